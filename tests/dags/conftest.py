"""Airflow for the DAG tests: a throwaway AIRFLOW_HOME with SQLite, set up by the project's
own script (`infra/airflow.sh test-env`) before anything in this process imports airflow.

Airflow reads its configuration once, when ``airflow`` is first imported, so the
environment is set when this conftest is imported (before the test modules here are
collected). Connections come from ``AIRFLOW_CONN_*`` variables: the Spark one here,
the Velocity one per test (its data dir is the test's own).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import FAST_JVM, free_port, land_file

from velocity.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
AIRFLOW_SH = ROOT / "infra" / "airflow.sh"
SPARK_CONNECTION = json.dumps({"conn_type": "spark", "host": "local[2]"})


def airflow_environment(home: Path, port: int) -> dict[str, str]:
    """The variables `infra/airflow.sh test-env HOME PORT` sets, as bash evaluates them."""
    script = f'eval "$(bash {AIRFLOW_SH} test-env {home} {port})" && env -0'
    out = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, check=True, env=os.environ.copy()
    ).stdout
    evaluated = dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
    return {
        k: v
        for k, v in evaluated.items()
        if (k.startswith("AIRFLOW") or k == "PATH") and os.environ.get(k) != v
    }


def velocity_connection(settings: Settings) -> str:
    """The velocity_default connection for ``settings``, small Spark for a shared 2-core box."""
    extra = {
        "data_dir": str(settings.data_dir),
        "redis_url": settings.redis_url,
        "spark_shuffle_partitions": 2,
        "spark_driver_memory": "1g",
    }
    return json.dumps({"conn_type": "generic", "extra": json.dumps(extra)})


_HOME = Path(tempfile.mkdtemp(prefix="velocity-airflow-tests-"))
# Removed at exit too: a run that never uses the airflow_home fixture still created it.
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)
os.environ.update(airflow_environment(_HOME, free_port()))
os.environ["AIRFLOW_CONN_VELOCITY_SPARK"] = SPARK_CONNECTION
if "airflow" in sys.modules:  # pragma: no cover - a guard, not a branch tests take
    raise RuntimeError(
        "airflow was imported before tests/dags/conftest.py set AIRFLOW_HOME; import it "
        "inside tests or fixtures, not at the top of a test module outside tests/dags"
    )


def airflow_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    done = subprocess.run(
        ["airflow", *args],
        env=env or os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"airflow {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


@pytest.fixture(scope="session")
def airflow_home() -> Iterator[Path]:
    """The tmp AIRFLOW_HOME with a migrated SQLite database and the velocity_spark pool."""
    airflow_cli("db", "migrate")
    airflow_cli("pools", "set", "velocity_spark", "1", "one Spark batch job at a time")
    yield _HOME
    shutil.rmtree(_HOME, ignore_errors=True)


@pytest.fixture
def velocity_conn(data_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """This test's data dir and the session's redis-server, as the velocity_default connection."""
    monkeypatch.setenv("AIRFLOW_CONN_VELOCITY_DEFAULT", velocity_connection(data_settings))
    return data_settings


def load_dag(dag_id: str) -> Any:
    """The DAG of ``dags/<dag_id>.py``, parsed the way the dag-processor parses it."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(ROOT / "dags" / f"{dag_id}.py"), safe_mode=False)
    if bag.import_errors:
        raise AssertionError(f"{dag_id}: import errors {bag.import_errors}")
    return bag.dags[dag_id]


def _value(state: object) -> str:
    return str(getattr(state, "value", state))


def run_dag(dag_id: str, conf: dict[str, Any] | None = None) -> tuple[str, dict[str, str]]:
    """``dag.test()`` one run of ``dag_id``: the run's state and each task's state."""
    dag = load_dag(dag_id)
    run = dag.test(run_conf=conf)
    states = {ti.task_id: _value(ti.state) for ti in run.get_task_instances()}
    return _value(run.state), states


