"""Velocity's backtest against its Flink peer (not a test): `make bench-peer` or
`python -m benchmarks.peer`.

The peer (``benchmarks/peers/flink``, built by `make bench-peer`) is a Flink 2.3
DataStream job of Velocity's design: parse and admit in arrival order, fan out per rule
signature to its dynamic key, keyBy (signature, key), per-key g-wide buckets in keyed
state, each event decided over the window ``[floor_g(t - W), t]`` ending at its own
eventTime, cooldown per rule and key; parallelism 2 in a local MiniCluster.

For each rules file (the sample rules and ``benchmarks/rules/fire_often.json`` by
default), on the same generated events (``benchmarks.backtest._events``, cached, the
file `make bench` uses), side by side in one run: `velocity backtest` as a fresh process
(as ``benchmarks.backtest`` runs it) and the peer as a fresh ``java -jar`` process, each
timed from outside (the process's wall clock, start-up included). Prints the seconds,
their ratio, the alert counts, and whether the alert sets are identical, compared on
(ruleId, ruleVersion, transactionId, aggregateValue as a decimal), and the cooldown's
notified/suppressed flags of the decisions both made; on a mismatch the first few
differences per rule.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from benchmarks import figures as figures_file
from benchmarks.backtest import SAMPLE_RULES, _backtest, _events

ROOT = Path(__file__).resolve().parents[1]
PEER_JAR = ROOT / "benchmarks" / "peers" / "flink" / "target" / "velocity-flink-peer.jar"
RULE_FILES = {
    "sample": SAMPLE_RULES,
    "fire-often": ROOT / "benchmarks" / "rules" / "fire_often.json",
}
# (ruleId, ruleVersion, transactionId, aggregateValue): one decision and its value.
Decision = tuple[int, int, str, Decimal]
SHOWN_DIFFERENCES = 5


@dataclass
class Alerts:
    """One engine's alerts, as the comparison reads them."""

    decisions: Counter[Decision] = field(default_factory=Counter)
    suppressed: set[Decision] = field(default_factory=set)

    @property
    def count(self) -> int:
        return sum(self.decisions.values())


def read_alerts(files: Iterable[Path]) -> Alerts:
    """The alerts of JSON-lines files (SPEC §4 records, or the peer's subset of them)."""
    alerts = Alerts()
    for path in files:
        with path.open() as lines:
            for line in lines:
                record = json.loads(line)
                decision = (
                    int(record["ruleId"]),
                    int(record.get("ruleVersion") or 0),
                    str(record["transactionId"]),
                    Decimal(record["aggregateValue"]),
                )
                alerts.decisions[decision] += 1
                if record.get("suppressed"):
                    alerts.suppressed.add(decision)
    return alerts


@dataclass
class Comparison:
    identical: bool
    flags_identical: bool
    lines: list[str]


def compare(velocity: Alerts, peer: Alerts) -> Comparison:
    """Whether both made the same decisions with the same values (as multisets: a
    decision made twice is a difference too), and the same cooldown flags; and, when
    not, the first few differences per rule."""
    only_velocity = velocity.decisions - peer.decisions
    only_peer = peer.decisions - velocity.decisions
    lines: list[str] = []
    rules = sorted({d[0] for d in only_velocity} | {d[0] for d in only_peer})
    for rule in rules:
        mine = sorted(d for d in only_velocity.elements() if d[0] == rule)
        theirs = sorted(d for d in only_peer.elements() if d[0] == rule)
        lines.append(
            f"  rule {rule}: {len(mine)} only in Velocity's alerts, "
            f"{len(theirs)} only in the peer's"
        )
        for label, differing in (("velocity", mine), ("peer", theirs)):
            for _, version, tx, value in differing[:SHOWN_DIFFERENCES]:
                lines.append(f"    only {label}: v{version} {tx} aggregateValue {value}")
    both = velocity.decisions.keys() & peer.decisions.keys()
    flags = sorted(d for d in both if (d in velocity.suppressed) != (d in peer.suppressed))
    if flags:
        lines.append(f"  cooldown flags differ on {len(flags)} common decisions, first:")
        for decision in flags[:SHOWN_DIFFERENCES]:
            rule, version, tx, _ = decision
            said = "suppressed" if decision in velocity.suppressed else "notified"
            lines.append(f"    rule {rule} v{version} {tx}: Velocity {said}, the peer not")
    return Comparison(not only_velocity and not only_peer, not flags, lines)


