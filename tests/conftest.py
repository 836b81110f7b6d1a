"""Shared fixtures: one real local Spark session with Delta for the whole run."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings

from tests.background import BACKGROUND, is_background_test, start_demo, start_soak
from tests.bench.background import BackgroundSmoke
from velocity.operating.local_process import free_loopback_port
from velocity.settings import PROJECT_ROOT, Settings, load_settings

# No per-example deadline: on a shared two-core machine a scheduler stall would fail a
# property that holds ("Unreliable test timings"); each test's pytest-timeout still bounds it.
hypothesis_settings.register_profile("velocity", deadline=None)
hypothesis_settings.load_profile("velocity")

CLUSTER_SH = PROJECT_ROOT / "infra" / "cluster.sh"
# The spark-submits and `velocity` processes of tests are short drivers on tiny data: the
# client compiler only and the serial collector start them about a third faster. Set for
# those JVMs only.
FAST_JVM = {"JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}


def poll_until(what: str, probe: Callable[[], Any], timeout: float, log: Path | None = None) -> Any:
    """``probe()`` every quarter second until it is truthy, and its value; else fail naming
    ``what`` with the tail of ``log`` (the log of the process being waited for)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.25)  # probes are cheap (a file, a local HTTP call): a second is lost time
    tail = "\n".join(log.read_text().splitlines()[-60:]) if log and log.exists() else ""
    pytest.fail(f"no {what} within {timeout} s\n{tail}")


