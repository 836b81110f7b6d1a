"""SPEC §3 window evaluation: the engine against the naive reference, and both engines agree.

``evaluate_key_history`` (sliding window, backtest/backfill) and
``window_from_buckets`` (stored buckets plus the event's partial own bucket, the
stream and Redis) must both equal ``tests.reference.reference_alerts`` on random
events and rules: equal timestamps, times on bucket and window edges, filters,
empty grouping keys, missing grouping fields, every aggregator and operator.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import (
    BASE_TIME,
    MINUTE_MS,
    bucket_seconds,
    event,
    events,
    keyed_event,
    keyed_histories,
    make_rule,
    rule_sets,
)
from tests.reference import AggregateValue, Pair, reference_alerts
from velocity.domain.buckets import (
    EMPTY,
    BucketAggregate,
    bucket_start,
    bucket_width_ms,
    merge_all,
    window_start,
)
from velocity.domain.rules import Aggregator, Operator, Rule, rules_by_signature
from velocity.domain.schema import Event
from velocity.domain.windows import (
    AVG_DISPLAY_PLACES,
    KeyedEvent,
    aggregate_value,
    evaluate_key_history,
    evaluate_with_buckets,
    fired_value,
    fires,
    format_aggregate,
    rule_check,
    window_from_buckets,
)

Outcome = dict[Pair, tuple[Fraction, int]]  # pair -> (aggregate value, window start)


# ---------------------------------------------------------------- both engines, as callers run them


def sliding_alerts(events: Sequence[Event], rules: Sequence[Rule], seconds: int) -> Outcome:
    """What the backtest computes: evaluate_key_history per signature and key."""
    width = bucket_width_ms(seconds)
    out: Outcome = {}
    for signature, group in rules_by_signature(rules).items():
        for history in keyed_histories(events, signature).values():
            for decision in evaluate_key_history(history, group, width):
                pair = (decision.rule.rule_id, decision.event.transaction_id)
                assert pair not in out, f"{pair} decided twice"
                out[pair] = (Fraction(decision.value), decision.window_start)
    return out


def _of(e: KeyedEvent) -> BucketAggregate:
    return BucketAggregate.of_event(e.value, e.number)


def bucket_alerts(events: Sequence[Event], rules: Sequence[Rule], seconds: int) -> Outcome:
    """What the stream computes on complete data: whole buckets below, partial own bucket."""
    width = bucket_width_ms(seconds)
    out: Outcome = {}
    for signature, group in rules_by_signature(rules).items():
        for history in keyed_histories(events, signature).values():
            buckets: dict[int, BucketAggregate] = {}
            for e in history:
                start = bucket_start(e.event_time, width)
                buckets[start] = buckets.get(start, EMPTY).merge(_of(e))
            for e in history:
                own_start = bucket_start(e.event_time, width)
                own = merge_all(
                    _of(x)
                    for x in history
                    if bucket_start(x.event_time, width) == own_start
                    and x.event_time <= e.event_time
                )
                for rule in group:
                    agg = window_from_buckets(buckets, e.event_time, rule.window_ms, width, own)
                    value = aggregate_value(agg, rule.aggregator)
                    if fires(rule, value):
                        assert value is not None
                        lower = window_start(e.event_time, rule.window_ms, width)
                        out[(rule.rule_id, e.transaction_id)] = (Fraction(value), lower)
    return out


def reference_outcome(events: Sequence[Event], rules: Sequence[Rule], seconds: int) -> Outcome:
    ref = reference_alerts(events, rules, seconds)
    assert set(ref.values) == ref.fired
    return {pair: (Fraction(ref.values[pair]), ref.window_starts[pair]) for pair in ref.fired}


def stream_alerts(
    events: Sequence[Event], rules: Sequence[Rule], seconds: int, targets_from: int = 0
) -> Outcome:
    """evaluate_with_buckets as the stream runs it: all events in state, decisions for
    the events from arrival position ``targets_from`` on (the latest micro-batch)."""
    width = bucket_width_ms(seconds)
    target_ids = {e.transaction_id for e in events[targets_from:]}
    out: Outcome = {}
    for signature, group in rules_by_signature(rules).items():
        for history in keyed_histories(events, signature).values():
            buckets: dict[int, BucketAggregate] = {}
            for e in history:
                start = bucket_start(e.event_time, width)
                buckets[start] = buckets.get(start, EMPTY).merge(_of(e))
            targets = [e for e in history if e.transaction_id in target_ids]
            owns = {bucket_start(t.event_time, width) for t in targets}
            own_events = [e for e in history if bucket_start(e.event_time, width) in owns]
            for decision in evaluate_with_buckets(buckets, own_events, targets, group, width):
                pair = (decision.rule.rule_id, decision.event.transaction_id)
                assert pair not in out, f"{pair} decided twice"
                out[pair] = (Fraction(decision.value), decision.window_start)
    return out


# ---------------------------------------------------------------- engine == naive reference


@given(events(max_size=25), rule_sets(), bucket_seconds, st.integers(0, 25))
@settings(max_examples=300, deadline=None)
def test_stream_evaluation_equals_sliding_window(
    evs: list[Event], rules: list[Rule], seconds: int, split: int
) -> None:
    expected = {
        pair: outcome
        for pair, outcome in sliding_alerts(evs, rules, seconds).items()
        if pair[1] in {e.transaction_id for e in evs[split:]}
    }
    assert stream_alerts(evs, rules, seconds, targets_from=split) == expected


@given(events(max_size=25), rule_sets(), bucket_seconds)
@settings(max_examples=400, deadline=None)
def test_sliding_window_equals_reference(evs: list[Event], rules: list[Rule], seconds: int) -> None:
    assert sliding_alerts(evs, rules, seconds) == reference_outcome(evs, rules, seconds)


@given(events(max_size=25), rule_sets(), bucket_seconds)
@settings(max_examples=300, deadline=None)
def test_buckets_equal_reference(evs: list[Event], rules: list[Rule], seconds: int) -> None:
    from_buckets = bucket_alerts(evs, rules, seconds)
    assert from_buckets == reference_outcome(evs, rules, seconds)
    assert from_buckets == sliding_alerts(evs, rules, seconds)


@given(events(max_size=20), rule_sets(), bucket_seconds, st.randoms(use_true_random=False))
@settings(max_examples=200, deadline=None)
def test_input_order_does_not_matter(
    evs: list[Event], rules: list[Rule], seconds: int, rnd: random.Random
) -> None:
    shuffled = list(evs)
    rnd.shuffle(shuffled)
    assert sliding_alerts(shuffled, rules, seconds) == sliding_alerts(evs, rules, seconds)


@given(events(max_size=25), rule_sets(max_size=3), bucket_seconds)
@settings(max_examples=150, deadline=None)
def test_decisions_come_in_event_time_then_input_order(
    evs: list[Event], rules: list[Rule], seconds: int
) -> None:
    width = bucket_width_ms(seconds)
    for signature, group in rules_by_signature(rules).items():
        for history in keyed_histories(evs, signature).values():
            position = {e.transaction_id: i for i, e in enumerate(history)}
            for rule in group:
                decided = [d.event for d in evaluate_key_history(history, [rule], width)]
                order = [(e.event_time, position[e.transaction_id]) for e in decided]
                assert order == sorted(order)


@given(events(min_size=1, max_size=15), bucket_seconds)
@settings(max_examples=100, deadline=None)
def test_a_rule_that_always_holds_fires_for_every_keyed_event(
    evs: list[Event], seconds: int
) -> None:
    # Guards against a vacuous comparison: COUNT >= 1 holds for every event (it is in
    # its own window), so every event with a key fires exactly once.
    rule = make_rule(
        groupingKeyNames=["payerId"],
        aggregatorFunctionType="COUNT",
        limitOperatorType=">=",
        limit=1,
        windowMinutes=1,
    )
    fired = sliding_alerts(evs, [rule], seconds)
    assert set(fired) == {(1, e.transaction_id) for e in evs}
    assert fired == reference_outcome(evs, [rule], seconds)


# ---------------------------------------------------------------- worked examples at the edges


def _count_rule(window_minutes: int = 1, **overrides: object) -> Rule:
    return make_rule(
        **{
            "groupingKeyNames": [],
            "aggregatorFunctionType": "COUNT",
            "limitOperatorType": ">=",
            "limit": 0,
            "windowMinutes": window_minutes,
            **overrides,
        }
    )


def _window_counts(times: Sequence[int], rule: Rule, seconds: int) -> dict[str, AggregateValue]:
    history = [keyed_event(t, f"t{i}") for i, t in enumerate(times)]
    decisions = evaluate_key_history(history, [rule], bucket_width_ms(seconds))
    return {d.event.transaction_id: d.value for d in decisions}


@pytest.mark.parametrize(
    ("seconds", "earlier", "counted"),
    [
        # Event at BASE+90s, W = 1 min: t − W = BASE+30s.
        (60, BASE_TIME, True),  # floored to BASE with g = 60 s: the lower edge is inclusive
        (60, BASE_TIME - 1, False),  # one ms before the floored edge
        (1, BASE_TIME + 30_000, True),  # g = 1 s: t − W is already an edge
        (1, BASE_TIME + 29_999, False),
        (20, BASE_TIME + 20_000, True),  # floor_20s(BASE+30s) = BASE+20s
        (20, BASE_TIME + 19_999, False),
    ],
)
def test_lower_edge_is_floored_to_a_bucket_and_inclusive(
    seconds: int, earlier: int, counted: bool
) -> None:
    counts = _window_counts([earlier, BASE_TIME + 90_000], _count_rule(), seconds)
    assert counts["t1"] == (2 if counted else 1)


def test_upper_edge_is_exact_and_equal_times_see_each_other() -> None:
    t = BASE_TIME + 10_000
    counts = _window_counts([t, t, t + 1, t - 1, t], _count_rule(), 60)
    assert counts == {"t3": 1, "t0": 4, "t1": 4, "t4": 4, "t2": 5}


def test_window_starts_and_values_are_reported_per_decision() -> None:
    rule = make_rule(
        groupingKeyNames=[],
        aggregatorFunctionType="SUM",
        limitOperatorType=">",
        limit=100,
        windowMinutes=2,
    )
    history = [
        keyed_event(BASE_TIME + 5_000, "a", number="60"),
        keyed_event(BASE_TIME + 65_000, "b", number="50.5"),
        keyed_event(BASE_TIME + 185_000, "c", number="1"),
    ]
    decisions = list(evaluate_key_history(history, [rule], 60_000))
    assert [(d.event.transaction_id, d.value, d.window_start) for d in decisions] == [
        ("b", Decimal("110.5"), BASE_TIME - MINUTE_MS),
    ]


def test_sliding_sum_stays_exact_after_events_leave_the_window() -> None:
    rule = make_rule(
        groupingKeyNames=[],
        aggregatorFunctionType="SUM",
        limitOperatorType="=",
        limit=Decimal("0.00000001"),
        windowMinutes=1,
    )
    history = [
        keyed_event(BASE_TIME, "big", number="999999999999999999.99999999"),
        keyed_event(BASE_TIME + 2 * MINUTE_MS, "small", number="0.00000001"),
    ]
    decided = [d.event.transaction_id for d in evaluate_key_history(history, [rule], 60_000)]
    assert decided == ["small"]


def test_min_and_max_follow_the_window_as_it_slides() -> None:
    history = [
        keyed_event(BASE_TIME, "a", number="5"),
        keyed_event(BASE_TIME + 61_000, "b", number="3"),
        keyed_event(BASE_TIME + 122_000, "c", number="4"),
        keyed_event(BASE_TIME + 183_000, "d", number="9"),
    ]
    lowest = make_rule(
        groupingKeyNames=[],
        aggregatorFunctionType="MIN",
        limitOperatorType=">=",
        limit=0,
        windowMinutes=1,
    )
    highest = make_rule(
        ruleId=2,
        groupingKeyNames=[],
        aggregatorFunctionType="MAX",
        limitOperatorType=">=",
        limit=0,
        windowMinutes=1,
    )
    decisions = evaluate_key_history(history, [lowest, highest], 1_000)
    got = {(d.rule.rule_id, d.event.transaction_id): d.value for d in decisions}
    # W = 1 min, g = 1 s: floor(t − 60 s) lies 1 s after the previous event (61 s
    # apart), so each window holds only its own event.
    assert got == {
        (1, "a"): 5,
        (1, "b"): 3,
        (1, "c"): 4,
        (1, "d"): 9,
        (2, "a"): 5,
        (2, "b"): 3,
        (2, "c"): 4,
        (2, "d"): 9,
    }
    got60 = {
        (d.rule.rule_id, d.event.transaction_id): d.value
        for d in evaluate_key_history(history, [lowest, highest], 60_000)
    }
    # g = 60 s: floor(t − 60 s) reaches back to the previous event's minute.
    assert got60 == {
        (1, "a"): 5,
        (1, "b"): 3,
        (1, "c"): 3,
        (1, "d"): 4,
        (2, "a"): 5,
        (2, "b"): 5,
        (2, "c"): 4,
        (2, "d"): 9,
    }


def test_avg_is_compared_exactly() -> None:
    # (1 + 1 + 1.00000001) / 3 = 1.0000000033..., above 1 and not equal to any decimal.
    history = [
        keyed_event(BASE_TIME + i, f"t{i}", number=n)
        for i, n in enumerate(["1", "1", "1.00000001"])
    ]
    above = make_rule(
        groupingKeyNames=[],
        aggregatorFunctionType="AVG",
        limitOperatorType=">",
        limit=1,
        windowMinutes=1,
    )
    equal = make_rule(
        ruleId=2,
        groupingKeyNames=[],
        aggregatorFunctionType="AVG",
        limitOperatorType="=",
        limit=Decimal("1.00000000333333333333333333333"),
        windowMinutes=1,
    )
    decisions = list(evaluate_key_history(history, [above, equal], 60_000))
    assert [(d.rule.rule_id, d.event.transaction_id) for d in decisions] == [(1, "t2")]
    assert decisions[0].value == Fraction(300000001, 300000000)


def test_unique_count_counts_distinct_values_and_skips_missing_ones() -> None:
    rule = make_rule(
        groupingKeyNames=[],
        aggregatorFunctionType="UNIQUE_COUNT",
        aggregateFieldName="ip",
        limitOperatorType=">=",
        limit=0,
        windowMinutes=1,
    )
    history = [
        keyed_event(BASE_TIME + i, f"t{i}", value=v)
        for i, v in enumerate(["a", None, "b", "a", None])
    ]
    got = {d.event.transaction_id: d.value for d in evaluate_key_history(history, [rule], 60_000)}
    assert got == {"t0": 1, "t1": 1, "t2": 2, "t3": 2, "t4": 2}


def test_an_event_without_a_grouping_value_is_in_no_window() -> None:
    rule = make_rule(
        groupingKeyNames=["ip"],
        aggregatorFunctionType="COUNT",
        limitOperatorType=">=",
        limit=1,
        windowMinutes=1,
    )
    evs = [
        event(transactionId="with", ip="1.1.1.1"),
        event(transactionId="without", ip=None),
        event(transactionId="with2", ip="1.1.1.1"),
    ]
    fired = sliding_alerts(evs, [rule], 60)
    assert {tx for _, tx in fired} == {"with", "with2"}
    assert fired[(1, "with2")][0] == 2


def test_numeric_aggregate_over_no_values_never_fires_even_for_not_equal() -> None:
    # A window of COUNT-only events (value None) has no SUM: "!= 5" must not fire.
    rule = make_rule(
        groupingKeyNames=[],
        aggregatorFunctionType="SUM",
        limitOperatorType="!=",
        limit=5,
        windowMinutes=1,
    )
    history = [keyed_event(BASE_TIME, "t0"), keyed_event(BASE_TIME + 1, "t1")]
    assert list(evaluate_key_history(history, [rule], 60_000)) == []


def test_exact_sum_over_many_large_amounts() -> None:
    # SPEC §1: exact decimals, no rounding in sums (101 × the largest amount needs 29 digits).
    largest = "999999999999999999.99999999"
    rule = make_rule(
        groupingKeyNames=[],
        aggregatorFunctionType="SUM",
        limitOperatorType=">",
        limit=0,
        windowMinutes=1,
    )
    history = [keyed_event(BASE_TIME + i, f"t{i}", number=largest) for i in range(101)]
    last = list(evaluate_key_history(history, [rule], 60_000))[-1]
    assert last.value == Decimal("100999999999999999999.99999899")


# ---------------------------------------------------------------- window_from_buckets directly


def test_window_from_buckets_ignores_buckets_at_or_after_its_own_and_before_the_window() -> None:
    width, window = 60_000, 2 * MINUTE_MS
    t = BASE_TIME + 30_000
    one = BucketAggregate.of_event(None)
    buckets = {
        BASE_TIME - 3 * MINUTE_MS: one,  # before the window
        BASE_TIME - 2 * MINUTE_MS: one,  # first bucket of the window
        BASE_TIME - 1 * MINUTE_MS: one,
        BASE_TIME: BucketAggregate(count=100),  # the own bucket: never read from the map
        BASE_TIME + MINUTE_MS: BucketAggregate(count=1000),  # the future
    }
    own = one.merge(one)
    got = window_from_buckets(buckets, t, window, width, own)
    assert got.count == 4


# ---------------------------------------------------------------- aggregate_value, fires, format


_AGG = merge_all(
    BucketAggregate.of_event(v, None if v is None else Decimal(v))
    for v in ["1", "2", "2", None, "0.5"]
)


@pytest.mark.parametrize(
    ("aggregator", "expected"),
    [
        (Aggregator.COUNT, Decimal(5)),
        (Aggregator.UNIQUE_COUNT, Decimal(3)),
        (Aggregator.SUM, Decimal("5.5")),
        (Aggregator.MIN, Decimal("0.5")),
        (Aggregator.MAX, Decimal(2)),
        (Aggregator.AVG, Fraction(11, 8)),
    ],
)
def test_aggregate_value(aggregator: Aggregator, expected: AggregateValue) -> None:
    assert aggregate_value(_AGG, aggregator) == expected


@pytest.mark.parametrize("aggregator", list(Aggregator))
def test_aggregate_value_of_an_empty_or_valueless_window(aggregator: Aggregator) -> None:
    valueless = BucketAggregate.of_event(None)
    for agg, count in ((EMPTY, 0), (valueless, 1)):
        value = aggregate_value(agg, aggregator)
        if aggregator is Aggregator.COUNT:
            assert value == count
        elif aggregator is Aggregator.UNIQUE_COUNT:
            assert value == 0
        else:
            assert value is None


@pytest.mark.parametrize("op", list(Operator))
def test_fires_never_without_a_value(op: Operator) -> None:
    rule = make_rule(limitOperatorType=op.value, limit=0)
    assert fires(rule, None) is False


@pytest.mark.parametrize(
    ("op", "value", "expected"),
    [
        (">", Decimal("200000.00000001"), True),
        (">", Decimal("200000"), False),
        (">=", Decimal("200000"), True),
        ("=", Fraction(400000, 2), True),
        ("!=", Fraction(1, 3), True),
        ("<", Fraction(1, 3), True),
        ("<=", Decimal("200000.00000001"), False),
    ],
)
def test_fires(op: str, value: AggregateValue, expected: bool) -> None:
    assert fires(make_rule(limitOperatorType=op, limit=200000), value) is expected


_AMOUNTS = st.decimals(min_value=-1000, max_value=1000, places=2, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(
    aggregator=st.sampled_from(list(Aggregator)),
    op=st.sampled_from(list(Operator)),
    limit=_AMOUNTS,
    values=st.lists(st.one_of(st.none(), _AMOUNTS), max_size=6),
)
def test_a_rule_check_equals_fired_value(
    aggregator: Aggregator, op: Operator, limit: Decimal, values: list[Decimal | None]
) -> None:
    """The stream's per-rule check is ``fired_value`` with its choices made once."""
    rule = make_rule(
        aggregatorFunctionType=aggregator.value, limitOperatorType=op.value, limit=limit
    )
    window = merge_all(BucketAggregate.of_event(None if v is None else str(v), v) for v in values)
    assert rule_check(rule)(window) == fired_value(window, rule)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (Fraction(1, 3), "0.33333333"),
        (Fraction(2, 3), "0.66666667"),
        (Fraction(5, 2), "2.5"),
        (Fraction(10, 1), "10"),
        (Fraction(0), "0"),
        # Half-even at the 9th place: ties go to the even 8th digit.
        (Fraction(15, 10**9), "0.00000002"),
        (Fraction(25, 10**9), "0.00000002"),
        (Fraction(35, 10**9), "0.00000004"),
        (Fraction(5, 10**9), "0"),
        (Fraction(51, 10**10), "0.00000001"),
        (Fraction(10**20 + 1, 3), "33333333333333333333.66666667"),
        (Decimal("250000.00"), "250000"),
        (Decimal("1E+3"), "1000"),
        (Decimal("0E-8"), "0"),
        (Decimal("100.50"), "100.5"),
        (Decimal("0.00000001"), "0.00000001"),
        (Decimal("100999999999999999999.99999899"), "100999999999999999999.99999899"),
    ],
    ids=repr,
)
def test_format_aggregate(value: AggregateValue, expected: str) -> None:
    text = format_aggregate(value)
    assert text == expected
    assert "E" not in text.upper()


@given(st.fractions(min_value=0, max_value=10**18, max_denominator=10**6))
@settings(max_examples=300, deadline=None)
def test_format_aggregate_of_avg_is_plain_and_within_half_a_unit(value: Fraction) -> None:
    text = format_aggregate(value)
    assert "e" not in text.lower()
    if "." in text:
        places = text.split(".")[1]
        assert len(places) <= AVG_DISPLAY_PLACES
        assert not text.endswith("0")
    assert abs(Fraction(Decimal(text)) - value) <= Fraction(1, 2 * 10**AVG_DISPLAY_PLACES)
