"""The words the page shows for each rule a pre-authorization check evaluated
(``check_working``): what the rule measures, over which window and key, the value with the
payment's own part, the comparison, and what follows (pure)."""

from __future__ import annotations

from typing import Any

from tests.builders import ABSENT, event, make_rule
from velocity.analyst.explain import check_working


def checked(**fields: Any) -> dict[str, Any]:
    """One entry of a check's ``rules`` (SPEC §5a), rule 1 firing by default."""
    base = {
        "ruleId": 1, "ruleVersion": 3, "outcome": "BLOCK", "key": {"payerId": "p-18"},
        "fired": True, "aggregateValue": "250120.5", "limitOperatorType": ">",
        "limit": "200000", "windowStart": 0, "windowEnd": 1,
    }  # fmt: skip
    return {**base, **fields}


def test_a_firing_rule_reads_as_its_sum_with_the_payment_s_part_and_the_outcome() -> None:
    rule = make_rule(groupingKeyNames=["payerId"], outcome="BLOCK").with_version(3)
    assert check_working(checked(), rule, event(paymentAmount="120.50")) == (
        "SUM(paymentAmount) over 1 d by payerId=p-18 = 250120.5 (the payment's 120.5 "
        "included) > 200000 → fires: BLOCK"
    )


def test_a_rule_that_does_not_fire_says_so_and_a_key_reads_in_the_rule_s_order() -> None:
    rule = make_rule(groupingKeyNames=["payerId", "beneficiaryId"], windowMinutes=90)
    words = check_working(
        checked(key={"beneficiaryId": "b-1", "payerId": "p-18"}, fired=False, aggregateValue="7"),
        rule,
        event(paymentAmount=7),
    )
    assert words == (
        "SUM(paymentAmount) over 1 h 30 min by payerId=p-18, beneficiaryId=b-1 = 7 (the "
        "payment's 7 included), not > 200000 → does not fire"
    )


def test_a_count_of_all_payments_within_its_cooldown_would_be_suppressed() -> None:
    rule = make_rule(
        groupingKeyNames=[], aggregatorFunctionType="COUNT", aggregateFieldName=ABSENT,
        limitOperatorType=">=", limit=3, windowMinutes=1, cooldownMinutes=10, outcome="REVIEW",
    )  # fmt: skip
    entry = checked(key={}, outcome="REVIEW", aggregateValue="4", limitOperatorType=">=")
    entry["limit"] = "3"
    assert check_working({**entry, "notified": False}, rule, event()) == (
        "COUNT() over 1 min of all payments = 4 (the payment included) >= 3 → fires: REVIEW; "
        "its alert would be suppressed: this key alerted within its 10-minute cooldown"
    )
    assert check_working({**entry, "notified": True}, rule, event()).endswith(
        "; its alert would be notified (none of this key's within its 10-minute cooldown)"
    )


def test_a_payment_without_the_measured_field_and_a_window_without_a_value() -> None:
    rule = make_rule(
        groupingKeyNames=["payerId"], aggregatorFunctionType="UNIQUE_COUNT",
        aggregateFieldName="ip", limit=2, windowMinutes=5,
    )  # fmt: skip
    entry = checked(fired=False, aggregateValue="0", limit="2")
    assert check_working(entry, rule, event()) == (
        "UNIQUE_COUNT(ip) over 5 min by payerId=p-18 = 0 (the payment has no ip), not > 2 "
        "→ does not fire"
    )
    assert check_working({**entry, "aggregateValue": None}, rule, event()) == (
        "UNIQUE_COUNT(ip) over 5 min by payerId=p-18: no value in the window (the payment has "
        "no ip) → does not fire"
    )
    assert "(the payment's 10.0.0.1 included)" in check_working(entry, rule, event(ip="10.0.0.1"))


def test_a_rule_version_not_known_here_is_named_by_its_id() -> None:
    assert check_working(checked(), None, event()) == (
        "ruleId 1 v3 by payerId=p-18 = 250120.5 > 200000 → fires: BLOCK"
    )
