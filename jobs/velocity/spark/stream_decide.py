"""A stream micro-batch decided a key-partition at a time, in Spark's executors.

The driver fans the batch's accepted events out to (signature, key) rows (columnar) and
cuts them into key-partitions; each partition is one Spark task, which reads its keys'
hot state from Redis in one round trip, decides with the columnar kernel
(``velocity.engine.key_partition``), commits its bucket changes to Redis in one round trip
(of calls of about a millisecond each, so checks and lookups wait behind none long) and
returns its alert rows and its bucket deltas for Delta. The driver then commits the
batch's accepted transactionIds, alerts and progress in one call. A small batch is
decided the same way by processes beside the driver (``LOCAL_DECIDERS``): a Spark job
costs more than it saves there, and threads of the driver's process would share its GIL
with the write-behind and Spark's callbacks.

A partition's commit is idempotent on (batch, partition) and fenced by the state lock's
token (``mirror.commit_partition``): it records the partition's outcome beside its
changes, so a retried or speculative task, or the partition of a batch replayed after a
crash, returns the recorded outcome and applies nothing twice. A replay is cut and
decided by the plan its first attempt recorded (``mirror.batch_plan``).
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from velocity.domain.decimals import dumps_json
from velocity.domain.rule_changes import stored_rule
from velocity.domain.rules import Rule, RuleSignature
from velocity.domain.stream_batch import BucketSlot
from velocity.engine.bucketing import BUCKET_ROWS
from velocity.engine.cooldown import LAST_NOTIFIED, notify
from velocity.engine.fan_out import keyed_rows
from velocity.engine.key_partition import (
    OUT_OF_ORDER,
    KeyPartitionDecided,
    decide_key_partition,
    run_starts,
    slot_list,
)
from velocity.engine.micro_batch import SLOT, own_buckets_needing_history, with_bucket_start
from velocity.engine.records import alert_lines, alert_rows
from velocity.operating.local_process import SpawnedWorkers
from velocity.redis import connection, mirror
from velocity.redis.commit_args import (
    DENSE_CHANGES_RUN,
    DENSE_RUN,
    KEY_RUNS,
    PACKED_ONLY_RUN,
    PACKED_RUN,
    BucketChanges,
    PartitionCommit,
    flat_runs,
    partition_pieces,
)
from velocity.redis.hot_state import STORED_FIELDS
from velocity.redis.keys import (
    HASH_MARK,
    RAW_FIELD,
    RedisKeys,
    bucket_value_texts,
    notified_field_texts,
    one_chunk,
    recent_fragment_texts,
)
from velocity.settings import Settings
from velocity.spark.evaluate import _ALERT_ARROW, _KEYED_ARROW, bucket_table

_KEY = ("signature_id", "key")
# A batch's alerts are published in this order (SPEC §4 records sorted by it).
_PUBLISHING_ORDER = ("eventTime", "ruleId", "transactionId")


@dataclass(frozen=True)
class BatchPlan:
    """What every key-partition of a batch needs (pickled into its task)."""

    settings: Settings
    rules: tuple[Rule, ...]
    decision_time: int
    cutoff: int | None  # buckets of changed keys below it are dropped (the horizon)
    batch: int
    token: str  # the state lock's, which fences every partition's commit
    bucket_ttl_ms: int
    submitted: float = 0.0  # epoch seconds the batch's key-partitions were sent off


@dataclass(frozen=True)
class RecordedPlan:
    """How a micro-batch is cut into key-partitions and decided: recorded in Redis before
    its first partition commits (``mirror.batch_plan``), so that a replay after a crash
    cuts the same keys into the same partitions and decides them by the same rules and
    clock, whatever the rules or the settings are by then."""

    partitions: int
    decision_time: int
    rules: tuple[Rule, ...]

    def text(self, batch_id: int) -> str:
        """As JSON; each rule as a row of the rules table, read back by ``stored_rule``."""
        return dumps_json(
            {
                "batch": str(batch_id),
                "partitions": self.partitions,
                "decision_time": self.decision_time,
                "rules": [
                    {
                        "ruleId": r.rule_id,
                        "version": r.version,
                        "ruleState": r.state.value,
                        "rule_json": dumps_json(r.to_json()),
                    }
                    for r in self.rules
                ],
            }
        )

    @classmethod
    def parse(cls, text: str) -> RecordedPlan:
        plan = json.loads(text)
        rules = [stored_rule(row) for row in plan["rules"]]
        return cls(int(plan["partitions"]), int(plan["decision_time"]), tuple(rules))


@dataclass
class BatchDecided:
    """A batch's decisions over all its key-partitions."""

    alerts: pa.Table  # rows of the alerts table
    deltas: pa.Table  # rows of the buckets table: the batch's events alone per bucket
    published: list[str] = field(default_factory=list)  # SPEC §4 JSON, in publishing order
    shadow_published: list[str] = field(default_factory=list)  # SHADOW rules' alerts, alike
    missing: list[BucketSlot] = field(default_factory=list)  # own buckets to read from Delta
    # The batch's events decided out of order (SPEC §3), once each (OUT_OF_ORDER).
    out_of_order: pa.Table = field(default_factory=OUT_OF_ORDER.empty_table)
    partitions: list[dict[str, object]] = field(default_factory=list)  # per-partition log


