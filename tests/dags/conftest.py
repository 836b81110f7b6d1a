"""Airflow for the DAG tests: a throwaway AIRFLOW_HOME with SQLite, set up by the project's
own script (`infra/airflow.sh test-env`) before anything in this process imports airflow.

Airflow reads its configuration once, when ``airflow`` is first imported, so the
environment is set when this conftest is imported (before the test modules here are
collected). Connections come from ``AIRFLOW_CONN_*`` variables: the Spark one here,
the Velocity one per test (its data dir is the test's own).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import free_port

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


def run_dag(dag_id: str, conf: dict[str, Any] | None = None) -> tuple[str, dict[str, str]]:
    """``dag.test()`` one run of ``dag_id``: the run's state and each task's state."""
    dag = load_dag(dag_id)
    run = dag.test(run_conf=conf)
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    return str(run.state), states
