"""The bench smoke (``benchmarks.smoke``) started as soon as the session's tests are
collected, as a process of its own beside the suite (``tests/background.py``): its JVM
starts and small runs (about four minutes) take the core that pytest, one process, mostly
leaves idle. Its tests run last and only read its verdicts.

Its Spark session is its own (never this process's test session), and its services take
ports of their own (``benchmarks.smoke.free_port``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from benchmarks import smoke

from tests.background import SMOKE_TEST, BackgroundRun

ROOT = Path(__file__).resolve().parents[2]


def is_smoke_test(item: pytest.Item) -> bool:
    return isinstance(item, pytest.Function) and item.originalname == SMOKE_TEST


def smoke_command(work: Path, report: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.smoke", "--work-dir", str(work),
            "--report", str(report), *args]  # fmt: skip


def verdicts_of(report: Path) -> dict[str, dict[str, Any]]:
    return {v["target"]: v for v in json.loads(report.read_text())["targets"]}


class BackgroundSmoke(BackgroundRun):
    """The smoke running beside the suite (``tests/background.py``)."""

    @property
    def report(self) -> Path:
        return self.folder / "report.json"

    @classmethod
    def start(cls, items: list[pytest.Item]) -> BackgroundSmoke | None:
        """The smoke of the targets the selected tests ask for (``-k check``: bench-check
        only; all selected: every target, bench-cluster on a standalone cluster of its
        own), or None when none is."""
        selected = sorted(item.callspec.params["target"] for item in items if is_smoke_test(item))
        if not selected:
            return None
        everything = set(selected) == set(smoke.TARGETS)
        args = [] if everything else [arg for target in selected for arg in ("--only", target)]
        return cls(
            "smoke", smoke_command(Path("{folder}/work"), Path("{folder}/report.json"), *args)
        )

    def verdicts(self, timeout: float) -> dict[str, dict[str, Any]]:
        """Its verdicts by target, once it has finished (waits at most ``timeout`` s)."""
        code = self.wait(timeout)
        print(self.tail())  # the table, shown on a failure
        if not self.report.exists():
            pytest.fail(f"benchmarks.smoke wrote no report (exit {code}): see {self.log}")
        return verdicts_of(self.report)
