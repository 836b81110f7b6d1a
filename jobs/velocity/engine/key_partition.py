"""One key-partition of a stream micro-batch, decided over its keys' hot state (pure).

The stream shuffles a micro-batch's keyed events by (signature, key); each partition
reads its keys' state (``KeyState``: the buckets, the newest eventTime counted in each,
and the raw events of the newest buckets) and is decided here by the columnar
``velocity.engine.micro_batch``. What comes out is what the partition's commit writes:
every changed bucket's new absolute value, the buckets that fell below the horizon, and
the raw events the batch adds to each key's newest ``RECENT_BUCKETS`` buckets (appended:
a hot key's bucket is never rewritten whole), so that an out-of-order event of a later
batch finds its own bucket's earlier events in the hot state instead of in Delta.

A key's raw events of a bucket are read only for an own bucket that needs them, and
used only when trusted (``velocity.stream_batch.trusted_recent``): appending to a bucket
whose raw events were incomplete keeps them incomplete, so the count tells.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

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
    dropped: list[BucketSlot]  # buckets of changed keys below the horizon
    raw_appended: pa.Table  # batch rows (KEYED_COLUMNS, ``bucket_start``) kept raw, in order
    raw_started: list[BucketSlot]  # raw events that start over (a bucket new to its key)
    raw_removed: list[BucketSlot]  # raw events no longer kept (left the newest buckets)
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


def needed_own_buckets(
    events: pa.Table, states: Mapping[SignatureKey, KeyState], width_ms: int
) -> list[BucketSlot]:
    """The own buckets whose earlier events the partition needs raw (an event later than
    one to decide, or an unknown newest eventTime): read their raw events first."""
    needed = own_buckets_needing_history(events, stored_buckets(states), width_ms)
    return list(zip(*(needed.column(n).to_pylist() for n in SLOT), strict=True))


def missing_history(
    events: pa.Table, states: Mapping[SignatureKey, KeyState], width_ms: int
) -> list[BucketSlot]:
    """The needed own buckets whose raw events the states do not hold (trusted): those
    come from the Delta history."""
    return [
        (sig, key, start)
        for sig, key, start in needed_own_buckets(events, states, width_ms)
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
    raw = _raw_changes(events, states, width_ms, cutoff)
    return KeyPartitionDecided(decided.decisions, decided.deltas, decided.buckets, *raw)


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


def _raw_changes(
    events: pa.Table,
    states: Mapping[SignatureKey, KeyState],
    width_ms: int,
    cutoff: int | None,
) -> tuple[list[BucketSlot], pa.Table, list[BucketSlot], list[BucketSlot], dict[SignatureKey, int]]:
    """The buckets below the horizon, and the raw events kept: each changed key's newest
    ``RECENT_BUCKETS`` buckets get the batch's events appended (started over for a bucket
    new to the key); a bucket that leaves the newest loses them. One pass per changed
    key and one per row, over the batch's rows only: a hot key's bucket is never read
    or written whole."""
    times = events.column("eventTime").to_numpy()
    starts = times - np.mod(times, width_ms)
    slots = pa.table(
        {
            "signature_id": events.column("signature_id"),
            "key": events.column("key"),
            "bucket_start": pa.array(starts, pa.int64()),
        }
    )
    distinct = slots.group_by(list(SLOT), use_threads=False).aggregate([])
    by_key: dict[SignatureKey, list[int]] = {}
    for sig, key, start in zip(*(distinct.column(n).to_pylist() for n in SLOT), strict=True):
        by_key.setdefault((sig, key), []).append(start)
    kept: set[BucketSlot] = set()
    started: list[BucketSlot] = []
    removed: list[BucketSlot] = []
    dropped: list[BucketSlot] = []
    counts: dict[SignatureKey, int] = {}
    for slot, added in by_key.items():
        stored = states[slot].buckets if slot in states else {}
        every = sorted({*stored, *added})
        counts[slot] = len(every)
        newest = {s for s in every[-RECENT_BUCKETS:] if cutoff is None or s >= cutoff}
        for start in added:
            if start in newest:
                kept.add((*slot, start))
                if start not in stored:
                    started.append((*slot, start))
        removed.extend((*slot, s) for s in sorted(stored)[-RECENT_BUCKETS:] if s not in newest)
        if cutoff is not None:
            dropped.extend((*slot, s) for s in every if s < cutoff)
    keep = np.fromiter(
        (
            (sig, key, start) in kept
            for sig, key, start in zip(
                events.column("signature_id").to_pylist(),
                events.column("key").to_pylist(),
                starts.tolist(),
                strict=True,
            )
        ),
        dtype=bool,
        count=events.num_rows,
    )
    appended = events.select(list(KEYED_COLUMNS)).append_column(
        "bucket_start", slots.column("bucket_start")
    )
    return dropped, appended.filter(pa.array(keep)), started, removed, counts
