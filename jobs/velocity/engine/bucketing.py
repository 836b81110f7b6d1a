"""Keyed events -> g-wide buckets, column by column (pure; SPEC §2).

``bucket_rows`` gives, per (signature, key, bucket start), what merging every event's
``BucketAggregate.of_event`` gives, with no Python loop per event: one sort, then
segmented reductions. Sums are exact: int64 units of 10^-8, and the rare bucket whose
amounts could pass 2^62 units is summed in Python integers.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from velocity.engine.kernel import (
    AMOUNT_PLACES,
    BUCKET_FIGURES,
    INT64_MAX,
    INT64_MIN,
    SAFE_TOTAL,
    decimal_units,
    dictionary_codes,
    units_of,
)

# ``newest_time``: the newest eventTime counted in the bucket (the stream's ``last_time``).
BUCKET_ROW_COLUMNS = ("signature_id", "key", "bucket_start", "newest_time", *BUCKET_FIGURES)


def bucket_schema(sum_type: pa.DataType, amount_type: pa.DataType) -> pa.Schema:
    """``bucket_rows``' columns, with the given decimal types for sums and amounts."""
    return pa.schema(
        [
            pa.field("signature_id", pa.string(), False),
            pa.field("key", pa.string(), False),
            pa.field("bucket_start", pa.int64(), False),
            pa.field("newest_time", pa.int64(), False),
            pa.field("event_count", pa.int64(), False),
            pa.field("value_count", pa.int64(), False),
            pa.field("value_sum", sum_type, True),
            pa.field("value_min", amount_type, True),
            pa.field("value_max", amount_type, True),
            pa.field("distinct_values", pa.list_(pa.field("element", pa.string(), False)), False),
        ]
    )


# The buckets table's types (``SUM_TYPE``, ``AMOUNT_TYPE``).
BUCKET_ROWS = bucket_schema(pa.decimal128(38, AMOUNT_PLACES), pa.decimal128(26, AMOUNT_PLACES))


def bucket_rows(
    events: pa.Table,
    width_ms: int,
    distinct_counted: Collection[str] | None = None,
    schema: pa.Schema | None = None,
) -> pa.Table:
    """The buckets of ``events`` (KEYED_COLUMNS, any order): one row per (signature, key,
    bucket start) with ``BUCKET_ROW_COLUMNS``, ``distinct_values`` sorted, and empty for
    a signature not in ``distinct_counted`` (None: every signature keeps them)."""
    schema = schema or BUCKET_ROWS
    n = events.num_rows
    if n == 0:
        return schema.empty_table()
    signature_codes, _ = dictionary_codes([events.column("signature_id")])
    key_codes, _ = dictionary_codes([events.column("key")])
    times = events.column("eventTime").to_numpy().astype(np.int64)
    starts = times - np.mod(times, width_ms)
    order = np.lexsort((starts, key_codes, signature_codes))
    sorted_starts = starts[order]
    first = np.r_[
        True,
        (np.diff(signature_codes[order]) != 0)
        | (np.diff(key_codes[order]) != 0)
        | (np.diff(sorted_starts) != 0),
    ]
    heads = np.flatnonzero(first)
    groups = len(heads)
    group_of = np.cumsum(first, dtype=np.int64) - 1

    has_value = events.column("value").is_valid().to_numpy(zero_copy_only=False)[order]
    units, has_number, wide = decimal_units(events.column("number"))
    units, has_number, wide = units[order], has_number[order], wide[order]
    number_counts = np.add.reduceat(has_number.astype(np.int64), heads)
    low_sum = np.add.reduceat(units, heads)  # may wrap: replaced below where it could
    high_sum = low_sum >> 63
    lows = np.minimum.reduceat(np.where(has_number, units, INT64_MAX), heads)
    highs = np.maximum.reduceat(np.where(has_number, units, INT64_MIN), heads)
    risky = (np.add.reduceat(np.abs(units.astype(np.float64)), heads) >= SAFE_TOTAL) | (
        np.add.reduceat(wide.astype(np.int64), heads) > 0
    )
    sum_words = np.stack([low_sum, high_sum], axis=1)
    min_words = np.stack([lows, lows >> 63], axis=1)
    max_words = np.stack([highs, highs >> 63], axis=1)
    if risky.any():
        numbers = events.column("number").take(pa.array(order))
        ends = np.r_[heads[1:], n]
        for group in np.flatnonzero(risky).tolist():
            exact = [
                units_of(v)
                for v in numbers.slice(heads[group], ends[group] - heads[group]).to_pylist()
                if v is not None
            ]
            for words, value in ((sum_words, sum(exact)), (min_words, min(exact)),
                                 (max_words, max(exact))):  # fmt: skip
                words[group] = _words_of(value)

    groups_by_row = np.empty(n, dtype=np.int64)
    groups_by_row[order] = group_of
    kept = None
    if distinct_counted is not None:
        # A mask, not ``pc.if_else``: pyarrow 22 returns a corrupt array from it when the
        # condition's and the values' chunks are laid out differently (a sliced chunk).
        counted = pa.array(sorted(distinct_counted), pa.string())
        kept = pc.is_in(events.column("signature_id").combine_chunks(), counted)
        kept = kept.to_numpy(zero_copy_only=False)
    distinct_values = distinct_lists(
        events.column("value"), groups_by_row, groups, schema.field("distinct_values").type, kept
    )
    first_rows = pa.array(order[heads])
    valid = number_counts > 0
    columns = {
        "signature_id": events.column("signature_id").combine_chunks().take(first_rows),
        "key": events.column("key").combine_chunks().take(first_rows),
        "bucket_start": pa.array(sorted_starts[heads], pa.int64()),
        "newest_time": pa.array(np.maximum.reduceat(times[order], heads), pa.int64()),
        "event_count": pa.array(np.diff(np.r_[heads, n]), pa.int64()),
        "value_count": pa.array(np.add.reduceat(has_value.astype(np.int64), heads), pa.int64()),
        "value_sum": _decimal_array(sum_words, valid, schema.field("value_sum").type),
        "value_min": _decimal_array(min_words, valid, schema.field("value_min").type),
        "value_max": _decimal_array(max_words, valid, schema.field("value_max").type),
        "distinct_values": distinct_values,
    }
    return pa.table([columns[f.name] for f in schema], schema=schema)


