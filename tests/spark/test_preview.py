"""The preview (delta-rs and the kernel in this process) equals a backtest of the same
events on Spark, restricted to the span, and its differences equal those of the
backtest's alerts of the candidates and of the versions in force."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pytest
from benchmarks.preview import write_live_events

from tests.spark.test_backtest import EXTRA_RULES
from velocity.analyst.preview import decide_span, event_fields, read_from, span_of
from velocity.delta.names import EVENTS, RULES
from velocity.delta.preview_reader import alert_schema, newest_event_time, preview, read_events
from velocity.delta.rule_store import RuleStore
from velocity.delta.small_tables import open_table
from velocity.domain.rules import Rule, parse_rules
from velocity.generate import GenerateOptions, generate_events
from velocity.resources import sample_rules_path
from velocity.settings import Settings
from velocity.spark.backtest import run_backtest

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

HOURS = 0.2  # 12 minutes of the ~33 the events span: every window reaches before it


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Accepted events only (the live table holds no duplicate or malformed line), late
    ones among them: the preview, like the backtest, decides on complete data."""
    folder = tmp_path_factory.mktemp("preview-events")
    generate_events(
        folder,
        GenerateOptions(
            events=4000, rate=2.0, payers=40, files=3, spike_fraction=0.03,
            late_fraction=0.03, duplicate_fraction=0, malformed_fraction=0, seed=13,
        ),
    )  # fmt: skip
    return folder


def _candidates() -> list[Rule]:
    """The sample rules and the backtest test's extra ones (every aggregator), unsaved
    (version 0), as a rules file gives them."""
    sample = json.loads(sample_rules_path().read_text())
    extra = [{"ruleState": "ACTIVE", **r} for r in EXTRA_RULES]
    return [e for e in parse_rules(json.dumps(sample + extra)) if isinstance(e, Rule)]


def _in_force_objects() -> list[dict]:
    """Versions in force of three ruleIds, other than the candidates: COUNT = 3 where the
    candidate has COUNT = 2 (alerts added and removed), a shorter SUM window (changed
    values), and one the same (nothing differs)."""
    by_id = {r["ruleId"]: r for r in EXTRA_RULES}
    return [
        {"ruleState": "ACTIVE", **by_id[17], "limit": 3},
        {"ruleState": "ACTIVE", **by_id[12], "windowMinutes": 3},
        {"ruleState": "ACTIVE", **by_id[16]},
    ]


def test_preview_equals_the_backtest_within_the_span(
    spark, data_settings: Settings, generated: Path, tmp_path: Path
) -> None:
    settings = data_settings
    candidates = _candidates()
    in_force = [
        r.with_version(1)
        for r in parse_rules(json.dumps(_in_force_objects()))
        if isinstance(r, Rule)
    ]
    write_live_events(sorted(generated.glob("*.jsonl")), settings.table_path(EVENTS), 700)
    RuleStore(settings.table_path(RULES)).apply(parse_rules(json.dumps(_in_force_objects())))

    # The backtest decides every event with every rule: candidates (version 0) and the
    # versions in force (1), in one Spark run over the same lines.
    out = tmp_path / "alerts.jsonl"
    run_backtest(spark, settings, [*candidates, *in_force], str(generated), out, decision_time=7)
    backtest = [json.loads(line) for line in out.read_text().splitlines()]

    table = open_table(settings.table_path(EVENTS))
    assert table is not None
    newest = newest_event_time(table)
    span = span_of(newest, HOURS)
    in_span = [a for a in backtest if span.start < a["eventTime"] <= span.end]
    expected = {
        (a["alertId"], a["aggregateValue"], a["windowStart"], a["windowEnd"]) for a in in_span
    }

    rules = [*candidates, *in_force]
    low = read_from(span, rules, settings.bucket_width_ms)
    events = read_events(table, event_fields(rules), low, span.end)
    assert pc.min(events.column("eventTime")).as_py() >= low
    fired = decide_span(events, rules, span, settings.bucket_width_ms)
    got = [row for f in fired for row in f.alerts(7, alert_schema()).to_pylist()]
    assert len(got) == len({a["alertId"] for a in got}), "one alert per (rule, event)"
    assert {(a["alertId"], a["aggregateValue"], a["windowStart"], a["windowEnd"]) for a in got} == (
        expected
    )
    assert {a["ruleId"] for a in in_span} >= {r["ruleId"] for r in EXTRA_RULES}

    # The whole preview: the same counts per rule, and the differences of the backtest's
    # alerts of the candidate and of the version in force.
    result = preview(settings, candidates, hours=HOURS, now_ms=7)
    assert result.span == span
    by_version: dict[tuple[int, int], dict[str, str]] = {}
    for a in in_span:
        by_version.setdefault((a["ruleId"], a["ruleVersion"]), {})[a["transactionId"]] = a[
            "aggregateValue"
        ]
    for rule in result.rules:
        mine = by_version.get((rule.rule.rule_id, 0), {})
        theirs = by_version.get((rule.rule.rule_id, 1), {}) if rule.in_force else {}
        assert rule.alerts == len(mine)
        assert rule.in_force_alerts == len(theirs)
        both = mine.keys() & theirs.keys()
        changed = sum(1 for tx in both if mine[tx] != theirs[tx])
        assert (rule.diff.added, rule.diff.removed, rule.diff.changed) == (
            len(mine.keys() - theirs.keys()),
            len(theirs.keys() - mine.keys()),
            changed,
        )
        for sample in rule.sample:
            assert sample.explanation is not None
            assert sample.explanation.agrees, sample.explanation.verdict
            assert sample.alert["alertId"] in {a["alertId"] for a in in_span}
    diffs = {r.rule.rule_id: r.diff for r in result.rules}
    assert diffs[17].removed > 0 and diffs[17].added > 0
    assert diffs[12].changed > 0
    assert diffs[16].unchanged > 0 and (diffs[16].added, diffs[16].removed) == (0, 0)
