"""Admission in arrival order (SPEC §1): far-future events quarantined, first arrival wins."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from velocity.domain.arrival import Arrivals, Verdict
from velocity.domain.schema import RejectReason

pytestmark = pytest.mark.timeout(60)

DAY_MS = 24 * 3600 * 1000
T0 = 1_767_225_600_000


def verdicts(arrivals: Arrivals, events: list[tuple[str, int]]) -> list[Verdict]:
    return [arrivals.admit(tx, t) for tx, t in events]


def test_one_event_decades_ahead_is_quarantined_and_moves_nothing() -> None:
    arrivals = Arrivals((), None, DAY_MS)
    outlier = T0 + 30 * 365 * DAY_MS
    got = verdicts(arrivals, [("a", T0), ("far", outlier), ("b", T0 + 1000)])
    assert got == [Verdict.ACCEPTED, Verdict.FUTURE, Verdict.ACCEPTED]
    assert arrivals.newest == T0 + 1000
    why = Arrivals((), T0, DAY_MS).future_rejection(outlier)
    assert why.code is RejectReason.FUTURE_EVENT_TIME
    assert str(outlier) in why.message and f"newest accepted eventTime {T0}" in why.message


def test_a_burst_of_future_events_is_quarantined_whole() -> None:
    """A quarantined event does not raise the newest accepted eventTime, so the rest of a
    burst is measured against the same, honest clock."""
    arrivals = Arrivals((), T0, DAY_MS)
    burst = [(f"f{i}", T0 + 2 * DAY_MS + i) for i in range(50)]
    assert set(verdicts(arrivals, burst)) == {Verdict.FUTURE}
    assert arrivals.newest == T0


def test_time_moving_forward_within_the_limit_step_by_step_is_accepted() -> None:
    arrivals = Arrivals((), None, DAY_MS)
    steps = [(f"s{i}", T0 + i * DAY_MS) for i in range(5)]
    assert set(verdicts(arrivals, steps)) == {Verdict.ACCEPTED}
    assert arrivals.admit("exact", T0 + 5 * DAY_MS) is Verdict.ACCEPTED  # exactly the limit


def test_the_clock_bounds_a_live_stream_even_before_any_event() -> None:
    arrivals = Arrivals((), None, DAY_MS, clock_ms=T0)
    assert arrivals.admit("x", T0 + DAY_MS + 1) is Verdict.FUTURE
    assert "the clock" in arrivals.future_rejection(T0 + DAY_MS + 1).message
    assert arrivals.admit("y", T0 + DAY_MS) is Verdict.ACCEPTED


def test_a_quarantined_event_does_not_claim_its_transaction_id() -> None:
    arrivals = Arrivals((), T0, DAY_MS)
    got = verdicts(arrivals, [("tx", T0 + 3 * DAY_MS), ("tx", T0), ("tx", T0)])
    assert got == [Verdict.FUTURE, Verdict.ACCEPTED, Verdict.DUPLICATE]


def test_ids_accepted_by_earlier_batches_are_duplicates() -> None:
    arrivals = Arrivals({"old"}, T0, DAY_MS)
    assert verdicts(arrivals, [("old", T0), ("new", T0)]) == [
        Verdict.DUPLICATE,
        Verdict.ACCEPTED,
    ]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("abcdef"), st.integers(0, 10 * DAY_MS)), max_size=40),
    st.integers(1, 3 * DAY_MS),
)
def test_verdicts_equal_a_direct_reading_of_the_spec(events, limit) -> None:
    """Accepted = not more than ``limit`` past the max of the accepted before it, and the
    first such arrival of its id."""
    accepted: list[tuple[str, int]] = []
    expected = []
    for tx, t in events:
        if accepted and t > max(x for _, x in accepted) + limit:
            expected.append(Verdict.FUTURE)
        elif tx in {x for x, _ in accepted}:
            expected.append(Verdict.DUPLICATE)
        else:
            accepted.append((tx, t))
            expected.append(Verdict.ACCEPTED)
    assert verdicts(Arrivals((), None, limit), events) == expected
