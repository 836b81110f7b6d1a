"""`velocity backfill`: replay a time range, or the late events no backfill covered, and
emit CORRECTION / RETRACTION alerts (SPEC §3)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from velocity.cli.shared import EXIT_OK, settings_from, spark_session
from velocity.errors import UsageError


def _rule_ids(text: str | None) -> list[int] | None:
    """``--rules 1,2,3`` as ids; None when not given."""
    if not text:
        return None
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise UsageError(f"--rules {text!r}: give rule ids separated by commas, e.g. 1,4") from exc
    if not ids or any(i <= 0 for i in ids):
        raise UsageError(f"--rules {text!r}: rule ids are positive integers, e.g. 1,4")
    return ids


def backfill(args: argparse.Namespace) -> int:
    from velocity.spark.backfill import Backfill

    settings = settings_from(args)
    if args.late == (args.from_ms is not None or args.to_ms is not None):
        raise UsageError("give either --from MS --to MS, or --late (the uncovered late events)")
    if not args.late and (args.from_ms is None or args.to_ms is None):
        raise UsageError("--from and --to go together: give both (epoch ms)")
    job = Backfill(spark_session(settings, "velocity-backfill"), settings)
    from velocity.operating.progress import Progress

    with Progress() as progress:
        options: dict[str, Any] = {"progress": progress, "airflow_run_id": args.airflow_run}
        if args.late:
            summary = job.run_late(_rule_ids(args.rules), **options)
        else:
            summary = job.run(args.from_ms, args.to_ms, _rule_ids(args.rules), **options)
    if summary is None:
        message = "no late or out-of-order events to backfill"
        print(json.dumps({"late_events": 0, "out_of_order_events": 0, "message": message}))
        return EXIT_OK
    print(json.dumps(summary.to_json()))
    return EXIT_OK
