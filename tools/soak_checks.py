"""The soak's pure part (``tools/soak.py`` runs it): when each fault strikes, and what must
hold at the end. No Spark, Delta, Redis, Kafka or Airflow here: the harness reads the
rows and hands them in, so every check is tested directly (tests/unit/test_soak_checks.py).

- ``fault_schedule``: every fault kind ``each`` times at random moments of the run, in a
  random order, never two closer than ``gap`` seconds (one fault at a time: each is waited
  out before the next).
- ``in_effect``: per (ruleId, transactionId), ALERT + CORRECTION - RETRACTION, and the value
  of the latest raising row by decisionTime (SPEC §3); ``compare_alerts`` sets that against
  `velocity backtest` over every event produced, values and cooldown flags included.
- ``repeats``: ids delivered more than once (the Redis stream, the Kafka topic).
- ``case_problems``: every stream alert in exactly one case, each case's count its alerts'.
- ``bucket_problems``: each kept g-wide bucket counts its events once, none lost.
- ``what_held``: the table the soak prints: faults (kind, injected, recovered in s) and
  checks (held or failed, with the detail).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

Pair = tuple[int, str]  # (ruleId, transactionId)
Slot = tuple[str, str, int]  # (signature_id, key, bucket_start)


def fault_schedule(
    kinds: Sequence[str], each: int, seconds: float, rng: random.Random, gap: float = 20.0
) -> list[tuple[float, str]]:
    """(second of the run, kind) for every kind ``each`` times, sorted by time: random
    moments in [gap, seconds - gap], at least ``gap`` apart when the run is long enough
    (else evenly spread), kinds in a random order."""
    chosen = [k for k in kinds for _ in range(each)]
    rng.shuffle(chosen)
    if not chosen:
        return []
    usable = seconds - 2 * gap
    slack = usable - gap * (len(chosen) - 1)
    if slack <= 0:  # too many for the run: evenly spread
        step = max(seconds, 0.0) / (len(chosen) + 1)
        return [(step * (i + 1), kind) for i, kind in enumerate(chosen)]
    # Random gaps on top of the minimum: sorted uniform points in the slack.
    extra = sorted(rng.uniform(0, slack) for _ in chosen)
    return [(gap + i * gap + extra[i], kind) for i, kind in enumerate(chosen)]


def decimal_text(value: object) -> str:
    """A value as a canonical decimal text (``12.50`` and ``12.5`` alike); text as is."""
    try:
        number = Decimal(str(value))
    except InvalidOperation:
        return str(value)
    if number.is_nan() or number.is_infinite():
        return str(number)
    normal = number.normalize()
    return format(normal, "f") if normal == normal.to_integral() else str(normal)


@dataclass(frozen=True)
class Effect:
    """What a decision in effect says: its value, its window's start, whether a cooldown
    suppressed it (recorded, not notified)."""

    value: str
    window_start: int
    suppressed: bool

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Effect:
        """From an alert row (the alerts table's or a backtest line's field names)."""
        return cls(
            decimal_text(row["aggregateValue"]),
            int(row["windowStart"]),
            bool(row.get("suppressed")),
        )


def in_effect(rows: Iterable[Mapping[str, Any]]) -> tuple[dict[Pair, Effect], list[Pair]]:
    """The alerts in effect among alert rows (``kind``, ``ruleId``, ``transactionId``,
    ``decisionTime``, value fields): per pair, a net count of 1 and its latest raising
    row's effect (a RETRACTION sorts before a raising row of the same decisionTime); and
    the pairs whose net count is neither 0 nor 1 (counted twice, or retracted twice)."""
    net: Counter[Pair] = Counter()
    # Each pair's latest row kept as its small Effect, not the row: a 30-minute soak's
    # millions of rows, kept whole, filled the machine's memory.
    latest: dict[Pair, tuple[tuple[int, bool], Effect | None]] = {}
    for row in rows:
        pair = (int(row["ruleId"]), str(row["transactionId"]))
        raises = str(row.get("kind") or "ALERT") != "RETRACTION"
        net[pair] += 1 if raises else -1
        order = (int(row.get("decisionTime") or 0), raises)
        if pair not in latest or order > latest[pair][0]:
            latest[pair] = (order, Effect.of(row) if raises else None)
    effect = {
        pair: found
        for pair, ((_, raises), found) in latest.items()
        if raises and found is not None and net[pair] == 1
    }
    broken = sorted(pair for pair, count in net.items() if count not in (0, 1))
    return effect, broken


@dataclass(frozen=True)
class AlertComparison:
    missing: list[Pair]  # expected, not in effect
    extra: list[Pair]  # in effect, not expected
    differing: list[tuple[Pair, Effect, Effect]]  # (pair, in effect, expected)

    @property
    def equal(self) -> bool:
        return not (self.missing or self.extra or self.differing)

    def detail(self, expected: int) -> str:
        if self.equal:
            return f"{expected} alerts, values and cooldown flags equal"
        shown = [
            *(f"missing {p}" for p in self.missing[:3]),
            *(f"extra {p}" for p in self.extra[:3]),
            *(f"{p}: {got} != {want}" for p, got, want in self.differing[:3]),
        ]
        return (
            f"of {expected}: {len(self.missing)} missing, {len(self.extra)} extra, "
            f"{len(self.differing)} differing; " + "; ".join(shown)
        )


def compare_alerts(
    actual: Mapping[Pair, Effect], expected: Mapping[Pair, Effect]
) -> AlertComparison:
    return AlertComparison(
        missing=sorted(set(expected) - set(actual)),
        extra=sorted(set(actual) - set(expected)),
        differing=[
            (pair, actual[pair], expected[pair])
            for pair in sorted(set(actual) & set(expected))
            if actual[pair] != expected[pair]
        ],
    )


def repeats(ids: Iterable[str]) -> dict[str, int]:
    """Each id seen more than once, with how many times."""
    return {i: n for i, n in Counter(ids).items() if n > 1}


def case_problems(
    alert_cases: Iterable[tuple[str, str | None]], case_alerts: Mapping[str, int]
) -> list[str]:
    """What breaks "every alert is in exactly one case": ``alert_cases`` is each stream
    alert row's (alertId, caseId); ``case_alerts`` each case's alert count as its events
    left it. An alert with no case, with two, in a case that does not exist, or a case
    whose count is not its alerts' (an alert joined twice)."""
    cases_of: dict[str, set[str | None]] = {}
    for alert_id, case in alert_cases:
        cases_of.setdefault(alert_id, set()).add(case)
    problems = []
    members: Counter[str] = Counter()
    for alert_id, cases in sorted(cases_of.items()):
        named = {c for c in cases if c}
        if len(cases) != 1 or not named:
            problems.append(f"alert {alert_id} in {len(named)} cases ({sorted(named)})")
            continue
        (case,) = named
        if case not in case_alerts:
            problems.append(f"alert {alert_id} in case {case}, which no case event opened")
            continue
        members[case] += 1
    for case, count in sorted(case_alerts.items()):
        if count != members[case]:
            problems.append(f"case {case} counts {count} alerts, {members[case]} name it")
    return problems


