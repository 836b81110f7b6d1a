"""The write-behind on real Spark + Delta: every spooled row lands once, whatever the batch
sizes, and a flush cut short is finished without doubling anything."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pytest

from velocity.delta import tables
from velocity.delta.live import LiveState
from velocity.delta.write_behind import ARROW_SCHEMAS, SPOOLED_TABLES, Spool
from velocity.settings import Settings, load_settings

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


def alert(batch: int, index: int) -> dict[str, object]:
    return {
        "alertId": f"a-{batch}-{index}", "kind": "ALERT", "ruleId": 1, "ruleVersion": 1,
        "transactionId": f"tx-{batch}-{index}", "key": [("payerId", f"p{index}")],
        "eventTime": 1, "aggregatorFunctionType": "COUNT", "aggregateValue": "1",
        "limitOperatorType": ">", "limit": "0", "windowStart": 0, "windowEnd": 1,
        "decisionTime": 2, "signature_id": "s",
    }  # fmt: skip


def spool_batches(spool: Spool, sizes: dict[int, int]) -> None:
    for batch, size in sizes.items():
        rows = {name: ARROW_SCHEMAS[name].empty_table() for name in SPOOLED_TABLES}
        rows["alerts"] = pa.Table.from_pylist(
            [alert(batch, i) for i in range(size)], schema=ARROW_SCHEMAS["alerts"]
        )
        spool.write(batch, rows, {"newest_before": None})


def test_every_spooled_row_lands_once_even_after_empty_batches(
    spark, data_settings: Settings
) -> None:
    state = LiveState(spark, data_settings)
    sizes = {0: 0, 1: 2, 2: 0, 3: 1, 4: 0, 5: 0, 6: 3, 7: 2}  # empty batches in between
    spool_batches(state.spool, sizes)
    flushed = state.flush_spool(7)
    assert flushed.batches == list(sizes) and flushed.rows["alerts"] == sum(sizes.values())

    def stored() -> list[str]:
        return sorted(r["alertId"] for r in tables.read_table(spark, state.live.alerts).collect())

    expected = sorted(f"a-{b}-{i}" for b, n in sizes.items() for i in range(n))
    assert stored() == expected
    assert state.spool.batches() == []

    # A flush cut short after its group was recorded (some tables appended, the spool
    # still there) is finished with the same group: Delta skips what it has.
    spool_batches(state.spool, {8: 1, 9: 0, 10: 2})
    state.spool.root.joinpath("flushing.json").write_text(json.dumps([8, 9, 10]))
    assert state.flush_spool(10).rows["alerts"] == 3
    spool_batches(state.spool, {8: 1, 9: 0, 10: 2})  # the same batches, spooled again
    state.spool.root.joinpath("flushing.json").write_text(json.dumps([8, 9, 10]))
    state.flush_spool(10)
    assert stored() == sorted([*expected, "a-8-0", "a-10-0", "a-10-1"])


def test_the_oldest_spooled_batch_says_how_far_delta_trails(tmp_path: Path) -> None:
    spool = Spool(load_settings(data_dir=tmp_path / "data"))
    assert spool.oldest_spooled_at() is None
    spool_batches(spool, {4: 0})  # empty: its flush needs no Delta table
    time.sleep(0.05)
    spool_batches(spool, {5: 0})
    folders = {b: (spool.root / f"{b:012d}").stat().st_mtime for b in (4, 5)}
    assert folders[4] < folders[5] and spool.oldest_spooled_at() == folders[4]
    spool.flush(4)
    assert spool.oldest_spooled_at() == folders[5]
    spool.discard_from(5)
    assert spool.oldest_spooled_at() is None
