"""The stream's metrics, in Prometheus's text format (``velocity stream`` serves them on
127.0.0.1:``VELOCITY_METRICS_PORT``; docs/reference/metrics.md lists them, generated from
this registry).

Where the figures come from:
- each micro-batch hands over one summary once it has committed (``BatchCounts``,
  counted from the Arrow rows the batch spools: table lengths and group counts, no loop
  per event);
- the source's backlog comes with Spark's progress and idle events (a folder's waiting
  files as the status file counts them, a topic's lag from the batch's offsets);
- the write-behind delay is read when scraped, from the spool.

Counters count this process's batches and start at 0 with each run (Prometheus's
``rate`` and ``increase`` take the reset in their stride). A batch replayed after a crash
that Redis had committed already counts in the batch duration only: the process that
committed it counted its events. So over the batches a run decided,
read = accepted + duplicate + quarantined, and late (both reasons) <= accepted.

No Spark, Redis or Airflow here; serving the registry over HTTP is the stream's
(``velocity.spark.stream``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    Info,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric

from velocity.domain.schema import LateReason, RejectReason

# From a tiny batch's 50 ms to the minute a backlog's bounded batch may take.
BATCH_SECONDS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# A commit's wait is milliseconds when Redis is well; seconds mean it is not.
REDIS_COMMIT_SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)

# The stream's status shows the share of late and out-of-order events over this many.
RECENT_BATCHES = 20

PartitionLag = dict[tuple[str, str], int]  # (topic, partition) -> messages behind


@dataclass(frozen=True)
class BatchCounts:
    """What one decided micro-batch did with its lines."""

    lines: int  # read from the source (a folder's blank lines skipped)
    accepted: int
    duplicates: int
    late: int  # accepted, older than the watermark
    quarantined: Mapping[str, int]  # by reason code
    alerts: Mapping[tuple[int, str, bool], int]  # by (ruleId, kind, suppressed)
    out_of_order: int = 0  # decided after a later event of one of their rule keys


def _group_counts(table: pa.Table, keys: list[str]) -> dict[tuple[Any, ...], int]:
    grouped = table.select(keys).group_by(keys).aggregate([([], "count_all")])
    columns = [grouped.column(k).to_pylist() for k in keys]
    counts = grouped.column("count_all").to_pylist()
    return dict(zip(zip(*columns, strict=True), counts, strict=True))


def _with_suppressed(alerts: pa.Table) -> pa.Table:
    """Alert rows with ``suppressed`` false where it is null or missing (older rows)."""
    flag = (
        pc.fill_null(alerts.column("suppressed"), False)
        if "suppressed" in alerts.column_names
        else pa.array([False] * alerts.num_rows, pa.bool_())
    )
    return alerts.select(["ruleId", "kind"]).append_column("suppressed", flag)


def batch_counts(lines: int, rows: Mapping[str, pa.Table]) -> BatchCounts:
    """A batch's counts from the rows it spools (keyed by live table, in the live tables'
    shapes: ``velocity.delta.write_behind.SPOOLED_TABLES``)."""
    reasons = _group_counts(rows["quarantine"], ["reason_code"])
    recorded = rows["late_events"]
    out_of_order = 0
    if "reason" in recorded.column_names:
        out_of_order = (
            pc.sum(pc.equal(recorded.column("reason"), LateReason.OUT_OF_ORDER.value)).as_py() or 0
        )
    return BatchCounts(
        lines=lines,
        accepted=rows["events"].num_rows,
        duplicates=rows["duplicates"].num_rows,
        late=recorded.num_rows - out_of_order,
        quarantined={str(reason): n for (reason,), n in reasons.items()},
        alerts={
            (int(rule), str(kind), bool(suppressed)): n
            for (rule, kind, suppressed), n in _group_counts(
                _with_suppressed(rows["alerts"]), ["ruleId", "kind", "suppressed"]
            ).items()
        },
        out_of_order=out_of_order,
    )


@dataclass(frozen=True)
class RunTotals:
    """What this process's stream did, counted as its metrics count it: ``batches`` is
    ``velocity_batch_duration_seconds_count`` (every micro-batch it committed, a replay
    included), ``lines`` is ``velocity_events_read_total``, ``last_batch`` is
    ``velocity_committed_batch_id`` (a batch id: the checkpoint numbers batches across runs)."""

    batches: int
    lines: int
    last_batch: int | None

    def text(self) -> str:
        """``342 micro-batches this run (the last is batch 1469), 195301 lines read``."""
        if not self.batches:
            return "no micro-batch this run, 0 lines read"
        many = "micro-batch" if self.batches == 1 else "micro-batches"
        return (
            f"{self.batches} {many} this run (the last is batch {self.last_batch}), "
            f"{self.lines} lines read"
        )


@dataclass(frozen=True)
class RecentArrivals:
    """The events of the last few batches, and how many of them were recorded for the
    backfill of late events, by reason: the share a lagging source makes."""

    batches: int
    accepted: int
    late: int
    out_of_order: int

    def to_json(self) -> dict[str, int]:
        return {
            "batches": self.batches,
            "accepted": self.accepted,
            "late": self.late,
            "outOfOrder": self.out_of_order,
        }


def kafka_lag(progress: Mapping[str, Any]) -> PartitionLag | None:
    """Messages each topic partition holds past the batch's end, from a Spark progress
    (StreamingQueryProgress as JSON: a Kafka source's ``latestOffset`` and ``endOffset`` are
    ``{topic: {partition: offset}}``); None when no source has such offsets (a folder)."""
    lag: PartitionLag = {}
    for source in progress.get("sources") or ():
        latest, end = source.get("latestOffset"), source.get("endOffset")
        if not isinstance(latest, dict) or not isinstance(end, dict):
            continue
        for topic, offsets in latest.items():
            ends = end.get(topic)
            if not isinstance(offsets, dict) or not isinstance(ends, dict):
                continue
            for partition, offset in offsets.items():
                done = ends.get(partition)
                if isinstance(offset, int) and isinstance(done, int):
                    lag[(str(topic), str(partition))] = max(0, offset - done)
    return lag or None


class StreamMetrics:
    """The stream's metrics in a registry of their own (never the process-global one).

    Thread-safe: the micro-batch, Spark's listener thread and the HTTP server's threads
    use it at once (each update is one counter call or one attribute assignment).
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._clock = clock
        r = self.registry
        self._read = Counter(
            "velocity_events_read", "Lines read from the source (blank lines of files skipped).",
            registry=r,
        )  # fmt: skip
        self._accepted = Counter(
            "velocity_events_accepted", "Events accepted (late ones included).", registry=r
        )
        self._quarantined = Counter(
            "velocity_events_quarantined", "Lines quarantined, by reason code.", ["reason"],
            registry=r,
        )  # fmt: skip
        self._duplicates = Counter(
            "velocity_events_duplicate",
            "Events dropped as duplicates (their transactionId accepted before).",
            registry=r,
        )
        self._late = Counter(
            "velocity_events_late",
            "Accepted events recorded for the backfill of late events, by reason: late "
            "(older than the watermark: counted, not decided) or out_of_order (decided at "
            "once, after a later event of one of its rule keys was decided).",
            ["reason"],
            registry=r,
        )
        self._alerts = Counter(
            "velocity_alerts",
            "Alerts decided, by rule, kind and whether the rule's cooldown suppressed them "
            '(suppressed="false": published; "true": recorded only).',
            ["rule_id", "kind", "suppressed"],
            registry=r,
        )
        self._batch_seconds = Histogram(
            "velocity_batch_duration_seconds",
            "Wall time of a micro-batch (read, decide, spool, Redis commit; the flush too "
            "with the available-now trigger).",
            buckets=BATCH_SECONDS_BUCKETS,
            registry=r,
        )
        self._commit_seconds = Histogram(
            "velocity_redis_commit_seconds",
            "How long a micro-batch waited for its Redis commit's answer after collecting "
            "its garbage, which overlaps the commit.",
            buckets=REDIS_COMMIT_SECONDS_BUCKETS,
            registry=r,
        )
        self._info = Info("velocity_stream", "What this stream reads and where its state is.",
                          registry=r)  # fmt: skip
        # Every reason from the start at 0, so a rate over a first quarantined line works.
        for reason in RejectReason:
            self._quarantined.labels(reason=reason.value)
        for why in LateReason:
            self._late.labels(reason=why.value)
        self._recent: deque[BatchCounts] = deque(maxlen=RECENT_BATCHES)
        self._batches = self._lines = 0  # this run's, for ``run_totals``
        ProcessCollector(registry=r)  # process_cpu_seconds_total, memory, open files
        # What is read at scrape time (``collect``): gauges only once their value is known.
        self._backlog_files: int | None = None
        self._lag: PartitionLag = {}
        self._heartbeat: float | None = None
        self._committed_batch: int | None = None
        self._spooled_since: Callable[[], float | None] | None = None
        r.register(self)

    # --- updates --------------------------------------------------------------------

    def stream_info(self, source: str, data_dir: str) -> None:
        """Name the stream's source and data dir (``velocity_stream_info``)."""
        self._info.info({"source": source, "data_dir": data_dir})

    def follow_spool(self, spooled_since: Callable[[], float | None]) -> None:
        """Read the write-behind delay at each scrape: ``spooled_since()`` is when the oldest
        batch not yet in Delta was spooled (epoch seconds), None when none waits."""
        self._spooled_since = spooled_since

    def batch_done(
        self,
        batch_id: int,
        seconds: float,
        counts: BatchCounts | None,
        redis_commit_seconds: float | None = None,
    ) -> None:
        """A micro-batch committed; ``counts`` is None for a replay Redis had committed."""
        self._batch_seconds.observe(seconds)
        if redis_commit_seconds is not None:
            self._commit_seconds.observe(redis_commit_seconds)
        self._committed_batch = batch_id
        self._heartbeat = self._clock()
        self._batches += 1
        if counts is None:
            return
        self._lines += counts.lines
        self._read.inc(counts.lines)
        self._accepted.inc(counts.accepted)
        self._duplicates.inc(counts.duplicates)
        self._late.labels(reason=LateReason.LATE.value).inc(counts.late)
        self._late.labels(reason=LateReason.OUT_OF_ORDER.value).inc(counts.out_of_order)
        self._recent.append(counts)
        for reason, n in counts.quarantined.items():
            self._quarantined.labels(reason=reason).inc(n)
        for (rule_id, kind, suppressed), n in counts.alerts.items():
            flag = "true" if suppressed else "false"
            self._alerts.labels(rule_id=str(rule_id), kind=kind, suppressed=flag).inc(n)

    def source_progress(
        self, progress: Mapping[str, Any] | None, backlog_files: int | None
    ) -> None:
        """A Spark progress event of the query (StreamingQueryProgress as JSON), or an idle
        one (None: the source had nothing new, so a topic has no lag); ``backlog_files`` is
        the folder's waiting files (None for a topic)."""
        self._heartbeat = self._clock()
        self._backlog_files = backlog_files
        lag = None if progress is None else kafka_lag(progress)
        if lag is not None:
            self._lag = lag
        elif progress is None:
            self._lag = dict.fromkeys(self._lag, 0)

    def run_totals(self) -> RunTotals:
        """This process's micro-batches and lines read, as the metrics count them (not
        Spark's recent progress, which keeps the last 100 batches only)."""
        return RunTotals(self._batches, self._lines, self._committed_batch)

    def recent_arrivals(self) -> RecentArrivals:
        """The last ``RECENT_BATCHES`` decided batches' events, late and out of order."""
        recent = list(self._recent)
        return RecentArrivals(
            batches=len(recent),
            accepted=sum(c.accepted for c in recent),
            late=sum(c.late for c in recent),
            out_of_order=sum(c.out_of_order for c in recent),
        )

    # --- read at scrape time --------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        """The gauges of the moment (the registry calls this at each scrape)."""
        if self._backlog_files is not None:
            yield GaugeMetricFamily(
                "velocity_backlog_files",
                "Files in the events folder that no micro-batch has picked up yet (a lower "
                "bound: one landing with an older mtime than the newest read is not counted).",
                value=self._backlog_files,
            )
        if self._lag:
            lag = GaugeMetricFamily(
                "velocity_kafka_lag_messages",
                "Messages of each topic partition past the last micro-batch's end offset.",
                labels=["topic", "partition"],
            )
            for (topic, partition), behind in sorted(self._lag.items()):
                lag.add_metric([topic, partition], behind)
            yield lag
        if self._spooled_since is not None:
            since = self._spooled_since()
            delay = 0.0 if since is None else max(0.0, self._clock() - since)
            yield GaugeMetricFamily(
                "velocity_write_behind_delay_seconds",
                "Age of the oldest committed batch not yet appended to Delta (0: Delta holds "
                "every batch Redis has).",
                value=delay,
            )
        if self._committed_batch is not None:
            yield GaugeMetricFamily(
                "velocity_committed_batch_id",
                "The last micro-batch this process committed to Redis.",
                value=self._committed_batch,
            )
        if self._heartbeat is not None:
            yield GaugeMetricFamily(
                "velocity_heartbeat_timestamp_seconds",
                "When the stream last showed life (a batch's end, a progress or idle event: "
                "at least every VELOCITY_STREAM_HEARTBEAT_SECONDS between batches).",
                value=self._heartbeat,
            )

    def render(self) -> bytes:
        """Every metric in Prometheus's text format, as a scrape gets them."""
        return generate_latest(self.registry)
