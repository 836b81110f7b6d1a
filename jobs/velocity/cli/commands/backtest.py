"""`velocity backtest`: the complete-data alerts of rules over a file or folder of events,
on Spark."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from velocity.cli.shared import EXIT_OK, read_rules_file, rule_store, settings_from, spark_session
from velocity.domain.rule_changes import RuleBook, plan_changes
from velocity.errors import UsageError


def backtest(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    if args.rules:
        # Versioned as if applied to an empty rules table: a rule and its SHADOW candidate
        # in one file get versions 1 and 2, as the store would give them.
        rules = RuleBook.of(plan_changes(RuleBook(), read_rules_file(args.rules))[0]).in_force()
    else:
        rules = rule_store(settings).in_force()
    if not Path(args.events).exists():
        raise UsageError(
            f"--events {args.events!r} does not exist; give a JSON-lines file or folder"
        )
    from velocity.operating.progress import Progress
    from velocity.spark.backtest import run_backtest

    spark = spark_session(settings, "velocity-backtest")
    with Progress() as progress:
        summary = run_backtest(
            spark,
            settings,
            rules,
            str(Path(args.events).resolve()),
            Path(args.out),
            progress=progress,
            keep_state=args.keep_state,
        )
    print(
        f"backtest: {summary.lines} lines, {summary.accepted} accepted, "
        f"{summary.quarantined} quarantined, {summary.duplicates} duplicates dropped"
    )
    if summary.quarantine_reasons:
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(summary.quarantine_reasons.items()))
        print(f"quarantine reasons: {reasons}")
    if summary.kept_state:
        per_bucket = summary.bucket_bytes / summary.buckets if summary.buckets else 0.0
        print(
            f"buckets: {summary.buckets} ({summary.bucket_bytes} bytes in Delta, "
            f"{per_bucket:.1f} bytes per bucket)"
        )
    print(f"alerts: {summary.alerts}")
    for rule_id, count in summary.alerts_by_rule.items():
        print(f"  rule {rule_id}: {count} alerts")
    print(f"alerts file: {summary.alerts_file}")
    print(f"delta tables: {summary.tables_dir}")
    print(f"took {summary.seconds:.1f} s")
    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps(asdict(summary), indent=2) + "\n")
    return EXIT_OK
