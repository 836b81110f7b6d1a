"""`velocity stream`: decisions in Spark's executors, Redis as the hot state, Delta behind.

Each micro-batch (``process_batch``):

1. take the new lines (of files landing in a folder, or messages of a Kafka topic) as
   Arrow once, put them in arrival order and parse them a block of lines at a time
   (``velocity.engine.event_lines``; in the driver: an Arrow UDF in the executors cost
   3× the CPU, measured, in the round trips of the lines through Spark's rows). With
   overlap on (setting ``stream_overlap``, the continuous trigger), this runs while the
   batch before is still deciding; once that one has committed, the parsed lines are
   spooled (``InputSpool``) and the rest runs in the deciding thread while Spark moves on,
   holding the data dir's state lock:
2. read, in one Redis call, the stream's progress and which of the batch's
   transactionIds earlier batches accepted (a Redis that lost this data dir's state, or
   whose progress is behind the last batch this process committed, is refilled from Delta
   first; a start checks the progress against the checkpoint and Delta too);
3. admit column by column (``velocity.engine.admission``): events far ahead of the newest
   accepted eventTime or the clock are quarantined, first arrivals win, late events
   count without a decision;
4. decide a key-partition per Spark task (``velocity.spark.stream_decide``): each reads
   its keys' hot state from Redis in one call, runs the columnar kernel (every event's
   window being its key's whole buckets below its own bucket plus its own bucket's
   events up to its time) and commits its keys' buckets in one call, idempotent on
   (batch, partition) and fenced by the state lock; the batch's cut, rules and clock are
   recorded first, so a replay decides as its first attempt did;
5. spool the batch's rows for Delta (``velocity.delta.write_behind``), then commit the
   accepted transactionIds, the alerts and the progress to Redis in one atomic Function
   call; then, when alerts go to Kafka too, publish them there (at least once: a
   replayed batch that finds itself committed publishes them again);
6. a flush appends the spooled batches to the Delta tables: at every batch with the
   available-now trigger, else from a background thread within ``write_behind_seconds``.

Rules are re-read when the rules table has a new version; a signature that becomes
active (or needs a wider history) is built from the Delta events first (SPEC §2).

Exactly once: the Redis commit refuses a batch it has already committed, so a replay
after a crash finds its rows spooled (or flushed) and only finishes the flush; a batch
whose key-partitions committed before the crash gets their recorded outcomes back; a batch
Spark counted done (its function returned) that had not committed is decided at the next
start from its spooled input, before Spark's next batch;
Delta appends carry ``txnAppId``/``txnVersion``; alert ids are deterministic.
"""

from __future__ import annotations

import gc
import json
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from wsgiref.simple_server import WSGIServer

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from prometheus_client import start_http_server
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from velocity.delta import batch_rows
from velocity.delta.live import LiveState, last_committed_batch
from velocity.delta.write_behind import SPOOL_FLUSHER, InputSpool
from velocity.domain.committed import rolled_back
from velocity.domain.rules import (
    Rule,
    RuleSignature,
    deciding_rules,
    rules_by_signature,
)
from velocity.domain.stream_batch import BucketSlot, collect_batch_garbage
from velocity.domain.windows import horizon_seconds
from velocity.engine.admission import admit_batch
from velocity.engine.event_lines import parsed_in_arrival_order
from velocity.errors import UsageError
from velocity.kafka.topics import AlertPublisher, kafka_alerts_on
from velocity.operating.stream_control import QUERY_NAME, EventSource, KafkaSource, checkpoint_dir
from velocity.operating.stream_metrics import BatchCounts, StreamMetrics, batch_counts
from velocity.operating.timing import StepTimer
from velocity.redis import connection, mirror
from velocity.redis.commit_args import BucketChanges
from velocity.redis.lease import Lease
from velocity.redis.lock import state_lock
from velocity.settings import Settings, local_mode_cores
from velocity.spark.evaluate import keyed_events
from velocity.spark.ingest import VERDICT_ARROW, kafka_messages, with_line_source
from velocity.spark.redis_state import RedisState
from velocity.spark.signature_builds import SignatureBuilds
from velocity.spark.stream_decide import (
    LOCAL_DECIDERS,
    BatchDecided,
    BatchPlan,
    RecordedPlan,
    batch_keyed_rows,
    decide_batch,
)

