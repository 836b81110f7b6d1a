"""Buckets: flooring times to bucket edges and the merge algebra of ``BucketAggregate``."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import BASE_TIME, bucket_seconds, event_times, keyed_event
from tests.reference import floor_g
from velocity.domain.buckets import (
    ALLOWED_BUCKET_SECONDS,
    EMPTY,
    BucketAggregate,
    bucket_start,
    bucket_width_ms,
    merge_all,
    window_start,
)
from velocity.domain.windows import KeyedEvent

# ---------------------------------------------------------------- widths and edges


def test_allowed_bucket_seconds_are_the_spec_set_and_divide_a_minute() -> None:
    assert ALLOWED_BUCKET_SECONDS == (1, 2, 5, 10, 15, 20, 30, 60)
    assert all(60 % s == 0 for s in ALLOWED_BUCKET_SECONDS)


@pytest.mark.parametrize("seconds", ALLOWED_BUCKET_SECONDS)
def test_bucket_width_ms(seconds: int) -> None:
    assert bucket_width_ms(seconds) == seconds * 1000


@pytest.mark.parametrize("seconds", [0, 7, 3, 120, -60, 90])
def test_bucket_width_rejects_other_widths_naming_the_allowed_ones(seconds: int) -> None:
    with pytest.raises(ValueError, match=r"\[1, 2, 5, 10, 15, 20, 30, 60\]") as caught:
        bucket_width_ms(seconds)
    assert str(seconds) in str(caught.value)


@pytest.mark.parametrize(
    ("event_time", "width_ms", "expected"),
    [
        (0, 60_000, 0),
        (1, 60_000, 0),
        (59_999, 60_000, 0),
        (60_000, 60_000, 60_000),
        (60_001, 60_000, 60_000),
        (BASE_TIME, 60_000, BASE_TIME),
        (BASE_TIME - 1, 60_000, BASE_TIME - 60_000),
        (BASE_TIME + 14_999, 15_000, BASE_TIME),
        (BASE_TIME + 15_000, 15_000, BASE_TIME + 15_000),
        (BASE_TIME + 999, 1_000, BASE_TIME),
        # Negative times floor down (mathematical modulus), never towards zero.
        (-1, 60_000, -60_000),
        (-59_999, 60_000, -60_000),
        (-60_000, 60_000, -60_000),
        (-60_001, 60_000, -120_000),
        (-1, 1_000, -1_000),
    ],
)
def test_bucket_start_on_edges_and_negative_times(
    event_time: int, width_ms: int, expected: int
) -> None:
    assert bucket_start(event_time, width_ms) == expected


@pytest.mark.parametrize(
    ("event_time", "window_ms", "width_ms", "expected"),
    [
        # t - W on an edge: exact.
        (BASE_TIME, 60_000, 60_000, BASE_TIME - 60_000),
        # t - W inside a bucket: rounded down (up to g more history, never less).
        (BASE_TIME + 90_000, 60_000, 60_000, BASE_TIME),
        (BASE_TIME + 90_000, 60_000, 1_000, BASE_TIME + 30_000),
        (BASE_TIME + 90_001, 60_000, 1_000, BASE_TIME + 30_000),
        (BASE_TIME + 90_001, 60_000, 2_000, BASE_TIME + 30_000),
        (BASE_TIME + 59_999, 60_000, 60_000, BASE_TIME - 60_000),
        (BASE_TIME + 60_000, 120_000, 30_000, BASE_TIME - 60_000),
        # Near the epoch the lower edge is negative and still floored.
        (0, 60_000, 60_000, -60_000),
        (1_500, 60_000, 1_000, -59_000),
        (1_500, 60_000, 60_000, -60_000),
    ],
)
def test_window_start_is_floor_of_t_minus_w(
    event_time: int, window_ms: int, width_ms: int, expected: int
) -> None:
    assert window_start(event_time, window_ms, width_ms) == expected


_times = st.one_of(st.integers(-(10**13), 10**13), event_times())


@given(_times, bucket_seconds)
@settings(max_examples=300, deadline=None)
def test_bucket_start_is_the_floor_to_a_bucket_edge(event_time: int, seconds: int) -> None:
    width = seconds * 1000
    start = bucket_start(event_time, width)
    assert start % width == 0
    assert start <= event_time < start + width
    assert bucket_start(start, width) == start  # flooring twice equals flooring once


@given(_times, st.integers(1, 527_040), bucket_seconds)
@settings(max_examples=300, deadline=None)
def test_window_start_is_the_own_bucket_minus_w(
    event_time: int, minutes: int, seconds: int
) -> None:
    width, window = seconds * 1000, minutes * 60_000
    lower = window_start(event_time, window, width)
    assert lower == floor_g(event_time - window, width)
    assert lower == bucket_start(event_time, width) - window
    assert event_time - window - width < lower <= event_time - window


# ---------------------------------------------------------------- of_event


def test_of_event_without_a_value_counts_only() -> None:
    assert BucketAggregate.of_event(None) == BucketAggregate(count=1)
    assert BucketAggregate.of_event(None, None).value_count == 0


def test_of_event_with_a_non_numeric_value() -> None:
    agg = BucketAggregate.of_event("p1")
    assert agg == BucketAggregate(1, 1, None, None, None, frozenset({"p1"}))


def test_of_event_with_a_number() -> None:
    agg = BucketAggregate.of_event("100.5", Decimal("100.5"))
    assert (agg.count, agg.value_count) == (1, 1)
    assert agg.total == agg.minimum == agg.maximum == Decimal("100.5")
    assert agg.distinct == frozenset({"100.5"})


def test_merge_combines_every_part() -> None:
    merged = merge_all(
        BucketAggregate.of_event(v, None if n is None else Decimal(n))
        for v, n in [("3", "3"), (None, None), ("1.5", "1.5"), ("3", "3")]
    )
    assert merged == BucketAggregate(
        count=4,
        value_count=3,
        total=Decimal("7.5"),
        minimum=Decimal("1.5"),
        maximum=Decimal(3),
        distinct=frozenset({"3", "1.5"}),
    )


def test_merge_all_of_nothing_is_empty() -> None:
    assert merge_all([]) == EMPTY
    assert BucketAggregate() == EMPTY
    assert (EMPTY.count, EMPTY.total, EMPTY.distinct) == (0, None, frozenset())


def test_sum_of_many_large_amounts_is_exact() -> None:
    # SPEC §1: amounts are exact decimals, no rounding in sums. 101 of the largest
    # allowed amount need 29 significant digits, one more than Decimal's default context.
    largest = Decimal("999999999999999999.99999999")
    merged = merge_all(BucketAggregate.of_event(str(largest), largest) for _ in range(101))
    assert merged.total == Decimal("100999999999999999999.99999899")


# ---------------------------------------------------------------- merge algebra (Hypothesis)

_values = st.one_of(
    st.just((None, None)),
    st.sampled_from(("p1", "p2", "7")).map(lambda v: (v, None)),
    st.sampled_from(
        (
            "0",
            "1",
            "1.5",
            "100.5",
            "0.00000001",
            "33.33333333",
            "250000",
            "999999999999999999.99999999",
            "-3",
        )
    ).map(lambda n: (None, Decimal(n))),
)


def _keyed(pair: tuple[str | None, Decimal | None], time: int) -> KeyedEvent:
    value, number = pair
    return keyed_event(time, "tx", value, number)


keyed_events = st.builds(_keyed, _values, event_times())


def of(event: KeyedEvent) -> BucketAggregate:
    return BucketAggregate.of_event(event.value, event.number)


aggregates = st.lists(keyed_events, max_size=8).map(lambda evs: merge_all(of(e) for e in evs))


@given(aggregates, aggregates, aggregates)
@settings(max_examples=300, deadline=None)
def test_merge_is_associative(a: BucketAggregate, b: BucketAggregate, c: BucketAggregate) -> None:
    assert a.merge(b).merge(c) == a.merge(b.merge(c))


@given(aggregates, aggregates)
@settings(max_examples=300, deadline=None)
def test_merge_is_commutative(a: BucketAggregate, b: BucketAggregate) -> None:
    assert a.merge(b) == b.merge(a)


@given(aggregates)
@settings(max_examples=200, deadline=None)
def test_empty_is_the_identity_of_merge(a: BucketAggregate) -> None:
    assert a.merge(EMPTY) == a
    assert EMPTY.merge(a) == a


@given(st.lists(keyed_events, max_size=20), st.data())
@settings(max_examples=300, deadline=None)
def test_split_then_merge_equals_whole(events: list[KeyedEvent], data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(events)), label="cut")
    whole = merge_all(of(e) for e in events)
    halves = merge_all(of(e) for e in events[:cut]).merge(merge_all(of(e) for e in events[cut:]))
    assert halves == whole


@given(st.lists(keyed_events, max_size=20), st.randoms(use_true_random=False))
@settings(max_examples=300, deadline=None)
def test_input_order_does_not_matter(events: list[KeyedEvent], rnd: random.Random) -> None:
    shuffled = list(events)
    rnd.shuffle(shuffled)
    assert merge_all(of(e) for e in shuffled) == merge_all(of(e) for e in events)


@given(st.lists(keyed_events, max_size=20), bucket_seconds)
@settings(max_examples=200, deadline=None)
def test_buckets_rolled_up_equal_the_whole(events: list[KeyedEvent], seconds: int) -> None:
    # Minute buckets roll up into coarser ones: merging per-bucket aggregates in any
    # grouping gives the aggregate of all events.
    width = seconds * 1000
    buckets: dict[int, BucketAggregate] = {}
    for e in events:
        start = bucket_start(e.event_time, width)
        buckets[start] = buckets.get(start, EMPTY).merge(of(e))
    assert merge_all(buckets.values()) == merge_all(of(e) for e in events)
    assert sum(b.count for b in buckets.values()) == len(events)


@given(st.lists(keyed_events, min_size=1, max_size=20))
@settings(max_examples=200, deadline=None)
def test_merged_aggregate_matches_its_events(events: list[KeyedEvent]) -> None:
    agg = merge_all(of(e) for e in events)
    numbers = [e.number for e in events if e.number is not None]
    assert agg.count == len(events)
    assert agg.value_count == sum(1 for e in events if e.value is not None)
    assert agg.distinct == frozenset(e.value for e in events if e.value is not None)
    if numbers:
        assert agg.total == sum(numbers, Decimal(0))
        assert agg.minimum == min(numbers)
        assert agg.maximum == max(numbers)
    else:
        assert (agg.total, agg.minimum, agg.maximum) == (None, None, None)


_EVENT_FIELDS = st.one_of(
    st.just((None, None)),
    st.text(max_size=3).map(lambda text: (text, None)),
    st.decimals(min_value=-1000, max_value=1000, places=2).map(lambda d: (str(d), d)),
)


@given(st.lists(_EVENT_FIELDS, max_size=40))
def test_aggregate_of_events_is_merging_each_event(events) -> None:
    from velocity.domain.buckets import aggregate_of_events

    merged = merge_all(BucketAggregate.of_event(value, number) for value, number in events)
    assert aggregate_of_events(events) == merged