def _words_of(units: int) -> tuple[int, int]:
    """A 128-bit two's complement integer as its (low, high) signed 64-bit words."""
    low = units & 0xFFFF_FFFF_FFFF_FFFF
    return (low - (1 << 64) if low >= 1 << 63 else low), units >> 64


def _decimal_array(words: np.ndarray, valid: np.ndarray, type_: pa.DataType) -> pa.Array:
    """Decimal units given as (low, high) int64 words per row; null where not ``valid``."""
    data = np.ascontiguousarray(words, dtype="<i8")
    validity = pa.array(valid, pa.bool_()).buffers()[1]
    return pa.Array.from_buffers(type_, len(valid), [validity, pa.py_buffer(data.tobytes())])


def distinct_lists(
    values: pa.Array | pa.ChunkedArray,
    group_of: np.ndarray,
    groups: int,
    list_type: pa.DataType,
    kept: np.ndarray | None = None,
) -> pa.Array:
    """Each group's distinct non-null ``values``, sorted: a list per group, ``group_of``
    naming each value's group (any order); only the values where ``kept`` holds (None:
    all)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    encoded = pc.dictionary_encode(values)
    dictionary = encoded.dictionary
    codes = encoded.indices.fill_null(-1).to_numpy().astype(np.int64)
    size = len(dictionary)
    present = codes >= 0
    if kept is not None:
        present &= kept
    if size == 0 or not present.any():
        empty = pa.array(np.zeros(groups + 1, dtype=np.int32))
        return pa.ListArray.from_arrays(empty, pa.array([], pa.string()), list_type)
    by_text = pc.sort_indices(dictionary).to_numpy()
    rank = np.empty(size, dtype=np.int64)
    rank[by_text] = np.arange(size, dtype=np.int64)
    pairs = np.sort(group_of[present] * size + rank[codes[present]])
    pairs = pairs[np.r_[True, pairs[1:] != pairs[:-1]]]  # np.unique, without its hashing
    pair_groups = pairs // size
    offsets = np.searchsorted(pair_groups, np.arange(groups + 1, dtype=np.int64))
    flat = dictionary.take(pa.array(by_text[pairs % size]))
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), flat, list_type)
