"""The versioned rule store on a real Delta table (delta-rs, no JVM): versions, all-or-nothing
applies, and concurrent appliers that never write a (ruleId, version) twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from tests.builders import make_rule, rule_obj, rules_text
from velocity.delta import small_tables
from velocity.delta.rule_store import RuleStore
from velocity.domain.rules import Control, ControlType, RuleState, StateChange, parse_rules
from velocity.errors import InvalidRuleError, UnknownRuleError
from velocity.resources import sample_rules_path

pytestmark = pytest.mark.timeout(120)

VELOCITY = str(Path(sys.executable).parent / "velocity")


@pytest.fixture
def store(tmp_path: Path) -> RuleStore:
    # A space in the path: delta-rs names the data files by percent-encoded URIs.
    return RuleStore(tmp_path / "data dir" / "tables" / "rules")


def _pairs(store: RuleStore) -> list[tuple[int, int]]:
    return [(r.rule_id, r.version) for r in store.history()]


def test_apply_versions_pause_delete_and_history(store: RuleStore) -> None:
    assert store.history() == [] and store.in_force() == [], "no table yet: no rules"
    sample = parse_rules(sample_rules_path().read_text())
    result = store.apply(sample)
    assert [(c.rule_id, c.version) for c in result.changes] == [(i, 1) for i in range(1, 9)]
    assert DeltaTable(str(store.path)).version() == 1, "created, then one commit for 8 rules"

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
    assert str(next(r for r in store.history() if r.rule_id == 1).limit) == "200000"

    # A deleted rule re-created continues its version numbers; the same rule again is no change.
    store.apply([sample[4]])
    assert {r.rule_id: r.version for r in store.in_force()}[5] == 3
    before = DeltaTable(str(store.path)).version()
    assert store.apply([sample[4]]).changes == []
    assert DeltaTable(str(store.path)).version() == before, "nothing to apply: no commit"


def test_an_unknown_state_change_applies_nothing_of_its_file(store: RuleStore) -> None:
    sample = parse_rules(sample_rules_path().read_text())
    store.apply(sample[:2])
    before = DeltaTable(str(store.path)).version()
    with pytest.raises(UnknownRuleError, match="ruleId 99"):
        store.apply([sample[2], StateChange(99, RuleState.PAUSE)])
    assert DeltaTable(str(store.path)).version() == before
    assert [r.rule_id for r in store.in_force()] == [1, 2]


def test_an_invalid_rule_rejects_its_file_whole_and_names_the_field(store: RuleStore) -> None:
    store.apply([make_rule(ruleId=1)])
    before = DeltaTable(str(store.path)).version()
    text = rules_text([rule_obj(ruleId=2), rule_obj(ruleId=3, windowMinutes=0)])
    with pytest.raises(InvalidRuleError) as rejected:
        store.apply(parse_rules(text))
    assert [p.field for p in rejected.value.problems] == ["windowMinutes"]
    assert "ruleId 3" in str(rejected.value)
    assert DeltaTable(str(store.path)).version() == before
    assert _pairs(store) == [(1, 1)]


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
    assert _pairs(store) == [(1, 1), (1, 2), (2, 1), (2, 2), (3, 1), (3, 2)]
    # The export reads back as the same rules.
    reparsed = parse_rules(json.dumps(result.exports[0]))
    assert [r.to_json() for r in reparsed] == result.exports[0]


def test_an_applier_that_loses_the_race_reads_again_and_commits_on_top(
    store: RuleStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forced interleaving: another applier commits between this one's read and its write."""
    store.apply([make_rule(ruleId=1)])
    other = RuleStore(store.path)
    real_write = small_tables.write_deltalake
    calls: list[int] = []

    def write_after_another(*args: Any, **kwargs: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            # The other applier plans from the same snapshot and commits first.
            monkeypatch.setattr(small_tables, "write_deltalake", real_write)
            assert [c.version for c in other.apply([make_rule(ruleId=1, limit=2)]).changes] == [2]
            monkeypatch.setattr(small_tables, "write_deltalake", write_after_another)
        real_write(*args, **kwargs)

    monkeypatch.setattr(small_tables, "write_deltalake", write_after_another)
    result = store.apply([make_rule(ruleId=1, limit=3)])
    assert len(calls) == 2, "the first commit failed, the second landed"
    assert [c.version for c in result.changes] == [3], "planned again on top of version 2"
    assert _pairs(store) == [(1, 1), (1, 2), (1, 3)]
    assert [str(r.limit) for r in store.history()] == ["200000", "2", "3"]


def test_concurrent_cli_appliers_each_get_their_own_version(tmp_path: Path) -> None:
    """Six `velocity rules apply` processes at once, each changing ruleId 1's limit: every
    change lands as its own version, none is written twice or lost."""
    env = {**os.environ, "VELOCITY_DATA_DIR": str(tmp_path / "data")}
    first = tmp_path / "first.json"
    first.write_text(rules_text([rule_obj(ruleId=1)]))
    subprocess.run([VELOCITY, "rules", "apply", str(first)], env=env, check=True, timeout=60)
    appliers = []
    for limit in range(1, 7):
        path = tmp_path / f"limit-{limit}.json"
        path.write_text(rules_text([rule_obj(ruleId=1, limit=limit)]))
        appliers.append(
            subprocess.Popen(
                [VELOCITY, "rules", "apply", str(path)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outputs = [p.communicate(timeout=90) for p in appliers]
    assert [p.returncode for p in appliers] == [0] * 6, outputs
    said = sorted(out.strip() for out, _ in outputs)
    assert said == [f"ruleId 1: version {v} ACTIVE" for v in range(2, 8)]

    store = RuleStore(tmp_path / "data" / "tables" / "rules")
    pairs = _pairs(store)
    assert Counter(pairs).most_common(1)[0][1] == 1, "no (ruleId, version) twice"
    assert pairs == [(1, v) for v in range(1, 8)]
    assert sorted(str(r.limit) for r in store.history()[1:]) == [str(n) for n in range(1, 7)]


def test_a_rule_change_from_the_cli_starts_no_jvm(tmp_path: Path) -> None:
    """`velocity rules` imports neither pyspark nor pandas: it answers in well under 2 s."""
    probe = (
        "import sys\n"
        "from velocity.cli.main import main\n"
        "codes = [main(['rules', 'apply', sys.argv[1]]), main(['rules', 'pause', '4']),\n"
        "         main(['rules', 'activate', '4']), main(['rules', 'list'])]\n"
        "heavy = sorted(m for m in ('pyspark', 'pandas', 'py4j') if m in sys.modules)\n"
        "print('codes', codes, 'heavy', heavy)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(sample_rules_path())],
        env={**os.environ, "VELOCITY_DATA_DIR": str(tmp_path / "data")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "ruleId 4: version 2 PAUSE" in done.stdout
    assert "ruleId 4: version 3 ACTIVE" in done.stdout
    assert "codes [0, 0, 0, 0] heavy []" in done.stdout


def test_shadow_promote_and_discard_through_the_command_line(tmp_path: Path) -> None:
    """`velocity rules shadow|promote|discard` on a real table: a candidate stands beside
    the rule in force with the next version, a promote makes it ACTIVE in one commit, a
    discard withdraws it; what cannot apply says why and writes nothing."""
    env = {**os.environ, "VELOCITY_DATA_DIR": str(tmp_path / "data")}

    def velocity(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [VELOCITY, "rules", *args], env=env, capture_output=True, text=True, timeout=60
        )

    rules = tmp_path / "rules.json"
    rules.write_text(rules_text([rule_obj(ruleId=1), rule_obj(ruleId=2)]))
    assert velocity("apply", str(rules)).returncode == 0
    candidates = tmp_path / "candidates.json"
    # Written ACTIVE: `rules shadow` adds whatever state a file says as a candidate.
    candidates.write_text(rules_text([rule_obj(ruleId=1, limit=7), rule_obj(ruleId=9)]))
    shadowed = velocity("shadow", str(candidates))
    assert shadowed.stdout.splitlines() == [
        "ruleId 1: version 2 SHADOW",
        "ruleId 9: version 1 SHADOW",
    ], shadowed.stderr
    listed = [json.loads(line) for line in velocity("list").stdout.splitlines()]
    assert [(r["ruleId"], r["version"], r["ruleState"]) for r in listed] == [
        (1, 1, "ACTIVE"), (1, 2, "SHADOW"), (2, 1, "ACTIVE"), (9, 1, "SHADOW"),
    ]  # fmt: skip

    store = RuleStore(tmp_path / "data" / "tables" / "rules")
    before = DeltaTable(str(store.path)).version()
    promoted = velocity("promote", "1")
    assert promoted.stdout.strip() == "ruleId 1: version 3 ACTIVE", promoted.stderr
    assert DeltaTable(str(store.path)).version() == before + 1, "one table version"
    book = store.book()
    assert str(book.live[1].limit) == "7" and 1 not in book.candidates

    assert velocity("discard", "9").stdout.strip() == "ruleId 9: version 2 DISCARD"
    assert store.book().candidates == {}
    refused = velocity("promote", "2")
    assert refused.returncode != 0 and "ruleId 2 has no shadow candidate" in refused.stderr
    assert DeltaTable(str(store.path)).version() == before + 2, "a refusal writes nothing"
    discard_in_a_file = tmp_path / "discard.json"
    discard_in_a_file.write_text('{"ruleId": 1, "ruleState": "DISCARD"}')
    rejected = velocity("apply", str(discard_in_a_file))
    assert rejected.returncode != 0 and "velocity rules discard" in rejected.stderr
