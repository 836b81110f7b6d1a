"""Two deployments side by side: the browser tests' (`infra/airflow.sh up` beside a stream)
and a neighbour with its own Redis (`velocity up`), data dir, AIRFLOW_HOME and ports, whose
`up` runs while the browser deployment's does. They do not collide: every listener of each
(the api-server, both log servers, the scheduler's health check, Redis) is on 127.0.0.1 at
the port its settings give, and the neighbour's `down` frees every one of its ports.

The REST API of the browser deployment: a JWT from `/auth/token`, and the backfill form's
schema enforced on a trigger (HTTP 400, no run). A run triggered and finished through the
REST API is the browser's backfill test: the form posts to the same endpoint.

The neighbour shares the browser deployment's start rather than starting one of its own: a
fresh `up` costs over a minute on two cores, and beside another `up` much less."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.browser.conftest import AIRFLOW_SH, Deployment, airflow_env, start_airflow
from tests.conftest import free_airflow_port, free_port, poll_until
from velocity.settings import Settings

pytestmark = [pytest.mark.browser, pytest.mark.redis, pytest.mark.airflow]

VELOCITY = str(Path(sys.executable).parent / "velocity")


@dataclass
class Neighbour:
    """A second deployment coming up: its Redis, then its Airflow (``up``, still running)."""

    home: Path
    port: int
    redis_port: int
    env: dict[str, str]
    up: subprocess.Popen[str]

    def ready(self) -> str:
        """The output of its `up`, once it has finished (it must succeed)."""
        output, _ = self.up.communicate(timeout=600)
        assert self.up.returncode == 0, output
        return output

    def down(self) -> None:
        if self.up.poll() is None:
            self.up.kill()
            self.up.communicate()
        for stop in (["bash", str(AIRFLOW_SH), "down"], [VELOCITY, "down"]):
            done = subprocess.run(stop, env=self.env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stdout + done.stderr


# Session-scoped, as `deployment` is, and asked for before it: its `up` starts first and
# runs while the browser deployment's does.
@pytest.fixture(scope="session")
def neighbour(
    spark_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Neighbour]:
    folder = tmp_path_factory.mktemp("neighbour")
    redis_port = free_port()
    settings = spark_settings.model_copy(
        update={
            "data_dir": folder / "data",
            "redis_url": f"redis://:neighbour-secret@127.0.0.1:{redis_port}/0",
        }
    )
    home, port = folder / "airflow_home", free_airflow_port(second=True)
    env = airflow_env(settings, home, port)
    env["VELOCITY_KAFKA_BOOTSTRAP"] = ""  # Redis only: no broker of its own
    started = subprocess.run([VELOCITY, "up"], env=env, capture_output=True, text=True, timeout=60)
    assert started.returncode == 0, started.stdout + started.stderr
    neighbour = Neighbour(home, port, redis_port, env, start_airflow(env))
    try:
        yield neighbour
    finally:
        neighbour.down()  # if the test did not get that far


def _listeners() -> list[tuple[str, int, set[int]]]:
    """Every listening TCP socket on this host: (address, port, pids), from `ss -ltnp`."""
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        address, _, port = fields[3].rpartition(":")
        pids = {int(pid) for pid in re.findall(r"pid=(\d+)", line)}
        found.append((address.strip("[]").removeprefix("::ffff:"), int(port), pids))
    return found


def _group_listeners(home: Path) -> set[tuple[str, int]]:
    """The sockets the processes of a deployment's Airflow (one process group) listen on."""
    group = int((home / "standalone.pid").read_text())
    members = {
        int(pid) for pid in os.listdir("/proc") if pid.isdigit() and _pgid(int(pid)) == group
    }
    return {(address, port) for address, port, pids in _listeners() if pids & members}


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_two_deployments_side_by_side_and_the_rest_api(
    neighbour: Neighbour, deployment: Deployment
) -> None:
    output = neighbour.ready()
    passwords = neighbour.home / "simple_auth_manager_passwords.json.generated"
    password = json.loads(passwords.read_text())["admin"]
    assert f"Airflow UI: http://127.0.0.1:{neighbour.port}" in output
    assert f"admin / {password}" in output

    # Side by side: each deployment's listeners are its own four ports, on loopback only;
    # each scheduler's health check answers on its port; the neighbour's Redis too.
    port = int(deployment.base.rpartition(":")[2])
    for home, first in ((deployment.home, port), (neighbour.home, neighbour.port)):
        assert _group_listeners(home) == {("127.0.0.1", first + n) for n in range(4)}
        health = httpx.get(f"http://127.0.0.1:{first + 3}/health", timeout=10)
        assert health.status_code == 200, health.text
    assert {a for a, p, _ in _listeners() if p == neighbour.redis_port} == {"127.0.0.1"}

    with httpx.Client(base_url=deployment.base, timeout=30) as client:
        token = client.post(
            "/auth/token", json={"username": "admin", "password": deployment.passwords["admin"]}
        )
        assert token.status_code in (200, 201), token.text
        client.headers["Authorization"] = f"Bearer {token.json()['access_token']}"
        poll_until(
            "backfill_alerts parsed by the dag-processor",
            lambda: client.get("/api/v2/dags/backfill_alerts").status_code == 200,
            120,
        )
        runs = "/api/v2/dags/backfill_alerts/dagRuns"
        before = client.get(runs).json()["total_entries"]
        # The form's schema is enforced on every trigger, the REST API's too.
        refused = client.post(runs, json={"logical_date": None, "conf": {"rule_ids": ["one"]}})
        assert refused.status_code == 400, refused.text
        assert client.get(runs).json()["total_entries"] == before

    neighbour.down()
    stopped = {neighbour.redis_port, *range(neighbour.port, neighbour.port + 4)}
    assert not {p for _, p, _ in _listeners()} & stopped
    assert not (neighbour.home / "standalone.pid").exists()
