"""Backfill alerts for a time range, or for the late events not yet backfilled.

What: the trigger form takes ``from_ms`` / ``to_ms`` (epoch milliseconds; both empty
means the recorded late events not yet backfilled, `velocity backfill --late`) and
optional ``rule_ids``. The form checks types and bounds; the first task checks the
range (from ≤ to, both or neither) and names a bad field; then `velocity backfill`
runs through spark-submit: buckets rebuilt from raw events, events re-evaluated,
CORRECTION / RETRACTION alerts emitted, Redis refreshed.
Why: late events and new rules change past windows; this is how an operator replays
them without stopping the stream.
Needs: the ``velocity_spark`` and ``velocity_default`` connections and the
``velocity_spark`` pool; Redis running.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from velocity_airflow import SPARK_BATCH_POOL
from velocity_airflow.operators import VelocitySparkSubmitOperator


@dag(
    schedule=None,
    catchup=False,
    tags=["velocity", "backfill"],
    params={
        "from_ms": Param(
            None,
            type=["null", "integer"],
            minimum=0,
            title="From (epoch ms)",
            description="Start of the event-time range, inclusive. Empty with To empty: "
            "the recorded late events not yet backfilled.",
        ),
        "to_ms": Param(
            None,
            type=["null", "integer"],
            minimum=0,
            title="To (epoch ms)",
            description="End of the event-time range, inclusive; not before From.",
        ),
        "rule_ids": Param(
            None,
            type=["null", "array"],
            items={"type": "integer", "minimum": 1},
            uniqueItems=True,
            title="Rule ids",
            description="Only these rules; empty: every rule in force.",
        ),
    },
)
def backfill_alerts() -> None:
    @task
    def plan_backfill(params: dict) -> list[str]:
        """The `velocity backfill` arguments; fails naming the field when the range is wrong."""
        from velocity_airflow.plans import backfill_args

        return backfill_args(params["from_ms"], params["to_ms"], params["rule_ids"])

    VelocitySparkSubmitOperator(task_id="backfill", command=plan_backfill(), pool=SPARK_BATCH_POOL)


backfill_alerts()
