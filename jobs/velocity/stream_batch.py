"""One micro-batch of the stream, decided in memory from each key's hot buckets (pure).

The stream keeps every (signature, key)'s g-wide buckets hot (``KeyState``) and decides a
micro-batch in three steps, all here and free of Spark and Redis:

1. ``admit``: the first arrival of each transactionId wins, against the batch itself and
   the transactionIds accepted by earlier batches; the rest are duplicates. An accepted
   event older than the watermark (newest eventTime of the earlier batches minus the
   allowed lateness) is late: it goes into the buckets but is not decided (SPEC §3).
2. ``key_groups``: the accepted events fanned out per active signature to their key.
3. ``decide``: every key's buckets plus its batch events, then every non-late event's
   window: the whole buckets below its own bucket, plus its own bucket's events up to its
   time (the exact upper edge of SPEC §3).

Invariants callers rely on:
- A bucket's ``last_time`` is the highest eventTime counted in it, or None when unknown
  (a bucket read from Delta). The own bucket of a batch's event counts whole only when
  its ``last_time`` is at or before the event; otherwise the caller supplies that
  bucket's raw events from the history (``history_needed`` names those buckets), so the
  upper edge stays exact for out-of-order input too.
- ``decide`` never mutates the states it is given; it returns the new absolute value of
  every bucket it changed, so a batch that fails to commit leaves the hot state as it was,
  and a replayed batch writes the same values again.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from velocity.buckets import BucketAggregate, bucket_start, merge_all, window_start
from velocity.rules import Rule, RuleSignature, key_text, rules_by_signature
from velocity.schema import FIELDS_BY_NAME, Event
from velocity.windows import Decision, KeyedEvent, aggregate_value, fires

SignatureKey = tuple[str, str]  # (signature_id, key text)
BucketSlot = tuple[str, str, int]  # (signature_id, key text, bucket start)


@dataclass
class KeyState:
    """One (signature, key)'s buckets by start, and the newest eventTime counted in each."""

    buckets: dict[int, BucketAggregate] = field(default_factory=dict)
    last_times: dict[int, int | None] = field(default_factory=dict)

    def newest_bucket(self) -> int | None:
        return max(self.buckets, default=None)

    def without_before(self, cutoff: int) -> KeyState:
        """The buckets that start at ``cutoff`` or later (the horizon)."""
        return KeyState(
            {s: a for s, a in self.buckets.items() if s >= cutoff},
            {s: t for s, t in self.last_times.items() if s >= cutoff},
        )


@dataclass(frozen=True)
class Admitted:
    """A batch's accepted events split from its duplicates, with the late ones marked."""

    accepted: list[Event]  # arrival order
    duplicates: list[int]  # indices into the batch's events
    late: set[str]  # transactionIds of accepted events older than the watermark
    watermark: int | None
    newest_event_time: int | None  # over the earlier batches and this one


def admit(
    events: Sequence[Event],
    seen_before: Iterable[str],
    newest_before: int | None,
    allowed_lateness_ms: int,
) -> Admitted:
    """First arrival of each transactionId wins; late = older than the watermark."""
    seen = set(seen_before)
    accepted: list[Event] = []
    duplicates: list[int] = []
    for index, event in enumerate(events):
        if event.transaction_id in seen:
            duplicates.append(index)
            continue
        seen.add(event.transaction_id)
        accepted.append(event)
    watermark = None if newest_before is None else newest_before - allowed_lateness_ms
    late = (
        set()
        if watermark is None
        else {e.transaction_id for e in accepted if e.event_time < watermark}
    )
    newest = max((e.event_time for e in accepted), default=None)
    if newest_before is not None:
        newest = newest_before if newest is None else max(newest, newest_before)
    return Admitted(accepted, duplicates, late, watermark, newest)


def keyed_event(event: Event, signature: RuleSignature) -> KeyedEvent:
    """The event as ``signature`` sees it: its field's canonical value (and Decimal)."""
    name = signature.aggregate_field
    value = None if name is None else event.value(name)
    number = None
    if name is not None and value is not None and FIELDS_BY_NAME[name].numeric:
        number = Decimal(value)
    return KeyedEvent(event.event_time, event.transaction_id, value, number)


