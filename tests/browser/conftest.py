"""A real deployment for the browser tests: the stream with the sample rules, Airflow (the
components of `airflow standalone`) started by `infra/airflow.sh up`, and Debian's headless
chromium driven by Selenium through Debian's chromedriver (nothing is downloaded).

Screenshots of each step go to ``$VELOCITY_TEST_OUTPUT/browser`` (default
``<checkout>/test-output/browser``), where CI keeps them.

``VELOCITY_BROWSER_STORED_ALERTS=N`` (``make bench-browser``, not the suite) fills the
deployment's tables with N alerts of three more rules (41-43: bench-page's storm, 3 000
payers) before the first test, as weeks of a stream would have left them: the storm test's
clicks are then timed with that history stored.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FAST_JVM, free_airflow_port, land_file, poll_until
from velocity.settings import PROJECT_ROOT, Settings

AIRFLOW_SH = PROJECT_ROOT / "infra" / "airflow.sh"
SAMPLE_RULES = PROJECT_ROOT / "jobs" / "velocity" / "resources" / "sample_rules.json"
VELOCITY = str(Path(sys.executable).parent / "velocity")
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@dataclass
class Deployment:
    """Velocity streaming into Redis and Delta, with Airflow serving its page."""

    settings: Settings
    home: Path  # its VELOCITY_AIRFLOW_HOME
    base: str  # the Airflow UI, http://127.0.0.1:<port>
    passwords: dict[str, str]
    events: Path  # the folder the stream reads
    waves: list[Path]  # generated files, landed one at a time
    stream: subprocess.Popen[str]
    stream_log: Path
    shots: Path

    def land(self, wave: int) -> None:
        land_file(self.waves[wave], self.events)

    def land_path(self, source: Path) -> None:
        land_file(source, self.events)

    def batches(self) -> int:
        """Micro-batches this run with nothing left to read (0 while files wait)."""
        from velocity.operating import stream_control

        status = stream_control.read_status(self.settings.data_dir) or {}
        return int(status.get("batchesThisRun") or 0) if status.get("backlogFiles") == 0 else 0


def airflow_env(settings: Settings, home: Path, port: int) -> dict[str, str]:
    # Only the script's own Airflow configuration: tests/dags sets AIRFLOW_* for its own
    # in-process instance.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        VELOCITY_AIRFLOW_HOME=str(home),
        VELOCITY_AIRFLOW_PORT=str(port),
        VELOCITY_AIRFLOW_USERS="admin:admin,viewer:viewer",
        VELOCITY_DATA_DIR=str(settings.data_dir),
        VELOCITY_REDIS_URL=settings.redis_url,
        VELOCITY_SPARK_SHUFFLE_PARTITIONS="2",
        VELOCITY_SPARK_DRIVER_MEMORY="1g",
        **FAST_JVM,
    )
    return env


def start_airflow(env: dict[str, str]) -> subprocess.Popen[str]:
    """`infra/airflow.sh up` under way (its output read once it ends)."""
    return subprocess.Popen(
        ["bash", str(AIRFLOW_SH), "up"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


# make bench-browser's history (0 in the suite); its fill's time is the first test's too.
STORED_ALERTS = int(os.environ.get("VELOCITY_BROWSER_STORED_ALERTS") or 0)
FILL_SECONDS = STORED_ALERTS // 2_000


def _stored_alerts(settings: Settings) -> None:
    """``STORED_ALERTS`` alerts written as the stream writes them (none published to the
    alert stream: the stream has published newer ones)."""
    if STORED_ALERTS:
        from benchmarks.page_fill import fill

        filled = fill(settings, STORED_ALERTS, first_rule=41, stream_entries=0)
        print(f"\nstored before the tests: {filled}", flush=True)


# One deployment and one browser for the whole browser suite (each file's tests run in file
# order, the files by name): starting Airflow beside a stream takes minutes.
@pytest.fixture(scope="session")
def deployment(
    spark_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    import redis

    from velocity.generate import GenerateOptions, generate_events

    redis.Redis.from_url(spark_settings.redis_url).flushall()
    base_dir = tmp_path_factory.mktemp("browser")
    settings = spark_settings.model_copy(update={"data_dir": base_dir / "data"})
    events = settings.data_dir / "events"
    events.mkdir(parents=True)
    # One generation (distinct transactionIds), landed as two waves: the second holds the
    # late events and comes after a rule is paused.
    generate_events(
        base_dir / "generated",
        GenerateOptions(
            events=400,
            rate=2.0,
            payers=8,
            files=2,
            spike_fraction=0.05,
            late_fraction=0.05,
            duplicate_fraction=0.02,
            malformed_fraction=0.02,
            seed=11,
        ),
    )
    waves = sorted((base_dir / "generated").glob("*.jsonl"))
    home, port = base_dir / "airflow_home", free_airflow_port()
    env = airflow_env(settings, home, port)
    shots = Path(os.environ.get("VELOCITY_TEST_OUTPUT", PROJECT_ROOT / "test-output")) / "browser"
    shutil.rmtree(shots, ignore_errors=True)
    shots.mkdir(parents=True)
    airflow_up = start_airflow(env)
    stream_log = base_dir / "stream.log"
    with stream_log.open("w") as out:
        stream = subprocess.Popen(
            [VELOCITY, "stream", "--events", str(events), "--rules", str(SAMPLE_RULES)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    deployment = Deployment(
        settings, home, f"http://127.0.0.1:{port}", {}, events, waves, stream, stream_log, shots
    )
    deployment.land(0)
    try:
        output, _ = airflow_up.communicate(timeout=600)  # migrations + components, beside a stream
        assert airflow_up.returncode == 0, output
        passwords = home / "simple_auth_manager_passwords.json.generated"
        deployment.passwords = json.loads(passwords.read_text())
        poll_until(
            "the stream's first micro-batch", lambda: deployment.batches() >= 1, 300, stream_log
        )
        _stored_alerts(settings)
        yield deployment
    finally:
        subprocess.run(
            [sys.executable, "-m", "velocity.cli", "stream-stop", "--wait", "60", "--force"],
            env=env,
            capture_output=True,
            check=False,
            timeout=200,
        )
        if deployment.stream.poll() is None:
            os.killpg(deployment.stream.pid, signal.SIGKILL)
        subprocess.run(
            ["bash", str(AIRFLOW_SH), "down"],
            env=env,
            capture_output=True,
            timeout=120,
            check=False,
        )


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Headless chromium, 1400×1000, driven through Debian's chromedriver."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail(
            "chromium and chromedriver are missing: `make test` installs them "
            "(VELOCITY_SETUP_BROWSER=1 bash infra/setup.sh)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()
