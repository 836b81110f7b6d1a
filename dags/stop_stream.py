"""Stop the streaming job on request.

What: records the stop request (so check_stream does not restart the stream), asks the
running stream to stop gracefully (`velocity stream-stop`: it finishes its micro-batch
and exits), and waits until no stream process is left. The run_stream run then ends
successfully. Starting run_stream again clears the request.
Why: a stop from the UI, next to the start and the health check, instead of killing
a Spark driver by hand mid-batch.
Needs: the ``velocity_default`` connection (data dir).
"""

from __future__ import annotations

from airflow.sdk import dag, task


@dag(schedule=None, catchup=False, tags=["velocity", "stream"])
def stop_stream() -> None:
    @task
    def request_stop() -> None:
        """Record the request before stopping, so a check in between cannot restart it."""
        from airflow.sdk import Variable, get_current_context

        from velocity_airflow import STOP_REQUESTED_VARIABLE

        Variable.set(
            STOP_REQUESTED_VARIABLE,
            get_current_context()["run_id"],
            description="set by stop_stream, cleared by run_stream: check_stream leaves it stopped",
        )

    @task
    def stop() -> None:
        """Ask the stream to stop and wait until it has; a stream that is not running is fine."""
        from velocity.errors import VelocityError
        from velocity_airflow.hooks import VelocityHook

        hook = VelocityHook()
        result = hook.stream_stop()
        if not hook.wait_stream_stopped():
            raise VelocityError(
                f"the stream is still running 120 s after `velocity stream-stop` "
                f"(exit {result.returncode}); see `velocity stream-status`, then stop its "
                "process by hand"
            )
        print("stream stopped" if result.returncode == 0 else "no stream was running")

    request_stop() >> stop()


stop_stream()
