"""`velocity backfill`: replay a time range over the complete raw history (SPEC §3).

The stream decides each event once, against what had arrived by then; late events are
added to the state but not decided. A backfill over ``[from, to]``:

1. pins a consistent view under the state lock (the events and alerts tables as of the
   last whole micro-batch), then releases the lock so the stream goes on;
2. decides every event with eventTime in ``[from, to]`` against the complete history
   (the backtest's engine over the raw events from ``floor_g(from − widest window)``);
3. under the lock again: rebuilds the buckets of the range from the raw events (late
   events included), compares the decisions with what was emitted so far
   (ALERT + CORRECTION − RETRACTION per rule version and transaction, for the events of
   the pinned view only) and appends a CORRECTION for each decision that should have
   fired, a RETRACTION for each that should not, and both, RETRACTION first, for each in
   effect with another value; gathers the corrections into cases as the stream's alerts
   are (the open case of their payment's case key, or a new one) and notes each
   retraction in the case of the alert it retracts; publishes them to the Redis alert
   stream and records the run.

Afterwards ALERT + CORRECTION − RETRACTION equals the complete-data result for the range,
values included: the latest record of each decision by decisionTime is the one in effect.
A second run over the same range finds nothing to amend. Each event is decided with the
versions of the rules (ACTIVE now) that the stream decided its micro-batch with (the
``rule_epochs`` table, SPEC §3); alerts of rules not ACTIVE now stand as they were.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field
from functools import reduce
from typing import Any

import pyarrow as pa
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from velocity.delta import tables
from velocity.delta.case_store import CaseStore
from velocity.delta.live import LiveState, LiveTables, newest_event_time
from velocity.domain.alerts import AlertKind, amended, is_shadow, record_of_stored
from velocity.domain.buckets import bucket_start
from velocity.domain.rule_changes import RuleEpochs
from velocity.domain.rules import Rule, deciding_rules, distinct_counted, rules_by_signature
from velocity.domain.schema import LateReason
from velocity.errors import UsageError
from velocity.kafka.topics import AlertPublisher, kafka_alerts_on
from velocity.operating.progress import QUIET, Progress
from velocity.operating.stream_control import source_is_kafka
from velocity.operating.timing import StepTimer
from velocity.redis import connection, mirror
from velocity.redis.lock import state_lock
from velocity.settings import Settings
from velocity.spark.evaluate import (
    BUCKET_FIGURES,
    HOUR_MS,
    bucket_aggregates,
    hashed_alerts,
    hashed_buckets,
    keyed_events,
    merged_figures,
)
from velocity.spark.fan_out import hash_partitioned, hashed_keyed_events
from velocity.spark.progress import SparkProgress
from velocity.spark.redis_state import RedisState

APP_ID = "velocity-backfill"
_DECISION_KEYS = ["ruleId", "ruleVersion", "transactionId"]


@dataclass
class BackfillSummary:
    run_id: str = ""
    from_ms: int | None = None
    to_ms: int | None = None
    rule_ids: list[int] = field(default_factory=list)
    late_through_batch: int | None = None
    # What a ``--late`` run covered, by reason (``LateReason``); None for a range.
    late_events: int | None = None
    out_of_order_events: int | None = None
    events_evaluated: int = 0
    history_events: int = 0
    decisions_fired: int = 0
    corrections: int = 0
    retractions: int = 0
    buckets_rebuilt: int = 0
    # Seconds the run held the state lock, the longest the stream waited on it.
    lock_seconds: float = 0.0
    # The Airflow DAG run that ran this backfill (`--airflow-run`), recorded with it.
    airflow_run_id: str | None = None
    republished: int = 0
    seconds: float = 0.0
    step_seconds: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# A bucket's identity in the buckets table.
_SLOT = ["signature_id", "key", "bucket_start"]


@dataclass(frozen=True)
class BucketChanges:
    """The g-wide buckets of ``[lower, upper)`` whose recount at the pin differs from the
    stored ones: ``rows`` (_SLOT and BUCKET_FIGURES, the figures null where the recount
    has no event), of ``signature_ids``, pinned at stream batch ``pinned_batch``."""

    rows: DataFrame
    signature_ids: list[str]
    lower: int
    upper: int
    pinned_batch: int


@dataclass(frozen=True)
class PendingLate:
    """The events recorded for the backfill of late events that no backfill has covered
    yet (SPEC §3): the range their windows reach, the stream batch they are recorded
    through, and how many there are of each reason."""

    from_ms: int
    to_ms: int
    through_batch: int
    late: int
    out_of_order: int


@dataclass(frozen=True)
class AcceptedVersions:
    """The rule versions a backfill decides with: ``rules``, every version of the asked
    rule ids that the stream decided some batch with (``epochs``), plus ``now``, the
    versions in force, for events of batches before any record."""

    rules: list[Rule]
    now: list[Rule]
    epochs: RuleEpochs


def publish_order(record: dict[str, Any]) -> tuple[int, int, str, int, str]:
    """Amendments by event, rule and transaction, and a decision's retraction before its
    correction (the earlier decisionTime)."""
    return (
        record["eventTime"],
        record["ruleId"],
        record["transactionId"],
        record["decisionTime"],
        record["kind"],
    )


def _read_at(spark: SparkSession, path: Any, version: int) -> DataFrame:
    return spark.read.format("delta").option("versionAsOf", version).load(str(path))


class Backfill:
    """One backfill over the live tables of ``settings``."""

    def __init__(self, spark: SparkSession, settings: Settings) -> None:
        self.spark = spark
        self.settings = settings
        self.state = LiveState(spark, settings)
        self.live: LiveTables = self.state.live
        self.redis = connection.connect(settings)
        connection.load_functions(self.redis)
        self.mirror = RedisState(self.state, self.redis)
        # Amendments reach the alerts topic too when the stream's alerts do.
        publishes = kafka_alerts_on(settings, source_is_kafka(settings.data_dir))
        self.kafka_alerts = AlertPublisher(settings) if publishes else None

    def _rules(self, rule_ids: list[int] | None) -> list[Rule]:
        rules = deciding_rules(self.state.rule_store.in_force())
        if not rule_ids:
            return rules
        deciding = {r.rule_id for r in rules}
        unknown = sorted(set(rule_ids) - deciding)
        if unknown:
            raise UsageError(
                f"--rules names {unknown}, not ACTIVE or SHADOW rules in force; those are "
                f"{sorted(deciding)} (`velocity rules list`)"
            )
        # A ruleId names its rule in force and its candidate, both replayed.
        return [r for r in rules if r.rule_id in set(rule_ids)]

    def pending_late_range(self) -> PendingLate | None:
        """The late and out-of-order events no backfill has covered yet, and the range
        that covers them: from the oldest to the newest plus the widest active window
        (every window they touched, every decision that did not see them), capped at the
        newest eventTime. None when there are none."""
        with state_lock(self.redis, self.settings, "backfill (late events written behind)"):
            self.mirror.flush_spooled()
        read = self.state.read
        covered = read("backfills").agg(F.max("late_through_batch")).first()
        through = -1 if covered is None or covered[0] is None else int(covered[0])
        pending = read("late_events").where(F.col("stream_batch") > through)
        out_of_order = F.col("reason") == LateReason.OUT_OF_ORDER.value
        row = pending.agg(
            F.min("eventTime"),
            F.max("eventTime"),
            F.max("stream_batch"),
            F.count(F.lit(1)),
            F.count(F.when(out_of_order, 1)),
        ).first()
        if row is None or row[0] is None:
            return None
        rules = deciding_rules(self.state.rule_store.in_force())
        widest = max((r.window_ms for r in rules), default=0)
        newest = newest_event_time(self.spark, self.live)
        to_ms = int(row[1]) + widest
        if newest is not None:
            to_ms = min(to_ms, newest)
        return PendingLate(int(row[0]), to_ms, int(row[2]), int(row[3] - row[4]), int(row[4]))

    def run(
        self,
        from_ms: int,
        to_ms: int,
        rule_ids: list[int] | None = None,
        late: PendingLate | None = None,
        decision_time: int | None = None,
        progress: Progress = QUIET,
        airflow_run_id: str | None = None,
    ) -> BackfillSummary:
        """Backfill ``[from_ms, to_ms]``; with ``late`` (``pending_late_range``), the run
        also records that it covered those late and out-of-order events."""
        with SparkProgress(self.spark, progress):
            return self._run(
                from_ms, to_ms, rule_ids, late, decision_time, progress, airflow_run_id
            )  # fmt: skip

    def run_late(self, rule_ids: list[int] | None = None, **options: Any) -> BackfillSummary | None:
        """`backfill --late`: the range of the late and out-of-order events no backfill
        covered yet (``pending_late_range``); None when there are none."""
        pending = self.pending_late_range()
        if pending is None:
            return None
        return self.run(pending.from_ms, pending.to_ms, rule_ids, pending, **options)

    def _run(
        self,
        from_ms: int,
        to_ms: int,
        rule_ids: list[int] | None,
        late: PendingLate | None,
        decision_time: int | None,
        progress: Progress,
        airflow_run_id: str | None = None,
    ) -> BackfillSummary:
        if from_ms < 0 or to_ms < from_ms:
            raise UsageError(
                f"--from {from_ms} --to {to_ms} is not a time range; give 0 <= from <= to "
                "(epoch ms)"
            )
        spark, settings = self.spark, self.settings
        timer = StepTimer()
        started = int(time.time() * 1000)
        decided_at = decision_time if decision_time is not None else started
        rules = self._rules(rule_ids)
        summary = BackfillSummary(
            run_id=uuid.uuid4().hex,
            from_ms=from_ms,
            to_ms=to_ms,
            rule_ids=sorted({r.rule_id for r in rules}),
            late_through_batch=None if late is None else late.through_batch,
            late_events=None if late is None else late.late,
            out_of_order_events=None if late is None else late.out_of_order,
            airflow_run_id=airflow_run_id,
        )
        with state_lock(self.redis, settings, f"backfill {summary.run_id} (recover)"):
            # Under the lock: another run between its append and its record is not a
            # crashed one.
            summary.republished = self._publish_unrecorded(started)
        if not rules:
            self._record(summary, [], started)
            return summary

        # Each event is decided with the versions in force when the stream accepted it.
        versions = self._versions_at_acceptance(rules)
        width = settings.bucket_width_ms
        widest = max(r.window_ms for r in versions.rules)
        history_from = max(0, bucket_start(from_ms - widest, width))

        progress.step("pin")
        # 1. A consistent view: no micro-batch is half-committed while the lock is held.
        # The stream writes Delta behind: what it committed but has not written yet is
        # flushed first, under the lock, so Delta holds every decided batch.
        with state_lock(self.redis, settings, f"backfill {summary.run_id} (pin)") as lease:
            self.mirror.flush_spooled()
            events_version = tables.table_version(spark, self.live.events)
            buckets_version = tables.table_version(spark, self.live.buckets)
        summary.lock_seconds += lease.held_seconds()
        timer.mark("pin")

        # 2. The complete-data decisions of the range (the backtest's engine).
        events = _read_at(spark, self.live.events, events_version)
        history = events.where(F.col("eventTime").between(history_from, to_ms))
        # Both counts in one pass over the pinned events (one Spark job, not two).
        counts = history.agg(
            F.count(F.lit(1)), F.count(F.when(F.col("eventTime") >= from_ms, 1))
        ).first()
        summary.history_events = 0 if counts is None else int(counts[0])
        progress.step("evaluate", summary.history_events)
        decisions = self._decide(history, versions, events, from_ms, to_ms, decided_at).persist()
        try:
            summary.events_evaluated = 0 if counts is None else int(counts[1])
            summary.decisions_fired = decisions.count()
            timer.mark("evaluate")

            # 3. The range's buckets recounted from the pinned events against the stored
            # ones at the same pin, outside the lock: the stream goes on meanwhile.
            progress.step("recount-buckets")
            changes = self._bucket_changes(
                rules, history_from, to_ms, events_version, buckets_version
            )
            timer.mark("recount-buckets")

            # 4. The amendments, against the alerts in effect now. The stream adds no
            # decision of a pinned event; only another backfill amends them, and that is
            # checked under the lock below.
            progress.step("amendments")
            amended_before = self._amendment_count()
            records, retracted_cases = self._amendments(
                decisions, versions.rules, events, from_ms, to_ms, decided_at, summary.run_id
            )
            timer.mark("amendments")

            # 5. Repair, publish, record: one writer at a time, for as long as the writes
            # take.
            with state_lock(self.redis, settings, f"backfill {summary.run_id}") as lease:
                progress.step("repair-buckets")
                self.mirror.flush_spooled()
                summary.buckets_rebuilt = (
                    0 if changes is None else self._repair_buckets(changes, events_version)
                )
                timer.mark("repair-buckets")
                progress.step("amend+publish")
                if self._amendment_count() != amended_before:
                    # Another run amended meanwhile: decide against what is in effect now.
                    records, retracted_cases = self._amendments(
                        decisions,
                        versions.rules,
                        events,
                        from_ms,
                        to_ms,
                        decided_at,
                        summary.run_id,
                    )
                summary.corrections = sum(r["kind"] == AlertKind.CORRECTION for r in records)
                summary.retractions = len(records) - summary.corrections
                lease.check()  # the rebuild took the lease's length: write nothing more
                if records:
                    # Cases: chosen before the append (each row carries its caseId), their
                    # events committed after it (a crash between: _publish_unrecorded).
                    payments = self._payments(events, records)
                    cases = CaseStore(settings)
                    corrections = _case_rows([r for r in records if r["kind"] != "RETRACTION"])
                    case_of = {
                        **retracted_cases,
                        **cases.assign_backfill(corrections, payments),
                    }
                    counted = self._counted_payments(records)
                    self._append_alerts(records, case_of)
                    cases.record_backfill(_case_rows(records, case_of), payments, counted)
                    self._publish(records)
                timer.mark("amend+publish")
                # The lock time so far: the record is the last write under the lock.
                held = summary.lock_seconds + lease.held_seconds()
                self._record(summary, [r["alertId"] for r in records], started, held)
            summary.lock_seconds += lease.held_seconds()
        finally:
            decisions.unpersist()
        summary.step_seconds = timer.steps
        summary.seconds = timer.total
        return summary

    def _versions_at_acceptance(self, rules: list[Rule]) -> AcceptedVersions:
        """The versions of ``rules``' ids that the stream decided with (rule_epochs), and
        the versions in force now for the events of batches before any record."""
        epochs = self.state.rule_epochs()
        ids = {rule.rule_id for rule in rules}
        recorded = {pair for versions in epochs.versions for pair in versions if pair[0] in ids}
        history = {(r.rule_id, r.version): r for r in self.state.rule_store.history()}
        now = {(r.rule_id, r.version): r for r in rules}
        chosen = {**{pair: history[pair] for pair in recorded if pair in history}, **now}
        return AcceptedVersions([chosen[pair] for pair in sorted(chosen)], rules, epochs)

    def _decide(
        self,
        history: DataFrame,
        versions: AcceptedVersions,
        pinned_events: DataFrame,
        from_ms: int,
        to_ms: int,
        decided_at: int,
    ) -> DataFrame:
        """The decisions of the events in ``[from_ms, to_ms]`` over ``history`` (the pinned
        events from the widest window before), as alert rows: each event's under the rule
        versions its batch was decided with. The backtest's path: fan-out and shuffle in
        the JVM, each key-partition decided by the kernel."""
        settings = self.settings
        signatures = list(rules_by_signature(versions.rules))
        ordered = hash_partitioned(
            hashed_keyed_events(history, signatures), settings.spark_shuffle_partitions
        )
        decided = hashed_alerts(
            ordered, signatures, versions.rules, settings.bucket_width_ms, decided_at
        ).where(F.col("eventTime").between(from_ms, to_ms))
        if not versions.epochs.starts:
            return decided  # no batch recorded its versions: today's for every event
        epoch = F.lit(-1)
        for index, start in enumerate(versions.epochs.starts):
            epoch = F.when(F.col("stream_batch") >= start, F.lit(index)).otherwise(epoch)
        ids = {rule.rule_id for rule in versions.now}
        allowed = [(-1, rule.rule_id, rule.version) for rule in versions.now] + [
            (index, rule_id, version)
            for index, pairs in enumerate(versions.epochs.versions)
            for rule_id, version in pairs
            if rule_id in ids
        ]
        allowed_frame = self.spark.createDataFrame(
            allowed, "_epoch int, ruleId long, ruleVersion int"
        )
        in_force = (
            pinned_events.where(F.col("eventTime").between(from_ms, to_ms))
            .select("transactionId", "eventTime", epoch.alias("_epoch"))
            .join(F.broadcast(allowed_frame), "_epoch")
            .select("transactionId", "eventTime", "ruleId", "ruleVersion")
        )
        keys = ["transactionId", "eventTime", "ruleId", "ruleVersion"]
        return decided.join(in_force, keys, "left_semi")

    def _bucket_changes(
        self,
        rules: list[Rule],
        history_from: int,
        to_ms: int,
        events_version: int,
        buckets_version: int,
    ) -> BucketChanges | None:
        """The g-wide buckets of the range's whole hours whose recount from the pinned raw
        events (late ones included) differs from the stored ones at the same pin: the
        recounted figures, or none where the recount has no event. Bounded below by the
        horizon, so evicted history is not brought back; signatures the stream has not
        built yet are left to its build from history. None when nothing is in scope."""
        spark, width = self.spark, self.settings.bucket_width_ms
        built = {r["signature_id"] for r in self.state.read("signatures").collect()}
        signatures = [s for s in rules_by_signature(rules) if s.signature_id in built]
        in_force = deciding_rules(self.state.rule_store.in_force())
        horizon_from = self.state.horizon_cutoff(in_force)
        if not signatures or horizon_from is None:
            return None
        lower = max(history_from, horizon_from)
        lower += -lower % HOUR_MS  # whole hours, as compaction keeps them
        upper = to_ms - to_ms % HOUR_MS + HOUR_MS
        if lower >= upper:
            return None
        ids = [s.signature_id for s in signatures]
        pinned = _read_at(spark, self.live.events, events_version)
        raw = pinned.where(F.col("eventTime").between(lower, upper - 1))
        counted = distinct_counted(in_force)
        ordered = hash_partitioned(
            hashed_keyed_events(raw, signatures), self.settings.spark_shuffle_partitions
        )
        recount = hashed_buckets(ordered, signatures, width, counted).select(
            *_SLOT, *[F.col(n).alias(f"new_{n}") for n in BUCKET_FIGURES]
        )
        stored_rows = _read_at(spark, self.live.buckets, buckets_version).where(
            F.col("signature_id").isin(ids)
        )
        stored = (
            self.state.window_buckets(stored_rows, since=lower)
            .where(F.col("bucket_start") < upper)
            .select(*_SLOT, *BUCKET_FIGURES)
        )
        # Distinct values only where a rule counts them: a list left from a UNIQUE_COUNT
        # rule since paused is read by nothing, so it is no reason to rewrite a bucket.
        unread = ~F.col("signature_id").isin(sorted(counted))
        same = reduce(
            lambda a, b: a & b,
            [
                F.col(n).eqNullSafe(F.col(f"new_{n}"))
                | (unread if n == "distinct_values" else F.lit(False))
                for n in BUCKET_FIGURES
            ],
        )
        differ = recount.join(stored, _SLOT, "full_outer").where(~same)
        rows = differ.select(*_SLOT, *[F.col(f"new_{n}").alias(n) for n in BUCKET_FIGURES])
        frame = rows.localCheckpoint(eager=True)
        pinned_batch = pinned.agg(F.max("stream_batch")).first()
        return BucketChanges(
            frame,
            ids,
            lower,
            upper,
            -1 if pinned_batch is None or pinned_batch[0] is None else int(pinned_batch[0]),
        )

    def _repair_buckets(self, changes: BucketChanges, events_version: int) -> int:
        """Write the changed buckets (hold the state lock): each becomes one g-wide row of
        its recount merged with the events the stream added to it since the pin, in one
        Delta commit (a compacted hour holding one is laid out again as g-wide rows), and
        the same absolute values in Redis. Returns the buckets written or removed."""
        if changes.rows.isEmpty():
            return 0
        spark, width = self.spark, self.settings.bucket_width_ms
        in_force = deciding_rules(self.state.rule_store.in_force())
        signatures = [
            s for s in rules_by_signature(in_force) if s.signature_id in changes.signature_ids
        ]
        since_pin = self.state.read("events").where(
            (F.col("stream_batch") > changes.pinned_batch)
            & F.col("eventTime").between(changes.lower, changes.upper - 1)
        )
        added = bucket_aggregates(
            keyed_events(since_pin, signatures), width, distinct_counted(in_force)
        ).join(changes.rows.select(*_SLOT), _SLOT, "left_semi")
        recounted = changes.rows.where(F.col("event_count").isNotNull())
        final = (
            recounted.select(*_SLOT, *BUCKET_FIGURES)
            .unionByName(added.select(*_SLOT, *BUCKET_FIGURES))
            .groupBy(*_SLOT)
            .agg(*merged_figures())
        )
        slots = changes.rows.select(*_SLOT)
        stored = self.state.read("buckets").where(
            F.col("signature_id").isin(changes.signature_ids)
            & (F.col("bucket_start") >= changes.lower - HOUR_MS)
            & (F.col("bucket_start") < changes.upper)
        )
        hour_of = F.col("bucket_start") - F.pmod(F.col("bucket_start"), F.lit(HOUR_MS))
        hours = (
            stored.where(F.col("parts").isNotNull())
            .join(
                slots.select("signature_id", "key", hour_of.alias("bucket_start")).distinct(),
                _SLOT,
                "left_semi",
            )
            .localCheckpoint(eager=True)
        )
        kept_parts = (
            hours.select("signature_id", "key", F.explode("parts").alias("part"))
            .select("signature_id", "key", "part.*")
            .join(slots, _SLOT, "left_anti")
        )
        g_wide = F.lit(width).cast("long").alias("bucket_width_ms")
        no_parts = F.lit(None).cast(tables.BUCKET_SCHEMA["parts"].dataType).alias("parts")
        inserted = final.unionByName(kept_parts.select(*_SLOT, *BUCKET_FIGURES))
        source = (
            slots.select(*_SLOT, g_wide)
            .unionByName(hours.select(*_SLOT, "bucket_width_ms"))
            .select(
                "*",
                *[
                    F.lit(None).cast(tables.BUCKET_SCHEMA[n].dataType).alias(n)
                    for n in BUCKET_FIGURES
                ],
                no_parts,
            )
            .withColumn("_op", F.lit("delete"))
            .unionByName(
                inserted.select(*_SLOT, g_wide, *BUCKET_FIGURES, no_parts).withColumn(
                    "_op", F.lit("insert")
                ),
                allowMissingColumns=True,
            )
        )
        ids = ", ".join(f"'{i}'" for i in changes.signature_ids)
        table = DeltaTable.forPath(spark, str(self.live.buckets))
        (
            table.alias("t")
            .merge(
                source.alias("s"),
                "s._op = 'delete' AND t.signature_id = s.signature_id AND t.key = s.key"
                " AND t.bucket_start = s.bucket_start"
                " AND t.bucket_width_ms = s.bucket_width_ms"
                f" AND t.signature_id IN ({ids})"
                f" AND t.bucket_start >= {changes.lower - HOUR_MS}"
                f" AND t.bucket_start < {changes.upper}",
            )
            .whenMatchedDelete()
            .whenNotMatchedInsert(
                condition="s._op = 'insert'",
                values={n: f"s.{n}" for n in tables.BUCKET_SCHEMA.fieldNames()},
            )
            .execute()
        )
        in_force = deciding_rules(self.state.rule_store.in_force())
        self.mirror.write_buckets(final.select(*_SLOT, g_wide, *BUCKET_FIGURES), in_force)
        removed = [
            (r["signature_id"], r["key"], r["bucket_start"])
            for r in slots.join(final, _SLOT, "left_anti").collect()
        ]
        mirror.remove_buckets(self.redis, self.settings.redis_keys, removed)
        return slots.count()

    def _amendments(
        self,
        decisions: DataFrame,
        rules: list[Rule],
        pinned_events: DataFrame,
        from_ms: int,
        to_ms: int,
        decided_at: int,
        run_id: str,
    ) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """The complete-data decisions against the alerts in effect, per (rule version,
        transaction), for the pinned events only (an event that arrived after the pin is
        the next backfill's):

        - decided, nothing in effect: a CORRECTION;
        - in effect, not decided: a RETRACTION of the record in effect;
        - in effect with another value: a RETRACTION of it, then a CORRECTION with the
          complete-data value (every decision's net count stays 0 or 1).

        Retractions carry the run's decision time and corrections one millisecond more, so
        the latest record of a decision by decisionTime is the one in effect. Also the
        case of each retraction: the caseId of the record it retracts, by its alertId.
        """
        in_scope = F.lit(False)
        for rule in rules:
            in_scope = in_scope | (
                (F.col("ruleId") == rule.rule_id) & (F.col("ruleVersion") == rule.version)
            )
        pinned = pinned_events.where(F.col("eventTime").between(from_ms, to_ms))
        emitted = (
            self.state.read("alerts")
            .where(F.col("eventTime").between(from_ms, to_ms))
            .where(in_scope)
            .join(pinned.select("transactionId"), "transactionId", "left_semi")
        )
        net = emitted.groupBy(*_DECISION_KEYS).agg(
            F.sum(F.when(F.col("kind") == AlertKind.RETRACTION.value, -1).otherwise(1)).alias("net")
        )
        in_effect = net.where(F.col("net") > 0).select(*_DECISION_KEYS)
        # The record in effect: the latest fired record of each decision in effect.
        newest_first = Window.partitionBy(*_DECISION_KEYS).orderBy(
            F.col("decisionTime").desc(), F.col("alertId")
        )
        effect = (
            emitted.where(F.col("kind") != AlertKind.RETRACTION.value)
            .withColumn("_newest", F.row_number().over(newest_first))
            .where(F.col("_newest") == 1)
            .drop("_newest")
            .join(in_effect, _DECISION_KEYS, "left_semi")
        )
        decided = decisions.select(
            *_DECISION_KEYS,
            F.col("aggregateValue").alias("_value"),
            F.col("windowStart").alias("_window"),
        )
        changed = (
            effect.join(decided, _DECISION_KEYS)
            .where(
                (F.col("aggregateValue") != F.col("_value"))
                | (F.col("windowStart") != F.col("_window"))
            )
            .drop("_value", "_window")
        )
        to_correct = decisions.join(effect, _DECISION_KEYS, "left_anti").unionByName(
            decisions.join(changed, _DECISION_KEYS, "left_semi")
        )
        to_retract = effect.join(decided, _DECISION_KEYS, "left_anti").unionByName(changed)
        # Both sides in one Spark job (one collect): each row is a retraction or a
        # correction, as a struct of its own side's columns; the plan reads the alerts
        # in effect once (Spark reuses the shared exchanges), where two collects read
        # them twice.
        retract_type, correct_type = to_retract.schema, to_correct.schema
        both = to_retract.select(
            F.struct("*").alias("_retract"), F.lit(None).cast(correct_type).alias("_correct")
        ).unionByName(
            to_correct.select(
                F.lit(None).cast(retract_type).alias("_retract"), F.struct("*").alias("_correct")
            )
        )
        rows = both.collect()
        records, retracted_cases = [], {}
        for row in (r["_retract"] for r in rows if r["_retract"] is not None):
            record = amended(
                record_of_stored(row.asDict()), AlertKind.RETRACTION, decided_at, run_id
            )
            records.append(record)
            if row["caseId"] is not None:
                retracted_cases[record["alertId"]] = row["caseId"]
        records += [
            amended(record_of_stored(r.asDict()), AlertKind.CORRECTION, decided_at + 1, run_id)
            for r in (row["_correct"] for row in rows if row["_correct"] is not None)
        ]
        signature_of = {(r.rule_id, r.version): r.signature.signature_id for r in rules}
        for record in records:
            record["signature_id"] = signature_of[(record["ruleId"], record["ruleVersion"])]
        records.sort(key=publish_order)
        return records, retracted_cases

    def _amendment_count(self) -> int:
        """The CORRECTION and RETRACTION records in the alerts table (only backfills
        write them)."""
        return self.state.read("alerts").where(F.col("kind") != AlertKind.ALERT.value).count()

    def _payments(self, events: DataFrame, records: list[dict[str, Any]]) -> pa.Table:
        """The payments of ``records``' corrections among ``events`` as cases need them:
        transactionId, the case key's field (``Settings.case_key``) and paymentAmount."""
        columns = ["transactionId", self.settings.case_key, "paymentAmount"]
        ids = sorted({r["transactionId"] for r in records if r["kind"] == "CORRECTION"})
        if not ids:
            return pa.table({c: pa.array([], pa.string()) for c in columns})
        wanted = self.spark.createDataFrame([(i,) for i in ids], "transactionId string")
        rows = events.join(F.broadcast(wanted), "transactionId", "left_semi").select(*columns)
        found = rows.collect()
        return pa.table({c: [r[c] for r in found] for c in columns})

    def _counted_payments(self, records: list[dict[str, Any]]) -> set[tuple[str, str]]:
        """(caseId, transactionId) of the alerts in cases, other than ``records``, of the
        payments of ``records``' corrections: a case counts a payment's amount once."""
        fixes = [r for r in records if r["kind"] == "CORRECTION"]
        if not fixes:
            return set()
        ids = sorted({r["transactionId"] for r in fixes})
        wanted = self.spark.createDataFrame([(i,) for i in ids], "transactionId string")
        times = [r["eventTime"] for r in fixes]
        found = (
            self.state.read("alerts")
            .where(F.col("eventTime").between(min(times), max(times)))
            .where(F.col("caseId").isNotNull() & (F.col("kind") != AlertKind.RETRACTION.value))
            .join(F.broadcast(wanted), "transactionId", "left_semi")
            .select("alertId", "transactionId", "caseId")
            .collect()
        )
        mine = {r["alertId"] for r in records}
        return {(r["caseId"], r["transactionId"]) for r in found if r["alertId"] not in mine}

    def _append_alerts(self, records: list[dict[str, Any]], case_of: dict[str, str]) -> None:
        rows = [
            {**record, "shadow": is_shadow(record), "caseId": case_of.get(record["alertId"])}
            for record in records
        ]
        self.state.append_rows(tables.ALERTS, [_in_schema_order(tables.ALERTS, r) for r in rows])

    def _record(
        self,
        summary: BackfillSummary,
        alert_ids: list[str],
        started: int,
        lock_seconds: float | None = None,
    ) -> None:
        row = {
            "run_id": summary.run_id,
            "from_ms": summary.from_ms or 0,
            "to_ms": summary.to_ms or 0,
            "rule_ids": summary.rule_ids,
            "late_through_batch": summary.late_through_batch,
            "events_evaluated": summary.events_evaluated,
            "corrections": summary.corrections,
            "retractions": summary.retractions,
            "alert_ids": alert_ids,
            "started_at": started,
            "finished_at": int(time.time() * 1000),
            "lock_seconds": summary.lock_seconds if lock_seconds is None else lock_seconds,
            "airflow_run_id": summary.airflow_run_id,
            "late_events": summary.late_events,
            "out_of_order_events": summary.out_of_order_events,
        }
        # A table made before lock_seconds, airflow_run_id or the late counts got them
        # when LiveState opened it (tables.create_if_missing adds missing nullable columns).
        self.state.append_rows(tables.BACKFILLS, [_in_schema_order(tables.BACKFILLS, row)])

    def _publish(self, records: list[dict[str, Any]]) -> None:
        """Amendments to the Redis alert stream and, when it is on, the alerts topic: both
        before the run records itself, so a crash between leaves them to
        ``_publish_unrecorded`` (at least once, ids unchanged). A SHADOW rule's amendments
        go to the shadow stream only, as its alerts did."""
        live = [r for r in records if not is_shadow(r)]
        shadow = [r for r in records if is_shadow(r)]
        retention = self.settings.alert_stream_retention
        mirror.publish_backfill(self.redis, self.settings.alert_stream, retention, live)
        mirror.publish_backfill(self.redis, self.settings.shadow_alert_stream, retention, shadow)
        if self.kafka_alerts is not None:
            self.kafka_alerts.publish(live)

    def _publish_unrecorded(self, started: int) -> int:
        """Publish the amendments of a run that committed them but died before it recorded
        itself (so before or while publishing): at least once, ids unchanged."""
        recorded = self.state.read("backfills").select(F.explode("alert_ids").alias("alertId"))
        orphans = (
            self.state.read("alerts")
            .where(F.col("kind") != AlertKind.ALERT.value)
            .join(recorded, "alertId", "left_anti")
            .collect()
        )
        if not orphans:
            return 0
        # Their case events, unless the run committed them before it died.
        stored = [r.asDict() for r in orphans]
        payments = self._payments(self.state.read("events"), stored)
        counted = self._counted_payments(stored)
        CaseStore(self.settings).record_backfill(_case_rows(stored), payments, counted)
        records = sorted((record_of_stored(r) for r in stored), key=publish_order)
        self._publish(records)
        recovery = BackfillSummary(run_id=f"republish-{uuid.uuid4().hex}", from_ms=0, to_ms=0)
        self._record(recovery, [r["alertId"] for r in records], started)
        return len(records)


def _in_schema_order(name: str, row: dict[str, Any]) -> tuple[Any, ...]:
    """``row`` as a tuple in live table ``name``'s column order (a missing field: null)
    for ``LiveState.append_rows``: one delta-rs commit, not a Spark job (the first Spark
    Delta write of a `velocity backfill` process took seconds)."""
    return tuple(row.get(field.name) for field in tables.LIVE_SCHEMAS[name].fields)


# What cases need of an amendment (``CaseStore.assign_backfill``, ``record_backfill``).
_CASE_COLUMNS = [
    "alertId", "kind", "ruleId", "ruleVersion", "transactionId", "decisionTime", "outcome",
]  # fmt: skip


def _case_rows(records: list[dict[str, Any]], case_of: dict[str, str] | None = None) -> pa.Table:
    """``records`` (amendments, or stored rows of them) as cases read them; with
    ``case_of`` (by alertId), their caseId from it, else their own."""
    columns: dict[str, list[Any]] = {c: [r[c] for r in records] for c in _CASE_COLUMNS}
    columns["caseId"] = [
        r.get("caseId") if case_of is None else case_of.get(r["alertId"]) for r in records
    ]
    return pa.table({**columns, "caseId": pa.array(columns["caseId"], pa.string())})
