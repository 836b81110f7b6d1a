"""The stream health verdict (pure): every rule, its boundary, and odd status content."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from velocity.operating.health import LIVE_STATES, LastCommit, stream_health

NOW = 1_767_225_600_000
STALE = 120_000
HOST = "worker-1"
PID = 4242


def status_obj(**changes: Any) -> dict[str, Any]:
    """A fresh RUNNING status as `velocity stream` writes it; state only what differs."""
    status: dict[str, Any] = {
        "state": "RUNNING",
        "pid": PID,
        "host": HOST,
        "eventsDir": "/data/events",
        "queryId": "q-1",
        "runId": "r-1",
        "startedAt": NOW - 600_000,
        "updatedAt": NOW - 5_000,
        "batch": 7,
        "batchFinishedAt": NOW - 20_000,
        "batchesThisRun": 3,
        "inputRowsPerSecond": 120.5,
        "processedRowsPerSecond": 300.0,
        "numInputRows": 1500,
        "lastBatchDurationMs": 4_000,
        "backlogFiles": 0,
        "oldestBacklogAt": None,
        "error": None,
        "stopReason": None,
    }
    status.update(changes)
    return status


def alive(pid: int) -> bool:
    return True


def dead(pid: int) -> bool:
    return False


def test_no_status_file_is_not_running() -> None:
    health = stream_health(None, NOW, STALE)
    assert (health.healthy, health.verdict) == (False, "absent")
    assert "no status file" in health.reason


def test_fresh_running_stream_is_healthy_with_its_figures() -> None:
    health = stream_health(status_obj(), NOW, STALE, local_host=HOST, pid_alive=alive)
    assert (health.healthy, health.verdict, health.state) == (True, "running", "RUNNING")
    assert health.heartbeatAgeMs == 5_000
    assert health.batchAgeMs == 20_000
    assert (health.batch, health.batchesThisRun, health.numInputRows) == (7, 3, 1500)
    assert (health.inputRowsPerSecond, health.processedRowsPerSecond) == (120.5, 300.0)
    assert (health.backlogFiles, health.lagMs) == (0, 0)
    assert health.to_json()["checkedAt"] == NOW


def test_stopped_says_why_and_is_not_running() -> None:
    health = stream_health(
        status_obj(state="STOPPED", stopReason="stop requested by ops@host"), NOW, STALE
    )
    assert (health.healthy, health.verdict) == (False, "stopped")
    assert "STOPPED" in health.reason and "ops@host" in health.reason


def test_failed_carries_the_error() -> None:
    health = stream_health(status_obj(state="FAILED", error="Delta table gone"), NOW, STALE)
    assert (health.healthy, health.verdict, health.error) == (False, "failed", "Delta table gone")
    assert "Delta table gone" in health.reason


def test_heartbeat_older_than_stale_after_is_stalled_at_the_boundary() -> None:
    on_edge = stream_health(status_obj(updatedAt=NOW - STALE), NOW, STALE)
    past = stream_health(status_obj(updatedAt=NOW - STALE - 1), NOW, STALE)
    assert (on_edge.healthy, on_edge.verdict) == (True, "running")
    assert (past.healthy, past.verdict) == (False, "stalled")
    assert past.heartbeatAgeMs == STALE + 1


def test_missing_heartbeat_is_stalled() -> None:
    assert stream_health(status_obj(updatedAt=None), NOW, STALE).verdict == "stalled"


def test_sigkilled_stream_on_this_host_is_dead_even_with_a_fresh_heartbeat() -> None:
    health = stream_health(status_obj(), NOW, STALE, local_host=HOST, pid_alive=dead)
    assert (health.healthy, health.verdict) == (False, "dead")
    assert str(PID) in health.reason


def test_pid_of_another_host_is_not_checked() -> None:
    checked: list[int] = []

    def spy(pid: int) -> bool:
        checked.append(pid)
        return False

    health = stream_health(status_obj(), NOW, STALE, local_host="elsewhere", pid_alive=spy)
    assert (health.healthy, checked) == (True, [])


def test_dead_on_another_host_shows_once_the_heartbeat_is_stale() -> None:
    health = stream_health(
        status_obj(updatedAt=NOW - 10 * STALE), NOW, STALE, local_host="elsewhere", pid_alive=dead
    )
    assert (health.healthy, health.verdict) == (False, "stalled")


def test_backlog_waiting_while_no_batch_finishes_is_stalled() -> None:
    health = stream_health(
        status_obj(backlogFiles=4, oldestBacklogAt=NOW - 300_000, batchFinishedAt=NOW - 400_000),
        NOW,
        STALE,
    )
    assert (health.healthy, health.verdict) == (False, "stalled")
    assert (health.backlogFiles, health.lagMs) == (4, 300_000)
    assert "4 files waiting" in health.reason


def test_file_landing_after_a_long_idle_time_is_not_stalled() -> None:
    health = stream_health(
        status_obj(backlogFiles=1, oldestBacklogAt=NOW - 2_000, batchFinishedAt=NOW - 3_600_000),
        NOW,
        STALE,
    )
    assert (health.healthy, health.lagMs) == (True, 2_000)


def test_backlog_with_batches_still_finishing_is_behind_but_healthy() -> None:
    health = stream_health(
        status_obj(backlogFiles=50, oldestBacklogAt=NOW - 600_000, batchFinishedAt=NOW - 10_000),
        NOW,
        STALE,
    )
    assert (health.healthy, health.lagMs) == (True, 600_000)


def test_no_batch_yet_this_run_counts_from_the_start() -> None:
    waiting = {"backlogFiles": 2, "oldestBacklogAt": NOW - 900_000, "batchFinishedAt": None}
    long_ago = stream_health(status_obj(startedAt=NOW - 900_000, **waiting), NOW, STALE)
    just_now = stream_health(status_obj(startedAt=NOW - 10_000, **waiting), NOW, STALE)
    assert (long_ago.verdict, just_now.verdict) == ("stalled", "running")


def test_starting_is_healthy_until_stale() -> None:
    fresh = stream_health(status_obj(state="STARTING", updatedAt=NOW - 1_000), NOW, STALE)
    stale = stream_health(status_obj(state="STARTING", updatedAt=NOW - 3 * STALE), NOW, STALE)
    assert (fresh.healthy, fresh.verdict) == (True, "starting")
    assert (stale.healthy, stale.verdict) == (False, "stalled")


def test_unknown_state_is_not_healthy() -> None:
    health = stream_health(status_obj(state="PAUSED"), NOW, STALE)
    assert (health.healthy, health.verdict) == (False, "unknown")
    assert "PAUSED" in health.reason


json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
status_values = st.dictionaries(
    st.sampled_from([*status_obj(), "extra"]),
    json_scalars | st.sampled_from(["RUNNING", "STARTING", "STOPPED", "FAILED"]),
)


# Generation time swings on a shared, loaded machine; too_slow would make this flaky.
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(status=status_values, now=st.integers(0, 2 * NOW), stale=st.integers(1, 10 * STALE))
def test_any_status_content_gets_a_verdict_and_only_live_states_are_healthy(
    status: dict[str, Any], now: int, stale: int
) -> None:
    health = stream_health(status, now, stale, local_host=HOST, pid_alive=alive)
    assert health.reason
    if health.healthy:
        assert status.get("state") in LIVE_STATES
        assert health.heartbeatAgeMs is not None and health.heartbeatAgeMs <= stale


def test_stream_status_and_stop_import_no_spark() -> None:
    """`velocity stream-status` and `stream-stop` answer at once: their protocol module and
    the CLI import no pyspark (a fresh interpreter, so nothing else loaded it first)."""
    import subprocess
    import sys

    code = (
        "import sys, velocity.cli.main, velocity.cli.commands.stream, "
        "velocity.operating.stream_control; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyspark'))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "[]"


def test_a_running_stream_states_the_last_batches_share_of_late_and_out_of_order() -> None:
    arrivals = {"batches": 20, "accepted": 12_000, "late": 12, "outOfOrder": 150}
    health = stream_health(status_obj(recentArrivals=arrivals), NOW, STALE)
    assert health.recentArrivals == arrivals
    assert health.reason.endswith(
        "; of the last 20 batches' 12000 events 1.2% out of order, 0.1% late "
        "(`velocity backfill --late` covers both)"
    )
    # An older status file, an odd value or no events yet: no figures, no words.
    for odd in (None, {"batches": 1}, {**arrivals, "late": "12"}, {**arrivals, "accepted": 0}):
        quiet = stream_health(status_obj(recentArrivals=odd), NOW, STALE)
        assert "out of order" not in quiet.reason and quiet.healthy


KAFKA = "kafka://127.0.0.1:9392/velocity.events"


def kafka_status(**changes: Any) -> dict[str, Any]:
    """A running Kafka stream's status: no folder, so no files waiting."""
    return status_obj(source=KAFKA, eventsDir=None, backlogFiles=None, **changes)


