"""The stream's lifecycle on the Spark side: the listener that keeps the status file
current from the query's events, and the loop that supervises the running query.

The protocol itself (status file, stop requests, health) is ``velocity.operating.stream_control``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener
from pyspark.sql.streaming.listener import (
    JStreamingQueryListener,
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
)

from velocity.errors import VelocityError
from velocity.operating.stream_control import (
    MAX_ERROR_CHARS,
    QUERY_NAME,
    StreamStatus,
    read_stop_request,
    remove_stop_request,
)
from velocity.operating.stream_metrics import StreamMetrics

log = logging.getLogger("velocity.lifecycle")


class _ProgressAsJson(JStreamingQueryListener):
    """PySpark's bridge from the JVM's listener calls, except that a progress event crosses
    as its JSON (two py4j calls). PySpark's own walks the progress field by field, dozens of
    py4j calls each resolving names against every JAR: measured, 3.4 s of the JVM's CPU for
    30 micro-batches on the listener's thread alone, beside the gateway's and the driver's."""

    def onQueryProgress(self, jevent: Any) -> None:
        progress = {"progress": json.loads(jevent.progress().json())}
        self.pylistener.onQueryProgress(QueryProgressEvent.fromJson(progress))


class StatusListener(StreamingQueryListener):
    """Keeps a StreamStatus (and the stream's metrics: heartbeat, backlog) current from the
    events of the query named ``QUERY_NAME``.

    Listener calls come on Spark's listener thread, asynchronously; a failure here is
    logged and never reaches the query. Spark reports a batch done once the stream has
    handed it over (the overlap); ``committed(batch)`` holds the report back until the
    batch has committed, so the status and the metrics tell the same batch.
    """

    def __init__(
        self,
        status: StreamStatus,
        query_name: str = QUERY_NAME,
        metrics: StreamMetrics | None = None,
        committed: Callable[[int], None] | None = None,
    ) -> None:
        self._status = status
        self._query_name = query_name
        self._metrics = metrics
        self._committed = committed
        self._ids: set[str] = set()

    @property
    def _jlistener(self) -> Any:  # what StreamingQueryManager.addListener registers
        from pyspark import SparkContext

        if not hasattr(self, "_jlistenerobj"):
            self._jlistenerobj = SparkContext._jvm.PythonStreamingQueryListenerWrapper(  # type: ignore[union-attr]
                _ProgressAsJson(self)
            )
        return self._jlistenerobj

    def _guard(self, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception:  # the status file is best effort; the stream must go on
            log.exception("could not update the stream status file")

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        if event.name != self._query_name:
            return
        self._ids.add(str(event.id))
        self._guard(lambda: self._status.running(str(event.id), str(event.runId)))

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        if str(event.progress.id) in self._ids:
            progress = json.loads(event.progress.json)
            if self._committed is not None:  # reported as committed, not as handed over
                self._committed(int(progress["batchId"]))
            # The batch counted its arrivals before Spark reported its progress.
            arrivals = None if self._metrics is None else self._metrics.recent_arrivals()
            self._guard(lambda: self._status.progress(progress, arrivals))
            self._guard(lambda: self._observe(progress))

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        if str(event.id) in self._ids:
            self._guard(self._status.heartbeat)
            self._guard(lambda: self._observe(None))

    def _observe(self, progress: dict[str, Any] | None) -> None:
        """Hand the metrics the event, with the folder's backlog the status just counted."""
        if self._metrics is not None:
            backlog = self._status.snapshot().get("backlogFiles")
            self._metrics.source_progress(progress, None if backlog is None else int(backlog))

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        if str(event.id) not in self._ids:
            return
        if event.exception:
            error = event.exception
            self._guard(lambda: self._status.failed(error))
        else:
            self._guard(lambda: self._status.stopped("query terminated"))


def attach_status_listener(
    spark: SparkSession,
    status: StreamStatus,
    heartbeat_seconds: int,
    metrics: StreamMetrics | None = None,
    committed: Callable[[int], None] | None = None,
) -> StatusListener:
    """Register the listener and make idle queries report every ``heartbeat_seconds``;
    ``committed(batch)`` returns once the batch Spark reports done has committed.

    Call before starting the query: the idle-event interval is read at query start.
    """
    spark.conf.set(
        "spark.sql.streaming.noDataProgressEventInterval", f"{heartbeat_seconds * 1000}ms"
    )
    listener = StatusListener(status, metrics=metrics, committed=committed)
    spark.streams.addListener(listener)
    return listener


def _wait_for_batch_end(query: StreamingQuery, grace_seconds: float) -> bool:
    """Wait until no micro-batch is in flight (or one more has ended), up to the grace.

    Back-to-back batches leave almost no idle gap to observe, so a new lastProgress
    also counts: the batch in flight at the request has then committed.
    """
    deadline = time.monotonic() + grace_seconds
    before = query.lastProgress
    mark = before["timestamp"] if before else None
    while time.monotonic() < deadline:
        if not query.status.get("isTriggerActive"):
            return True
        last = query.lastProgress
        if last is not None and last["timestamp"] != mark and int(last["numInputRows"]) > 0:
            return True
        time.sleep(0.05)
    return False


def supervise(
    query: StreamingQuery,
    status: StreamStatus,
    data_dir: Path,
    *,
    duration_seconds: float | None,
    grace_seconds: float,
    terminate_requested: Callable[[], bool],
    batch_failure: Callable[[], BaseException | None] = lambda: None,
) -> str:
    """Wait for the query to end, or stop it on request; returns why it stopped.

    Polls once a second for: the query ending by itself (available-now: done), a
    micro-batch that failed while Spark went on (``batch_failure()``), a stop request file,
    ``terminate_requested()`` (SIGTERM, Ctrl-C), the ``duration``. A stop
    lets the micro-batch in flight finish (up to ``grace_seconds``; one interrupted
    later replays from the checkpoint on the next start, exactly once), removes the
    request and writes STOPPED. A failed query writes FAILED and raises VelocityError.
    """
    deadline = time.monotonic() + duration_seconds if duration_seconds else None
    request: dict[str, Any] | None = None
    try:
        while True:
            try:
                if query.awaitTermination(1):
                    reason = "the query ended (available-now: every landed file processed)"
                    status.stopped(reason, final=True)
                    return reason
            except KeyboardInterrupt:
                reason = "interrupted (Ctrl-C)"
                break
            failure = batch_failure()
            if failure is not None:
                query.stop()
                raise StreamingQueryException(f"a micro-batch failed: {failure}") from failure
            request = read_stop_request(data_dir)
            if request is not None:
                reason = f"stop requested by {request.get('requestedBy', 'unknown')}"
                if request.get("reason"):
                    reason += f": {request['reason']}"
                break
            if terminate_requested():
                reason = "terminated (SIGTERM)"
                break
            if deadline is not None and time.monotonic() >= deadline:
                reason = f"--duration {duration_seconds} s elapsed"
                break
        if not _wait_for_batch_end(query, grace_seconds):
            log.warning(
                "micro-batch still running after %s s; stopping anyway (it replays on the "
                "next start)",
                grace_seconds,
            )
        query.stop()
    except StreamingQueryException as exc:
        error = str(exc)
        status.failed(error, final=True)
        raise VelocityError(
            f"the stream failed: {error[:MAX_ERROR_CHARS]}; `velocity stream` restarts it "
            "from its checkpoint"
        ) from exc
    if request is not None:
        remove_stop_request(data_dir)
    status.stopped(reason, request, final=True)
    return reason
