"""Rule versioning, planned without Spark (velocity.domain.rule_changes)."""

from __future__ import annotations

import pytest

from tests.builders import make_rule
from velocity.domain.rule_changes import (
    Promotion,
    RuleBook,
    outcome_change,
    outcome_lines,
    plan_changes,
)
from velocity.domain.rules import Control, ControlType, Outcome, Rule, RuleState, StateChange
from velocity.errors import InvalidFieldError, UnknownRuleError


class Table:
    """The rules table's rows, applied to as the store applies (pure)."""

    def __init__(self) -> None:
        self.history: list[Rule] = []

    @property
    def book(self) -> RuleBook:
        return RuleBook.of(self.history)

    def __getitem__(self, rule_id: int) -> Rule:
        return self.book.live[rule_id]


def apply(table: Table | dict, *entries) -> tuple[Table, list[tuple[int, int]]]:
    table = Table() if isinstance(table, dict) else table
    written, result = plan_changes(table.book, list(entries))
    table.history.extend(written)
    return table, [(c.rule_id, c.version) for c in result.changes]


def test_versions_count_up_and_reapplying_the_same_rule_changes_nothing() -> None:
    rule = make_rule(ruleId=3)
    latest, changes = apply({}, rule)
    assert changes == [(3, 1)]
    latest, changes = apply(latest, rule)
    assert changes == []
    latest, changes = apply(latest, make_rule(ruleId=3, windowMinutes=7))
    assert changes == [(3, 2)] and latest[3].window_minutes == 7


def test_pause_delete_and_recreate_continue_the_versions() -> None:
    latest, _ = apply({}, make_rule(ruleId=1), make_rule(ruleId=2))
    latest, changes = apply(latest, StateChange(1, RuleState.PAUSE))
    assert changes == [(1, 2)] and latest[1].state is RuleState.PAUSE
    latest, changes = apply(latest, make_rule(ruleId=1))  # ACTIVE again: a new version
    assert changes == [(1, 3)] and latest[1].state is RuleState.ACTIVE
    latest, changes = apply(latest, Control(ControlType.DELETE_RULES_ALL))
    assert changes == [(1, 4), (2, 2)]
    with pytest.raises(UnknownRuleError, match="ruleId 2"):
        plan_changes(latest.book, [StateChange(2, RuleState.PAUSE)])
    _, changes = apply(latest, make_rule(ruleId=2))
    assert changes == [(2, 3)]


def test_the_page_s_outcome_change_is_a_new_version_that_keeps_the_rest_of_the_rule() -> None:
    latest, _ = apply({}, make_rule(ruleId=1, windowMinutes=7))
    latest, _ = apply(latest, StateChange(1, RuleState.PAUSE))
    latest, changes = apply(latest, outcome_change(1, " block "))
    assert changes == [(1, 3)]
    assert latest[1] == make_rule(ruleId=1, windowMinutes=7, outcome="BLOCK").with_version(
        3
    ).with_state(RuleState.PAUSE), "state and body kept, only the outcome set"
    again = [outcome_change(1, "BLOCK")]
    assert outcome_lines(plan_changes(latest.book, again)[1], again) == [
        "ruleId 1's outcome is BLOCK already: nothing to apply"
    ]
    assert outcome_change(1, "review").outcome is Outcome.REVIEW
    for wrong in ("DENY", "", None):
        with pytest.raises(InvalidFieldError, match=r"field 'outcome': .* ALERT, REVIEW, BLOCK"):
            outcome_change(1, wrong)
    with pytest.raises(UnknownRuleError, match="ruleId 2 is not in force"):
        plan_changes(latest.book, [outcome_change(2, "REVIEW")])


def test_export_sees_the_entries_before_it() -> None:
    _, result = plan_changes(
        RuleBook(),
        [make_rule(ruleId=5), Control(ControlType.EXPORT_RULES_CURRENT), make_rule(ruleId=6)],
    )
    assert [r["ruleId"] for r in result.exports[0]] == [5]


def test_rule_epochs_keep_the_latest_record_of_a_batch_in_batch_order() -> None:
    from velocity.domain.rule_changes import RuleEpochs, rule_versions, rule_versions_text

    rules = [make_rule(ruleId=4).with_version(3), make_rule(ruleId=1).with_version(1)]
    assert rule_versions(rules) == ((1, 1), (4, 3))
    rows = [
        (7, 2_000, rule_versions_text([(1, 1), (4, 3)])),
        (0, 1_000, rule_versions_text([(1, 1), (4, 1)])),
        (7, 1_500, rule_versions_text([(1, 1)])),  # the same batch, recorded before its replay
    ]
    epochs = RuleEpochs.of_rows(rows)
    assert epochs.starts == (0, 7)
    assert epochs.versions == (((1, 1), (4, 1)), ((1, 1), (4, 3)))
    assert epochs.newest() == ((1, 1), (4, 3))
    assert RuleEpochs.of_rows([]).newest() is None


