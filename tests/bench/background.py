"""The bench smoke (``benchmarks.smoke``) started as soon as the session's tests are
collected, as a process of its own beside the suite: its JVM starts and small runs (about
four minutes) take the core that pytest, one process, mostly leaves idle, instead of
four minutes of the suite's own. Its tests run last (``tests/conftest.py`` orders them)
and only read its verdicts.

Its Spark session is its own (never this process's test session), and its services take
ports of their own (``benchmarks.smoke.free_port``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from benchmarks import smoke

ROOT = Path(__file__).resolve().parents[2]
SMOKE_TEST = "test_benchmark_runs_and_its_figures_hold_their_shape"
# Every target but bench-cluster, which runs on the suite's own cluster (tests/cluster).
ON_OWN_PROCESS = [t for t in smoke.TARGETS if t != "bench-cluster"]
STARTED = pytest.StashKey["BackgroundSmoke"]()


def is_smoke_test(item: pytest.Item) -> bool:
    return isinstance(item, pytest.Function) and item.originalname == SMOKE_TEST


def smoke_command(work: Path, report: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.smoke", "--work-dir", str(work),
            "--report", str(report), *args]  # fmt: skip


def verdicts_of(report: Path) -> dict[str, dict[str, Any]]:
    return {v["target"]: v for v in json.loads(report.read_text())["targets"]}


@dataclass
class BackgroundSmoke:
    """The smoke running beside the suite, its output in ``log``."""

    folder: Path
    process: subprocess.Popen[bytes]

    @property
    def report(self) -> Path:
        return self.folder / "report.json"

    @property
    def log(self) -> Path:
        return self.folder / "smoke.log"

    @classmethod
    def start(cls, items: list[pytest.Item]) -> BackgroundSmoke | None:
        """The smoke of the targets the selected tests ask for (``-k check``: bench-check
        only; all selected: every target but bench-cluster), or None when none is."""
        selected = sorted(item.callspec.params["target"] for item in items if is_smoke_test(item))
        if not selected:
            return None
        everything = set(selected) == set(ON_OWN_PROCESS)
        args = ["--skip", "bench-cluster"] if everything else [
            arg for target in selected for arg in ("--only", target)
        ]  # fmt: skip
        folder = Path(tempfile.mkdtemp(prefix="velocity-bench-smoke-"))
        with (folder / "smoke.log").open("wb") as log:
            process = subprocess.Popen(
                smoke_command(folder / "work", folder / "report.json", *args),
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        return cls(folder, process)

    def verdicts(self, timeout: float) -> dict[str, dict[str, Any]]:
        """Its verdicts by target, once it has finished (waits at most ``timeout`` s)."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"benchmarks.smoke did not finish within {timeout:g} s: {self.log}")
        print(self.log.read_text(errors="replace")[-6000:])  # the table, shown on a failure
        if not self.report.exists():
            pytest.fail(f"benchmarks.smoke wrote no report (exit {code}): see {self.log}")
        return verdicts_of(self.report)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)
