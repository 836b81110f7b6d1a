"""`velocity quality check`: the data-quality suites on the live tables."""

from __future__ import annotations

import argparse

from velocity.cli.shared import EXIT_FAILURE, EXIT_OK, settings_from, spark_session


def check(args: argparse.Namespace) -> int:
    """Exit 0 when every expectation passed, 1 when any failed; results are kept either way."""
    from velocity.quality import format_summary, run_quality_checks

    settings = settings_from(args)
    report = run_quality_checks(
        spark_session(settings, "velocity-quality"), settings, args.suite or ["all"], args.run_id
    )
    print(format_summary(report))
    return EXIT_OK if report.success else EXIT_FAILURE
