"""`velocity stream`: per-event evaluation over a folder of JSON lines, Delta as state of record.

Each micro-batch (``process_batch``), in this order:

1. parse the new lines; quarantine the bad ones;
2. drop duplicates: within the batch the first arrival wins, and any transactionId
   already in the events table from an earlier batch;
3. append the accepted events (with their batch id) to the events table;
4. read the rules in force (so rule changes reach the next batch without a restart);
   build the buckets of any newly active signature from the raw events, and drop those
   of signatures no longer active;
5. merge the batch's bucket deltas into the buckets table;
6. record late events (older than the watermark: the highest eventTime of earlier
   batches minus the allowed lateness) — they are in the buckets, but not evaluated;
7. evaluate every other new event from the stored buckets plus its own bucket's raw
   events, and append the alerts.

Exactly once: every Delta write of a batch carries a transaction id
(``txnAppId`` = this job and table, ``txnVersion`` = the batch id), so a batch
replayed after a crash rewrites nothing that already committed; the de-duplication
ignores the replayed batch's own events; alert ids are deterministic.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from velocity.alerts import record_of_stored
from velocity.delta import tables
from velocity.delta.rule_store import RuleStore
from velocity.redis import mirror
from velocity.redis.lock import state_lock
from velocity.rules import Rule, RuleSignature, active_rules, rules_by_signature
from velocity.settings import Settings
from velocity.spark.evaluate import (
    bucket_aggregates,
    evaluate_from_state,
    keyed_events,
    minute_buckets,
    state_rows,
)
from velocity.spark.ingest import parse_events, split_parsed, with_line_order, with_line_source
from velocity.timing import StepTimer

log = logging.getLogger("velocity.stream")
APP_ID = "velocity-stream"
# Names the data dir whose buckets Redis mirrors; gone after a flush, so a start rebuilds.
MIRROR_MARKER = "velocity:mirror"


@dataclass(frozen=True)
class LiveTables:
    """Where the live system's tables are, under ``<data_dir>/tables``."""

    events: Path
    quarantine: Path
    duplicates: Path
    late_events: Path
    buckets: Path
    alerts: Path
    signatures: Path
    rules: Path
    backfills: Path

    @classmethod
    def of(cls, settings: Settings) -> LiveTables:
        return cls(
            **{
                name: settings.table_path(getattr(tables, name.upper()))
                for name in cls.__dataclass_fields__
            }
        )


LIVE_SCHEMAS = {
    "events": tables.LIVE_EVENT_SCHEMA,
    "quarantine": tables.QUARANTINE_SCHEMA,
    "duplicates": tables.EVENT_SCHEMA,
    "late_events": tables.LATE_EVENT_SCHEMA,
    "buckets": tables.BUCKET_SCHEMA,
    "alerts": tables.ALERT_SCHEMA,
    "signatures": tables.SIGNATURE_SCHEMA,
    "rules": tables.RULE_SCHEMA,
    "backfills": tables.BACKFILL_SCHEMA,
}


def newest_event_time(spark: SparkSession, live: LiveTables) -> int | None:
    """The highest accepted eventTime: the clock that seals buckets and sets the horizon."""
    row = tables.read_table(spark, live.events).agg(F.max("eventTime")).first()
    return None if row is None or row[0] is None else int(row[0])


def ensure_live_tables(spark: SparkSession, live: LiveTables) -> None:
    """Create every live table that is missing (idempotent)."""
    for name, schema in LIVE_SCHEMAS.items():
        tables.create_if_missing(spark, getattr(live, name), schema)


@contextmanager
def idempotent_dml(spark: SparkSession, app_id: str, version: int) -> Iterator[None]:
    """MERGE/UPDATE/DELETE inside are skipped by Delta if (app_id, version) already committed."""
    spark.conf.set("spark.databricks.delta.write.txnAppId", app_id)
    spark.conf.set("spark.databricks.delta.write.txnVersion", str(version))
    try:
        yield
    finally:
        spark.conf.unset("spark.databricks.delta.write.txnAppId")
        spark.conf.unset("spark.databricks.delta.write.txnVersion")


