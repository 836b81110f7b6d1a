"""Long, self-contained runs started as processes of their own once the session's tests are
collected, beside the suite: pytest, one process, mostly leaves the second core idle while
it waits for JVMs and services, and these runs (the bench smoke, the short soak) take it
instead of minutes of the suite's own. One at a time, in the order started (each waits for
the one before it to end), so the suite shares its two cores with one of them at most, and
at a lower priority (nice 10; 19 could starve the soak's page probes past their 30 s): a
fresh clone's suite took 5 minutes longer with the short soak beside it at the suite's own
priority (40:18 against 34:54), the soak taking CPU the suite's JVMs were waiting for, not
only what the suite left idle.
Their tests run last (``tests/conftest.py`` orders them) and only read how they ended.

Each run's services take ports of their own (ranges no test fixture draws from:
``tests/conftest.py`` lists them)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The runs started for this session, by name ("smoke", "soak").
BACKGROUND = pytest.StashKey[dict[str, "BackgroundRun"]]()
SMOKE_TEST = "test_benchmark_runs_and_its_figures_hold_their_shape"
SOAK_TEST = "test_every_fault_together_for_a_short_soak"
DEMO_TEST = "test_demo_exits_zero_on_ports_of_its_own"
# The suite's soak (`make soak` is the long one): 3 minutes of 70 payments/s over 2,000
# payers, each fault kind once, 5 s apart; Redis restarted while the stream is down after
# its SIGKILL, so one restart of the stream serves both faults. Three minutes, not one:
# each fault is waited out before the next, and in the suite (two cores shared) a minute
# ran out before the last faults struck, which then found nothing to break.
SHORT_SOAK = ("--minutes", "3", "--rate", "70", "--keys", "2000", "--each", "1", "--gap", "5",
              "--redis-with-sigkill")  # fmt: skip


BACKGROUND_TESTS = (SMOKE_TEST, SOAK_TEST, DEMO_TEST)


def is_background_test(item: pytest.Item) -> bool:
    """A test that reads how a run beside the suite ended."""
    return isinstance(item, pytest.Function) and item.originalname in BACKGROUND_TESTS


def selected(items: list[pytest.Item], test: str) -> bool:
    return any(isinstance(i, pytest.Function) and i.originalname == test for i in items)


def run_of(
    request: pytest.FixtureRequest,
    name: str,
    start: Callable[[list[pytest.Item], BackgroundRun | None], BackgroundRun | None],
) -> BackgroundRun:
    """The run ``name`` started beside the suite for this session, or, when its test was
    collected some other way, ``start`` now."""
    runs = request.config.stash.setdefault(BACKGROUND, {})
    if name not in runs:
        started = start([request.node], None)
        assert started is not None
        runs[name] = started
    return runs[name]


def start_soak(items: list[pytest.Item], after: BackgroundRun | None) -> BackgroundRun | None:
    """The short soak (once ``after`` has ended), or None when its test is not selected."""
    if not selected(items, SOAK_TEST):
        return None
    command = [sys.executable, "-m", "tools.soak", *SHORT_SOAK, "--work-dir", "{folder}/work"]
    return BackgroundRun("soak", command, after)


def start_demo(items: list[pytest.Item], after: BackgroundRun | None) -> BackgroundRun | None:
    """The shortened demo (``tests/integration/demo_run.py``, once ``after`` has ended), or
    None when its test is not selected."""
    if not selected(items, DEMO_TEST):
        return None
    return BackgroundRun(
        "demo", [sys.executable, "-m", "tests.integration.demo_run", "{folder}"], after
    )


class BackgroundRun:
    """``command`` run in a folder of its own (``folder``, its output in ``log``) once
    ``after`` (if any) has ended."""

    def __init__(self, name: str, command: list[str], after: BackgroundRun | None = None):
        self.name = name
        self.folder = Path(tempfile.mkdtemp(prefix=f"velocity-{name}-"))
        self.command = [part.replace("{folder}", str(self.folder)) for part in command]
        self.after = after
        # The environment as collected: tests set variables of their own later (FAST_JVM's
        # JAVA_TOOL_OPTIONS, which a Kafka broker refuses), and a run starts when the one
        # before it ends, in the middle of the suite.
        self.env = dict(os.environ)
        self.process: subprocess.Popen[bytes] | None = None
        self.created = time.monotonic()
        self.ran: tuple[float, float] | None = None  # (started, ended), monotonic
        self.cancelled = threading.Event()
        self.lock = threading.Lock()
        self.starter = threading.Thread(target=self._start, name=f"start-{name}", daemon=True)
        self.starter.start()

    @property
    def log(self) -> Path:
        return self.folder / f"{self.name}.log"

    def _start(self) -> None:
        if self.after is not None:
            self.after.ended()
        with self.lock:
            if self.cancelled.is_set():
                return
            with self.log.open("wb") as log:
                self.process = subprocess.Popen(
                    ["nice", "-n", "10", *self.command], cwd=ROOT, env=self.env, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
        started = time.monotonic()
        self.process.wait()
        self.ran = (started, time.monotonic())

    def ended(self) -> None:
        """Returns once the run has ended (or never started)."""
        self.starter.join()
        if self.process is not None:
            self.process.wait()

    def wait(self, timeout: float) -> int:
        """Its exit code, once it has ended (waits at most ``timeout`` s, its wait for the
        run before it included); fails the test after that."""
        deadline = time.monotonic() + timeout
        self.starter.join(timeout)
        try:
            if self.process is None:
                raise subprocess.TimeoutExpired(self.command, timeout)
            return self.process.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"{self.name} did not finish within {timeout:g} s: {self.log}")

    def timing(self, since: float) -> str:
        """When it started and how long it ran, for the suite's summary."""
        if self.ran is None:
            return f"{self.name}: did not run to its end"
        started, ended = self.ran
        return (
            f"{self.name}: started {started - since:.0f} s after collection, "
            f"ran {ended - started:.0f} s, ended {ended - since:.0f} s after collection"
        )

    def tail(self, chars: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def stop(self) -> None:
        with self.lock:  # not started from here on, or started and then killed
            self.cancelled.set()
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)
