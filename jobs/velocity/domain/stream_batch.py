"""One micro-batch of the stream, decided event by event from each key's hot state (pure).

The stream's admission (``admit``) and its state's shape (``KeyState``) are defined here;
the rest is the per-event reference engine that the columnar one
(``velocity.engine.key_partition``) is property-tested against. A micro-batch, in three
steps, all free of Spark and Redis:

1. ``admit``: an event far ahead of the newest accepted eventTime or the clock is
   quarantined; the first arrival of each transactionId wins, against the batch itself
   and the transactionIds accepted by earlier batches; the rest are duplicates. An accepted
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

import gc
import json
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from velocity.domain.arrival import Arrivals, Verdict
from velocity.domain.buckets import (
    EMPTY,
    BucketAggregate,
    aggregate_of_events,
    bucket_start,
    merge_all,
    window_start,
)
from velocity.domain.rules import Rule, RuleSignature, key_text, rules_by_signature
from velocity.domain.schema import FIELDS_BY_NAME, Event, Rejection
from velocity.domain.windows import Decision, KeyedEvent, RuleCheck, rule_check

SignatureKey = tuple[str, str]  # (signature_id, key text)
BucketSlot = tuple[str, str, int]  # (signature_id, key text, bucket start)


# Buckets per (signature, key) whose raw events stay in memory (the newest ones): an
# event that arrives after a later event of its own bucket (several Kafka partitions)
# is decided from them instead of from the Delta history.
RECENT_BUCKETS = 2


@dataclass
class KeyState:
    """One (signature, key)'s buckets by start, the newest eventTime counted in each, and
    the raw events of its newest buckets when every one of them passed through here."""

    buckets: dict[int, BucketAggregate] = field(default_factory=dict)
    last_times: dict[int, int | None] = field(default_factory=dict)
    recent: dict[int, tuple[KeyedEvent, ...]] = field(default_factory=dict)


def _recent_after(
    before: KeyState | None, added: Mapping[int, Sequence[KeyedEvent]]
) -> dict[int, tuple[KeyedEvent, ...]]:
    """``before``'s recent raw events plus a batch's ``added`` events by bucket start: a
    bucket new to the key holds exactly its added events; one known before grows; one
    whose earlier events are unknown (read from Redis) stays unknown. The newest
    ``RECENT_BUCKETS`` are kept."""
    recent = dict(before.recent) if before is not None else {}
    for start, events in added.items():
        if before is None or start not in before.buckets:
            recent[start] = tuple(events)
        elif start in recent:
            recent[start] = (*recent[start], *events)
    if len(recent) > RECENT_BUCKETS:
        recent = {s: recent[s] for s in sorted(recent)[-RECENT_BUCKETS:]}
    return recent


def recent_history(
    needed: Iterable[BucketSlot], states: Mapping[SignatureKey, KeyState]
) -> tuple[dict[BucketSlot, Sequence[KeyedEvent]], set[BucketSlot]]:
    """The own-bucket history of ``needed`` slots that memory holds, and the slots it
    does not (those come from the Delta history)."""
    known: dict[BucketSlot, Sequence[KeyedEvent]] = {}
    missing: set[BucketSlot] = set()
    for slot in needed:
        state = states.get((slot[0], slot[1]))
        events = None if state is None else state.recent.get(slot[2])
        if events is None:
            missing.add(slot)
        else:
            known[slot] = events
    return known, missing


@dataclass(frozen=True)
class Admitted:
    """A batch's accepted events split from its duplicates and far-future events, with
    the late ones marked."""

    accepted: list[Event]  # arrival order
    duplicates: list[int]  # indices into the batch's events
    late: set[str]  # transactionIds of accepted events older than the watermark
    watermark: int | None
    newest_event_time: int | None  # accepted, over the earlier batches and this one
    future: dict[int, Rejection] = field(default_factory=dict)  # quarantined, by index


def admit(
    events: Sequence[Event],
    seen_before: Iterable[str],
    newest_before: int | None,
    allowed_lateness_ms: int,
    max_future_ms: int,
    clock_ms: int | None = None,
) -> Admitted:
    """Admission in arrival order (``velocity.domain.arrival``); late = older than the watermark
    of the earlier batches."""
    arrivals = Arrivals(seen_before, newest_before, max_future_ms, clock_ms)
    accepted: list[Event] = []
    duplicates: list[int] = []
    future: dict[int, Rejection] = {}
    for index, event in enumerate(events):
        verdict = arrivals.admit(event.transaction_id, event.event_time)
        if verdict is Verdict.ACCEPTED:
            accepted.append(event)
        elif verdict is Verdict.DUPLICATE:
            duplicates.append(index)
        else:
            future[index] = arrivals.future_rejection(event.event_time)
    watermark = None if newest_before is None else newest_before - allowed_lateness_ms
    late = (
        set()
        if watermark is None
        else {e.transaction_id for e in accepted if e.event_time < watermark}
    )
    return Admitted(accepted, duplicates, late, watermark, arrivals.newest, future)


def key_groups(
    events: Iterable[Event], signatures: Iterable[RuleSignature]
) -> dict[SignatureKey, list[KeyedEvent]]:
    """Per (signature, key), the events that pass its filter and have its key, in order,
    as the signature sees them: its field's canonical value (and, numeric, the amount)."""
    groups: dict[SignatureKey, list[KeyedEvent]] = {}
    texts: dict[tuple[str | None, ...], str] = {}  # key_text is JSON: made once per key
    plans = [
        (
            s.signature_id,
            s.filter,
            s.grouping_keys,
            s.aggregate_field,
            s.aggregate_field is not None and FIELDS_BY_NAME[s.aggregate_field].numeric,
        )
        for s in signatures
    ]
    for event in events:
        values = event.values
        for signature_id, filters, names, field_name, numeric in plans:
            if filters and not all(values.get(n) in allowed for n, allowed in filters):
                continue
            key = tuple(values.get(n) for n in names)
            if None in key:
                continue  # a missing grouping field: not this signature's event
            text = texts.get(key)
            if text is None:
                text = texts[key] = key_text(key)  # type: ignore[arg-type]  # no None left
            value = None if field_name is None else values.get(field_name)
            # The only numeric field is the amount, parsed already (equal to its value).
            number = event.amount if numeric and value is not None else None
            keyed = KeyedEvent(event.event_time, event.transaction_id, value, number)
            slot = (signature_id, text)
            group = groups.get(slot)
            if group is None:
                groups[slot] = [keyed]
            else:
                group.append(keyed)
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