log = logging.getLogger("velocity.stream")
APP_ID = "velocity-stream"
KAFKA_FETCH_MAX_WAIT_MS = 10


@dataclass(frozen=True)
class PreparedBatch:
    """A decided, spooled micro-batch waiting for its Redis commit."""

    commit: mirror.StreamCommit  # velocity_stream_commit's call (mirror.stream_commit)
    alerts: list[str]  # SPEC §4 JSON, in the order they are published
    partitions: list[dict[str, object]]  # each key-partition's figures, for the batch log
    counts: BatchCounts  # for the metrics
    partition_count: int  # the key-partitions it was cut into (their records go after it)


class SharedStateLock:
    """The data dir's state lock, held while any thread of this stream works: the micro-batch
    and the write-behind flush run side by side, and other writers wait for both."""

    def __init__(self, client: object, settings: Settings) -> None:
        self._client = client
        self._settings = settings
        self._mutex = threading.Lock()
        self._holders = 0
        self._stack: ExitStack | None = None
        self._lease: Lease | None = None

    @contextmanager
    def held(self, holder: str) -> Iterator[Lease]:
        with self._mutex:
            if self._holders == 0:
                stack = ExitStack()
                self._lease = stack.enter_context(
                    state_lock(self._client, self._settings, holder)  # type: ignore[arg-type]
                )
                self._stack = stack
            self._holders += 1
            lease = self._lease
        assert lease is not None
        try:
            yield lease
        finally:
            with self._mutex:
                self._holders -= 1
                if self._holders == 0 and self._stack is not None:
                    self._stack.close()
                    self._stack, self._lease = None, None


