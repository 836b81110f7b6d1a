"""The streaming job's health, judged from its status file (pure: no Spark, Redis or Airflow).

``velocity stream`` keeps ``<data_dir>/status/stream.json`` current (see
``velocity.operating.stream_control``); this module turns one reading of it into a verdict.
The clock and the process check are parameters, so every rule is testable.

Verdicts, in the order they are decided:

- ``absent``   no status file. The checkpoint tells the rest: nothing committed, the
               stream never ran with this data dir; else a stream ran here (its last
               committed batch and when are stated) that keeps no status file (a program
               running ``StreamJob`` itself, as benchmarks do), or the file was deleted;
- ``stopped``  the stream ended cleanly (stop request, --duration, available-now);
- ``failed``   the query ended with an error (the status carries it);
- ``dead``     STARTING/RUNNING, but its process is gone (only checkable on its host);
- ``stalled``  STARTING/RUNNING with a heartbeat older than ``stale_after_ms``, or files
               waiting longer than ``stale_after_ms`` while no batch finished for as long;
- ``starting`` / ``running``: healthy.

Only ``starting`` and ``running`` are healthy. A scheduler restarts on ``dead``,
``stalled`` and ``failed``; ``stopped`` was asked for, so whether to restart it is policy.

Every reason that is not about a live run's batches states what the checkpoint holds (the
last committed batch and when, from any run; ``LastCommit``), so a stream starting on a data
dir that ran before reads "starting …, no batch yet this run; last committed batch 41 at
2026-11-28T10:15:02.123Z, before this run", and one that never ran says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from velocity.domain.times import iso_utc

STARTING, RUNNING, STOPPED, FAILED = "STARTING", "RUNNING", "STOPPED", "FAILED"
STATES = (STARTING, RUNNING, STOPPED, FAILED)
LIVE_STATES = (STARTING, RUNNING)
# What refreshes the heartbeat of a live stream: while it starts, its own beat (no query
# yet, so no listener event); once its query runs, every progress or idle event.
_BEAT = {STARTING: "heartbeat while starting", RUNNING: "progress event"}


@dataclass(frozen=True)
class LastCommit:
    """The newest micro-batch the stream's checkpoint holds as committed, of any run: its
    id and when its commit was written (epoch ms)."""

    batch: int
    at: int


@dataclass(frozen=True)
class Health:
    """One verdict plus the figures it was drawn from (ms; None where unknown).

    Field names are camelCase: they are the JSON that `velocity stream-status` prints.
    """

    healthy: bool
    verdict: str
    reason: str
    state: str | None = None
    checkedAt: int | None = None
    heartbeatAgeMs: int | None = None
    batch: int | None = None
    batchesThisRun: int | None = None
    batchAgeMs: int | None = None
    numInputRows: int | None = None
    inputRowsPerSecond: float | None = None
    processedRowsPerSecond: float | None = None
    lastBatchDurationMs: int | None = None
    backlogFiles: int | None = None
    lagMs: int | None = None
    # A topic's consumer lag after the last batch (or idle trigger): messages past its end
    # offsets over all partitions, and the most in one partition. None for a folder.
    offsetsBehindLatest: int | None = None
    maxOffsetsBehindLatest: int | None = None
    source: str | None = None
    pid: int | None = None
    host: str | None = None
    queryId: str | None = None
    runId: str | None = None
    error: str | None = None
    # The last batches' accepted events, and how many were late or out of order.
    recentArrivals: dict[str, int] | None = None
    # The checkpoint's newest committed batch, of any run, and when it committed.
    lastCommittedBatch: int | None = None
    lastCommittedAt: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _float(status: Mapping[str, Any], name: str) -> float | None:
    """A finite number from the status, else None (a hand-edited file may hold anything)."""
    value = status.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _int(status: Mapping[str, Any], name: str) -> int | None:
    value = status.get(name)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    number = _float(status, name)
    return None if number is None else int(number)


def _age(now_ms: int, then: int | None) -> int | None:
    return None if then is None else max(0, now_ms - then)


def _seconds(ms: int | None) -> str:
    return "?" if ms is None else f"{ms / 1000:.0f} s"


def _when(ms: int) -> str:
    """``ms`` as ISO-8601 UTC; a hand-edited file's time out of any calendar as itself."""
    try:
        return iso_utc(ms)
    except (OverflowError, ValueError, OSError):
        return f"{ms} (epoch ms)"