def batch_keyed_rows(
    events: pa.Table, signatures: Sequence[RuleSignature], watermark: int | None
) -> pa.Table:
    """The accepted events (rows of the events table, arrival order) per signature and
    key, with ``decide`` false for the late ones (older than the watermark)."""
    keyed = keyed_rows(events, signatures, _KEYED_ARROW)
    times = keyed.column("eventTime").to_numpy()
    decide = np.ones(len(times), dtype=bool) if watermark is None else times >= watermark
    return keyed.append_column("decide", pa.array(decide))


def decide_batch(
    spark: SparkSession,
    keyed: pa.Table,
    history: pa.Table | None,
    plan: BatchPlan,
    partitions: int,
    in_executors: bool,
) -> BatchDecided:
    """Decide ``keyed`` (``batch_keyed_rows``) in ``partitions`` key-partitions; with
    ``history`` (the raw earlier events of own buckets, keyed rows) for the slots a first
    round named ``missing``."""
    parts = _key_partitions(keyed, history, partitions)
    plan = replace(plan, submitted=time.time())
    if in_executors and len(parts) > 1:
        tasks = spark.sparkContext.parallelize(parts, len(parts))
        results = tasks.map(lambda part: _run_partition(plan, *part)).collect()
    elif len(parts) > 1:
        results = LOCAL_DECIDERS.run(
            _run_partition,
            [plan] * len(parts),
            *zip(*parts, strict=True),
            workers=partitions,
            what=f"deciding batch {plan.batch}",
        )
    else:
        results = [_run_partition(plan, *part) for part in parts]
    out = BatchDecided(_ALERT_ARROW.empty_table(), _empty_deltas(plan))
    alerts, deltas, texts = [out.alerts], [out.deltas], [pa.array([], pa.string())]
    arrivals = [out.out_of_order]
    returned = time.time()
    for blob in results:
        done = pickle.loads(blob)
        out.missing.extend(done["missing"])
        # From the task's end until its result was back in the driver.
        done["log"]["back_s"] = round(returned - done["log"].pop("ended"), 4)
        out.partitions.append(done["log"])
        if done["missing"]:
            continue
        alerts_ipc, texts_ipc, deltas_ipc, *rest = unpacked(done["outcome"])
        alerts.append(_conformed(_from_ipc(alerts_ipc)))
        texts.append(_from_ipc(texts_ipc).column(0).combine_chunks())
        deltas.append(_from_ipc(deltas_ipc))
        # An outcome recorded by a Velocity before out-of-order marking has three parts.
        arrivals.extend(_from_ipc(blob) for blob in rest)
    out.alerts, out.deltas = pa.concat_tables(alerts), pa.concat_tables(deltas)
    # An event is out of order once, whichever of its signature keys found it so.
    out.out_of_order = (
        pa.concat_tables(arrivals)
        .group_by("transactionId", use_threads=False)
        .aggregate([("eventTime", "min")])
        .rename_columns({"eventTime_min": "eventTime"})
        .select(OUT_OF_ORDER.names)
    )
    order = pc.sort_indices(out.alerts, sort_keys=[(n, "ascending") for n in _PUBLISHING_ORDER])
    ordered = pa.concat_arrays(texts).take(order)
    shadow = pc.fill_null(out.alerts.column("shadow").take(order), False).combine_chunks()
    # A suppressed alert (SPEC §3 cooldown) is recorded, never published.
    notified = pc.invert(pc.fill_null(out.alerts.column("suppressed").take(order), False))
    out.published = ordered.filter(pc.and_(notified, pc.invert(shadow))).to_pylist()
    out.shadow_published = ordered.filter(pc.and_(notified, shadow)).to_pylist()
    return out


