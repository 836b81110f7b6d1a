"""The soak's checks (tools/soak_checks.py), on rows made here: what counts as held."""

from __future__ import annotations

import itertools
import random

from tools.soak_checks import (
    Check,
    Effect,
    FaultRecord,
    bucket_problems,
    case_problems,
    compare_alerts,
    decimal_text,
    fault_schedule,
    fault_summary,
    in_effect,
    repeats,
    what_held,
)


def alert(kind: str, rule: int, tx: str, at: int, value: object = "5", **more: object) -> dict:
    return {
        "kind": kind,
        "ruleId": rule,
        "transactionId": tx,
        "decisionTime": at,
        "aggregateValue": value,
        "windowStart": 100,
        **more,
    }


def test_every_kind_strikes_each_time_inside_the_run_and_apart() -> None:
    kinds = ["a", "b", "c"]
    schedule = fault_schedule(kinds, 2, 1800, random.Random(1), gap=20)
    assert sorted(k for _, k in schedule) == ["a", "a", "b", "b", "c", "c"]
    times = [t for t, _ in schedule]
    assert times == sorted(times) and times[0] >= 20 and times[-1] <= 1780
    assert all(b - a >= 20 for a, b in itertools.pairwise(times))
    # Another seed, another order and other moments; a run too short for the gap: spread.
    assert fault_schedule(kinds, 2, 1800, random.Random(2), gap=20) != schedule
    short = fault_schedule(kinds, 2, 60, random.Random(1), gap=20)
    assert [round(t) for t, _ in short] == [9, 17, 26, 34, 43, 51]


def test_in_effect_nets_kinds_and_keeps_the_latest_value() -> None:
    rows = [
        alert("ALERT", 1, "t1", 10, "5.0"),
        alert("RETRACTION", 1, "t1", 20),
        alert("CORRECTION", 1, "t1", 20, "7"),  # same time: the correction stands
        alert("ALERT", 2, "t2", 10),
        alert("RETRACTION", 2, "t2", 30),  # retracted: not in effect
        alert("ALERT", 3, "t3", 10, suppressed=True),
        alert("ALERT", 4, "t4", 10),
        alert("ALERT", 4, "t4", 11),  # published twice in the table: counted twice
    ]
    effect, broken = in_effect(rows)
    assert effect == {(1, "t1"): Effect("7", 100, False), (3, "t3"): Effect("5", 100, True)}
    assert broken == [(4, "t4")]


def test_alerts_compare_by_pair_value_window_and_cooldown_flag() -> None:
    expected = {(1, "a"): Effect("5", 1, False), (1, "b"): Effect("2", 1, True)}
    assert compare_alerts(dict(expected), expected).equal
    actual = {(1, "b"): Effect("2", 1, False), (2, "c"): Effect("1", 1, False)}
    comparison = compare_alerts(actual, expected)
    assert comparison.missing == [(1, "a")] and comparison.extra == [(2, "c")]
    assert [p for p, *_ in comparison.differing] == [(1, "b")]
    assert "1 missing, 1 extra, 1 differing" in comparison.detail(2)
    assert decimal_text("12.50") == decimal_text(12.5) == "12.5"
    assert decimal_text("1E+1") == "10" and decimal_text("x") == "x"


def test_repeats_are_the_ids_seen_twice_or_more() -> None:
    assert repeats(["a", "b", "a", "c", "a"]) == {"a": 3}
    assert repeats([]) == {}


def test_each_alert_in_exactly_one_case_and_each_case_counts_its_alerts() -> None:
    assert case_problems([("a1", "c1"), ("a2", "c1"), ("a3", "c2")], {"c1": 2, "c2": 1}) == []
    problems = case_problems(
        [("a1", "c1"), ("a1", "c2"), ("a2", None), ("a3", "c9"), ("a4", "c3")],
        {"c1": 0, "c2": 0, "c3": 2},
    )
    assert problems == [
        "alert a1 in 2 cases (['c1', 'c2'])",
        "alert a2 in 0 cases ([])",
        "alert a3 in case c9, which no case event opened",
        "case c3 counts 2 alerts, 1 name it",
    ]


def test_buckets_from_the_horizon_on_count_each_event_once() -> None:
    reference = {("s", "k", 0): 2, ("s", "k", 60): 3, ("s", "j", 120): 1, ("t", "k", 60): 4}
    kept = {("s", "k", 60): 3, ("s", "j", 120): 1, ("t", "k", 60): 4}  # bucket 0 evicted
    assert bucket_problems(kept, reference, evictable_before=60) == ([], 3)
    # Nothing evictable: the bucket gone is lost.
    assert bucket_problems(kept, reference)[0] == ["lost: ('s', 'k', 0) counts 0 of 2 events"]
    # A signature with no bucket kept at all is no signature to skip.
    problems, compared = bucket_problems(
        {("s", "k", 0): 2, ("s", "k", 60): 4, ("s", "j", 120): 1, ("t", "x", 60): 1}, reference
    )
    assert compared == 4 and problems == [
        "doubled: ('s', 'k', 60) counts 4, the backtest 3",
        "lost: ('t', 'k', 60) counts 0 of 4 events",
        "unknown: ('t', 'x', 60) counts 1",
    ]


def test_the_table_says_what_held_and_what_did_not() -> None:
    faults = [
        FaultRecord(10, "kill", 12.0),
        FaultRecord(50, "kill", 30.0),
        FaultRecord(90, "flush", None, "no batch"),
    ]
    rows, check = fault_summary(faults, ["kill", "flush", "restart"], 1)
    assert rows == [("kill", 2, "max 30, mean 21"), ("flush", 1, "NOT 1/1"), ("restart", 0, "-")]
    assert not check.held
    assert check.detail == "flush 0/1 recovered of 1 wanted; restart 0/0 recovered of 1 wanted"
    table = what_held(rows, [check, Check("alerts", True, "a|b")])
    assert "| kill | 2 | max 30, mean 21 |" in table
    assert "| every fault injected and recovered | FAILED |" in table
    assert "| alerts | held | a/b |" in table
