"""``run_ahead``: a server's callers wait for it, so it gets the priority it is given,
never a lower one, and says what it has."""

from __future__ import annotations

import os
import subprocess

import pytest

from velocity.operating.local_process import run_ahead

pytestmark = pytest.mark.timeout(30)


def test_a_process_gets_the_higher_priority_and_keeps_a_higher_one() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        if os.geteuid() == 0:
            assert run_ahead(child.pid, -5) == "nice -5"
            assert os.getpriority(os.PRIO_PROCESS, child.pid) == -5
        else:
            assert "needs root or CAP_SYS_NICE" in run_ahead(child.pid, -5)
        # A lower priority than the process has is never given.
        before = os.getpriority(os.PRIO_PROCESS, child.pid)
        assert run_ahead(child.pid, before + 3) == f"nice {before}"
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == before
    finally:
        child.kill()
        child.wait()


def test_real_time_is_round_robin_and_its_children_start_at_the_normal_policy() -> None:
    # A shell that forks a child of its own once told to: Redis's AOF rewrite, for one.
    child = subprocess.Popen(
        ["sh", "-c", "read go; sleep 30 & echo $!; wait"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        said = run_ahead(child.pid, -5, 7)
        if os.geteuid() != 0:
            assert "needs root or CAP_SYS_NICE" in said
            return
        assert said == "real-time 7, nice -5"
        assert os.sched_getscheduler(child.pid) == os.SCHED_RR | os.SCHED_RESET_ON_FORK
        assert os.sched_getparam(child.pid).sched_priority == 7
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        grandchild = int(child.stdout.readline())
        assert os.sched_getscheduler(grandchild) == os.SCHED_OTHER
        assert os.getpriority(os.PRIO_PROCESS, grandchild) == 0
        os.kill(grandchild, 9)
    finally:
        child.kill()
        child.wait()


def test_a_process_that_is_gone_keeps_nothing() -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    assert run_ahead(child.pid, -5).startswith("niceness unchanged")
