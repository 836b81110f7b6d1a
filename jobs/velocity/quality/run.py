"""`velocity quality check`: run the suites on the live tables and keep every result.

Results are kept whether the suites pass or fail: one row per expectation result in
the Delta table ``<data_dir>/tables/quality_results`` and GX's full validation result
per suite in ``<data_dir>/quality/<run_id>/<suite>.json``. A run id names one run;
running again with the same id replaces that run's rows and files, so a retried
scheduled task keeps one copy.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from velocity.delta.rule_store import RuleStore
from velocity.domain.rules import deciding_rules
from velocity.errors import UsageError
from velocity.quality import checks
from velocity.quality.report import SUITE_NAMES, QualityReport, result_rows, suite_outcome
from velocity.settings import Settings

# Safe in a path and in the results table's replaceWhere predicate; allows Airflow run ids
# such as ``scheduled__2026-11-22T00:00:00+00:00``.
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,127}$")
# The tables each suite reads, pinned together under the state lock.
_TABLES = {
    "events": ("events",),
    "quarantine": ("events", "duplicates", "quarantine"),
    "buckets": ("events", "buckets", "signatures"),
    "alerts": ("alerts",),
}


def new_run_id(now_ms: int) -> str:
    """``20261122T110334Z-1a2b3c4d``: sorts by time, unique across concurrent runs."""
    stamp = datetime.fromtimestamp(now_ms / 1000, UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{uuid.uuid4().hex[:8]}"


def suite_names(requested: Iterable[str]) -> list[str]:
    """The suites to run, in ``SUITE_NAMES`` order; ``all`` means every suite."""
    wanted = set(requested)
    unknown = wanted - {*SUITE_NAMES, "all"}
    if unknown:
        raise UsageError(
            f"unknown quality suite(s) {sorted(unknown)}; use all or any of {list(SUITE_NAMES)}"
        )
    if not wanted or "all" in wanted:
        return list(SUITE_NAMES)
    return [name for name in SUITE_NAMES if name in wanted]


def _frames(spark: SparkSession, settings: Settings, names: list[str]) -> dict[str, DataFrame]:
    needed = sorted({table for name in names for table in _TABLES[name]})
    snapshot = checks.pin_snapshot(spark, settings, needed)
    store = RuleStore(snapshot.live.rules)
    frames: dict[str, DataFrame] = {}
    for name in names:
        match name:
            case "events":
                frames[name] = checks.events_frame(snapshot)
            case "quarantine":
                frames[name] = checks.quarantine_frame(snapshot)
            case "buckets":
                rules = deciding_rules(store.in_force())
                frames[name] = checks.buckets_frame(snapshot, rules, settings)
            case "alerts":
                frames[name] = checks.alerts_frame(snapshot, store.history())
    return frames


def run_quality_checks(
    spark: SparkSession,
    settings: Settings,
    suites: Iterable[str] = SUITE_NAMES,
    run_id: str | None = None,
    now_ms: int | None = None,
) -> QualityReport:
    """Run the named suites on one consistent cut of the live tables; keep the results.

    Returns the report whatever the outcome (``report.success`` says whether every
    expectation passed); raises only when a check cannot run at all.
    """
    from velocity.quality import suites as gx_suites  # GX is heavy: import it when used

    names = suite_names(suites)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    run = run_id or new_run_id(now)
    if not _RUN_ID.match(run):
        raise UsageError(
            f"run id {run!r} must be 1-128 letters, digits or _ . : + - "
            "(starting with a letter or digit)"
        )
    frames = _frames(spark, settings, names)
    expectations = {
        name: gx_suites.suite_expectations(name, settings.quality_max_quarantine_rate)
        for name in names
    }
    validations = gx_suites.validate(frames, expectations)

    results_dir = settings.data_dir / "quality" / run
    _write_json(results_dir, validations)
    report = QualityReport(
        run_id=run,
        run_time=now,
        suites=tuple(suite_outcome(name, validations[name]) for name in names),
        results_dir=str(results_dir),
    )
    checks.write_results(spark, settings, run, result_rows(report))
    return report


def _write_json(folder: Path, validations: dict[str, dict[str, object]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, validation in validations.items():
        target = folder / f"{name}.json"
        partial = folder / f".{name}.json.tmp"
        # GX's JSON holds only JSON types, but stay safe for anything it adds (str()).
        partial.write_text(json.dumps(validation, indent=2, default=str) + "\n", encoding="utf-8")
        partial.replace(target)