@pytest.mark.timeout(30)
def test_a_kafka_stream_states_its_consumer_lag_not_files_waiting() -> None:
    health = stream_health(
        kafka_status(offsetsBehindLatest=12_000, maxOffsetsBehindLatest=4_000), NOW, STALE
    )
    assert (health.healthy, health.verdict) == (True, "running")
    assert (health.offsetsBehindLatest, health.maxOffsetsBehindLatest) == (12_000, 4_000)
    assert health.source == KAFKA and health.to_json()["offsetsBehindLatest"] == 12_000
    assert health.reason.endswith(
        "12000 messages behind the topic's latest offsets, at most 4000 in one partition"
    )
    assert "files waiting" not in health.reason
    caught_up = stream_health(
        kafka_status(offsetsBehindLatest=0, maxOffsetsBehindLatest=0), NOW, STALE
    )
    assert caught_up.reason.endswith(", 0 messages behind the topic's latest offsets")
    # Before its first batch or idle trigger the lag is not known; never "? files".
    unknown = stream_health(kafka_status(), NOW, STALE)
    assert unknown.offsetsBehindLatest is None
    assert unknown.reason.endswith("lag not known yet (no batch or idle trigger since the start)")
    # A folder's stream still counts files (and an older status file without a source).
    assert stream_health(status_obj(backlogFiles=2), NOW, STALE).reason.endswith("2 files waiting")
    assert stream_health(status_obj(backlogFiles=None), NOW, STALE).reason.endswith(
        "? files waiting"
    )


