"""The versioned rule store on a real Delta table."""

from __future__ import annotations

import json

import pytest

from velocity.cli import sample_rules_path
from velocity.delta.rule_store import RuleStore
from velocity.delta.tables import RULES, read_table
from velocity.errors import UnknownRuleError
from velocity.rules import Control, ControlType, RuleState, StateChange, parse_rules

pytestmark = pytest.mark.spark


@pytest.fixture
def store(spark, data_settings) -> RuleStore:
    return RuleStore(spark, data_settings.table_path(RULES))


def test_apply_versions_pause_delete_and_history(store: RuleStore) -> None:
    sample = parse_rules(sample_rules_path().read_text())
    result = store.apply(sample)
    assert [(c.rule_id, c.version) for c in result.changes] == [(i, 1) for i in range(1, 9)]

    changed = json.loads(sample_rules_path().read_text())[0] | {"limit": 1234}
    store.apply(parse_rules(json.dumps(changed)))
    store.apply([StateChange(4, RuleState.PAUSE), StateChange(5, RuleState.DELETE)])

    in_force = {r.rule_id: r for r in store.in_force()}
    assert sorted(in_force) == [1, 2, 3, 4, 6, 7, 8]
    assert (in_force[1].version, str(in_force[1].limit)) == (2, "1234")
    assert (in_force[4].version, in_force[4].state) == (2, RuleState.PAUSE)
    versions = [(r.rule_id, r.version, r.state.value) for r in store.history()]
    assert (1, 1, "ACTIVE") in versions and (1, 2, "ACTIVE") in versions
    assert (5, 2, "DELETE") in versions

    # A deleted rule re-created continues its version numbers.
    store.apply([parse_rules(sample_rules_path().read_text())[4]])
    assert {r.rule_id: r.version for r in store.in_force()}[5] == 3


def test_unknown_state_change_applies_nothing(store: RuleStore, spark, data_settings) -> None:
    sample = parse_rules(sample_rules_path().read_text())
    store.apply(sample[:2])
    before = read_table(spark, data_settings.table_path(RULES)).count()
    with pytest.raises(UnknownRuleError, match="ruleId 99"):
        store.apply([sample[2], StateChange(99, RuleState.PAUSE)])
    assert read_table(spark, data_settings.table_path(RULES)).count() == before
    assert [r.rule_id for r in store.in_force()] == [1, 2]


def test_controls_delete_all_and_export(store: RuleStore) -> None:
    sample = parse_rules(sample_rules_path().read_text())
    result = store.apply(
        [
            *sample[:3],
            Control(ControlType.EXPORT_RULES_CURRENT),
            Control(ControlType.DELETE_RULES_ALL),
            Control(ControlType.CLEAR_STATE_ALL),
        ]
    )
    assert [r["ruleId"] for r in result.exports[0]] == [1, 2, 3]
    assert result.clear_state is True
    assert store.in_force() == []
    # The export reads back as the same rules.
    reparsed = parse_rules(json.dumps(result.exports[0]))
    assert [r.to_json() for r in reparsed] == result.exports[0]