def wait_for(
    what: str,
    condition: Callable[[], Any],
    timeout: float,
    process: subprocess.Popen[str] | None = None,
    log: Path | None = None,
) -> Any:
    """Poll ``condition`` until truthy; fail naming ``what`` and showing the log's tail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if process is not None and process.poll() is not None:
            break
        time.sleep(0.25)  # the conditions read a status file: cheap to ask often
    tail = "\n".join(log.read_text().splitlines()[-40:]) if log and log.exists() else ""
    exited = f" (process exited {process.returncode})" if process and process.poll() else ""
    pytest.fail(f"no {what} within {timeout} s{exited}\n{tail}")


@dataclass
class StreamedData:
    """A data dir the stream has processed two waves of events into, through run_stream."""

    settings: Settings
    connection: str  # the velocity_default connection (AIRFLOW_CONN_VELOCITY_DEFAULT)
    process: subprocess.Popen[str]  # `airflow dags test run_stream`, running the stream
    log: Path
    first_event_ms: int
    last_event_ms: int


def _start_run_stream(connection: str, log: Path) -> subprocess.Popen[str]:
    """`airflow dags test run_stream` with the sample rules, in a session of its own."""
    env = {**os.environ, **FAST_JVM, "AIRFLOW_CONN_VELOCITY_DEFAULT": connection}
    conf = json.dumps({"rules_file": str(ROOT / "jobs/velocity/resources/sample_rules.json")})
    with log.open("a") as out:
        return subprocess.Popen(
            ["airflow", "dags", "test", "run_stream", "--conf", conf],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )


@pytest.fixture(scope="session")
def streamed(
    airflow_home: Path, spark_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StreamedData]:
    """run_stream started with `airflow dags test` (real spark-submit, Delta, redis-server) over
    generated events: a first wave, then a second one with late events, each a micro-batch.

    The stream is left running for the lifecycle test; ``stopped_stream`` stops it for the
    tests that need the state at rest. Torn down by stream-stop, then by killing the group.
    """
    import redis

    from velocity.generate import GenerateOptions, generate_events
    from velocity.operating import stream_control

    redis.Redis.from_url(spark_settings.redis_url).flushall()
    base = tmp_path_factory.mktemp("streamed")
    settings = spark_settings.model_copy(update={"data_dir": base / "data"})
    events = settings.data_dir / "events"
    events.mkdir(parents=True)
    common = {
        "payers": 8,
        "spike_fraction": 0.05,
        "duplicate_fraction": 0.02,
        "malformed_fraction": 0.02,
        "seed": 5,
    }
    first = generate_events(
        base / "wave1", GenerateOptions(events=120, rate=2.0, files=2, late_fraction=0.0, **common)
    )
    second = generate_events(
        base / "wave2",
        GenerateOptions(
            events=60,
            rate=2.0,
            files=1,
            start_ms=int(first.max_event_time or 0) + 60_000,
            late_fraction=0.1,
            prefix="later",
            **common,
        ),
    )
    connection = velocity_connection(settings)
    log = base / "run_stream.log"
    for source in sorted((base / "wave1").glob("*.jsonl")):
        land_file(source, events)
    data = StreamedData(
        settings=settings,
        connection=connection,
        process=_start_run_stream(connection, log),
        log=log,
        first_event_ms=min(int(s.min_event_time or 0) for s in (first, second)),
        last_event_ms=max(int(s.max_event_time or 0) for s in (first, second)),
    )

    def batches() -> int:
        status = stream_control.read_status(settings.data_dir) or {}
        return int(status.get("batchesThisRun") or 0) if status.get("backlogFiles") == 0 else 0

    try:
        wait_for("first micro-batch of run_stream", lambda: batches() >= 1, 300, data.process, log)
        for source in sorted((base / "wave2").glob("*.jsonl")):
            land_file(source, events)
        wait_for("second micro-batch of run_stream", lambda: batches() >= 2, 180, data.process, log)
        yield data
    finally:
        # data.process: running_stream may have started run_stream again.
        _stop(data)


def _stop(data: StreamedData, wait_seconds: int = 60) -> None:
    """Stop the stream gracefully and wait for run_stream's process; kill the group if stuck."""
    process = data.process
    if process.poll() is None:
        subprocess.run(
            [sys.executable, "-m", "velocity.cli", "stream-stop", "--wait", str(wait_seconds)],
            env={**os.environ, "VELOCITY_DATA_DIR": str(data.settings.data_dir)},
            capture_output=True,
            check=False,
        )
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)


@pytest.fixture
def streamed_conn(streamed: StreamedData, monkeypatch: pytest.MonkeyPatch) -> StreamedData:
    """The streamed data dir as this test's velocity_default connection."""
    monkeypatch.setenv("AIRFLOW_CONN_VELOCITY_DEFAULT", streamed.connection)
    for name, value in FAST_JVM.items():
        monkeypatch.setenv(name, value)
    return streamed


@pytest.fixture
def running_stream(streamed_conn: StreamedData) -> StreamedData:
    """The streamed data dir with run_stream running: started again (resuming from the
    checkpoint) when an earlier test stopped it."""
    from velocity.operating import stream_control

    if streamed_conn.process.poll() is not None:
        streamed_conn.process = _start_run_stream(streamed_conn.connection, streamed_conn.log)
        wait_for(
            "run_stream running again",
            lambda: stream_control.check_health(streamed_conn.settings).verdict == "running",
            300,
            streamed_conn.process,
            streamed_conn.log,
        )
    return streamed_conn


@pytest.fixture
def stopped_stream(streamed_conn: StreamedData) -> StreamedData:
    """The streamed data dir with the stream stopped (run_stream's run finished)."""
    _stop(streamed_conn, wait_seconds=90)
    return streamed_conn