def _conformed(alerts: pa.Table) -> pa.Table:
    """Alert rows as ``_ALERT_ARROW`` has them: a partition's outcome recorded by a
    Velocity before a column was added (``outcome``) has nulls there."""
    if alerts.schema.names == _ALERT_ARROW.names:
        return alerts
    columns = [
        alerts.column(f.name)
        if f.name in alerts.column_names
        else pa.nulls(alerts.num_rows, f.type)
        for f in _ALERT_ARROW
    ]
    return pa.Table.from_arrays(columns, schema=_ALERT_ARROW)


# Small batches' key-partitions (``decide_batch``), beside the driver: as Spark's
# executors would run them (``_run_partition``, the same idempotent commit), so a batch
# whose process died is decided again, its partitions committed already returning their
# recorded outcome.
LOCAL_DECIDERS = SpawnedWorkers(__name__)


def _empty_deltas(plan: BatchPlan) -> pa.Table:
    return bucket_table(BUCKET_ROWS.empty_table(), plan.settings.bucket_width_ms)


def _key_partitions(
    keyed: pa.Table, history: pa.Table | None, partitions: int
) -> list[tuple[int, bytes, bytes | None]]:
    """The batch's keyed rows (and history rows) cut by (signature, key) into
    ``partitions`` parts, each in arrival order, as Arrow IPC: (partition, rows, history)
    for each part with rows. The same rows are always cut the same way (a partition's
    commit is recorded under its number)."""
    codes = _key_codes(keyed)
    count = max(1, partitions)
    part_of = codes % count
    parts = []
    for p in range(count):
        rows = keyed.filter(pa.array(part_of == p))
        if rows.num_rows == 0:
            continue
        given = None
        if history is not None and history.num_rows:
            mine = history.join(_keys_of(rows), keys=list(_KEY), join_type="inner")
            given = _to_ipc(mine) if mine.num_rows else None
        parts.append((p, _to_ipc(rows), given))
    return parts


def _key_codes(keyed: pa.Table) -> np.ndarray:
    """A number per (signature, key) of the batch, spread evenly over keys."""
    encoded = _key_names(keyed).combine_chunks().dictionary_encode() if keyed.num_rows else None
    if encoded is None:
        return np.zeros(0, dtype=np.int64)
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)


