"""Every `make bench*` target at its smoke size (``benchmarks.smoke``), one test a target,
so CI names the benchmark that broke. The smoke runs once for the session as its own
process (its shared Spark session must not be this process's test session);
bench-cluster runs on the suite's standalone cluster (the ``spark_cluster`` fixture that
tests/cluster starts anyway), so the cluster starts once."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from benchmarks import smoke

from tests.conftest import SparkCluster

ROOT = Path(__file__).resolve().parents[2]
ON_OWN_PROCESS = [t for t in smoke.TARGETS if t != "bench-cluster"]


def run_smoke(work: Path, *args: str) -> dict[str, dict[str, Any]]:
    """``python -m benchmarks.smoke`` with ``args``: its verdicts by target."""
    report = work / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.smoke", "--work-dir", str(work / "work"),
         "--report", str(report), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=1500, check=False,
    )  # fmt: skip
    print(done.stdout[-6000:])  # the table, shown by pytest on a failure
    if not report.exists():
        pytest.fail(f"benchmarks.smoke wrote no report (exit {done.returncode}): {done.stderr}")
    return {v["target"]: v for v in json.loads(report.read_text())["targets"]}


@pytest.fixture(scope="session")
def smoke_verdicts(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    """The verdicts of the targets this session's selected tests ask for (``-k check``: only
    bench-check's smoke runs), every target's but bench-cluster's when all are selected."""
    selected = sorted(
        item.callspec.params["target"]
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.originalname == test_benchmark_runs_and_its_figures_hold_their_shape.__name__
    )
    only = [arg for target in selected for arg in ("--only", target)]
    everything = set(selected) == set(ON_OWN_PROCESS)
    args = ["--skip", "bench-cluster"] if everything or not only else only
    return run_smoke(tmp_path_factory.mktemp("bench-smoke"), *args)


def held(verdict: dict[str, Any]) -> None:
    if verdict["verdict"] == "skipped":
        pytest.skip(f"{verdict['target']}: {'; '.join(verdict['problems'])}")
    log = Path(verdict["log"])
    tail = "\n".join(log.read_text().splitlines()[-40:]) if log.exists() else ""
    assert verdict["verdict"] == "ok", "\n".join([*verdict["problems"], tail])


@pytest.mark.spark
@pytest.mark.redis
@pytest.mark.timeout(1500)  # the whole smoke runs in the first test's time
@pytest.mark.parametrize("target", ON_OWN_PROCESS)
def test_benchmark_runs_and_its_figures_hold_their_shape(
    target: str, smoke_verdicts: dict[str, dict[str, Any]]
) -> None:
    assert target in smoke_verdicts, f"benchmarks.smoke did not run {target}"
    held(smoke_verdicts[target])


@pytest.mark.cluster
@pytest.mark.spark
@pytest.mark.timeout(600)
def test_bench_cluster_on_the_suites_cluster(spark_cluster: SparkCluster, tmp_path: Path) -> None:
    verdicts = run_smoke(
        tmp_path, "--only", "bench-cluster", "--cluster-master", spark_cluster.master
    )
    held(verdicts["bench-cluster"])


def test_the_smoke_runs_every_bench_target_of_the_makefile() -> None:
    """A bench target added to the Makefile without a smoke size fails here."""
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^(bench[a-z-]*):", makefile, re.MULTILINE)) - {"bench-smoke"}
    assert targets == set(smoke.TARGETS)
    assert "benchmarks.smoke" in makefile
