"""Columnar admission (``engine.admission.admit``) gives ``Arrivals``' verdicts, event by
event, on random arrivals: repeated transactionIds, ids accepted by earlier batches, and
far-future eventTimes alone, chained and behind the clock."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from velocity.domain.arrival import Arrivals, Verdict
from velocity.domain.schema import Event
from velocity.domain.stream_batch import admit as stream_admit
from velocity.engine.admission import (
    NO_TIME,
    VERDICT_NAMES,
    _admit_in_order,
    admit,
    admit_batch,
)

LIMIT = 1_000
arrival = st.tuples(
    st.sampled_from([f"t{i}" for i in range(8)]),
    st.one_of(st.integers(0, 3_000), st.integers(0, 20).map(lambda k: 2_000 * k)),
)


def sequential(events, seen, newest, clock):
    arrivals = Arrivals(
        {t for (t, _), s in zip(events, seen, strict=True) if s}, newest, LIMIT, clock
    )
    out = []
    for transaction_id, time in events:
        before = arrivals.newest
        out.append((arrivals.admit(transaction_id, time), before))
    return out, arrivals.newest


def columnar(events, seen, newest, clock, admit_with=admit):
    ids = pa.array([t for t, _ in events], pa.string())
    times = np.array([t for _, t in events], dtype=np.int64)
    got = admit_with(ids, times, np.array(seen, dtype=bool), newest, LIMIT, clock)
    pairs = [
        (VERDICT_NAMES[int(v)], None if b == NO_TIME else int(b))
        for v, b in zip(got.verdicts, got.newest_before, strict=True)
    ]
    return pairs, got.newest


@settings(max_examples=300)
@given(
    events=st.lists(arrival, max_size=40),
    seen_ids=st.sets(st.sampled_from([f"t{i}" for i in range(8)]), max_size=3),
    newest=st.one_of(st.none(), st.integers(0, 3_000)),
    clock=st.one_of(st.none(), st.integers(0, 30_000)),
)
def test_columnar_admission_equals_the_sequential_one(events, seen_ids, newest, clock) -> None:
    seen = [t in seen_ids for t, _ in events]
    expected = sequential(events, seen, newest, clock)
    assert columnar(events, seen, newest, clock) == expected
    assert columnar(events, seen, newest, clock, _admit_in_order) == expected


def test_a_chain_of_far_future_events_settles() -> None:
    events = [("a", 0), ("b", 5_000), ("b", 500), ("c", 9_000), ("d", 1_400), ("e", 2_500)]
    result = columnar(events, [False] * 6, None, None)
    assert result == sequential(events, [False] * 6, None, None)
    assert [v for v, _ in result[0]] == [
        Verdict.ACCEPTED,
        Verdict.FUTURE,
        Verdict.ACCEPTED,
        Verdict.FUTURE,
        Verdict.ACCEPTED,
        Verdict.FUTURE,
    ]


@settings(max_examples=200)
@given(
    events=st.lists(arrival, max_size=40),
    seen_ids=st.sets(st.sampled_from([f"t{i}" for i in range(8)]), max_size=3),
    newest=st.one_of(st.none(), st.integers(0, 3_000)),
    clock=st.integers(0, 30_000),
    lateness=st.sampled_from([0, 500, 5_000]),
)
def test_a_micro_batchs_admission_equals_the_stream_reference(
    events, seen_ids, newest, clock, lateness
) -> None:
    """``admit_batch`` splits a batch's rows as ``stream_batch.admit`` splits its events:
    the same accepted rows, duplicates, far-future reasons, late events and newest time."""
    valid = pa.table(
        {
            "transactionId": pa.array([t for t, _ in events], pa.string()),
            "eventTime": pa.array([t for _, t in events], pa.int64()),
            "line_seq": pa.array(range(len(events)), pa.int64()),
            "reason": pa.nulls(len(events), pa.string()),
        }
    )
    seen = np.array([t in seen_ids for t, _ in events], dtype=bool)
    got = admit_batch(valid, seen, newest, lateness, LIMIT, clock)
    parsed = [
        Event(t, time, Decimal(1), {"transactionId": t, "eventTime": str(time)})
        for t, time in events
    ]
    want = stream_admit(parsed, seen_ids, newest, lateness, LIMIT, clock)
    assert got.accepted.column("transactionId").to_pylist() == [
        e.transaction_id for e in want.accepted
    ]
    assert got.duplicates.column("line_seq").to_pylist() == want.duplicates
    assert got.future.column("line_seq").to_pylist() == list(want.future)
    assert got.future.column("reason_code").to_pylist() == [
        r.code.value for r in want.future.values()
    ]
    assert got.future.column("reason").to_pylist() == [r.message for r in want.future.values()]
    late = got.accepted.filter(pa.array(got.late)).column("transactionId").to_pylist()
    assert set(late) == want.late and len(late) == len(want.late)
    assert (got.watermark, got.newest) == (want.watermark, want.newest_event_time)
