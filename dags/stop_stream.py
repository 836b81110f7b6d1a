"""Stop the streaming job on request.

What: `velocity stream-stop` asks the running stream to stop after its micro-batch in
flight and waits until it has; the run_stream run then ends successfully. A stream
that is not running is fine (nothing to stop). check_stream leaves a stopped stream
stopped; run_stream starts it again.
Why: a stop from the UI, next to the start and the health check, instead of killing
a Spark driver by hand mid-batch.
When: before an upgrade, a Spark or Kafka setting change, or moving the data dir;
run_stream starts it again, resuming from its checkpoint.
Needs: the ``velocity_default`` connection (data dir).
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task


@dag(
    doc_md=__doc__,
    schedule=None,
    catchup=False,
    tags=["velocity", "stream"],
    params={
        "wait_seconds": Param(
            120,
            type="integer",
            minimum=1,
            title="Wait (s)",
            description="How long to wait for the stream to finish its micro-batch and stop.",
        ),
    },
)
def stop_stream() -> None:
    @task
    def stop(params: dict, run_id: str) -> None:
        """Ask the stream to stop and wait; fails when it is still running after the wait."""
        from velocity.errors import VelocityError
        from velocity_airflow.hooks import VelocityHook

        result = VelocityHook().stream_stop(
            params["wait_seconds"], reason=f"Airflow stop_stream {run_id}"
        )
        if result.returncode != 0:
            raise VelocityError(
                f"the stream did not stop within {params['wait_seconds']} s: "
                f"{result.stderr.strip() or result.stdout.strip()}; rerun with a longer wait, "
                "or see `velocity stream-status`"
            )

    stop()


stop_stream()