class StreamJob:
    """The streaming job over one data dir; ``process_batch`` is its foreachBatch function."""

    def __init__(
        self, spark: SparkSession, settings: Settings, metrics: StreamMetrics | None = None
    ) -> None:
        self.spark = spark
        self.settings = settings
        self.state = LiveState(spark, settings)
        self.live = self.state.live
        self.rule_store = self.state.rule_store
        self.spool = self.state.spool
        self.redis = connection.connect(settings)
        connection.load_functions(self.redis)
        self.mirror = RedisState(self.state, self.redis)
        self.signatures = SignatureBuilds(spark, self.state, self.mirror)
        self._lock = SharedStateLock(self.redis, settings)
        self._rules: list[Rule] = []
        self._rules_version: int | None = None
        self._rules_log: DeltaTable | None = None  # the rules table, as delta-rs sees it
        self._committed: int | None = None  # newest batch this process committed to Redis
        self._flush_each_batch = settings.write_behind_seconds == 0
        self._flushing = threading.Lock()
        # When the write-behind's next eviction is due (time.monotonic()): a period after
        # the start, then a period after each.
        self._next_eviction = time.monotonic() + settings.eviction_every_seconds
        self._flusher_stop = threading.Event()
        self._flusher: threading.Thread | None = None
        self._reads_kafka = False
        self._kafka_alerts: AlertPublisher | None = None
        # Overlap: Spark reads and parses the next batch while this one is decided in a
        # thread of its own; its input is spooled first (Spark counts it done on return).
        self._overlap = False
        self.inputs = InputSpool(settings)
        self._deciding = ThreadPoolExecutor(max_workers=1, thread_name_prefix="velocity-batch")
        self._in_flight: Future[None] | None = None
        self._reported: BaseException | None = None  # a failure batch_failure() handed out
        self._batch_ended = threading.Condition()
        self._ended_through = -1  # the newest batch this process decided (or failed)
        self.metrics = metrics if metrics is not None else StreamMetrics()
        self.metrics.follow_spool(self.spool.oldest_spooled_at)
        self._metrics_server: WSGIServer | None = None

    # --- the hot path ------------------------------------------------------------------

    def process_batch(self, lines: DataFrame, batch_id: int) -> None:
        """One micro-batch (the foreachBatch function): read and parse its lines, then
        decide and commit them (``_decide_and_commit``); with overlap on, in the deciding
        thread once the batch before has committed, while Spark goes on to the next."""
        timer = StepTimer()
        parsed = parsed_in_arrival_order(
            lines.toArrow(), VERDICT_ARROW, judge_blank=self._reads_kafka
        )
        timer.mark("read+parse")
        if not self._overlap:
            self._decide_and_commit(parsed, batch_id, timer)
            return
        self.settle()  # one batch decides at a time, in order; a failed one fails this
        timer.mark("previous")
        self.inputs.write(batch_id, parsed)
        timer.mark("input-spool")
        self._in_flight = self._deciding.submit(self._decide_and_commit, parsed, batch_id, timer)

    def settle(self) -> None:
        """Wait until the micro-batch in flight has committed; raises its failure."""
        pending, self._in_flight = self._in_flight, None
        if pending is not None:
            pending.result()

    def batch_failure(self) -> BaseException | None:
        """The failure of the micro-batch in flight, once it has failed (the supervisor
        polls this: with no next batch to raise it, an idle stream would hide it)."""
        pending = self._in_flight
        if pending is None or not pending.done():
            return None
        self._reported = pending.exception()
        return self._reported

    def wait_for_commit(self, batch_id: int, timeout: float) -> None:
        """Return once ``batch_id`` has committed (or failed), or after ``timeout`` seconds.
        Spark reports a batch done when it is handed over; the status waits for this."""
        with self._batch_ended:
            self._batch_ended.wait_for(lambda: self._ended_through >= batch_id, timeout)

    def _decide_and_commit(self, parsed: pa.Table, batch_id: int, timer: StepTimer) -> None:
        try:
            self._decide_and_commit_once(parsed, batch_id, timer)
        finally:
            with self._batch_ended:
                self._ended_through = max(self._ended_through, batch_id)
                self._batch_ended.notify_all()

    def _decide_and_commit_once(self, parsed: pa.Table, batch_id: int, timer: StepTimer) -> None:
        """Decide, spool and commit a parsed batch, then forget its spooled input; logs one
        JSON line when done."""
        line_count = parsed.num_rows
        with self._lock.held(f"stream batch {batch_id}") as lease:
            timer.mark("lock")
            prepared = self._prepare(parsed, batch_id, timer, lease)
            # The batch's lines and events are garbage from here on, freed before the
            # collection (which would otherwise scan them all) in ``_commit``.
            del parsed
            partitions = [] if prepared is None else prepared.partitions
            counts = None if prepared is None else prepared.counts
            alerts = 0 if prepared is None else self._commit(prepared, batch_id, timer, lease)
        if self._flush_each_batch:
            self.flush(batch_id)
            timer.mark("flush")
        self.inputs.remove(batch_id)
        self.metrics.batch_done(batch_id, timer.total, counts, timer.steps.get("redis-commit"))
        log.info(
            json.dumps(
                {
                    "batch": batch_id,
                    "lines": line_count,
                    "alerts": alerts,
                    "partitions": partitions,
                    "seconds": round(timer.total, 3),
                    "steps": timer.steps,
                    "finished": int(time.time() * 1000),
                }
            )
        )

    def _prepare(
        self, lines: pa.Table, batch_id: int, timer: StepTimer, lease: Lease
    ) -> PreparedBatch | None:
        """Decide the batch (``lines``: parsed, in arrival order) and spool its rows; None
        when Redis has it committed already."""
        settings = self.settings
        rules = self._rules_in_force(batch_id)
        timer.mark("rules")
        valid = lines.filter(lines.column("accepted"))
        transaction_ids = valid.column("transactionId")
        read = self._read_state(pc.unique(transaction_ids).to_pylist(), batch_id)
        timer.mark("redis-read")
        if read.committed_batch is not None and read.committed_batch >= batch_id:
            # Committed before a crash: its rows are spooled (or flushed) already; its
            # alerts may not have reached Kafka (published after the Redis commit).
            if self._kafka_alerts is not None:
                self._kafka_alerts.publish(
                    mirror.batch_alerts(self.redis, settings.alert_stream, batch_id)
                )
            self._committed = batch_id
            return None
        lease.check()  # a batch that stalled past its lease must not write anything
        plan = self._batch_plan(batch_id, rules, lease)
        rules, decision_time = list(plan.rules), plan.decision_time
        signatures = list(rules_by_signature(rules))
        self.spool.discard_from(batch_id)
        # What a backfill decides this batch's events with (SPEC §3).
        self.state.record_rule_versions(batch_id, rules)

        seen = pc.is_in(transaction_ids, value_set=pa.array(list(read.seen), pa.string()))
        admitted = admit_batch(
            valid,
            seen.to_numpy(zero_copy_only=False),
            read.newest_event_time,
            settings.allowed_lateness_ms,
            settings.max_future_ms,
            clock_ms=decision_time,
        )
        ingest_time = int(time.time() * 1000)
        accepted_rows = batch_rows.live_rows(
            "events", admitted.accepted, ingest_time=ingest_time, stream_batch=batch_id
        )
        timer.mark("admit")
        cutoff = None
        if read.newest_event_time is not None and rules:
            horizon_ms = horizon_seconds(rules, settings) * 1000
            cutoff = read.newest_event_time - horizon_ms
        bucket_ttl_ms = mirror.key_ttl_seconds(rules, settings) * 1000
        decided = self._decide(
            accepted_rows,
            signatures,
            admitted.watermark,
            BatchPlan(
                settings, tuple(rules), decision_time, cutoff, batch_id, lease.token, bucket_ttl_ms
            ),
            plan.partitions,
        )
        timer.mark("decide")
        alerts = decided.published
        rejected = lines.filter(pc.invert(lines.column("accepted")))
        rows = batch_rows.spooled_rows(
            accepted_rows,
            rejected,
            admitted,
            decided.deltas,
            decided.alerts,
            decided.out_of_order,
            ingest_time,
            batch_id,
        )
        self.spool.write(
            batch_id,
            rows,
            {"newest_before": read.newest_event_time, "newest": admitted.newest},
        )
        timer.mark("spool")
        commit = mirror.stream_commit(
            settings,
            batch_id,
            admitted.newest,
            BucketChanges(),  # committed by the key-partitions
            admitted.accepted.column("transactionId").to_pylist(),
            alerts,
            horizon_seconds(rules, settings),
            lease,
            decided.shadow_published,
        )
        timer.mark("commit-args")
        return PreparedBatch(
            commit,
            alerts,
            decided.partitions,
            batch_counts(lines.num_rows, rows),
            plan.partitions,
        )

    def _batch_plan(self, batch_id: int, rules: list[Rule], lease: Lease) -> RecordedPlan:
        """How the batch is cut and decided: as now, or, for a batch replayed after a crash
        whose key-partitions may have committed already, as its first attempt recorded."""
        partitions = self._decide_partitions()
        now = RecordedPlan(partitions, int(time.time() * 1000), tuple(rules))
        recorded = RecordedPlan.parse(
            mirror.batch_plan(self.redis, self.settings, lease, batch_id, now.text(batch_id))
        )
        if recorded != now:
            log.warning(
                "batch %s is replayed as first decided: %s key-partitions, rules %s",
                batch_id,
                recorded.partitions,
                [(r.rule_id, r.version) for r in recorded.rules],
            )
        return recorded

    def _decide_partitions(self) -> int:
        """How many key-partitions a new batch is cut into."""
        settings = self.settings
        return (
            settings.stream_decide_partitions
            or local_mode_cores(settings.spark_master)
            or self.spark.sparkContext.defaultParallelism
        )

    def _decide(
        self,
        accepted: pa.Table,
        signatures: list[RuleSignature],
        watermark: int | None,
        plan: BatchPlan,
        partitions: int,
    ) -> BatchDecided:
        """The batch's decisions, a key-partition at a time (``velocity.spark.stream_decide``):
        in the executors unless the batch is small. An own bucket whose earlier events the
        hot state does not hold (after a restart, rarely) makes a second round with them
        read from the Delta history."""
        settings = self.settings
        keyed = batch_keyed_rows(accepted, signatures, watermark)
        in_executors = keyed.num_rows >= settings.stream_executor_min_rows
        decided = decide_batch(self.spark, keyed, None, plan, partitions, in_executors)
        if decided.missing:
            history = self._own_bucket_history(set(decided.missing), signatures, plan.batch)
            decided = decide_batch(self.spark, keyed, history, plan, partitions, in_executors)
            if decided.missing:
                raise RuntimeError(f"own buckets without history: {decided.missing[:3]}")
        return decided

    def _commit(
        self, prepared: PreparedBatch, batch_id: int, timer: StepTimer, lease: Lease
    ) -> int:
        """Send the batch's commit and collect while Redis runs it; then the alerts go to
        Kafka (when it publishes there): at least once, since a batch that fails here is
        replayed, finds itself committed in Redis and publishes them again. Returns the
        alerts published."""
        pending = mirror.begin_stream_commit(self.redis, self.settings, prepared.commit, lease)
        alerts, partitions = prepared.alerts, prepared.partition_count
        try:
            del prepared
            collect_batch_garbage()
            timer.mark("gc")
        finally:  # never leave a commit in flight behind a failed step
            published = pending.result()
        # Committed: its key-partitions' records are of no more use (a replay stops at
        # the progress). Left by a crash here, they expire.
        mirror.forget_partitions(self.redis, self.settings.redis_keys, batch_id, partitions)
        timer.mark("redis-commit")
        if self._kafka_alerts is not None and alerts:
            self._kafka_alerts.publish(alerts)
            timer.mark("kafka-publish")
        self._committed = batch_id
        return max(published, 0)

    def _read_state(self, transaction_ids: list[str], batch_id: int) -> mirror.StreamRead:
        """The Redis half of a batch's input on the driver (progress, seen transactionIds);
        refills Redis first when it lost this data dir's state: flushed, or behind the last
        batch this process committed (restored from an older snapshot under the running
        stream). Costs no call of its own: both come with the read."""
        read = mirror.read_stream_state(self.redis, self.settings, transaction_ids)
        lost = None
        if read.mirror_of != str(self.settings.data_dir):
            lost = f"Redis lost the state of {self.settings.data_dir}"
        elif (rollback := rolled_back(read.committed_batch, process=self._committed)) is not None:
            lost = rollback.message()
        if lost is not None:
            log.warning("%s: rebuilding it from Delta before batch %s", lost, batch_id)
            self.mirror.rebuild(batch_id - 1)
            read = mirror.read_stream_state(self.redis, self.settings, transaction_ids)
        return read

    def _own_bucket_history(
        self, needed: set[BucketSlot], signatures: list[RuleSignature], batch_id: int
    ) -> pa.Table:
        """The earlier batches' raw events of ``needed`` own buckets, from Delta, as keyed
        rows (rare: an own bucket whose raw events the hot state does not hold)."""
        self.state.flush_spool(batch_id - 1)
        width = self.settings.bucket_width_ms
        lower = min(start for _, _, start in needed)
        upper = max(start for _, _, start in needed) + width - 1
        wanted = {s for s in signatures if s.signature_id in {sig for sig, _, _ in needed}}
        earlier = self.state.read("events").where(
            (F.col("stream_batch") < batch_id) & F.col("eventTime").between(lower, upper)
        )
        rows = keyed_events(earlier, wanted).toArrow()
        times = rows.column("eventTime").to_numpy()
        slots = zip(
            rows.column("signature_id").to_pylist(),
            rows.column("key").to_pylist(),
            (times - times % width).tolist(),
            strict=True,
        )
        return rows.filter(pa.array([slot in needed for slot in slots], pa.bool_()))

    def _rules_in_force(self, batch_id: int) -> list[Rule]:
        """The active rules, read again only when the rules table has a new version; a
        change publishes them to Redis and builds the signatures that need it."""
        version = self._rules_table_version()
        if version != self._rules_version:
            rules = deciding_rules(self.rule_store.in_force())
            mirror.publish_rules(
                self.redis,
                self.settings.redis_keys,
                rules,
                self.settings.bucket_width_ms,
                self.settings.max_future_seconds * 1000,
            )
            signatures = list(rules_by_signature(rules))
            # Build from every batch Redis has: a batch committed there before a crash is
            # replayed without being decided again, so the build must count its events.
            committed = mirror.committed_batch(self.redis, self.settings)
            through = batch_id if committed is None else max(batch_id, committed + 1)
            self.signatures.sync(signatures, rules, through)
            self._rules, self._rules_version = rules, version
        return self._rules

    def _rules_table_version(self) -> int:
        """The rules table's version, read from its log by delta-rs (the rule store's own
        writer): the kept handle moves on by the commits since its last look, ~1 ms a
        batch. Not the JVM's: its first look at a Delta log loads Delta's classes, ~10 s
        of a new stream's start on two busy cores."""
        if self._rules_log is None:
            self._rules_log = self.rule_store.create_if_missing()
        else:
            self._rules_log.update_incremental()
        return int(self._rules_log.version())

    # --- write-behind ------------------------------------------------------------------

    def flush(self, through: int | None = None) -> None:
        """Append the spooled batches up to ``through`` (None: every batch this process
        committed) to Delta under the state lock, and evict the Delta buckets below the
        horizon at most every ``eviction_every_seconds``."""
        through = self._committed if through is None else through
        # One flush (and its eviction) at a time: the write-behind thread, close() and a
        # caller's flush() would otherwise run two DELETEs on the buckets table at once.
        with self._lock.held("stream write-behind") as lease, self._flushing:
            lease.check()
            group = [b for b in self.spool.batches() if through is not None and b <= through]
            metas = [self.spool.meta(b) for b in group[-1:]]
            self.state.flush_spool(through)
            if not group or not self._rules:
                return
            # By the clock, not by batches: at one batch a second, every tenth batch was a
            # DELETE every 15 s, 15 % of the stream's JVM CPU at 1 000 events/s.
            newest_before = metas[0].get("newest_before")
            if newest_before is not None and time.monotonic() >= self._next_eviction:
                self.state.evict(self._rules, int(newest_before))  # type: ignore[call-overload]
                self._next_eviction = time.monotonic() + self.settings.eviction_every_seconds

    def _write_behind(self) -> None:
        """The background flusher: every half ``write_behind_seconds``, flush what is
        committed, so a batch reaches Delta within about that bound."""
        period = max(0.5, self.settings.write_behind_seconds / 2)
        while not self._flusher_stop.wait(period):
            try:
                self.flush(self._committed)
            except Exception:  # logged; the stream keeps deciding, the next round retries
                log.exception("write-behind flush failed; will retry")

    def close(self) -> None:
        """Let the micro-batch in flight commit (raising its failure, after the rest),
        stop the background flusher, flush every committed batch, then stop serving the
        metrics. Idempotent."""
        try:
            self.settle()
        except BaseException as exc:
            if exc is not self._reported:
                raise
        finally:
            self._close_after_batches()

    def _close_after_batches(self) -> None:
        if self._flusher is not None:
            self._flusher_stop.set()
            self._flusher.join()
            self._flusher = None
        try:
            through = max((b for b in (self._committed, last_committed_batch(self.settings))
                           if b is not None), default=None)  # fmt: skip
            # Spark counts a batch done before it commits: one whose input is still
            # spooled did not, and the next start decides it first.
            undecided = self.inputs.batches()
            if through is not None and undecided:
                through = min(through, undecided[0] - 1)
            self.flush(through)
        finally:
            if self._metrics_server is not None:
                self._metrics_server.shutdown()
                self._metrics_server.server_close()
                self._metrics_server = None

    def _serve_metrics(self, source: EventSource) -> None:
        """Serve the metrics on 127.0.0.1:``metrics_port`` (0: not at all), once. A taken
        port stops the start: a scrape must never read another stream's figures."""
        self.metrics.stream_info(str(source), str(self.settings.data_dir))
        port = self.settings.metrics_port
        if port == 0 or self._metrics_server is not None:
            return
        try:
            self._metrics_server, _ = start_http_server(
                port, addr="127.0.0.1", registry=self.metrics.registry
            )
        except OSError as exc:
            raise UsageError(
                f"cannot serve the stream's metrics on 127.0.0.1:{port} ({exc.strerror}): set "
                "VELOCITY_METRICS_PORT to a free port, or 0 for no metrics server"
            ) from exc

    def _folder_lines(self, folder: Path, max_files_per_trigger: int | None) -> DataFrame:
        # A file deleted between Spark's listing and its read is skipped (its lines went
        # with it) instead of failing every retry of the batch for good.
        reader = self.spark.readStream.format("text").option("ignoreMissingFiles", "true")
        # Bounded batches: a stream that fell behind would otherwise take the whole backlog
        # in one batch, whose atomic Redis commit grows with it (and blocks lookups) until
        # it outlasts the client's timeout, and every retry fails the same way.
        if max_files_per_trigger:
            reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
        elif self.settings.stream_max_bytes_per_trigger:
            reader = reader.option("maxBytesPerTrigger", self.settings.stream_max_bytes_per_trigger)
        archive = self.settings.stream_archive_dir
        if archive is not None:
            reader = reader.option("cleanSource", "archive").option(
                "sourceArchiveDir", str(archive)
            )
        return with_line_source(reader.load(str(folder)))

    def _kafka_lines(self, source: KafkaSource) -> DataFrame:
        """The topic through Spark's Kafka source: offsets in the checkpoint, batches of at
        most ``kafka_max_offsets_per_trigger`` messages (bounded, like the folder's)."""
        messages = (
            self.spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", source.bootstrap)
            .option("subscribe", source.topic)
            .option("startingOffsets", source.starting_offsets)
            .option("maxOffsetsPerTrigger", self.settings.kafka_max_offsets_per_trigger)
            # A task reading a partition's range otherwise waits the consumer's default
            # 500 ms for more data at the range's end: measured, a micro-batch of 1 000
            # messages over 4 partitions took 0.9 s to read, 0.1 s with this.
            .option("kafka.fetch.max.wait.ms", KAFKA_FETCH_MAX_WAIT_MS)
            .load()
        )
        return kafka_messages(messages)

    def _finish_spooled_inputs(self) -> None:
        """Decide and commit the batches Spark handed over but this data dir's stream never
        committed (it ended while deciding them), from their spooled input, in order; one
        that did commit only publishes its alerts to Kafka again."""
        for batch_id in self.inputs.batches():
            log.warning("finishing batch %s from its spooled input", batch_id)
            self._decide_and_commit(self.inputs.read(batch_id), batch_id, StepTimer())

    def _refuse_a_lost_checkpoint(self) -> None:
        """A checkpoint without a committed batch, in a data dir whose stream committed
        some: Spark would number batches from 0 again and each would be refused as done
        until the ids passed the old ones (every event in between lost)."""
        in_delta = None
        if not self.state.unwritten("events"):
            row = self.state.read("events").agg(F.max("stream_batch")).first()
            in_delta = None if row is None or row[0] is None else int(row[0])
        marks = (mirror.committed_batch(self.redis, self.settings), in_delta)
        done = max((b for b in marks if b is not None and b >= 0), default=None)
        if done is not None:
            raise UsageError(
                f"the stream's checkpoint {checkpoint_dir(self.settings.data_dir)} is missing "
                f"or empty, but this data dir's stream committed batches up to {done}: "
                "restore the checkpoint folder, or run the stream on a new VELOCITY_DATA_DIR"
            )

    def start(
        self, source: EventSource, available_now: bool, max_files_per_trigger: int | None = None
    ) -> StreamingQuery:
        """Start the query over ``source`` (a folder, or a Kafka topic); its checkpoint
        lives in the data dir.

        Serves the metrics first (``metrics_port``), then refills Redis from Delta when
        Redis does not hold this data dir's state. With the available-now trigger every
        batch is flushed to Delta before the next; otherwise a background thread writes
        Delta behind (``close`` flushes the rest).
        """
        archive = self.settings.stream_archive_dir
        folder = None if isinstance(source, KafkaSource) else source.resolve()
        if archive is not None and folder is not None and archive.is_relative_to(folder):
            raise UsageError(
                f"VELOCITY_STREAM_ARCHIVE_DIR {archive} lies inside the events folder "
                f"{source}: Spark would read the archived files again"
            )
        self._serve_metrics(source)
        # A batch makes many short-lived objects; each batch collects its own garbage
        # once (``collect_batch_garbage``) instead of the collector running every 700.
        gc.set_threshold(1_000_000, 1000, 1000)
        self._flush_each_batch = available_now or self.settings.write_behind_seconds == 0
        self._overlap = self.settings.stream_overlap and not available_now
        self._reads_kafka = isinstance(source, KafkaSource)
        if kafka_alerts_on(self.settings, self._reads_kafka):
            self._kafka_alerts = AlertPublisher(self.settings)
        with self._lock.held("stream start"):
            # Redis lost this data dir's state (a flush, a new server, a long stop), or
            # lost committed batches (restored from an older snapshot): never decide on it.
            current = self.mirror.is_current()
            rollback = self.mirror.rolled_back() if current else None
            if rollback is not None:
                log.warning("%s: rebuilding it from Delta", rollback.message())
            if not current or rollback is not None:
                self.mirror.rebuild()
            self._finish_spooled_inputs()
            committed = last_committed_batch(self.settings)
            if committed is None:
                self._refuse_a_lost_checkpoint()
            # Rules and their signatures' history in place before the first batch arrives.
            self._rules_in_force(0 if committed is None else committed + 1)
        if self.settings.stream_executor_min_rows > 0:
            LOCAL_DECIDERS.start(self._decide_partitions())
        SPOOL_FLUSHER.start(1)
        lines = (
            self._kafka_lines(source)
            if isinstance(source, KafkaSource)
            else self._folder_lines(source, max_files_per_trigger)
        )
        writer = (
            lines.writeStream.foreachBatch(self.process_batch)
            .option("checkpointLocation", str(checkpoint_dir(self.settings.data_dir)))
            .queryName(QUERY_NAME)
        )
        writer = (
            writer.trigger(availableNow=True)
            if available_now
            else writer.trigger(processingTime="0 seconds")
        )
        query = writer.start()
        if not self._flush_each_batch and self._flusher is None:
            self._flusher_stop.clear()
            self._flusher = threading.Thread(
                target=self._write_behind, name="velocity-write-behind", daemon=True
            )
            self._flusher.start()
        return query
