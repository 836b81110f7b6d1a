"""SPEC §4: the alert record and its deterministic identity."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import BASE_TIME, SPEC_ALERT_FIELDS, keyed_event, make_rule
from velocity.domain.alerts import (
    AlertKind,
    alert_id,
    alert_record,
    amended,
    record_of_stored,
    rule_key,
)
from velocity.domain.windows import Decision

SPEC_FIELDS = SPEC_ALERT_FIELDS


def test_alert_kinds_are_the_spec_three() -> None:
    assert [k.value for k in AlertKind] == ["ALERT", "CORRECTION", "RETRACTION"]


def test_alert_id_is_deterministic_and_a_uuid() -> None:
    first = alert_id(1, 3, "tx-9", AlertKind.ALERT)
    assert first == alert_id(1, 3, "tx-9", AlertKind.ALERT)
    assert str(uuid.UUID(first)) == first


_alert_parts = st.tuples(
    st.integers(1, 50), st.integers(0, 5), st.text(max_size=6), st.sampled_from(AlertKind)
)


@given(_alert_parts, _alert_parts)
@settings(max_examples=500, deadline=None)
def test_alert_id_differs_when_any_part_differs(
    a: tuple[int, int, str, AlertKind], b: tuple[int, int, str, AlertKind]
) -> None:
    assert (alert_id(*a) == alert_id(*b)) is (a == b)


@pytest.mark.parametrize(
    "other",
    [
        (2, 3, "tx-9", AlertKind.ALERT),
        (1, 4, "tx-9", AlertKind.ALERT),
        (1, 3, "tx-10", AlertKind.ALERT),
        (1, 3, "tx-9", AlertKind.CORRECTION),
        (1, 3, "tx-9", AlertKind.RETRACTION),
        (13, 3, "tx-9", AlertKind.ALERT),
        (1, 33, "tx-9", AlertKind.ALERT),
    ],
)
def test_alert_id_is_distinct_across_rule_version_transaction_and_kind(
    other: tuple[int, int, str, AlertKind],
) -> None:
    assert alert_id(*other) != alert_id(1, 3, "tx-9", AlertKind.ALERT)


def _decision(value: Decimal | Fraction = Decimal("250000.00"), **rule_fields: object) -> Decision:
    rule = make_rule(
        ruleId=1, groupingKeyNames=["payerId", "beneficiaryId"], limit=200000, **rule_fields
    ).with_version(3)
    event = keyed_event(BASE_TIME, "tx-9", number=value if isinstance(value, Decimal) else 1)
    return Decision(rule, event, value, BASE_TIME - 1440 * 60_000)


@pytest.mark.parametrize("kind", list(AlertKind))
def test_record_has_every_spec_field(kind: AlertKind) -> None:
    key = {"payerId": "25", "beneficiaryId": "12"}
    record = alert_record(_decision(), key, decision_time=BASE_TIME + 312, kind=kind)
    assert set(record) == SPEC_FIELDS
    assert record == {
        "alertId": alert_id(1, 3, "tx-9", kind),
        "kind": kind.value,
        "ruleId": 1,
        "ruleVersion": 3,
        "transactionId": "tx-9",
        "key": {"payerId": "25", "beneficiaryId": "12"},
        "eventTime": BASE_TIME,
        "aggregatorFunctionType": "SUM",
        "aggregateValue": "250000",
        "limitOperatorType": ">",
        "limit": "200000",
        "windowStart": BASE_TIME - 1440 * 60_000,
        "windowEnd": BASE_TIME,
        "decisionTime": BASE_TIME + 312,
        "outcome": "ALERT",
    }


def test_record_defaults_to_alert_and_is_plain_json() -> None:
    record = alert_record(_decision(), {"payerId": "25", "beneficiaryId": "12"}, 0)
    assert record["kind"] == "ALERT"
    assert json.loads(json.dumps(record)) == record


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Decimal("250000.50"), "250000.5"),
        (Fraction(1, 3), "0.33333333"),
        (Decimal("1E+6"), "1000000"),
    ],
)
def test_aggregate_value_and_limit_are_decimal_strings(
    value: Decimal | Fraction, text: str
) -> None:
    record = alert_record(_decision(value), {"payerId": "25", "beneficiaryId": "12"}, 0)
    assert record["aggregateValue"] == text
    assert isinstance(record["limit"], str)


def test_fractional_limit_is_a_plain_decimal_string() -> None:
    decision = _decision()
    rule = make_rule(limit=Decimal("0.00000001"))
    record = alert_record(Decision(rule, decision.event, decision.value, 0), {}, 0)
    assert record["limit"] == "0.00000001"


def test_key_is_a_copy() -> None:
    key = {"payerId": "25", "beneficiaryId": "12"}
    record = alert_record(_decision(), key, 0)
    key["payerId"] = "changed"
    assert record["key"]["payerId"] == "25"


def test_rule_key_maps_signature_order_to_the_rules_grouping_order() -> None:
    rule = make_rule(groupingKeyNames=["payerId", "ip", "beneficiaryId"])
    assert rule.signature.grouping_keys == ("beneficiaryId", "ip", "payerId")
    key = rule_key(rule, ("b-1", "10.0.0.1", "p-1"))
    assert key == {"payerId": "p-1", "ip": "10.0.0.1", "beneficiaryId": "b-1"}
    assert list(key) == ["payerId", "ip", "beneficiaryId"]


def test_rule_key_of_a_global_rule_is_empty() -> None:
    assert rule_key(make_rule(groupingKeyNames=[]), ()) == {}


def test_rule_key_rejects_a_key_of_the_wrong_length() -> None:
    with pytest.raises(ValueError):
        rule_key(make_rule(groupingKeyNames=["payerId"]), ("a", "b"))


@pytest.mark.parametrize("kind", [AlertKind.CORRECTION, AlertKind.RETRACTION])
def test_amended_record_keeps_the_decision_and_names_itself(kind: AlertKind) -> None:
    fired = alert_record(_decision(), {"payerId": "25"}, decision_time=BASE_TIME + 1)
    record = amended({**fired, "signature_id": "abc"}, kind, BASE_TIME + 99, "run-1")
    assert set(record) == SPEC_FIELDS
    assert record["kind"] == kind.value
    assert record["alertId"] == alert_id(1, 3, "tx-9", kind, "run-1") != fired["alertId"]
    again = amended({**fired, "signature_id": "abc"}, kind, BASE_TIME + 99, "run-2")
    assert again["alertId"] != record["alertId"], "a later run's amendment is a new alert"
    assert record["decisionTime"] == BASE_TIME + 99
    unchanged = SPEC_FIELDS - {"kind", "alertId", "decisionTime"}
    assert {f: record[f] for f in unchanged} == {f: fired[f] for f in unchanged}
    record["key"]["payerId"] = "other"
    assert fired["key"] == {"payerId": "25"}, "the key is a copy"


def test_an_amendment_is_never_an_alert() -> None:
    fired = alert_record(_decision(), {"payerId": "25"}, decision_time=0)
    with pytest.raises(ValueError, match="CORRECTION or RETRACTION"):
        amended(fired, AlertKind.ALERT, 0, "run")


@pytest.mark.parametrize("outcome", ["REVIEW", "BLOCK"])
def test_the_rule_version_s_outcome_is_carried_by_its_alerts_and_their_amendments(
    outcome: str,
) -> None:
    fired = alert_record(_decision(outcome=outcome.lower()), {"payerId": "25"}, 0)
    assert fired["outcome"] == outcome
    for kind in (AlertKind.CORRECTION, AlertKind.RETRACTION):
        assert amended(fired, kind, 9, "run")["outcome"] == outcome
    assert record_of_stored({**fired, "signature_id": "s"})["outcome"] == outcome


def test_a_stored_row_of_an_older_velocity_reads_as_alert() -> None:
    fired = alert_record(_decision(outcome="BLOCK"), {"payerId": "25"}, 0)
    for older in ({**fired, "outcome": None}, {k: v for k, v in fired.items() if k != "outcome"}):
        assert record_of_stored(older)["outcome"] == "ALERT"
        assert amended(older, AlertKind.RETRACTION, 9, "run")["outcome"] == "ALERT"
