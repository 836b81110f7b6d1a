"""Admission of valid events in arrival order, column by column (pure; SPEC §1).

``admit`` gives the verdicts ``velocity.domain.arrival.Arrivals`` gives event after event, with
no Python loop per event. Admission is sequential by nature (an event is too far ahead
of the newest eventTime accepted *before it*, and a quarantined event claims neither
its transactionId nor the newest eventTime), so it is solved as a fixed point:

1. guess the far-future events (at first: those ahead of the clock);
2. the others' first arrival of each transactionId is accepted, unless an earlier batch
   accepted it; the newest accepted eventTime before each event is a running maximum;
3. the far-future events are those ahead of that running maximum (or the clock).

When step 3 gives back the guess, every verdict is what the sequential pass gives (by
induction over arrival order: each event sees the state the verdicts before it make).
It settles in a round or two (far-future events are few and rarely chained); a batch
that does not settle within ``ROUNDS`` is admitted by the sequential pass itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from velocity.domain.arrival import Arrivals, Verdict, future_rejection
from velocity.engine.kernel import dictionary_codes

ACCEPTED, DUPLICATE, FUTURE = np.int8(0), np.int8(1), np.int8(2)
VERDICT_NAMES = {
    int(ACCEPTED): Verdict.ACCEPTED,
    int(DUPLICATE): Verdict.DUPLICATE,
    int(FUTURE): Verdict.FUTURE,
}
ROUNDS = 8
NO_TIME = np.iinfo(np.int64).min  # "no accepted eventTime yet"


@dataclass(frozen=True)
class Admission:
    verdicts: np.ndarray  # int8, per event in arrival order
    newest_before: np.ndarray  # int64: newest accepted eventTime when it arrived (NO_TIME)
    newest: int | None  # the newest accepted eventTime after the batch


def admit(
    transaction_ids: pa.Array | pa.ChunkedArray,
    times: np.ndarray,
    seen: np.ndarray,
    newest: int | None,
    max_future_ms: int,
    clock_ms: int | None = None,
) -> Admission:
    """Verdicts of events in arrival order: ``seen`` marks transactionIds accepted before
    (by earlier batches), ``newest`` is the newest eventTime they accepted."""
    n = len(times)
    times = np.asarray(times, dtype=np.int64)
    if n == 0:
        return Admission(np.zeros(0, np.int8), np.zeros(0, np.int64), newest)
    codes, _ = dictionary_codes([transaction_ids])
    ahead_of_clock = (
        times > clock_ms + max_future_ms if clock_ms is not None else np.zeros(n, dtype=bool)
    )
    start = NO_TIME if newest is None else newest
    future = ahead_of_clock
    for _ in range(ROUNDS):
        candidates = np.flatnonzero(~future)
        _, first = np.unique(codes[candidates], return_index=True)
        accepted = np.zeros(n, dtype=bool)
        accepted[candidates[first]] = True
        accepted &= ~seen
        running = np.maximum.accumulate(np.where(accepted, times, NO_TIME))
        before = np.maximum(np.r_[NO_TIME, running[:-1]], start)
        ahead = (before != NO_TIME) & (times - max_future_ms > before)
        settled = ahead | ahead_of_clock
        if np.array_equal(settled, future):
            verdicts = np.where(future, FUTURE, np.where(accepted, ACCEPTED, DUPLICATE))
            last = int(running[-1])
            after = newest if last == NO_TIME else max(last, start)
            return Admission(verdicts.astype(np.int8), before, after)
        future = settled
    return _admit_in_order(transaction_ids, times, seen, newest, max_future_ms, clock_ms)


def _admit_in_order(
    transaction_ids: pa.Array | pa.ChunkedArray,
    times: np.ndarray,
    seen: np.ndarray,
    newest: int | None,
    max_future_ms: int,
    clock_ms: int | None,
) -> Admission:
    """The sequential pass (``Arrivals``), for a batch the fixed point did not settle."""
    ids = transaction_ids.to_pylist()
    arrivals = Arrivals(
        (t for t, s in zip(ids, seen.tolist(), strict=True) if s), newest, max_future_ms, clock_ms
    )
    codes = {Verdict.ACCEPTED: ACCEPTED, Verdict.DUPLICATE: DUPLICATE, Verdict.FUTURE: FUTURE}
    verdicts = np.empty(len(ids), dtype=np.int8)
    before = np.empty(len(ids), dtype=np.int64)
    for index, (transaction_id, time) in enumerate(zip(ids, times.tolist(), strict=True)):
        before[index] = NO_TIME if arrivals.newest is None else arrivals.newest
        verdicts[index] = codes[arrivals.admit(transaction_id, time)]
    return Admission(verdicts, before, arrivals.newest)


@dataclass(frozen=True)
class AdmittedBatch:
    """A micro-batch's valid lines (rows in arrival order) split by their verdicts, with
    the accepted ones older than the watermark marked late (SPEC §3: counted in buckets,
    not decided)."""

    accepted: pa.Table
    duplicates: pa.Table
    future: pa.Table  # the far-future lines, with reason_code and reason
    late: np.ndarray  # bool per accepted row
    watermark: int | None  # newest accepted eventTime of the earlier batches − lateness
    newest: int | None  # newest accepted eventTime, the earlier batches' and this one's


def admit_batch(
    valid: pa.Table,
    seen: np.ndarray,
    newest_before: int | None,
    allowed_lateness_ms: int,
    max_future_ms: int,
    clock_ms: int,
) -> AdmittedBatch:
    """``admit`` over a micro-batch's ``valid`` lines (transactionId and eventTime columns,
    arrival order); ``seen`` marks the transactionIds earlier batches accepted."""
    ids = valid.column("transactionId")
    times = valid.column("eventTime").to_numpy()
    admission = admit(ids, times, seen, newest_before, max_future_ms, clock_ms)
    verdicts = admission.verdicts
    accepted = valid.filter(pa.array(verdicts == ACCEPTED))
    future_rows = np.flatnonzero(verdicts == FUTURE)
    reasons = [
        future_rejection(
            int(times[i]), None if before == NO_TIME else int(before), max_future_ms, clock_ms
        )
        for i, before in zip(
            future_rows.tolist(), admission.newest_before[future_rows].tolist(), strict=True
        )
    ]
    future_lines = valid.take(pa.array(future_rows, pa.int64()))
    future = (
        future_lines.drop_columns(
            [name for name in ("reason_code", "reason") if name in future_lines.column_names]
        )
        .append_column("reason_code", pa.array([r.code.value for r in reasons], pa.string()))
        .append_column("reason", pa.array([r.message for r in reasons], pa.string()))
    )
    watermark = None if newest_before is None else newest_before - allowed_lateness_ms
    accepted_times = accepted.column("eventTime").to_numpy()
    late = (
        np.zeros(len(accepted_times), dtype=bool)
        if watermark is None
        else accepted_times < watermark
    )
    return AdmittedBatch(
        accepted,
        valid.filter(pa.array(verdicts == DUPLICATE)),
        future,
        late,
        watermark,
        admission.newest,
    )
