"""Check the streaming job's health every 5 minutes; restart it when it died or stalled.

What: `velocity stream-status` judges the stream from its status file (batches
advancing, input rate, lag). Healthy → nothing. Dead or failed → trigger run_stream,
which resumes from the checkpoint. Stalled → ask it to stop (killed after 60 s if it
does not; this host only), then trigger run_stream (the new run waits for the old one:
run_stream allows one run at a time). Stopped on request (stop_stream, `velocity
stream-stop`, a duration) → leave it stopped. Never started, or a run_stream run
already queued or running → wait for the next check.
Why: the stream is long-running; a crash or a stuck micro-batch must not go unnoticed
for longer than one check interval.
When: it runs by itself every 5 minutes; trigger it to check (and restart) now.
Needs: the ``velocity_default`` connection (data dir), the run_stream DAG unpaused
(a triggered run of a paused DAG waits until it is unpaused).
"""

from __future__ import annotations

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import Param, dag, task


@dag(
    doc_md=__doc__,
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
        """Decide the action from the stream's verdict and run_stream's runs under way."""
        from airflow.sdk import get_current_context

        from velocity_airflow.hooks import VelocityHook
        from velocity_airflow.plans import StreamAction, decide_stream_action

        health = VelocityHook().stream_status(stale_seconds=params["stale_seconds"])
        ti = get_current_context()["ti"]
        active = ti.get_dr_count(dag_id="run_stream", states=["queued", "running"])
        action = decide_stream_action(health, active_runs=active)
        print(
            f"stream {health.verdict}: {health.reason} -> {action.value} "
            f"(run_stream runs queued or running: {active})"
        )
        if action is StreamAction.RESTART:
            return ["restart_stream"]
        if action is StreamAction.STOP_AND_RESTART:
            return ["stop_stalled", "restart_stream"]
        return ["nothing_to_do"]

    @task
    def stop_stalled() -> None:
        """Stop a stream that is alive but no longer advancing: gracefully if it still can,
        else SIGKILL after 60 s (its checkpoint makes the restart exactly once)."""
        from velocity.errors import VelocityError
        from velocity_airflow.hooks import VelocityHook

        result = VelocityHook().stream_stop(60, reason="Airflow check_stream: stalled", force=True)
        if result.returncode != 0:
            raise VelocityError(
                f"the stalled stream could not be stopped: {result.stderr.strip()}; stop it "
                "where it runs (`velocity stream-status` shows pid and host), then the next "
                "check restarts it"
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