def merge_buckets(spark: SparkSession, path: Path, deltas: DataFrame) -> None:
    """Add bucket deltas to the stored buckets (counts add, extremes widen, sets unite)."""
    from delta.tables import DeltaTable

    def added(column: str) -> Column:
        t, s = F.col(f"t.{column}"), F.col(f"s.{column}")
        return F.when(t.isNull(), s).when(s.isNull(), t).otherwise(t + s)

    (
        DeltaTable.forPath(spark, str(path))
        .alias("t")
        .merge(
            deltas.alias("s"),
            # A compacted hour never matches: a late delta into it lands as a g-wide row.
            "t.signature_id = s.signature_id AND t.key = s.key"
            " AND t.bucket_start = s.bucket_start AND t.bucket_width_ms = s.bucket_width_ms",
        )
        .whenMatchedUpdate(
            set={
                "event_count": F.col("t.event_count") + F.col("s.event_count"),
                "value_count": F.col("t.value_count") + F.col("s.value_count"),
                "value_sum": added("value_sum").cast(tables.SUM_TYPE),
                "value_min": F.least("t.value_min", "s.value_min"),
                "value_max": F.greatest("t.value_max", "s.value_max"),
                "distinct_values": F.array_sort(
                    F.array_union("t.distinct_values", "s.distinct_values")
                ),
            }
        )
        .whenNotMatchedInsertAll()
        .execute()
    )