def key_groups(
    events: Iterable[Event], signatures: Iterable[RuleSignature]
) -> dict[SignatureKey, list[KeyedEvent]]:
    """Per (signature, key), the events that pass its filter and have its key, in order."""
    groups: dict[SignatureKey, list[KeyedEvent]] = {}
    signatures = list(signatures)
    for event in events:
        for signature in signatures:
            if not signature.passes_filter(event.values):
                continue
            key = signature.key_of(event.values)
            if key is None:
                continue
            slot = (signature.signature_id, key_text(key))
            groups.setdefault(slot, []).append(keyed_event(event, signature))
    return groups


def history_needed(
    groups: Mapping[SignatureKey, Sequence[KeyedEvent]],
    states: Mapping[SignatureKey, KeyState],
    late: set[str],
    width_ms: int,
) -> set[BucketSlot]:
    """Own buckets whose earlier events are not all at or before a decided event in them:
    their raw events of earlier batches must come from the history."""
    needed: set[BucketSlot] = set()
    for (signature_id, key), events in groups.items():
        state = states.get((signature_id, key))
        if state is None or not state.buckets:
            continue
        for event in events:
            if event.transaction_id in late:
                continue
            own = bucket_start(event.event_time, width_ms)
            if own not in state.buckets:
                continue
            last = state.last_times.get(own)
            if last is None or last > event.event_time:
                needed.add((signature_id, key, own))
    return needed


@dataclass
class Decided:
    """What a batch changes: new absolute buckets per (signature, key), and its decisions."""

    buckets: dict[SignatureKey, KeyState]  # the changed keys' whole new state
    changed: dict[SignatureKey, list[int]]  # bucket starts this batch changed, per key
    decisions: list[tuple[Decision, str, tuple[str, ...]]]  # (decision, signature_id, key)
    deltas: dict[BucketSlot, BucketAggregate]  # this batch's events alone, per bucket


def _add_events(state: KeyState, events: Iterable[KeyedEvent], width_ms: int) -> list[int]:
    """Count ``events`` into ``state`` (in place); returns the bucket starts they changed."""
    changed: dict[int, None] = {}
    for event in events:
        start = bucket_start(event.event_time, width_ms)
        one = BucketAggregate.of_event(event.value, event.number)
        current = state.buckets.get(start)
        if current is None:
            state.buckets[start] = one
            state.last_times[start] = event.event_time
        else:
            state.buckets[start] = current.merge(one)
            last = state.last_times.get(start)  # None: unknown, and stays so
            state.last_times[start] = None if last is None else max(last, event.event_time)
        changed[start] = None
    return list(changed)


def decide(
    groups: Mapping[SignatureKey, Sequence[KeyedEvent]],
    states: Mapping[SignatureKey, KeyState],
    rules: Sequence[Rule],
    late: set[str],
    width_ms: int,
    history: Mapping[BucketSlot, Sequence[KeyedEvent]] | None = None,
) -> Decided:
    """Add every group's events to its buckets and decide its non-late events.

    ``history`` holds, for each slot ``history_needed`` named, the raw events of earlier
    batches in that bucket (any order). Decisions come per key in eventTime order.
    """
    by_signature = {s.signature_id: group for s, group in rules_by_signature(rules).items()}
    history = history or {}
    out = Decided({}, {}, [], {})
    for (signature_id, key), events in groups.items():
        signature_rules = by_signature.get(signature_id)
        if not signature_rules:
            continue
        before = states.get((signature_id, key)) or KeyState()
        after = KeyState(dict(before.buckets), dict(before.last_times))
        out.changed[(signature_id, key)] = _add_events(after, events, width_ms)
        out.buckets[(signature_id, key)] = after
        alone = KeyState()
        _add_events(alone, events, width_ms)
        for start, aggregate in alone.buckets.items():
            out.deltas[(signature_id, key, start)] = aggregate
        targets = [e for e in events if e.transaction_id not in late]
        if not targets:
            continue
        key_values = tuple(_key_values(key))
        for decision in _decide_key(
            signature_id, key, before, after, events, targets, signature_rules, width_ms, history
        ):
            out.decisions.append((decision, signature_id, key_values))
    return out


def _key_values(key: str) -> list[str]:
    return [str(v) for v in json.loads(key)]


