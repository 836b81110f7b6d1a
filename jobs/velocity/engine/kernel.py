"""The columnar decision kernel (SPEC §3): a key-partition's events in, the decisions out.

``decide_history`` takes the keyed events of any number of (signature, key)s as Arrow
columns and returns every decision that fires over their complete history, exactly as
the per-event reference (``velocity.windows.evaluate_key_history``) decides them, which
the property tests hold it to. No Python loop runs per event:

- one ``lexsort`` by (signature, key, eventTime); a sortable composite of (key rank,
  eventTime rank) turns both window edges into ``searchsorted`` calls: the upper edge
  after the last event at or before ``t`` (ties included), the lower edge at the first
  event at or after ``floor_g(t) - W`` (SPEC §3's bucket-exact lower edge);
- COUNT, SUM and the value counts are differences of prefix sums; amounts are integers
  of 10^-8 units (``AMOUNT_TYPE`` has 8 places), so sums are exact. A prefix sum may wrap
  past 2^63, but a difference of two wrapped sums is still exact as long as the window's
  own sum fits, which holds for every key whose amounts add up below 2^62; the rare key
  beyond that (or with an amount past 2^63 units) is decided by the exact reference;
- MIN and MAX are range queries on a sparse table (levels up to the longest window);
- UNIQUE_COUNT is the number of events in the window whose previous occurrence of the
  same value (in the same key) lies before the window, counted on a merge-sort tree over
  dyadic blocks (levels up to the longest window);
- every comparison with the limit is exact: a limit is turned into the integer bound
  that the integer figure must pass (AVG compares ``total OP limit × count``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import pairwise

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from velocity.rules import Aggregator, Operator, Rule
from velocity.windows import KeyedEvent, evaluate_key_history, format_aggregate

# The amount's decimal places (``AMOUNT_TYPE``): numbers are kept as integer units of
# 10^-AMOUNT_PLACES. AVG is shown with as many places (``AVG_DISPLAY_PLACES``).
AMOUNT_PLACES = 8
UNITS = 10**AMOUNT_PLACES
_INT64_MAX = int(np.iinfo(np.int64).max)
_INT64_MIN = int(np.iinfo(np.int64).min)
# A key whose amounts add up to more than this (in units) is decided exactly instead:
# every window sum of the others fits in int64 with room to spare.
_SAFE_TOTAL = float(2**62)
_NEEDS_NUMBERS = frozenset({Aggregator.SUM, Aggregator.AVG, Aggregator.MIN, Aggregator.MAX})

# The keyed events' columns (``velocity.spark.evaluate.KEYED_SCHEMA``).
KEYED_COLUMNS = ("signature_id", "key", "eventTime", "transactionId", "value", "number")


@dataclass(frozen=True)
class Decisions:
    """The decisions that fired: the event's row in the input, the rule's index in the
    rules given, the aggregate as SPEC §4 text, and the window's lower edge."""

    rows: np.ndarray  # int64
    rules: np.ndarray  # int64
    values: np.ndarray  # str
    window_starts: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.rows)

    @classmethod
    def concat(cls, parts: Sequence[Decisions]) -> Decisions:
        if not parts:
            return cls(_ints(), _ints(), np.array([], dtype=str), _ints())
        return cls(
            np.concatenate([p.rows for p in parts]),
            np.concatenate([p.rules for p in parts]),
            np.concatenate([p.values.astype(str) for p in parts]),
            np.concatenate([p.window_starts for p in parts]),
        )


def _ints(values: Sequence[int] = ()) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def decide_history(events: pa.Table, rules: Sequence[Rule], width_ms: int) -> Decisions:
    """Every decision that fires over the complete history in ``events`` (KEYED_COLUMNS,
    any order), for every rule of ``rules`` whose signature has events there."""
    if events.num_rows == 0 or not rules:
        return Decisions.concat([])
    columns = _Columns.of(events)
    by_signature: dict[str, list[int]] = {}
    for index, rule in enumerate(rules):
        by_signature.setdefault(rule.signature.signature_id, []).append(index)
    parts = []
    for signature_id, rows in columns.signature_rows():
        indices = by_signature.get(signature_id)
        if indices:
            group = [(i, rules[i]) for i in indices]
            parts.append(_decide_signature(columns, rows, group, width_ms))
    return Decisions.concat(parts)