# --- what the checkpoint says of earlier runs (issue 51: "absent" while a stream started) ---

EARLIER = LastCommit(batch=41, at=NOW - 3_600_000)  # 2025-12-31T23:00:00.000Z


def test_no_status_file_and_nothing_committed_never_ran_and_names_the_data_dir() -> None:
    health = stream_health(None, NOW, STALE, data_dir="/srv/velocity")
    assert (health.healthy, health.verdict) == (False, "absent")
    assert "never ran with data dir /srv/velocity" in health.reason
    assert (health.lastCommittedBatch, health.lastCommittedAt) == (None, None)


def test_no_status_file_beside_a_checkpoint_says_a_stream_ran_there_and_when() -> None:
    health = stream_health(None, NOW, STALE, last_commit=EARLIER, data_dir="/srv/velocity")
    assert (health.healthy, health.verdict) == (False, "absent")
    assert "never ran" not in health.reason and "not running" not in health.reason
    assert "last committed batch 41 at 2025-12-31T23:00:00.000Z" in health.reason
    assert "may run now" not in health.reason
    assert (health.lastCommittedBatch, health.lastCommittedAt) == (41, EARLIER.at)
    # A commit younger than the staleness: a stream without a status file may run now.
    recent = stream_health(None, NOW, STALE, last_commit=LastCommit(7, NOW - 3_000))
    assert "it committed 3 s ago, so it may run now" in recent.reason


def test_a_stream_starting_where_one_ran_before_is_starting_and_says_what_ran() -> None:
    status = status_obj(
        state="STARTING", startedAt=NOW - 20_000, updatedAt=NOW - 1_000, batch=None,
        batchFinishedAt=None, batchesThisRun=0,
    )  # fmt: skip
    health = stream_health(status, NOW, STALE, local_host=HOST, pid_alive=alive,
                           last_commit=EARLIER)  # fmt: skip
    assert (health.healthy, health.verdict) == (True, "starting")
    assert f"pid {PID} on {HOST} since 2025-12-31T23:59:40.000Z" in health.reason
    assert "no batch yet this run" in health.reason
    assert "last committed batch 41 at 2025-12-31T23:00:00.000Z, before this run" in health.reason
    first = stream_health(status, NOW, STALE)
    assert "no batch committed in its checkpoint yet" in first.reason
    # Its query runs, no batch with data yet: the same history.
    running = stream_health({**status, "state": "RUNNING"}, NOW, STALE, last_commit=EARLIER)
    assert (running.verdict, running.lastCommittedBatch) == ("running", 41)
    assert "no batch with data yet (last committed batch 41 at" in running.reason


def test_a_start_with_no_heartbeat_for_longer_than_stale_is_stalled_and_says_so() -> None:
    status = status_obj(state="STARTING", updatedAt=NOW - 3 * STALE)
    health = stream_health(status, NOW, STALE)
    assert health.verdict == "stalled" and "no heartbeat while starting for 360 s" in health.reason


def test_stopped_and_failed_say_when_and_the_last_committed_batch() -> None:
    stopped = stream_health(
        status_obj(state="STOPPED", stopReason="the demo ended", stoppedAt=NOW - 60_000),
        NOW,
        STALE,
        last_commit=LastCommit(1469, NOW - 61_000),
    )
    assert stopped.verdict == "stopped"
    assert stopped.reason == (
        "not running: STOPPED at 2025-12-31T23:59:00.000Z (the demo ended); "
        "last committed batch 1469 at 2025-12-31T23:58:59.000Z"
    )
    failed = stream_health(
        status_obj(state="FAILED", error="Delta table gone"), NOW, STALE, last_commit=EARLIER
    )
    assert "Delta table gone; last committed batch 41 at" in failed.reason
    # A hand-edited time past any calendar is shown as it is, never raised on.
    odd = stream_health(status_obj(state="STOPPED", stoppedAt=10**20), NOW, STALE)
    assert f"at {10**20} (epoch ms)" in odd.reason
