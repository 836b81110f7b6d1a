"""A stream key-partition decided over its keys' hot state (``engine.key_partition``)
equals the stream's reference batch engine (``stream_batch.decide``) over the whole
record, batch after batch, with the hot state carried only as the partition's own output
says (buckets, newest eventTimes, recent raw events), and the Delta history asked for
exactly the own buckets whose raw events that state lacks."""

from __future__ import annotations

from unittest.mock import patch

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import MINUTE_MS, bucket_seconds, events, rule_sets
from tests.unit.test_kernel import keyed_row
from tests.unit.test_micro_batch import keyed_table
from tests.unit.test_stream_batch import arrival_batches
from velocity.domain.buckets import bucket_from_columns
from velocity.domain.rules import RuleState, rules_by_signature
from velocity.domain.stream_batch import (
    RECENT_BUCKETS,
    KeyState,
    admit,
    decide,
    history_needed,
    key_groups,
)
from velocity.domain.windows import KeyedEvent, format_aggregate
from velocity.engine.key_partition import (
    _raw_changes,
    decide_key_partition,
    missing_history,
    needed_own_buckets,
    stored_buckets,
)
from velocity.redis import mirror
from velocity.redis.hot_state import RAW_TEXTS, STORED_FIELDS, HotState
from velocity.redis.keys import (
    HASH_MARK,
    RedisKeys,
    bucket_value,
    parse_bucket,
    parse_recent,
    recent_fragment,
)
from velocity.spark.stream_decide import bucket_changes

pytestmark = pytest.mark.timeout(120)


KEYS = RedisKeys("P", "/data")


def applied(redis: dict, strings: dict, changes) -> None:
    """``changes`` applied to a model of Redis as velocity.lua's apply_bucket_changes
    applies each key's run: ``redis`` maps a key's state name to (dense, its fields),
    ``strings`` a raw-events string's name to its text."""
    for change in changes.key_changes():
        base, name = change.base, f"{change.base}:buckets"
        if change.whole is not None:
            was_dense = redis.get(name, (False, {}))[0]
            assert change.dense or (change.expire == "2") == was_dense  # its hash goes
            fields = dict(change.whole)
            assert len(fields) == len(change.whole)  # no field twice
            redis[name] = (change.dense, fields)
        else:
            dense, fields = redis[name]  # a dense key's changes: only to a dense key
            assert dense
            for start, value in change.sets:
                fields[str(start)] = value
            for start, fragment in change.started:
                fields[f"~{start}"] = fragment
            fields.update(change.notified)
            for start in change.drops:
                fields.pop(str(start), None)
        for start in change.removed:
            strings.pop(f"{base}:raw:{start}", None)
            if change.whole is None:
                fields.pop(f"~{start}", None)
        for start, fragment in change.appended:
            raw_name = f"{base}:raw:{start}"
            if change.whole is None and f"~{start}" in fields:  # moves to its own string
                strings[raw_name] = fields.pop(f"~{start}") + fragment
            else:
                assert f"~{start}" not in fields  # a whole key's run moved them
                strings[raw_name] = strings.get(raw_name, "") + fragment
        if not fields:
            del redis[name]


def stored_fields(redis: dict, slots) -> pa.Table:
    """What velocity.lua's read_keys gives of ``slots``' states (``STORED_FIELDS``)."""
    rows = []
    for sig, key in slots:
        dense, fields = redis.get(KEYS.bucket_hash(sig, key), (False, {}))
        pairs = [(HASH_MARK, "")] if dense else []
        for field, value in [*pairs, *fields.items()]:
            rows.append({"signature_id": sig, "key": key, "field": field, "value": value})
    return pa.Table.from_pylist(rows, STORED_FIELDS)