def _run_partition(
    plan: BatchPlan, partition: int, rows_ipc: bytes, history_ipc: bytes | None
) -> bytes:
    """One key-partition, where its task runs: read its keys' state, decide, commit its
    changes to Redis, and return its outcome (pickled: the log, and the outcome as
    recorded in Redis). A partition committed before returns that outcome unchanged."""
    began = time.perf_counter()
    waited = time.time() - plan.submitted  # from the driver's send until this task ran
    settings = plan.settings
    keys = settings.redis_keys
    record = keys.partition_record(plan.batch, partition)
    rows = _from_ipc(rows_ipc)
    history = None if history_ipc is None else _from_ipc(history_ipc)
    log: dict[str, object] = {
        "partition": partition,
        "rows": rows.num_rows,
        "executor": _executor_name(),
        "attempt": _task_attempt(),
        "wait_s": round(waited, 4),
    }
    client = connection.connect(settings)
    try:
        recorded = mirror.partition_outcome(client, record)
        if recorded is not None:
            log["recorded"] = True
            log["ended"] = time.time()
            return pickle.dumps({"missing": [], "outcome": recorded, "log": log})
        asked = _keys_of(rows)
        width = settings.bucket_width_ms
        given = set() if history is None else _slots_of(history, width)
        hot = mirror.read_stream_state(client, settings, [], asked).hot
        # The raw events of the own buckets that need them: kept in the hash (a bucket
        # new to its key in one batch) or, added to since, in their own strings, read in a
        # second round trip.
        needing_history = own_buckets_needing_history(rows, hot.buckets, width)
        needed = [s for s in slot_list(needing_history) if s not in given]
        recent = hot.recent_events(needed)
        wanted = [s for s in needed if s not in recent]
        texts = mirror.read_recent_texts(client, keys, wanted)
        recent.update(hot.recent_events(list(texts), texts))
        read = time.perf_counter()
        log.update(keys=asked.num_rows, redis_read_s=round(read - began, 4))
        missing = [s for s in wanted if s not in recent]
        if missing:  # read from Delta by the driver, then decided in a second round
            log["ended"] = time.time()
            return pickle.dumps({"missing": missing, "log": log})
        decided = decide_key_partition(
            rows, hot.buckets, recent, history, plan.rules, width, plan.cutoff, needing_history
        )
        notified = notify(decided.decisions, rows, plan.rules, hot.notified)
        alerts = alert_rows(
            decided.decisions,
            rows,
            plan.rules,
            plan.decision_time,
            _ALERT_ARROW,
            notified.suppressed_by,
        )
        outcome = packed(
            [
                _to_ipc(table, OUTCOME_COMPRESSION)
                for table in (
                    alerts,
                    pa.table({"json": alert_lines(alerts)}),
                    bucket_table(decided.deltas, width),
                    decided.out_of_order,
                )
            ]
        )
        decided_at = time.perf_counter()
        log["decide_s"] = round(decided_at - read, 4)
        commit = PartitionCommit(
            (keys.stream_progress, keys.state_lock, record),
            plan.token,
            plan.batch,
            mirror.PARTITION_RECORD_TTL_MS,
            plan.bucket_ttl_ms,
            width,
            bucket_changes(keys, decided, notified.last, hot.stored),
            outcome,
            partition_pieces(asked.num_rows),
        )
        kept = mirror.commit_partition(client, settings, commit)
        log["commit_s"] = round(time.perf_counter() - decided_at, 4)
        if kept is not outcome:
            log["recorded"] = True  # a speculative twin committed first
    finally:
        client.close()
    log["ended"] = time.time()
    return pickle.dumps({"missing": [], "outcome": kept, "log": log})


# A partition's outcome is recorded in Redis, and so passes through its AOF: with rules that
# fire on most events it is about 1 MB a partition a second, mostly alerts' JSON, and the
# AOF's growth set how often Redis forked to rewrite it. zstd makes it about 6× smaller
# for about 3 ms a partition (reading an older, uncompressed record works the same).
OUTCOME_COMPRESSION = "zstd"


def packed(blobs: Sequence[bytes]) -> str:
    """Byte strings as one text (each behind its length; base64, as Redis replies are
    decoded as text): a partition's outcome as recorded in Redis."""
    return base64.b64encode(b"".join(len(b).to_bytes(8, "big") + b for b in blobs)).decode()


def unpacked(text: str) -> list[bytes]:
    """The inverse of ``packed``."""
    data, out, at = base64.b64decode(text), [], 0
    while at < len(data):
        size = int.from_bytes(data[at : at + 8], "big")
        out.append(data[at + 8 : at + 8 + size])
        at += 8 + size
    return out