class StreamJob:
    """The streaming job over one data dir; ``process_batch`` is its foreachBatch function."""

    def __init__(self, spark: SparkSession, settings: Settings) -> None:
        self.spark = spark
        self.settings = settings
        self.live = LiveTables.of(settings)
        self.rule_store = RuleStore(spark, self.live.rules)
        ensure_live_tables(spark, self.live)
        self.redis = mirror.connect(settings)
        mirror.load_functions(self.redis)
        self._timer = StepTimer()

    def mirror_is_current(self) -> bool:
        """True when Redis holds this data dir's mirror (false after a flush or a new Redis)."""
        return self.redis.get(MIRROR_MARKER) == str(self.settings.data_dir)

    def rebuild_mirror(self) -> int:
        """Refill Redis from Delta: rules in force and every bucket inside the horizon.

        Idempotent (absolute values); returns the number of buckets written.
        """
        rules = active_rules(self.rule_store.in_force())
        mirror.publish_rules(self.redis, rules, self.settings.bucket_width_ms)
        buckets = self._buckets_in_horizon(rules)
        written = buckets.count()
        self.mirror_buckets(buckets, rules)
        self.redis.set(MIRROR_MARKER, str(self.settings.data_dir))
        return written

    def reconcile_mirror(self) -> mirror.Drift:
        """Compare Redis with the Delta buckets inside the horizon (reads only)."""
        rules = active_rules(self.rule_store.in_force())
        rows = self._buckets_in_horizon(rules).orderBy("signature_id", "key")
        return mirror.compare_buckets(
            self.redis, (r.asDict() for r in rows.toLocalIterator()), self.horizon_cutoff(rules)
        )

    def repair_mirror(self, drift: mirror.Drift) -> int:
        """Rewrite Redis from Delta and drop the buckets only Redis had; returns buckets written."""
        written = self.rebuild_mirror()
        mirror.remove_buckets(self.redis, drift.extra)
        return written

    def _buckets_in_horizon(self, rules: list[Rule]) -> DataFrame:
        """g-wide buckets the mirror holds: those starting within the widest window +
        lateness + one bucket of the newest eventTime (the "widest window" state of the
        Flink design) — the cutoff every eviction of Delta and Redis uses, at its latest."""
        buckets = self.read("buckets")
        cutoff = self.horizon_cutoff(rules)
        if cutoff is None:
            return self.window_buckets(buckets.limit(0))
        return self.window_buckets(buckets, since=cutoff)

    def horizon_cutoff(self, rules: list[Rule]) -> int | None:
        """The oldest bucket start the state keeps: newest eventTime − horizon (None: no
        events or no rules)."""
        newest = newest_event_time(self.spark, self.live)
        if newest is None or not rules:
            return None
        return newest - mirror.horizon_seconds(rules, self.settings) * 1000

    def window_buckets(
        self, buckets: DataFrame, since: int | None = None, keys: DataFrame | None = None
    ) -> DataFrame:
        """``buckets`` as g-wide buckets, only those starting at ``since`` or later and of
        the (signature, key) pairs in ``keys``; rows are pruned before hours are expanded."""
        if since is not None:
            buckets = buckets.where(F.col("bucket_start") + F.col("bucket_width_ms") > since)
        if keys is not None:
            buckets = buckets.join(keys, ["signature_id", "key"], "left_semi")
        minutes = minute_buckets(buckets, self.settings.bucket_width_ms)
        return minutes if since is None else minutes.where(F.col("bucket_start") >= since)

    def mirror_buckets(
        self, buckets: DataFrame, rules: list[Rule], evict_before: int | None = None
    ) -> None:
        ttl = mirror.horizon_seconds(rules, self.settings)
        buckets.foreachPartition(mirror.bucket_rows_writer(self.settings, ttl, evict_before))

    def evict(self, rules: list[Rule], newest_event_time: int) -> int:
        """Delete Delta buckets that start before the horizon; returns that cutoff.

        The horizon is the widest active window + allowed lateness + one bucket behind
        the newest eventTime already decided (``newest_event_time``; for the stream, that
        of the earlier batches): no window of a non-late event still to come reaches
        below it, and it shrinks when the widest rule goes. Idempotent.
        """
        cutoff = newest_event_time - mirror.horizon_seconds(rules, self.settings) * 1000
        # A compacted hour goes when its last g-wide bucket starts before the cutoff.
        last_part = f"bucket_start + bucket_width_ms - {self.settings.bucket_width_ms}"
        self.spark.sql(f"DELETE FROM delta.`{self.live.buckets}` WHERE {last_part} < {cutoff}")
        return cutoff

    def _append(self, df: DataFrame, name: str, batch_id: int) -> None:
        tables.append_once(df, getattr(self.live, name), f"{APP_ID}:{name}", batch_id)

    def read(self, name: str) -> DataFrame:
        return tables.read_table(self.spark, getattr(self.live, name))

    def process_batch(self, lines: DataFrame, batch_id: int) -> None:
        """One micro-batch (the foreachBatch function); logs one JSON line when done."""
        self._timer = StepTimer()
        with state_lock(self.redis, self.settings, f"stream batch {batch_id}"):
            self._timer.mark("lock")
            alerts = self._process(lines, batch_id)
        log.info(
            json.dumps(
                {
                    "batch": batch_id,
                    "alerts": alerts,
                    "seconds": round(self._timer.total, 3),
                    "steps": self._timer.steps,
                    "finished": int(time.time() * 1000),
                }
            )
        )

    def _process(self, lines: DataFrame, batch_id: int) -> int:
        spark = self.spark
        settings = self.settings
        width_ms = settings.bucket_width_ms
        decision_time = int(time.time() * 1000)

        parsed = parse_events(with_line_order(lines)).persist()
        try:
            ingested = split_parsed(parsed)
            self._append(ingested.quarantine, "quarantine", batch_id)
            earlier = self.read("events").where(F.col("stream_batch") != batch_id)
            seen = earlier.select("transactionId")
            fresh = ingested.events.join(seen, "transactionId", "left_anti")
            repeated = ingested.events.join(seen, "transactionId", "left_semi")
            self._append(ingested.duplicates.unionByName(repeated), "duplicates", batch_id)
            self._append(
                fresh.withColumn("stream_batch", F.lit(batch_id).cast("long")), "events", batch_id
            )
        finally:
            parsed.unpersist()
        self._timer.mark("ingest")

        events = self.read("events")
        batch_events = events.where(F.col("stream_batch") == batch_id).persist()
        try:
            rules = active_rules(self.rule_store.in_force())
            mirror.publish_rules(self.redis, rules, width_ms)
            signatures = list(rules_by_signature(rules))
            self._sync_signatures(signatures, rules, batch_id)
            self._timer.mark("rules")
            keyed = keyed_events(batch_events, signatures).persist()
            deltas = bucket_aggregates(keyed, width_ms).persist()
            try:
                with idempotent_dml(spark, f"{APP_ID}:buckets", batch_id):
                    merge_buckets(spark, self.live.buckets, deltas)
                self._timer.mark("bucket-merge")
                slots = deltas.select("signature_id", "key", "bucket_start")
                oldest_slot = deltas.agg(F.min("bucket_start")).first()
                changed = self.window_buckets(
                    self.read("buckets"),
                    since=None if oldest_slot is None else oldest_slot[0],
                    keys=slots.select("signature_id", "key").distinct(),
                ).join(slots, ["signature_id", "key", "bucket_start"], "left_semi")
                # The newest eventTime of the earlier batches: the watermark's reference.
                earlier_row = (
                    events.where(F.col("stream_batch") < batch_id).agg(F.max("eventTime")).first()
                )
                newest_earlier = None if earlier_row is None else earlier_row[0]
                # The horizon is measured from the newest eventTime of the *earlier*
                # batches: this batch's oldest non-late event (>= that minus the lateness)
                # still needs its whole window, so nothing it reads may go first.
                cutoff = None
                if newest_earlier is not None and rules:
                    horizon_ms = mirror.horizon_seconds(rules, settings) * 1000
                    cutoff = int(newest_earlier) - horizon_ms
                    if batch_id % settings.eviction_every_batches == 0:
                        self.evict(rules, int(newest_earlier))
                self.mirror_buckets(changed, rules, cutoff)
                self._timer.mark("evict+mirror")
                return self._evaluate(
                    events, batch_events, keyed, rules, batch_id, decision_time, newest_earlier
                )
            finally:
                deltas.unpersist()
                keyed.unpersist()
        finally:
            batch_events.unpersist()

    def _sync_signatures(
        self, signatures: list[RuleSignature], rules: list[Rule], batch_id: int
    ) -> None:
        """Build newly active signatures from the raw events; forget inactive ones.

        A signature is also rebuilt when the widest active window grows past the history
        its buckets kept (eviction dropped the rest), so a wider rule sees its whole
        window (SPEC §2).
        """
        spark = self.spark
        widest = max((r.window_ms for r in rules), default=0)
        kept = {r["signature_id"]: r["kept_window_ms"] for r in self.read("signatures").collect()}
        wanted = {s.signature_id: s for s in signatures}
        for gone in sorted(set(kept) - set(wanted)):
            spark.sql(f"DELETE FROM delta.`{self.live.buckets}` WHERE signature_id = '{gone}'")
            spark.sql(f"DELETE FROM delta.`{self.live.signatures}` WHERE signature_id = '{gone}'")
        short = {s for s in set(wanted) & set(kept) if (kept[s] or 0) < widest}
        for signature_id in sorted((set(wanted) - set(kept)) | short):
            self._build_signature(wanted[signature_id], rules, widest, batch_id)
        # Eviction will keep only the narrower history from now on: remember it.
        spark.sql(
            f"UPDATE delta.`{self.live.signatures}` SET kept_window_ms = {widest} "
            f"WHERE kept_window_ms > {widest}"
        )

    def _build_signature(
        self, signature: RuleSignature, rules: list[Rule], widest: int, batch_id: int
    ) -> None:
        """(Re)build one signature's buckets from the raw events of the earlier batches
        inside the horizon, then record it. Idempotent: a half-done build (a crash between
        its commits) is started again from nothing, so nothing counts twice."""
        spark, signature_id = self.spark, signature.signature_id
        history = self.read("events").where(F.col("stream_batch") < batch_id)
        newest = history.agg(F.max("eventTime")).first()
        if newest is not None and newest[0] is not None:
            horizon_ms = mirror.horizon_seconds(rules, self.settings) * 1000
            history = history.where(F.col("eventTime") >= int(newest[0]) - horizon_ms)
        for table in (self.live.signatures, self.live.buckets):
            spark.sql(f"DELETE FROM delta.`{table}` WHERE signature_id = '{signature_id}'")
        deltas = bucket_aggregates(
            keyed_events(history, [signature]), self.settings.bucket_width_ms
        )
        merge_buckets(spark, self.live.buckets, deltas)
        record = spark.createDataFrame(
            [(signature_id, json.dumps(signature.to_json(), sort_keys=True), batch_id, widest)],
            tables.SIGNATURE_SCHEMA,
        )
        record.write.format("delta").mode("append").save(str(self.live.signatures))
        built_now = self._buckets_in_horizon(rules).where(F.col("signature_id") == signature_id)
        self.mirror_buckets(built_now, rules)

    def _evaluate(
        self,
        events: DataFrame,
        batch_events: DataFrame,
        keyed: DataFrame,
        rules: list[Rule],
        batch_id: int,
        decision_time: int,
        newest_earlier: int | None,
    ) -> int:
        """Record late events, decide the others; returns the number of alerts.

        ``newest_earlier`` is the highest eventTime of the earlier batches (None: none).
        """
        settings = self.settings
        width_ms = settings.bucket_width_ms
        watermark = (
            None if newest_earlier is None else newest_earlier - settings.allowed_lateness_ms
        )
        late_condition = F.lit(False) if watermark is None else F.col("eventTime") < watermark
        late = batch_events.where(late_condition).select(
            "transactionId",
            "eventTime",
            F.lit(watermark).cast("long").alias("watermark"),
            F.lit(batch_id).cast("long").alias("stream_batch"),
        )
        self._append(late, "late_events", batch_id)
        self._timer.mark("late")

        targets = keyed.where(~late_condition)
        bounds = targets.agg(F.min("eventTime"), F.max("eventTime")).first()
        if bounds is None or bounds[0] is None:
            self._append(self.spark.createDataFrame([], tables.ALERT_SCHEMA), "alerts", batch_id)
            return 0
        first_time, last_time = int(bounds[0]), int(bounds[1])
        widest_ms = max(r.window_ms for r in rules)
        target_keys = targets.select("signature_id", "key").distinct()
        stored = self.window_buckets(
            self.read("buckets").where(F.col("bucket_start") <= last_time),
            since=first_time - widest_ms - width_ms,
            keys=target_keys,
        )
        own_from = first_time - first_time % width_ms
        recent = events.where(F.col("eventTime").between(own_from, last_time))
        own_events = keyed_events(recent, rules_by_signature(rules)).join(
            target_keys, ["signature_id", "key"], "left_semi"
        )
        alerts = evaluate_from_state(
            state_rows(stored, own_events, targets),
            rules,
            width_ms,
            decision_time,
            settings.spark_shuffle_partitions,
        ).persist()
        try:
            self._append(alerts, "alerts", batch_id)
            self._timer.mark("evaluate")
            # Alerts of one batch are few (they are decisions, not events): publish from here.
            records = [record_of_stored(r.asDict()) for r in alerts.collect()]
        finally:
            alerts.unpersist()
        records.sort(key=lambda a: (a["eventTime"], a["ruleId"], a["transactionId"]))
        mirror.publish_alerts(self.redis, settings.redis_alert_stream, batch_id, records)
        self._timer.mark("publish")
        return len(records)

    def start(
        self, events_dir: Path, available_now: bool, max_files_per_trigger: int | None = None
    ) -> StreamingQuery:
        """Start the query over ``events_dir``; its checkpoint lives in the data dir.

        Refills the Redis mirror from Delta first when Redis does not hold it.
        """
        if not self.mirror_is_current():
            self.rebuild_mirror()
        reader = self.spark.readStream.format("text")
        if max_files_per_trigger:
            reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
        lines = with_line_source(reader.load(str(events_dir)))
        writer = (
            lines.writeStream.foreachBatch(self.process_batch)
            .option("checkpointLocation", str(self.settings.data_dir / "checkpoints" / "stream"))
            .queryName("velocity-stream")
        )
        writer = (
            writer.trigger(availableNow=True)
            if available_now
            else writer.trigger(processingTime="0 seconds")
        )
        return writer.start()
