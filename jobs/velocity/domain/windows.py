"""Window evaluation (SPEC §3): the aggregate of an event's window and whether a rule fires.

For an event at ``t`` and a rule with window ``W`` the window holds every event of
the same signature and key with ``floor_g(t - W) <= eventTime <= t``. Two ways to
compute it live here and must always agree (the property tests check it):

- ``window_from_buckets``: from stored buckets plus the event's own partial
  bucket, as the stream and the Redis lookup do;
- ``evaluate_key_history``: a sliding window over one key's complete, time-sorted
  history, as the backtest and backfill do, O(n) per rule window.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal, localcontext
from fractions import Fraction
from functools import partial
from itertools import groupby
from operator import attrgetter
from typing import NamedTuple, Protocol

from velocity.domain.buckets import BucketAggregate, bucket_start, merge_all, window_start
from velocity.domain.decimals import EXACT, exact_add, exact_subtract, format_decimal
from velocity.domain.rules import Aggregator, Rule

# AVG is compared exactly (as a fraction) and shown with this many decimal places.
AVG_DISPLAY_PLACES = 8

AggregateValue = Decimal | Fraction


class KeyedEvent(NamedTuple):
    """One accepted event as a signature sees it: its time, identity and field value."""

    event_time: int
    transaction_id: str
    value: str | None = None
    number: Decimal | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """A rule fired for an event: the aggregate and the window it was computed over."""

    rule: Rule
    event: KeyedEvent
    value: AggregateValue
    window_start: int


class WindowFigures(Protocol):
    """What every aggregator reads of a window; buckets and sliding windows both provide it."""

    @property
    def count(self) -> int: ...
    @property
    def value_count(self) -> int: ...
    @property
    def total(self) -> Decimal | None: ...
    @property
    def minimum(self) -> Decimal | None: ...
    @property
    def maximum(self) -> Decimal | None: ...
    @property
    def distinct_count(self) -> int: ...


class StateWidths(Protocol):
    """What the state's horizon depends on besides the rules (``velocity.settings.Settings``)."""

    @property
    def allowed_lateness_ms(self) -> int: ...
    @property
    def bucket_width_ms(self) -> int: ...


def horizon_seconds(rules: Sequence[Rule], widths: StateWidths) -> int:
    """How long a key's buckets matter after its last event, in whole seconds: the widest
    active window plus the allowed lateness plus one bucket. Older buckets are evicted
    (Delta) and expire (Redis)."""
    widest = max((r.window_ms for r in rules), default=0)
    return (widest + widths.allowed_lateness_ms + widths.bucket_width_ms) // 1000 + 1


def aggregate_value(aggregate: WindowFigures, aggregator: Aggregator) -> AggregateValue | None:
    """The rule's aggregate of a window; None when it has no value (no numeric values)."""
    match aggregator:
        case Aggregator.COUNT:
            return Decimal(aggregate.count)
        case Aggregator.UNIQUE_COUNT:
            return Decimal(aggregate.distinct_count)
        case Aggregator.SUM:
            return aggregate.total
        case Aggregator.MIN:
            return aggregate.minimum
        case Aggregator.MAX:
            return aggregate.maximum
        case Aggregator.AVG:
            if aggregate.total is None or aggregate.value_count == 0:
                return None
            return Fraction(aggregate.total) / aggregate.value_count
    raise AssertionError(aggregator)  # unreachable: match is exhaustive


def fires(rule: Rule, value: AggregateValue | None) -> bool:
    """``aggregate OP limit``; a window without a value never fires."""
    return value is not None and rule.operator.holds(value, rule.limit)


def fired_value(window: WindowFigures, rule: Rule) -> AggregateValue | None:
    """The rule's aggregate of ``window`` when ``aggregate OP limit`` holds, else None.

    AVG is judged as ``total OP limit × count`` (exact, count > 0), so the exact quotient
    is made only for a window that fires.
    """
    if rule.aggregator is Aggregator.AVG:
        total, count = window.total, window.value_count
        if total is None or count == 0:
            return None
        if not rule.operator.holds(total, EXACT.multiply(rule.limit, Decimal(count))):
            return None
        return Fraction(total) / count
    value = aggregate_value(window, rule.aggregator)
    return value if fires(rule, value) else None


