"""A micro-batch decided column by column (``engine.micro_batch``) equals the stream's
in-memory batch engine (``stream_batch.decide``): the same decisions, bucket deltas and
new absolute buckets, batch after batch, for any arrival order, duplicates, late events
and own buckets that need their earlier events raw."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import MINUTE_MS, bucket_seconds, events, rule_sets
from tests.unit.test_kernel import _ARROW, keyed_row
from tests.unit.test_stream_batch import arrival_batches
from velocity.domain.buckets import BucketAggregate, bucket_from_columns
from velocity.domain.rules import RuleState, distinct_counted, rules_by_signature
from velocity.domain.stream_batch import KeyState, admit, decide, history_needed, key_groups
from velocity.domain.windows import format_aggregate
from velocity.engine.bucketing import BUCKET_ROWS
from velocity.engine.micro_batch import STORED_COLUMNS, decide_micro_batch

pytestmark = pytest.mark.timeout(120)

_STORED = pa.schema(
    [
        pa.field("signature_id", pa.string()),
        pa.field("key", pa.string()),
        pa.field("bucket_start", pa.int64()),
        pa.field("last_time", pa.int64()),
        *(BUCKET_ROWS.field(name) for name in STORED_COLUMNS[4:]),
    ]
)


def keyed_table(rows: list[dict], decide_column: bool) -> pa.Table:
    schema = _ARROW.append(pa.field("decide", pa.bool_())) if decide_column else _ARROW
    return pa.Table.from_pylist(rows, schema=schema)


def slot_of(row: dict) -> tuple[str, str, int]:
    return row["signature_id"], row["key"], row["bucket_start"]


def stored_table(states: dict, slots) -> pa.Table:
    rows = []
    for slot in slots:
        state = states.get(slot)
        for start, aggregate in (state.buckets if state else {}).items():
            rows.append(
                {
                    "signature_id": slot[0],
                    "key": slot[1],
                    "bucket_start": start,
                    "last_time": state.last_times.get(start),
                    "event_count": aggregate.count,
                    "value_count": aggregate.value_count,
                    "value_sum": aggregate.total,
                    "value_min": aggregate.minimum,
                    "value_max": aggregate.maximum,
                    "distinct_values": sorted(aggregate.distinct),
                }
            )
    return pa.Table.from_pylist(rows, schema=_STORED)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), evs=events(max_size=30), rules=rule_sets(), seconds=bucket_seconds)
def test_micro_batch_equals_the_streams_batch_engine(data, evs, rules, seconds) -> None:
    width = seconds * 1000
    batches = data.draw(arrival_batches(evs))
    lateness = data.draw(st.sampled_from((0, 30_000, 10 * MINUTE_MS)))
    unknown = data.draw(st.booleans())  # buckets read from Delta: newest eventTime unknown
    active = [r for r in rules if r.state is RuleState.ACTIVE]
    signatures = list(rules_by_signature(active))
    counted = distinct_counted(active)

    def as_kept(aggregate: BucketAggregate, signature_id: str) -> BucketAggregate:
        """The reference keeps every distinct value; the engine only those a rule counts."""
        return aggregate if signature_id in counted else aggregate._replace(distinct=frozenset())

    states: dict = {}
    raw: dict = {}
    seen: set[str] = set()
    newest = None
    for batch in batches:
        admitted = admit(batch, seen, newest, lateness, 10**15)
        groups = key_groups(admitted.accepted, signatures)
        needed = history_needed(groups, states, admitted.late, width)
        history = {slot: raw.get(slot, []) for slot in needed}
        expected = decide(groups, states, active, admitted.late, width, history)

        rows = [
            keyed_row(slot, e, decide=e.transaction_id not in admitted.late)
            for slot, group in groups.items()
            for e in group
        ]
        earlier = [keyed_row(slot[:2], e) for slot, es in history.items() for e in es]
        got = decide_micro_batch(
            keyed_table(rows, True),
            stored_table(states, groups),
            keyed_table(earlier, False),
            active,
            width,
        )
        decided = {
            (active[int(r)].rule_id, rows[int(i)]["transactionId"]): (str(v), int(s))
            for i, r, v, s in zip(
                got.decisions.rows,
                got.decisions.rules,
                got.decisions.texts().to_pylist(),
                got.decisions.window_starts,
                strict=True,
            )
        }
        assert decided == {
            (d.rule.rule_id, d.event.transaction_id): (format_aggregate(d.value), d.window_start)
            for d, _, _ in expected.decisions
        }
        assert {slot_of(r): bucket_from_columns(r) for r in got.deltas.to_pylist()} == {
            slot: as_kept(aggregate, slot[0]) for slot, aggregate in expected.deltas.items()
        }
        assert {
            (r["signature_id"], r["key"], r["bucket_start"]): (
                bucket_from_columns(r),
                r["last_time"],
            )
            for r in got.buckets.to_pylist()
        } == {
            (*slot, start): (as_kept(state.buckets[start], slot[0]), state.last_times.get(start))
            for slot, state in expected.buckets.items()
            for start in expected.changed[slot]
        }

        # The stored buckets carry distinct values only where a rule counts them.
        states.update(
            {
                slot: replace(
                    state,
                    buckets={start: as_kept(a, slot[0]) for start, a in state.buckets.items()},
                )
                for slot, state in expected.buckets.items()
            }
        )
        if unknown:  # as read back from Delta: no newest eventTimes, no raw events
            states = {
                s: KeyState(st_.buckets, dict.fromkeys(st_.buckets)) for s, st_ in states.items()
            }
        for (signature_id, key), group in groups.items():
            for e in group:
                raw.setdefault((signature_id, key, e.event_time - e.event_time % width), []).append(
                    e
                )
        seen.update(e.transaction_id for e in admitted.accepted)
        newest = admitted.newest_event_time
