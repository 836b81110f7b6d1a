"""Running the streaming job in tests: over what is in a folder, then stopped."""

from __future__ import annotations

from pathlib import Path

from velocity.spark.stream import StreamJob


def run_available_now(job: StreamJob, events: Path, files_per_batch: int | None = 1) -> int:
    """Process what is in ``events`` and stop (raising if the query failed); returns the
    number of micro-batches that had lines."""
    query = job.start(events, available_now=True, max_files_per_trigger=files_per_batch)
    try:
        query.awaitTermination()
    finally:
        query.stop()
    return len([p for p in query.recentProgress if p["numInputRows"] > 0])