def assert_stored(
    redis: dict, strings: dict, after: dict, raw: dict, layouts: tuple[int, int, set]
) -> None:
    """The model holds each key's buckets with their newest eventTimes as ``after`` says
    and the raw events ``raw`` (in a key's field for a bucket new to it, else in its own
    string). With ``layouts`` (DENSE_MIN_BUCKETS, DENSE_KEEP_BUCKETS, the names of the
    dense keys before): packed below the first, dense from it on, and a dense key stays
    dense down to the second."""
    dense_at, dense_until, dense_before = layouts
    bases = {KEYS.bucket_hash(*slot): slot for slot in after}
    held = {}
    for name, (dense, fields) in redis.items():
        slot = bases[name]
        buckets = {int(f): parse_bucket(v) for f, v in fields.items() if f.isdigit()}
        state = after[slot]
        assert buckets == {s: (a, state.last_times[s]) for s, a in state.buckets.items()}
        if name in dense_before:
            assert dense == (len(buckets) >= dense_until)
        else:
            assert dense == (len(buckets) >= dense_at)
        for field, text in fields.items():
            if field.startswith("~"):
                held[f"{name.removesuffix(':buckets')}:raw:{field[1:]}"] = text
    assert not held.keys() & strings.keys()
    assert {n: parse_recent(t) for n, t in {**strings, **held}.items()} == {
        KEYS.recent_events(*slot): tuple(evs) for slot, evs in raw.items() if evs
    }


def rebuilt(hot: dict, dense_at: int) -> dict:
    """The model after a rebuild from Delta (velocity_put_buckets): buckets without newest
    eventTimes, dense from ``dense_at`` buckets on."""
    return {
        KEYS.bucket_hash(*slot): (
            len(state.buckets) >= dense_at,
            {str(s): bucket_value(a, None) for s, a in state.buckets.items()},
        )
        for slot, state in hot.items()
        if state.buckets
    }


def carried(states: dict, raw: dict, decided, forget_raw: bool) -> tuple[dict, dict]:
    """The hot state after a partition's batch, as its commit leaves it in Redis: the
    buckets (with newest eventTimes) and the raw-events strings, started over, appended
    to and removed (with ``forget_raw``, as a rebuild from Delta leaves it: no newest
    eventTimes, no raw events)."""
    out = dict(states)
    for row in decided.buckets.to_pylist():
        slot = (row["signature_id"], row["key"])
        before = out.get(slot, KeyState())
        out[slot] = KeyState(
            {**before.buckets, row["bucket_start"]: bucket_from_columns(row)},
            {**before.last_times, row["bucket_start"]: row["last_time"]},
        )
    raw = {slot: list(evs) for slot, evs in raw.items()}
    for row in decided.raw_removed.to_pylist():
        raw.pop((row["signature_id"], row["key"], row["bucket_start"]), None)
    started = set()
    for row in decided.raw_appended.to_pylist():
        slot = (row["signature_id"], row["key"], row["bucket_start"])
        if row["starts"] and slot not in started:  # a SET of the whole fragment
            raw[slot] = []
            started.add(slot)
        event = KeyedEvent(row["eventTime"], row["transactionId"], row["value"], row["number"])
        raw.setdefault(slot, []).append(event)
    if forget_raw:
        out = {s: KeyState(st_.buckets, dict.fromkeys(st_.buckets)) for s, st_ in out.items()}
        raw = {}
    return out, raw


