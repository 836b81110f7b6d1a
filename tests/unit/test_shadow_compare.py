"""A shadow candidate beside the rule in force (pure: velocity.analyst.shadow_compare): decisions in
effect, the figures per transaction, verdicts shared by both sides, the window."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.builders import BASE_TIME, alert_row, decision_histories, make_rule
from velocity.analyst.reviews import DAY_MS, Review, Verdict
from velocity.analyst.shadow_compare import (
    DecisionRow,
    SideFigures,
    compare,
    compare_candidates,
    in_effect,
    window_start,
)
from velocity.domain.rule_changes import RuleBook
from velocity.domain.rules import RuleState

pytestmark = pytest.mark.timeout(120)

IN_FORCE = make_rule(ruleId=4).with_version(3)
CANDIDATE = make_rule(ruleId=4, limit=3).with_version(4).with_state(RuleState.SHADOW)


def _rows(rows: list[dict[str, Any]]) -> list[DecisionRow]:
    return [DecisionRow.of(r) for r in rows]


def _net(rows: list[dict[str, Any]]) -> int:
    return sum(-1 if r["kind"] == "RETRACTION" else 1 for r in rows)


@given(
    st.lists(st.tuples(decision_histories("tx", 1), st.integers(0, 12_000)), max_size=6),
    st.randoms(use_true_random=False),
)
def test_a_decision_is_in_effect_when_its_net_count_is_one_whatever_the_order(
    drawn: list[tuple[list[dict[str, Any]], int]], random: Any
) -> None:
    histories = {}
    for n, (history, _) in enumerate(drawn):
        for row in history:  # one decision per history: a transaction of its own
            row["transactionId"] = f"tx-{n}"
            row["alertId"] = f"{row['alertId']}-{n}"
        histories[f"tx-{n}"] = history
    assert all(_net(h) in (0, 1) for h in histories.values()), "the builder keeps SPEC §3"
    for since in [None, *(BASE_TIME + cut for _, cut in drawn)]:
        seen = [
            r for h in histories.values() for r in h if since is None or r["decisionTime"] >= since
        ]
        random.shuffle(seen)
        expected = {
            (4, 1, tx): sorted(
                r["alertId"] for r in seen if r["transactionId"] == tx and r["kind"] != "RETRACTION"
            )
            for tx, history in histories.items()
            # In effect now, with the value in effect decided in the window.
            if _net(history) == 1
            and (
                since is None
                or max(r["decisionTime"] for r in history if r["kind"] != "RETRACTION") >= since
            )
        }
        assert in_effect(_rows(seen)) == expected


def test_a_retraction_and_a_correction_decided_together_leave_the_correction_in_effect() -> None:
    rows = [
        alert_row("r", (4, 3), BASE_TIME + 10, "RETRACTION", "tx-1"),
        alert_row("c", (4, 3), BASE_TIME + 10, "CORRECTION", "tx-1"),
    ]  # the ALERT they amend was decided before the window
    assert in_effect(_rows(rows)) == {(4, 3, "tx-1"): ["c"]}
    assert in_effect(_rows(rows[:1])) == {}, "a retraction alone raises nothing"


_TX = st.sets(st.sampled_from([f"tx-{n}" for n in range(12)]))


@given(_TX, _TX, _TX, _TX, st.randoms(use_true_random=False))
def test_the_figures_are_set_arithmetic_of_the_transactions_each_side_fired_on(
    live_v3: set[str], live_v5: set[str], candidate: set[str], discarded: set[str], random: Any
) -> None:
    """Versions 3 and 5 are the rule in force (paused and re-activated between), 4 the
    candidate, 2 a candidate discarded earlier: its alerts count for neither side."""
    rows = [
        alert_row(f"{tx}-v{version}", (4, version), BASE_TIME, "ALERT", tx, shadow)
        for version, fired, shadow in [
            (3, live_v3, None),
            (5, live_v5, False),
            (4, candidate, True),
            (2, discarded, True),
        ]
        for tx in sorted(fired)
    ]
    random.shuffle(rows)
    other_rule = alert_row("x", (9, 4), BASE_TIME, "ALERT", "tx-1", True)
    got = compare(CANDIDATE, IN_FORCE, _rows([*rows, other_rule]), [], BASE_TIME)
    live = live_v3 | live_v5
    assert got.candidate_figures == SideFigures(len(candidate))
    assert got.in_force_figures == SideFigures(len(live))
    assert (got.both, got.only_candidate, got.only_in_force) == (
        len(candidate & live),
        len(candidate - live),
        len(live - candidate),
    )
    assert got.both + got.only_candidate == got.candidate_figures.alerts
    assert got.both + got.only_in_force == got.in_force_figures.alerts


def _review(alert_id: str, verdict: Verdict, when: int, version: int = 3) -> Review:
    return Review(alert_id, 4, version, verdict, "", "ana", when)


def test_a_verdict_on_a_payment_counts_for_both_sides_the_latest_winning() -> None:
    rows = [
        alert_row("a1", (4, 3), BASE_TIME, "ALERT", "tx-1"),
        alert_row("s1", (4, 4), BASE_TIME, "ALERT", "tx-1", True),
        alert_row("a2", (4, 3), BASE_TIME, "ALERT", "tx-2"),
        alert_row("s3", (4, 4), BASE_TIME, "ALERT", "tx-3", True),
        alert_row("s4", (4, 4), BASE_TIME, "ALERT", "tx-4", True),
        alert_row("a5", (4, 3), BASE_TIME, "ALERT", "tx-5"),
        alert_row("r5", (4, 3), BASE_TIME + 1, "RETRACTION", "tx-5"),
    ]
    reviews = [
        _review("a1", Verdict.FALSE_POSITIVE, 1),
        _review("s1", Verdict.CONFIRMED_FRAUD, 2, 4),  # later: the payment's verdict
        _review("a2", Verdict.FALSE_POSITIVE, 3),
        _review("s3", Verdict.NEEDS_REVIEW, 4, 4),
        _review("a5", Verdict.CONFIRMED_FRAUD, 5),  # retracted: in effect on neither side
        _review("zz", Verdict.CONFIRMED_FRAUD, 6),  # another rule's alert
    ]
    got = compare(CANDIDATE, IN_FORCE, _rows(rows), reviews, BASE_TIME)
    assert got.in_force_figures == SideFigures(
        alerts=2, reviewed=2, confirmed=1, false_positives=1, needs_review=0
    )
    assert got.in_force_figures.precision == 0.5
    assert got.candidate_figures == SideFigures(
        alerts=3, reviewed=2, confirmed=1, false_positives=0, needs_review=1
    )
    assert got.candidate_figures.precision == 1.0
    assert (got.both, got.only_candidate, got.only_in_force) == (1, 2, 1)
    assert got.to_json()["candidate"]["precision"] == 1.0
    assert (
        compare(CANDIDATE, IN_FORCE, _rows(rows), [], BASE_TIME).in_force_figures.precision is None
    )


def test_each_candidate_is_compared_since_it_was_applied_or_for_the_last_24_h() -> None:
    now = BASE_TIME + 2 * DAY_MS
    applied = now - 3_600_000
    book = RuleBook.of(
        [
            IN_FORCE,
            CANDIDATE,
            make_rule(ruleId=7, limit=9).with_version(1).with_state(RuleState.SHADOW),
        ]
    )
    rows = [
        alert_row("old", (4, 3), applied - 1, "ALERT", "tx-old"),  # before the candidate
        alert_row("new", (4, 3), applied, "ALERT", "tx-new"),
        alert_row("n7", (7, 1), now - DAY_MS + 1, "ALERT", "tx-7", True),
        alert_row("o7", (7, 1), now - DAY_MS - 1, "ALERT", "tx-8", True),  # over a day old
    ]
    first, second = compare_candidates(book, _rows(rows), [], {(4, 4): applied}, now)
    assert (first.candidate, first.in_force, first.since) == (CANDIDATE, IN_FORCE, applied)
    assert first.in_force_figures.alerts == 1 and first.only_in_force == 1
    assert second.in_force is None and second.since == now - DAY_MS
    assert second.candidate_figures.alerts == 1 and second.only_candidate == 1
    assert second.to_json()["inForceVersion"] is None
    assert window_start(now, now - 2 * DAY_MS) == now - DAY_MS
