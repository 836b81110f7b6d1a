"""Backfill alerts for an event-time range, or for the late and out-of-order events not yet
backfilled.

What: replays the payments of a range through the rules and emits the difference from
what was already emitted: CORRECTION alerts for decisions that should have fired,
RETRACTION alerts for those that should not have (SPEC §3). Buckets are rebuilt from the
raw events and Redis is refreshed; the stream keeps running and waits only for the
backfill's final commit (about a second).
Why: late events, events that arrive after a later event of their key (a lagging Kafka
partition, a slow producer) and new rules change past windows; this is how an analyst
replays them without stopping the stream.
When: after late or out-of-order events (leave From and To empty: the windows the recorded
ones touched, `velocity backfill --late`); after adding or changing a rule, to see what it would
have raised over a past range (pick it under Rules); after fixing quarantined events.
The form: From and To are event times in the UI's timezone, both inclusive; give both or
neither. Rules: only these (the rules in force when the DAG was last parsed); none means
every rule in force. A wrong form fails the first task, plan_backfill, naming the field,
before any Spark starts. Airflow's own fields of the trigger form (Logical Date, Run ID,
the backfill option) are not needed: leave them as they are; Velocity ignores the logical
date (the range is From and To). Each run's outcome (range, rules, events evaluated,
corrections, retractions, lock time, and for the late events how many of them were late
and how many out of order) shows on the Velocity page (Backfill runs), with the
corrections among its alerts and on the alert stream.
Needs: the ``velocity_spark`` and ``velocity_default`` connections, the ``velocity_spark``
pool (one Spark batch job at a time), and Redis.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from velocity_airflow import SPARK_BATCH_POOL
from velocity_airflow.hooks import rules_in_force_for_forms
from velocity_airflow.operators import VelocitySparkSubmitOperator
from velocity_airflow.plans import rule_choices

# The rules in force when the dag-processor last parsed this file (every 30 s or so).
RULE_IDS, RULE_LABELS = rule_choices(rules_in_force_for_forms())


@dag(
    schedule=None,
    catchup=False,
    tags=["velocity", "backfill"],
    doc_md=__doc__,
    params={
        "from_time": Param(
            None,
            type=["null", "string"],
            format="date-time",
            title="From",
            description="First event time of the range, inclusive. Empty with To empty: "
            "the recorded late and out-of-order events not yet backfilled. Airflow's own "
            "fields of this form (Logical Date, Run ID, Unpause, Single Run or Backfill) are "
            "ignored: the range is From and To.",
        ),
        "to_time": Param(
            None,
            type=["null", "string"],
            format="date-time",
            title="To",
            description="Last event time of the range, inclusive; not before From.",
        ),
        "rule_ids": Param(
            None,
            type=["null", "array"],
            items={"type": "string", "pattern": "^[1-9][0-9]*$"},
            uniqueItems=True,
            examples=RULE_IDS,
            values_display=RULE_LABELS,
            title="Rules",
            description="Only these rules; empty: every rule in force.",
        ),
    },
)
def backfill_alerts() -> None:
    @task
    def plan_backfill(params: dict, run_id: str | None = None) -> list[str]:
        """The `velocity backfill` arguments (with this run's id, recorded with its figures);
        fails naming the field when the form is wrong."""
        from velocity_airflow.plans import backfill_form_args

        return backfill_form_args(params, run_id)

    VelocitySparkSubmitOperator(task_id="backfill", command=plan_backfill(), pool=SPARK_BATCH_POOL)


backfill_alerts()
