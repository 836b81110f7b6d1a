"""One key-partition of a stream micro-batch, decided over its keys' hot state (pure).

The stream shuffles a micro-batch's keyed events by (signature, key); each partition
reads its keys' state (``KeyState``: the buckets, the newest eventTime counted in each,
and the raw events of the newest buckets) and is decided here by the columnar
``velocity.engine.micro_batch``. What comes out is what the partition's commit writes:
every changed bucket's new absolute value, the buckets that fell below the horizon, and
each changed key's recent raw events, so that an out-of-order event of a later batch
finds its own bucket's earlier events in the hot state instead of in Delta.

A key's recent raw events of a bucket are used only when trusted
(``velocity.stream_batch.trusted_recent``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

import numpy as np
import pyarrow as pa

from velocity.engine.bucketing import BUCKET_ROWS
from velocity.engine.kernel import KEYED_COLUMNS, Decisions
from velocity.engine.micro_batch import (
    SLOT,
    STORED_COLUMNS,
    decide_micro_batch,
    own_buckets_needing_history,
)
from velocity.rules import Rule
from velocity.stream_batch import RECENT_BUCKETS, BucketSlot, KeyState, SignatureKey
from velocity.windows import KeyedEvent

STORED_SCHEMA = pa.schema(
    [
        *(BUCKET_ROWS.field(name) for name in SLOT),
        pa.field("last_time", pa.int64()),
        *(BUCKET_ROWS.field(name) for name in STORED_COLUMNS[4:]),
    ]
)


@dataclass(frozen=True)
class KeyPartitionDecided:
    """What a key-partition's batch decided and what its commit writes."""

    decisions: Decisions  # rows index the partition's batch events
    deltas: pa.Table  # the batch's events alone per bucket (``bucket_rows``)
    buckets: pa.Table  # STORED_COLUMNS: every changed bucket's new absolute value
    recent: dict[SignatureKey, dict[int, tuple[KeyedEvent, ...]]]  # per changed key
    dropped: list[BucketSlot]  # buckets of changed keys below the horizon
    bucket_counts: dict[SignatureKey, int] = field(default_factory=dict)  # after the batch


def stored_buckets(states: Mapping[SignatureKey, KeyState]) -> pa.Table:
    """The states' buckets as rows (STORED_SCHEMA)."""
    rows: dict[str, list[object]] = {name: [] for name in STORED_SCHEMA.names}
    for (signature_id, key), state in states.items():
        for start, aggregate in state.buckets.items():
            rows["signature_id"].append(signature_id)
            rows["key"].append(key)
            rows["bucket_start"].append(start)
            rows["last_time"].append(state.last_times.get(start))
            rows["event_count"].append(aggregate.count)
            rows["value_count"].append(aggregate.value_count)
            rows["value_sum"].append(aggregate.total)
            rows["value_min"].append(aggregate.minimum)
            rows["value_max"].append(aggregate.maximum)
            rows["distinct_values"].append(sorted(aggregate.distinct))
    return pa.table(rows, schema=STORED_SCHEMA)


def missing_history(
    events: pa.Table, states: Mapping[SignatureKey, KeyState], width_ms: int
) -> list[BucketSlot]:
    """The own buckets whose earlier events the partition needs and its keys' recent raw
    events do not hold: those come from the Delta history."""
    needed = own_buckets_needing_history(events, stored_buckets(states), width_ms)
    return [
        (sig, key, start)
        for sig, key, start in zip(*(needed.column(n).to_pylist() for n in SLOT), strict=True)
        if start not in states[(sig, key)].recent
    ]