@dataclass(frozen=True)
class _Columns:
    """The input's columns as numpy arrays, decoded once."""

    table: pa.Table
    signatures: list[str]
    signature_codes: np.ndarray
    key_codes: np.ndarray
    times: np.ndarray
    value_codes: np.ndarray  # -1: no value
    units: np.ndarray  # the number in 10^-8 units (0 where none or too wide)
    has_number: np.ndarray
    too_wide: np.ndarray  # a number whose units do not fit in int64

    @classmethod
    def of(cls, table: pa.Table) -> _Columns:
        signature_codes, signatures = _dictionary_codes(table.column("signature_id"))
        key_codes, _ = _dictionary_codes(table.column("key"))
        value_codes, _ = _dictionary_codes(table.column("value"))
        units, has_number, too_wide = _decimal_units(table.column("number"))
        times = table.column("eventTime").to_numpy().astype(np.int64, copy=False)
        return cls(
            table,
            signatures,
            signature_codes,
            key_codes,
            times,
            value_codes,
            units,
            has_number,
            too_wide,
        )

    def signature_rows(self) -> Iterator[tuple[str, np.ndarray]]:
        """Per signature, its rows ordered by (key, eventTime, input order)."""
        order = np.lexsort((self.times, self.key_codes, self.signature_codes))
        codes = self.signature_codes[order]
        edges = np.flatnonzero(np.diff(codes)) + 1
        for part in np.split(order, edges):
            yield self.signatures[int(self.signature_codes[part[0]])], part


