"""One key-partition of a stream micro-batch, decided over its keys' hot state (pure).

The stream shuffles a micro-batch's keyed events by (signature, key); each partition
reads its keys' state as columns (``velocity.redis.hot_state``: the stored buckets with
the newest eventTime counted in each, and the raw events of the own buckets that need
them) and is decided here by the columnar
``velocity.engine.micro_batch``. What comes out is what the partition's commit writes:
every changed bucket's new absolute value, the buckets that fell below the horizon, and
the raw events the batch adds to each key's newest ``RECENT_BUCKETS`` buckets (appended:
a hot key's bucket is never rewritten whole), so that an out-of-order event of a later
batch finds its own bucket's earlier events in the hot state instead of in Delta.

A key's raw events of a bucket are read only for an own bucket that needs them, and
used only when trusted (``HotState.recent_events``: as many as the bucket counts):
appending to a bucket whose raw events were incomplete keeps them incomplete, so the
count tells.

An event to decide is **out of order** (SPEC §3) when an earlier batch counted an event
of its (signature, key) with a later or equal eventTime: that event's decision did not
see this one (equal times share a window). The key's newest counted eventTime comes from
the state the partition reads anyway: each stored bucket's ``last_time`` (its start when
unknown, a lower bound), and the raw earlier events of the own buckets it was given,
which are exactly the buckets where that bound would be too low to tell. No extra read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from velocity.domain.rules import Rule
from velocity.domain.stream_batch import RECENT_BUCKETS, BucketSlot, KeyState, SignatureKey
from velocity.domain.windows import KeyedEvent
from velocity.engine.bucketing import BUCKET_ROWS
from velocity.engine.kernel import KEYED_COLUMNS, Decisions
from velocity.engine.micro_batch import (
    SLOT,
    STORED_COLUMNS,
    decide_micro_batch,
    own_buckets_needing_history,
)

_KEY = ("signature_id", "key")

STORED_SCHEMA = pa.schema(
    [
        *(BUCKET_ROWS.field(name) for name in SLOT),
        pa.field("last_time", pa.int64()),
        *(BUCKET_ROWS.field(name) for name in STORED_COLUMNS[4:]),
    ]
)


@dataclass(frozen=True)
class KeyPartitionDecided:
    """What a key-partition's batch decided and what its commit writes (slots as SLOT
    columns)."""

    decisions: Decisions  # rows index the partition's batch events
    deltas: pa.Table  # the batch's events alone per bucket (``bucket_rows``)
    buckets: pa.Table  # STORED_COLUMNS: every changed bucket's new absolute value
    dropped: pa.Table  # buckets of changed keys below the horizon
    raw_appended: pa.Table  # batch rows (KEYED_COLUMNS, ``bucket_start``, ``starts``) kept raw
    raw_removed: pa.Table  # raw events no longer kept (left the newest buckets)
    bucket_counts: pa.Table  # signature_id, key, bucket_count: each changed key's, after
    out_of_order: pa.Table  # OUT_OF_ORDER rows: the batch events decided out of order


# The events a key-partition found out of order (a row per event and signature key).
OUT_OF_ORDER = pa.schema(
    [pa.field("transactionId", pa.string()), pa.field("eventTime", pa.int64())]
)


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


def needed_own_buckets(events: pa.Table, stored: pa.Table, width_ms: int) -> list[BucketSlot]:
    """The own buckets whose earlier events the partition needs raw (an event later than
    one to decide, or an unknown newest eventTime): read their raw events first."""
    return slot_list(own_buckets_needing_history(events, stored, width_ms))


def slot_list(slots: pa.Table) -> list[BucketSlot]:
    """SLOT rows as (signature, key, bucket start) tuples."""
    return list(zip(*(slots.column(n).to_pylist() for n in SLOT), strict=True))


def missing_history(
    events: pa.Table,
    stored: pa.Table,
    recent: Mapping[BucketSlot, Sequence[KeyedEvent]],
    width_ms: int,
) -> list[BucketSlot]:
    """The needed own buckets whose raw events ``recent`` does not hold (trusted): those
    come from the Delta history."""
    return [s for s in needed_own_buckets(events, stored, width_ms) if s not in recent]


def decide_key_partition(
    events: pa.Table,
    stored: pa.Table,
    recent: Mapping[BucketSlot, Sequence[KeyedEvent]],
    history: pa.Table | None,
    rules: Sequence[Rule],
    width_ms: int,
    cutoff: int | None,
    needed: pa.Table | None = None,
) -> KeyPartitionDecided:
    """Decide a partition's batch ``events`` (KEYED_COLUMNS and ``decide``, in arrival
    order) over its keys' ``stored`` buckets (STORED_SCHEMA) and the trusted ``recent``
    raw events of own buckets; ``history`` holds the raw earlier events of the own
    buckets ``missing_history`` named (KEYED_COLUMNS, or None when it named none).
    ``needed``: ``own_buckets_needing_history``, when the caller has it already."""
    if needed is None:
        needed = own_buckets_needing_history(events, stored, width_ms)
    earlier = [_recent_rows(needed, recent, events.schema)]
    if history is not None and history.num_rows:
        earlier.append(history.select(list(KEYED_COLUMNS)).cast(earlier[0].schema))
    earlier_rows = pa.concat_tables(earlier)
    decided = decide_micro_batch(events, stored, earlier_rows, rules, width_ms, needed)
    raw = _raw_changes(events, stored, width_ms, cutoff)
    late_arrivals = events.filter(pa.array(out_of_order(events, stored, earlier_rows)))
    return KeyPartitionDecided(
        decided.decisions,
        decided.deltas,
        decided.buckets,
        *raw,
        late_arrivals.select(OUT_OF_ORDER.names).cast(OUT_OF_ORDER),
    )


def out_of_order(events: pa.Table, stored: pa.Table, earlier: pa.Table) -> np.ndarray:
    """Which batch ``events`` (KEYED_COLUMNS and ``decide``) are decided out of order:
    an event to decide whose (signature, key) has a counted event at its eventTime or
    later in ``stored`` (STORED_SCHEMA: ``last_time``, else ``bucket_start``) or in
    ``earlier`` (KEYED_COLUMNS: the raw earlier events of the own buckets that needed
    them). Events of the batch itself never count: they are in each other's windows."""
    key_types = [events.schema.field(n).type for n in _KEY]
    newest_of = [
        pa.table(
            {
                "signature_id": stored.column("signature_id").cast(key_types[0]),
                "key": stored.column("key").cast(key_types[1]),
                "time": pc.coalesce(stored.column("last_time"), stored.column("bucket_start")),
            }
        ),
        pa.table(
            {
                "signature_id": earlier.column("signature_id").cast(key_types[0]),
                "key": earlier.column("key").cast(key_types[1]),
                "time": earlier.column("eventTime").cast(pa.int64()),
            }
        ),
    ]
    newest = (
        pa.concat_tables(newest_of)
        .group_by(list(_KEY), use_threads=False)
        .aggregate([("time", "max")])
    )
    rows = events.select(list(_KEY)).append_column(
        "_row", pa.array(np.arange(events.num_rows, dtype=np.int64))
    )
    joined = rows.join(newest, keys=list(_KEY), join_type="inner", use_threads=False)
    at = joined.column("_row").to_numpy()
    times = events.column("eventTime").to_numpy()
    marked = np.zeros(events.num_rows, dtype=bool)
    marked[at] = times[at] <= joined.column("time_max").to_numpy()
    if "decide" in events.column_names:
        marked &= pc.fill_null(events.column("decide"), True).to_numpy(zero_copy_only=False)
    return marked