def _committed(last: LastCommit | None, started: int | None = None) -> str:
    """``last committed batch 41 at 2026-11-28T10:15:02.123Z[, before this run]``."""
    if last is None:
        return "no batch committed in its checkpoint yet"
    before = ", before this run" if started is not None and last.at < started else ""
    return f"last committed batch {last.batch} at {_when(last.at)}{before}"


def stream_health(
    status: Mapping[str, Any] | None,
    now_ms: int,
    stale_after_ms: int,
    *,
    local_host: str | None = None,
    pid_alive: Callable[[int], bool] | None = None,
    last_commit: LastCommit | None = None,
    data_dir: object = None,
) -> Health:
    """The verdict on one reading of the status file at ``now_ms``.

    ``local_host`` and ``pid_alive`` let a checker on the stream's own host call a
    SIGKILLed stream dead at once (its file still says RUNNING); without them, or on
    another host, a dead stream shows as ``stalled`` once its heartbeat is
    ``stale_after_ms`` old. ``last_commit``: what the checkpoint holds (None: nothing
    committed); ``data_dir``, named in the reasons. Never raises on odd content: a missing
    figure is None.
    """
    here = "" if data_dir is None else f" with data dir {data_dir}"
    committed: dict[str, Any] = {
        "lastCommittedBatch": None if last_commit is None else last_commit.batch,
        "lastCommittedAt": None if last_commit is None else last_commit.at,
    }
    if status is None:
        if last_commit is None:
            reason = (
                f"not running: the stream never ran{here} (no status file, nothing committed "
                "in its checkpoint); `velocity stream --events DIR` (or --source kafka) "
                "starts it"
            )
        else:
            age = now_ms - last_commit.at
            recent = (
                f"; it committed {_seconds(age)} ago, so it may run now"
                if age <= stale_after_ms
                else ""
            )
            reason = (
                f"no status file{here}, but its checkpoint shows a stream ran here "
                f"({_committed(last_commit)}): one run other than by `velocity stream` (a "
                "program running StreamJob itself, as benchmarks do), which keeps no status "
                f"file, or the file was deleted; whether one runs now cannot be told{recent}"
            )
        return Health(healthy=False, verdict="absent", reason=reason, checkedAt=now_ms, **committed)
    state = status.get("state")
    updated = _int(status, "updatedAt")
    finished = _int(status, "batchFinishedAt")
    started = _int(status, "startedAt")
    backlog = _int(status, "backlogFiles")
    oldest_waiting = _int(status, "oldestBacklogAt")
    pid = _int(status, "pid")
    host = status.get("host") if isinstance(status.get("host"), str) else None
    error = status.get("error") if isinstance(status.get("error"), str) else None
    lag = _age(now_ms, oldest_waiting) if backlog else (0 if backlog == 0 else None)
    heartbeat_age = _age(now_ms, updated)
    batch_age = _age(now_ms, finished)
    figures: dict[str, Any] = {
        "state": state if isinstance(state, str) else None,
        "checkedAt": now_ms,
        "heartbeatAgeMs": heartbeat_age,
        "batch": _int(status, "batch"),
        "batchesThisRun": _int(status, "batchesThisRun"),
        "batchAgeMs": batch_age,
        "numInputRows": _int(status, "numInputRows"),
        "inputRowsPerSecond": _float(status, "inputRowsPerSecond"),
        "processedRowsPerSecond": _float(status, "processedRowsPerSecond"),
        "lastBatchDurationMs": _int(status, "lastBatchDurationMs"),
        "backlogFiles": backlog,
        "lagMs": lag,
        "offsetsBehindLatest": _int(status, "offsetsBehindLatest"),
        "maxOffsetsBehindLatest": _int(status, "maxOffsetsBehindLatest"),
        "source": status.get("source") if isinstance(status.get("source"), str) else None,
        "pid": pid,
        "host": host,
        "queryId": status.get("queryId") if isinstance(status.get("queryId"), str) else None,
        "runId": status.get("runId") if isinstance(status.get("runId"), str) else None,
        "error": error,
        "recentArrivals": _arrivals(status),
        **committed,
    }

    def verdict(healthy: bool, name: str, reason: str) -> Health:
        return Health(healthy=healthy, verdict=name, reason=reason, **figures)

    stopped_at = _int(status, "stoppedAt")
    ended = "" if stopped_at is None else f" at {_when(stopped_at)}"
    if state == STOPPED:
        why = status.get("stopReason") or "stopped"
        suffix = f"; error: {error}" if error else ""
        return verdict(
            False,
            "stopped",
            f"not running: STOPPED{ended} ({why}){suffix}; {_committed(last_commit)}",
        )
    if state == FAILED:
        return verdict(
            False,
            "failed",
            f"not running: FAILED{ended}: {error or 'no error recorded'}; "
            f"{_committed(last_commit)}; `velocity stream` restarts it from its checkpoint",
        )
    if state not in LIVE_STATES:
        return verdict(
            False, "unknown", f"status file has state {state!r}, not one of {list(STATES)}"
        )
    where = f"pid {pid} on {host}"
    if (
        pid is not None
        and pid_alive is not None
        and local_host is not None
        and host == local_host
        and not pid_alive(pid)
    ):
        return verdict(
            False,
            "dead",
            f"dead: status says {state} but {where} is gone (killed?); "
            f"{_committed(last_commit)}; `velocity stream` restarts it from its checkpoint",
        )
    if heartbeat_age is None or heartbeat_age > stale_after_ms:
        return verdict(
            False,
            "stalled",
            f"stalled or dead: {state} with no {_BEAT[state]} for {_seconds(heartbeat_age)} "
            f"(stale after {_seconds(stale_after_ms)}); {where}",
        )
    since_batch = batch_age if batch_age is not None else _age(now_ms, started)
    if (
        backlog
        and lag is not None
        and lag > stale_after_ms
        and since_batch is not None
        and since_batch > stale_after_ms
    ):
        return verdict(
            False,
            "stalled",
            f"stalled: {backlog} files waiting, the oldest for {_seconds(lag)}, and no batch "
            f"finished for {_seconds(since_batch)} (stale after {_seconds(stale_after_ms)})",
        )
    if state == STARTING:
        since = "" if started is None else f" since {_when(started)}"
        return verdict(
            True,
            "starting",
            f"starting: {where}{since} (Spark, the Delta tables, the rules), no batch yet "
            f"this run; {_committed(last_commit, started)}",
        )
    batches = figures["batchesThisRun"] or 0
    last = (
        f"last batch {figures['batch']} {_seconds(batch_age)} ago"
        if batch_age is not None
        else f"no batch with data yet ({_committed(last_commit, started)})"
    )
    return verdict(
        True,
        "running",
        f"running: {batches} batches with data this run, {last}, {_waiting_text(figures)}"
        f"{_arrivals_text(figures['recentArrivals'])}",
    )


