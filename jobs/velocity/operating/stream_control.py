"""The stream's lifecycle protocol: its status file, stop requests, health and backlog.

Pure of Spark (``velocity stream-status`` and ``stream-stop`` import only this, so they
answer at once); the Spark side (the listener that keeps the status current and the
supervision loop) is ``velocity.spark.lifecycle``.

Three files under the data dir make the running ``velocity stream`` visible and
controllable from outside the process (an Airflow task, an operator's shell):

- ``status/stream.json``  written by the stream only, always whole (temp file + rename):
  state (STARTING, RUNNING, STOPPED, FAILED), pid, host, the query and run ids, a
  heartbeat (``updatedAt``, refreshed by every progress and idle event, so at least
  every ``stream_heartbeat_seconds`` while the process is alive and between batches),
  the last batch's figures and the backlog: a folder's files waiting, or a topic's
  consumer lag (``offsetsBehindLatest``: messages past the last batch's end offsets, all
  partitions; ``maxOffsetsBehindLatest``: the most in one). ``velocity.operating.health`` judges it.
- ``control/stop-stream``  a stop request (who asked, when), written by
  ``velocity stream-stop``. The stream polls for it every second, lets the micro-batch
  in flight finish, stops the query, removes the request, writes STOPPED. A request
  older than a stream's start is left over from an earlier run and is removed unread.

A SIGKILLed stream cannot write anything: its file still says RUNNING, and the health
check calls it dead from the pid (same host) or from the stale heartbeat (any host).
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from velocity.errors import VelocityError
from velocity.operating.health import (
    FAILED,
    LIVE_STATES,
    RUNNING,
    STARTING,
    STOPPED,
    Health,
    LastCommit,
    stream_health,
)
from velocity.operating.local_process import process_alive
from velocity.operating.stream_metrics import RecentArrivals, kafka_lag
from velocity.settings import Settings

log = logging.getLogger("velocity.lifecycle")

# The name StreamJob.start gives its query; the listener follows only that query.
QUERY_NAME = "velocity-stream"
# Longest error text kept in the status file (a Spark error can carry a long plan).
MAX_ERROR_CHARS = 4000


@dataclass(frozen=True)
class KafkaSource:
    """The stream's events from a Kafka topic (``velocity stream --source kafka``)."""

    bootstrap: str
    topic: str
    starting_offsets: str = "earliest"
    """Where a new checkpoint starts reading (earliest or latest); a checkpoint that
    exists resumes at its own offsets."""

    def __str__(self) -> str:
        return f"kafka://{self.bootstrap}/{self.topic}"

    @classmethod
    def from_text(cls, text: str | None) -> KafkaSource | None:
        """The source ``str`` wrote (the status file's ``source``); None for a folder."""
        if text is None or not text.startswith("kafka://"):
            return None
        bootstrap, _, topic = text.removeprefix("kafka://").rpartition("/")
        return cls(bootstrap, topic)


EventSource = Path | KafkaSource  # a folder that event files land in, or a topic


def last_source(data_dir: Path) -> str | None:
    """What the stream of this data dir read when it last ran (``str`` of its source: a
    folder, or ``kafka://<bootstrap>/<topic>``); None when it never ran."""
    status = read_status(data_dir)
    return None if status is None or not status.get("source") else str(status["source"])


def source_is_kafka(data_dir: Path) -> bool:
    """Whether the stream of this data dir read (or reads) Kafka when it last ran."""
    return KafkaSource.from_text(last_source(data_dir)) is not None


def now_ms() -> int:
    return int(time.time() * 1000)


def local_host() -> str:
    return socket.gethostname()


def status_path(data_dir: Path) -> Path:
    return data_dir / "status" / "stream.json"


def stop_request_path(data_dir: Path) -> Path:
    return data_dir / "control" / "stop-stream"


def checkpoint_dir(data_dir: Path) -> Path:
    """The stream's checkpoint (where StreamJob.start puts it)."""
    return data_dir / "checkpoints" / "stream"


def write_json_atomically(path: Path, value: Mapping[str, Any]) -> None:
    """Write ``value`` so a reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    temp.write_text(json.dumps(value, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(temp, path)


def _read_json(path: Path, what: str) -> dict[str, Any] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise VelocityError(
            f"{what} {path} is not JSON ({exc}); delete it, the stream rewrites it"
        ) from exc
    if not isinstance(value, dict):
        raise VelocityError(f"{what} {path} holds {type(value).__name__}, not a JSON object")
    return value


def read_status(data_dir: Path) -> dict[str, Any] | None:
    """The stream's status file, or None when the stream never ran with this data dir."""
    return _read_json(status_path(data_dir), "status file")


