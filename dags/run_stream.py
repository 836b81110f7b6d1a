"""Start Velocity's streaming job, restartable from its checkpoint.

What: one task submits `velocity stream` through spark-submit (the Spark master comes
from the ``velocity_spark`` connection, so the same DAG drives local mode and a
cluster) and runs as long as the stream does.
Why: the stream is the one long-running job; starting it from Airflow puts its
lifecycle next to the health check (check_stream) that restarts it and the stop
request (stop_stream). Its checkpoint is under ``$VELOCITY_DATA_DIR/checkpoints/stream``,
so a new run resumes where the last one stopped.
When: to start the stream the first time, or again after stop_stream; after a
crash check_stream triggers it by itself.
Needs: the ``velocity_spark`` and ``velocity_default`` connections (infra/airflow.sh
creates both), Redis running (`velocity up`), events landing in the events folder or, with the
source param kafka, a broker (`velocity up` starts a local one).
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from velocity_airflow.operators import VelocitySparkSubmitOperator


@dag(
    doc_md=__doc__,
    schedule=None,
    catchup=False,
    # Two streams on one checkpoint would corrupt it; a restart queues behind the old run.
    max_active_runs=1,
    tags=["velocity", "stream"],
    params={
        "source": Param(
            "auto",
            enum=["auto", "folder", "kafka"],
            title="Source",
            description="Where payments come from: files landing in the events folder, or "
            "the Kafka events topic (VELOCITY_KAFKA_BOOTSTRAP); auto: what this data dir's "
            "stream read last (a restart resumes its checkpoint), folder the first time.",
        ),
        "topic": Param(
            "",
            type="string",
            title="Kafka topic",
            description="Source kafka: the topic read; empty: VELOCITY_KAFKA_EVENTS_TOPIC.",
        ),
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
        from velocity.operating.stream_control import last_source
        from velocity_airflow.hooks import VelocityHook
        from velocity_airflow.plans import stream_args, stream_source

        data_dir = VelocityHook().get_conn().data_dir
        source, last_topic = stream_source(params["source"], last_source(data_dir))
        return stream_args(
            params["events_dir"] or str(data_dir / "events"),
            params["rules_file"] or None,
            params["duration_seconds"],
            source,
            params["topic"] or last_topic,
        )

    VelocitySparkSubmitOperator(task_id="stream", command=plan_stream())


run_stream()
