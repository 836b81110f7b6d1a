"""Redis as the copy of the Delta state: refilled from it, checked and repaired against it.

Redis holds the stream's hot buckets, the accepted transactionIds and the stream's
progress; Delta plus the stream's spool holds every committed batch. This is the one
place that moves state from Delta to Redis (the stream's own batches go through
``velocity.redis.mirror.stream_commit``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import reduce
from typing import Any, cast

import redis
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from redis.cluster import RedisCluster

from velocity.delta.live import LiveState, last_committed_batch
from velocity.delta.write_behind import InputSpool, flushed_batch
from velocity.domain.alerts import AlertKind
from velocity.domain.committed import Rollback, known_committed, rolled_back
from velocity.domain.rules import Rule, deciding_rules, key_text
from velocity.redis import cluster, connection, mirror
from velocity.redis.lock import state_lock


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
            buckets = self.state.buckets_in_horizon(rules)
            written = buckets.count()
            self.write_buckets(buckets, rules)
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

        def write(rows: Iterator[Any]) -> None:
            client = connection.connect(settings)
            pipe = client.pipeline(transaction=False)
            for count, row in enumerate(rows, 1):
                span = row["ingest_time"] // horizon_ms
                name = f"{prefix}{span}"
                pipe.hset(name, row["transactionId"], str(row["stream_batch"]))
                pipe.pexpireat(name, (span + 2) * horizon_ms)
                if count % 1000 == 0:
                    pipe.execute()
            pipe.execute()
            client.close()

        recent.select("transactionId", "ingest_time", "stream_batch").foreachPartition(write)

    def write_buckets(
        self, buckets: DataFrame, rules: list[Rule], evict_before: int | None = None
    ) -> None:
        """Write g-wide bucket rows' absolute values (each Spark task writes its own)."""
        ttl = mirror.key_ttl_seconds(rules, self.settings)
        buckets.foreachPartition(mirror.bucket_rows_writer(self.settings, ttl, evict_before))

    def reconcile(self) -> mirror.Drift:
        """Compare Redis with the Delta buckets inside the horizon (reads only)."""
        with state_lock(self.redis, self.settings, "reconcile"):
            return self._drift()

    def repair(self) -> tuple[mirror.Drift, int]:
        """Compare, then rewrite Redis from Delta and drop the buckets only Redis had, in
        one hold of the lock (a batch committed in between would be overwritten, or its
        new buckets dropped). Returns the drift found and the buckets written."""
        with state_lock(self.redis, self.settings, "reconcile --repair"):
            drift = self._drift()
            if drift.clean:
                return drift, 0
            written = self.rebuild()
            mirror.remove_buckets(self.redis, self.settings.redis_keys, drift.extra)
            return drift, written

    def _drift(self) -> mirror.Drift:
        """Redis against Delta, after the spooled batches are flushed so that Delta holds
        what Redis holds; hashes only Redis has (of the active signatures) count too."""
        self.flush_spooled()
        rules = deciding_rules(self.state.rule_store.in_force())
        rows = self.state.buckets_in_horizon(rules).orderBy("signature_id", "key")
        return mirror.compare_buckets(
            self.redis,
            self.settings.redis_keys,
            (r.asDict() for r in rows.toLocalIterator()),
            self.state.horizon_cutoff(rules),
            {r.signature.signature_id for r in rules},
        )
