"""The write-behind on real Spark + Delta: every spooled row lands once, whatever the batch
sizes, and a flush cut short is finished without doubling anything."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql.types import StructType

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


def test_a_new_data_dirs_tables_are_as_spark_would_create_them_and_read_as_unwritten(
    spark, data_settings: Settings, tmp_path: Path
) -> None:
    """A new data dir's live tables are created by delta-rs (as Spark jobs they took 20-45 s
    of a stream's start on two busy cores): each reads in Spark as the table Spark makes
    from an empty DataFrame (nullable throughout, protocol 1/2), and reads as unwritten,
    without a Spark job, until something is written to it."""
    state = LiveState(spark, data_settings)
    for name in (tables.BUCKETS, tables.ALERTS):  # nested arrays of non-null values, a map
        by_spark = tmp_path / f"spark-{name}"
        spark.createDataFrame([], tables.LIVE_SCHEMAS[name]).write.format("delta").save(
            str(by_spark)
        )
        assert state.read(name).schema == tables.read_table(spark, by_spark).schema, name
    for name in tables.LIVE_SCHEMAS:
        created = DeltaTable(str(getattr(state.live, name)))
        protocol = created.protocol()
        assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2), name
        assert created.version() == 0 and not created.file_uris(), name
        assert state.unwritten(name), name
    assert state.newest_event_time() is None and state.rule_epochs().newest() is None

    # Written: a few rows in one delta-rs commit, which Spark reads.
    state.append_rows(tables.RULE_EPOCHS, [(3, 1_767_225_600_000, "[[1, 2]]")])
    assert not state.unwritten(tables.RULE_EPOCHS)
    assert [tuple(r) for r in state.read(tables.RULE_EPOCHS).collect()] == [
        (3, 1_767_225_600_000, "[[1, 2]]")
    ]
    # A table whose first version holds rows (written before any LiveState) is not unwritten.
    other = load_settings(data_dir=tmp_path / "other")
    seeded = spark.createDataFrame([(1, 2, "[]")], tables.RULE_EPOCH_SCHEMA)
    seeded.write.format("delta").save(str(other.table_path(tables.RULE_EPOCHS)))
    assert not LiveState(spark, other).unwritten(tables.RULE_EPOCHS)

    # A table of an earlier Velocity gains the nullable columns it lacks.
    signatures = data_settings.model_copy(update={"data_dir": tmp_path / "old"})
    path = signatures.table_path(tables.SIGNATURES)
    older = StructType([f for f in tables.SIGNATURE_SCHEMA.fields if f.name != "kept_distinct"])
    spark.createDataFrame([], older).write.format("delta").save(str(path))
    LiveState(spark, signatures)
    assert "kept_distinct" in tables.read_table(spark, path).columns


def test_two_flushers_at_once_append_each_row_once(spark, data_settings: Settings) -> None:
    """The stream's flusher and a backfill's, both past a state lock whose lease ran out
    on a loaded machine: they flush one after the other, and neither fails."""
    state = LiveState(spark, data_settings)
    sizes = {0: 2, 1: 1, 2: 3}
    spool_batches(state.spool, sizes)
    start = threading.Barrier(2)

    def flush() -> list[int]:
        start.wait()
        return Spool(data_settings).flush(2).batches

    with ThreadPoolExecutor(2) as pool:
        flushed = [f.result() for f in [pool.submit(flush), pool.submit(flush)]]
    assert sorted(flushed) == [[], [0, 1, 2]]  # the second found nothing left to do
    stored = sorted(r["alertId"] for r in tables.read_table(spark, state.live.alerts).collect())
    assert stored == sorted(f"a-{b}-{i}" for b, n in sizes.items() for i in range(n))
    assert state.spool.batches() == []