def bucket_changes(
    keys: RedisKeys,
    decided: KeyPartitionDecided,
    notified: pa.Table | None = None,
    stored: pa.Table | None = None,
) -> BucketChanges:
    """A decided key-partition's Redis changes, column by column: a run of arguments per
    changed key (``commit_args.KeyChange``). A packed key (``stored``: every field its
    state held when read, ``hot_state.STORED_FIELDS``) is rewritten whole: its fields
    unchanged, every changed bucket's new value (with its newest eventTime), the raw
    events of buckets new to it, and its rules' newest ``notified`` alerts
    (``LAST_NOTIFIED``: the cooldown's state), less the dropped buckets and the raw events
    no longer kept or moved to their own strings; it turns dense (a hash with roll-ups)
    once it has ``mirror.DENSE_MIN_BUCKETS``. A dense key gets those changes as such.
    Either way: the raw events no longer kept or appended to (a fragment per bucket, its
    events in arrival order; one moved out of a packed key starts with those it held)."""
    if notified is None:
        notified = LAST_NOTIFIED.empty_table()
    if stored is None:
        stored = STORED_FIELDS.empty_table()
    buckets, raw = decided.buckets, decided.raw_appended
    # One fragment per kept bucket, its events in arrival order (a stable sort keeps the
    # rows' order within each bucket).
    order = pc.sort_indices(raw, sort_keys=[(name, "ascending") for name in SLOT])
    by_slot = raw.select([*SLOT, "starts"]).take(order)
    firsts = run_starts(by_slot, SLOT)
    fragments = pc.binary_join(
        pa.ListArray.from_arrays(
            pa.array(np.append(firsts, raw.num_rows), pa.int32()),
            recent_fragment_texts(raw).take(order),
        ),
        "",
    )
    slots = by_slot.take(pa.array(firsts))
    new, old = slots.column("starts"), pc.invert(slots.column("starts"))
    started, appended = slots.filter(new), slots.filter(old)
    changed = decided.bucket_counts
    names = _key_names(changed)
    kinds = [buckets, started, decided.dropped, decided.raw_removed, appended, notified]
    owners = [_owners(rows, names) for rows in kinds]
    counts = [np.bincount(owner, minlength=changed.num_rows) for owner in owners]
    anything = np.sum(counts, axis=0) > 0
    renumbered = np.cumsum(anything) - 1
    set_of, started_of, drop_of, removed_of, appended_of, notified_of = (
        renumbered[owner] for owner in owners
    )
    n_sets, n_started, n_drops, n_removed, n_appended, n_notified = (
        count[anything] for count in counts
    )
    changed = changed.filter(pa.array(anything))
    n = changed.num_rows
    # What each changed key held, and its layout from now on.
    held = pc.index_in(_key_names(stored), value_set=one_chunk(_key_names(changed)))
    stored = stored.filter(pc.is_valid(held))
    stored_of = held.drop_null().to_numpy(zero_copy_only=False).astype(np.int64)
    field = stored.column("field")
    was_dense = np.zeros(n, bool)
    was_dense[stored_of[pc.equal(field, HASH_MARK).to_numpy(zero_copy_only=False)]] = True
    after = changed.column("bucket_count").to_numpy(zero_copy_only=False)
    changes_only = was_dense & (after >= mirror.DENSE_KEEP_BUCKETS)
    turns_dense = ~was_dense & (after >= mirror.DENSE_MIN_BUCKETS)
    is_packed = ~changes_only & ~turns_dense
    whole = ~changes_only
    # A whole key's fields: those it held that the batch left alone, and the new ones.
    set_fields, started_fields = _starts(buckets), _raw_fields(started)
    notified_fields, notified_values = notified_field_texts(notified)
    new_of = np.concatenate([set_of, started_of, notified_of])
    new_fields = _texts([set_fields, started_fields, notified_fields])
    set_values = bucket_value_texts(buckets)  # made once: the dense keys' changes reuse it
    new_values = _texts([set_values, fragments.filter(new), notified_values])
    gone_of = np.concatenate([new_of, drop_of, removed_of, appended_of])
    gone = _owned_fields(
        gone_of,
        _texts([new_fields, _starts(decided.dropped), _raw_fields(decided.raw_removed),
                _raw_fields(appended)]),
    )  # fmt: skip
    held_fields = _owned_fields(stored_of, field)
    kept = whole[stored_of] & pc.invert(
        pc.or_(pc.is_in(held_fields, value_set=gone), pc.equal(field, HASH_MARK))
    ).to_numpy(zero_copy_only=False)
    is_new = whole[new_of]
    line_of = np.concatenate([stored_of[kept], new_of[is_new]])
    line_fields = _texts([field.filter(kept), new_fields.filter(is_new)])
    line_values = _texts([stored.column("value").filter(kept), new_values.filter(is_new)])
    # Raw events moved out of a packed key: their fragment starts with those it held.
    moved = pc.index_in(_owned_fields(appended_of, _raw_fields(appended)), value_set=held_fields)
    appended_texts = pc.if_else(
        pa.array(whole[appended_of]),
        pc.binary_join_element_wise(
            pc.fill_null(stored.column("value").take(moved), ""), fragments.filter(old), ""
        ),
        fragments.filter(old),
    )
    # A packed key's TTL starts again only when its newest bucket moves.
    newest_held = np.full(n, -1, np.int64)
    is_bucket = pc.match_substring_regex(field, r"^\d").to_numpy(zero_copy_only=False)
    np.maximum.at(
        newest_held, stored_of[is_bucket], pc.cast(field.filter(is_bucket), pa.int64()).to_numpy()
    )
    newest_set = np.full(n, -1, np.int64)
    np.maximum.at(newest_set, set_of, one_chunk(buckets.column("bucket_start")).to_numpy())
    # "2": it was dense (its hash goes), "1": its newest bucket moved, "0": neither.
    expire = np.where(was_dense, "2", np.where(newest_set > newest_held, "1", "0"))
    order = np.argsort(line_of, kind="stable")
    lines = pc.binary_join_element_wise(line_fields, "\t", line_values, "\n", "").take(order)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(np.bincount(line_of, minlength=n), out=offsets[1:])
    packed_values = pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets), lines), "")
    (dense,) = np.nonzero(changes_only)
    (packed,) = np.nonzero(is_packed)
    (fresh,) = np.nonzero(turns_dense)
    in_dense = [changes_only[of] for of in (set_of, started_of, notified_of, drop_of)]
    into_fresh = turns_dense[line_of]
    base = keys.key_base_texts(changed.column("signature_id"), changed.column("key"))
    # A packed key without raw-events changes (nearly every key): "state p<expire> value".
    alone = is_packed & (n_removed == 0) & (n_appended == 0)
    (tailed,) = np.nonzero(~alone)
    first = pc.if_else(pa.array(alone), pc.binary_join_element_wise(base, ":buckets", ""), base)
    packed_kind = np.char.add(np.where(alone, PACKED_ONLY_RUN, PACKED_RUN), expire)
    kind = np.where(changes_only, DENSE_CHANGES_RUN, np.where(turns_dense, DENSE_RUN, packed_kind))
    runs = flat_runs(
        n,
        [
            (np.arange(n), first),
            (np.arange(n), pa.array(kind, pa.string())),
            # a dense key's changes
            (dense, _counts(n_sets[dense])),
            (dense, _counts(n_started[dense] + n_notified[dense])),
            _pairs(set_of[in_dense[0]], set_fields.filter(in_dense[0]),
                   set_values.filter(in_dense[0])),
            _pairs(started_of[in_dense[1]], started_fields.filter(in_dense[1]),
                   fragments.filter(new).filter(in_dense[1])),
            _pairs(notified_of[in_dense[2]], notified_fields.filter(in_dense[2]),
                   notified_values.filter(in_dense[2])),
            (dense, _counts(n_drops[dense])),
            (drop_of[in_dense[3]], _starts(decided.dropped).filter(in_dense[3])),
            # a packed key whole
            (packed, packed_values.take(pa.array(packed))),
            # a key turning dense, whole
            (fresh, _counts(np.bincount(line_of, minlength=n)[fresh])),
            _pairs(line_of[into_fresh], line_fields.filter(into_fresh),
                   line_values.filter(into_fresh)),
            # every other key's raw events no longer kept and appended to
            (tailed, _counts(n_removed[tailed])),
            (removed_of, _starts(decided.raw_removed)),
            (tailed, _counts(n_appended[tailed])),
            _pairs(appended_of, _starts(appended), appended_texts),
        ],
    )  # fmt: skip
    return BucketChanges(pa.table({"base": base, "args": runs}, schema=KEY_RUNS))


