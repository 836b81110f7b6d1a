"""Does a stored alert satisfy its rule? The exact check behind the alerts suite (pure).

An ALERT or CORRECTION says "``aggregateValue OP limit`` held for this rule version".
The check reads the version's own terms (aggregator, operator, limit) from the rules
table, so an alert that copied a wrong limit is caught too, and compares as exact
decimals, never floats. AVG is stored rounded half-even to ``AVG_DISPLAY_PLACES``
places while the engine compares the exact fraction, so an AVG alert passes when some
value within half a unit of its last place satisfies the rule (``1/3 > 0.33333333``
fires although the shown ``0.33333333`` is not greater). RETRACTION rows withdraw an
alert and carry no claim about the limit; only their rule version is checked.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal, InvalidOperation

from velocity.domain.decimals import format_decimal
from velocity.domain.rules import Aggregator, Operator, Rule
from velocity.domain.windows import AVG_DISPLAY_PLACES

# Half a unit in the last shown place of an AVG: the most its rounding can move it.
_AVG_HALF_UNIT = Decimal(5).scaleb(-(AVG_DISPLAY_PLACES + 1))
CLAIMING_KINDS = frozenset({"ALERT", "CORRECTION"})


def rule_terms(rules: Iterable[Rule]) -> list[tuple[int, int, str, str, str]]:
    """(ruleId, version, aggregator, operator, limit) of every rule version, as strings."""
    return [
        (r.rule_id, r.version, r.aggregator.value, r.operator.value, format_decimal(r.limit))
        for r in rules
    ]


def _decimal(text: str | None) -> Decimal | None:
    if text is None:
        return None
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def avg_may_satisfy(shown: Decimal, operator: Operator, limit: Decimal) -> bool:
    """Whether some exact average that rounds to ``shown`` satisfies ``OP limit``."""
    low, high = shown - _AVG_HALF_UNIT, shown + _AVG_HALF_UNIT
    match operator:
        case Operator.GREATER:
            return high > limit
        case Operator.GREATER_EQUAL:
            return high >= limit
        case Operator.LESS:
            return low < limit
        case Operator.LESS_EQUAL:
            return low <= limit
        case Operator.EQUAL:
            return low <= limit <= high
        case Operator.NOT_EQUAL:
            return True  # the interval holds more than one value, so one differs from limit
    raise AssertionError(operator)  # unreachable: match is exhaustive


def alert_violation(
    kind: str | None,
    rule_id: int | None,
    rule_version: int | None,
    transaction_id: str | None,
    aggregator: str | None,
    value: str | None,
    operator: str | None,
    limit: str | None,
    rule_aggregator: str | None,
    rule_operator: str | None,
    rule_limit: str | None,
) -> str | None:
    """None when the alert agrees with its rule version; else why not, naming the alert.

    ``rule_*`` are the version's terms from the rules table (None: no such version).
    """
    who = f"ruleId {rule_id} v{rule_version} tx {transaction_id} {kind}"
    if rule_aggregator is None or rule_operator is None or rule_limit is None:
        return f"{who}: rule version not in the rules table"
    if aggregator != rule_aggregator:
        return f"{who}: aggregator {aggregator} but the rule version has {rule_aggregator}"
    try:
        alert_op, version_op = Operator(operator or ""), Operator(rule_operator)
    except ValueError:
        return f"{who}: limitOperatorType {operator!r} is not a canonical operator"
    if alert_op is not version_op:
        return f"{who}: operator {operator} but the rule version has {rule_operator}"
    recorded_limit, version_limit = _decimal(limit), _decimal(rule_limit)
    if recorded_limit is None or version_limit is None or recorded_limit != version_limit:
        return f"{who}: limit {limit} but the rule version has {rule_limit}"
    if kind not in CLAIMING_KINDS:
        return None
    number = _decimal(value)
    if number is None:
        return f"{who}: aggregateValue {value!r} is not a decimal"
    holds = (
        avg_may_satisfy(number, version_op, version_limit)
        if aggregator == Aggregator.AVG.value
        else version_op.holds(number, version_limit)
    )
    if holds:
        return None
    return f"{who}: aggregateValue {value} {operator} limit {rule_limit} does not hold"