def _by_bucket(events: Iterable[KeyedEvent], width_ms: int) -> dict[int, list[KeyedEvent]]:
    """A key's batch events per bucket start, in batch order."""
    out: dict[int, list[KeyedEvent]] = {}
    for event in events:
        out.setdefault(event.event_time - event.event_time % width_ms, []).append(event)
    return out


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
    by_signature: dict[str, dict[int, list[tuple[Rule, RuleCheck]]]] = {}
    for signature, group in rules_by_signature(rules).items():
        by_window = by_signature[signature.signature_id] = {}
        for rule in group:
            by_window.setdefault(rule.window_ms, []).append((rule, rule_check(rule)))
    history = history or {}
    out = Decided({}, {}, [], {})
    deltas, changed, new_states = out.deltas, out.changed, out.buckets
    for slot, events in groups.items():
        windows = by_signature.get(slot[0])
        if not windows:
            continue
        before = states.get(slot)
        if len(events) == 1:
            # The common case, a key's only event in the batch, inline.
            only = events[0]
            time = only.event_time
            start = time - time % width_ms
            one = BucketAggregate.of_event(only.value, only.number)
            deltas[(slot[0], slot[1], start)] = one
            if before is None:
                after = KeyState({start: one}, {start: time}, {start: (only,)})
            else:
                recent = _recent_after(before, {start: events})
                after = KeyState(dict(before.buckets), dict(before.last_times), recent)
                _add_to_bucket(after, start, one, time)
            changed[slot] = [start]
            new_states[slot] = after
            if late and only.transaction_id in late:
                continue
            if (slot[0], slot[1], start) not in history:
                # Its own bucket counts whole: ``history_needed`` vouched that the earlier
                # events there are not later than it.
                decisions = _decide_only_event(after, only, windows, width_ms)
            else:
                decisions = _decide_key(
                    slot,
                    before or KeyState(),
                    after,
                    {start: events},
                    events,
                    windows,
                    width_ms,
                    history,
                )
        else:
            after = KeyState()
            if before is not None:
                after = KeyState(dict(before.buckets), dict(before.last_times))
            by_start = _by_bucket(events, width_ms)
            after.recent = _recent_after(before, by_start)
            for start, inside in by_start.items():
                aggregate = aggregate_of_events((e.value, e.number) for e in inside)
                deltas[(slot[0], slot[1], start)] = aggregate
                _add_to_bucket(after, start, aggregate, max(e.event_time for e in inside))
            changed[slot] = list(by_start)
            new_states[slot] = after
            targets = [e for e in events if e.transaction_id not in late] if late else events
            if not targets:
                continue
            decisions = _decide_key(
                slot, before or KeyState(), after, by_start, targets, windows, width_ms, history
            )
        key_values: tuple[str, ...] | None = None
        for decision in decisions:
            if key_values is None:
                key_values = tuple(str(v) for v in json.loads(slot[1]))
            out.decisions.append((decision, slot[0], key_values))
    return out