def _counts(counts: np.ndarray) -> pa.Array:
    return pc.cast(pa.array(counts, pa.int64()), pa.string())


def _texts(parts: Sequence[pa.Array | pa.ChunkedArray]) -> pa.Array:
    return pa.concat_arrays([one_chunk(part).cast(pa.string()) for part in parts])


def _raw_fields(slots: pa.Table) -> pa.Array:
    """The ``~<start>`` field of each slot's raw events in its key's state."""
    return one_chunk(pc.binary_join_element_wise(RAW_FIELD, _starts(slots), ""))


def _owned_fields(owner: np.ndarray, fields: pa.Array) -> pa.Array:
    """One text per (key index, field), to look fields of keys up by."""
    owners = pc.cast(pa.array(owner, pa.int64()), pa.string())
    return one_chunk(pc.binary_join_element_wise(owners, fields, "\x1f"))


def _owners(rows: pa.Table, names: pa.ChunkedArray) -> np.ndarray:
    """The index in ``names`` (``_key_names``) of each row's (signature, key)."""
    index = pc.index_in(_key_names(rows), value_set=one_chunk(names))
    if index.null_count:
        raise ValueError("a change of a key the partition did not change")
    return index.to_numpy(zero_copy_only=False).astype(np.int64)


def _starts(slots: pa.Table) -> pa.ChunkedArray:
    return pc.cast(slots.column("bucket_start"), pa.string())


