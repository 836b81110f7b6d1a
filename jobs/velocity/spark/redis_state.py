"""Redis as the copy of the Delta state: refilled from it, checked and repaired against it.

Redis holds the stream's hot buckets, the accepted transactionIds and the stream's
progress; Delta plus the stream's spool holds every committed batch. This is the one
place that moves state from Delta to Redis (the stream's own batches go through
``velocity.redis.mirror.stream_commit``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from functools import reduce
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
import redis
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType
from redis.cluster import RedisCluster

from velocity.delta.live import LiveState, last_committed_batch
from velocity.delta.write_behind import InputSpool, flushed_batch
from velocity.domain.alerts import AlertKind
from velocity.domain.committed import Rollback, known_committed, rolled_back
from velocity.domain.rules import Rule, deciding_rules, key_text
from velocity.domain.stream_batch import SignatureKey
from velocity.redis import cluster, connection, mirror
from velocity.redis.lock import state_lock
from velocity.settings import Settings


class RedisState:
    """Redis as the copy of ``state`` (one data dir's live tables)."""

    def __init__(self, state: LiveState, client: redis.Redis) -> None:
        self.state = state
        self.settings = state.settings
        self.redis = client

    def is_current(self) -> bool:
        """True when Redis holds this data dir's whole state: false after a flush or on a
        new Redis, and after the stream stopped committing for longer than the horizon's
        slack (allowed lateness + one bucket). Bucket hashes expire on the clock while
        eventTime stands still in a stop, so after a long one a hash may be gone whose
        buckets are still inside the horizon."""
        keys = self.settings.redis_keys
        if self.redis.get(keys.mirror_marker) != str(self.settings.data_dir):
            return False
        at = self.redis.hget(keys.stream_progress, "at")
        slack_ms = self.settings.allowed_lateness_ms + self.settings.bucket_width_ms
        return at is None or int(time.time() * 1000) - int(at) <= slack_ms  # type: ignore[arg-type]

    def rolled_back(self) -> Rollback | None:
        """The rollback when Redis's progress is behind a batch the checkpoint or Delta
        knows committed (``velocity.domain.committed``): a Redis restored from an older
        snapshot, which still names this data dir. None when it is not (a batch replayed
        after a crash is not). Reads the checkpoint, the input spool and each spooled
        table's Delta log: for a start, not for every batch."""
        return rolled_back(
            mirror.committed_batch(self.redis, self.settings),
            checkpoint=last_committed_batch(self.settings),
            delta=flushed_batch(self.settings),
            undecided=InputSpool(self.settings).batches(),
        )

    def committed_through(self) -> int | None:
        """The newest batch known committed outside Redis (the checkpoint's or Delta's,
        but not one whose input still waits in the input spool: the stream decides it, or
        finds it committed, at its start)."""
        return known_committed(
            last_committed_batch(self.settings),
            flushed_batch(self.settings),
            InputSpool(self.settings).batches(),
        )

    def flush_spooled(self) -> None:
        """Append every batch the stream committed but has not written to Delta yet (hold
        the state lock: then no batch is half committed)."""
        committed = [
            last_committed_batch(self.settings),
            mirror.committed_batch(self.redis, self.settings),
        ]
        self.state.flush_spool(max((b for b in committed if b is not None), default=None))

    def rebuild(self, through: int | None = None) -> int:
        """Refill Redis from Delta: rules in force, every bucket inside the horizon, the
        accepted transactionIds inside the de-duplication horizon, and the stream's progress.

        Flushes the spooled batches up to ``through`` first (None: ``committed_through``),
        so Delta holds everything Redis held. Idempotent (absolute values); returns the
        number of buckets written.
        """
        if through is None:
            through = self.committed_through()
        self.state.flush_spool(through)
        rules = deciding_rules(self.state.rule_store.in_force())
        keys = self.settings.redis_keys
        if connection.is_cluster(self.redis):
            cluster.forget_staging(cast(RedisCluster, self.redis), keys)
        mirror.forget_partitions(self.redis, keys)
        mirror.publish_rules(
            self.redis,
            keys,
            rules,
            self.settings.bucket_width_ms,
            self.settings.max_future_seconds * 1000,
        )
        written = 0
        # A new data dir's tables hold nothing to refill: no Spark job for them.
        if not self.state.unwritten("buckets"):
            written = self.write_buckets(self.state.buckets_in_horizon(rules), rules)
        if not self.state.unwritten("alerts"):
            self._write_last_notified(rules)
        if not self.state.unwritten("events"):
            self._write_accepted()
        newest = self.state.newest_event_time()
        self.redis.hset(
            keys.stream_progress,
            mapping={
                "batch": -1 if through is None else through,
                "newest": "" if newest is None else newest,
                "at": int(time.time() * 1000),  # whole as of now (see ``is_current``)
                mirror.STATE_LAYOUT_FIELD: mirror.STATE_LAYOUT,
            },
        )
        self.redis.set(keys.mirror_marker, str(self.settings.data_dir))
        return written

    def _write_last_notified(self, rules: list[Rule]) -> None:
        """Each cooled rule version's last notified alert per key (SPEC §3 cooldown), from
        the alerts table: the newest ALERT by (eventTime, transactionId) that was not
        suppressed (a backfill's retraction does not take a notification back)."""
        cooled = [r for r in rules if r.cooldown_minutes]
        if not cooled:
            return
        alerts = self.state.read("alerts").where(
            (F.col("kind") == AlertKind.ALERT.value)
            & ~F.coalesce(F.col("suppressed"), F.lit(False))
        )
        parts = [
            alerts.where(
                (F.col("ruleId") == r.rule_id) & (F.col("ruleVersion") == r.version)
            ).select(
                "ruleId",
                "ruleVersion",
                "signature_id",
                F.array(*[F.col("key")[name] for name in r.signature.grouping_keys]).alias(
                    "values"
                ),
                F.struct("eventTime", "transactionId").alias("alert"),
            )
            for r in cooled
        ]
        newest = (
            reduce(DataFrame.unionAll, parts)
            .groupBy("ruleId", "ruleVersion", "signature_id", "values")
            .agg(F.max("alert").alias("alert"))
        )
        settings = self.settings
        ttl = mirror.key_ttl_seconds(rules, settings)

        def write(rows: Iterator[Any]) -> None:
            client = connection.connect(settings)
            try:
                last = (
                    {
                        "signature_id": row["signature_id"],
                        "key": key_text(row["values"]),
                        "ruleId": row["ruleId"],
                        "ruleVersion": row["ruleVersion"],
                        "eventTime": row["alert"]["eventTime"],
                        "transactionId": row["alert"]["transactionId"],
                    }
                    for row in rows
                )
                mirror.write_last_notified(client, settings.redis_keys, last, ttl)
            finally:
                client.close()

        newest.foreachPartition(write)

    def _write_accepted(self) -> None:
        """Remember the accepted transactionIds of the de-duplication horizon as the stream's
        commit does (velocity.lua's ``remember_seen``): in the hash of the horizon-long span
        they were ingested in, for the spans still read (this one and the one before)."""
        horizon_ms = self.settings.dedup_horizon_seconds * 1000
        now = int(time.time() * 1000)
        first_span = now // horizon_ms - 1
        recent = self.state.read("events").where(F.col("ingest_time") >= first_span * horizon_ms)
        prefix = self.settings.redis_keys.seen_prefix
        settings = self.settings

        def write(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            # A span's ids of an Arrow batch in one HSET: two commands an id took 31 s
            # for 1.8M ids.
            client = connection.connect(settings)
            try:
                for batch in batches:
                    spans = pc.divide(batch.column("ingest_time"), horizon_ms)
                    pipe = client.pipeline(transaction=False)
                    for span in pc.unique(spans).to_pylist():
                        mine = batch.filter(pc.equal(spans, span))
                        ids = mine.column("transactionId").to_pylist()
                        batches_of = pc.cast(mine.column("stream_batch"), pa.string()).to_pylist()
                        name = f"{prefix}{span}"
                        pipe.hset(name, mapping=dict(zip(ids, batches_of, strict=True)))
                        pipe.pexpireat(name, (span + 2) * horizon_ms)
                    pipe.execute()
                    yield pa.RecordBatch.from_pydict({"written": [batch.num_rows]}, mirror.WRITTEN)
            finally:
                client.close()

        recent.select("transactionId", "ingest_time", "stream_batch").mapInArrow(
            write, "written long"
        ).agg(F.sum("written")).collect()

    def write_buckets(
        self, buckets: DataFrame, rules: list[Rule], evict_before: int | None = None
    ) -> int:
        """Write g-wide bucket rows' absolute values (each Spark task writes its own, a key's
        rows side by side); returns the rows written."""
        ttl = mirror.key_ttl_seconds(rules, self.settings)
        writer = mirror.bucket_table_writer(self.settings, ttl, evict_before)
        written = (
            buckets.select(*mirror.BUCKET_ROWS.names)
            .sortWithinPartitions("signature_id", "key")
            .mapInArrow(writer, "written long")
            .agg(F.sum("written"))
            .first()
        )
        return int(written[0] or 0) if written is not None else 0

    def reconcile(self) -> mirror.Drift:
        """Compare Redis with the Delta buckets inside the horizon (reads only).

        Every key is compared without the state lock, by Spark tasks (the stream keeps
        committing meanwhile); the keys that differed are compared again under the lock,
        after the spooled batches are flushed, and only their drift counts: a key a batch
        changed mid-pass, or whose batch Delta did not hold yet, is no drift. The stream
        waits for the suspects alone (it waited for the whole comparison: 6.5 minutes at
        2.5M buckets).
        """
        drift, suspects = self._first_pass()
        if drift.clean:
            return drift
        with state_lock(self.redis, self.settings, "reconcile"):
            return self._confirmed(drift, suspects)

    def repair(self) -> tuple[mirror.Drift, int]:
        """Compare (as ``reconcile``), then rewrite Redis from Delta and drop the buckets
        only Redis had, in the hold of the lock that confirmed the drift (a batch
        committed in between would be overwritten, or its new buckets dropped). Returns
        the drift found and the buckets written."""
        found, suspects = self._first_pass()
        if found.clean:
            return found, 0
        with state_lock(self.redis, self.settings, "reconcile --repair"):
            drift = self._confirmed(found, suspects)
            if drift.clean:
                return drift, 0
            written = self.rebuild()
            mirror.remove_buckets(self.redis, self.settings.redis_keys, drift.extra)
            return drift, written

    def _first_pass(self) -> tuple[mirror.Drift, set[SignatureKey]]:
        """Every (signature, key) of the horizon compared by the Spark task that holds its
        rows, and the states only Redis has (of the active signatures) in the driver;
        returns the drift and the keys it names."""
        rules = deciding_rules(self.state.rule_store.in_force())
        since = self.state.horizon_cutoff(rules)
        rows = (
            self.state.buckets_in_horizon(rules)
            .repartition("signature_id", "key")
            .mapInArrow(key_partition_drift(self.settings, since), DRIFT_ROWS)
            .toArrow()
        )
        kinds = rows.column("kind")
        compared = rows.filter(pc.equal(kinds, "key"))
        known = _pairs(compared)
        active = {r.signature.signature_id for r in rules}
        keys = self.settings.redis_keys
        only_in_redis = [
            name
            for name, slot in mirror.bucket_hashes(self.redis, keys)
            if slot[0] in active and slot not in known
        ]
        drift = _drift_of(rows)
        if only_in_redis:
            ghosts = mirror.compare_buckets(
                self.redis, keys, mirror.BUCKET_ROWS.empty_table(), since, only_in_redis
            )
            drift.extra = sorted(drift.extra + ghosts.extra)
        suspects = {(s, k) for s, k, _ in (*drift.missing, *drift.different, *drift.extra)}
        return drift, suspects

    def _confirmed(self, found: mirror.Drift, suspects: set[SignatureKey]) -> mirror.Drift:
        """The drift of the keys ``suspects`` (named by ``found``) compared again, after
        the spooled batches are flushed so that Delta holds what Redis holds; hold the
        state lock. More than CONFIRM_MAX_KEYS suspects (a flushed Redis): every key again."""
        self.flush_spooled()
        if len(suspects) > CONFIRM_MAX_KEYS:
            drift, _ = self._first_pass()
            return drift
        rules = deciding_rules(self.state.rule_store.in_force())
        since = self.state.horizon_cutoff(rules)
        keys = self.settings.redis_keys
        asked = pa.table(
            {
                "signature_id": pa.array([s for s, _ in suspects], pa.string()),
                "key": pa.array([k for _, k in suspects], pa.string()),
            }
        )
        rows = mirror.BUCKET_ROWS.empty_table()
        if since is not None:
            buckets = self.state.read("buckets")
            rows = self.state.window_buckets(
                buckets, since=since, keys=self.state.spark.createDataFrame(asked)
            ).toArrow()
        present = _pairs(rows)
        also = [keys.bucket_hash(s, k) for s, k in sorted(suspects - present)]
        drift = mirror.compare_buckets(self.redis, keys, rows, since, also)
        drift.checked = found.checked
        return drift


# What a key-partition's comparison hands the driver: a row a drifted bucket (kind
# missing, different or extra), a row a (signature, key) compared (kind "key") and its
# count of buckets compared (kind "checked", the count in bucket_start).
DRIFT_ROWS = StructType(
    [
        StructField("kind", StringType(), False),
        StructField("signature_id", StringType(), True),
        StructField("key", StringType(), True),
        StructField("bucket_start", LongType(), True),
    ]
)
_DRIFT_KINDS = ("missing", "different", "extra")
# More keys than this differing in the pass without the lock (a flushed Redis, a stream
# far behind) are compared again whole under the lock, not by a Delta read of each.
CONFIRM_MAX_KEYS = 50_000


def key_partition_drift(
    settings: Settings, since: int | None
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function: a task compares the keys whose rows it holds (each
    key's rows all in one task) with Redis, reading their states itself."""

    def compare(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        listed = list(batches)
        if not listed:
            return
        rows = pa.Table.from_batches(listed)
        client = connection.connect(settings)
        try:
            drift = mirror.compare_buckets(client, settings.redis_keys, rows, since)
        finally:
            client.close()
        pairs = rows.group_by(["signature_id", "key"]).aggregate([])
        slots = [(kind, *slot) for kind in _DRIFT_KINDS for slot in getattr(drift, kind)]
        yield pa.RecordBatch.from_pydict(
            {
                "kind": [k for k, *_ in slots] + ["key"] * pairs.num_rows + ["checked"],
                "signature_id": [s for _, s, _, _ in slots]
                + pairs.column("signature_id").to_pylist()
                + [None],
                "key": [k for _, _, k, _ in slots] + pairs.column("key").to_pylist() + [None],
                "bucket_start": [b for *_, b in slots] + [None] * pairs.num_rows + [rows.num_rows],
            },
            schema=DRIFT_ARROW,
        )

    return compare


DRIFT_ARROW = pa.schema(
    [
        pa.field("kind", pa.string(), False),
        pa.field("signature_id", pa.string()),
        pa.field("key", pa.string()),
        pa.field("bucket_start", pa.int64()),
    ]
)


def _drift_of(rows: pa.Table) -> mirror.Drift:
    """The Drift the key-partitions' rows (``DRIFT_ROWS``) add up to."""
    kinds = rows.column("kind")
    drift = mirror.Drift(
        checked=int(
            pc.sum(rows.filter(pc.equal(kinds, "checked")).column("bucket_start")).as_py() or 0
        )
    )
    for kind in _DRIFT_KINDS:
        part = rows.filter(pc.equal(kinds, kind))
        slots = zip(
            *(part.column(c).to_pylist() for c in ("signature_id", "key", "bucket_start")),
            strict=True,
        )
        setattr(drift, kind, sorted(slots))
    return drift


def _pairs(rows: pa.Table) -> set[SignatureKey]:
    """The (signature, key)s of ``rows``."""
    columns = (rows.column(c).to_pylist() for c in ("signature_id", "key"))
    return set(zip(*columns, strict=True))