RuleCheck = Callable[[WindowFigures], AggregateValue | None]


def rule_check(rule: Rule) -> RuleCheck:
    """``fired_value`` for one rule as a function of the window, its aggregator and
    operator chosen once: the stream calls it for every event and rule. Exact like
    ``fired_value`` (an int compares exactly with a Decimal)."""
    compare, limit = rule.operator.comparison, rule.limit
    if rule.aggregator is Aggregator.AVG:
        return partial(fired_value, rule=rule)
    read = attrgetter(_WINDOW_FIGURES[rule.aggregator])
    if rule.aggregator in (Aggregator.COUNT, Aggregator.UNIQUE_COUNT):

        def counted(window: WindowFigures) -> AggregateValue | None:
            n = read(window)
            return Decimal(n) if compare(n, limit) else None

        return counted

    def numeric(window: WindowFigures) -> AggregateValue | None:
        value = read(window)
        return value if value is not None and compare(value, limit) else None

    return numeric


# The window figure each aggregator but AVG reads (``aggregate_value``'s choices).
_WINDOW_FIGURES = {
    Aggregator.COUNT: "count",
    Aggregator.UNIQUE_COUNT: "distinct_count",
    Aggregator.SUM: "total",
    Aggregator.MIN: "minimum",
    Aggregator.MAX: "maximum",
}


def format_aggregate(value: AggregateValue) -> str:
    """Decimal string of an aggregate; AVG rounded half-even to 8 places for display."""
    if isinstance(value, Fraction):
        with localcontext() as ctx:
            # Enough digits that the quotient is exact to far below the shown places.
            ctx.prec = 120
            quotient = Decimal(value.numerator) / Decimal(value.denominator)
            value = quotient.quantize(Decimal(1).scaleb(-AVG_DISPLAY_PLACES), ROUND_HALF_EVEN)
    return format_decimal(value)


def window_from_buckets(
    buckets: Mapping[int, BucketAggregate],
    event_time: int,
    window_ms: int,
    width_ms: int,
    own_bucket: BucketAggregate,
) -> BucketAggregate:
    """The window of an event at ``event_time`` from whole buckets below its own.

    ``buckets`` maps bucket start to aggregate; the event's own bucket is not read
    from it, because only its events up to ``event_time`` count: the caller passes
    that partial aggregate as ``own_bucket``.
    """
    lower = window_start(event_time, window_ms, width_ms)
    own = bucket_start(event_time, width_ms)
    whole = (agg for start, agg in buckets.items() if lower <= start < own)
    return merge_all(whole).merge(own_bucket)


class _SlidingWindow:
    """Aggregates of the events in ``[lower, upper]`` as both edges move forward."""

    def __init__(self, events: Sequence[KeyedEvent], need_extremes: bool, need_distinct: bool):
        self._events = events
        self._need_extremes = need_extremes
        self._need_distinct = need_distinct
        self.lo = 0  # first index inside the window
        self.hi = 0  # first index past the window
        self.count = 0
        self.value_count = 0
        self.total: Decimal | None = None
        self.total_count = 0  # numeric values in total
        self.distinct: Counter[str] = Counter()
        self._mins: deque[int] = deque()  # indices, numbers increasing
        self._maxs: deque[int] = deque()  # indices, numbers decreasing

    def advance(self, lower: int, upper_index: int) -> None:
        events = self._events
        while self.hi < upper_index:
            self._add(self.hi, events[self.hi])
            self.hi += 1
        while self.lo < self.hi and events[self.lo].event_time < lower:
            self._remove(events[self.lo])
            self.lo += 1
        if self._need_extremes:
            while self._mins and self._mins[0] < self.lo:
                self._mins.popleft()
            while self._maxs and self._maxs[0] < self.lo:
                self._maxs.popleft()

    def _add(self, index: int, event: KeyedEvent) -> None:
        self.count += 1
        if event.value is None:
            return
        self.value_count += 1
        if self._need_distinct:
            self.distinct[event.value] += 1
        number = event.number
        if number is None:
            return
        self.total = number if self.total is None else exact_add(self.total, number)
        self.total_count += 1
        if self._need_extremes:
            events = self._events
            while self._mins and events[self._mins[-1]].number >= number:  # type: ignore[operator]
                self._mins.pop()
            self._mins.append(index)
            while self._maxs and events[self._maxs[-1]].number <= number:  # type: ignore[operator]
                self._maxs.pop()
            self._maxs.append(index)

    def _remove(self, event: KeyedEvent) -> None:
        self.count -= 1
        if event.value is None:
            return
        self.value_count -= 1
        if self._need_distinct:
            left = self.distinct[event.value] - 1
            if left:
                self.distinct[event.value] = left
            else:
                del self.distinct[event.value]
        if event.number is not None:
            self.total_count -= 1
            self.total = (
                None if self.total_count == 0 else exact_subtract(self.total, event.number)  # type: ignore[arg-type]
            )

    @property
    def minimum(self) -> Decimal | None:
        return self._events[self._mins[0]].number if self._mins else None

    @property
    def maximum(self) -> Decimal | None:
        return self._events[self._maxs[0]].number if self._maxs else None

    @property
    def distinct_count(self) -> int:
        return len(self.distinct)


