"""Backtest throughput benchmark (not a test): `make bench` or `python -m benchmarks.backtest`.

Generates N events once (cached by their options), then runs `velocity backtest`
as a fresh process over them with the 8 sample rules and prints:
- end-to-end events/s (the whole process: interpreter, JVM and Spark start-up, all writes),
- events/s excluding Spark start-up (the backtest itself, as the job's summary times it),
- Delta bytes per bucket (the buckets table's snapshot size over its row count).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000, help="distinct payers")
    parser.add_argument("--rate", type=float, default=20.0, help="events per second of event time")
    parser.add_argument("--bucket-seconds", type=int, default=60)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--work-dir", default=str(ROOT / "data" / "bench"))
    args = parser.parse_args()

    work = Path(args.work_dir)
    tag = f"{args.events}-{args.keys}-{args.rate}"
    events_dir = work / f"events-{tag}"
    velocity = str(Path(sys.executable).parent / "velocity")
    if not (events_dir / ".complete").exists():
        shutil.rmtree(events_dir, ignore_errors=True)
        started = time.monotonic()
        subprocess.run(
            [
                velocity,
                "generate",
                "--out",
                str(events_dir),
                "--events",
                str(args.events),
                "--keys",
                str(args.keys),
                "--rate",
                str(args.rate),
                "--files",
                "8",
                "--spike-fraction",
                "0.01",
                "--duplicate-fraction",
                "0.002",
                "--malformed-fraction",
                "0.002",
                "--seed",
                "1",
            ],
            check=True,
        )
        (events_dir / ".complete").write_text("")
        print(f"generated {args.events} events in {time.monotonic() - started:.1f} s")

    rules = ROOT / "jobs" / "velocity" / "resources" / "sample_rules.json"
    rows = []
    for run in range(args.runs):
        data_dir = work / "data"
        shutil.rmtree(data_dir, ignore_errors=True)
        summary_file = work / "summary.json"
        env = {**os.environ, "VELOCITY_DATA_DIR": str(data_dir)}
        started = time.monotonic()
        subprocess.run(
            [
                velocity,
                "backtest",
                "--rules",
                str(rules),
                "--events",
                str(events_dir),
                "--out",
                str(work / "alerts.jsonl"),
                "--bucket-seconds",
                str(args.bucket_seconds),
                "--summary-json",
                str(summary_file),
            ],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )
        wall = time.monotonic() - started
        summary = json.loads(summary_file.read_text())
        rows.append((wall, summary))
        print(f"run {run + 1}: {wall:.1f} s end to end, {summary['seconds']:.1f} s backtest")

    wall, summary = sorted(rows, key=lambda r: r[0])[len(rows) // 2]
    lines = summary["lines"]
    print()
    print(f"events (lines)            {lines}")
    print(f"accepted / quarantined    {summary['accepted']} / {summary['quarantined']}")
    print(f"rules / alerts            8 / {summary['alerts']}")
    print(f"end to end                {wall:.1f} s  {lines / wall:,.0f} events/s")
    print(
        f"excluding Spark start-up  {summary['seconds']:.1f} s  "
        f"{lines / summary['seconds']:,.0f} events/s"
    )
    print(
        f"buckets                   {summary['buckets']}  "
        f"{summary['bucket_bytes'] / max(summary['buckets'], 1):.1f} Delta bytes per bucket"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
