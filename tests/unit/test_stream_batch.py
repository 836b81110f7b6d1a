"""The stream's in-memory batch engine against the naive reference (SPEC §3 streaming).

Events arrive in micro-batches; each decided event's window holds the events that
arrived up to and including its batch. For any arrival order the engine must equal a
naive recount of that; for per-key increasing eventTimes it must equal the complete-data
reference. Duplicates lose to the first arrival; late events count but are not decided.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import (
    BASE_TIME,
    MINUTE_MS,
    bucket_seconds,
    event,
    events,
    make_rule,
    rule_sets,
)
from tests.reference import aggregate, fires, key_of, passes_filter, reference_alerts
from velocity.domain.rules import Rule, RuleState, rules_by_signature
from velocity.domain.schema import Event
from velocity.domain.stream_batch import (
    BucketSlot,
    KeyState,
    SignatureKey,
    admit,
    decide,
    history_needed,
    key_groups,
    recent_history,
)
from velocity.domain.windows import KeyedEvent

pytestmark = pytest.mark.timeout(120)


NO_FUTURE_LIMIT = 10**15


def run_batches(
    batches: Sequence[Sequence[Event]],
    rules: Sequence[Rule],
    width_ms: int,
    lateness_ms: int,
    max_future_ms: int = NO_FUTURE_LIMIT,
) -> tuple[dict[tuple[int, str], object], list[set[str]]]:
    """Decide ``batches`` in order; returns {(ruleId, tx): value} and each batch's late set."""
    active = [r for r in rules if r.state is RuleState.ACTIVE]
    signatures = list(rules_by_signature(active))
    states: dict[SignatureKey, KeyState] = {}
    raw: dict[BucketSlot, list[KeyedEvent]] = {}
    seen: set[str] = set()
    newest: int | None = None
    fired: dict[tuple[int, str], object] = {}
    lates = []
    for batch in batches:
        admitted = admit(batch, seen, newest, lateness_ms, max_future_ms)
        groups = key_groups(admitted.accepted, signatures)
        needed = history_needed(groups, states, admitted.late, width_ms)
        # Memory's own-bucket history where it holds one (it must be the whole history),
        # the full record for the rest, as the stream reads it from Delta.
        known, missing = recent_history(needed, states)
        for slot, earlier in known.items():
            assert sorted(earlier, key=repr) == sorted(raw.get(slot, []), key=repr), slot
        history = {**known, **{slot: raw.get(slot, []) for slot in missing}}
        decided = decide(groups, states, active, admitted.late, width_ms, history)
        for decision, _signature, _key in decided.decisions:
            pair = (decision.rule.rule_id, decision.event.transaction_id)
            assert pair not in fired
            fired[pair] = decision.value
        states.update(decided.buckets)
        for (signature_id, key), events_of_key in groups.items():
            for e in events_of_key:
                raw.setdefault((signature_id, key, e.event_time - e.event_time % width_ms), [])
                raw[(signature_id, key, e.event_time - e.event_time % width_ms)].append(e)
        seen.update(e.transaction_id for e in admitted.accepted)
        newest = admitted.newest_event_time
        lates.append(admitted.late)
    return fired, lates


def arrived_reference(
    batches: Sequence[Sequence[Event]],
    rules: Sequence[Rule],
    width_ms: int,
    lates: Sequence[set[str]],
    max_future_ms: int = NO_FUTURE_LIMIT,
) -> dict[tuple[int, str], object]:
    """Each non-late first arrival's window over the first arrivals up to its batch; an
    event more than ``max_future_ms`` past every earlier first arrival never arrived."""
    arrived: list[Event] = []
    seen: set[str] = set()
    fired: dict[tuple[int, str], object] = {}
    for batch, late in zip(batches, lates, strict=True):
        fresh = []
        for e in batch:
            newest = max((x.event_time for x in [*arrived, *fresh]), default=None)
            if newest is not None and e.event_time > newest + max_future_ms:
                continue
            if e.transaction_id not in seen:
                seen.add(e.transaction_id)
                fresh.append(e)
        arrived.extend(fresh)
        for rule in rules:
            if rule.state is not RuleState.ACTIVE:
                continue
            for e in fresh:
                key = key_of(rule, e)
                if e.transaction_id in late or key is None or not passes_filter(rule, e):
                    continue
                t = e.event_time
                lower = t - rule.window_ms - (t - rule.window_ms) % width_ms
                window = [
                    x
                    for x in arrived
                    if key_of(rule, x) == key
                    and passes_filter(rule, x)
                    and lower <= x.event_time <= t
                ]
                value = aggregate(rule, window)
                if fires(rule, value):
                    fired[(rule.rule_id, e.transaction_id)] = value
    return fired


