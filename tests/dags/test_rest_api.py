"""The whole deployment path: `infra/airflow.sh up` starts `airflow standalone` on a free
loopback port with a tmp AIRFLOW_HOME; backfill_alerts is triggered through the running
api-server's REST API with a conf, and its run succeeds; `down` stops everything."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from tests.conftest import free_port, poll_until
from tests.dags.conftest import AIRFLOW_SH, FAST_JVM, StreamedData

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.redis]


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def test_backfill_triggered_through_the_rest_api(
    stopped_stream: StreamedData, tmp_path: Path
) -> None:
    home = tmp_path / "airflow_home"
    port = free_port()
    # Only the script's own configuration: no AIRFLOW_* from the in-process test instance,
    # so the connections and the pool are the ones `up` creates.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        VELOCITY_AIRFLOW_HOME=str(home),
        VELOCITY_AIRFLOW_PORT=str(port),
        VELOCITY_DATA_DIR=str(stopped_stream.settings.data_dir),
        VELOCITY_REDIS_URL=stopped_stream.settings.redis_url,
        VELOCITY_SPARK_SHUFFLE_PARTITIONS="2",
        VELOCITY_SPARK_DRIVER_MEMORY="1g",
        **FAST_JVM,
    )
    log = home / "standalone.log"
    try:
        up = subprocess.run(
            ["bash", str(AIRFLOW_SH), "up"], env=env, capture_output=True, text=True, timeout=300
        )
        assert up.returncode == 0, up.stdout + up.stderr
        base = f"http://127.0.0.1:{port}"
        passwords = home / "simple_auth_manager_passwords.json.generated"
        password = json.loads(passwords.read_text())["admin"]
        assert f"Airflow UI: {base}" in up.stdout
        assert f"admin / {password}" in up.stdout

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
    finally:
        down = subprocess.run(
            ["bash", str(AIRFLOW_SH), "down"], env=env, capture_output=True, text=True, timeout=120
        )
        assert down.returncode == 0, down.stdout + down.stderr
        assert not (home / "standalone.pid").exists()
