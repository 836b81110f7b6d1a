"""Every `make bench*` target at its smoke size (``benchmarks.smoke``), one test a target,
so CI names the benchmark that broke. The smoke runs once for the session as its own
process, beside the suite from the end of collection (``tests/bench/background.py``),
bench-cluster too, on a standalone cluster the smoke starts: beside the suite it costs the
suite nothing, where on the suite's own cluster it took 73-77 s of the suite's time."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from benchmarks import smoke

from tests.background import run_of
from tests.bench.background import ROOT, BackgroundSmoke


@pytest.fixture(scope="session")
def smoke_verdicts(request: pytest.FixtureRequest) -> dict[str, dict[str, Any]]:
    """The verdicts of the smoke that ran beside the suite since its tests were collected
    (``tests/bench/background.py``: the targets the selected tests ask for)."""
    # Collected some other way: the smoke of every selected target of it, now.
    smoke = run_of(request, "smoke", lambda _, __: BackgroundSmoke.start(request.session.items))
    assert isinstance(smoke, BackgroundSmoke)
    return smoke.verdicts(timeout=1500)


def held(verdict: dict[str, Any]) -> None:
    if verdict["verdict"] == "skipped":
        pytest.skip(f"{verdict['target']}: {'; '.join(verdict['problems'])}")
    log = Path(verdict["log"])
    tail = "\n".join(log.read_text().splitlines()[-40:]) if log.exists() else ""
    assert verdict["verdict"] == "ok", "\n".join([*verdict["problems"], tail])


@pytest.mark.spark
@pytest.mark.redis
@pytest.mark.timeout(1500)  # the whole smoke runs in the first test's time
@pytest.mark.parametrize("target", smoke.TARGETS)
def test_benchmark_runs_and_its_figures_hold_their_shape(
    target: str, smoke_verdicts: dict[str, dict[str, Any]]
) -> None:
    assert target in smoke_verdicts, f"benchmarks.smoke did not run {target}"
    held(smoke_verdicts[target])


def test_the_smoke_runs_every_bench_target_of_the_makefile() -> None:
    """A bench target added to the Makefile without a smoke size fails here."""
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^(bench[a-z-]*):", makefile, re.MULTILINE)) - {"bench-smoke"}
    assert targets == set(smoke.TARGETS)
    assert "benchmarks.smoke" in makefile
