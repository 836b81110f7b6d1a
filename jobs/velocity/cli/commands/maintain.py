"""`velocity maintain compact|optimize|vacuum|evict|reconcile`: the upkeep of the live
tables and the Redis mirror."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from velocity.cli.shared import EXIT_FAILURE, EXIT_OK, settings_from, spark_session


def maintain(args: argparse.Namespace) -> int:
    """The step the subcommand names (``args.step``)."""
    from velocity.spark import maintenance

    settings = settings_from(args)
    spark = spark_session(settings, f"velocity-maintain-{args.step}")
    result: Any
    match args.step:
        case "compact":
            result = asdict(maintenance.compact_buckets(spark, settings))
        case "optimize":
            result = {k: asdict(v) for k, v in maintenance.optimize_tables(spark, settings).items()}
        case "vacuum":
            tables_done = maintenance.vacuum_tables(spark, settings, args.retention_hours)
            result = {k: asdict(v) for k, v in tables_done.items()}
        case "evict":
            result = asdict(maintenance.evict_state(spark, settings))
        case _:
            summary = maintenance.reconcile_state(spark, settings, args.repair)
            print(json.dumps(asdict(summary)))
            return EXIT_OK if summary.clean_after else EXIT_FAILURE
    print(json.dumps({"step": args.step, **result}))
    return EXIT_OK