def _decide_key(
    signature_id: str,
    key: str,
    before: KeyState,
    after: KeyState,
    batch_events: Sequence[KeyedEvent],
    targets: Sequence[KeyedEvent],
    rules: Sequence[Rule],
    width_ms: int,
    history: Mapping[BucketSlot, Sequence[KeyedEvent]],
) -> Iterable[Decision]:
    """Decisions of one key: windows from ``after``'s whole buckets below each target's own
    bucket, plus the own bucket's events up to the target's time."""
    starts = sorted(after.buckets)
    by_window: dict[int, list[Rule]] = {}
    for rule in rules:
        by_window.setdefault(rule.window_ms, []).append(rule)
    # Per own bucket: the earlier batches' part counted whole (``base``) or event by event
    # (``earlier``), and this batch's events, each in eventTime order.
    own_events: dict[int, list[KeyedEvent]] = {}
    for event in batch_events:
        own_events.setdefault(bucket_start(event.event_time, width_ms), []).append(event)
    whole_cache: dict[tuple[int, int], BucketAggregate] = {}
    running: dict[int, tuple[BucketAggregate, int, list[KeyedEvent]]] = {}
    for target in sorted(targets, key=lambda e: e.event_time):
        own = bucket_start(target.event_time, width_ms)
        if own not in running:
            slot = (signature_id, key, own)
            if slot in history:
                base, pending = BucketAggregate(), [*history[slot], *own_events[own]]
            else:
                base, pending = before.buckets.get(own, BucketAggregate()), list(own_events[own])
            pending.sort(key=lambda e: e.event_time)
            running[own] = (base, 0, pending)
        partial, index, pending = running[own]
        while index < len(pending) and pending[index].event_time <= target.event_time:
            event = pending[index]
            partial = partial.merge(BucketAggregate.of_event(event.value, event.number))
            index += 1
        running[own] = (partial, index, pending)
        for window_ms, group in by_window.items():
            lower = window_start(target.event_time, window_ms, width_ms)
            whole = whole_cache.get((window_ms, own))
            if whole is None:
                span = starts[bisect_left(starts, lower) : bisect_left(starts, own)]
                whole = whole_cache[(window_ms, own)] = merge_all(after.buckets[s] for s in span)
            window = whole.merge(partial)
            for rule in group:
                value = aggregate_value(window, rule.aggregator)
                if fires(rule, value):
                    yield Decision(rule, target, value, lower)  # type: ignore[arg-type]


class HotBuckets:
    """The stream's in-memory copy of the (signature, key) states it has read or written.

    A copy, never the only one: a key it does not hold is read from Redis, and it may drop
    any key at any time (``max_keys`` keeps the most recently used ones).
    """

    def __init__(self, max_keys: int) -> None:
        self.max_keys = max_keys
        self._states: dict[SignatureKey, KeyState] = {}

    def __len__(self) -> int:
        return len(self._states)

    def missing(self, slots: Iterable[SignatureKey]) -> list[SignatureKey]:
        return [s for s in slots if s not in self._states]

    def states(self, slots: Iterable[SignatureKey]) -> dict[SignatureKey, KeyState]:
        return {s: self._states[s] for s in slots if s in self._states}

    def put(self, slot: SignatureKey, state: KeyState) -> None:
        self._states.pop(slot, None)  # re-inserted last: the most recently used
        self._states[slot] = state

    def apply(
        self, changed: Mapping[SignatureKey, KeyState], cutoff: int | None
    ) -> list[BucketSlot]:
        """Take a committed batch's new states, dropping their buckets below ``cutoff``;
        returns the dropped (signature, key, start) slots."""
        dropped: list[BucketSlot] = []
        for slot, state in changed.items():
            if cutoff is not None:
                old = [s for s in state.buckets if s < cutoff]
                dropped.extend((slot[0], slot[1], s) for s in old)
                if old:
                    state = state.without_before(cutoff)
            self.put(slot, state)
        if len(self._states) > self.max_keys:
            for slot in list(self._states)[: len(self._states) - self.max_keys // 2]:
                del self._states[slot]
        return dropped

    def forget(self, signature_ids: Iterable[str] | None = None) -> None:
        """Drop every key (None) or the keys of the given signatures."""
        if signature_ids is None:
            self._states.clear()
            return
        gone = set(signature_ids)
        for slot in [s for s in self._states if s[0] in gone]:
            del self._states[slot]

    def sweep(self, cutoff: int) -> int:
        """Drop keys with no bucket at or after ``cutoff`` (their Redis hashes expire too)."""
        idle = [s for s, st in self._states.items() if (st.newest_bucket() or cutoff - 1) < cutoff]
        for slot in idle:
            del self._states[slot]
        return len(idle)
