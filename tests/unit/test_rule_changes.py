"""Rule versioning, planned without Spark (velocity.rule_changes)."""

from __future__ import annotations

import pytest

from tests.builders import make_rule
from velocity.errors import UnknownRuleError
from velocity.rule_changes import outcome_lines, plan_changes
from velocity.rules import Control, ControlType, Rule, RuleState, StateChange


def apply(current: dict[int, Rule], *entries) -> tuple[dict[int, Rule], list[tuple[int, int]]]:
    written, result = plan_changes(current, list(entries))
    latest = dict(current)
    for rule in written:
        latest[rule.rule_id] = rule
    return latest, [(c.rule_id, c.version) for c in result.changes]


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
        plan_changes(latest, [StateChange(2, RuleState.PAUSE)])
    _, changes = apply(latest, make_rule(ruleId=2))
    assert changes == [(2, 3)]


def test_export_sees_the_entries_before_it() -> None:
    _, result = plan_changes(
        {}, [make_rule(ruleId=5), Control(ControlType.EXPORT_RULES_CURRENT), make_rule(ruleId=6)]
    )
    assert [r["ruleId"] for r in result.exports[0]] == [5]


def test_rule_epochs_keep_the_latest_record_of_a_batch_in_batch_order() -> None:
    from velocity.rule_changes import RuleEpochs, rule_versions, rule_versions_text

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
    current = {1: make_rule(ruleId=1).with_version(1)}
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
