"""Check the streaming job's health every 5 minutes; restart it when it died or stalled.

What: `velocity stream-status` reads the stream's progress (batches advancing, input
rate, lag). Healthy → nothing. Dead → trigger run_stream, which resumes from the
checkpoint. Alive but stalled → ask it to stop, wait until it is gone, then trigger
run_stream. Stopped on purpose by stop_stream → leave it stopped. A run_stream run
that is still starting is left alone until the next check.
Why: the stream is long-running; a crash or a stuck micro-batch must not go unnoticed
for longer than one check interval.
Needs: the ``velocity_default`` connection (data dir), the run_stream DAG unpaused
(a triggered run of a paused DAG waits until it is unpaused).
"""

from __future__ import annotations

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import Param, dag, task


@dag(
    schedule="*/5 * * * *",
    catchup=False,
    max_active_runs=1,
    tags=["velocity", "stream"],
    params={
        "stale_seconds": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            title="Stale after (s)",
            description="No new micro-batch for this long counts as stalled; empty: "
            "velocity stream-status's default.",
        ),
    },
)
def check_stream() -> None:
    @task.branch
    def check_health(params: dict) -> list[str]:
        """Decide the action from the stream's status, the stop request and run_stream's runs."""
        from airflow.sdk import Variable, get_current_context

        from velocity_airflow import STOP_REQUESTED_VARIABLE
        from velocity_airflow.hooks import VelocityHook
        from velocity_airflow.plans import StreamAction, decide_stream_action

        health = VelocityHook().stream_status(stale_seconds=params["stale_seconds"])
        ti = get_current_context()["ti"]
        active = ti.get_dr_count(dag_id="run_stream", states=["queued", "running"])
        stop_requested = Variable.get(STOP_REQUESTED_VARIABLE, default=None) is not None
        action = decide_stream_action(health, active_runs=active, stop_requested=stop_requested)
        print(
            f"stream {health.reason}: {action.value} "
            f"(run_stream runs under way: {active}, stop requested: {stop_requested})"
        )
        if action is StreamAction.RESTART:
            return ["restart_stream"]
        if action is StreamAction.STOP_AND_RESTART:
            return ["stop_stalled", "restart_stream"]
        return ["nothing_to_do"]

    @task
    def stop_stalled() -> None:
        """Stop a stream that is alive but no longer advancing, and wait until it is gone."""
        from velocity.errors import VelocityError
        from velocity_airflow.hooks import VelocityHook

        hook = VelocityHook()
        hook.stream_stop()
        if not hook.wait_stream_stopped():
            raise VelocityError(
                "the stalled stream did not stop within 120 s; stop its process by hand "
                "(its pid is in `velocity stream-status`) and the next check restarts it"
            )

    restart = TriggerDagRunOperator(
        task_id="restart_stream",
        trigger_dag_id="run_stream",
        # Runs after stop_stalled when that was chosen, straight after the check otherwise.
        trigger_rule="none_failed_min_one_success",
    )
    decision = check_health()
    decision >> [EmptyOperator(task_id="nothing_to_do"), restart]
    decision >> stop_stalled() >> restart


check_stream()