@pytest.mark.timeout(30)
def test_the_outcome_of_a_change_is_one_line_a_version_or_why_nothing_changed() -> None:
    current = RuleBook.of([make_rule(ruleId=1).with_version(1)])
    entries = [StateChange(1, RuleState.PAUSE), Control(ControlType.EXPORT_RULES_CURRENT)]
    _, result = plan_changes(current, entries)
    lines = outcome_lines(result, entries)
    assert lines[0] == "ruleId 1: version 2 PAUSE"
    assert lines[1].startswith("[\n  {") and '"ruleState":"PAUSE"' in lines[1]
    again = [StateChange(1, RuleState.ACTIVE)]
    assert outcome_lines(plan_changes(current, again)[1], again) == [
        "ruleId 1 is ACTIVE already: nothing to apply"
    ]
    same = [make_rule(ruleId=1)]
    assert outcome_lines(plan_changes(current, same)[1], same) == ["nothing to apply"]
    clear = [Control(ControlType.CLEAR_STATE_ALL)]
    assert outcome_lines(plan_changes(current, clear)[1], clear) == []


# --- shadow candidates (SPEC §2 SHADOW) ------------------------------------------------


def shadow(**fields) -> Rule:
    return make_rule(**fields).with_state(RuleState.SHADOW)


@pytest.mark.timeout(30)
def test_a_candidate_stands_beside_the_rule_in_force_and_counts_the_same_versions() -> None:
    table, changes = apply({}, make_rule(ruleId=1, limit=100))
    table, changes = apply(table, shadow(ruleId=1, limit=50), shadow(ruleId=2))
    assert changes == [(1, 2), (2, 1)]
    assert table[1].version == 1 and table[1].limit == 100, "the rule in force is unchanged"
    assert {i: (r.version, r.state) for i, r in table.book.candidates.items()} == {
        1: (2, RuleState.SHADOW),
        2: (1, RuleState.SHADOW),
    }
    assert [(r.rule_id, r.version) for r in table.book.in_force()] == [(1, 1), (1, 2), (2, 1)]
    _, again = apply(table, shadow(ruleId=1, limit=50))
    assert again == [], "the same candidate again writes nothing"


@pytest.mark.timeout(30)
def test_promote_makes_the_candidate_the_active_version_and_ends_it() -> None:
    table, _ = apply({}, make_rule(ruleId=1, limit=100), shadow(ruleId=1, limit=50))
    table, changes = apply(table, Promotion(1))
    assert changes == [(1, 3)]
    assert table[1].state is RuleState.ACTIVE and table[1].limit == 50
    assert table.book.candidates == {}
    with pytest.raises(UnknownRuleError, match="no shadow candidate to promote"):
        plan_changes(table.book, [Promotion(1)])


@pytest.mark.timeout(30)
def test_a_new_rule_can_be_tried_in_shadow_and_promoted() -> None:
    table, _ = apply({}, shadow(ruleId=9))
    assert 9 not in table.book.live
    with pytest.raises(UnknownRuleError, match="ruleId 9 is not in force"):
        plan_changes(table.book, [StateChange(9, RuleState.PAUSE)])
    table, changes = apply(table, Promotion(9))
    assert changes == [(9, 2)] and table[9].state is RuleState.ACTIVE


@pytest.mark.timeout(30)
def test_discard_withdraws_the_candidate_and_leaves_the_rule_in_force() -> None:
    table, _ = apply({}, make_rule(ruleId=1), shadow(ruleId=1, limit=7))
    table, changes = apply(table, StateChange(1, RuleState.DISCARD))
    assert changes == [(1, 3)] and table.history[-1].state is RuleState.DISCARD
    assert table.book.candidates == {} and table[1].version == 1
    with pytest.raises(UnknownRuleError, match="no shadow candidate to discard"):
        plan_changes(table.book, [StateChange(1, RuleState.DISCARD)])
    table, changes = apply(table, shadow(ruleId=1, limit=7))
    assert changes == [(1, 4)], "a discarded candidate can be tried again"


@pytest.mark.timeout(30)
def test_pausing_the_rule_in_force_keeps_its_candidate_running() -> None:
    table, _ = apply({}, make_rule(ruleId=1), shadow(ruleId=1, limit=7))
    table, _ = apply(table, StateChange(1, RuleState.PAUSE))
    assert table[1].state is RuleState.PAUSE and table.book.candidates[1].limit == 7


@pytest.mark.timeout(30)
def test_applying_the_candidate_as_active_is_its_promotion() -> None:
    table, _ = apply({}, make_rule(ruleId=1), shadow(ruleId=1, limit=7))
    table, changes = apply(table, make_rule(ruleId=1, limit=7))
    assert changes == [(1, 3)] and table.book.candidates == {}
    _, none = apply(table, shadow(ruleId=1, limit=7))
    assert none == [], "a candidate equal to the rule in force would only repeat it"


@pytest.mark.timeout(30)
def test_delete_all_discards_the_candidates_too_and_export_keeps_them() -> None:
    table, _ = apply({}, make_rule(ruleId=1), shadow(ruleId=1, limit=7), shadow(ruleId=2))
    _, result = plan_changes(table.book, [Control(ControlType.EXPORT_RULES_CURRENT)])
    assert [(r["ruleId"], r["ruleState"]) for r in result.exports[0]] == [
        (1, "ACTIVE"),
        (1, "SHADOW"),
        (2, "SHADOW"),
    ]
    table, changes = apply(table, Control(ControlType.DELETE_RULES_ALL))
    assert changes == [(1, 3), (1, 4), (2, 2)]
    assert table.book.in_force() == []
