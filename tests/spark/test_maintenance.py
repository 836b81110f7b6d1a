"""Maintenance on real Spark + Delta + Redis: compaction, eviction and OPTIMIZE while the
stream runs leave alerts, buckets and Redis lookups unchanged."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from pyspark.sql import functions as F

from velocity.delta import tables
from velocity.delta.live import LiveTables
from velocity.domain.rules import (
    Rule,
    deciding_rules,
    distinct_counted,
    parse_rules,
    rules_by_signature,
)
from velocity.errors import UsageError
from velocity.generate import GenerateOptions, generate_events
from velocity.settings import Settings
from velocity.spark import maintenance
from velocity.spark.backtest import run_backtest
from velocity.spark.evaluate import HOUR_MS, bucket_aggregates, keyed_events, minute_buckets
from velocity.spark.stream import StreamJob

pytestmark = pytest.mark.spark

# Windows of 3 to 60 minutes over ~2.7 hours of events: eviction and compaction both bite.
RULES = [
    {"ruleId": 1, "ruleState": "ACTIVE", "groupingKeyNames": ["payerId"],
     "aggregateFieldName": "paymentAmount", "aggregatorFunctionType": "SUM",
     "limitOperatorType": ">", "limit": 60000, "windowMinutes": 60},
    {"ruleId": 2, "ruleState": "ACTIVE", "groupingKeyNames": ["payerId"],
     "aggregatorFunctionType": "COUNT", "limitOperatorType": ">=", "limit": 4,
     "windowMinutes": 10},
    {"ruleId": 3, "ruleState": "ACTIVE", "groupingKeyNames": ["payerId"],
     "aggregateFieldName": "ip", "aggregatorFunctionType": "UNIQUE_COUNT",
     "limitOperatorType": ">", "limit": 2, "windowMinutes": 30},
    {"ruleId": 4, "ruleState": "ACTIVE", "groupingKeyNames": ["beneficiaryId"],
     "aggregateFieldName": "paymentAmount", "aggregatorFunctionType": "MAX",
     "limitOperatorType": ">=", "limit": 50000, "windowMinutes": 45},
]  # fmt: skip


@pytest.fixture(scope="module")
def hours_of_events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("maintenance-events")
    generate_events(
        folder,
        GenerateOptions(
            events=1800,
            rate=0.2,
            payers=12,
            files=4,
            spike_fraction=0.05,
            late_fraction=0.0,
            duplicate_fraction=0.01,
            malformed_fraction=0.01,
            seed=44,
        ),
    )
    return folder


BUCKET_COLUMNS = ["signature_id", "key", "bucket_start", "event_count", "value_count",
                  "value_sum", "value_min", "value_max", "distinct_values"]  # fmt: skip


def as_tuple(row) -> tuple:
    return tuple(tuple(v) if isinstance(v, list) else v for v in row)


def bucket_rows(spark, settings: Settings) -> set[tuple]:
    """The live buckets as g-wide buckets (compaction expanded), comparable as a set."""
    stored = tables.read_table(spark, LiveTables.of(settings).buckets)
    expanded = minute_buckets(stored, settings.bucket_width_ms)
    return {as_tuple(r) for r in expanded.select(*BUCKET_COLUMNS).collect()}


def buckets_from_raw_events(spark, settings: Settings, since: int) -> set[tuple]:
    live = LiveTables.of(settings)
    rules = deciding_rules(StreamJob(spark, settings).rule_store.in_force())
    events = tables.read_table(spark, live.events)
    built = bucket_aggregates(
        keyed_events(events, rules_by_signature(rules)),
        settings.bucket_width_ms,
        distinct_counted(rules),
    ).where(F.col("bucket_start") >= since)
    return {as_tuple(r) for r in built.select(*BUCKET_COLUMNS).collect()}


def test_maintenance_during_a_live_stream_changes_no_result(
    spark, data_settings: Settings, hours_of_events: Path, tmp_path: Path
) -> None:
    # Delta written behind within a second, so maintenance works on a table that grows.
    settings = data_settings.model_copy(
        update={"eviction_every_seconds": 0, "write_behind_seconds": 1.0}
    )
    arriving = tmp_path / "arriving"
    arriving.mkdir()
    job = StreamJob(spark, settings)
    job.rule_store.apply(parse_rules(json.dumps(RULES)))
    query = job.start(arriving, available_now=False, max_files_per_trigger=1)
    files = sorted(hours_of_events.glob("*.jsonl"))
    runs: list[str] = []
    errors: list[BaseException] = []
    caught_up = threading.Event()

    def maintain() -> None:
        # Cycles while files land and batches run; one more full cycle once all are in.
        try:
            last = False
            while not last:
                last = caught_up.is_set()
                compaction = maintenance.compact_buckets(spark, settings)
                runs.append(f"compact {compaction.hours_written}")
                runs.append(f"evict {maintenance.evict_state(spark, settings).cutoff}")
                maintenance.optimize_tables(spark, settings, ["buckets", "events"])
        except BaseException as exc:  # surfaced below, in the test's thread
            errors.append(exc)

    worker = threading.Thread(target=maintain)
    worker.start()
    try:
        for order, source in enumerate(files):
            hidden = arriving / f".{source.name}"
            shutil.copy(source, hidden)
            os.utime(hidden, (1_700_000_000 + order,) * 2)
            hidden.rename(arriving / source.name)
            time.sleep(2)
        query.processAllAvailable()
        job.settle()  # Spark counts a batch done before it commits (the overlap)
        job.flush()  # Delta holds every batch before maintenance's last cycle
        caught_up.set()
        worker.join(timeout=900)
        query.processAllAvailable()
    finally:
        caught_up.set()
        query.stop()
        job.close()  # the batches still spooled for Delta are written
        worker.join(timeout=900)
    assert not errors, errors
    assert any(r.startswith("compact ") and r != "compact 0" for r in runs), runs

    live = LiveTables.of(settings)
    stored = tables.read_table(spark, live.buckets)
    assert stored.where(F.col("bucket_width_ms") == HOUR_MS).count() > 0, "hours compacted"

    # Alerts: exactly the complete-data result (per-key eventTimes increase here).
    rules = [r.with_version(1) for r in parse_rules(json.dumps(RULES)) if isinstance(r, Rule)]
    out = tmp_path / "bt.jsonl"
    run_backtest(
        spark, settings.model_copy(update={"data_dir": tmp_path / "bt"}), rules,
        str(hours_of_events), out,
    )  # fmt: skip
    expected = {
        (a["ruleId"], a["transactionId"], a["aggregateValue"], a["windowStart"])
        for a in map(json.loads, out.read_text().splitlines())
    }
    streamed = {
        (r["ruleId"], r["transactionId"], r["aggregateValue"], r["windowStart"])
        for r in tables.read_table(spark, live.alerts).collect()
    }
    assert streamed and streamed == expected

    # Buckets: what is left equals the raw events' buckets above the oldest one kept, and
    # Redis mirrors it (so every lookup reads the same windows as before compaction).
    kept = bucket_rows(spark, settings)
    oldest = min(start for _, _, start, *_ in kept)
    assert kept == buckets_from_raw_events(spark, settings, oldest)
    first_event = tables.read_table(spark, live.events).agg(F.min("eventTime")).first()[0]
    assert oldest >= first_event + HOUR_MS, "eviction dropped the first hour"
    assert job.mirror.reconcile().clean

    # Idempotent: compacting again writes nothing new and changes no bucket.
    again = maintenance.compact_buckets(spark, settings)
    assert again.hours_written == 0 and again.rows_after == again.rows_before
    assert bucket_rows(spark, settings) == kept


def test_a_late_event_in_a_compacted_hour_counts_once_and_compaction_folds_it(
    spark, data_settings: Settings, hours_of_events: Path, tmp_path: Path
) -> None:
    job = StreamJob(spark, data_settings)
    job.rule_store.apply(parse_rules(json.dumps(RULES)))
    arriving = tmp_path / "arriving"
    arriving.mkdir()
    for order, source in enumerate(sorted(hours_of_events.glob("*.jsonl"))[:3]):
        shutil.copy(source, arriving / source.name)
        os.utime(arriving / source.name, (1_700_000_000 + order,) * 2)
    job.start(arriving, available_now=True, max_files_per_trigger=3).awaitTermination()
    compaction = maintenance.compact_buckets(spark, data_settings)
    assert compaction.hours_written > 0 and compaction.rows_after < compaction.rows_before

    live = LiveTables.of(data_settings)
    hour = tables.read_table(spark, live.buckets).where(F.col("bucket_width_ms") == HOUR_MS)
    target = hour.orderBy("bucket_start").first()
    party = json.loads(target["key"])[0]  # payer or beneficiary: the event is both
    late_time = target["bucket_start"] + 90_000  # inside the compacted hour
    late = {"transactionId": "late-1", "eventTime": late_time, "payerId": party,
            "beneficiaryId": party, "paymentAmount": "12.5", "paymentType": "CRD",
            "ip": "10.9.9.9"}  # fmt: skip
    (arriving / "zz-late.jsonl").write_text(json.dumps(late) + "\n")
    os.utime(arriving / "zz-late.jsonl", (1_700_000_100,) * 2)
    job.start(arriving, available_now=True).awaitTermination()

    side_by_side = tables.read_table(spark, live.buckets).where(
        (F.col("key") == target["key"]) & (F.col("signature_id") == target["signature_id"])
        & (F.col("bucket_start") == late_time - late_time % data_settings.bucket_width_ms)
    )  # fmt: skip
    assert side_by_side.count() == 1, "the late delta lands as a g-wide row"
    oldest = min(start for _, _, start, *_ in bucket_rows(spark, data_settings))
    assert bucket_rows(spark, data_settings) == buckets_from_raw_events(
        spark, data_settings, oldest
    )
    assert job.mirror.reconcile().clean

    folded = maintenance.compact_buckets(spark, data_settings)
    assert folded.hours_written > 0 and folded.rows_after < folded.rows_before
    hour = F.col("bucket_start") - F.pmod(F.col("bucket_start"), F.lit(HOUR_MS))
    crowded = (
        tables.read_table(spark, live.buckets)
        .where(F.col("bucket_start") < folded.sealed_before)
        .groupBy("signature_id", "key", hour)
        .count()
        .where("count > 1")
    )
    assert crowded.count() == 0, "every sealed hour is one row: the late deltas are folded in"
    assert bucket_rows(spark, data_settings) == buckets_from_raw_events(
        spark, data_settings, oldest
    )


def test_vacuum_refuses_an_unsafe_retention(spark, data_settings: Settings) -> None:
    with pytest.raises(UsageError, match="168"):
        maintenance.vacuum_tables(spark, data_settings, 24)
    StreamJob(spark, data_settings)
    done = maintenance.vacuum_tables(spark, data_settings, 168)
    assert "buckets" in done


def test_vacuum_deletes_only_unreferenced_files_older_than_the_retention(
    spark, data_settings: Settings
) -> None:
    """VACUUM runs on a table only when it may delete something: a data file the table
    does not reference, written before the retention (a stray one, 8 days old, goes); a
    younger stray file and every referenced file stay."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    StreamJob(spark, data_settings)
    live = LiveTables.of(data_settings)
    referenced = [
        uri
        for name in LiveTables.__dataclass_fields__
        if tables.table_exists(spark, getattr(live, name))
        for uri in DeltaTable(str(getattr(live, name))).file_uris()
    ]
    old, young = live.buckets / "stray-old.parquet", live.buckets / "stray-young.parquet"
    for stray in (old, young):
        pq.write_table(pa.table({"x": [1]}), stray)
    week_ago = time.time() - 8 * 24 * 3600
    os.utime(old, (week_ago, week_ago))
    done = maintenance.vacuum_tables(spark, data_settings, 168)
    assert not old.exists() and young.exists()
    assert all(Path(unquote(urlparse(uri).path)).exists() for uri in referenced)
    assert done["buckets"].files_before == done["buckets"].files_after + 1
