"""Stream lifecycle through the real CLI: status file, stream-status, stream-stop, SIGKILL, resume.

One test runs `velocity stream` twice as a subprocess (real Spark, Delta, redis-server):
healthy with batches advancing and an idle heartbeat, SIGKILL -> dead, a stale stop
request that must not stop the next start, restart -> healthy and resumed from the
checkpoint (every event once), its metrics scraped and parsed as Prometheus does and held
to what it was given, stream-stop -> exit 0 and STOPPED. The others need no Spark.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from tests.builders import event_line, rule_obj, rules_text
from tests.conftest import FAST_JVM, free_metrics_port, poll_until
from velocity.delta import tables
from velocity.delta.live import LiveTables
from velocity.generate import DEFAULT_START_MS, GenerateOptions, generate_events
from velocity.operating import stream_control
from velocity.operating.health import LastCommit
from velocity.settings import Settings

VELOCITY = str(Path(sys.executable).parent / "velocity")
EVENTS_PER_FILE = 50
FIRST_WAVE, SECOND_WAVE = 1, 2


def cli(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [VELOCITY, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def health_of(env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    done = cli(env, "stream-status")
    return done.returncode, json.loads(done.stdout)


def wait_for(
    what: str, condition: Callable[[], Any], timeout: float, process: subprocess.Popen[str]
) -> Any:
    """Poll ``condition`` until truthy; fail naming ``what`` (and the stream's log)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if process.poll() is not None:
            pytest.fail(f"stream exited ({process.returncode}) while waiting for {what}")
        time.sleep(0.5)
    pytest.fail(f"no {what} within {timeout} s")


def land(source: Path, events: Path) -> None:
    """Land a file the way writers should: under a hidden name, then renamed, newer mtime."""
    hidden = events / f".{source.name}"
    shutil.copy(source, hidden)
    stamp = time.time()
    os.utime(hidden, (stamp, stamp))
    hidden.rename(events / source.name)
    time.sleep(0.01)  # distinct mtimes keep the landing order


def add_lines_the_metrics_tell_apart(path: Path, earlier: Path) -> None:
    """Append to ``path`` (landed as one micro-batch) two malformed lines, a duplicate of an
    event of the ``earlier`` file (accepted by another run) and one of its own first
    event, and a late event (ten minutes before the first generated one)."""
    own_first = path.read_text().splitlines()[0]
    earlier_first = earlier.read_text().splitlines()[0]
    more = [
        "not json",
        event_line(paymentType="WIRE"),
        earlier_first,
        own_first,
        event_line(transactionId="late-1", eventTime=DEFAULT_START_MS - 600_000),
    ]
    with path.open("a") as out:
        out.write("".join(line + "\n" for line in more))


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The stream's metrics as Prometheus reads them: by (sample name, sorted labels)."""
    answer = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    answer.raise_for_status()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


@contextmanager
def stream_process(env: dict[str, str], events: Path, log: Path) -> Iterator[subprocess.Popen[str]]:
    with log.open("w") as out:
        process = subprocess.Popen(
            [VELOCITY, "stream", "--events", str(events), "--max-files-per-trigger", "1"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            yield process
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)


@pytest.mark.spark
@pytest.mark.redis
def test_status_stop_kill_and_resume_through_the_cli(
    request: pytest.FixtureRequest, data_settings: Settings, tmp_path: Path
) -> None:
    held = tmp_path / "held"
    generate_events(
        held,
        GenerateOptions(
            events=EVENTS_PER_FILE * (FIRST_WAVE + SECOND_WAVE),
            rate=5.0,
            payers=10,
            files=FIRST_WAVE + SECOND_WAVE,
            late_fraction=0.0,
            duplicate_fraction=0.0,
            malformed_fraction=0.0,
            seed=11,
        ),
    )
    files = sorted(held.glob("*.jsonl"))
    add_lines_the_metrics_tell_apart(files[-1], files[0])
    events = tmp_path / "events"
    events.mkdir()
    for source in files[:FIRST_WAVE]:
        land(source, events)
    data_dir = data_settings.data_dir
    env = {
        **os.environ,
        **FAST_JVM,
        "VELOCITY_DATA_DIR": str(data_dir),
        "VELOCITY_REDIS_URL": data_settings.redis_url,
        "VELOCITY_SPARK_MASTER": "local[2]",
        "VELOCITY_SPARK_SHUFFLE_PARTITIONS": "2",
        "VELOCITY_STREAM_HEARTBEAT_SECONDS": "2",
        "VELOCITY_METRICS_PORT": str(metrics_port := free_metrics_port()),
    }

    def status() -> dict[str, Any]:
        return stream_control.read_status(data_dir) or {}

    # --- first run: healthy, batches advance, an idle stream keeps its heartbeat --------
    with stream_process(env, events, tmp_path / "run1.log") as first:
        wait_for("first batch", lambda: status().get("batch") is not None, 300, first)
        code, health = health_of(env)
        assert (code, health["verdict"], health["state"]) == (0, "running", "RUNNING"), health
        assert health["pid"] == first.pid and health["batchesThisRun"] >= 1
        # One file a batch; the next batch may already have picked its file.
        assert 0 <= health["backlogFiles"] <= FIRST_WAVE - 1 - health["batch"], health
        wait_for("first wave", lambda: status().get("backlogFiles") == 0, 180, first)
        before = status()
        land(files[FIRST_WAVE], events)
        wait_for("next batch", lambda: status().get("batch", -1) > before["batch"], 180, first)
        code, health = health_of(env)
        assert code == 0 and health["batchesThisRun"] > before["batchesThisRun"], health
        idle = wait_for("idle", lambda: status().get("backlogFiles") == 0 and status(), 60, first)

        def heartbeat_without_batch() -> bool:
            now = status()
            return bool(now["updatedAt"] > idle["updatedAt"] and now["batch"] == idle["batch"])

        wait_for("idle heartbeat", heartbeat_without_batch, 30, first)

        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    code, health = health_of(env)
    assert (code, health["verdict"], health["state"]) == (1, "dead", "RUNNING"), health

    # Nothing runs: stream-stop says so and leaves no request behind.
    stop = cli(env, "stream-stop")
    assert stop.returncode == 0 and "no stream is running" in stop.stdout, stop
    assert not stream_control.stop_request_path(data_dir).exists()

    # A request left from before the next start must not stop it.
    stale_request = {"requestedAt": stream_control.now_ms() - 3_600_000, "requestedBy": "yesterday"}
    stream_control.write_json_atomically(stream_control.stop_request_path(data_dir), stale_request)
    for source in files[FIRST_WAVE + 1 :]:
        land(source, events)
    # Rules from the second run on: every alert on the Redis stream is that run's.
    rules = tmp_path / "rules.json"
    count = {"groupingKeyNames": ["payerId"], "aggregatorFunctionType": "COUNT", "limit": 1}
    rules.write_text(
        rules_text(
            [
                rule_obj(ruleId=1, limitOperatorType=">=", windowMinutes=60, **count),
                rule_obj(ruleId=2, limitOperatorType=">=", windowMinutes=60,
                         filter={"paymentType": "CRD"}, **count),
            ]
        )
    )  # fmt: skip
    applied = cli(env, "rules", "apply", str(rules))
    assert applied.returncode == 0, applied

    # --- second run: resumes from the checkpoint, then stops on request ---------------------
    committed = stream_control.last_commit(stream_control.checkpoint_dir(data_dir))
    assert committed is not None
    with stream_process(env, events, tmp_path / "run2.log") as second:
        # While Spark starts: "starting" on a data dir that ran before, and what it ran.
        wait_for("second run's start", lambda: status().get("pid") == second.pid, 120, second)
        code, health = health_of(env)
        assert (code, health["verdict"], health["state"]) == (0, "starting", "STARTING"), health
        assert f"last committed batch {committed.batch} at " in health["reason"], health
        assert "before this run" in health["reason"] and "no batch yet" in health["reason"]
        wait_for(
            "second run's status",
            lambda: status().get("pid") == second.pid and status().get("state") == "RUNNING",
            300,
            second,
        )
        assert not stream_control.stop_request_path(data_dir).exists()
        wait_for(
            "the rest",
            lambda: status().get("backlogFiles") == 0 and status().get("batchesThisRun", 0) >= 1,
            240,
            second,
        )
        code, health = health_of(env)
        assert (code, health["verdict"]) == (0, "running"), health
        assert second.poll() is None

        # Its metrics: the last file, 50 generated events and the five lines added to them.
        metrics = scrape(metrics_port)

        def metric(name: str, **labels: str) -> float | None:
            return metrics.get((name, tuple(sorted(labels.items()))))

        assert metric("velocity_events_read_total") == EVENTS_PER_FILE + 5
        assert metric("velocity_events_accepted_total") == EVENTS_PER_FILE + 1
        assert metric("velocity_events_duplicate_total") == 2
        assert metric("velocity_events_late_total", reason="late") == 1
        assert metric("velocity_events_late_total", reason="out_of_order") == 0
        quarantined = {
            labels: n
            for (name, labels), n in metrics.items()
            if name == "velocity_events_quarantined_total" and n
        }
        assert quarantined == {(("reason", "not_json"),): 1, (("reason", "unknown_enum"),): 1}
        published = Counter(
            (str(alert["ruleId"]), alert["kind"])
            for _, fields in redis.Redis.from_url(data_settings.redis_url).xrange(
                data_settings.alert_stream
            )
            for alert in [json.loads(fields[b"alert"])]
        )
        scraped = {
            (dict(labels)["rule_id"], dict(labels)["kind"]): n
            for (name, labels), n in metrics.items()
            if name == "velocity_alerts_total" and dict(labels)["suppressed"] == "false"
        }
        assert scraped == published and set(published) == {("1", "ALERT"), ("2", "ALERT")}
        assert metric("velocity_batch_duration_seconds_count") == health["batchesThisRun"]
        assert metric("velocity_redis_commit_seconds_count") == health["batchesThisRun"]
        assert metric("velocity_committed_batch_id") == health["batch"]
        assert metric("velocity_backlog_files") == 0
        assert 0 <= (metric("velocity_write_behind_delay_seconds") or -1) < 120
        heartbeat = metric("velocity_heartbeat_timestamp_seconds") or 0
        assert abs(heartbeat - time.time()) < 60
        info = {"source": str(events), "data_dir": str(data_dir)}
        assert metric("velocity_stream_info", **info) == 1

        asked = time.monotonic()
        stop = cli(env, "stream-stop", "--reason", "test", "--wait", "120", timeout=150)
        assert stop.returncode == 0, stop
        # Stopped means the process has exited (its last Delta appends done), not only
        # that its status says STOPPED.
        assert second.poll() == 0, "stream-stop said stopped while the stream's process ran"
        assert time.monotonic() - asked < 120
    # Its closing line counts what its metrics counted: its batches and lines this run.
    closing = (
        f": {health['batchesThisRun']} micro-batch{'es' if health['batchesThisRun'] > 1 else ''}"
        f" this run (the last is batch {health['batch']}), {EVENTS_PER_FILE + 5} lines read\n"
    )
    assert closing in (tmp_path / "run2.log").read_text(), closing
    final = status()
    assert final["state"] == "STOPPED" and "stop requested" in final["stopReason"], final
    assert final["stopRequest"]["reason"] == "test"
    assert not stream_control.stop_request_path(data_dir).exists()
    code, health = health_of(env)
    assert (code, health["verdict"]) == (1, "stopped"), health
    assert health["lastCommittedBatch"] >= final["batch"] > committed.batch, health
    assert f"; last committed batch {health['lastCommittedBatch']} at " in health["reason"]

    # Every event counted once across the kill and the restart.
    spark = request.getfixturevalue("spark")
    stored = tables.read_table(spark, LiveTables.of(data_settings).events)
    total = EVENTS_PER_FILE * len(files) + 1  # and the late event
    assert stored.count() == total
    assert stored.select("transactionId").distinct().count() == total


def test_stream_status_without_a_status_file_is_not_running(tmp_path: Path) -> None:
    env = {**os.environ, "VELOCITY_DATA_DIR": str(tmp_path / "data")}
    code, health = health_of(env)
    assert (code, health["verdict"], health["healthy"]) == (1, "absent", False)
    assert f"never ran with data dir {tmp_path / 'data'}" in health["reason"], health


def commit_log(data_dir: Path, batches: range, at_s: float) -> None:
    """Spark's commit log in the stream's checkpoint: ``commits/<batch>`` and its .crc."""
    log_dir = stream_control.checkpoint_dir(data_dir) / "commits"
    log_dir.mkdir(parents=True)
    for batch in batches:
        (log_dir / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
        (log_dir / f".{batch}.crc").write_bytes(b"crc")
        os.utime(log_dir / str(batch), (at_s + batch, at_s + batch))


@pytest.mark.timeout(60)
def test_last_commit_is_the_newest_batch_of_the_checkpoint_s_commit_log(tmp_path: Path) -> None:
    assert stream_control.last_commit(tmp_path / "none") is None
    (tmp_path / "empty" / "commits").mkdir(parents=True)
    assert stream_control.last_commit(tmp_path / "empty") is None
    commit_log(tmp_path, range(8, 12), 1_767_225_000.0)
    checkpoint = stream_control.checkpoint_dir(tmp_path)
    assert stream_control.last_commit(checkpoint) == LastCommit(11, 1_767_225_011_000)


@pytest.mark.timeout(60)
def test_stream_status_with_a_checkpoint_and_no_status_file_says_a_stream_ran_there(
    tmp_path: Path,
) -> None:
    """A data dir a stream ran in without `velocity stream` (a benchmark running StreamJob)
    or whose status file was deleted: not "never ran"; its last batch and when."""
    data_dir = tmp_path / "data"
    commit_log(data_dir, range(3), 1_767_225_600.0)
    code, health = health_of({**os.environ, "VELOCITY_DATA_DIR": str(data_dir)})
    assert (code, health["verdict"], health["lastCommittedBatch"]) == (1, "absent", 2), health
    assert "never ran" not in health["reason"]
    assert f"no status file with data dir {data_dir}" in health["reason"]
    assert "last committed batch 2 at 2026-01-01T00:00:02.000Z" in health["reason"]


@pytest.mark.timeout(60)
def test_a_start_keeps_its_heartbeat_until_its_query_runs(tmp_path: Path) -> None:
    """Spark's start can outlast the staleness on a busy machine; no listener event comes
    before the query starts, so the start beats by itself: starting, never stalled."""
    status = stream_control.StreamStatus(tmp_path, tmp_path / "events", stream_control.now_ms())
    status.starting()
    first = stream_control.read_status(tmp_path)
    assert first is not None and first["state"] == "STARTING"
    beat = status.beat_while_starting(0.05)
    poll_until(
        "a heartbeat while starting",
        lambda: (stream_control.read_status(tmp_path) or {})["updatedAt"] > first["updatedAt"],
        10,
    )
    status.running("q-1", "r-1")
    beat.join(timeout=10)
    assert not beat.is_alive()
    assert (stream_control.read_status(tmp_path) or {})["state"] == "RUNNING"


def test_stream_stop_with_no_stream_exits_0_and_writes_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    stream_control.write_json_atomically(
        stream_control.status_path(data_dir),
        {"state": "STOPPED", "stopReason": "done", "updatedAt": stream_control.now_ms()},
    )
    stop = cli({**os.environ, "VELOCITY_DATA_DIR": str(data_dir)}, "stream-stop")
    assert stop.returncode == 0 and "no stream is running" in stop.stdout, stop
    assert not stream_control.stop_request_path(data_dir).exists()


def test_only_a_stop_request_older_than_the_start_is_cleared(tmp_path: Path) -> None:
    stream_control.request_stop(tmp_path, "old")
    started = stream_control.now_ms() + 1
    cleared = stream_control.clear_stale_stop_request(tmp_path, started)
    assert cleared is not None and cleared["reason"] == "old"
    assert stream_control.read_stop_request(tmp_path) is None

    fresh = stream_control.request_stop(tmp_path, "new")
    assert stream_control.clear_stale_stop_request(tmp_path, fresh["requestedAt"]) is None
    kept = stream_control.read_stop_request(tmp_path)
    assert kept is not None and kept["reason"] == "new"


def test_newest_processed_mtime_reads_the_newest_source_log(tmp_path: Path) -> None:
    log_dir = tmp_path / "sources" / "0"
    log_dir.mkdir(parents=True)

    def entry(stamp: int, batch: int) -> str:
        return json.dumps({"path": f"file:///e/{stamp}", "timestamp": stamp, "batchId": batch})

    (log_dir / "8").write_text("v1\n" + entry(800, 8) + "\n")
    (log_dir / "9.compact").write_text("v1\n" + "\n".join(entry(s, 9) for s in (5, 900, 7)))
    (log_dir / "10").write_text("v1\n" + entry(1000, 10) + "\n" + entry(1001, 10) + "\n")
    assert stream_control.newest_processed_mtime(tmp_path) == 1001
    (log_dir / "10").unlink()
    assert stream_control.newest_processed_mtime(tmp_path) == 900
    assert stream_control.newest_processed_mtime(tmp_path / "none") is None


def test_backlog_counts_visible_files_newer_than_the_newest_processed(tmp_path: Path) -> None:
    for name, stamp in (("a.jsonl", 100), ("b.jsonl", 200), ("c.jsonl", 300), (".d", 400)):
        (tmp_path / name).write_text("{}\n")
        os.utime(tmp_path / name, (stamp, stamp))
    (tmp_path / "_e").write_text("{}\n")
    assert stream_control.backlog(tmp_path, 100_000) == (2, 200_000)
    assert stream_control.backlog(tmp_path, None) == (3, 100_000)
    assert stream_control.backlog(tmp_path, 300_000) == (0, None)


@contextmanager
def fake_stream(data_dir: Path, heartbeat_age_ms: int) -> Iterator[subprocess.Popen[bytes]]:
    """A live process the status file names as the stream, heartbeat ``heartbeat_age_ms`` old."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    now = stream_control.now_ms()
    stream_control.write_json_atomically(
        stream_control.status_path(data_dir),
        {
            "state": "RUNNING",
            "pid": process.pid,
            "host": stream_control.local_host(),
            "startedAt": now - heartbeat_age_ms,
            "updatedAt": now - heartbeat_age_ms,
            "backlogFiles": 0,
        },
    )
    try:
        yield process
    finally:
        process.kill()
        process.wait(timeout=10)


@pytest.mark.parametrize("heartbeat_age_ms", [0, 3_600_000], ids=["healthy", "stalled"])
def test_a_second_stream_refuses_while_the_first_process_lives(
    tmp_path: Path, heartbeat_age_ms: int
) -> None:
    data_dir = tmp_path / "data"
    env = {**os.environ, "VELOCITY_DATA_DIR": str(data_dir)}
    with fake_stream(data_dir, heartbeat_age_ms) as process:
        started = cli(env, "stream", "--events", str(tmp_path))
        assert started.returncode == 1, started
        assert f"data dir {data_dir}" in started.stderr and "stream-stop" in started.stderr
        assert stream_control.read_status(data_dir)["pid"] == process.pid  # untouched


def test_stream_stop_force_kills_a_stream_that_ignores_the_request(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    env = {**os.environ, "VELOCITY_DATA_DIR": str(data_dir)}
    with fake_stream(data_dir, 0) as process:
        polite = cli(env, "stream-stop", "--wait", "1")
        assert polite.returncode == 1 and "--force" in polite.stderr, polite
        forced = cli(env, "stream-stop", "--wait", "1", "--force")
        assert forced.returncode == 0 and "killed" in forced.stdout, forced
        assert process.wait(timeout=10) == -signal.SIGKILL
    code, health = health_of(env)
    assert (code, health["verdict"]) == (1, "dead"), health


# A stream's last steps as `velocity stream` takes them: STOPPED once its query has stopped
# (the request removed), then the last batches appended to Delta (here: a sleep), then exit.
LINGERING_STREAM = """
import sys, time
from pathlib import Path
from velocity.operating import stream_control

data_dir, linger = Path(sys.argv[1]), float(sys.argv[2])
status = stream_control.StreamStatus(data_dir, data_dir / "events", stream_control.now_ms())
status.starting()
status.running("q-1", "r-1")
while (request := stream_control.read_stop_request(data_dir)) is None:
    time.sleep(0.05)
stream_control.remove_stop_request(data_dir)
status.stopped("stop requested", request, final=True)
time.sleep(linger)
"""


@contextmanager
def lingering_stream(data_dir: Path, linger_seconds: float) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(
        [sys.executable, "-c", LINGERING_STREAM, str(data_dir), str(linger_seconds)]
    )
    try:
        poll_until(
            "the stream's RUNNING status",
            lambda: (stream_control.read_status(data_dir) or {}).get("state") == "RUNNING",
            30,
        )
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


@pytest.mark.timeout(120)
def test_stream_stop_wait_says_stopped_only_once_the_process_has_exited(tmp_path: Path) -> None:
    """It once printed "stopped" when the status said STOPPED, up to 5 s before the
    stream's process (appending its last batches to Delta) exited."""
    data_dir = tmp_path / "data"
    env = {**os.environ, "VELOCITY_DATA_DIR": str(data_dir)}
    with lingering_stream(data_dir, 3) as process:
        asked = time.monotonic()
        stop = cli(env, "stream-stop", "--wait", "60")
        assert stop.returncode == 0, stop
        assert process.poll() == 0, "stream-stop said stopped while the stream's process ran"
        assert time.monotonic() - asked >= 3
        assert "stream stopped: " in stop.stdout and "its process exited" in stop.stdout, stop
    # A process that outlives the wait: not stopped yet, and --force ends it.
    with lingering_stream(tmp_path / "slow", 60) as process:
        slow = {**env, "VELOCITY_DATA_DIR": str(tmp_path / "slow")}
        stop = cli(slow, "stream-stop", "--wait", "2")
        assert stop.returncode == 1 and "has not exited" in stop.stderr, stop
        assert process.poll() is None
        forced = cli(slow, "stream-stop", "--wait", "1", "--force")
        assert forced.returncode == 0 and "killed" in forced.stdout, forced
        assert process.wait(timeout=10) == -signal.SIGKILL
