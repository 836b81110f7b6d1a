"""A naive reference evaluator of SPEC §3: slow, short and obviously correct.

For every accepted event ``e`` at time ``t`` and every ACTIVE rule ``r`` whose
filter ``e`` passes, it rescans all events for

    window(r, e) = { x : filter_r(x), key_r(x) = key_r(e), floor_g(t − W) <= x.eventTime <= t }

and computes the aggregate from scratch, with exact arithmetic:

- COUNT: the number of events in the window;
- UNIQUE_COUNT: the number of distinct canonical non-null values of the field;
- SUM / MIN / MAX: over the exact Decimal values of the numeric field (SUM in a
  context wide enough to never round, with ``Inexact`` trapped so it cannot);
- AVG: exact SUM divided by the number of non-null values, a ``Fraction``.

It is O(n²) per rule on purpose and shares no code with ``velocity.domain.windows`` or
``velocity.domain.buckets``: ``floor_g`` and the filter and key checks are written out
here, and the comparison is done on Fractions with Python's own operators. It
uses ``velocity.domain.schema`` only for the canonical values already held by ``Event``
and which fields are numeric, and ``velocity.domain.rules`` only for the ``Rule`` objects.

Design choices already made in the engine (SPEC §3 is silent), followed here:

- An event lacking a value for one of the rule's grouping fields is not
  evaluated by that rule and is in no one's window for that rule (no "null" key).
- SUM, AVG, MIN and MAX over a window with no numeric values have no value and
  never fire, whatever the operator (``!=`` included).
- ``events`` are accepted and already de-duplicated; input order does not matter.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Callable, Sequence
from decimal import Decimal, Inexact, localcontext
from fractions import Fraction
from typing import NamedTuple

from velocity.domain.rules import Aggregator, Operator, Rule, RuleState
from velocity.domain.schema import FIELDS_BY_NAME, Event

AggregateValue = Decimal | Fraction
Pair = tuple[int, str]  # (ruleId, transactionId)

_SPEC_BUCKET_SECONDS = (1, 2, 5, 10, 15, 20, 30, 60)
_COMPARE: dict[Operator, Callable[[Fraction, Fraction], bool]] = {
    Operator.EQUAL: operator.eq,
    Operator.NOT_EQUAL: operator.ne,
    Operator.GREATER_EQUAL: operator.ge,
    Operator.LESS_EQUAL: operator.le,
    Operator.GREATER: operator.gt,
    Operator.LESS: operator.lt,
}


class ReferenceResult(NamedTuple):
    """What fired: the pairs, and per pair the aggregate value and the window's lower edge."""

    fired: set[Pair]
    values: dict[Pair, AggregateValue]
    window_starts: dict[Pair, int]


def floor_g(value: int, width_ms: int) -> int:
    """SPEC §3: ``v - (v mod g)``, with the mathematical modulus (floors negatives too)."""
    return value - (value % width_ms)


def passes_filter(rule: Rule, event: Event) -> bool:
    """Every filtered field equals (as a canonical string) one of its allowed values."""
    return all(event.values.get(name) in allowed for name, allowed in rule.filter)


def key_of(rule: Rule, event: Event) -> tuple[str, ...] | None:
    """The event's values of the rule's grouping fields; None when any is missing."""
    key = tuple(event.values.get(name) for name in rule.grouping_keys)
    if any(value is None for value in key):
        return None
    return tuple(str(value) for value in key)


def aggregate(rule: Rule, window: Sequence[Event]) -> AggregateValue | None:
    """The rule's aggregate of a window, from scratch; None when it has no value."""
    if rule.aggregator is Aggregator.COUNT:
        return Decimal(len(window))
    field = rule.aggregate_field
    if field is None:
        raise ValueError(f"rule {rule.rule_id}: {rule.aggregator} without a field")
    values = [event.values.get(field) for event in window]
    present = [value for value in values if value is not None]
    if rule.aggregator is Aggregator.UNIQUE_COUNT:
        return Decimal(len(set(present)))
    if not FIELDS_BY_NAME[field].numeric:
        raise ValueError(f"rule {rule.rule_id}: {rule.aggregator} over non-numeric {field}")
    numbers = [Decimal(value) for value in present]
    if not numbers:
        return None
    if rule.aggregator is Aggregator.MIN:
        return min(numbers)
    if rule.aggregator is Aggregator.MAX:
        return max(numbers)
    with localcontext() as ctx:
        ctx.prec = 400
        ctx.traps[Inexact] = True
        total = sum(numbers, Decimal(0))
    if rule.aggregator is Aggregator.SUM:
        return total
    if rule.aggregator is Aggregator.AVG:
        return Fraction(total) / len(numbers)
    raise ValueError(f"unknown aggregator {rule.aggregator!r}")


def fires(rule: Rule, value: AggregateValue | None) -> bool:
    """``value OP limit`` compared exactly; no value never fires."""
    if value is None:
        return False
    return _COMPARE[rule.operator](Fraction(value), Fraction(rule.limit))


def reference_alerts(
    events: Sequence[Event], rules: Sequence[Rule], bucket_seconds: int
) -> ReferenceResult:
    """The complete-data result of SPEC §3 for ``events`` under the ACTIVE ``rules``.

    ``rules`` must have distinct ruleIds (a pair names one rule).
    """
    if bucket_seconds not in _SPEC_BUCKET_SECONDS:
        raise ValueError(f"bucket_seconds {bucket_seconds} is not allowed by SPEC §3")
    width_ms = bucket_seconds * 1000
    result = ReferenceResult(set(), {}, {})
    for rule in rules:
        if rule.state is not RuleState.ACTIVE:
            continue
        window_ms = rule.window_minutes * 60_000
        # Grouping by key first only saves time; the window is still rescanned per event.
        by_key: dict[tuple[str, ...], list[Event]] = defaultdict(list)
        for event in events:
            key = key_of(rule, event)
            if key is not None and passes_filter(rule, event):
                by_key[key].append(event)
        for members in by_key.values():
            for event in members:
                t = event.event_time
                lower = floor_g(t - window_ms, width_ms)
                window = [x for x in members if lower <= x.event_time <= t]
                value = aggregate(rule, window)
                if fires(rule, value):
                    pair = (rule.rule_id, event.transaction_id)
                    if pair in result.fired:
                        raise ValueError(f"duplicate ruleId or transactionId: {pair}")
                    result.fired.add(pair)
                    result.values[pair] = value  # type: ignore[assignment]  # fires() => not None
                    result.window_starts[pair] = lower
    return result
