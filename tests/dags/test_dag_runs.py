"""Each DAG runs with ``dag.test()`` against real spark-submit, Spark, Delta and redis-server.

The stream DAGs share one data dir (the ``streamed`` fixture starts run_stream over two
waves of generated events); quality and backfill then work on the state the stream
left. The stream policy's other branches are unit-tested in test_plans.py. Maintenance's
DAG runs in the short soak (tests/dags/test_soak.py), beside a stream under faults.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from tests.conftest import SparkCluster
from tests.dags.conftest import StreamedData, run_dag

from velocity.settings import Settings

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.redis]


def _verdict(settings: Settings) -> str:
    from velocity.operating import stream_control

    return stream_control.check_health(settings).verdict


def test_run_check_and_stop_the_stream(running_stream: StreamedData) -> None:
    # run_stream's task is running the stream (the fixtures saw its micro-batches).
    streamed_conn = running_stream
    assert streamed_conn.process.poll() is None
    assert _verdict(streamed_conn.settings) == "running"

    state, tasks = run_dag("check_stream")
    assert (state, tasks) == (
        "success",
        {
            "check_health": "success",
            "nothing_to_do": "success",
            "stop_stalled": "skipped",
            "restart_stream": "skipped",
        },
    )

    state, tasks = run_dag("stop_stream")
    assert (state, tasks) == ("success", {"stop": "success"})
    # run_stream's spark-submit ended cleanly, so its run succeeded (`airflow dags test`
    # exits non-zero on a failed run).
    assert streamed_conn.process.wait(timeout=120) == 0, streamed_conn.log.read_text()[-4000:]
    assert _verdict(streamed_conn.settings) == "stopped"

    # Stopped on request: the next check leaves it stopped.
    state, tasks = run_dag("check_stream")
    assert state == "success"
    assert (tasks["nothing_to_do"], tasks["restart_stream"]) == ("success", "skipped")


def test_check_stream_restarts_a_dead_stream(airflow_home: Path, velocity_conn: Settings) -> None:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    from velocity.operating import stream_control

    # The status file a SIGKILLed stream leaves behind: RUNNING, but its process is gone.
    gone = subprocess.Popen(["true"])
    gone.wait()
    now = stream_control.now_ms()
    stream_control.write_json_atomically(
        stream_control.status_path(velocity_conn.data_dir),
        {
            "state": "RUNNING",
            "pid": gone.pid,
            "host": stream_control.local_host(),
            "startedAt": now - 60_000,
            "updatedAt": now,
        },
    )
    assert _verdict(velocity_conn) == "dead"

    with create_session() as session:
        before = {r.run_id for r in session.query(DagRun).filter(DagRun.dag_id == "run_stream")}
    state, tasks = run_dag("check_stream")
    assert (state, tasks) == (
        "success",
        {
            "check_health": "success",
            "nothing_to_do": "skipped",
            "stop_stalled": "skipped",
            "restart_stream": "success",
        },
    )
    with create_session() as session:
        triggered = [
            r
            for r in session.query(DagRun).filter(DagRun.dag_id == "run_stream")
            if r.run_id not in before
        ]
        assert [str(getattr(r.state, "value", r.state)) for r in triggered] == ["queued"]
        # Nothing runs it here (no scheduler); remove it so no other test counts it.
        for run in triggered:
            session.delete(run)


@pytest.mark.cluster
def test_check_quality_submits_to_the_spark_cluster_of_its_connection(
    stopped_stream: StreamedData, spark_cluster: SparkCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The velocity_spark connection names a standalone master: spark-submit runs the task
    there, with the JARs and the project's Python on the executors. (The same DAG on the
    default local[2] connection would add a minute and test nothing new: backfill_alerts
    submits through that connection with the same operator. maintain_state's run is the
    short soak's: its `maintain_state` fault runs the DAG beside the stream, and the soak
    fails unless it succeeds.)"""
    host, _, port = spark_cluster.master.rpartition(":")
    monkeypatch.setenv(
        "AIRFLOW_CONN_VELOCITY_SPARK",
        json.dumps({"conn_type": "spark", "host": host, "port": int(port)}),
    )
    before = len(spark_cluster.applications())
    # One suite (the form's param, templated into the command): the cluster is the point,
    # and every suite is checked by tests/spark/test_quality.py.
    state, tasks = run_dag("check_quality", conf={"suite": "events"})
    assert (state, tasks) == ("success", {"quality": "success"})
    assert len(spark_cluster.applications()) == before + 1


def test_backfill_the_late_events(stopped_stream: StreamedData) -> None:
    state, tasks = run_dag("backfill_alerts", conf={})
    assert (state, tasks) == ("success", {"plan_backfill": "success", "backfill": "success"})


def test_backfill_refuses_a_reversed_range_before_any_spark(airflow_home: Path) -> None:
    state, tasks = run_dag(
        "backfill_alerts",
        conf={"from_time": "2026-01-02T00:00:00Z", "to_time": "2026-01-01T00:00:00Z"},
    )
    assert (state, tasks) == (
        "failed",
        {"plan_backfill": "failed", "backfill": "upstream_failed"},
    )
