"""Time buckets and the bucket aggregate that one rule signature keeps per key.

Invariants callers rely on:
- ``bucket_start(t, g)`` is ``t - (t mod g)`` with the mathematical (non-negative)
  modulus, so it floors negative times too.
- Every allowed bucket width divides one minute, so for a rule window ``W``
  (whole minutes) ``window_start(t) == bucket_start(t) - W``: a window always
  covers whole buckets below the event's own bucket.
- ``BucketAggregate.merge`` is associative and commutative with ``EMPTY`` as
  identity: merging buckets in any grouping or order gives the same result,
  which is what lets minute buckets roll up into hour buckets later.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any, NamedTuple

from velocity.domain.decimals import exact_add

ALLOWED_BUCKET_SECONDS: tuple[int, ...] = (1, 2, 5, 10, 15, 20, 30, 60)


def bucket_width_ms(bucket_seconds: int) -> int:
    """Bucket width in milliseconds; ValueError names the allowed widths."""
    if bucket_seconds not in ALLOWED_BUCKET_SECONDS:
        raise ValueError(
            f"bucket seconds {bucket_seconds!r} is not one of {list(ALLOWED_BUCKET_SECONDS)}"
        )
    return bucket_seconds * 1000


def bucket_start(event_time: int, width_ms: int) -> int:
    """Start of the bucket holding ``event_time`` (floor to the bucket width)."""
    return event_time - (event_time % width_ms)


def window_start(event_time: int, window_ms: int, width_ms: int) -> int:
    """Lower edge of an event's window: ``floor_g(t - W)`` (SPEC §3), inclusive."""
    return bucket_start(event_time - window_ms, width_ms)


def _min(a: Decimal | None, b: Decimal | None) -> Decimal | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if a <= b else b


def _max(a: Decimal | None, b: Decimal | None) -> Decimal | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if a >= b else b


def _add(a: Decimal | None, b: Decimal | None) -> Decimal | None:
    if a is None:
        return b
    if b is None:
        return a
    return exact_add(a, b)


class BucketAggregate(NamedTuple):
    """Everything SUM, COUNT, AVG, MIN, MAX and UNIQUE_COUNT need from a set of events.

    ``count`` counts events; ``value_count`` counts events whose aggregated field
    has a value; ``total``/``minimum``/``maximum`` cover numeric values only and
    are None when there are none; ``distinct`` holds canonical values. Immutable (a
    tuple, which the stream's hot path builds per event far faster than a dataclass).
    """

    count: int = 0  # type: ignore[assignment]  # shadows tuple.count: the field is meant
    value_count: int = 0
    total: Decimal | None = None
    minimum: Decimal | None = None
    maximum: Decimal | None = None
    distinct: frozenset[str] = frozenset()

    @classmethod
    def of_event(cls, value: str | None, number: Decimal | None = None) -> BucketAggregate:
        """The aggregate of one event whose field has canonical ``value`` (numeric ``number``)."""
        if value is None:
            return cls(1)
        return cls(1, 1, number, number, number, frozenset((value,)))

    @property
    def distinct_count(self) -> int:
        return len(self.distinct)

    def merge(self, other: BucketAggregate) -> BucketAggregate:
        return BucketAggregate(
            self.count + other.count,
            self.value_count + other.value_count,
            _add(self.total, other.total),
            _min(self.minimum, other.minimum),
            _max(self.maximum, other.maximum),
            self.distinct | other.distinct if other.distinct else self.distinct,
        )


EMPTY = BucketAggregate()


def bucket_from_columns(row: Mapping[str, Any]) -> BucketAggregate:
    """A stored bucket (a row of the buckets table, as a mapping) as the aggregate."""
    return BucketAggregate(
        row["event_count"],
        row["value_count"],
        row["value_sum"],
        row["value_min"],
        row["value_max"],
        frozenset(row["distinct_values"] or ()),
    )


def aggregate_of_events(events: Iterable[tuple[str | None, Decimal | None]]) -> BucketAggregate:
    """``merge_all`` of ``BucketAggregate.of_event(value, number)`` for each event, in one
    pass with one set of distinct values (merging event by event copies that set each time:
    quadratic in a window of hundreds of thousands of events)."""
    count = value_count = 0
    total: Decimal | None = None
    minimum: Decimal | None = None
    maximum: Decimal | None = None
    distinct: set[str] = set()
    for value, number in events:
        count += 1
        if value is None:
            continue
        value_count += 1
        distinct.add(value)
        total, minimum, maximum = _add(total, number), _min(minimum, number), _max(maximum, number)
    return BucketAggregate(count, value_count, total, minimum, maximum, frozenset(distinct))


def merge_all(aggregates: Iterable[BucketAggregate]) -> BucketAggregate:
    result = EMPTY
    for aggregate in aggregates:
        result = result.merge(aggregate)
    return result
