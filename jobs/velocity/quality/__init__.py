"""Data quality: great-expectations suites on the live tables (events, quarantine rate,
buckets against a recount of the raw events, alerts against their rules).

``run_quality_checks(spark, settings, suites=...)`` runs them and keeps every result;
``format_summary`` renders its report for people. Importing this package imports
neither Spark nor GX (``run_quality_checks`` is loaded on first use).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from velocity.quality.report import SUITE_NAMES, QualityReport, format_summary

if TYPE_CHECKING:
    from velocity.quality.run import run_quality_checks

__all__ = ["SUITE_NAMES", "QualityReport", "format_summary", "run_quality_checks"]


def __getattr__(name: str) -> object:
    if name == "run_quality_checks":
        from velocity.quality.run import run_quality_checks

        return run_quality_checks
    raise AttributeError(f"module 'velocity.quality' has no attribute {name!r}")