def _dictionary_codes(column: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """Integer codes of a string column's values (-1 for null) and the values by code."""
    encoded = pc.dictionary_encode(column).combine_chunks()
    codes = encoded.indices.fill_null(-1).to_numpy().astype(np.int64, copy=False)
    return codes, encoded.dictionary.to_pylist()


def _decimal_units(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A decimal column as int64 units of 10^-8: (units, has a number, too wide for int64).

    Read from the 128-bit two's complement words: a value fits when its high word is the
    sign extension of its low word.
    """
    number = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not pa.types.is_decimal(number.type) or number.type.scale != AMOUNT_PLACES:
        number = pc.cast(number, pa.decimal128(38, AMOUNT_PLACES))
    n = len(number)
    has_number = number.is_valid().to_numpy(zero_copy_only=False)
    if number.type.bit_width != 128 or n == 0:
        number = pc.cast(number, pa.decimal128(38, AMOUNT_PLACES))
    words = np.frombuffer(number.buffers()[1], dtype="<i8")
    words = words[2 * number.offset : 2 * (number.offset + n)].reshape(n, 2)
    low, high = words[:, 0], words[:, 1]
    fits = high == (low >> 63)
    too_wide = has_number & ~fits
    units = np.where(has_number & fits, low, 0).astype(np.int64)
    return units, has_number, too_wide


def _decide_signature(
    columns: _Columns, rows: np.ndarray, rules: Sequence[tuple[int, Rule]], width_ms: int
) -> Decisions:
    """The decisions of one signature's rows (ordered by key, then eventTime)."""
    keys = columns.key_codes[rows]
    times = columns.times[rows]
    key_starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    key_rank = np.cumsum(np.r_[False, keys[1:] != keys[:-1]], dtype=np.int64)

    exact = np.zeros(len(rows), dtype=bool)
    if any(rule.aggregator in _NEEDS_NUMBERS for _, rule in rules):
        exact = _keys_beyond_int64(columns, rows, key_starts, key_rank)

    window = _Windows(columns, rows, key_rank, times, width_ms)
    parts = [_fired(window, index, rule, ~exact) for index, rule in rules]
    if exact.any():
        parts.append(_decide_exactly(columns, rows[exact], key_rank[exact], rules, width_ms))
    return Decisions.concat(parts)


def _keys_beyond_int64(
    columns: _Columns, rows: np.ndarray, key_starts: np.ndarray, key_rank: np.ndarray
) -> np.ndarray:
    """Rows of keys whose amounts could take a window sum past int64: decided exactly."""
    units = columns.units[rows]
    wide = columns.too_wide[rows]
    totals = np.add.reduceat(np.abs(units).astype(np.float64), key_starts)
    wide_keys = np.add.reduceat(wide.astype(np.int64), key_starts) > 0
    beyond = (totals > _SAFE_TOTAL) | wide_keys
    return beyond[key_rank]


class _Windows:
    """Each event's window per window length, and the figures over it, computed once."""

    def __init__(
        self,
        columns: _Columns,
        rows: np.ndarray,
        key_rank: np.ndarray,
        times: np.ndarray,
        width_ms: int,
    ) -> None:
        self.columns = columns
        self.rows = rows
        self.key_rank = key_rank
        self.times = times
        self.width_ms = width_ms
        self._unique_times = np.unique(times)
        self._span = np.int64(len(self._unique_times) + 1)
        self._composite = key_rank * self._span + np.searchsorted(self._unique_times, times)
        # The upper edge: past the last event of the key at or before t (ties included).
        self.hi = np.searchsorted(self._composite, self._composite, side="right")
        self._lower: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._figures: dict[tuple[str, int], np.ndarray] = {}
        self._prefix: dict[str, np.ndarray] = {}

    def lower(self, window_ms: int) -> tuple[np.ndarray, np.ndarray]:
        """(the window's first row, its lower edge floor_g(t) - W) per event."""
        if window_ms not in self._lower:
            own = self.times - np.mod(self.times, self.width_ms)
            edge = own - window_ms
            first_time = np.searchsorted(self._unique_times, edge, side="left")
            lo = np.searchsorted(
                self._composite, self.key_rank * self._span + first_time, side="left"
            )
            self._lower[window_ms] = (lo, edge)
        return self._lower[window_ms]

    def _prefix_sum(self, name: str, values: Callable[[], np.ndarray]) -> np.ndarray:
        if name not in self._prefix:
            # Wraps past 2^63 where a key is wide; differences inside a key stay exact.
            self._prefix[name] = np.concatenate(([0], np.cumsum(values(), dtype=np.int64)))
        return self._prefix[name]

    def figure(self, name: str, window_ms: int) -> np.ndarray:
        """``count``, ``value_count``, ``number_count``, ``total``, ``minimum``,
        ``maximum`` or ``distinct_count`` of every event's window."""
        slot = (name, window_ms)
        if slot in self._figures:
            return self._figures[slot]
        lo, _ = self.lower(window_ms)
        hi, columns, rows = self.hi, self.columns, self.rows
        if name == "count":
            out = hi - lo
        elif name == "value_count":
            prefix = self._prefix_sum("value", lambda: columns.value_codes[rows] >= 0)
            out = prefix[hi] - prefix[lo]
        elif name == "number_count":
            prefix = self._prefix_sum("number", lambda: columns.has_number[rows])
            out = prefix[hi] - prefix[lo]
        elif name == "total":
            prefix = self._prefix_sum("total", lambda: columns.units[rows])
            out = prefix[hi] - prefix[lo]
        elif name == "minimum":
            units = np.where(columns.has_number[rows], columns.units[rows], _INT64_MAX)
            out = range_extreme(units, lo, hi, np.minimum)
        elif name == "maximum":
            units = np.where(columns.has_number[rows], columns.units[rows], _INT64_MIN)
            out = range_extreme(units, lo, hi, np.maximum)
        elif name == "distinct_count":
            out = distinct_counts(columns.value_codes[rows], self.key_rank, lo, hi)
        else:
            raise ValueError(f"no window figure {name!r}")
        self._figures[slot] = out
        return out


def range_extreme(
    values: np.ndarray, lo: np.ndarray, hi: np.ndarray, reduce: np.ufunc
) -> np.ndarray:
    """``reduce`` (np.minimum or np.maximum) of ``values[lo:hi]`` per query (hi > lo), on
    a sparse table with levels up to the longest range."""
    lengths = hi - lo
    if len(lengths) == 0:
        return np.array([], dtype=values.dtype)
    levels = np.floor(np.log2(lengths)).astype(np.int64)
    table = [values]
    for level in range(1, int(levels.max()) + 1):
        previous, step = table[-1], 1 << (level - 1)
        table.append(reduce(previous[:-step], previous[step:]))
    out = np.empty(len(lo), dtype=values.dtype)
    for level in np.unique(levels):
        chosen = levels == level
        left, right = lo[chosen], hi[chosen] - (1 << int(level))
        out[chosen] = reduce(table[level][left], table[level][right])
    return out


def distinct_counts(
    codes: np.ndarray, key_rank: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """The number of distinct values (codes >= 0) in ``[lo, hi)`` per query.

    A value counts once, at its first occurrence inside the range: an index ``i`` with
    ``prev[i] < lo``, where ``prev`` is the previous index of the same value in the same
    key (-1 for none). ``[lo, hi)`` splits into dyadic blocks (at most two per level);
    each level keeps ``prev`` sorted within its blocks, so a block's count is one
    ``searchsorted``.
    """
    n = len(codes)
    out = np.zeros(len(lo), dtype=np.int64)
    if n == 0 or len(lo) == 0:
        return out
    index = np.arange(n, dtype=np.int64)
    valued = codes >= 0
    order = np.lexsort((index, codes, key_rank))
    same = (key_rank[order][1:] == key_rank[order][:-1]) & (codes[order][1:] == codes[order][:-1])
    previous = np.full(n, -1, dtype=np.int64)
    previous[order[1:][same]] = order[:-1][same]
    # prev + 1 in [0, n]; n + 1 for an event without a value (never counted).
    shifted = np.where(valued, previous + 1, n + 1)
    span = np.int64(n + 2)
    levels = int((hi - lo).max()).bit_length()
    blocks: dict[int, np.ndarray] = {}

    def count_block(level: int, chosen: np.ndarray, start: np.ndarray) -> None:
        if level not in blocks:
            composite = (index >> level) * span + shifted
            blocks[level] = composite if level == 0 else np.sort(composite)
        block = start >> level
        below = np.searchsorted(blocks[level], block * span + lo[chosen] + 1, side="left")
        out[chosen] += below - block * (1 << level)

    cursor = lo.copy()
    for level in range(levels):  # up: align the cursor, smallest blocks first
        size = 1 << level
        chosen = ((cursor & size) != 0) & (cursor + size <= hi)
        if chosen.any():
            count_block(level, chosen, cursor[chosen])
            cursor[chosen] += size
    for level in reversed(range(levels)):  # down: the rest, largest blocks first
        size = 1 << level
        chosen = cursor + size <= hi
        if chosen.any():
            count_block(level, chosen, cursor[chosen])
            cursor[chosen] += size
    return out


def _fired(window: _Windows, index: int, rule: Rule, eligible: np.ndarray) -> Decisions:
    """One rule's decisions among the ``eligible`` rows of a signature."""
    w = rule.window_ms
    aggregator, op, limit = rule.aggregator, rule.operator, Fraction(rule.limit)
    text: Callable[[np.ndarray], np.ndarray]
    if aggregator in (Aggregator.COUNT, Aggregator.UNIQUE_COUNT):
        name = "count" if aggregator is Aggregator.COUNT else "distinct_count"
        figure = window.figure(name, w)
        fired = eligible & holds(figure, op, limit)
        text = lambda chosen: figure[chosen].astype(str)  # noqa: E731
    elif aggregator is Aggregator.AVG:
        total, count = window.figure("total", w), window.figure("value_count", w)
        has = window.figure("number_count", w) > 0
        fired = eligible & has & (count > 0)
        fired[fired] = average_holds(total[fired], count[fired], op, limit * UNITS)
        text = lambda chosen: units_text(rounded_average(total[chosen], count[chosen]))  # noqa: E731
    else:
        name = {Aggregator.SUM: "total", Aggregator.MIN: "minimum", Aggregator.MAX: "maximum"}[
            aggregator
        ]
        figure = window.figure(name, w)
        has = window.figure("number_count", w) > 0
        fired = eligible & has & holds(figure, op, limit * UNITS)
        text = lambda chosen: units_text(figure[chosen])  # noqa: E731
    chosen = np.flatnonzero(fired)
    _, edge = window.lower(w)
    return Decisions(
        window.rows[chosen],
        np.full(len(chosen), index, dtype=np.int64),
        text(chosen),
        edge[chosen],
    )


def holds(figures: np.ndarray, op: Operator, limit: Fraction) -> np.ndarray:
    """``figure OP limit`` per integer figure, exactly, for any rational limit."""
    floor, ceil = math.floor(limit), math.ceil(limit)
    integral = floor == ceil
    match op:
        case Operator.GREATER:
            return _compare(figures, op, floor)
        case Operator.LESS_EQUAL:
            return _compare(figures, op, floor)
        case Operator.GREATER_EQUAL | Operator.LESS:
            return _compare(figures, op, ceil)
        case Operator.EQUAL:
            return _compare(figures, op, floor) if integral else np.zeros(len(figures), bool)
        case Operator.NOT_EQUAL:
            return _compare(figures, op, floor) if integral else np.ones(len(figures), bool)
    raise AssertionError(op)  # unreachable: match is exhaustive


def _compare(figures: np.ndarray, op: Operator, bound: int) -> np.ndarray:
    """``figures OP bound`` for an integer bound that may lie outside int64."""
    if bound > _INT64_MAX:
        below = op in (Operator.LESS, Operator.LESS_EQUAL, Operator.NOT_EQUAL)
        return np.full(len(figures), below)
    if bound < _INT64_MIN:
        above = op in (Operator.GREATER, Operator.GREATER_EQUAL, Operator.NOT_EQUAL)
        return np.full(len(figures), above)
    return np.asarray(op.comparison(figures, np.int64(bound)), dtype=bool)


def average_holds(
    totals: np.ndarray, counts: np.ndarray, op: Operator, limit_units: Fraction
) -> np.ndarray:
    """``total / count OP limit`` as ``total × q OP p × count`` (limit = p/q, count > 0),
    in int64 when no product can overflow, else in Python integers."""
    p, q = limit_units.numerator, limit_units.denominator
    if len(totals) == 0:
        return np.zeros(0, dtype=bool)
    reach = max(abs(int(totals.max())), abs(int(totals.min()))) * q
    if reach < _SAFE_TOTAL and abs(p) * int(counts.max()) < _SAFE_TOTAL:
        left, right = totals * np.int64(q), np.int64(p) * counts
    else:
        left = totals.astype(object) * q
        right = counts.astype(object) * p
    return np.asarray(op.comparison(left, right), dtype=bool)


def rounded_average(totals: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``total / count`` in units, rounded half to even (as ``format_aggregate`` shows AVG
    with ``AMOUNT_PLACES`` places)."""
    quotient, remainder = np.divmod(totals, counts)
    twice = 2 * remainder
    up = (twice > counts) | ((twice == counts) & (quotient % 2 == 1))
    return quotient + up


def units_text(units: np.ndarray) -> np.ndarray:
    """Integer units of 10^-8 as decimal text with no exponent and no trailing zeros, as
    ``velocity.decimals.format_decimal`` writes them (``0``, ``250000``, ``0.5``)."""
    units = units.astype(np.int64)
    if len(units) == 0:
        return np.array([], dtype=str)
    magnitude = np.abs(units.astype(object)) if (units == _INT64_MIN).any() else np.abs(units)
    whole = (magnitude // UNITS).astype(str)
    fraction = np.strings.rstrip(np.strings.zfill((magnitude % UNITS).astype(str), 8), "0")
    text = np.where(fraction == "", whole, np.strings.add(np.strings.add(whole, "."), fraction))
    return np.where(units < 0, np.strings.add("-", text), text)


def _decide_exactly(
    columns: _Columns,
    rows: np.ndarray,
    key_rank: np.ndarray,
    rules: Sequence[tuple[int, Rule]],
    width_ms: int,
) -> Decisions:
    """The reference engine over the keys that do not fit the int64 kernel (rare)."""
    table = columns.table.take(pa.array(rows))
    times = table.column("eventTime").to_pylist()
    ids = table.column("transactionId").to_pylist()
    values = table.column("value").to_pylist()
    numbers = table.column("number").to_pylist()
    index_of = {id(rule): index for index, rule in rules}
    out_rows: list[int] = []
    out_rules: list[int] = []
    out_values: list[str] = []
    out_edges: list[int] = []
    edges = [*np.flatnonzero(np.r_[True, key_rank[1:] != key_rank[:-1]]).tolist(), len(rows)]
    for start, end in pairwise(edges):
        events = [KeyedEvent(times[i], ids[i], values[i], numbers[i]) for i in range(start, end)]
        row_of = {id(event): int(rows[start + i]) for i, event in enumerate(events)}
        for decision in evaluate_key_history(events, [rule for _, rule in rules], width_ms):
            out_rows.append(row_of[id(decision.event)])
            out_rules.append(index_of[id(decision.rule)])
            out_values.append(format_aggregate(decision.value))
            out_edges.append(decision.window_start)
    return Decisions(
        _ints(out_rows), _ints(out_rules), np.array(out_values, dtype=str), _ints(out_edges)
    )