def _waiting_text(figures: Mapping[str, Any]) -> str:
    """What the source holds that no batch has read: a folder's files waiting, or a
    topic's consumer lag (``12000 messages behind the topic's latest offsets, at most 4000
    in one partition``)."""
    if figures["backlogFiles"] is not None:
        return f"{figures['backlogFiles']} files waiting"
    behind = figures["offsetsBehindLatest"]
    if behind is not None:
        most = figures["maxOffsetsBehindLatest"]
        spread = f", at most {most} in one partition" if behind and most is not None else ""
        return f"{behind} messages behind the topic's latest offsets{spread}"
    if str(figures["source"] or "").startswith("kafka://"):
        return "lag not known yet (no batch or idle trigger since the start)"
    return "? files waiting"


def _arrivals(status: Mapping[str, Any]) -> dict[str, int] | None:
    """The status file's ``recentArrivals`` (the last batches' events, late and out of
    order), None when absent or odd."""
    value = status.get("recentArrivals")
    names = ("batches", "accepted", "late", "outOfOrder")
    if not isinstance(value, Mapping) or not all(isinstance(value.get(n), int) for n in names):
        return None
    return {n: int(value[n]) for n in names}


def _arrivals_text(arrivals: Mapping[str, int] | None) -> str:
    """``; of the last 20 batches' 12000 events 1.2% out of order, 0.1% late``."""
    if not arrivals or not arrivals["accepted"]:
        return ""
    accepted = arrivals["accepted"]

    def share(n: int) -> str:
        return f"{100 * n / accepted:.1f}%"

    return (
        f"; of the last {arrivals['batches']} batches' {accepted} events "
        f"{share(arrivals['outOfOrder'])} out of order, {share(arrivals['late'])} late "
        "(`velocity backfill --late` covers both)"
    )