@settings(max_examples=150, deadline=None)
@given(data=st.data(), evs=events(max_size=30), rules=rule_sets(), seconds=bucket_seconds)
def test_key_partition_equals_the_reference_over_its_own_hot_state(
    data, evs, rules, seconds
) -> None:
    width = seconds * 1000
    batches = data.draw(arrival_batches(evs))
    lateness = data.draw(st.sampled_from((0, 30_000, 10 * MINUTE_MS)))
    forget_raw = data.draw(st.booleans())
    # Layouts change within a few buckets here: packed, dense (a hash), packed again.
    dense_at = data.draw(st.sampled_from((2, 3, 128)))
    dense_until = data.draw(st.integers(1, dense_at))
    active = [r for r in rules if r.state is RuleState.ACTIVE]
    signatures = list(rules_by_signature(active))
    reference: dict = {}
    hot: dict = {}
    stored_raw: dict = {}  # the raw events Redis holds, by bucket
    model: dict = {}  # the keys' states as the commits' runs leave them
    strings: dict = {}  # and the raw-events strings
    raw: dict = {}
    seen: set[str] = set()
    newest = None
    for batch in batches:
        admitted = admit(batch, seen, newest, lateness, 10**15)
        groups = key_groups(admitted.accepted, signatures)
        needed = history_needed(groups, reference, admitted.late, width)
        expected = decide(
            groups, reference, active, admitted.late, width, {s: raw.get(s, []) for s in needed}
        )

        rows = [
            keyed_row(slot, e, decide=e.transaction_id not in admitted.late)
            for slot, group in groups.items()
            for e in group
        ]
        table = keyed_table(rows, True)
        states = {
            slot: KeyState(hot[slot].buckets, hot[slot].last_times)
            for slot in groups
            if slot in hot
        }
        stored = stored_buckets(states)
        needed = needed_own_buckets(table, stored, width)  # read from Redis, then trusted
        texts = {s: recent_fragment(stored_raw[s]) for s in needed if stored_raw.get(s)}
        recent = HotState(stored, RAW_TEXTS.empty_table()).recent_events(needed, texts)
        missing = missing_history(table, stored, recent, width)
        if not forget_raw:
            # Raw events are missing only for an own bucket older than the key's newest two.
            for sig, key, start in missing:
                assert start not in sorted(states[(sig, key)].buckets)[-2:]
        history = keyed_table([keyed_row(s[:2], e) for s in missing for e in raw.get(s, [])], False)
        got = decide_key_partition(table, stored, recent, history, active, width, None)
        assert {
            (active[int(r)].rule_id, rows[int(i)]["transactionId"]): (str(v), int(s))
            for i, r, v, s in zip(
                got.decisions.rows,
                got.decisions.rules,
                got.decisions.texts().to_pylist(),
                got.decisions.window_starts,
                strict=True,
            )
        } == {
            (d.rule.rule_id, d.event.transaction_id): (format_aggregate(d.value), d.window_start)
            for d, _, _ in expected.decisions
        }

        # Out of order (SPEC §3): an event to decide whose signature key had an event of
        # an earlier batch at its eventTime or later, whatever the hot state remembers.
        newest_before: dict = {}
        for (signature_id, key, _), earlier in raw.items():
            top = max(e.event_time for e in earlier)
            newest_before[(signature_id, key)] = max(
                newest_before.get((signature_id, key), top), top
            )
        assert set(got.out_of_order.column("transactionId").to_pylist()) == {
            e.transaction_id
            for slot, group in groups.items()
            for e in group
            if e.transaction_id not in admitted.late and newest_before.get(slot, -1) >= e.event_time
        }

        reference.update(expected.buckets)
        with (
            patch.object(mirror, "DENSE_MIN_BUCKETS", dense_at),
            patch.object(mirror, "DENSE_KEEP_BUCKETS", dense_until),
        ):
            changes = bucket_changes(KEYS, got, None, stored_fields(model, groups))
        dense_before = {name for name, (dense, _) in model.items() if dense}
        applied(model, strings, changes)
        hot, stored_raw = carried(hot, stored_raw, got, False)
        assert_stored(model, strings, hot, stored_raw, (dense_at, dense_until, dense_before))
        if forget_raw:
            hot, stored_raw = carried(hot, stored_raw, got, True)
            model, strings = rebuilt(hot, dense_at), {}
        for (signature_id, key), group in groups.items():
            for e in group:
                start = e.event_time - e.event_time % width
                raw.setdefault((signature_id, key, start), []).append(e)
        seen.update(e.transaction_id for e in admitted.accepted)
        newest = admitted.newest_event_time


