"""Hourly data-quality checks: great-expectations suites over Velocity's Delta tables.

What: `velocity quality check --suite <suite>` through spark-submit validates the events,
the quarantine rate, the buckets and the alerts. A failed expectation makes the command
exit 1 with a readable summary, which fails the task and shows in its log (and at the
end of the error); the command keeps the validation results in the data dir.
Why: bad input or a bug in the stream shows up as broken expectations before anyone
acts on wrong alerts.
When: hourly by itself; trigger it after a deploy, a backfill or a rules change to
check now.
Needs: the ``velocity_spark`` and ``velocity_default`` connections and the
``velocity_spark`` pool. Scheduled at minute 45, away from maintain_state (minute 15).
"""

from __future__ import annotations

from airflow.sdk import Param, dag

from velocity_airflow import SPARK_BATCH_POOL
from velocity_airflow.operators import VelocitySparkSubmitOperator
from velocity_airflow.plans import QUALITY_SUITES


@dag(
    doc_md=__doc__,
    schedule="45 * * * *",
    catchup=False,
    max_active_runs=1,
    tags=["velocity", "quality"],
    params={
        "suite": Param(
            "all",
            type="string",
            enum=list(QUALITY_SUITES),
            title="Suite",
            description="Which expectation suite to run; all runs every one.",
        ),
    },
)
def check_quality() -> None:
    VelocitySparkSubmitOperator(
        task_id="quality",
        command=["quality", "check", "--suite", "{{ params.suite }}"],
        pool=SPARK_BATCH_POOL,
    )


check_quality()
