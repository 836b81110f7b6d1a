"""An alert against its rule version (pure): exact decimals, AVG's display rounding."""

from __future__ import annotations

from decimal import Decimal

import pytest

from tests.builders import make_rule
from velocity.domain.rules import Operator
from velocity.quality.alert_values import alert_violation, avg_may_satisfy, rule_terms


def check(
    value: str,
    op: str = ">",
    limit: str = "200000",
    aggregator: str = "SUM",
    kind: str = "ALERT",
    rule: tuple[str, str, str] | None = None,
) -> str | None:
    """``alert_violation`` of an alert whose rule version has ``rule`` (aggregator, op,
    limit); by default the alert's own terms."""
    rule_aggregator, rule_op, rule_limit = rule or (aggregator, op, limit)
    return alert_violation(
        kind, 1, 2, "tx-9", aggregator, value, op, limit, rule_aggregator, rule_op, rule_limit
    )


@pytest.mark.parametrize(
    ("value", "op", "limit"),
    [
        ("200000.00000001", ">", "200000"),
        ("200000", ">=", "200000"),
        ("5", "<", "5.00000001"),
        ("5", "<=", "5"),
        ("7", "=", "7.0"),
        ("7", "!=", "7.00000001"),
        # Far beyond a double's 16 digits: a float comparison would call these equal.
        ("99999999999999999999.00000001", ">", "99999999999999999999"),
    ],
)
def test_an_alert_whose_value_satisfies_its_rule_passes(value: str, op: str, limit: str) -> None:
    assert check(value, op, limit) is None


@pytest.mark.parametrize(
    ("value", "op", "limit"),
    [
        ("200000", ">", "200000"),
        ("199999.99999999", ">=", "200000"),
        ("5", "<", "5"),
        ("7", "!=", "7"),
        ("99999999999999999999", ">", "99999999999999999999.00000001"),
    ],
)
def test_an_alert_whose_value_does_not_satisfy_its_rule_is_named(
    value: str, op: str, limit: str
) -> None:
    message = check(value, op, limit)

    assert message == (
        f"ruleId 1 v2 tx tx-9 ALERT: aggregateValue {value} {op} limit {limit} does not hold"
    )


def test_corrections_are_checked_and_retractions_only_for_their_rule_version() -> None:
    assert check("1", kind="CORRECTION") is not None
    assert check("1", kind="RETRACTION") is None
    assert check("1", kind="RETRACTION", rule=("SUM", ">", "5")) is not None


def test_an_alert_must_carry_its_rule_versions_terms() -> None:
    assert "rule version not in the rules table" in (
        alert_violation("ALERT", 1, 9, "tx", "SUM", "5", ">", "1", None, None, None) or ""
    )
    assert "limit 1 but the rule version has 2" in (
        check("5", ">", "1", rule=("SUM", ">", "2")) or ""
    )
    assert "operator > but the rule version has >=" in (
        check("5", ">", "1", rule=("SUM", ">=", "1")) or ""
    )
    assert "aggregator SUM but the rule version has MAX" in (
        check("5", ">", "1", rule=("MAX", ">", "1")) or ""
    )
    # Equal limits in different spellings are the same limit.
    assert check("5", ">", "1.0", rule=("SUM", ">", "1")) is None
    assert "is not a decimal" in (check("NaN") or "")


def test_avg_is_judged_by_every_exact_value_its_rounded_display_may_stand_for() -> None:
    # 1/3 > 0.33333333 fires, and is shown as 0.33333333.
    assert check("0.33333333", ">", "0.33333333", aggregator="AVG") is None
    # 0.333333325 rounds half-even to 0.33333332; shown 0.33333332 cannot exceed 0.33333333.
    assert check("0.33333332", ">", "0.33333333", aggregator="AVG") is not None
    assert check("0.33333333", "<", "0.33333333", aggregator="AVG") is None
    assert check("0.33333333", "=", "0.333333334", aggregator="AVG") is None
    assert check("0.33333333", "=", "0.33333334", aggregator="AVG") is not None
    # Exactly half a unit away is still possible (half-even rounding may land there).
    assert avg_may_satisfy(Decimal("0.5"), Operator.GREATER_EQUAL, Decimal("0.500000005"))
    assert not avg_may_satisfy(Decimal("0.5"), Operator.GREATER, Decimal("0.500000005"))
    assert avg_may_satisfy(Decimal("2"), Operator.NOT_EQUAL, Decimal("2"))


def test_rule_terms_are_canonical_strings_per_version() -> None:
    rule = make_rule(ruleId=4, limitOperatorType="gte", limit=Decimal("2.50")).with_version(3)

    assert rule_terms([rule]) == [(4, 3, "SUM", ">=", "2.5")]
