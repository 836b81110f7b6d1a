"""SpawnedWorkers: real spawned processes (standard library work, nothing mocked)."""

from __future__ import annotations

import operator
import os
import signal
import time
from pathlib import Path

import pytest

from velocity.operating.local_process import SpawnedWorkers


def kill_worker(pid: int) -> None:
    """SIGKILL one of the pool's processes and wait until it has died, without reaping it:
    the pool's own thread must (a pool whose dead worker someone else reaped never sees it
    go, and its thread spins on it until the interpreter's exit, which then hangs)."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return  # reaped by the pool already
        if state == "Z":
            return
        time.sleep(0.01)
    raise AssertionError(f"worker {pid} did not die within 30 s of SIGKILL")


@pytest.mark.timeout(120)
def test_work_runs_in_kept_processes_and_again_in_new_ones_when_one_died(
    caplog: pytest.LogCaptureFixture,
) -> None:
    workers = SpawnedWorkers("operator")
    workers.start(2)
    first = workers.pids()
    assert len(first) == 2 and os.getpid() not in first

    sums = workers.run(operator.add, [1, 2, 3], [10, 20, 30], workers=2, what="adding")
    assert sums == [11, 22, 33]
    assert workers.pids() == first, "kept for the next call"

    kill_worker(first[0])
    assert workers.run(operator.mul, [2, 3], [5, 7], workers=2, what="multiplying") == [10, 21]
    assert "a process multiplying died: running it again in a new one" in caplog.text
    assert len(workers.pids()) == 2 and not set(workers.pids()) & set(first)

    # More workers asked than kept: a larger set replaces them.
    assert workers.run(operator.neg, [1, 2, 3], workers=3, what="negating") == [-1, -2, -3]
    assert len(workers.pids()) == 3
