"""Columnar buckets (``bucket_rows``) equal merging ``BucketAggregate.of_event`` per
(signature, key, bucket start), on random keyed events in any order, amounts past 2^63
units included."""

from __future__ import annotations

import random
from collections import defaultdict
from decimal import Decimal

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import events, rule_sets
from tests.unit.test_kernel import _ARROW, histories_of, keyed_rows
from velocity.domain.buckets import (
    BucketAggregate,
    bucket_from_columns,
    bucket_start,
    bucket_width_ms,
)
from velocity.domain.rules import deciding_rules
from velocity.engine.bucketing import bucket_rows

Slot = tuple[str, str, int]


def expected_buckets(rows: list[tuple], width: int) -> dict[Slot, tuple[BucketAggregate, int]]:
    out: dict[Slot, tuple[BucketAggregate, int]] = defaultdict(lambda: (BucketAggregate(), -1))
    for signature_id, key, time, _, value, number in rows:
        slot = (signature_id, key, bucket_start(time, width))
        aggregate, newest = out[slot]
        out[slot] = (aggregate.merge(BucketAggregate.of_event(value, number)), max(newest, time))
    return dict(out)


def columnar_buckets(
    rows: list[tuple], width: int, counted: frozenset[str] | None = None
) -> dict[Slot, tuple[BucketAggregate, int]]:
    table = pa.Table.from_pylist(
        [dict(zip(_ARROW.names, row, strict=True)) for row in rows], schema=_ARROW
    )
    out = {}
    for r in bucket_rows(table, width, counted).to_pylist():
        slot = (r["signature_id"], r["key"], r["bucket_start"])
        assert slot not in out, f"{slot} twice"
        assert r["distinct_values"] == sorted(r["distinct_values"])
        out[slot] = (bucket_from_columns(r), r["newest_time"])
    return out


@settings(max_examples=150)
@given(
    events=events(max_size=40),
    rules=rule_sets(max_size=5),
    seconds=st.sampled_from((1, 60)),
    order=st.randoms(use_true_random=False),
    data=st.data(),
)
def test_columnar_buckets_equal_merged_events(
    events, rules, seconds, order: random.Random, data
) -> None:
    width = bucket_width_ms(seconds)
    rows = keyed_rows(histories_of(events, deciding_rules(rules)))
    order.shuffle(rows)
    assert columnar_buckets(rows, width) == expected_buckets(rows, width)
    # Distinct values kept for the counted signatures only; every other figure unchanged.
    ids = sorted({row[0] for row in rows})
    counted = frozenset(data.draw(st.lists(st.sampled_from(ids), unique=True)) if ids else ())
    assert columnar_buckets(rows, width, counted) == {
        slot: (a if slot[0] in counted else a._replace(distinct=frozenset()), newest)
        for slot, (a, newest) in expected_buckets(rows, width).items()
    }


def test_bucket_sums_past_int64_units_are_exact() -> None:
    big = Decimal("999999999999999999.99999999")  # 10^26 units: far past 2^63
    rows = [
        ("s", '["a"]', 1_000 + i, f"t{i}", None if amount is None else str(amount), amount)
        for i, amount in enumerate([big, big, Decimal("0.00000001"), None, Decimal(5)])
    ] + [("s", '["b"]', 61_000, "u", "x", Decimal("1.5"))]
    assert columnar_buckets(rows, 60_000) == expected_buckets(rows, 60_000)


def test_no_events_no_buckets() -> None:
    assert bucket_rows(_ARROW.empty_table(), 60_000).num_rows == 0


def test_distinct_values_kept_only_where_counted_whatever_the_chunks() -> None:
    """Columns of several chunks laid out differently (a sliced one first, as Spark's
    batches arrive): pyarrow's ``if_else`` returned a corrupt array for such input."""
    rows = [
        (sig, '["k"]', 1_000 + i, f"t{i}", f"v{i % 3}", None)
        for i, sig in enumerate(["a", "b", "a", "b", "a", "b", "a"])
    ]
    whole = pa.Table.from_pylist(
        [dict(zip(_ARROW.names, row, strict=True)) for row in rows], schema=_ARROW
    )
    # Every column in chunks of 3 + 4 rows, a slice first; the signatures in 2 + 5.
    laid_out = pa.concat_tables([whole.slice(0, 3).combine_chunks(), whole.slice(3)])
    signatures = whole.column("signature_id").combine_chunks()
    split = pa.chunked_array([signatures.slice(0, 2), signatures.slice(2)])
    chunked = laid_out.set_column(0, "signature_id", split)
    got = {
        r["signature_id"]: r["distinct_values"]
        for r in bucket_rows(chunked, 60_000, {"a"}).to_pylist()
    }
    assert got == {"a": ["v0", "v1", "v2"], "b": []}
