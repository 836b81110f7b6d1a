"""`velocity explain`: the events of an alert's window give its value, and the figures add up."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import BASE_TIME, event, events, make_rule, rule_sets
from tests.reference import key_of, reference_alerts
from velocity.analyst.explain import explain_alert
from velocity.domain.rules import Rule
from velocity.domain.schema import Event
from velocity.domain.windows import format_aggregate


def _alert(rule: Rule, trigger: Event, value: str, window_start: int) -> dict:
    key = dict(zip(rule.grouping_keys, key_of(rule, trigger) or (), strict=True))
    return {
        "alertId": "a-1",
        "kind": "ALERT",
        "ruleId": rule.rule_id,
        "ruleVersion": rule.version,
        "transactionId": trigger.transaction_id,
        "key": key,
        "eventTime": trigger.event_time,
        "aggregatorFunctionType": rule.aggregator.value,
        "aggregateValue": value,
        "limitOperatorType": rule.operator.value,
        "limit": str(rule.limit),
        "windowStart": window_start,
        "windowEnd": trigger.event_time,
        "decisionTime": trigger.event_time,
    }


@settings(max_examples=150, deadline=None)
@given(evs=events(max_size=30), rules=rule_sets(), seconds=st.sampled_from([1, 10, 60]))
def test_every_complete_data_alert_is_explained_by_its_window(evs, rules, seconds) -> None:
    expected = reference_alerts(evs, rules, seconds)
    by_id = {r.rule_id: r for r in rules}
    by_tx = {e.transaction_id: e for e in evs}
    for rule_id, tx in expected.fired:
        rule = by_id[rule_id]
        value = format_aggregate(expected.values[(rule_id, tx)])
        alert = _alert(rule, by_tx[tx], value, expected.window_starts[(rule_id, tx)])
        explanation = explain_alert(alert, rule, reversed(evs))
        assert explanation.agrees, explanation.to_json()
        assert explanation.recomputed is not None
        assert Decimal(explanation.recomputed) == Decimal(value)
        assert tx in {e.transaction_id for e in explanation.events}


def test_the_sum_is_the_events_of_the_key_and_window_added_up() -> None:
    rule = make_rule(
        groupingKeyNames=["payerId"], aggregatorFunctionType="SUM", limit=100, windowMinutes=1
    )
    counted = [
        event(transactionId="t1", payerId="p", eventTime=BASE_TIME, paymentAmount="60.5"),
        event(transactionId="t2", payerId="p", eventTime=BASE_TIME + 30_000, paymentAmount="40"),
    ]
    trigger = event(transactionId="t3", payerId="p", eventTime=BASE_TIME + 60_000, paymentAmount=1)
    ignored = [
        event(transactionId="other-key", payerId="q", eventTime=BASE_TIME, paymentAmount=999),
        event(transactionId="later", payerId="p", eventTime=BASE_TIME + 60_001, paymentAmount=7),
        event(transactionId="too-old", payerId="p", eventTime=BASE_TIME - 1, paymentAmount=5),
    ]
    alert = _alert(rule, trigger, "101.5", BASE_TIME)
    explanation = explain_alert(alert, rule, [*ignored, trigger, *counted])
    assert [e.transaction_id for e in explanation.events] == ["t1", "t2", "t3"]
    assert explanation.arithmetic == "60.5 + 40 + 1 = 101.5"
    assert sum(Decimal(e["value"]) for e in explanation.to_json()["events"]) == Decimal("101.5")
    assert explanation.agrees
    assert "101.5 > 100" in explanation.verdict


def test_an_event_that_arrived_after_the_decision_makes_the_recount_differ() -> None:
    rule = make_rule(groupingKeyNames=["payerId"], aggregatorFunctionType="COUNT", limit=1)
    trigger = event(transactionId="t2", payerId="p", eventTime=BASE_TIME + 10)
    window = [event(transactionId="t1", payerId="p", eventTime=BASE_TIME), trigger]
    late = event(transactionId="late", payerId="p", eventTime=BASE_TIME + 5)
    alert = _alert(rule, trigger, "2", BASE_TIME - 86_400_000)
    assert explain_alert(alert, rule, window).agrees
    recount = explain_alert(alert, rule, [*window, late])
    assert not recount.agrees
    assert recount.recomputed == "3"
    assert "arrived after the decision" in recount.verdict


def test_an_alert_is_explained_only_by_its_own_rule_version() -> None:
    rule = make_rule().with_version(2)
    trigger = event()
    alert = _alert(rule, trigger, "1", BASE_TIME)
    with pytest.raises(ValueError, match="v1 explained with ruleId 1 v3"):
        explain_alert({**alert, "ruleVersion": 1}, rule.with_version(3), [trigger])
    with pytest.raises(ValueError, match="RETRACTION"):
        explain_alert({**alert, "kind": "RETRACTION"}, rule, [trigger])


def test_a_suppressed_alert_names_the_notified_alert_that_suppressed_it() -> None:
    from velocity.domain.alerts import AlertKind, alert_id

    rule = make_rule(
        groupingKeyNames=["payerId"],
        aggregatorFunctionType="COUNT",
        limit=0,
        windowMinutes=10,
        cooldownMinutes=30,
    ).with_version(2)
    first, second = event(transactionId="t-1"), event(transactionId="t-2", eventTime=BASE_TIME + 1)
    notified = explain_alert(_alert(rule, first, "1", BASE_TIME), rule, [first])
    assert notified.to_json()["suppressedByAlertId"] is None
    assert "notified" in (notified.notification or "")
    alert = {**_alert(rule, second, "2", BASE_TIME), "suppressed": True, "suppressedBy": "t-1"}
    suppressed = explain_alert(alert, rule, [first, second]).to_json()
    first_id = alert_id(rule.rule_id, 2, "t-1", AlertKind.ALERT)
    assert suppressed["suppressedByAlertId"] == first_id
    assert (
        first_id in suppressed["notification"]
        and "30-minute cooldown" in suppressed["notification"]
    )
    no_cooldown = make_rule(groupingKeyNames=["payerId"], aggregatorFunctionType="COUNT", limit=0)
    assert (
        explain_alert(_alert(no_cooldown, first, "1", BASE_TIME), no_cooldown, [first]).notification
        is None
    )