def last_commit(checkpoint: Path) -> LastCommit | None:
    """The newest batch the checkpoint's commit log holds (``commits/<batchId>``, one file a
    committed micro-batch; Spark keeps the last hundred or so) and when its file was
    written; None when nothing has committed. One listing and one stat."""
    log_dir = checkpoint / "commits"
    try:
        batches = [int(n) for n in os.listdir(log_dir) if n.isdigit()]
    except FileNotFoundError:
        return None
    for batch in sorted(batches, reverse=True):
        try:
            return LastCommit(batch, int((log_dir / str(batch)).stat().st_mtime * 1000))
        except FileNotFoundError:
            continue  # purged between the listing and the stat: the next newest
    return None


def check_health(
    settings: Settings, stale_seconds: int | None = None, at_ms: int | None = None
) -> Health:
    """Read the status file and judge it now (pid checked when the stream runs here), with
    what the checkpoint says of earlier runs."""
    stale = settings.stream_stale_seconds if stale_seconds is None else stale_seconds
    return stream_health(
        read_status(settings.data_dir),
        now_ms() if at_ms is None else at_ms,
        stale * 1000,
        local_host=local_host(),
        pid_alive=process_alive,
        last_commit=last_commit(checkpoint_dir(settings.data_dir)),
        data_dir=settings.data_dir,
    )


def stream_ended(health: Health, pid_alive: Callable[[int | None], bool] = process_alive) -> bool:
    """Whether the stream is over: its status no longer live (or it is dead) and, when it
    ran on this host, its process gone too. The stream writes STOPPED once its query has
    stopped, then appends its last batches to Delta and exits, seconds later; from
    another host only the status can tell."""
    if health.state in LIVE_STATES and health.verdict != "dead":
        return False
    return health.host != local_host() or not pid_alive(health.pid)


# --- stop requests ------------------------------------------------------------------------


def request_stop(data_dir: Path, reason: str | None = None) -> dict[str, Any]:
    """Ask the running stream to stop; returns the request written."""
    request = {
        "requestedAt": now_ms(),
        "requestedBy": f"{getpass.getuser()}@{local_host()} pid {os.getpid()}",
        "reason": reason,
    }
    write_json_atomically(stop_request_path(data_dir), request)
    return request


def read_stop_request(data_dir: Path) -> dict[str, Any] | None:
    """The pending stop request, or None. An unreadable one still counts (it is a request)."""
    path = stop_request_path(data_dir)
    try:
        request = _read_json(path, "stop request")
    except VelocityError:
        request = {"requestedBy": "unknown (unreadable request file)"}
    if request is not None and not isinstance(request.get("requestedAt"), int):
        try:
            request["requestedAt"] = int(path.stat().st_mtime * 1000)
        except FileNotFoundError:
            return None
    return request


def remove_stop_request(data_dir: Path) -> None:
    stop_request_path(data_dir).unlink(missing_ok=True)


def clear_stale_stop_request(data_dir: Path, started_at_ms: int) -> dict[str, Any] | None:
    """Remove a stop request made before ``started_at_ms``; returns it, or None.

    Such a request was meant for an earlier run (or found none to stop); honouring
    it would stop this run the moment it starts.
    """
    request = read_stop_request(data_dir)
    if request is None or int(request["requestedAt"]) >= started_at_ms:
        return None
    remove_stop_request(data_dir)
    return request


# --- backlog ------------------------------------------------------------------------------


def newest_processed_mtime(checkpoint: Path) -> int | None:
    """Modification time (ms) of the newest file any micro-batch has picked up.

    Read from the file source's log in the checkpoint (``sources/0/<batch>``, one JSON
    line per file with its ``timestamp``; every 10th batch a ``.compact`` file holding
    all). The source takes files oldest first, so the newest batch's log holds the
    newest time; only that file's tail is read.
    """
    log_dir = checkpoint / "sources" / "0"
    try:
        names = [p.name for p in log_dir.iterdir()]
    except FileNotFoundError:
        return None
    batches = [(int(n.split(".")[0]), n) for n in names if n.split(".")[0].isdigit()]
    if not batches:
        return None
    path = log_dir / max(batches)[1]
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 256 * 1024))
            tail = handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return None  # compacted away between the listing and the read; next event retries
    newest: int | None = None
    for line in tail.splitlines():
        if '"timestamp"' not in line:
            continue
        try:
            stamp = json.loads(line).get("timestamp")
        except json.JSONDecodeError:
            continue  # the tail's first line may be cut
        if isinstance(stamp, int) and (newest is None or stamp > newest):
            newest = stamp
    return newest


