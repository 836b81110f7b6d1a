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


def test_a_process_that_is_gone_keeps_nothing() -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    assert run_ahead(child.pid, -5).startswith("niceness unchanged")
