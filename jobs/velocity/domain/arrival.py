"""Which valid events are accepted, in arrival order (pure; SPEC §1).

One definition for the stream (per micro-batch, carried across batches) and the batch
engine (one pass over every line in arrival order):

- an eventTime more than ``max_future_ms`` ahead of the newest accepted eventTime, or,
  in a live stream, of the clock, is quarantined (``FUTURE_EVENT_TIME``): one wrong clock
  must not move the watermark and the horizon for everyone (a burst of them neither:
  a quarantined event does not raise the newest accepted eventTime);
- otherwise the first arrival of a transactionId is accepted and later ones are
  duplicates. A quarantined event does not claim its transactionId.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from velocity.domain.schema import Rejection, RejectReason


class Verdict(StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    FUTURE = "future"


class Arrivals:
    """The running state of admission: the accepted transactionIds asked about, and the
    newest accepted eventTime."""

    def __init__(
        self,
        seen: Iterable[str],
        newest: int | None,
        max_future_ms: int,
        clock_ms: int | None = None,
    ) -> None:
        self.seen = set(seen)
        self.newest = newest
        self.max_future_ms = max_future_ms
        self.clock_ms = clock_ms

    def admit(self, transaction_id: str, event_time: int) -> Verdict:
        """The verdict on the next valid event in arrival order (and it counts)."""
        if self.too_far_ahead(event_time):
            return Verdict.FUTURE
        if transaction_id in self.seen:
            return Verdict.DUPLICATE
        self.seen.add(transaction_id)
        if self.newest is None or event_time > self.newest:
            self.newest = event_time
        return Verdict.ACCEPTED

    def too_far_ahead(self, event_time: int) -> bool:
        limit = self.max_future_ms
        return (self.newest is not None and event_time > self.newest + limit) or (
            self.clock_ms is not None and event_time > self.clock_ms + limit
        )

    def future_rejection(self, event_time: int) -> Rejection:
        """Why ``event_time`` was quarantined (call right after its FUTURE verdict)."""
        return future_rejection(event_time, self.newest, self.max_future_ms, self.clock_ms)


def future_rejection(
    event_time: int, newest: int | None, max_future_ms: int, clock_ms: int | None
) -> Rejection:
    """Why an event at ``event_time`` is too far ahead, when it arrived after ``newest``
    (the newest accepted eventTime then) with the clock at ``clock_ms``."""
    seconds = max_future_ms // 1000
    if newest is not None and event_time > newest + max_future_ms:
        against = f"the newest accepted eventTime {newest}"
    else:
        against = f"the clock ({clock_ms})"
    return Rejection(
        RejectReason.FUTURE_EVENT_TIME,
        f"eventTime {event_time} is more than {seconds} s ahead of {against}",
    )
