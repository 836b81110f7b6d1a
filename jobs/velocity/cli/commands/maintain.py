"""`velocity maintain compact|optimize|vacuum|evict|reconcile|all`: the upkeep of the live
tables and the Redis mirror."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any, Final

from velocity.cli.shared import EXIT_FAILURE, EXIT_OK, settings_from, spark_session

# The order `maintain all` (and so the maintain_state DAG) runs the steps in: compact sealed
# minute buckets first so OPTIMIZE rewrites fewer files, VACUUM what both left behind, then
# evict and reconcile Redis against the compacted Delta state.
MAINTENANCE_ORDER: Final = ("compact", "optimize", "vacuum", "evict", "reconcile")


def maintain(args: argparse.Namespace) -> int:
    """The step the subcommand names (``args.step``), or every step in one Spark session
    (``all``: one JVM and session instead of five, a quarter of a minute each on two
    cores)."""
    from velocity.spark import maintenance

    settings = settings_from(args)
    spark = spark_session(settings, f"velocity-maintain-{args.step}")

    def step(name: str) -> tuple[dict[str, Any], bool]:
        """The step's summary and whether it left things clean (only reconcile may not)."""
        match name:
            case "compact":
                return asdict(maintenance.compact_buckets(spark, settings)), True
            case "optimize":
                done = maintenance.optimize_tables(spark, settings)
                return {k: asdict(v) for k, v in done.items()}, True
            case "vacuum":
                done = maintenance.vacuum_tables(spark, settings, args.retention_hours)
                return {k: asdict(v) for k, v in done.items()}, True
            case "evict":
                return asdict(maintenance.evict_state(spark, settings)), True
            case _:
                summary = maintenance.reconcile_state(spark, settings, args.repair)
                return asdict(summary), summary.clean_after

    if args.step == "all":
        steps, clean = {}, True
        for name in MAINTENANCE_ORDER:
            steps[name], ok = step(name)
            clean = clean and ok
        print(json.dumps({"step": "all", "steps": steps}))
        return EXIT_OK if clean else EXIT_FAILURE
    result, clean = step(args.step)
    if args.step == "reconcile":  # its summary as it always was: no "step" field
        print(json.dumps(result))
    else:
        print(json.dumps({"step": args.step, **result}))
    return EXIT_OK if clean else EXIT_FAILURE