def bucket_problems(
    kept: Mapping[Slot, int], reference: Mapping[Slot, int], evictable_before: int | None = None
) -> tuple[list[str], int]:
    """The kept g-wide buckets' event counts (``kept``: the live table's, compacted hours
    expanded to their parts) against the backtest's (``reference``). Eviction may have
    dropped buckets starting before ``evictable_before`` (the horizon's cutoff at the end;
    None: nothing compared is evictable), so those are not compared; every other bucket
    must count what the backtest counts. The problems (lost: fewer or absent; doubled:
    more; unknown: not in the reference) and how many buckets were compared."""
    problems, compared = [], 0
    for slot, count in sorted(reference.items()):
        if evictable_before is not None and slot[2] < evictable_before:
            continue
        compared += 1
        got = kept.get(slot, 0)
        if got < count:
            problems.append(f"lost: {slot} counts {got} of {count} events")
        elif got > count:
            problems.append(f"doubled: {slot} counts {got}, the backtest {count}")
    problems += [
        f"unknown: {slot} counts {n}"
        for slot, n in sorted(kept.items())
        if slot not in reference and (evictable_before is None or slot[2] >= evictable_before)
    ]
    return problems, compared


@dataclass
class FaultRecord:
    """One fault injected: when (seconds into the run), what, how long until the stream
    committed a batch again (None: it did not within the limit), and what happened."""

    at: float
    kind: str
    recovered_s: float | None = None
    detail: str = ""


@dataclass
class Check:
    name: str
    held: bool
    detail: str


@dataclass
class Outcome:
    faults: list[FaultRecord] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    @property
    def held(self) -> bool:
        return all(c.held for c in self.checks)


def fault_summary(
    faults: Sequence[FaultRecord], kinds: Sequence[str], each: int
) -> tuple[list[tuple[str, int, str]], Check]:
    """Per kind: (kind, times injected, recovered in s: max and mean, or 'NOT n/m'), and the
    check that every kind was injected ``each`` times and recovered each time."""
    rows, short = [], []
    for kind in kinds:
        mine = [f for f in faults if f.kind == kind]
        times = [f.recovered_s for f in mine if f.recovered_s is not None]
        if len(times) < len(mine):
            recovered = f"NOT {len(mine) - len(times)}/{len(mine)}"
        elif times:
            recovered = f"max {max(times):.0f}, mean {sum(times) / len(times):.0f}"
        else:
            recovered = "-"
        rows.append((kind, len(mine), recovered))
        if len(mine) < each or len(times) < len(mine):
            short.append(f"{kind} {len(times)}/{len(mine)} recovered of {each} wanted")
    check = Check(
        "every fault injected and recovered",
        not short,
        "; ".join(short) or f"{len(faults)} faults, each kind {each}+ times, all recovered",
    )
    return rows, check


def what_held(fault_rows: Sequence[tuple[str, int, str]], checks: Sequence[Check]) -> str:
    """The two tables the soak prints, as Markdown (pasteable into a note)."""
    lines = ["| fault | injected | recovered in s |", "|---|---:|---|"]
    lines += [f"| {kind} | {count} | {recovered} |" for kind, count, recovered in fault_rows]
    lines += ["", "| check | held | detail |", "|---|---|---|"]
    lines += [
        f"| {c.name} | {'held' if c.held else 'FAILED'} | {c.detail.replace('|', '/')} |"
        for c in checks
    ]
    return "\n".join(lines)
