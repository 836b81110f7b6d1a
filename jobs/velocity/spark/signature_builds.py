"""The signatures whose buckets are built (the ``signatures`` table), kept in step with the
rules in force: a signature that becomes active is built from the raw events of the
earlier batches first, so a new rule sees the history already inside its window
(SPEC §2); one whose rules are gone is forgotten; one whose buckets kept less history
than the widest active window, or no distinct values that a UNIQUE_COUNT rule now counts,
is built again."""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from velocity.delta import small_tables, tables
from velocity.delta.live import LiveState
from velocity.domain.rules import Rule, RuleSignature, distinct_counted
from velocity.domain.windows import horizon_seconds
from velocity.spark.evaluate import bucket_aggregates, keyed_events
from velocity.spark.redis_state import RedisState


def signature_records(
    signatures: list[RuleSignature], rules: list[Rule], widest: int, batch_id: int
) -> list[tuple[str, str, int, int, bool]]:
    """The signatures table's rows (``tables.SIGNATURE_SCHEMA``) of ``signatures`` built
    through ``batch_id`` with the history of the ``widest`` window."""
    counted = distinct_counted(rules)
    return [
        (
            s.signature_id,
            json.dumps(s.to_json(), sort_keys=True),
            batch_id,
            widest,
            s.signature_id in counted,
        )
        for s in signatures
    ]


class SignatureBuilds:
    """The stream's upkeep of the signatures table and the buckets behind it (Delta, and
    Redis refilled for a rebuilt signature)."""

    def __init__(self, spark: SparkSession, state: LiveState, mirror: RedisState) -> None:
        self.spark = spark
        self.state = state
        self.mirror = mirror

    def sync(self, signatures: list[RuleSignature], rules: list[Rule], batch_id: int) -> None:
        """Build newly active signatures from the raw events; forget inactive ones.

        A signature is also rebuilt when the widest active window grows past the history
        its buckets kept (eviction dropped the rest), so a wider rule sees its whole
        window (SPEC §2). A change that leaves every signature as recorded (a rule paused
        beside another of its signature, a limit changed) costs a read of the signatures
        table by delta-rs, no Spark job: it is a batch of the stream that waits for it.
        The stream's own write-behind does not flush while the tables change: its appends
        of buckets would conflict with the deletes here.
        """
        widest = max((r.window_ms for r in rules), default=0)
        counted = distinct_counted(rules)
        new_data_dir = self.state.unwritten("signatures")
        recorded = [] if new_data_dir else self._recorded()
        kept = {r["signature_id"]: r["kept_window_ms"] for r in recorded}
        without_distinct = {r["signature_id"] for r in recorded if r["kept_distinct"] is False}
        wanted = {s.signature_id: s for s in signatures}
        gone = sorted(set(kept) - set(wanted))
        short = {s for s in set(wanted) & set(kept) if (kept[s] or 0) < widest}
        # A UNIQUE_COUNT rule now counts buckets built without their distinct values.
        short |= set(wanted) & without_distinct & counted
        build = sorted((set(wanted) - set(kept)) | short)
        built = set(build)  # recorded with this widest window and distinct counting
        # Eviction will keep only the narrower history from now on: remember it.
        narrower = any((kept[s] or 0) > widest for s in set(kept) - built)
        # Buckets stop gathering distinct values once no rule counts them.
        uncounted = sorted(set(wanted) - counted - without_distinct - built)
        if not (gone or build or narrower or uncounted):
            return
        with self.state.flushes_held():
            if gone:
                self._forget(gone)
            self._build_all(build, wanted, rules, widest, batch_id, new_data_dir)
            if narrower:
                self.spark.sql(
                    f"UPDATE delta.`{self.state.live.signatures}` "
                    f"SET kept_window_ms = {widest} WHERE kept_window_ms > {widest}"
                )
            if uncounted:
                ids = ", ".join(f"'{s}'" for s in uncounted)
                self.spark.sql(
                    f"UPDATE delta.`{self.state.live.signatures}` SET kept_distinct = false "
                    f"WHERE signature_id IN ({ids})"
                )

    def _recorded(self) -> list[dict[str, Any]]:
        """The signatures table's rows (delta-rs: a Spark job of a second on the batch's
        path for a table of a few rows)."""
        table = small_tables.open_table(self.state.live.signatures)
        if table is None:
            return []
        return small_tables.read_rows(table, ["signature_id", "kept_window_ms", "kept_distinct"])

    def _build_all(
        self,
        build: list[str],
        wanted: dict[str, RuleSignature],
        rules: list[Rule],
        widest: int,
        batch_id: int,
        new_data_dir: bool,
    ) -> None:
        if not build:
            return
        # The build reads every earlier batch from Delta: flush what is spooled first.
        self.state.flush_spool(batch_id - 1)
        if self.state.unwritten("events") or (
            self.state.read("events").where(F.col("stream_batch") < batch_id).isEmpty()
        ):
            # No history (a new data dir): nothing to count, so record them all at
            # once (a build is five Spark jobs a signature, 2-3 s each on 2 cores).
            if not (new_data_dir and self.state.unwritten("buckets")):
                self._forget(build)
            self._record([wanted[s] for s in build], rules, widest, batch_id)
            return
        for signature_id in build:
            self._build(wanted[signature_id], rules, widest, batch_id)

    def _build(
        self, signature: RuleSignature, rules: list[Rule], widest: int, batch_id: int
    ) -> None:
        """(Re)build one signature's buckets from the raw events of the earlier batches
        inside the horizon, refill its Redis hashes, then record it. Idempotent: a
        half-done build (a crash between its steps) is started again from nothing."""
        signature_id = signature.signature_id
        history = self.state.read("events").where(F.col("stream_batch") < batch_id)
        newest = history.agg(F.max("eventTime")).first()
        if newest is not None and newest[0] is not None:
            horizon_ms = horizon_seconds(rules, self.state.settings) * 1000
            history = history.where(F.col("eventTime") >= int(newest[0]) - horizon_ms)
        self._forget([signature_id])
        counted = distinct_counted(rules)
        deltas = bucket_aggregates(
            keyed_events(history, [signature]), self.state.settings.bucket_width_ms, counted
        )
        deltas.write.format("delta").mode("append").save(str(self.state.live.buckets))
        built_now = self.state.buckets_in_horizon(rules).where(
            F.col("signature_id") == signature_id
        )
        self.mirror.write_buckets(built_now, rules)
        self._record([signature], rules, widest, batch_id)

    def _forget(self, signature_ids: list[str]) -> None:
        """Delete the signatures' records and buckets (a build starts from nothing)."""
        ids = ", ".join(f"'{s}'" for s in signature_ids)
        for table in (self.state.live.signatures, self.state.live.buckets):
            self.spark.sql(f"DELETE FROM delta.`{table}` WHERE signature_id IN ({ids})")

    def _record(
        self, signatures: list[RuleSignature], rules: list[Rule], widest: int, batch_id: int
    ) -> None:
        """Record the signatures as built through ``batch_id`` (one append)."""
        self.state.append_rows(
            tables.SIGNATURES, signature_records(signatures, rules, widest, batch_id)
        )