def land_file(source: Path, folder: Path) -> None:
    """Land a file as writers should: a hidden name, then renamed (name order = mtime order)."""
    hidden = folder / f".{source.name}"
    shutil.copy(source, hidden)
    hidden.rename(folder / source.name)
    time.sleep(0.01)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server (Debian's, 7.0) for the whole run, on a free loopback port."""
    from velocity.redis.server import redis_down, redis_up

    url = f"redis://:test-secret@127.0.0.1:{free_port()}/0"
    # One server for every test's data dir: its reader user may read all of them.
    settings = load_settings(
        data_dir=tmp_path_factory.mktemp("redis-home"), redis_url=url, redis_key_prefix="velocity"
    )
    redis_up(settings)
    yield url
    redis_down(settings)


# Each kind of service draws its ports from a range of its own (free_loopback_port): the
# Redis Cluster 20 000-22 000 (its bus ports 30 000-32 002), the Spark cluster
# 22 000-23 000, Kafka brokers 23 000-30 000, Airflow deployments 12 000-20 000, streams'
# metrics 10 000-12 000, check services 7 000-8 000; the benchmark smoke 2 000-6 000
# (benchmarks/smoke.py); the soak (tools/soak.py) its broker 6 000-7 000, its Redis
# 8 000-9 000, its Airflow 9 000-10 000; the demo (tests/integration/demo_run.py)
# 1 100-2 000.


def free_port_pair() -> int:
    """A free loopback port whose next port is free too (the broker's controller)."""
    return free_loopback_port((0, 1), low=23_000, high=30_000)


def free_metrics_port() -> int:
    """A port for a stream's metrics server (VELOCITY_METRICS_PORT)."""
    return free_loopback_port((0,), low=10_000, high=12_000)


@pytest.fixture(autouse=True, scope="session")
def _no_metrics_server() -> Iterator[None]:
    """Streams that tests start (in this process or as `velocity stream`) serve no metrics
    unless the test gives them a port: two at once, or one beside a developer's own stream,
    would otherwise both want the default port and the second would refuse to start. The
    same for the check service `velocity up` starts (VELOCITY_CHECK_PORT)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VELOCITY_METRICS_PORT", "0")
        patch.setenv("VELOCITY_CHECK_PORT", "0")
        yield


def free_check_port() -> int:
    """A port for a check service (VELOCITY_CHECK_PORT)."""
    return free_loopback_port((0,), low=7_000, high=8_000)


def free_airflow_port(second: bool = False) -> int:
    """A port for `infra/airflow.sh` (VELOCITY_AIRFLOW_PORT): its api-server takes it, the log
    servers and the scheduler's health check the next three, all free. ``second``: from a
    range of its own, for a deployment drawn while another's ports are drawn but not yet
    bound (both `up`s running at once)."""
    low = 16_000 if second else 12_000
    return free_loopback_port((0, 1, 2, 3), low=low, high=low + 4_000)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Kafka broker (the one `velocity up` runs: KRaft, one node) for the whole run,
    on free loopback ports; tests make topics of their own."""
    from velocity.kafka.broker import kafka_down, kafka_up

    settings = load_settings(
        data_dir=tmp_path_factory.mktemp("kafka-home"),
        kafka_bootstrap=f"127.0.0.1:{free_port_pair()}",
    )
    kafka_up(settings)
    yield settings.kafka_bootstrap
    kafka_down(settings)


@pytest.fixture(scope="session")
def spark_settings(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Settings:
    return load_settings(
        data_dir=tmp_path_factory.mktemp("velocity-data"),
        redis_url=redis_url,
        spark_master="local[2]",
        spark_shuffle_partitions=2,
        spark_driver_memory="3g",
        # Every micro-batch of the Spark tests is decided in the executors (two tasks),
        # however small; the subprocess streams keep the default (small ones inline).
        stream_executor_min_rows=0,
    )


@pytest.fixture(scope="session")
def spark(spark_settings: Settings) -> Iterator[object]:
    """A real SparkSession (local[2], UI off, 2 shuffle partitions, Delta configured)."""
    from velocity.spark.session import build_spark

    session = build_spark(spark_settings, "velocity-tests")
    yield session
    session.stop()


@pytest.fixture(autouse=True, scope="module")
def _forget_delta_logs() -> Iterator[None]:
    """Each test module's Delta tables leave the session's DeltaLog cache when it ends: one
    JVM serves every Spark test, and the cached snapshots of hundreds of test tables
    exhausted its heap. Starts no Spark: only a session that runs is cleared."""
    yield
    pyspark_sql = sys.modules.get("pyspark.sql")
    session = pyspark_sql.SparkSession.getActiveSession() if pyspark_sql else None
    if session is not None:
        session._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


@pytest.fixture
def data_settings(tmp_path: Path, spark_settings: Settings) -> Settings:
    """Settings whose data dir is this test's own, so tests never share Delta state, and an
    empty Redis (the session's server, flushed)."""
    import redis

    redis.Redis.from_url(spark_settings.redis_url).flushall()
    return spark_settings.model_copy(update={"data_dir": tmp_path / "data"})


class SparkCluster:
    """The Spark standalone cluster of `infra/cluster.sh`, on this run's ports."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.master = f"spark://127.0.0.1:{env['VELOCITY_CLUSTER_PORT']}"

    def run(self, action: str) -> str:
        done = subprocess.run(
            ["bash", str(CLUSTER_SH), action],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def state(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.env['VELOCITY_CLUSTER_UI_PORT']}/json/"
        with urllib.request.urlopen(url, timeout=10) as answer:
            return json.load(answer)

    def applications(self) -> list[str]:
        """The names of the applications the master has run to the end."""
        return [app["name"] for app in self.state()["completedapps"]]


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """`infra/cluster.sh up` on free loopback ports, once per run; `down` at the end."""
    master = free_loopback_port((0, 1), low=22_000, high=23_000)  # the master and its UI
    cluster = SparkCluster(
        {
            **os.environ,
            "VELOCITY_CLUSTER_PORT": str(master),
            "VELOCITY_CLUSTER_UI_PORT": str(master + 1),
            "VELOCITY_CLUSTER_WORKER_MEMORY": "2g",
            "VELOCITY_CLUSTER_DIR": str(tmp_path_factory.mktemp("spark-cluster")),
        }
    )
    cluster.run("up")
    try:
        yield cluster
    finally:
        cluster.run("down")


REDIS_CLUSTER_SH = PROJECT_ROOT / "infra" / "redis-cluster.sh"


def free_cluster_ports() -> int:
    """A first port such that it, the next two and their cluster-bus ports (+10 000) are
    free on loopback."""
    return free_loopback_port((0, 1, 2, 10_000, 10_001, 10_002), low=20_000, high=22_000)


@pytest.fixture(scope="session")
def redis_cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`infra/redis-cluster.sh up`: three masters with a password, once per run."""
    env = {
        **os.environ,
        "VELOCITY_REDIS_CLUSTER_PORT": str(free_cluster_ports()),
        "VELOCITY_REDIS_CLUSTER_PASSWORD": "cluster-secret",
        "VELOCITY_REDIS_CLUSTER_DIR": str(tmp_path_factory.mktemp("redis-cluster")),
    }

    def run(action: str) -> None:
        done = subprocess.run(
            ["bash", str(REDIS_CLUSTER_SH), action],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr

    run("up")
    try:
        yield f"redis+cluster://:cluster-secret@127.0.0.1:{env['VELOCITY_REDIS_CLUSTER_PORT']}/0"
    finally:
        run("down")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Browser tests run last but those of the runs beside the suite: they start airflow
    standalone and a stream beside chromium, and the rest of the suite need not wait for, or
    share two cores with, any of it. The bench smoke's and the short soak's tests only read
    how the run that went beside the whole suite ended (``tests/background.py``)."""
    items.sort(
        key=lambda item: (is_background_test(item), item.get_closest_marker("browser") is not None)
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    """The bench smoke starts now, beside the suite, the short soak once it has ended, and
    the shortened demo after that, each if a test of theirs is selected (and will run)."""
    if session.config.option.collectonly:
        return
    smoke = BackgroundSmoke.start(session.items)
    soak = start_soak(session.items, after=smoke)
    demo = start_demo(session.items, after=soak or smoke)
    session.config.stash[BACKGROUND] = {
        name: run
        for name, run in (("smoke", smoke), ("soak", soak), ("demo", demo))
        if run is not None
    }


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """When each run beside the suite started and how long it ran: the suite's wall time
    is the longer of its own tests and these runs."""
    runs = list(config.stash.get(BACKGROUND, {}).values())
    if runs:
        terminalreporter.section("beside the suite")
        since = min(run.created for run in runs)
        for run in runs:
            terminalreporter.write_line(run.timing(since))


def pytest_unconfigure(config: pytest.Config) -> None:
    # The soak first: a soak still waiting for the smoke must not start once it is killed.
    for run in reversed(list(config.stash.get(BACKGROUND, {}).values())):
        run.remove()
