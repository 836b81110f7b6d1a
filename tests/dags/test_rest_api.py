"""The whole deployment path: `infra/airflow.sh up` starts Airflow (the components of
`airflow standalone`) on free loopback ports with a tmp AIRFLOW_HOME; backfill_alerts is
triggered through the running api-server's REST API with a conf, and its run succeeds;
`down` stops everything.

Beside it a second deployment comes up at the same time, with its own Redis (`velocity up`),
data dir, AIRFLOW_HOME and ports: the two do not collide, and every listener of each (the
api-server, both log servers, the scheduler's health check, Redis) is on 127.0.0.1 at the
port its settings give. It shares this test because a fresh `up` costs over a minute on two
cores, and beside another `up` it costs less than a test of its own."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from tests.conftest import free_airflow_port, free_port, poll_until
from tests.dags.conftest import AIRFLOW_SH, FAST_JVM, StreamedData

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.redis]

VELOCITY = str(Path(sys.executable).parent / "velocity")


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _env(home: Path, port: int, data_dir: Path, redis_url: str) -> dict[str, str]:
    # Only the script's own configuration: no AIRFLOW_* from the in-process test instance,
    # so the connections and the pool are the ones `up` creates.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        VELOCITY_AIRFLOW_HOME=str(home),
        VELOCITY_AIRFLOW_PORT=str(port),
        VELOCITY_DATA_DIR=str(data_dir),
        VELOCITY_REDIS_URL=redis_url,
        VELOCITY_SPARK_SHUFFLE_PARTITIONS="2",
        VELOCITY_SPARK_DRIVER_MEMORY="1g",
        **FAST_JVM,
    )
    return env


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


def _run(command: list[str], env: dict[str, str], timeout: float) -> str:
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_two_deployments_side_by_side_and_a_backfill_through_the_rest_api(
    stopped_stream: StreamedData, tmp_path: Path
) -> None:
    home, port = tmp_path / "airflow_home", free_airflow_port()
    env = _env(home, port, stopped_stream.settings.data_dir, stopped_stream.settings.redis_url)
    other_home, other_redis = tmp_path / "other" / "airflow_home", free_port()
    other_port = free_airflow_port()
    while abs(other_port - port) < 4:  # neither is bound yet: draw apart
        other_port = free_airflow_port()
    other_env = _env(
        other_home,
        other_port,
        tmp_path / "other" / "data",
        f"redis://:other-secret@127.0.0.1:{other_redis}/0",
    )
    other_env["VELOCITY_KAFKA_BOOTSTRAP"] = ""  # Redis only: no broker of its own
    log = home / "standalone.log"
    other_up: subprocess.Popen[str] | None = None
    other_down: subprocess.Popen[str] | None = None
    try:
        _run([VELOCITY, "up"], other_env, 60)  # the second deployment's own Redis
        other_up = subprocess.Popen(
            ["bash", str(AIRFLOW_SH), "up"],
            env=other_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        up = subprocess.run(
            ["bash", str(AIRFLOW_SH), "up"], env=env, capture_output=True, text=True, timeout=300
        )
        assert up.returncode == 0, up.stdout + up.stderr
        other_output, _ = other_up.communicate(timeout=300)
        assert other_up.returncode == 0, other_output
        base = f"http://127.0.0.1:{port}"
        passwords = home / "simple_auth_manager_passwords.json.generated"
        password = json.loads(passwords.read_text())["admin"]
        assert f"Airflow UI: {base}" in up.stdout
        assert f"admin / {password}" in up.stdout

        # Side by side: each deployment's listeners are its own four ports, on loopback
        # only; each scheduler's health check answers on its port; Redis too.
        for where, first in ((home, port), (other_home, other_port)):
            assert _group_listeners(where) == {("127.0.0.1", first + n) for n in range(4)}
            health = httpx.get(f"http://127.0.0.1:{first + 3}/health", timeout=10)
            assert health.status_code == 200, health.text
        assert {a for a, p, _ in _listeners() if p == other_redis} == {"127.0.0.1"}
        # The second deployment goes down while the first runs its backfill (its
        # components take seconds to stop); checked once the backfill is done.
        other_down = subprocess.Popen(
            ["bash", "-c", f'bash "{AIRFLOW_SH}" down && "{VELOCITY}" down'],
            env=other_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

        with httpx.Client(base_url=base, timeout=30) as client:
            token = client.post("/auth/token", json={"username": "admin", "password": password})
            assert token.status_code in (200, 201), token.text
            client.headers["Authorization"] = f"Bearer {token.json()['access_token']}"
            poll_until(
                "backfill_alerts parsed by the dag-processor",
                lambda: client.get("/api/v2/dags/backfill_alerts").status_code == 200,
                120,
                log,
            )
            unpaused = client.patch("/api/v2/dags/backfill_alerts", json={"is_paused": False})
            assert unpaused.status_code == 200, unpaused.text

            # The form's schema is enforced on every trigger, the REST API's too.
            refused = client.post(
                "/api/v2/dags/backfill_alerts/dagRuns",
                json={"logical_date": None, "conf": {"rule_ids": ["one"]}},
            )
            assert refused.status_code == 400, refused.text

            conf = {
                "from_time": _iso(stopped_stream.first_event_ms),
                "to_time": _iso(stopped_stream.last_event_ms),
                "rule_ids": ["1", "2"],
            }
            triggered = client.post(
                "/api/v2/dags/backfill_alerts/dagRuns", json={"logical_date": None, "conf": conf}
            )
            assert triggered.status_code == 200, triggered.text
            run_id = triggered.json()["dag_run_id"]
            assert triggered.json()["conf"] == conf
            run_url = f"/api/v2/dags/backfill_alerts/dagRuns/{run_id}"

            def finished() -> str | None:
                state = client.get(run_url).json()["state"]
                return state if state in ("success", "failed") else None

            assert poll_until("backfill run finished", finished, 600, log) == "success"
            tasks = client.get(f"{run_url}/taskInstances").json()["task_instances"]
            assert {t["task_id"]: t["state"] for t in tasks} == {
                "plan_backfill": "success",
                "backfill": "success",
            }
        down_output, _ = other_down.communicate(timeout=180)
        assert other_down.returncode == 0, down_output
        stopped = {other_redis, *range(other_port, other_port + 4)}
        assert not {p for _, p, _ in _listeners()} & stopped
    finally:
        if other_up is not None and other_up.poll() is None:
            other_up.kill()
        if other_down is not None and other_down.poll() is None:
            other_down.communicate(timeout=180)
        for stop in (["bash", str(AIRFLOW_SH), "down"], [VELOCITY, "down"]):  # if still up
            subprocess.run(stop, env=other_env, capture_output=True, timeout=120, check=False)
        down = subprocess.run(
            ["bash", str(AIRFLOW_SH), "down"], env=env, capture_output=True, text=True, timeout=120
        )
        assert down.returncode == 0, down.stdout + down.stderr
        assert not (home / "standalone.pid").exists()
