"""A decided micro-batch as rows of the live tables (Arrow, column by column).

The stream spools these for the Delta write-behind (``velocity.delta.write_behind``);
the shapes are the live tables' schemas, so the spool appends to Delta unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from velocity.delta.write_behind import ARROW_SCHEMAS
from velocity.domain.buckets import BucketAggregate
from velocity.domain.schema import LateReason
from velocity.engine.admission import AdmittedBatch


def _table(name: str, columns: Mapping[str, Sequence[Any]]) -> pa.Table:
    schema = ARROW_SCHEMAS[name]
    return pa.table([pa.array(columns[f.name], type=f.type) for f in schema], schema=schema)


def live_rows(name: str, rows: pa.Table, **constants: int | str | None) -> pa.Table:
    """``rows`` as rows of the live table ``name``: its columns taken from ``rows`` by
    name, but for the ``constants`` (``ingest_time``, ``stream_batch``, ...), the same
    in every row."""
    schema = ARROW_SCHEMAS[name]
    columns = [
        pa.repeat(pa.scalar(constants[f.name], f.type), rows.num_rows)
        if f.name in constants
        else rows.column(f.name).cast(f.type)
        for f in schema
    ]
    return pa.table(columns, schema=schema)


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


def late_event_rows(admitted: AdmittedBatch, out_of_order: pa.Table, batch_id: int) -> pa.Table:
    """The batch's events for the backfill of late events, each once with its reason
    (``LateReason``): those older than the watermark, and the ``out_of_order`` ones
    (transactionId, eventTime; decided, so never late too). An out-of-order event of a
    stream without a watermark yet (none before a first batch) carries its own eventTime."""
    late = live_rows(
        "late_events",
        admitted.accepted.filter(pa.array(admitted.late)),
        watermark=admitted.watermark,
        stream_batch=batch_id,
        reason=LateReason.LATE.value,
    )
    times = out_of_order.column("eventTime")
    watermark = times if admitted.watermark is None else pa.repeat(admitted.watermark, len(times))
    arrivals = live_rows(
        "late_events",
        out_of_order.append_column("watermark", pa.array(watermark, pa.int64())),
        stream_batch=batch_id,
        reason=LateReason.OUT_OF_ORDER.value,
    )
    return pa.concat_tables([late, arrivals])


def spooled_rows(
    accepted: pa.Table,
    rejected: pa.Table,
    admitted: AdmittedBatch,
    deltas: pa.Table,
    alerts: pa.Table,
    out_of_order: pa.Table,
    ingest_time: int,
    batch_id: int,
) -> dict[str, pa.Table]:
    """A stream micro-batch's rows for each live table: ``accepted`` (already events-table
    rows), the ``rejected`` lines and the far-future events for quarantine, the
    duplicates, the late and ``out_of_order`` events, the bucket ``deltas`` and the
    ``alerts``."""
    return {
        "events": accepted,
        "duplicates": live_rows("duplicates", admitted.duplicates, ingest_time=ingest_time),
        "quarantine": pa.concat_tables(
            live_rows("quarantine", part, ingest_time=ingest_time)
            for part in (rejected, admitted.future)
        ),
        "late_events": late_event_rows(admitted, out_of_order, batch_id),
        "buckets": deltas,
        "alerts": alerts,
    }
