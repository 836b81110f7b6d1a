"""The columnar decision kernel (SPEC §3): a key-partition's events in, the decisions out.

``decide_history`` takes the keyed events of any number of (signature, key)s as Arrow
columns and returns every decision that fires over their complete history, exactly as
the per-event reference (``velocity.domain.windows.evaluate_key_history``) decides them, which
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
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from velocity.domain.rules import Aggregator, Operator, Rule

# The amount's decimal places (``AMOUNT_TYPE``): numbers are kept as integer units of
# 10^-AMOUNT_PLACES. AVG is shown with as many places (``AVG_DISPLAY_PLACES``).
AMOUNT_PLACES = 8
UNITS = 10**AMOUNT_PLACES
INT64_MAX = int(np.iinfo(np.int64).max)
INT64_MIN = int(np.iinfo(np.int64).min)
# A key whose amounts add up to more than this (in units) is decided in Python integers
# instead: every window sum of the others fits in int64 with room to spare.
SAFE_TOTAL = float(2**62)
_NEEDS_NUMBERS = frozenset({Aggregator.SUM, Aggregator.AVG, Aggregator.MIN, Aggregator.MAX})

# The keyed events' columns (``velocity.spark.evaluate.KEYED_SCHEMA``); an optional
# boolean ``decide`` column marks the events to decide (all of them without it).
KEYED_COLUMNS = ("signature_id", "key", "eventTime", "transactionId", "value", "number")
# What a stored bucket holds (the buckets table's figures, ``BucketAggregate``'s fields).
BUCKET_FIGURES = (
    "event_count",
    "value_count",
    "value_sum",
    "value_min",
    "value_max",
    "distinct_values",
)
# Stored buckets beside the events: ``time`` is where the bucket stands on the time axis,
# the newest eventTime counted in it (its start when only whole-bucket windows read it).
BUCKET_COLUMNS = ("signature_id", "key", "time", *BUCKET_FIGURES)


@dataclass(frozen=True)
class Decisions:
    """The decisions that fired: the event's row in the input, the rule's index in the
    rules given, the aggregate as a number (integer units of 10^-8, a count too: text is
    made once, by ``value_texts``, where a record is written), and the window's lower
    edge."""

    rows: np.ndarray  # int64
    rules: np.ndarray  # int64
    values: np.ndarray  # int64 units (object: Python integers, beyond int64)
    window_starts: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.rows)

    def texts(self) -> pa.Array:
        """The values as SPEC §4 text (``value_texts``)."""
        return value_texts(self.values)

    @classmethod
    def concat(cls, parts: Sequence[Decisions]) -> Decisions:
        if not parts:
            return cls(_ints(), _ints(), _ints(), _ints())
        if len(parts) == 1:
            return parts[0]
        return cls(
            np.concatenate([p.rows for p in parts]),
            np.concatenate([p.rules for p in parts]),
            np.concatenate([p.values for p in parts]),  # object if any part is
            np.concatenate([p.window_starts for p in parts]),
        )


def _ints(values: Sequence[int] = ()) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def decide_history(events: pa.Table, rules: Sequence[Rule], width_ms: int) -> Decisions:
    """Every decision that fires over the complete history in ``events`` (KEYED_COLUMNS,
    any order), for every rule of ``rules`` whose signature has events there."""
    return decide(events, None, rules, width_ms)


def decide(
    events: pa.Table, buckets: pa.Table | None, rules: Sequence[Rule], width_ms: int
) -> Decisions:
    """The decisions of ``events`` (KEYED_COLUMNS; those whose ``decide`` is true, when
    that column is there) over the windows they see: the events themselves plus the
    stored ``buckets`` (BUCKET_COLUMNS) of the same (signature, key).

    A bucket counts whole in the window of an event at ``t`` when its ``time`` is at or
    before ``t`` and its start at or after the window's lower edge; so a bucket that also
    holds events later than an event in it must come as those raw events instead (the
    stream's own-bucket history). Decisions equal the reference engine's over the events
    the buckets were made of plus ``events``.
    """
    if events.num_rows == 0 or not rules:
        return Decisions.concat([])
    columns = _Columns.of(events, buckets)
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
    """Window rows as numpy arrays, decoded once: the events, then the stored buckets,
    then one row per distinct value of each bucket (which counts only for UNIQUE_COUNT).

    Amount figures are int64 units of 10^-8; ``too_wide`` marks a row with a figure
    beyond int64, whose exact value ``exact_units`` gives.
    """

    events: pa.Table
    buckets: pa.Table | None
    signatures: list[str]
    signature_codes: np.ndarray
    key_codes: np.ndarray
    times: np.ndarray
    origins: np.ndarray  # the event's row in ``events``; -1 for a bucket's rows
    targets: np.ndarray  # the events to decide
    counts: np.ndarray
    value_counts: np.ndarray
    number_counts: np.ndarray
    value_codes: np.ndarray  # -1: no value
    totals: np.ndarray
    minimums: np.ndarray
    maximums: np.ndarray
    too_wide: np.ndarray

    @classmethod
    def of(cls, events: pa.Table, buckets: pa.Table | None) -> _Columns:
        n = events.num_rows
        ones = np.ones(n, dtype=np.int64)
        units, has_number, wide = decimal_units(events.column("number"))
        targets = (
            events.column("decide").to_numpy(zero_copy_only=False).astype(bool)
            if "decide" in events.column_names
            else np.ones(n, dtype=bool)
        )
        has_value = events.column("value").is_valid().to_numpy(zero_copy_only=False)
        parts = {
            "signature_id": [events.column("signature_id")],
            "key": [events.column("key")],
            "value": [events.column("value")],
        }
        times = [events.column("eventTime").to_numpy().astype(np.int64)]
        origins, target_parts = [np.arange(n, dtype=np.int64)], [targets]
        counts, value_counts = [ones], [has_value.astype(np.int64)]
        number_counts = [has_number.astype(np.int64)]
        totals, minimums, maximums, too_wide = [units], [units], [units], [wide]
        if buckets is not None and buckets.num_rows:
            b = buckets.num_rows
            values = buckets.column("distinct_values").combine_chunks()
            flat = pc.list_flatten(values)
            parent = pc.list_parent_indices(values).to_numpy().astype(np.int64)
            x = len(flat)
            for name in ("signature_id", "key"):
                column = buckets.column(name).combine_chunks()
                parts[name] += [column, column.take(pa.array(parent))]
            parts["value"] += [pa.nulls(b, pa.string()), flat.cast(pa.string())]
            bucket_times = buckets.column("time").to_numpy().astype(np.int64)
            times += [bucket_times, bucket_times[parent]]
            origins.append(np.full(b + x, -1, dtype=np.int64))
            target_parts.append(np.zeros(b + x, dtype=bool))
            event_count = buckets.column("event_count").to_numpy().astype(np.int64)
            value_count = buckets.column("value_count").to_numpy().astype(np.int64)
            total, has_total, wide_total = decimal_units(buckets.column("value_sum"))
            low, _, wide_low = decimal_units(buckets.column("value_min"))
            high, _, wide_high = decimal_units(buckets.column("value_max"))
            none = np.zeros(x, dtype=np.int64)
            counts += [event_count, none]
            value_counts += [value_count, none]
            number_counts += [np.where(has_total, value_count, 0), none]
            totals += [total, none]
            minimums += [low, none]
            maximums += [high, none]
            too_wide += [wide_total | wide_low | wide_high, np.zeros(x, dtype=bool)]
        signature_codes, signatures = dictionary_codes(parts["signature_id"], values=True)
        key_codes, _ = dictionary_codes(parts["key"])
        value_codes, _ = dictionary_codes(parts["value"])
        return cls(
            events,
            buckets,
            signatures,
            signature_codes,
            key_codes,
            np.concatenate(times),
            np.concatenate(origins),
            np.concatenate(target_parts),
            np.concatenate(counts),
            np.concatenate(value_counts),
            np.concatenate(number_counts),
            value_codes,
            np.concatenate(totals),
            np.concatenate(minimums),
            np.concatenate(maximums),
            np.concatenate(too_wide),
        )

    def signature_rows(self) -> Iterator[tuple[str, np.ndarray]]:
        """Per signature, its rows ordered by (key, time)."""
        order = np.lexsort((self.times, self.key_codes, self.signature_codes))
        codes = self.signature_codes[order]
        edges = np.flatnonzero(np.diff(codes)) + 1
        for part in np.split(order, edges):
            yield self.signatures[int(self.signature_codes[part[0]])], part

    def exact_units(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(totals, minimums, maximums) of ``rows`` as Python integers (object arrays)."""
        out = [
            figure[rows].astype(object) for figure in (self.totals, self.minimums, self.maximums)
        ]
        wide = np.flatnonzero(self.too_wide[rows])
        n = self.events.num_rows
        for position in wide.tolist():
            row = int(rows[position])
            if row < n:
                number = units_of(self.events.column("number")[row].as_py())
                out[0][position] = out[1][position] = out[2][position] = number
            else:
                assert self.buckets is not None
                bucket = row - n
                for figure, name in zip(out, ("value_sum", "value_min", "value_max"), strict=True):
                    figure[position] = units_of(self.buckets.column(name)[bucket].as_py())
        return out[0], out[1], out[2]


def units_of(value: Decimal | None) -> int:
    return 0 if value is None else int(value.scaleb(AMOUNT_PLACES))


def dictionary_codes(
    columns: Sequence[pa.Array | pa.ChunkedArray], values: bool = False
) -> tuple[np.ndarray, list[str]]:
    """Integer codes of string columns' values, one dictionary for all (-1 for null),
    and (``values``) the values by code."""
    chunks = [
        c
        for column in columns
        for c in (column.chunks if isinstance(column, pa.ChunkedArray) else [column])
    ]
    encoded = pc.dictionary_encode(pa.chunked_array(chunks, pa.string())).combine_chunks()
    codes = encoded.indices.fill_null(-1).to_numpy().astype(np.int64, copy=False)
    return codes, encoded.dictionary.to_pylist() if values else []


def decimal_units(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A decimal column as int64 units of 10^-8: (units, has a number, too wide for int64).

    Read from the 128-bit two's complement words: a value fits when its high word is the
    sign extension of its low word.
    """
    number = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not pa.types.is_decimal128(number.type) or number.type.scale != AMOUNT_PLACES:
        number = pc.cast(number, pa.decimal128(38, AMOUNT_PLACES))
    n = len(number)
    has_number = number.is_valid().to_numpy(zero_copy_only=False)
    if n == 0:
        return _ints(), has_number, np.zeros(0, dtype=bool)
    words = np.frombuffer(number.buffers()[1], dtype="<i8")
    words = words[2 * number.offset : 2 * (number.offset + n)].reshape(n, 2)
    low, high = words[:, 0], words[:, 1]
    fits = high == (low >> 63)
    too_wide = has_number & ~fits
    units = np.where(has_number & fits, low, 0).astype(np.int64)
    return units, has_number, too_wide


@dataclass(frozen=True)
class KeyTimeOrder:
    """Rows sorted by (key rank, time) as one increasing int64 (``composite``): key rank
    × span + the time's place, so one ``searchsorted`` finds a key's first row at or past
    a time. The place is the time past the oldest row's while that fits int64 with room,
    else its rank among the rows' distinct times; any time at or before the oldest
    places first, any past the newest last."""

    oldest: int
    span: np.int64
    ranks: np.ndarray | None  # the rows' distinct times, when offsets would not fit

    @classmethod
    def of(cls, key_rank: np.ndarray, times: np.ndarray) -> KeyTimeOrder:
        """For rows sorted by (key rank, time); ``key_rank`` counts from 0."""
        if not len(times):
            return cls(0, np.int64(2), None)
        oldest = int(times.min())
        reach = int(times.max()) - oldest + 2
        if reach * (int(key_rank[-1]) + 1) < SAFE_TOTAL:
            return cls(oldest, np.int64(reach), None)
        ranks = sorted_distinct(times)
        return cls(oldest, np.int64(len(ranks) + 1), ranks)

    def composite(self, key_rank: np.ndarray, times: np.ndarray) -> np.ndarray:
        if self.ranks is None:
            place = np.clip(times - self.oldest, 0, self.span - 1)
        else:  # the count of distinct times below: at least a row's exactly when its time is
            place = np.searchsorted(self.ranks, times, side="left")
        return key_rank * self.span + place


def sorted_distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, ascending, as ``np.unique`` gives them: NumPy 2.4's hashes
    them first, 12× one sort for 3M eventTimes."""
    ordered = np.sort(values)
    return ordered[_runs(ordered)[0]] if len(ordered) else ordered


def _runs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For sorted ``values``: where each run of equal values starts (a mask), and each
    row's run number."""
    starts = np.r_[True, values[1:] != values[:-1]]
    return starts, np.cumsum(starts, dtype=np.int64) - 1


def _decide_signature(
    columns: _Columns, rows: np.ndarray, rules: Sequence[tuple[int, Rule]], width_ms: int
) -> Decisions:
    """The decisions of one signature's rows (ordered by key, then time): keys whose
    amounts fit int64 sums in int64, the rare others in Python integers."""
    starts, key_rank = _runs(columns.key_codes[rows])
    exact = np.zeros(len(rows), dtype=bool)
    if any(rule.aggregator in _NEEDS_NUMBERS for _, rule in rules):
        totals = np.add.reduceat(
            np.abs(columns.totals[rows]).astype(np.float64), np.flatnonzero(starts)
        )
        wide = np.add.reduceat(columns.too_wide[rows].astype(np.int64), np.flatnonzero(starts)) > 0
        exact = ((totals > SAFE_TOTAL) | wide)[key_rank]
    parts = []
    for chosen in (~exact, exact):
        if not chosen.any():
            continue
        subset = rows[chosen]
        figures = columns.exact_units(subset) if chosen is exact else None
        window = _Windows(columns, subset, width_ms, figures)
        parts += [_fired(window, index, rule) for index, rule in rules]
    return Decisions.concat(parts)


class _Windows:
    """Each target's window per window length, and the figures over it, computed once.

    ``exact``: the rows' (totals, minimums, maximums) as Python integers, for keys whose
    sums could pass int64 (None: int64, whose prefix sums may wrap, but whose differences
    inside a key are exact).
    """

    def __init__(
        self,
        columns: _Columns,
        rows: np.ndarray,
        width_ms: int,
        exact: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
    ) -> None:
        self.columns = columns
        self.rows = rows
        self.width_ms = width_ms
        _, self.key_rank = _runs(columns.key_codes[rows])
        self.times = columns.times[rows]
        self.targets = np.flatnonzero(columns.targets[rows])
        self._exact = exact
        self._order = KeyTimeOrder.of(self.key_rank, self.times)
        self._composite = self._order.composite(self.key_rank, self.times)
        # The upper edge: past the last row of the target's run of equal (key, time).
        composite = self._composite
        run_starts, run = _runs(composite)
        run_ends = np.r_[np.flatnonzero(run_starts)[1:], len(composite)]
        self.hi = run_ends[run[self.targets]]
        self._lower: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._figures: dict[tuple[str, int], np.ndarray] = {}
        self._prefix: dict[str, np.ndarray] = {}

    def lower(self, window_ms: int) -> tuple[np.ndarray, np.ndarray]:
        """(the window's first row, its lower edge floor_g(t) - W) per target."""
        if window_ms not in self._lower:
            times = self.times[self.targets]
            edge = times - np.mod(times, self.width_ms) - window_ms
            lo = np.searchsorted(
                self._composite,
                self._order.composite(self.key_rank[self.targets], edge),
                side="left",
            )
            self._lower[window_ms] = (lo, edge)
        return self._lower[window_ms]

    def _amounts(self, index: int) -> np.ndarray:
        if self._exact is not None:
            return self._exact[index]
        figure = (self.columns.totals, self.columns.minimums, self.columns.maximums)[index]
        return figure[self.rows]

    def _range_sum(self, name: str, window_ms: int) -> np.ndarray:
        if name not in self._prefix:
            if name == "totals":
                values = self._amounts(0)
            else:
                values = getattr(self.columns, name)[self.rows]
            dtype = object if values.dtype == object else np.int64
            # int64 sums wrap past 2^63 only where a key is wide (then ``exact`` is used).
            self._prefix[name] = np.concatenate(([0], np.cumsum(values, dtype=dtype)))
        lo, _ = self.lower(window_ms)
        prefix = self._prefix[name]
        return prefix[self.hi] - prefix[lo]

    def figure(self, name: str, window_ms: int) -> np.ndarray:
        """``count``, ``value_count``, ``number_count``, ``total``, ``minimum``,
        ``maximum`` or ``distinct_count`` of every target's window."""
        slot = (name, window_ms)
        if slot in self._figures:
            return self._figures[slot]
        lo, _ = self.lower(window_ms)
        numbered = self.columns.number_counts[self.rows] > 0
        if name in ("count", "value_count", "number_count"):
            out = self._range_sum(f"{name}s", window_ms)
        elif name == "total":
            out = self._range_sum("totals", window_ms)
        elif name == "minimum":
            high = INT64_MAX if self._exact is None else 10**40
            out = range_extreme(np.where(numbered, self._amounts(1), high), lo, self.hi, np.minimum)
        elif name == "maximum":
            low = INT64_MIN if self._exact is None else -(10**40)
            out = range_extreme(np.where(numbered, self._amounts(2), low), lo, self.hi, np.maximum)
        elif name == "distinct_count":
            codes = self.columns.value_codes[self.rows]
            out = distinct_counts(codes, self.key_rank, lo, self.hi)
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
        while level not in blocks:
            # A level's blocks are two sorted blocks of the level below: re-keyed, a stable
            # sort only merges them.
            below = len(blocks) - 1
            if below < 0:
                blocks[0] = index * span + shifted
            else:
                lower = blocks[below]
                composite = (lower // span >> 1) * span + lower % span
                blocks[below + 1] = np.sort(composite, kind="stable")
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


def _fired(window: _Windows, index: int, rule: Rule) -> Decisions:
    """One rule's decisions of a signature's targets."""
    w = rule.window_ms
    aggregator, op, limit = rule.aggregator, rule.operator, Fraction(rule.limit)
    value: Callable[[np.ndarray], np.ndarray]  # in units of 10^-8, as every value
    if aggregator in (Aggregator.COUNT, Aggregator.UNIQUE_COUNT):
        name = "count" if aggregator is Aggregator.COUNT else "distinct_count"
        figure = window.figure(name, w)
        fired = holds(figure, op, limit)
        value = lambda chosen: figure[chosen] * UNITS  # noqa: E731
    elif aggregator is Aggregator.AVG:
        total, count = window.figure("total", w), window.figure("value_count", w)
        has = window.figure("number_count", w) > 0
        fired = has & (count > 0)
        fired[fired] = average_holds(total[fired], count[fired], op, limit * UNITS)
        value = lambda chosen: rounded_average(total[chosen], count[chosen])  # noqa: E731
    else:
        name = {Aggregator.SUM: "total", Aggregator.MIN: "minimum", Aggregator.MAX: "maximum"}[
            aggregator
        ]
        figure = window.figure(name, w)
        has = window.figure("number_count", w) > 0
        fired = has & holds(figure, op, limit * UNITS)
        value = lambda chosen: figure[chosen]  # noqa: E731
    chosen = np.flatnonzero(fired)
    _, edge = window.lower(w)
    return Decisions(
        window.columns.origins[window.rows[window.targets[chosen]]],
        np.full(len(chosen), index, dtype=np.int64),
        value(chosen),
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
    if figures.dtype == object:
        return np.asarray(op.comparison(figures, bound), dtype=bool)
    if bound > INT64_MAX:
        below = op in (Operator.LESS, Operator.LESS_EQUAL, Operator.NOT_EQUAL)
        return np.full(len(figures), below)
    if bound < INT64_MIN:
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
    if reach < SAFE_TOTAL and abs(p) * int(counts.max()) < SAFE_TOTAL:
        left, right = totals * np.int64(q), np.int64(p) * counts
    else:
        left = totals.astype(object) * q
        right = counts.astype(object) * p
    return np.asarray(op.comparison(left, right), dtype=bool)


def rounded_average(totals: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``total / count`` in units, rounded half to even (as ``format_aggregate`` shows AVG
    with ``AMOUNT_PLACES`` places)."""
    if totals.dtype == object:
        pairs = [divmod(t, int(c)) for t, c in zip(totals.tolist(), counts.tolist(), strict=True)]
        quotient = np.array([q for q, _ in pairs] or [0], dtype=object)[: len(pairs)]
        remainder = np.array([r for _, r in pairs] or [0], dtype=object)[: len(pairs)]
    else:
        quotient, remainder = np.divmod(totals, counts)
    twice = 2 * remainder
    up = (twice > counts) | ((twice == counts) & (quotient % 2 == 1))
    return quotient + up


def value_texts(units: np.ndarray) -> pa.Array:
    """Integer units of 10^-8 as SPEC §4 text, by Arrow kernels: no exponent and no trailing
    zeros, as ``velocity.domain.decimals.format_decimal`` writes them (``0``, ``250000``,
    ``0.5``). Python integers beyond int64 go through ``units_text``."""
    if len(units) == 0:
        return pa.array([], pa.string())
    if units.dtype == object or (units == INT64_MIN).any():
        return pa.array(units_text(units.astype(object)).tolist(), pa.string())
    magnitude = np.abs(units)
    whole = pc.cast(pa.array(magnitude // UNITS), pa.string())
    digits = pc.utf8_lpad(pc.cast(pa.array(magnitude % UNITS), pa.string()), 8, "0")
    fraction = pc.utf8_rtrim(digits, "0")
    text = pc.if_else(
        pc.equal(fraction, ""), whole, pc.binary_join_element_wise(whole, fraction, ".")
    )
    negative = units < 0
    if negative.any():
        text = pc.if_else(pa.array(negative), pc.binary_join_element_wise("-", text, ""), text)
    return text


def units_text(units: np.ndarray) -> np.ndarray:
    """Integer units of 10^-8 as decimal text with no exponent and no trailing zeros, as
    ``velocity.domain.decimals.format_decimal`` writes them (``0``, ``250000``, ``0.5``)."""
    if len(units) == 0:
        return np.array([], dtype=str)
    if units.dtype != object and (units == INT64_MIN).any():
        units = units.astype(object)
    magnitude = np.abs(units)
    whole = (magnitude // UNITS).astype(str)
    fraction = np.strings.rstrip(np.strings.zfill((magnitude % UNITS).astype(str), 8), "0")
    text = np.where(fraction == "", whole, np.strings.add(np.strings.add(whole, "."), fraction))
    return np.where(units < 0, np.strings.add("-", text), text)