def _pairs(
    owner: np.ndarray, firsts: pa.Array | pa.ChunkedArray, seconds: pa.Array | pa.ChunkedArray
) -> tuple[np.ndarray, pa.Array]:
    """(first, second) of each row, one after the other, with their rows' owners."""
    rows = len(owner)
    interleaved = np.empty(2 * rows, np.int64)
    interleaved[0::2] = np.arange(rows)
    interleaved[1::2] = np.arange(rows) + rows
    texts = pa.concat_arrays([one_chunk(t).cast(pa.string()) for t in (firsts, seconds)])
    return np.repeat(owner, 2), texts.take(pa.array(interleaved))


def _key_names(rows: pa.Table) -> pa.ChunkedArray:
    """One text per (signature, key) of ``rows``, to look keys up by."""
    return pc.binary_join_element_wise(rows.column("signature_id"), rows.column("key"), "\x1f")


def _slots_of(rows: pa.Table, width_ms: int) -> set[BucketSlot]:
    slots = with_bucket_start(rows, width_ms)
    return set(zip(*(slots.column(n).to_pylist() for n in SLOT), strict=True))


def _keys_of(rows: pa.Table) -> pa.Table:
    """The distinct (signature, key)s of keyed rows."""
    return rows.select(list(_KEY)).group_by(list(_KEY)).aggregate([])


def _executor_name() -> str:
    """Where this task ran: host, Python worker process, and the working folder's name
    (on a standalone cluster, the executor's id; ``driver`` beside the driver)."""
    from pyspark import TaskContext

    where = f"{socket.gethostname()}:{os.getpid()}"
    if TaskContext.get() is None:
        return f"driver {where}"
    return f"{where}:{Path.cwd().name}"


def _task_attempt() -> int:
    """Which attempt of its Spark task this is (0 the first; a task re-run after its
    executor was lost counts up; 0 beside the driver)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return 0 if context is None else context.attemptNumber()


def _to_ipc(table: pa.Table, compression: str | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _from_ipc(blob: bytes) -> pa.Table:
    return pa.ipc.open_stream(blob).read_all()
