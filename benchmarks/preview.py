"""Preview benchmark (not a test): `python -m benchmarks.preview`.

Makes, once per size, a data dir whose live events table holds ``--hours`` of events at
``--rate`` events/s (default: 1 hour at 1 000/s, 3.6M events), then times
`velocity rules preview FILE --hours 1 --json` as a fresh process (interpreter start-up
included: the wall time a person waits) for the sample rules and for
benchmarks/rules/fire_often.json, first with no rules in force (everything "added"),
then with the file's rules in force at 0.9 × their limits, so that a version in force
that differs from its candidate is decided beside it (a version in force equal to its
candidate would be decided once).
``--long-window`` adds a table with 30 days of thin history before the busy hour and
previews a 30-day rule on it.

The events table is made the cheapest honest way, without a stream or a JVM: `velocity
generate` writes in-order JSON lines (no duplicate, malformed or late lines: the events
table holds accepted events only), the stream's own parser (``parsed_in_arrival_order``)
and row builder (``batch_rows.live_rows``) make events-table rows of them, and delta-rs
appends them as the stream's write-behind does, one commit per ``--commit-seconds`` of
events (the write-behind's default is 30 s): many small files, as a stream leaves the
table between OPTIMIZE runs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
VELOCITY = str(Path(sys.executable).parent / "velocity")
SAMPLE_RULES = ROOT / "jobs" / "velocity" / "resources" / "sample_rules.json"
FIRE_OFTEN = ROOT / "benchmarks" / "rules" / "fire_often.json"
DAY_MS = 86_400_000
# The busy hour starts here (a fixed date, so data dirs are reproducible).
START_MS = 1_767_225_600_000
LONG_RULE = [
    {"ruleId": 901, "ruleState": "ACTIVE", "groupingKeyNames": ["payerId"],
     "aggregatorFunctionType": "COUNT", "limitOperatorType": ">=", "limit": 5,
     "windowMinutes": 43200},
]  # fmt: skip


def raw_lines(raws: pa.Array, path: Path, block: int) -> pa.Table:
    """A micro-batch's lines as the stream's text source gives them to the parser (``raw``,
    ``source_file``, ``source_block``: ``tables.PARSED_SCHEMA``'s first fields)."""
    return pa.table(
        {
            "raw": raws,
            "source_file": pa.repeat(pa.scalar(str(path)), len(raws)),
            "source_block": pa.repeat(pa.scalar(block, pa.int64()), len(raws)),
        }
    )


def write_live_events(
    files: Sequence[Path], table_path: Path, rows_per_commit: int, first_batch: int = 0
) -> int:
    """Append the JSON lines of ``files`` (in order) to the live events table at
    ``table_path`` as the stream would accept them (its parser and row builder; every line
    must be a valid, new event), ``rows_per_commit`` rows a delta-rs commit; returns the
    rows written."""
    from deltalake import write_deltalake

    from velocity.delta import batch_rows
    from velocity.engine.event_lines import parsed_in_arrival_order
    from velocity.spark.ingest import VERDICT_ARROW

    written = 0
    batch = first_batch
    for path in files:
        raws = pa.array(path.read_text(encoding="utf-8").splitlines(), pa.string())
        for begin in range(0, len(raws), rows_per_commit):
            chunk = raws.slice(begin, rows_per_commit)
            lines = raw_lines(chunk, path, begin)
            parsed = parsed_in_arrival_order(lines, VERDICT_ARROW)
            accepted = parsed.filter(parsed.column("accepted"))
            if accepted.num_rows != len(chunk):
                raise ValueError(f"{path}: {len(chunk) - accepted.num_rows} lines not accepted")
            rows = batch_rows.live_rows(
                "events", accepted, ingest_time=int(time.time() * 1000), stream_batch=batch
            )
            write_deltalake(str(table_path), rows, mode="append")
            written += rows.num_rows
            batch += 1
    return written


def _generate(out: Path, events: int, rate: float, keys: int, start_ms: int, seed: int) -> None:
    subprocess.run(
        [VELOCITY, "generate", "--out", str(out), "--events", str(events), "--rate", str(rate),
         "--keys", str(keys), "--files", str(max(1, events // 200_000)), "--start", str(start_ms),
         "--spike-fraction", "0.01", "--late-fraction", "0", "--duplicate-fraction", "0",
         "--malformed-fraction", "0", "--seed", str(seed), "--overwrite"],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip


def data_dir(
    work: Path, hours: float, rate: float, keys: int, commit_seconds: float, history_days: int = 0
) -> Path:
    """A data dir whose events table holds ``hours`` at ``rate`` ending at START_MS +
    ``hours``, and before them ``history_days`` of thin history (1 event/s), made once."""
    name = f"data-{hours}h-{rate}-{keys}-{commit_seconds}s-{history_days}d"
    home = work / name
    if (home / ".complete").exists():
        return home
    shutil.rmtree(home, ignore_errors=True)
    table = home / "tables" / "events"
    started = time.monotonic()
    written = 0
    if history_days:
        lines = work / f"history-{history_days}d"
        count = history_days * 86_400  # 1 event/s
        _generate(lines, count, 1.0, keys, START_MS - history_days * DAY_MS, seed=2)
        written += write_live_events(sorted(lines.glob("*.jsonl")), table, 200_000)
        shutil.rmtree(lines)
    lines = work / f"busy-{hours}h-{rate}-{keys}"
    _generate(lines, round(hours * 3600 * rate), rate, keys, START_MS, seed=1)
    per_commit = max(1, round(rate * commit_seconds))
    written += write_live_events(sorted(lines.glob("*.jsonl")), table, per_commit, 1_000_000)
    shutil.rmtree(lines)
    (home / ".complete").write_text("")
    print(f"{home.name}: {written} events written in {time.monotonic() - started:.1f} s")
    return home


def _velocity(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VELOCITY_DATA_DIR": str(home)}
    return subprocess.run(
        [VELOCITY, *args], env=env, capture_output=True, text=True, check=True, timeout=600
    )


def timed_preview(home: Path, rules: Path, hours: float) -> tuple[float, float, dict]:
    """One `velocity rules preview` process: (wall seconds, its CPU seconds, its JSON).
    The CPU time (user + system, all its threads) tells what the machine's other load
    does to the wall time: on an idle machine the wall is at most the CPU time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = _velocity(home, "rules", "preview", str(rules), "--hours", str(hours), "--json")
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, json.loads(done.stdout)


def _rules_table(home: Path, rules: Path | None) -> None:
    """The rules in force: none, or ``rules`` at 0.9 × their limits."""
    shutil.rmtree(home / "tables" / "rules", ignore_errors=True)
    if rules is not None:
        lowered = home / f"in-force-{rules.name}"
        objects = json.loads(rules.read_text())
        for rule in objects:
            rule["limit"] = round(float(rule["limit"]) * 0.9, 2)
        lowered.write_text(json.dumps(objects))
        _velocity(home, "rules", "apply", str(lowered))


def _report(label: str, wall: float, cpu: float, result: dict) -> None:
    alerts = sum(r["alerts"] for r in result["rules"])
    base = sum(r["inForceAlerts"] for r in result["rules"])
    diff = {k: sum(r["diff"][k] for r in result["rules"]) for k in ("added", "removed", "changed")}
    steps = ", ".join(f"{k} {v:.1f}" for k, v in result["stepSeconds"].items())
    print(
        f"{label:<36} {wall:6.1f} s wall, {cpu:5.1f} s CPU, load {os.getloadavg()[0]:.1f} "
        f"({result['seconds']:.1f} s in the function: {steps}); "
        f"{result['eventsInSpan']:,} events in span, {result['eventsRead']:,} read; "
        f"{alerts:,} alerts, {base:,} by the versions in force; {diff['added']:,} added, "
        f"{diff['removed']:,} removed, {diff['changed']:,} changed"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=1.0, help="hours of events in the table")
    parser.add_argument("--rate", type=float, default=1000.0, help="events per second")
    parser.add_argument("--keys", type=int, default=100_000, help="distinct payers")
    parser.add_argument("--commit-seconds", type=float, default=30.0)
    parser.add_argument("--runs", type=int, default=1, help="runs per case; the median counts")
    parser.add_argument("--long-window", action="store_true", help="also the 30-day rule case")
    parser.add_argument("--work-dir", default=str(ROOT / "data" / "bench-preview"))
    args = parser.parse_args()

    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    home = data_dir(work, args.hours, args.rate, args.keys, args.commit_seconds)
    cases: list[tuple[str, Path, Path, bool]] = []
    for rules in (SAMPLE_RULES, FIRE_OFTEN):
        cases.append((f"{rules.name}, none in force", home, rules, False))
        cases.append((f"{rules.name}, 0.9 x limits in force", home, rules, True))
    if args.long_window:
        long_home = data_dir(
            work, args.hours, args.rate, args.keys, args.commit_seconds, history_days=30
        )
        long_rules = work / "long_window_rule.json"
        long_rules.write_text(json.dumps(LONG_RULE))
        cases.append(("30-day COUNT rule, 30 days of history", long_home, long_rules, False))
    print(
        f"preview of the last 1 h: {args.hours} h at {args.rate:g} events/s in the table, "
        f"{args.keys} payers, one commit per {args.commit_seconds:g} s of events; "
        f"load average before: {os.getloadavg()[0]:.1f}"
    )
    for label, where, rules, in_force in cases:
        _rules_table(where, rules if in_force else None)
        runs = sorted(
            (timed_preview(where, rules, 1.0) for _ in range(args.runs)), key=lambda r: r[0]
        )
        _report(label, *runs[len(runs) // 2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