@st.composite
def batched(draw: st.DrawFn, items: list[Event]) -> list[list[Event]]:
    cuts = sorted(draw(st.lists(st.integers(0, len(items)), max_size=4)))
    bounds = [0, *cuts, len(items)]
    return [items[a:b] for a, b in pairwise(bounds)]


@st.composite
def arrival_batches(draw: st.DrawFn, items: list[Event]) -> list[list[Event]]:
    """``items`` in any order, some arriving twice (the first arrival wins), cut into
    micro-batches."""
    order = draw(st.permutations(items))
    again = draw(st.lists(st.sampled_from(order), max_size=3)) if order else []
    return draw(batched([*order, *again]))


@settings(max_examples=150, deadline=None)
@given(data=st.data(), evs=events(max_size=30), rules=rule_sets(), seconds=bucket_seconds)
def test_any_arrival_order_equals_a_recount_of_what_arrived(data, evs, rules, seconds) -> None:
    width = seconds * 1000
    batches = data.draw(arrival_batches(evs))
    lateness = data.draw(st.sampled_from((0, 30_000, 10 * MINUTE_MS)))
    # A limit inside the events' spread quarantines some as too far in the future.
    limit = data.draw(st.sampled_from((NO_FUTURE_LIMIT, 2 * MINUTE_MS, 30_000)))
    fired, lates = run_batches(batches, rules, width, lateness, limit)
    assert fired == arrived_reference(batches, rules, width, lates, limit)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), evs=events(max_size=30), rules=rule_sets(), seconds=bucket_seconds)
def test_in_order_arrival_equals_the_complete_data_result(data, evs, rules, seconds) -> None:
    ordered = sorted(evs, key=lambda e: e.event_time)
    # Cut only between different times: an earlier batch cannot see a tie that comes later.
    edges = [i for i in range(1, len(ordered)) if ordered[i - 1].event_time < ordered[i].event_time]
    cuts = sorted(data.draw(st.lists(st.sampled_from(edges), max_size=4))) if edges else []
    batches = [ordered[a:b] for a, b in pairwise([0, *cuts, len(ordered)])]
    fired, lates = run_batches(batches, rules, seconds * 1000, 0)
    assert not set().union(*lates), "in-order input has no late events"
    expected = reference_alerts(ordered, rules, seconds)
    assert fired == expected.values


def test_duplicates_lose_and_late_events_count_without_a_decision() -> None:
    from tests.builders import make_rule

    rule = make_rule(
        groupingKeyNames=["payerId"], aggregatorFunctionType="COUNT", limit=0, windowMinutes=60
    ).with_version(1)
    first = event(transactionId="a", eventTime=BASE_TIME + 10 * MINUTE_MS)
    copy = event(transactionId="a", eventTime=BASE_TIME + 11 * MINUTE_MS)
    late = event(transactionId="b", eventTime=BASE_TIME)
    after = event(transactionId="c", eventTime=BASE_TIME + 12 * MINUTE_MS)
    fired, lates = run_batches([[first, copy], [late, after]], [rule], 60_000, MINUTE_MS)
    assert lates == [set(), {"b"}]
    # c's window counts a and the late b, not the duplicate of a.
    assert fired == {(1, "a"): 1, (1, "c"): 3}


def test_an_out_of_order_event_reads_its_own_bucket_from_memory() -> None:
    """A batch's event earlier than a decided one of its own bucket needs the bucket's
    raw events: memory holds them for a bucket that began here, not for one read from
    Redis (then they come from Delta)."""
    count = make_rule(
        groupingKeyNames=["payerId"], aggregatorFunctionType="COUNT", limit=0, windowMinutes=5
    ).with_version(1)
    signatures = list(rules_by_signature([count]))
    at = BASE_TIME - BASE_TIME % MINUTE_MS
    first = [
        event(transactionId="a", eventTime=at + 10_000, payerId="p"),
        event(transactionId="b", eventTime=at + 50_000, payerId="p"),
    ]
    decided = decide(key_groups(first, signatures), {}, [count], set(), MINUTE_MS)
    later = key_groups([event(transactionId="c", eventTime=at + 30_000, payerId="p")], signatures)
    needed = history_needed(later, decided.buckets, set(), MINUTE_MS)
    assert len(needed) == 1
    known, missing = recent_history(needed, decided.buckets)
    assert not missing
    assert [e.transaction_id for e in next(iter(known.values()))] == ["a", "b"]
    from_redis = {slot: KeyState(st.buckets, st.last_times) for slot, st in decided.buckets.items()}
    assert recent_history(needed, from_redis) == ({}, needed)