def backlog(events_dir: Path, newest_processed: int | None) -> tuple[int, int | None]:
    """(files in ``events_dir`` newer than ``newest_processed``, the oldest one's mtime ms).

    Top-level files only, skipping names starting with "." or "_" as the file source
    does. A file landing with an mtime not newer than the newest processed one is not
    counted (the source still reads it): the figure is a cheap lower bound.
    """
    count, oldest = 0, None
    try:
        entries = list(os.scandir(events_dir))
    except FileNotFoundError:
        return 0, None
    for entry in entries:
        if entry.name.startswith((".", "_")):
            continue
        try:
            if not entry.is_file():
                continue
            mtime = entry.stat().st_mtime_ns // 1_000_000
        except FileNotFoundError:
            continue
        if newest_processed is None or mtime > newest_processed:
            count += 1
            oldest = mtime if oldest is None else min(oldest, mtime)
    return count, oldest


# --- the status file ----------------------------------------------------------------------


def _iso_ms(text: str) -> int | None:
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        return None


class StreamStatus:
    """The running stream's status file; every method rewrites it whole. Thread-safe.

    Once STOPPED or FAILED is written, later progress events (they arrive
    asynchronously) no longer change it; only ``stopped``/``failed`` with
    ``final=True`` (the supervising main thread's last word) may.
    """

    def __init__(
        self,
        data_dir: Path,
        source: EventSource,
        started_at_ms: int,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self._path = status_path(data_dir)
        self._checkpoint = checkpoint_dir(data_dir)
        # A folder's backlog is counted in files, a topic's in messages (its consumer lag).
        self._events_dir = source if isinstance(source, Path) else None
        self._clock = clock
        self._lock = threading.Lock()
        self._beats_end = threading.Event()  # set: the start's heartbeat ends at once
        self._newest_processed: int | None = None
        self._values: dict[str, Any] = {
            "state": STARTING,
            "pid": os.getpid(),
            "host": local_host(),
            "source": str(source),
            "eventsDir": str(source) if isinstance(source, Path) else None,
            "queryId": None,
            "runId": None,
            "startedAt": started_at_ms,
            "updatedAt": started_at_ms,
            "batch": None,
            "batchFinishedAt": None,
            "batchesThisRun": 0,
            "inputRowsPerSecond": None,
            "processedRowsPerSecond": None,
            "numInputRows": None,
            "lastBatchDurationMs": None,
            "backlogFiles": None,
            "oldestBacklogAt": None,
            "offsetsBehindLatest": None,
            "maxOffsetsBehindLatest": None,
            "recentArrivals": None,
            "error": None,
            "stopReason": None,
            "stopRequest": None,
            "stoppedAt": None,
        }

    @property
    def state(self) -> str:
        with self._lock:
            return str(self._values["state"])

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._values)

    def _update(self, final: bool = False, **values: Any) -> None:
        with self._lock:
            if self._values["state"] in (STOPPED, FAILED) and not final:
                return
            self._values.update(values)
            if self._values["state"] != STARTING:
                self._beats_end.set()
            self._values["updatedAt"] = self._clock()
            write_json_atomically(self._path, self._values)

    def _backlog(
        self, refresh_newest: bool, progress: Mapping[str, Any] | None = None, idle: bool = False
    ) -> dict[str, Any]:
        """A folder's files waiting; or a topic's lag, from ``progress`` (Spark's, read by
        ``kafka_lag``) or 0 when ``idle`` (the source had nothing new to read)."""
        if self._events_dir is None:
            lag = None if progress is None else kafka_lag(progress)
            if lag is None and not idle:
                return {}  # nothing to tell: the last figures stand
            behind = list((lag or {}).values())
            return {
                "offsetsBehindLatest": sum(behind),
                "maxOffsetsBehindLatest": max(behind, default=0),
            }
        if refresh_newest or self._newest_processed is None:
            self._newest_processed = newest_processed_mtime(self._checkpoint)
        files, oldest = backlog(self._events_dir, self._newest_processed)
        return {"backlogFiles": files, "oldestBacklogAt": oldest}

    @staticmethod
    def _arrivals(arrivals: RecentArrivals | None) -> dict[str, Any]:
        return {} if arrivals is None else {"recentArrivals": arrivals.to_json()}

    def starting(self) -> None:
        self._update()

    def beat_while_starting(self, every_seconds: float) -> threading.Thread:
        """Refresh the heartbeat every ``every_seconds`` for as long as the state is
        STARTING: Spark's start, the tables and the rules can take minutes on a busy
        machine, and no listener event comes before the query starts, so without this a
        slow start would read as stalled (and a scheduler would kill it). Ends by itself
        once the state moves on; a daemon thread, so it never holds the process up."""

        def beat() -> None:
            while not self._beats_end.wait(every_seconds):
                with self._lock:
                    if self._values["state"] != STARTING:
                        return
                    self._values["updatedAt"] = self._clock()
                    try:
                        write_json_atomically(self._path, self._values)
                    except OSError:  # best effort, as the listener's: the start goes on
                        log.exception("could not refresh the stream status file")

        thread = threading.Thread(target=beat, name="velocity-status-start-beat", daemon=True)
        thread.start()
        return thread

    def running(self, query_id: str, run_id: str) -> None:
        self._update(state=RUNNING, queryId=query_id, runId=run_id, **self._backlog(True))

    def heartbeat(self, progress: Mapping[str, Any] | None = None) -> None:
        """An idle trigger (or a batch of no rows, ``progress``): the process and its
        query are alive, nothing new to read."""
        self._update(**self._backlog(False, progress, idle=True))

    def progress(self, progress: Mapping[str, Any], arrivals: RecentArrivals | None = None) -> None:
        """A micro-batch ended (``progress`` as StreamingQueryProgress.json); ``arrivals``:
        the last batches' events, late and out of order (the stream's metrics')."""
        rows = int(progress.get("numInputRows") or 0)
        if rows == 0:
            self.heartbeat(progress)
            return
        duration = int(progress.get("batchDuration") or 0)
        started = _iso_ms(str(progress.get("timestamp", "")))
        with self._lock:
            batches = int(self._values["batchesThisRun"]) + 1
        self._update(
            batch=int(progress["batchId"]),
            batchFinishedAt=(started + duration) if started is not None else self._clock(),
            batchesThisRun=batches,
            numInputRows=rows,
            inputRowsPerSecond=progress.get("inputRowsPerSecond"),
            processedRowsPerSecond=progress.get("processedRowsPerSecond"),
            lastBatchDurationMs=duration,
            **self._arrivals(arrivals),
            **self._backlog(True, progress),
        )

    def stopped(
        self, reason: str, request: Mapping[str, Any] | None = None, final: bool = False
    ) -> None:
        self._update(
            final=final,
            state=STOPPED,
            stopReason=reason,
            stopRequest=dict(request) if request else None,
            stoppedAt=self._clock(),
        )

    def failed(self, error: str, final: bool = False) -> None:
        self._update(
            final=final, state=FAILED, error=error[:MAX_ERROR_CHARS], stoppedAt=self._clock()
        )