def evaluate_key_history(
    events: Iterable[KeyedEvent], rules: Sequence[Rule], width_ms: int
) -> Iterator[Decision]:
    """Every decision that fires, over one key's complete history of one signature.

    ``rules`` must share the signature the events were keyed by. Events may come
    in any order; decisions come in (eventTime, input order) order. Events with
    equal eventTime see each other (the window's upper edge is inclusive).
    """
    ordered = sorted(events, key=lambda e: e.event_time)
    by_window: dict[int, list[Rule]] = {}
    for rule in rules:
        by_window.setdefault(rule.window_ms, []).append(rule)
    windows = [
        (
            _SlidingWindow(
                ordered,
                need_extremes=any(r.aggregator in (Aggregator.MIN, Aggregator.MAX) for r in group),
                need_distinct=any(r.aggregator is Aggregator.UNIQUE_COUNT for r in group),
            ),
            window_ms,
            group,
        )
        for window_ms, group in by_window.items()
    ]
    index = 0
    for event_time, tied_group in groupby(ordered, key=lambda e: e.event_time):
        tied = list(tied_group)
        index += len(tied)
        for window, window_ms, group in windows:
            lower = window_start(event_time, window_ms, width_ms)
            window.advance(lower, index)
            for rule in group:
                value = fired_value(window, rule)
                if value is not None:
                    for event in tied:
                        yield Decision(rule, event, value, lower)


def evaluate_with_buckets(
    buckets: Mapping[int, BucketAggregate],
    own_bucket_events: Iterable[KeyedEvent],
    targets: Iterable[KeyedEvent],
    rules: Sequence[Rule],
    width_ms: int,
) -> Iterator[Decision]:
    """Every decision that fires for ``targets``, from stored buckets: the stream's way.

    ``buckets`` are one key's stored buckets (any may be missing: an empty bucket is
    never stored); only those below a target's own bucket are read whole.
    ``own_bucket_events`` are the key's raw events of the targets' own buckets (the
    targets included): a target's own bucket counts only its events up to the
    target's time. Equals ``evaluate_key_history`` over the same events.
    """
    starts = sorted(buckets)
    own_events: dict[int, list[KeyedEvent]] = {}
    for event in sorted(own_bucket_events, key=lambda e: e.event_time):
        own_events.setdefault(bucket_start(event.event_time, width_ms), []).append(event)
    by_window: dict[int, list[Rule]] = {}
    for rule in rules:
        by_window.setdefault(rule.window_ms, []).append(rule)
    whole_cache: dict[tuple[int, int], BucketAggregate] = {}
    for target in sorted(targets, key=lambda e: e.event_time):
        own = bucket_start(target.event_time, width_ms)
        partial = merge_all(
            BucketAggregate.of_event(e.value, e.number)
            for e in own_events.get(own, ())
            if e.event_time <= target.event_time
        )
        for window_ms, group in by_window.items():
            lower = window_start(target.event_time, window_ms, width_ms)
            whole = whole_cache.get((window_ms, own))
            if whole is None:
                span = starts[bisect_left(starts, lower) : bisect_left(starts, own)]
                whole = whole_cache[(window_ms, own)] = merge_all(buckets[s] for s in span)
            window = whole.merge(partial)
            for rule in group:
                value = fired_value(window, rule)
                if value is not None:
                    yield Decision(rule, target, value, lower)
