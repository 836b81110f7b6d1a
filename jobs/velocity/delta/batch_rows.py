"""A decided micro-batch as rows of the live tables (Arrow, column by column).

The stream spools these for the Delta write-behind (``velocity.delta.write_behind``);
the shapes are the live tables' schemas, so the spool appends to Delta unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa

from velocity.buckets import BucketAggregate
from velocity.decimals import EXACT
from velocity.delta.write_behind import ARROW_SCHEMAS
from velocity.schema import Event, Rejection

_AMOUNT_QUANTUM = Decimal("1e-8")
_EVENT_FIELDS = ("payerId", "beneficiaryId", "paymentType", "ip", "deviceId", "action")


@dataclass(frozen=True)
class Line:
    """One line of the batch in arrival order, where it came from and what it parsed to."""

    raw: str
    source_file: str
    source_block: int
    line_seq: int
    parsed: Event | Rejection


def _table(name: str, columns: Mapping[str, Sequence[Any]]) -> pa.Table:
    schema = ARROW_SCHEMAS[name]
    return pa.table([pa.array(columns[f.name], type=f.type) for f in schema], schema=schema)


def event_rows(
    name: str, lines: Sequence[Line], ingest_time: int, batch_id: int | None = None
) -> pa.Table:
    """Accepted lines as rows of ``events`` (with ``batch_id``) or ``duplicates``."""
    events = [line.parsed for line in lines]
    columns: dict[str, list[Any]] = {
        "transactionId": [e.transaction_id for e in events],  # type: ignore[union-attr]
        "eventTime": [e.event_time for e in events],  # type: ignore[union-attr]
        "paymentAmount": [
            e.amount.quantize(_AMOUNT_QUANTUM, context=EXACT)  # type: ignore[union-attr]
            for e in events
        ],
        "raw": [line.raw for line in lines],
        "source_file": [line.source_file for line in lines],
        "source_block": [line.source_block for line in lines],
        "line_seq": [line.line_seq for line in lines],
        "ingest_time": [ingest_time] * len(lines),
    }
    for field in _EVENT_FIELDS:
        columns[field] = [e.values.get(field) for e in events]  # type: ignore[union-attr]
    if batch_id is not None:
        columns["stream_batch"] = [batch_id] * len(lines)
    return _table(name, columns)


def quarantine_rows(lines: Sequence[Line], ingest_time: int) -> pa.Table:
    rejections = [line.parsed for line in lines]
    return _table(
        "quarantine",
        {
            "raw": [line.raw for line in lines],
            "reason_code": [r.code.value for r in rejections],  # type: ignore[union-attr]
            "reason": [r.message for r in rejections],  # type: ignore[union-attr]
            "source_file": [line.source_file for line in lines],
            "source_block": [line.source_block for line in lines],
            "line_seq": [line.line_seq for line in lines],
            "ingest_time": [ingest_time] * len(lines),
        },
    )


def late_rows(late: Sequence[Event], watermark: int | None, batch_id: int) -> pa.Table:
    return _table(
        "late_events",
        {
            "transactionId": [e.transaction_id for e in late],
            "eventTime": [e.event_time for e in late],
            "watermark": [watermark] * len(late),
            "stream_batch": [batch_id] * len(late),
        },
    )


def bucket_rows(deltas: Mapping[tuple[str, str, int], BucketAggregate], width_ms: int) -> pa.Table:
    """One g-wide row per bucket a batch changed, holding only that batch's events: the
    buckets table adds rows of the same bucket up (readers merge them, compaction folds)."""
    slots = list(deltas)
    aggregates = [deltas[s] for s in slots]
    return _table(
        "buckets",
        {
            "signature_id": [s[0] for s in slots],
            "key": [s[1] for s in slots],
            "bucket_start": [s[2] for s in slots],
            "bucket_width_ms": [width_ms] * len(slots),
            "event_count": [a.count for a in aggregates],
            "value_count": [a.value_count for a in aggregates],
            "value_sum": [a.total for a in aggregates],
            "value_min": [a.minimum for a in aggregates],
            "value_max": [a.maximum for a in aggregates],
            "distinct_values": [sorted(a.distinct) for a in aggregates],
            "parts": [None] * len(slots),
        },
    )


def alert_rows(records: Iterable[Mapping[str, Any]], signature_ids: Sequence[str]) -> pa.Table:
    """SPEC §4 records (and the signature each was decided on) as rows of ``alerts``."""
    records = list(records)
    columns: dict[str, list[Any]] = {
        name: [r[name] for r in records]
        for name in ARROW_SCHEMAS["alerts"].names
        if name != "key" and name != "signature_id"
    }
    columns["key"] = [list(r["key"].items()) for r in records]
    columns["signature_id"] = list(signature_ids)
    return _table("alerts", columns)
