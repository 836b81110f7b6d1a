"""Backtest throughput benchmark (not a test): `make bench` or `python -m benchmarks.backtest`.

Generates the events once per size (cached by their options), then runs `velocity
backtest` as a fresh process over 200k and over 1M of them with the 8 sample rules and
prints, per size:
- end-to-end events/s (the whole process: interpreter, JVM and Spark start-up, all writes),
- events/s excluding Spark start-up (the backtest itself, as the job's summary times it),
- the step timings, Delta bytes per bucket, and the peak RSS of the process tree
  (Python driver plus its JVM), sampled every 0.5 s;
and the marginal events/s from 200k to 1M (start-up cancels out). With several
``--master``s, each size runs on each master in turn and the throughput ratios follow.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks import figures as figures_file
from benchmarks.stream import process_tree, rss_mb

ROOT = Path(__file__).resolve().parents[1]
VELOCITY = str(Path(sys.executable).parent / "velocity")


def _events(work: Path, events: int, keys: int, rate: float) -> Path:
    """The generated events of this size, made once."""
    events_dir = work / f"events-{events}-{keys}-{rate}"
    if (events_dir / ".complete").exists():
        return events_dir
    shutil.rmtree(events_dir, ignore_errors=True)
    started = time.monotonic()
    subprocess.run(
        [VELOCITY, "generate", "--out", str(events_dir), "--events", str(events),
         "--keys", str(keys), "--rate", str(rate), "--files", "8",
         "--spike-fraction", "0.01", "--duplicate-fraction", "0.002",
         "--malformed-fraction", "0.002", "--seed", "1"],
        check=True,
    )  # fmt: skip
    (events_dir / ".complete").write_text("")
    print(f"generated {events} events in {time.monotonic() - started:.1f} s")
    return events_dir


SAMPLE_RULES = ROOT / "jobs" / "velocity" / "resources" / "sample_rules.json"


def _backtest(
    work: Path,
    events_dir: Path,
    bucket_seconds: int,
    master: str | None,
    rules: Path = SAMPLE_RULES,
    code: Path | None = None,
    keep_state: bool = False,
) -> tuple[float, dict]:
    """One `velocity backtest` process over ``events_dir``: (wall seconds, its summary with
    the peak RSS of its process tree added). ``code``: another checkout whose ``jobs/``
    runs instead of this one (the design before, side by side in one run)."""
    data_dir = work / "data"
    shutil.rmtree(data_dir, ignore_errors=True)
    summary_file = work / "summary.json"
    started = time.monotonic()
    backtest = subprocess.Popen(
        [sys.executable, "-m", "velocity.cli", "backtest", "--rules", str(rules),
         "--events", str(events_dir),
         "--out", str(work / "alerts.jsonl"), "--bucket-seconds", str(bucket_seconds),
         "--summary-json", str(summary_file),
         *(["--keep-state"] if keep_state else [])],
        env={**os.environ, "VELOCITY_DATA_DIR": str(data_dir),
             **({"VELOCITY_SPARK_MASTER": master} if master else {}),
             **({"PYTHONPATH": str(code / "jobs")} if code else {})},
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    peak = [0.0, 0.0]  # the whole tree, the driver's Python alone

    def sample() -> None:
        while backtest.poll() is None:
            peak[0] = max(peak[0], rss_mb(process_tree(backtest.pid)))
            peak[1] = max(peak[1], rss_mb([backtest.pid]))
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    if backtest.wait() != 0:
        raise subprocess.CalledProcessError(backtest.returncode, backtest.args)
    wall = time.monotonic() - started
    sampler.join()
    summary = json.loads(summary_file.read_text())
    summary["peak_rss_mb"], summary["peak_rss_python_mb"] = peak
    return wall, summary


def _report(wall: float, summary: dict) -> None:
    lines = summary["lines"]
    print(f"events (lines)            {lines}")
    print(f"accepted / quarantined    {summary['accepted']} / {summary['quarantined']}")
    print(f"rules / alerts            {len(summary['alerts_by_rule'])} / {summary['alerts']}")
    print(f"end to end                {wall:.1f} s  {lines / wall:,.0f} events/s")
    print(
        f"excluding Spark start-up  {summary['seconds']:.1f} s  "
        f"{lines / summary['seconds']:,.0f} events/s"
    )
    steps = ", ".join(f"{name} {sec:.1f}" for name, sec in summary["step_seconds"].items())
    print(f"steps (s)                 {steps}")
    if summary.get("kept_state", True):  # a checkout before --keep-state always kept it
        print(
            f"buckets                   {summary['buckets']}  "
            f"{summary['bucket_bytes'] / max(summary['buckets'], 1):.1f} Delta bytes per bucket"
        )
    print(
        f"peak RSS                  {summary['peak_rss_mb']:,.0f} MB "
        f"(the driver's Python {summary['peak_rss_python_mb']:,.0f} MB; "
        "the rest is the JVM and its Python workers)"
    )


def run_figures(master: str | None, size: int, wall: float, summary: dict) -> dict[str, Any]:
    """One run's figures, as ``_report`` prints them."""
    lines = summary["lines"]
    return {
        "master": master or "default",
        "events": size,
        "lines": lines,
        "accepted": summary["accepted"],
        "quarantined": summary["quarantined"],
        "rules": len(summary["alerts_by_rule"]),
        "alerts": summary["alerts"],
        "end_to_end_seconds": round(wall, 2),
        "end_to_end_events_per_s": round(lines / wall),
        "backtest_seconds": round(summary["seconds"], 2),
        "events_per_s_excluding_startup": round(lines / summary["seconds"]),
        "step_seconds": {k: round(v, 2) for k, v in summary["step_seconds"].items()},
        "peak_rss_mb": round(summary["peak_rss_mb"]),
        "peak_rss_python_mb": round(summary["peak_rss_python_mb"]),
        **(
            {"buckets": summary["buckets"], "bucket_bytes": summary["bucket_bytes"]}
            if summary.get("kept_state")
            else {}
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument(
        "--baseline-events",
        type=int,
        default=200_000,
        help="a smaller run for the marginal rate (0: none)",
    )
    parser.add_argument("--keys", type=int, default=100_000, help="distinct payers")
    parser.add_argument("--rate", type=float, default=20.0, help="events per second of event time")
    parser.add_argument("--bucket-seconds", type=int, default=60)
    parser.add_argument("--runs", type=int, default=1, help="runs per size; the median counts")
    parser.add_argument("--work-dir", default=str(ROOT / "data" / "bench"))
    parser.add_argument(
        "--events-dir", help="where the generated events are cached (default: --work-dir)"
    )
    parser.add_argument(
        "--rules",
        type=Path,
        default=SAMPLE_RULES,
        help="rules file (default: the 8 sample rules; benchmarks/rules/fire_often.json: "
        "8 rules that fire on most events, one keyed by the three-valued action)",
    )
    parser.add_argument(
        "--before",
        type=Path,
        help="a checkout of the design before (e.g. a git worktree): each run is paired "
        "with one of its backtest on the same events, and the ratios follow",
    )
    parser.add_argument(
        "--keep-state",
        action="store_true",
        help="run `velocity backtest --keep-state` (events and buckets tables written too; "
        "the bytes per bucket are reported); a --before checkout runs as it is",
    )
    parser.add_argument(
        "--master",
        action="append",
        help="Spark master (VELOCITY_SPARK_MASTER) to run on; repeat to compare masters "
        "side by side, e.g. --master local[2] --master spark://127.0.0.1:7077",
    )
    figures_file.add_option(parser)
    args = parser.parse_args()

    work = Path(args.work_dir)
    sizes = [n for n in (args.baseline_events, args.events) if n]
    masters: list[str | None] = args.master or [None]
    designs: list[Path | None] = [None, args.before] if args.before else [None]
    results: dict[tuple[str | None, int], tuple[float, dict]] = {}
    before: dict[int, tuple[float, dict]] = {}
    for size in sizes:
        events_dir = _events(Path(args.events_dir or work), size, args.keys, args.rate)
        for master in masters:
            runs: dict[Path | None, list[tuple[float, dict]]] = {d: [] for d in designs}
            for run in range(args.runs):
                for code in designs:  # interleaved: the machine's noise hits both alike
                    wall, summary = _backtest(
                        work,
                        events_dir,
                        args.bucket_seconds,
                        master,
                        args.rules,
                        code,
                        args.keep_state and code is None,
                    )
                    runs[code].append((wall, summary))
                    print(
                        f"{size} on {master or 'the default master'}"
                        f"{' (before)' if code else ''}: run {run + 1}: "
                        f"{wall:.1f} s end to end, {summary['seconds']:.1f} s backtest"
                    )
            median = {d: sorted(r, key=lambda x: x[0])[len(r) // 2] for d, r in runs.items()}
            results[master, size] = median[None]
            if args.before and master == masters[0]:
                before[size] = median[args.before]
    figures: dict[str, Any] = {
        "rules": str(args.rules),
        "runs": [run_figures(m, n, *results[m, n]) for m in masters for n in sizes],
    }
    print(f"\nrules: {args.rules}")
    for master in masters:
        if master:
            print(f"\n== master {master}")
        for size in sizes:
            print()
            _report(*results[master, size])
        if len(sizes) == 2:
            (small_wall, small) = results[master, sizes[0]]
            (big_wall, big) = results[master, sizes[1]]
            extra = big["lines"] - small["lines"]
            marginal = figures.setdefault("marginal_events_per_s", {})
            marginal[master or "default"] = {
                "end_to_end": round(extra / (big_wall - small_wall)),
                "excluding_startup": round(extra / (big["seconds"] - small["seconds"])),
            }
            print()
            print(
                f"marginal {sizes[0]:,} -> {sizes[1]:,}: "
                f"{extra / (big_wall - small_wall):,.0f} events/s end to end, "
                f"{extra / (big['seconds'] - small['seconds']):,.0f} events/s excluding start-up"
            )
    for size, (wall, summary) in before.items():
        now_wall, now = results[masters[0], size]
        figures.setdefault("before", []).append(run_figures(masters[0], size, wall, summary))
        print(f"\n== before ({args.before}), {size:,} events")
        _report(wall, summary)
        print(
            f"now / before, {size:,} events: {wall / now_wall:.2f}x end to end, "
            f"{summary['seconds'] / now['seconds']:.2f}x excluding start-up; "
            f"alerts {now['alerts']} now, {summary['alerts']} before"
        )
    if len(masters) > 1:
        first = masters[0]
        print()
        for master in masters[1:]:
            for size in sizes:
                ratio = results[first, size][0] / results[master, size][0]
                figures.setdefault("throughput_ratios", []).append(
                    {"master": master, "against": first, "events": size, "ratio": round(ratio, 3)}
                )
                print(f"{size:,} events: {master} is {ratio:.2f}x the throughput of {first}")
    figures_file.write(args.figures, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