def decide_key_partition(
    events: pa.Table,
    states: Mapping[SignatureKey, KeyState],
    history: pa.Table | None,
    rules: Sequence[Rule],
    width_ms: int,
    cutoff: int | None,
) -> KeyPartitionDecided:
    """Decide a partition's batch ``events`` (KEYED_COLUMNS and ``decide``, in arrival
    order) over its keys' ``states`` (recent events trusted); ``history`` holds the raw
    earlier events of the own buckets ``missing_history`` named (KEYED_COLUMNS, or
    None when it named none)."""
    stored = stored_buckets(states)
    needed = own_buckets_needing_history(events, stored, width_ms)
    earlier = [_recent_rows(needed, states, events.schema)]
    if history is not None and history.num_rows:
        earlier.append(history.select(list(KEYED_COLUMNS)).cast(earlier[0].schema))
    decided = decide_micro_batch(events, stored, pa.concat_tables(earlier), rules, width_ms)
    recent, counts = _recent_after(events, states, decided.buckets, width_ms)
    dropped: list[BucketSlot] = []
    if cutoff is not None:
        for slot in recent:
            starts = {*states.get(slot, KeyState()).buckets, *recent[slot]}
            dropped.extend((slot[0], slot[1], s) for s in sorted(starts) if s < cutoff)
    return KeyPartitionDecided(
        decided.decisions, decided.deltas, decided.buckets, recent, dropped, counts
    )


def _recent_rows(
    needed: pa.Table, states: Mapping[SignatureKey, KeyState], schema: pa.Schema
) -> pa.Table:
    """The recent raw events of the ``needed`` own buckets, as keyed rows."""
    events: list[tuple[str, str, KeyedEvent]] = []
    for sig, key, start in zip(*(needed.column(n).to_pylist() for n in SLOT), strict=True):
        recent = states[(sig, key)].recent.get(start)
        if recent is None:
            continue  # from the Delta history (``missing_history``)
        events.extend((sig, key, e) for e in recent)
    columns = {
        "signature_id": [s for s, _, _ in events],
        "key": [k for _, k, _ in events],
        "eventTime": [e.event_time for _, _, e in events],
        "transactionId": [e.transaction_id for _, _, e in events],
        "value": [e.value for _, _, e in events],
        "number": [e.number for _, _, e in events],
    }
    return pa.table(
        {name: pa.array(columns[name], schema.field(name).type) for name in KEYED_COLUMNS}
    )


def keyed_events_of(rows: pa.Table) -> list[KeyedEvent]:
    """Keyed rows as the reference engine's events."""
    numbers: list[Decimal | None] = rows.column("number").to_pylist()
    return [
        KeyedEvent(t, tx, v, n)
        for t, tx, v, n in zip(
            rows.column("eventTime").to_pylist(),
            rows.column("transactionId").to_pylist(),
            rows.column("value").to_pylist(),
            numbers,
            strict=True,
        )
    ]


def _recent_after(
    events: pa.Table,
    states: Mapping[SignatureKey, KeyState],
    buckets: pa.Table,
    width_ms: int,
) -> tuple[dict[SignatureKey, dict[int, tuple[KeyedEvent, ...]]], dict[SignatureKey, int]]:
    """Each changed key's recent raw events after the batch (its newest
    ``RECENT_BUCKETS`` buckets that every event of passed through a batch since the
    bucket began), and its bucket count."""
    times = events.column("eventTime").to_numpy()
    starts = (times - np.mod(times, width_ms)).tolist()
    added: dict[SignatureKey, dict[int, list[KeyedEvent]]] = {}
    for slot_sig, slot_key, start, event in zip(
        events.column("signature_id").to_pylist(),
        events.column("key").to_pylist(),
        starts,
        keyed_events_of(events),
        strict=True,
    ):
        added.setdefault((slot_sig, slot_key), {}).setdefault(start, []).append(event)
    new_starts: dict[SignatureKey, set[int]] = {}
    for sig, key, start in zip(*(buckets.column(n).to_pylist() for n in SLOT), strict=True):
        new_starts.setdefault((sig, key), set()).add(start)
    recent: dict[SignatureKey, dict[int, tuple[KeyedEvent, ...]]] = {}
    counts: dict[SignatureKey, int] = {}
    for slot, by_start in added.items():
        before = states.get(slot)
        kept = dict(before.recent) if before is not None else {}
        known = before.buckets if before is not None else {}
        for start, batch_events in by_start.items():
            if start not in known:
                kept[start] = tuple(batch_events)
            elif start in kept:
                kept[start] = (*kept[start], *batch_events)
        if len(kept) > RECENT_BUCKETS:
            kept = {s: kept[s] for s in sorted(kept)[-RECENT_BUCKETS:]}
        recent[slot] = kept
        counts[slot] = len({*known, *new_starts.get(slot, ())})
    return recent, counts
