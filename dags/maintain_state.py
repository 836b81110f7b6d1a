"""Hourly maintenance of Velocity's Delta tables and Redis mirror.

What: compact sealed minute buckets into hour buckets, OPTIMIZE the tables, VACUUM
files no version needs, evict buckets and Redis keys beyond every rule's window, and
reconcile Redis against Delta, repairing drift: `velocity maintain all`, the steps in that
order in one spark-submit (one JVM and Spark session, not one a step). Each step is
idempotent, so a rerun does nothing new; the task's log holds each step's summary.
Why: the stream appends small files and buckets every micro-batch; without this, reads
slow down, storage grows and Redis can drift from the state of record.
When: hourly by itself; trigger it after a large backfill, or when lookups or
micro-batches slow down.
Needs: the ``velocity_spark`` and ``velocity_default`` connections and the
``velocity_spark`` pool (infra/airflow.sh creates them), Redis running.
Scheduled at minute 15, away from check_quality (minute 45): two cores run one Spark
batch job at a time.
"""

from __future__ import annotations

from airflow.sdk import dag

from velocity_airflow import SPARK_BATCH_POOL
from velocity_airflow.operators import VelocitySparkSubmitOperator
from velocity_airflow.plans import MAINTENANCE_COMMAND


@dag(
    schedule="15 * * * *",
    doc_md=__doc__,
    catchup=False,
    max_active_runs=1,
    tags=["velocity", "maintenance"],
)
def maintain_state() -> None:
    VelocitySparkSubmitOperator(
        task_id="maintain", command=list(MAINTENANCE_COMMAND), pool=SPARK_BATCH_POOL
    )


maintain_state()
