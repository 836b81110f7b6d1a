"""Start Velocity's streaming job, restartable from its checkpoint.

What: one task submits `velocity stream` through spark-submit (the Spark master comes
from the ``velocity_spark`` connection, so the same DAG drives local mode and a
cluster) and runs as long as the stream does.
Why: the stream is the one long-running job; starting it from Airflow puts its
lifecycle next to the health check (check_stream) that restarts it and the stop
request (stop_stream). Its checkpoint is under ``$VELOCITY_DATA_DIR/checkpoints/stream``,
so a new run resumes where the last one stopped.
Needs: the ``velocity_spark`` and ``velocity_default`` connections (infra/airflow.sh
creates both), Redis running (`velocity up`), events landing in the events folder.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from velocity_airflow.operators import VelocitySparkSubmitOperator


@dag(
    schedule=None,
    catchup=False,
    # Two streams on one checkpoint would corrupt it; a restart queues behind the old run.
    max_active_runs=1,
    tags=["velocity", "stream"],
    params={
        "events_dir": Param(
            "",
            type="string",
            title="Events folder",
            description="Folder of JSON-lines files the stream reads; empty: <data dir>/events.",
        ),
        "rules_file": Param(
            "",
            type="string",
            title="Rules file",
            description="Rules applied before the stream starts; empty: the rules in force.",
        ),
        "duration_seconds": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            title="Duration (s)",
            description="Stop after this many seconds; empty: run until stop_stream.",
        ),
    },
)
def run_stream() -> None:
    @task
    def plan_stream(params: dict) -> list[str]:
        """The `velocity stream` arguments, the events folder resolved against the data dir."""
        from velocity_airflow.hooks import VelocityHook
        from velocity_airflow.plans import stream_args

        events_dir = params["events_dir"] or str(VelocityHook().get_conn().data_dir / "events")
        return stream_args(events_dir, params["rules_file"] or None, params["duration_seconds"])

    VelocitySparkSubmitOperator(task_id="stream", command=plan_stream())


run_stream()
