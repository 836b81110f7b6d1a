"""The columnar kernel equals the per-event reference engine (``evaluate_key_history``).

Random events and rules (every aggregator, operator and filter; equal times and times on
bucket edges; bucket widths 1 s and 60 s), rows in any order; keys with one event and
keys with thousands; sums past 2^63 units, which leave the int64 path for the exact one.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import BASE_TIME, events, keyed_event, keyed_histories, make_rule, rule_sets
from velocity.domain.buckets import bucket_width_ms
from velocity.domain.rules import Operator, Rule, deciding_rules, key_text, rules_by_signature
from velocity.domain.schema import Event
from velocity.domain.windows import KeyedEvent, evaluate_key_history, format_aggregate
from velocity.engine.kernel import (
    Decisions,
    KeyTimeOrder,
    average_holds,
    decide,
    decide_history,
    distinct_counts,
    holds,
    range_extreme,
    rounded_average,
    units_text,
    value_texts,
)

Row = tuple[str, str, int, str, str | None, Decimal | None]
Outcome = dict[tuple[int, int, str], tuple[str, int]]  # (rule, version, tx) -> (value, start)

_ARROW = pa.schema(
    [
        ("signature_id", pa.string()),
        ("key", pa.string()),
        ("eventTime", pa.int64()),
        ("transactionId", pa.string()),
        ("value", pa.string()),
        ("number", pa.decimal128(26, 8)),
    ]
)


def keyed_row(slot: tuple[str, str], e: KeyedEvent, **more: object) -> dict:
    """A keyed event of ``slot`` (signature, key) as a row of KEYED_COLUMNS (and ``more``)."""
    return {
        "signature_id": slot[0],
        "key": slot[1],
        "eventTime": e.event_time,
        "transactionId": e.transaction_id,
        "value": e.value,
        "number": e.number,
        **more,
    }


def keyed_rows(histories: dict[tuple[str, str], Sequence[KeyedEvent]]) -> list[Row]:
    return [
        (signature_id, key, e.event_time, e.transaction_id, e.value, e.number)
        for (signature_id, key), history in histories.items()
        for e in history
    ]


def histories_of(
    events: Sequence[Event], rules: Sequence[Rule]
) -> dict[tuple[str, str], list[KeyedEvent]]:
    out = {}
    for signature in rules_by_signature(rules):
        for key, history in keyed_histories(events, signature).items():
            out[(signature.signature_id, key_text(key))] = history
    return out


def kernel_outcome(rows: Sequence[Row], rules: Sequence[Rule], width_ms: int) -> Outcome:
    table = pa.Table.from_pylist(
        [dict(zip(_ARROW.names, row, strict=True)) for row in rows], schema=_ARROW
    )
    decided = decide_history(table, rules, width_ms)
    out: Outcome = {}
    for row, rule_index, value, start in zip(
        decided.rows, decided.rules, decided.texts().to_pylist(), decided.window_starts, strict=True
    ):
        rule = rules[int(rule_index)]
        pair = (rule.rule_id, rule.version, rows[int(row)][3])
        assert pair not in out, f"{pair} decided twice"
        out[pair] = (str(value), int(start))
    return out


def reference_outcome(
    histories: dict[tuple[str, str], Sequence[KeyedEvent]], rules: Sequence[Rule], width_ms: int
) -> Outcome:
    out: Outcome = {}
    by_signature = {s.signature_id: group for s, group in rules_by_signature(rules).items()}
    for (signature_id, _), history in histories.items():
        for decision in evaluate_key_history(history, by_signature[signature_id], width_ms):
            rule = decision.rule
            pair = (rule.rule_id, rule.version, decision.event.transaction_id)
            out[pair] = (format_aggregate(decision.value), decision.window_start)
    return out


@settings(max_examples=200)
@given(
    events=events(max_size=40),
    rules=rule_sets(max_size=5),
    seconds=st.sampled_from((1, 60)),
    order=st.randoms(use_true_random=False),
)
def test_kernel_equals_the_reference_on_random_batches(
    events: list[Event], rules: list[Rule], seconds: int, order: random.Random
) -> None:
    active = deciding_rules(rules)
    width = bucket_width_ms(seconds)
    histories = histories_of(events, active)
    rows = keyed_rows(histories)
    order.shuffle(rows)
    assert kernel_outcome(rows, active, width) == reference_outcome(histories, active, width)


def _rule(
    rule_id: int, aggregator: str, op: str, limit: object, minutes: int, **more: object
) -> Rule:
    fields = {"aggregateFieldName": "paymentAmount"} if aggregator != "COUNT" else {}
    return make_rule(
        ruleId=rule_id,
        aggregatorFunctionType=aggregator,
        limitOperatorType=op,
        limit=Decimal(str(limit)),
        windowMinutes=minutes,
        groupingKeyNames=["payerId"],
        **{**fields, **more},
    ).with_version(1)


def _long_history(
    seed: int, keys: Sequence[str], per_key: int, amounts: Sequence[str]
) -> dict[tuple[str, str], list[KeyedEvent]]:
    rng = random.Random(seed)
    signature = _rule(1, "SUM", ">", 0, 1).signature.signature_id
    out = {}
    for key in keys:
        history = []
        for i in range(per_key):
            time = BASE_TIME + rng.randrange(0, 90 * 60_000)
            if i % 7 == 0 and history:
                time = history[-1].event_time  # ties
            history.append(keyed_event(time, f"{key}-{i}", number=rng.choice(amounts)))
        out[(signature, key_text([key]))] = history
    return out


@pytest.mark.parametrize("seconds", [1, 60])
def test_keys_with_thousands_of_events_and_sums_past_2_63_units(seconds: int) -> None:
    """One key with 3,000 events whose amounts of 5·10^10 (5·10^18 units, each fits
    int64) add up far past 2^63 units: the exact path; beside it keys on the int64 path,
    one with a single event."""
    width = bucket_width_ms(seconds)
    rules = [
        _rule(1, "SUM", ">", "100000000000", 30),
        _rule(2, "AVG", ">=", "20000000000.123456789", 5),
        _rule(3, "MAX", "=", "50000000000", 1),
        _rule(4, "MIN", "<", "2.5", 60),
        _rule(5, "COUNT", ">", 40, 10),
        _rule(6, "SUM", "<=", "1000.5", 2),
    ]
    histories = {
        **_long_history(1, ["huge"], 3000, ["50000000000", "0.00000001", "1"]),
        **_long_history(2, ["small", "other"], 2000, ["1.5", "2", "33.33333333", "0"]),
        **_long_history(3, ["single"], 1, ["7"]),
    }
    rows = keyed_rows(histories)
    random.Random(4).shuffle(rows)
    expected = reference_outcome(histories, rules, width)
    assert kernel_outcome(rows, rules, width) == expected
    assert any(pair[0] == 1 and pair[2].startswith("huge") for pair in expected)


def test_unique_count_over_long_windows_of_many_values() -> None:
    rng = random.Random(5)
    rule = make_rule(
        ruleId=9,
        aggregatorFunctionType="UNIQUE_COUNT",
        aggregateFieldName="ip",
        limitOperatorType=">=",
        limit=30,
        windowMinutes=20,
        groupingKeyNames=["payerId"],
    ).with_version(1)
    signature = rule.signature.signature_id
    histories = {
        (signature, key_text([key])): [
            keyed_event(
                BASE_TIME + rng.randrange(0, 60 * 60_000),
                f"{key}-{i}",
                value=None if i % 11 == 0 else f"10.0.0.{rng.randrange(60)}",
            )
            for i in range(n)
        ]
        for key, n in (("a", 2500), ("b", 1), ("c", 700))
    }
    rows = keyed_rows(histories)
    assert kernel_outcome(rows, [rule], 60_000) == reference_outcome(histories, [rule], 60_000)


# ------------------------------------------------------------------ the kernel's parts, directly


@given(st.lists(st.integers(-50, 50), min_size=1, max_size=60), st.data())
def test_range_extremes_and_distinct_counts_equal_slices(
    values: list[int], data: st.DataObject
) -> None:
    n = len(values)
    lo = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=20)))
    hi = np.array([data.draw(st.integers(int(a) + 1, n)) for a in lo])
    array = np.array(values, dtype=np.int64)
    assert range_extreme(array, lo, hi, np.minimum).tolist() == [
        min(values[a:b]) for a, b in zip(lo, hi, strict=True)
    ]
    assert range_extreme(array, lo, hi, np.maximum).tolist() == [
        max(values[a:b]) for a, b in zip(lo, hi, strict=True)
    ]
    codes = np.where(array < -40, -1, array % 7)  # -1: no value
    one_key = np.zeros(n, dtype=np.int64)
    expected = [
        len({c for c in codes[a:b].tolist() if c >= 0}) for a, b in zip(lo, hi, strict=True)
    ]
    assert distinct_counts(codes, one_key, lo, hi).tolist() == expected


@given(
    st.lists(st.integers(-(2**62), 2**62), min_size=1, max_size=10),
    st.sampled_from(list(Operator)),
    st.one_of(
        st.integers(-(2**70), 2**70),
        st.decimals(
            allow_nan=False, allow_infinity=False, places=12, min_value=-(10**20), max_value=10**20
        ),
    ),
)
def test_integer_comparisons_with_any_limit_are_exact(
    values: list[int], op: Operator, limit: object
) -> None:
    bound = Fraction(limit)  # type: ignore[arg-type]
    figures = np.array(values, dtype=np.int64)
    assert holds(figures, op, bound).tolist() == [op.holds(Fraction(v), bound) for v in values]
    counts = np.array([abs(v) % 9 + 1 for v in values], dtype=np.int64)
    expected = [
        op.holds(Fraction(v, c), bound) for v, c in zip(values, counts.tolist(), strict=True)
    ]
    assert average_holds(figures, counts, op, bound).tolist() == expected


@given(st.lists(st.integers(-(10**17), 10**17), min_size=1, max_size=10), st.data())
def test_units_text_and_rounded_average_match_the_decimal_formatting(
    values: list[int], data: st.DataObject
) -> None:
    units = np.array(values, dtype=np.int64)
    expected = [format_aggregate(Decimal(v).scaleb(-8)) for v in values]
    assert units_text(units).tolist() == expected
    # The texts a record is written with, by Arrow kernels; past int64 by Python integers.
    assert value_texts(units).to_pylist() == expected
    wide = np.array([v * 10**4 for v in values], dtype=object)
    assert value_texts(wide).to_pylist() == [
        format_aggregate(Decimal(v).scaleb(-4)) for v in values
    ]
    counts = np.array([data.draw(st.integers(1, 10**6)) for _ in values], dtype=np.int64)
    averages = units_text(rounded_average(units, counts)).tolist()
    assert averages == [
        format_aggregate(Fraction(v, 10**8) / c)
        for v, c in zip(values, counts.tolist(), strict=True)
    ]


def test_no_events_or_no_rules_decide_nothing() -> None:
    empty = pa.Table.from_pylist([], schema=_ARROW)
    assert len(decide_history(empty, [_rule(1, "COUNT", ">", 0, 1)], 60_000)) == 0
    assert isinstance(Decisions.concat([]), Decisions)


# ------------------------------------------------------------------ stored buckets beside events

_BUCKET_ARROW = pa.schema(
    [
        ("signature_id", pa.string()),
        ("key", pa.string()),
        ("time", pa.int64()),
        ("event_count", pa.int64()),
        ("value_count", pa.int64()),
        ("value_sum", pa.decimal128(38, 8)),
        ("value_min", pa.decimal128(26, 8)),
        ("value_max", pa.decimal128(26, 8)),
        ("distinct_values", pa.list_(pa.string())),
    ]
)


def _bucket_row(slot: tuple[str, str], time: int, events: Sequence[KeyedEvent]) -> dict:
    numbers = [e.number for e in events if e.number is not None]
    return {
        "signature_id": slot[0],
        "key": slot[1],
        "time": time,
        "event_count": len(events),
        "value_count": sum(e.value is not None for e in events),
        "value_sum": sum(numbers) if numbers else None,
        "value_min": min(numbers) if numbers else None,
        "value_max": max(numbers) if numbers else None,
        "distinct_values": sorted({e.value for e in events if e.value is not None}),
    }


@settings(max_examples=200)
@given(
    events=events(max_size=40),
    rules=rule_sets(max_size=5),
    seconds=st.sampled_from((1, 60)),
    data=st.data(),
)
def test_kernel_over_stored_buckets_and_a_batch_equals_the_reference(
    events: list[Event], rules: list[Rule], seconds: int, data: st.DataObject
) -> None:
    """Earlier arrivals folded into buckets (standing at their newest eventTime, or at
    their start when no batch event shares them), the batch's events raw: the batch's
    decisions equal the complete-data decisions of the same events. A bucket that holds
    an event later than a batch event in it comes as raw events (the own-bucket
    history), as the stream supplies it."""
    active = deciding_rules(rules)
    width = bucket_width_ms(seconds)
    histories = histories_of(events, active)
    rows: list[dict] = []
    buckets: list[dict] = []
    expected: Outcome = {}
    for slot, history in histories.items():
        split = data.draw(st.integers(0, len(history)))
        earlier, batch = history[:split], history[split:]
        batch_ids = {e.transaction_id for e in batch}
        expected |= {
            pair: outcome
            for pair, outcome in reference_outcome({slot: history}, active, width).items()
            if pair[2] in batch_ids
        }
        by_start: dict[int, list[KeyedEvent]] = {}
        for e in earlier:
            by_start.setdefault(e.event_time - e.event_time % width, []).append(e)
        raw = list(batch)
        for start, inside in by_start.items():
            newest = max(e.event_time for e in inside)
            sharing = [e for e in batch if e.event_time - e.event_time % width == start]
            if any(e.event_time < newest for e in sharing):
                raw += inside  # the own bucket's history, event by event
                continue
            time = newest if sharing or data.draw(st.booleans()) else start
            buckets.append(_bucket_row(slot, time, inside))
        rows += [keyed_row(slot, e, decide=e.transaction_id in batch_ids) for e in raw]
    schema = _ARROW.append(pa.field("decide", pa.bool_()))
    table = pa.Table.from_pylist(rows, schema=schema)
    decided = decide(table, pa.Table.from_pylist(buckets, schema=_BUCKET_ARROW), active, width)
    got: Outcome = {}
    for row, rule_index, value, start in zip(
        decided.rows, decided.rules, decided.texts().to_pylist(), decided.window_starts, strict=True
    ):
        rule = active[int(rule_index)]
        pair = (rule.rule_id, rule.version, rows[int(row)]["transactionId"])
        assert pair not in got, f"{pair} decided twice"
        got[pair] = (str(value), int(start))
    assert got == expected


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 4), st.integers(0, 50)), min_size=1, max_size=40),
    st.lists(st.tuples(st.integers(0, 4), st.integers(-10, 60)), min_size=1, max_size=20),
    st.sampled_from([1, 2**57]),
)
def test_key_time_order_finds_each_keys_first_row_at_or_past_a_time(
    rows: list[tuple[int, int]], queries: list[tuple[int, int]], scale: int
) -> None:
    # Scale 2**57 spreads the times so far apart that offsets mostly would not fit int64:
    # their ranks are used.
    rows = sorted(rows)
    keys = sorted({k for k, _ in rows})
    rank = {k: i for i, k in enumerate(keys)}
    key_rank = np.array([rank[k] for k, _ in rows], dtype=np.int64)
    times = np.array([t * scale for _, t in rows], dtype=np.int64)
    order = KeyTimeOrder.of(key_rank, times)
    if scale == 1:
        assert order.ranks is None
    composite = order.composite(key_rank, times)
    assert np.all(np.diff(composite) >= 0)
    for key, t in queries:
        if key not in rank:
            continue
        owner = rank[key]
        expected = next(
            (i for i, (k, time) in enumerate(rows) if rank[k] == owner and time >= t),
            max(i for i, (k, _) in enumerate(rows) if rank[k] == owner) + 1,
        )
        at = np.array([t * scale], dtype=np.int64)
        found = int(np.searchsorted(composite, order.composite(np.array([owner]), at))[0])
        assert found == expected


def test_key_time_order_ranks_times_when_their_offsets_would_pass_int64() -> None:
    assert KeyTimeOrder.of(np.array([0, 0]), np.array([0, 2**62])).ranks is not None
    assert KeyTimeOrder.of(np.array([0, 1]), np.array([0, 2**61])).ranks is not None
    assert KeyTimeOrder.of(np.array([0, 1]), np.array([0, 2**59])).ranks is None