def test_stale_raw_events_are_not_trusted() -> None:
    from velocity.domain.buckets import BucketAggregate

    one = KeyedEvent(60_001, "tx-1")
    buckets = {60_000: BucketAggregate(2), 120_000: BucketAggregate(1)}
    recent = {60_000: (one,), 120_000: (KeyedEvent(120_001, "tx-2"),), 180_000: (one,)}
    hot = HotState(stored_buckets({("sig", "k"): KeyState(buckets)}), RAW_TEXTS.empty_table())
    texts = {("sig", "k", start): recent_fragment(evs) for start, evs in recent.items()}
    assert hot.recent_events(list(texts), texts) == {("sig", "k", 120_000): recent[120_000]}


def per_key_raw_changes(arrivals, stored, cutoff):
    """The raw-event bookkeeping key by key (the rule ``_raw_changes`` computes column by
    column): per changed key, its newest RECENT_BUCKETS buckets at or above the cutoff
    keep the batch's events (started over when new to the key), a stored bucket that
    leaves them loses its raw events, and every bucket below the cutoff goes."""
    by_key: dict = {}
    for slot, start in arrivals:
        by_key.setdefault(slot, set()).add(start)
    kept, removed, dropped, counts = {}, set(), set(), {}
    for slot, added in by_key.items():
        before = stored.get(slot, set())
        every = sorted({*before, *added})
        counts[slot] = len(every)
        newest = {s for s in every[-RECENT_BUCKETS:] if cutoff is None or s >= cutoff}
        kept.update({(*slot, s): s not in before for s in added if s in newest})
        removed.update((*slot, s) for s in sorted(before)[-RECENT_BUCKETS:] if s not in newest)
        dropped.update((*slot, s) for s in every if cutoff is not None and s < cutoff)
    return kept, removed, dropped, counts


@settings(max_examples=300, deadline=None)
@given(
    arrivals=st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]), st.sampled_from(["k1", "k2"]), st.integers(0, 9)
        ),
        max_size=25,
    ),
    stored_starts=st.dictionaries(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["k1", "k2"])),
        st.sets(st.integers(0, 9), max_size=6),
    ),
    cutoff=st.one_of(st.none(), st.integers(0, 10).map(lambda b: b * 60_000)),
)
def test_raw_bookkeeping_column_by_column_equals_the_per_key_rule(
    arrivals, stored_starts, cutoff
) -> None:
    width = 60_000
    rows = [
        keyed_row((sig, key), KeyedEvent(b * width + 7 * i, f"t{i}"))
        for i, (sig, key, b) in enumerate(arrivals)
    ]
    table = keyed_table(rows, True)
    batch_keys = {(sig, key) for sig, key, _ in arrivals}
    stored = {
        slot: {b * width for b in starts}
        for slot, starts in stored_starts.items()
        if slot in batch_keys
    }
    stored_table = pa.table(
        {
            "signature_id": [s for (s, _), starts in stored.items() for _ in starts],
            "key": [k for (_, k), starts in stored.items() for _ in starts],
            "bucket_start": pa.array([b for starts in stored.values() for b in starts], pa.int64()),
        }
    )
    dropped, appended, removed, counts = _raw_changes(table, stored_table, width, cutoff)
    kept, want_removed, want_dropped, want_counts = per_key_raw_changes(
        [((sig, key), b * width) for sig, key, b in arrivals], stored, cutoff
    )
    slots = lambda t: {(r["signature_id"], r["key"], r["bucket_start"]) for r in t.to_pylist()}  # noqa: E731
    assert slots(dropped) == want_dropped
    assert slots(removed) == want_removed
    assert {
        (r["signature_id"], r["key"]): r["bucket_count"] for r in counts.to_pylist()
    } == want_counts
    got = appended.to_pylist()
    # Every kept row, in arrival order, and only those.
    assert [r["transactionId"] for r in got] == [
        f"t{i}" for i, (sig, key, b) in enumerate(arrivals) if (sig, key, b * width) in kept
    ]
    assert {(r["signature_id"], r["key"], r["bucket_start"]): r["starts"] for r in got} == kept
