"""A Spark step's events done, read from Spark's status tracker while the step runs: the
share of finished tasks in the active jobs' stages, times the step's events."""

from __future__ import annotations

import threading
from types import TracebackType

from pyspark.sql import SparkSession

from velocity.operating.progress import Progress


def finished_share(spark: SparkSession) -> float | None:
    """Finished tasks over all tasks of the active jobs' submitted stages; None when no
    job runs."""
    tracker = spark.sparkContext.statusTracker()
    done = total = 0
    for job_id in tracker.getActiveJobsIds():
        job = tracker.getJobInfo(job_id)
        for stage_id in job.stageIds if job else ():
            stage = tracker.getStageInfo(stage_id)
            if stage is not None:
                done += stage.numCompletedTasks
                total += stage.numTasks
    return done / total if total else None


class SparkProgress:
    """While open, moves ``progress``'s step with the running Spark jobs (every
    ``interval`` seconds, on a daemon thread). Does nothing when ``progress`` is disabled."""

    def __init__(self, spark: SparkSession, progress: Progress, interval: float = 0.5) -> None:
        self.spark = spark
        self.progress = progress
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> SparkProgress:
        if self.progress.enabled:
            self._thread = threading.Thread(target=self._poll, name="spark-progress", daemon=True)
            self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            share, total = finished_share(self.spark), self.progress.total
            if share is not None and total:
                self.progress.update(int(share * total))

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