def _add_to_bucket(state: KeyState, start: int, aggregate: BucketAggregate, newest: int) -> None:
    """Merge events (their aggregate and newest eventTime) into ``state``'s bucket."""
    current = state.buckets.get(start)
    if current is None:
        state.buckets[start] = aggregate
        state.last_times[start] = newest
    else:
        state.buckets[start] = current.merge(aggregate)
        last = state.last_times.get(start)  # None: unknown, and stays so
        state.last_times[start] = None if last is None else max(last, newest)


def _decide_only_event(
    after: KeyState,
    event: KeyedEvent,
    windows: Mapping[int, Sequence[tuple[Rule, RuleCheck]]],
    width_ms: int,
) -> Iterable[Decision]:
    """Decisions of a key's only event in the batch: its own bucket in ``after`` holds
    exactly the events up to its time."""
    time = event.event_time
    own = time - time % width_ms
    buckets = after.buckets
    own_aggregate = buckets[own]
    earlier = [(s, a) for s, a in buckets.items() if s < own] if len(buckets) > 1 else []
    for window_ms, group in windows.items():
        lower = time - window_ms
        lower -= lower % width_ms  # window_start, inline: once per event and window
        window = own_aggregate
        for start, aggregate in earlier:
            if start >= lower:
                window = window.merge(aggregate)
        for rule, check in group:
            value = check(window)
            if value is not None:
                yield Decision(rule, event, value, lower)


def _decide_key(
    slot: SignatureKey,
    before: KeyState,
    after: KeyState,
    own_events: Mapping[int, Sequence[KeyedEvent]],
    targets: Sequence[KeyedEvent],
    windows: Mapping[int, Sequence[tuple[Rule, RuleCheck]]],
    width_ms: int,
    history: Mapping[BucketSlot, Sequence[KeyedEvent]],
) -> Iterable[Decision]:
    """Decisions of one key: windows from ``after``'s whole buckets below each target's own
    bucket, plus the own bucket's events up to the target's time (``own_events``: the
    batch's events of the key per bucket start)."""
    starts = sorted(after.buckets)
    # Per own bucket, events in eventTime order: the earlier batches' part counted whole
    # (``base``) unless the history gives it event by event, then this batch's events.
    whole_cache: dict[tuple[int, int], BucketAggregate] = {}
    running: dict[int, tuple[BucketAggregate, int, list[KeyedEvent]]] = {}
    ordered = targets if len(targets) == 1 else sorted(targets, key=lambda e: e.event_time)
    for target in ordered:
        own = target.event_time - target.event_time % width_ms
        if own not in running:
            earlier = history.get((slot[0], slot[1], own))
            if earlier is not None:
                base, pending = EMPTY, [*earlier, *own_events[own]]
            else:
                base, pending = before.buckets.get(own, EMPTY), list(own_events[own])
            pending.sort(key=lambda e: e.event_time)
            running[own] = (base, 0, pending)
        partial, index, pending = running[own]
        while index < len(pending) and pending[index].event_time <= target.event_time:
            event = pending[index]
            partial = partial.merge(BucketAggregate.of_event(event.value, event.number))
            index += 1
        running[own] = (partial, index, pending)
        for window_ms, group in windows.items():
            lower = window_start(target.event_time, window_ms, width_ms)
            whole = whole_cache.get((window_ms, own))
            if whole is None:
                span = starts[bisect_left(starts, lower) : bisect_left(starts, own)]
                whole = whole_cache[(window_ms, own)] = merge_all(after.buckets[s] for s in span)
            window = whole.merge(partial) if whole.count else partial
            for rule, check in group:
                value = check(window)
                if value is not None:
                    yield Decision(rule, target, value, lower)


def collect_batch_garbage() -> None:
    """Free a micro-batch's cyclic garbage, then freeze what it kept.

    The stream holds millions of long-lived objects (the hot buckets): once frozen, the
    cyclic collector never rescans them. The collection scans only what is not frozen
    yet, i.e. this batch's objects; it frees the cycles Spark's Python objects leave (py4j
    proxies of the batch's Java objects), which a freeze alone would keep for good, with
    what they hold in the JVM.
    """
    gc.collect()
    gc.freeze()