def _recent_rows(
    needed: pa.Table, recent: Mapping[BucketSlot, Sequence[KeyedEvent]], schema: pa.Schema
) -> pa.Table:
    """The recent raw events of the ``needed`` own buckets, as keyed rows."""
    events: list[tuple[str, str, KeyedEvent]] = []
    for slot in slot_list(needed):
        known = recent.get(slot)
        if known is None:
            continue  # from the Delta history (``missing_history``)
        events.extend((slot[0], slot[1], e) for e in known)
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


def run_starts(rows: pa.Table, columns: Sequence[str]) -> np.ndarray:
    """The rows that start a run of equal ``columns`` (rows sorted by them)."""
    first = np.ones(rows.num_rows, bool)
    if rows.num_rows > 1:
        differs = [
            pc.not_equal(c[1:], c[:-1]) for c in (rows.column(n).combine_chunks() for n in columns)
        ]
        change = differs[0]
        for other in differs[1:]:
            change = pc.or_(change, other)
        first[1:] = change.to_numpy(zero_copy_only=False)
    return np.flatnonzero(first)


def _raw_changes(
    events: pa.Table, stored: pa.Table, width_ms: int, cutoff: int | None
) -> tuple[pa.Table, pa.Table, pa.Table, pa.Table]:
    """The buckets below the horizon, the raw events kept, those no longer kept and each
    key's bucket count: each changed key's newest ``RECENT_BUCKETS`` buckets get the
    batch's events appended (``starts``: started over, a bucket new to the key); a bucket
    that leaves the newest loses them. Column by column over the batch's rows and its
    keys' stored slots: a hot key's bucket is never read or written whole."""
    times = events.column("eventTime").to_numpy()
    slots = pa.table(
        {
            "signature_id": events.column("signature_id"),
            "key": events.column("key"),
            "bucket_start": pa.array(times - np.mod(times, width_ms), pa.int64()),
        }
    )
    added = slots.group_by(list(SLOT), use_threads=False).aggregate([])
    before = stored.select(list(SLOT)).cast(slots.schema)
    flagged = pa.concat_tables(
        [
            added.append_column("added", pa.array(np.ones(added.num_rows, bool))),
            before.append_column("added", pa.array(np.zeros(before.num_rows, bool))),
        ]
    )
    # Each slot of a changed key once, a key's newest first: added (the batch has it),
    # stored (Redis has it), or both.
    every = (
        flagged.group_by(list(SLOT), use_threads=False)
        .aggregate([("added", "max"), ("added", "min")])
        .sort_by(
            [("signature_id", "ascending"), ("key", "ascending"), ("bucket_start", "descending")]
        )
    )
    n = every.num_rows
    sig = every.column("signature_id").combine_chunks()
    key = every.column("key").combine_chunks()
    firsts = run_starts(every, ("signature_id", "key"))
    group = np.searchsorted(firsts, np.arange(n), side="right") - 1  # each row's key
    rank = np.arange(n) - firsts[group]
    bucket_start = every.column("bucket_start").to_numpy()
    is_added = every.column("added_max").to_numpy(zero_copy_only=False)
    is_stored = ~every.column("added_min").to_numpy(zero_copy_only=False)
    below = np.zeros(n, bool) if cutoff is None else bucket_start < cutoff
    newest = (rank < RECENT_BUCKETS) & ~below
    stored_so_far = np.cumsum(is_stored)
    stored_rank = stored_so_far - (stored_so_far - is_stored)[firsts][group] - 1
    removed = is_stored & (stored_rank < RECENT_BUCKETS) & ~newest
    kept = is_added & newest
    kept_slots = (
        every.filter(kept).select(list(SLOT)).append_column("starts", pa.array(~is_stored[kept]))
    )
    indexed = slots.append_column("row", pa.array(np.arange(events.num_rows), pa.int64()))
    joined = indexed.join(kept_slots, keys=list(SLOT), join_type="inner", use_threads=False)
    order = np.argsort(joined.column("row").to_numpy(), kind="stable")
    appended = (
        events.select(list(KEYED_COLUMNS))
        .append_column("bucket_start", slots.column("bucket_start"))
        .take(pa.array(joined.column("row").to_numpy()[order]))
        .append_column("starts", joined.column("starts").take(pa.array(order)))
    )
    counts = pa.table(
        {
            "signature_id": sig.take(pa.array(firsts)),
            "key": key.take(pa.array(firsts)),
            "bucket_count": pa.array(np.diff(np.append(firsts, n)), pa.int64()),
        }
    )
    slot_columns = every.select(list(SLOT))
    return (
        slot_columns.filter(pa.array(below)),
        appended,
        slot_columns.filter(pa.array(removed)),
        counts,
    )
