"""The preview's pure parts: the span, per-hour counts, the sample, the difference against
the version in force, and ``decide_span`` against the naive reference over all events."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tests.builders import accepted_rows, make_rule
from tests.reference import reference_alerts
from velocity.analyst.preview import (
    HOUR_MS,
    KEYED_ARROW,
    Span,
    baseline,
    decide_span,
    diff_alerts,
    event_fields,
    hourly_counts,
    read_from,
    rule_previews,
    sample_positions,
    span_of,
)
from velocity.delta.preview_reader import alert_schema
from velocity.domain.rules import Rule, RuleState
from velocity.domain.schema import Event, parse_event_line
from velocity.domain.windows import format_aggregate
from velocity.errors import UsageError
from velocity.generate import GenerateOptions, generate_events

pytestmark = pytest.mark.timeout(120)

END = 1_767_225_600_000 + 5 * HOUR_MS


def test_span_is_the_last_hours_before_and_at_the_newest_event() -> None:
    assert span_of(END, 1) == Span(END - HOUR_MS, END)
    assert span_of(END, 0.25) == Span(END - HOUR_MS // 4, END)
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(UsageError, match="hours must be a positive number"):
            span_of(END, bad)


def test_history_reaches_the_lower_edge_of_the_earliest_windows() -> None:
    span = Span(END - HOUR_MS, END)
    short = make_rule(windowMinutes=10)
    wide = make_rule(ruleId=2, windowMinutes=1440)
    # floor_g(start - W): START is on a bucket edge, so exactly W before it.
    assert read_from(span, [short], 60_000) == span.start - 10 * 60_000
    assert read_from(span, [short, wide], 60_000) == span.start - 1440 * 60_000
    odd = Span(END - HOUR_MS + 1_500, END)
    assert read_from(odd, [short], 60_000) == END - HOUR_MS - 10 * 60_000  # rounded down


def test_hours_count_back_from_the_end_and_exclude_the_start() -> None:
    span = Span(END - 2 * HOUR_MS, END)
    times = np.array([END, END - 1, END - HOUR_MS + 1, END - HOUR_MS, END - 2 * HOUR_MS + 1])
    hours = hourly_counts(np.append(times, END - 2 * HOUR_MS), span)  # the start: not in it
    assert [(h.start, h.end, h.alerts) for h in hours] == [
        (END - 2 * HOUR_MS, END - HOUR_MS, 2),
        (END - HOUR_MS, END, 3),
    ]


def test_a_fractional_span_has_a_partial_oldest_hour() -> None:
    span = span_of(END, 1.5)
    hours = hourly_counts(np.array([END - HOUR_MS - 1, END - 10]), span)
    assert [(h.start, h.end, h.alerts) for h in hours] == [
        (END - HOUR_MS - HOUR_MS // 2, END - HOUR_MS, 1),
        (END - HOUR_MS, END, 1),
    ]


def test_sample_spreads_over_the_span_and_is_deterministic() -> None:
    times = np.array([50, 10, 40, 20, 30, 60, 70, 80, 90, 100])
    picks = sample_positions(times, 3)
    assert times[picks].tolist() == [10, 50, 100]
    assert sample_positions(times, 3).tolist() == picks.tolist()
    assert sorted(times[sample_positions(times, 20)].tolist()) == sorted(times.tolist())
    assert sample_positions(times[:0], 5).tolist() == []
    assert sample_positions(times, 0).tolist() == []


def _fired(rows: list[tuple[str, int, str]]) -> pa.Table:
    ids, times, values = zip(*rows, strict=True) if rows else ((), (), ())
    return pa.table(
        {
            "transactionId": pa.array(ids, pa.string()),
            "eventTime": pa.array(times, pa.int64()),
            "aggregateValue": pa.array(values, pa.string()),
        }
    )


def test_difference_is_per_transaction() -> None:
    candidate = _fired([("a", 3, "5"), ("b", 1, "7"), ("c", 2, "9"), ("d", 4, "1.5")])
    in_force = _fired([("b", 1, "7"), ("c", 2, "8"), ("e", 5, "2"), ("d", 4, "1.5")])
    diff = diff_alerts(candidate, in_force, shown=10)
    assert (diff.added, diff.removed, diff.changed, diff.unchanged) == (1, 1, 1, 2)
    assert [(e.transaction_id, e.candidate, e.in_force) for e in diff.added_shown] == [
        ("a", "5", None)
    ]
    assert [(e.transaction_id, e.event_time, e.in_force) for e in diff.removed_shown] == [
        ("e", 5, "2")
    ]
    assert [(e.transaction_id, e.candidate, e.in_force) for e in diff.changed_shown] == [
        ("c", "9", "8")
    ]


def test_difference_without_a_version_in_force_adds_everything_and_shows_the_first() -> None:
    candidate = _fired([(f"t{i}", 100 - i, "1") for i in range(30)])
    diff = diff_alerts(candidate, _fired([]), shown=3)
    assert (diff.added, diff.removed, diff.changed, diff.unchanged) == (30, 0, 0, 0)
    assert [e.event_time for e in diff.added_shown] == [71, 72, 73]


def test_baseline_is_the_version_in_force_of_the_rule_id() -> None:
    one = make_rule(ruleId=1).with_version(3)
    two = make_rule(ruleId=2).with_version(1)
    assert baseline([one, two], 2) == two
    assert baseline([one, two], 9) is None
    # A later version in another state (a standing shadow candidate, in the rule store's
    # in_force beside the rule in force) is not the version in force.
    other = make_rule(ruleId=1, limit=5).with_version(4).with_state(RuleState.DELETE)
    assert baseline([one, other, two], 1) == one
    paused = one.with_state(RuleState.PAUSE)
    assert baseline([paused, other], 1) == paused


def test_event_fields_are_those_the_signatures_read() -> None:
    rule = make_rule(
        groupingKeyNames=["payerId"], aggregatorFunctionType="UNIQUE_COUNT",
        aggregateFieldName="ip", filter={"paymentType": "CRD"},
    )  # fmt: skip
    assert event_fields([rule]) == ["eventTime", "transactionId", "ip", "payerId", "paymentType"]


def test_keyed_rows_schema_equals_the_backtests() -> None:
    from velocity.spark import evaluate

    assert KEYED_ARROW.equals(evaluate._KEYED_ARROW)


# --- decide_span against the reference -----------------------------------------------------

RULES = [
    {"ruleId": 1, "groupingKeyNames": ["payerId"], "aggregatorFunctionType": "COUNT",
     "limitOperatorType": ">=", "limit": 3, "windowMinutes": 5},
    {"ruleId": 2, "groupingKeyNames": ["payerId"], "aggregatorFunctionType": "SUM",
     "aggregateFieldName": "paymentAmount", "limitOperatorType": ">", "limit": 20000,
     "windowMinutes": 30, "filter": {"paymentType": "CRD"}},
    {"ruleId": 3, "groupingKeyNames": ["payerId"], "aggregatorFunctionType": "UNIQUE_COUNT",
     "aggregateFieldName": "ip", "limitOperatorType": ">=", "limit": 2, "windowMinutes": 15},
    {"ruleId": 4, "groupingKeyNames": ["beneficiaryId"], "aggregatorFunctionType": "AVG",
     "aggregateFieldName": "paymentAmount", "limitOperatorType": "<", "limit": 800,
     "windowMinutes": 2},
]  # fmt: skip


def _rules() -> list[Rule]:
    return [make_rule(ruleState="ACTIVE", **r) for r in RULES]


@pytest.fixture(scope="module")
def lines(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    folder: Path = tmp_path_factory.mktemp("events")
    options = GenerateOptions(
        events=900, rate=0.5, payers=25, files=1, spike_fraction=0.05, late_fraction=0.05,
        duplicate_fraction=0, malformed_fraction=0, seed=5,
    )  # fmt: skip
    generate_events(folder, options)
    return [line for p in sorted(folder.glob("*.jsonl")) for line in p.read_text().splitlines()]


def _events_table(lines: list[str]) -> pa.Table:
    """The lines as events-table columns, parsed as the stream parses them."""
    return accepted_rows(lines)


def test_decide_span_equals_the_reference_over_all_events_within_the_span(
    lines: list[str],
) -> None:
    rules = _rules()
    events = [e for e in map(parse_event_line, lines) if isinstance(e, Event)]
    newest = max(e.event_time for e in events)
    span = span_of(newest, 0.2)  # 12 of the 30 minutes: every window reaches before it
    table = _events_table(lines)
    low = read_from(span, rules, 60_000)
    history = table.filter(pa.compute.greater_equal(table.column("eventTime"), low))
    fired = decide_span(history.select(event_fields(rules)), rules, span, 60_000)

    expected = reference_alerts(events, rules, 60)
    in_span = {
        (rule_id, tx)
        for rule_id, tx in expected.fired
        if span.start < next(e.event_time for e in events if e.transaction_id == tx) <= span.end
    }
    got = {}
    for rule, one in zip(rules, fired, strict=True):
        alerts = one.alerts(7, alert_schema())
        for row in alerts.to_pylist():
            got[(rule.rule_id, row["transactionId"])] = row
    assert set(got) == in_span
    assert {r for r, _ in in_span} == {1, 2, 3, 4}, "every rule must fire in the span"
    for pair, row in got.items():
        assert row["aggregateValue"] == format_aggregate(expected.values[pair])
        assert row["windowStart"] == expected.window_starts[pair]
        assert row["ruleVersion"] == 0 and row["decisionTime"] == 7


def test_rule_previews_compare_with_the_version_in_force(lines: list[str]) -> None:
    rules = _rules()
    table = _events_table(lines)
    newest = pa.compute.max(table.column("eventTime")).as_py()
    span = span_of(newest, 0.2)
    in_force = [r.with_version(4) for r in rules]
    # The candidates: rule 1 with a higher limit (fewer alerts), rule 2 over a longer
    # window (other values), rule 3 unchanged, rule 4 paused in force (fires nothing).
    candidates = [
        make_rule(**{**RULES[0], "limit": 4}),
        make_rule(**{**RULES[1], "windowMinutes": 60}),
        make_rule(**{**RULES[2], "cooldownMinutes": 5}),
        make_rule(**RULES[3]),
    ]
    in_force[3] = in_force[3].with_state(RuleState.PAUSE)
    previews = rule_previews(
        table.select(event_fields([*candidates, *in_force])),
        candidates, in_force, span, 60_000, 7, alert_schema(), sample_size=3,
    )  # fmt: skip
    one, two, three, four = previews
    assert one.in_force == in_force[0] and one.in_force_alerts > one.alerts > 0
    assert one.diff.added == 0 and one.diff.changed == 0
    assert one.diff.removed == one.in_force_alerts - one.alerts
    assert two.diff.changed > 0 and two.diff.removed == 0
    assert three.diff.unchanged == three.alerts == three.in_force_alerts > 0
    # Its 5-minute cooldown would notify fewer, each hour; the version in force all.
    assert 0 < three.notified < three.alerts and three.in_force_notified == three.alerts
    assert all(h.notified <= h.alerts for h in three.per_hour)
    assert sum(h.notified for h in three.per_hour) == three.notified
    assert (three.diff.added, three.diff.removed, three.diff.changed) == (0, 0, 0)
    assert four.in_force_alerts == 0 and four.diff.added == four.alerts > 0
    for preview in previews:
        assert sum(h.alerts for h in preview.per_hour) == preview.alerts
        assert len(preview.sample) == min(3, preview.alerts)
        for sample in preview.sample:
            assert sample.explanation is not None
            assert sample.explanation.agrees, sample.explanation.verdict
            assert sample.window_events == len(sample.explanation.events)
            assert sample.alert["ruleVersion"] == 0
    json_form = one.to_json()
    assert json_form["inForce"]["version"] == 4 and json_form["rule"]["version"] == 0


def test_a_version_in_force_like_the_candidate_is_decided_once_and_differs_in_nothing(
    lines: list[str],
) -> None:
    rules = _rules()
    table = _events_table(lines)
    span = span_of(pa.compute.max(table.column("eventTime")).as_py(), 0.2)
    in_force = [r.with_version(2) for r in rules]
    previews = rule_previews(
        table.select(event_fields(rules)), rules, in_force, span, 60_000, 7, alert_schema()
    )
    for preview in previews:
        assert preview.in_force_alerts == preview.alerts == preview.diff.unchanged > 0
        assert preview.in_force_per_hour == preview.per_hour