# --- supervision --------------------------------------------------------------------------


def refuse_if_running(settings: Settings) -> None:
    """Raise when a stream may still run with this data dir: two would share one
    checkpoint and corrupt it. That is a healthy one, or a stalled one whose process
    is alive on this host; a dead, stopped or failed one may be replaced, and so may a
    stalled one on another host (its pid cannot be checked from here)."""
    health = check_health(settings)
    if health.healthy:
        raise VelocityError(
            f"a stream already runs with data dir {settings.data_dir} ({health.reason}); "
            "stop it first with `velocity stream-stop --wait 300`"
        )
    if (
        health.verdict == "stalled"
        and health.host == local_host()
        and health.pid is not None
        and process_alive(health.pid)
    ):
        raise VelocityError(
            f"the stream of data dir {settings.data_dir} is stalled but its process is alive "
            f"({health.reason}); end it with `velocity stream-stop --wait 60 --force`"
        )


def kill_stream(pid: int, wait_seconds: float = 30) -> bool:
    """SIGKILL the stream's driver process (its Spark JVM exits with it); True once gone.

    Safe for the data: every write of a micro-batch is idempotent, and the next start
    replays the batch that was in flight.
    """
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + wait_seconds
    while time.monotonic() < deadline:
        if not process_alive(pid):
            return True
        time.sleep(0.2)
    return False
