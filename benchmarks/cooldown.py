"""Alerts against notified alerts per hour (not a test): `make bench-cooldown`.

What an analyst would be sent: the issue's new-user stream (150 events/s over 3,000
payers, by default two hours of eventTime) backtested with a rules file as it is and
with a cooldown on every rule (`--cooldown-minutes`, default 10), in one `velocity
backtest` process each. A cooldown never changes which alerts exist, so one run gives
both figures per rule: all its alerts, and those its cooldown notifies. Printed per rule
and for the file, per hour of eventTime, plus the same with the cooldown on only the
``--top`` rules that fire most (the sample rules ship with theirs on rules 4, 5 and 7).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks import figures as figures_file
from benchmarks.backtest import SAMPLE_RULES, _events

ROOT = Path(__file__).resolve().parents[1]
HOUR_MS = 3_600_000


def _cooled(rules: Path, minutes: int, out: Path) -> Path:
    """The rules file with ``cooldownMinutes`` on every rule."""
    entries = json.loads(rules.read_text())
    out.write_text(json.dumps([{**e, "cooldownMinutes": minutes} for e in entries]))
    return out


def _backtest(rules: Path, events: Path, work: Path, spark: Any = None) -> Path:
    """`velocity backtest` as a process of its own; with ``spark`` (a caller's session,
    shared by several benchmarks) the same backtest, the CLI's steps, in this process: the
    figures are alert counts, which do not depend on the process."""
    out = work / f"{rules.stem}.jsonl"
    if spark is not None:
        from velocity.cli.shared import read_rules_file
        from velocity.domain.rule_changes import RuleBook, plan_changes
        from velocity.settings import load_settings
        from velocity.spark.backtest import run_backtest

        in_force = RuleBook.of(plan_changes(RuleBook(), read_rules_file(str(rules)))[0])
        settings = load_settings(data_dir=work / "data")
        run_backtest(spark, settings, in_force.in_force(), str(events.resolve()), out)
        return out
    subprocess.run(
        [sys.executable, "-m", "velocity.cli", "backtest", "--rules", str(rules),
         "--events", str(events), "--out", str(out)],
        check=True, stdout=subprocess.DEVNULL,
        env={**os.environ, "VELOCITY_DATA_DIR": str(work / "data")},
    )  # fmt: skip
    return out


def report(name: str, alerts: Path, top: int, minutes: int) -> dict[str, Any]:
    """Prints the counts and returns them as figures. Counts are read line by line (a
    fire-often file holds millions of alerts: as dicts they took 14 GB)."""
    fired: Counter[int] = Counter()
    told: Counter[int] = Counter()
    low, high = None, None
    with alerts.open() as lines:
        for line in lines:
            alert = json.loads(line)
            rule, at = alert["ruleId"], alert["eventTime"]
            fired[rule] += 1
            told[rule] += not alert.get("suppressed")
            low = at if low is None else min(low, at)
            high = at if high is None else max(high, at)
    if low is None or high is None:
        print(f"{name}: no alerts")
        return {"rules": name, "alerts": 0}
    hours = max(1.0, (high - low) / HOUR_MS)
    total = sum(fired.values())
    loudest = {rule for rule, _ in fired.most_common(top)}
    print(f"\n{name}: {total} alerts over {hours:.2f} h of eventTime")
    print(f"{'rule':>6} {'alerts/h':>10} {f'notified/h ({minutes} min)':>22}")
    for rule in sorted(fired):
        mark = " *" if rule in loudest else ""
        print(f"{rule:>6} {fired[rule] / hours:>10.0f} {told[rule] / hours:>22.0f}{mark}")
    top_only = sum(told[r] if r in loudest else fired[r] for r in fired)
    print(
        f"{'all':>6} {total / hours:>10.0f} {sum(told.values()) / hours:>22.0f}"
        f"   cooldown on the {top} loudest (*) only: {top_only / hours:.0f} notified/h"
    )
    return {
        "rules": name,
        "alerts": total,
        "notified": sum(told.values()),
        "hours": round(hours, 3),
        "alerts_per_h": round(total / hours),
        "notified_per_h": round(sum(told.values()) / hours),
        "notified_per_h_top_only": round(top_only / hours),
        "by_rule": {
            str(rule): {"alerts_per_h": round(fired[rule] / hours),
                        "notified_per_h": round(told[rule] / hours)}
            for rule in sorted(fired)
        },
    }  # fmt: skip


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rules", type=Path, action="append", help="rules files (repeat)")
    parser.add_argument("--events", type=int, default=1_080_000)
    parser.add_argument("--keys", type=int, default=3_000)
    parser.add_argument("--rate", type=float, default=150.0)
    parser.add_argument("--cooldown-minutes", type=int, default=10)
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--work", type=Path, default=ROOT / ".cache" / "bench-cooldown")
    figures_file.add_option(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    run(parser().parse_args(argv))


def run(args: argparse.Namespace, spark: Any = None) -> dict[str, Any]:
    """The benchmark; its figures. ``spark``: backtest in this process on that session."""
    rules_files = args.rules or [SAMPLE_RULES, ROOT / "benchmarks" / "rules" / "fire_often.json"]
    args.work.mkdir(parents=True, exist_ok=True)
    events = _events(args.work, args.events, args.keys, args.rate)
    figures: dict[str, Any] = {"cooldown_minutes": args.cooldown_minutes, "files": []}
    for rules in rules_files:
        with tempfile.TemporaryDirectory(dir=args.work) as tmp:
            cooled = _cooled(rules, args.cooldown_minutes, Path(tmp) / rules.name)
            alerts = _backtest(cooled, events, Path(tmp), spark)
            figures["files"].append(report(rules.name, alerts, args.top, args.cooldown_minutes))
    figures_file.write(args.figures, figures)
    return figures


if __name__ == "__main__":
    main()
