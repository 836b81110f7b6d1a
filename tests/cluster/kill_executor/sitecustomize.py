"""Test-only fault injection, loaded by the Python workers of the cluster test's stream
(this folder is put first on their PYTHONPATH by a wrapper interpreter, see
``test_spark_cluster``): the first key-partition task that runs on worker 1's executor
decides and commits its partition, then SIGKILLs that executor's JVM before its result is returned,
as a machine failure would in the middle of a micro-batch. Spark must re-run the task
elsewhere, and the stream must lose and double nothing.

Once per test run (``VELOCITY_TEST_KILL_MARKER``, created exclusively, records the kill).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path


def _parent_of(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[1])


def _install() -> None:
    marker = os.environ.get("VELOCITY_TEST_KILL_MARKER")
    if not marker:
        return
    from pyspark import TaskContext

    import velocity.spark.stream_decide as stream_decide

    decide = stream_decide._run_partition

    def run_partition(*args: object) -> bytes:
        result = decide(*args)  # type: ignore[arg-type]
        context = TaskContext.get()
        if context is None or context.attemptNumber() > 0 or "worker-1" not in Path.cwd().parts:
            return result
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return result
        # This worker's parent is the pyspark daemon; the daemon's is the executor's JVM.
        executor = _parent_of(os.getppid())
        os.write(fd, f"killed executor pid {executor} in stage {context.stageId()}\n".encode())
        os.close(fd)
        os.kill(executor, signal.SIGKILL)
        os._exit(1)  # no result: the task is lost with its executor

    stream_decide._run_partition = run_partition  # type: ignore[assignment]


_install()
