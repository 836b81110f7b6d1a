"""A micro-batch's events for the backfill of late events (``delta.batch_rows``): each
once, with its reason, in the late_events table's shape."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from velocity.delta.batch_rows import late_event_rows
from velocity.delta.write_behind import ARROW_SCHEMAS
from velocity.engine.admission import AdmittedBatch

pytestmark = pytest.mark.timeout(60)


def admitted(times: list[int], late: list[bool], watermark: int | None) -> AdmittedBatch:
    accepted = pa.table(
        {"transactionId": [f"tx-{t}" for t in times], "eventTime": pa.array(times, pa.int64())}
    )
    empty = accepted.slice(0, 0)
    return AdmittedBatch(accepted, empty, empty, np.array(late, bool), watermark, max(times))


def out_of_order(times: list[int]) -> pa.Table:
    return pa.table(
        {"transactionId": [f"ooo-{t}" for t in times], "eventTime": pa.array(times, pa.int64())}
    )


def test_late_and_out_of_order_events_are_recorded_with_their_reasons() -> None:
    rows = late_event_rows(admitted([5, 50, 60], [True, False, False], 40), out_of_order([45]), 7)
    assert rows.schema == ARROW_SCHEMAS["late_events"]
    assert rows.to_pylist() == [
        {"transactionId": "tx-5", "eventTime": 5, "watermark": 40, "stream_batch": 7,
         "reason": "late"},
        {"transactionId": "ooo-45", "eventTime": 45, "watermark": 40, "stream_batch": 7,
         "reason": "out_of_order"},
    ]  # fmt: skip


def test_without_a_watermark_an_out_of_order_event_carries_its_own_time() -> None:
    rows = late_event_rows(admitted([9], [False], None), out_of_order([3, 8]), 0)
    assert [(r["watermark"], r["reason"]) for r in rows.to_pylist()] == [
        (3, "out_of_order"),
        (8, "out_of_order"),
    ]