def run_peer(
    events: Path, rules: Path, out: Path, mode: str, parallelism: int
) -> tuple[float, str]:
    """One ``java -jar`` of the peer: (wall seconds, its summary lines)."""
    shutil.rmtree(out, ignore_errors=True)
    started = time.monotonic()
    done = subprocess.run(
        ["java", "-jar", str(PEER_JAR), "--rules", str(rules), "--events", str(events),
         "--out", str(out), "--mode", mode, "--parallelism", str(parallelism)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.monotonic() - started
    said = "; ".join(line.removeprefix("peer: ") for line in done.stdout.splitlines())
    return wall, said


def _steps(seconds: dict[str, float]) -> str:
    return ", ".join(f"{step} {s:.1f}" for step, s in seconds.items())


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument(
        "--rules",
        default="both",
        help="sample, fire-often, both (default) or a rules file",
    )
    parser.add_argument("--runs", type=int, default=1, help="runs per engine; the median counts")
    parser.add_argument("--keys", type=int, default=100_000, help="distinct payers")
    parser.add_argument("--rate", type=float, default=20.0, help="events per second of event time")
    parser.add_argument(
        "--mode",
        choices=("batch", "streaming"),
        default="batch",
        help="the peer's Flink runtime mode (batch: sorted keyed input, Flink's way for "
        "bounded jobs; streaming: HashMap state backend, timers fired by the final watermark)",
    )
    parser.add_argument("--parallelism", type=int, default=2, help="the peer's parallelism")
    parser.add_argument(
        "--before",
        type=Path,
        help="another checkout (e.g. a git worktree of an earlier commit) whose backtest is "
        "timed too, in the same run, its alerts compared with the peer's as well",
    )
    parser.add_argument("--work-dir", default=str(ROOT / "data" / "bench-peer"))
    parser.add_argument(
        "--events-dir",
        default=str(ROOT / "data" / "bench"),
        help="where the generated events are cached (make bench's folder: one file for both)",
    )
    figures_file.add_option(parser)
    args = parser.parse_args()
    if not PEER_JAR.exists():
        print(f"{PEER_JAR} is missing: build it with `make bench-peer`", file=sys.stderr)
        return 2
    if args.rules == "both":
        rule_files = dict(RULE_FILES)
    elif args.rules in RULE_FILES:
        rule_files = {args.rules: RULE_FILES[args.rules]}
    else:
        rule_files = {Path(args.rules).stem: Path(args.rules)}

    events = _events(Path(args.events_dir), args.events, args.keys, args.rate)
    work = Path(args.work_dir)
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.events:,} events "
        f"({events}), load average {_load()}, peer mode {args.mode}, "
        f"parallelism {args.parallelism}"
    )
    results = []
    for name, rules in rule_files.items():
        velocity_walls: list[float] = []
        before_walls: list[float] = []
        peer_walls: list[float] = []
        steps: dict[str, list[float]] = {}
        for run in range(args.runs):  # interleaved: the machine's noise hits both alike
            velocity_work = work / f"velocity-{name}"
            velocity_work.mkdir(parents=True, exist_ok=True)
            wall, summary = _backtest(velocity_work, events, 60, None, rules)
            velocity_walls.append(wall)
            for step, seconds in summary["step_seconds"].items():
                steps.setdefault(step, []).append(seconds)
            print(
                f"{name}, run {run + 1}: velocity backtest {wall:.1f} s "
                f"({summary['seconds']:.1f} s excluding Spark start-up), "
                f"{summary['alerts']:,} alerts, peak RSS {summary['peak_rss_mb']:,.0f} MB; "
                f"steps (s): {_steps(summary['step_seconds'])}"
            )
            if args.before:
                before_work = work / f"before-{name}"
                before_work.mkdir(parents=True, exist_ok=True)
                wall, summary = _backtest(before_work, events, 60, None, rules, args.before)
                before_walls.append(wall)
                print(
                    f"{name}, run {run + 1}: the code before ({args.before}) {wall:.1f} s, "
                    f"{summary['alerts']:,} alerts; steps (s): {_steps(summary['step_seconds'])}"
                )
            peer_out = work / f"flink-{name}"
            wall, said = run_peer(events, rules, peer_out, args.mode, args.parallelism)
            peer_walls.append(wall)
            print(f"{name}, run {run + 1}: flink peer {wall:.1f} s ({said})")
        velocity = read_alerts([work / f"velocity-{name}" / "alerts.jsonl"])
        peer = read_alerts(sorted((work / f"flink-{name}").glob("alerts-*.jsonl")))
        comparison = compare(velocity, peer)
        if args.before:
            before = compare(read_alerts([work / f"before-{name}" / "alerts.jsonl"]), peer)
            print(
                f"{name}: the code before {statistics.median(before_walls):.1f} s, its alerts "
                f"{'identical' if before.identical and before.flags_identical else 'NOT identical'}"
                " to the peer's"
            )
            comparison.lines.extend(before.lines)
            comparison.identical &= before.identical
            comparison.flags_identical &= before.flags_identical
        results.append(
            (name, statistics.median(velocity_walls), statistics.median(peer_walls),
             velocity.count, peer.count, comparison,
             {step: round(statistics.median(s), 2) for step, s in steps.items()},
             statistics.median(before_walls) if before_walls else None)
        )  # fmt: skip
    print(f"\nload average at the end {_load()}")
    print(
        f"{'rules':<12}{'velocity s':>12}{'flink s':>10}{'ratio':>8}"
        f"{'velocity alerts':>17}{'flink alerts':>14}  identical"
    )
    failed = False
    figures_file.write(
        args.figures,
        {
            "events": args.events,
            "mode": args.mode,
            "parallelism": args.parallelism,
            "rules": [
                {"rules": name, "velocity_seconds": round(v_wall, 2),
                 "peer_seconds": round(p_wall, 2), "ratio": round(v_wall / p_wall, 3),
                 "velocity_alerts": v_count, "peer_alerts": p_count,
                 "identical": c.identical, "flags_identical": c.flags_identical,
                 "velocity_step_seconds": step_seconds,
                 **({"before_seconds": round(b_wall, 2)} if b_wall is not None else {})}
                for name, v_wall, p_wall, v_count, p_count, c, step_seconds, b_wall in results
            ],
        },
    )  # fmt: skip
    for name, velocity_wall, peer_wall, velocity_count, peer_count, comparison, *_ in results:
        same = "yes" if comparison.identical else "NO"
        flags = "" if comparison.flags_identical else " (cooldown flags differ)"
        print(
            f"{name:<12}{velocity_wall:>12.1f}{peer_wall:>10.1f}{velocity_wall / peer_wall:>7.2f}x"
            f"{velocity_count:>17,}{peer_count:>14,}  {same}{flags}"
        )
        for line in comparison.lines:
            print(line)
        failed |= not (comparison.identical and comparison.flags_identical)
    print("ratio: Velocity's seconds over the peer's (above 1: the peer is faster)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
