"""Data-quality suites on real Spark + Delta: consistent live tables pass, and each suite
fails, naming the defect, when one is planted; results are kept either way."""

from __future__ import annotations

import json
import shutil
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from velocity.cli.main import main
from velocity.delta import tables
from velocity.delta.live import LiveTables
from velocity.delta.rule_store import RuleStore
from velocity.domain.rules import deciding_rules, distinct_counted, parse_rules, rules_by_signature
from velocity.generate import GenerateOptions, generate_events
from velocity.quality import format_summary, run_quality_checks
from velocity.quality.checks import QUALITY_RESULTS, write_results
from velocity.resources import sample_rules_path
from velocity.settings import Settings
from velocity.spark.evaluate import (
    bucket_aggregates,
    evaluate_alerts,
    hour_buckets,
    keyed_events,
    minute_buckets,
)
from velocity.spark.ingest import admitted_lines, split_admitted

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def live_tables(spark, spark_settings: Settings, tmp_path_factory) -> Path:
    """Live tables as the stream leaves them, built directly (cheaper than streaming):
    generated events with duplicates and malformed lines, the sample rules, buckets merged
    from two "batches" with a compaction into hour buckets between them (so the second
    batch's deltas land as g-wide rows next to compacted hours), and the engine's alerts.
    Tests work on copies."""
    root = tmp_path_factory.mktemp("quality-live")
    options = GenerateOptions(
        events=300,
        rate=2.0,
        payers=6,
        files=1,
        spike_fraction=0.05,
        late_fraction=0.0,
        duplicate_fraction=0.03,
        malformed_fraction=0.03,
        seed=11,
    )
    generate_events(root / "events", options)
    settings = spark_settings.model_copy(update={"data_dir": root / "data"})
    live = LiveTables.of(settings)
    width_ms = settings.bucket_width_ms

    admitted = admitted_lines(
        spark, str(root / "events"), settings.max_future_ms, True, root / "admitted"
    )
    ingested = split_admitted(admitted)
    tables.overwrite_table(ingested.quarantine, live.quarantine)
    tables.overwrite_table(ingested.duplicates, live.duplicates)
    second_batch = options.start_ms + 75_000
    batch = F.when(F.col("eventTime") < second_batch, 0).otherwise(1).cast("long")
    tables.overwrite_table(ingested.events.withColumn("stream_batch", batch), live.events)
    events = tables.read_table(spark, live.events)

    store = RuleStore(live.rules)
    store.apply(parse_rules(sample_rules_path().read_text()))
    rules = deciding_rules(store.in_force())
    signatures = list(rules_by_signature(rules))
    widest = max(r.window_ms for r in rules)
    counted = distinct_counted(rules)
    built = [
        (
            s.signature_id,
            json.dumps(s.to_json(), sort_keys=True),
            0,
            widest,
            s.signature_id in counted,
        )
        for s in signatures
    ]
    tables.overwrite_table(spark.createDataFrame(built, tables.SIGNATURE_SCHEMA), live.signatures)

    keyed = keyed_events(events, signatures)
    tables.create_if_missing(spark, live.buckets, tables.BUCKET_SCHEMA)

    def append_buckets(rows: DataFrame) -> None:
        rows.write.format("delta").mode("append").save(str(live.buckets))

    first = keyed.where(F.col("eventTime") < second_batch)
    append_buckets(bucket_aggregates(first, width_ms, counted))
    hours = hour_buckets(minute_buckets(tables.read_table(spark, live.buckets), width_ms), width_ms)
    tables.overwrite_table(hours.localCheckpoint(), live.buckets)
    second = keyed.where(F.col("eventTime") >= second_batch)
    # As the stream writes them: a row per bucket and batch, beside the compacted hours.
    append_buckets(bucket_aggregates(second.where(F.col("eventTime") % 2 == 0), width_ms, counted))
    append_buckets(bucket_aggregates(second.where(F.col("eventTime") % 2 == 1), width_ms, counted))

    alerts = evaluate_alerts(keyed, rules, width_ms, 1_800_000_000_000, 2)
    tables.overwrite_table(alerts, live.alerts)
    stored = tables.read_table(spark, live.buckets)
    assert stored.where(F.col("parts").isNotNull()).count() > 0, "compacted hours"
    assert stored.where(F.col("parts").isNull()).count() > 0, "g-wide rows next to them"
    assert tables.read_table(spark, live.alerts).where(F.col("ruleId") == 4).count() > 0
    return settings.data_dir / "tables"


@pytest.fixture
def live_copy(live_tables: Path, data_settings: Settings) -> Settings:
    """``data_settings`` whose live tables are a private copy of ``live_tables``."""
    shutil.copytree(live_tables, data_settings.data_dir / "tables")
    return data_settings


def _delta(spark, path: Path):
    from delta.tables import DeltaTable

    return DeltaTable.forPath(spark, str(path))


def test_cli_passes_on_consistent_tables_and_keeps_the_results(
    spark, live_copy: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    for name, value in {
        "VELOCITY_DATA_DIR": str(live_copy.data_dir),
        "VELOCITY_REDIS_URL": live_copy.redis_url,
        "VELOCITY_SPARK_MASTER": live_copy.spark_master,
        "VELOCITY_SPARK_SHUFFLE_PARTITIONS": str(live_copy.spark_shuffle_partitions),
    }.items():
        monkeypatch.setenv(name, value)

    code = main(["quality", "check", "--run-id", "nightly-1"])
    out = capsys.readouterr().out.splitlines()

    assert code == 0, "\n".join(out)
    assert out == [
        "events: passed 9 of 9 expectations",
        "quarantine: passed 2 of 2 expectations",
        "buckets: passed 5 of 5 expectations",
        "alerts: passed 4 of 4 expectations",
        f"data quality passed (run nightly-1; results in {live_copy.data_dir}/quality/nightly-1)",
    ]
    results_path = live_copy.table_path(QUALITY_RESULTS)
    rows = tables.read_table(spark, results_path).where(F.col("run_id") == "nightly-1").collect()
    assert len(rows) == 20 and all(r["success"] for r in rows)
    rate = next(r for r in rows if r["expectation_type"] == "expect_column_max_to_be_between")
    assert 0 < json.loads(rate["observed_value_json"]) <= live_copy.quality_max_quarantine_rate
    for suite in ("events", "quarantine", "buckets", "alerts"):
        saved = live_copy.data_dir / "quality" / "nightly-1" / f"{suite}.json"
        result = json.loads(saved.read_text())
        assert result["success"] is True and result["suite_name"] == suite

    # The same run id again (a retried task) replaces that run's rows: no second copy.
    write_results(spark, live_copy, "nightly-1", [r.asDict() for r in rows[:3]])
    again = tables.read_table(spark, results_path).where(F.col("run_id") == "nightly-1")
    assert again.count() == 3


def test_planted_defects_fail_their_suites_and_the_summary_names_them(
    spark, live_copy: Settings
) -> None:
    live = LiveTables.of(live_copy)
    # Events: a repeated transactionId, a negative amount and an unknown paymentType, all
    # at eventTime -5 (so before any bucket the recount compares: the buckets stay right).
    # The largest valid amount must not be reported: a double calls it 10^18.
    rows = tables.read_table(spark, live.events).orderBy("transactionId").limit(3).collect()
    again, negative, edge = (dict(row.asDict(), eventTime=-5) for row in rows)
    negative.update(transactionId="tx-negative", paymentAmount=Decimal("-0.5"))
    edge.update(
        transactionId="tx-edge",
        paymentAmount=Decimal("999999999999999999.99999999"),
        paymentType="XXX",
    )
    planted = spark.createDataFrame([again, negative, edge], tables.LIVE_EVENT_SCHEMA)
    planted.write.format("delta").mode("append").save(str(live.events))
    # Buckets: one g-wide bucket counts an event too many.
    bucket = (
        tables.read_table(spark, live.buckets)
        .where(F.col("parts").isNull())
        .orderBy("signature_id", "key", "bucket_start")
        .first()
    )
    _delta(spark, live.buckets).update(
        (F.col("signature_id") == bucket["signature_id"])
        & (F.col("key") == bucket["key"])
        & (F.col("bucket_start") == bucket["bucket_start"])
        & F.col("parts").isNull(),
        {"event_count": F.col("event_count") + 1},
    )
    stored_count = (
        minute_buckets(tables.read_table(spark, live.buckets), live_copy.bucket_width_ms)
        .where(
            (F.col("signature_id") == bucket["signature_id"])
            & (F.col("key") == bucket["key"])
            & (F.col("bucket_start") == bucket["bucket_start"])
        )
        .first()["event_count"]
    )
    # A bucket of a key that never paid, inside the horizon, is reported; a stray partial
    # bucket far below the horizon (a very late event after eviction) is not.
    copies = [
        dict(bucket.asDict(), key='["nobody"]'),
        dict(bucket.asDict(), bucket_start=0),
    ]
    spark.createDataFrame(copies, tables.BUCKET_SCHEMA).write.format("delta").mode("append").save(
        str(live.buckets)
    )
    # Alerts: a COUNT > 5 alert (rule 4) whose recorded value is 5, which does not fire.
    alert = (
        tables.read_table(spark, live.alerts).where(F.col("ruleId") == 4).orderBy("alertId").first()
    )
    _delta(spark, live.alerts).update(
        F.col("alertId") == alert["alertId"], {"aggregateValue": F.lit("5")}
    )
    # Quarantine: 200 more quarantined lines, with a reason code nobody knows.
    quarantine = tables.read_table(spark, live.quarantine)
    extra = (
        quarantine.limit(1)
        .crossJoin(spark.range(200))
        .select(
            *[
                F.lit("bogus").alias(c) if c == "reason_code" else F.col(c)
                for c in quarantine.columns
            ]
        )
    )
    extra.write.format("delta").mode("append").save(str(live.quarantine))

    report = run_quality_checks(spark, live_copy)
    summary = format_summary(report)

    assert not report.success
    failed = {(o.suite, o.expectation_type, o.column) for s in report.suites for o in s.failures}
    assert failed == {
        ("events", "expect_column_values_to_be_unique", "transactionId"),
        ("events", "expect_column_values_to_be_between", "eventTime"),
        ("events", "expect_column_values_to_be_null", "amount_out_of_range"),
        ("events", "expect_column_values_to_be_in_set", "paymentType"),
        ("quarantine", "expect_column_max_to_be_between", "quarantine_rate"),
        ("quarantine", "expect_column_values_to_be_in_set", "reason_code"),
        ("buckets", "expect_column_values_to_be_null", "recount_mismatch"),
        ("alerts", "expect_column_values_to_be_null", "rule_violation"),
    }
    events = {o.column: o for o in report.suite("events").failures}
    assert set(events["transactionId"].unexpected_values) == {again["transactionId"]}
    assert events["amount_out_of_range"].unexpected_values == (
        "tx tx-negative: paymentAmount -0.50000000",
    )
    assert events["paymentType"].unexpected_values == ("XXX",)
    where = f"signature {bucket['signature_id']} key {{}} bucket {bucket['bucket_start']}: "
    assert set(report.suite("buckets").failures[0].unexpected_values) == {
        where.format(bucket["key"])
        + f"event_count stored {stored_count}, from events {stored_count - 1}",
        where.format('["nobody"]') + f"no such events (stored event_count {bucket['event_count']})",
    }
    assert report.suite("alerts").failures[0].unexpected_values == (
        f"ruleId 4 v1 tx {alert['transactionId']} ALERT: aggregateValue 5 > limit 5 does not hold",
    )
    quarantine_failures = {o.column: o for o in report.suite("quarantine").failures}
    rate = quarantine_failures["quarantine_rate"].observed
    assert isinstance(rate, float) and rate > live_copy.quality_max_quarantine_rate
    assert quarantine_failures["reason_code"].unexpected_values[0] == "bogus"
    for text in (
        "events: FAILED, passed 5 of 9 expectations",
        "quarantine: FAILED, passed 0 of 2 expectations",
        "buckets: FAILED, passed 4 of 5 expectations",
        "alerts: FAILED, passed 3 of 4 expectations",
        "  FAILED expect_column_max_to_be_between(quarantine_rate)",
        "    expected: max >= 0 and <= 0.05",
        "  FAILED expect_column_values_to_be_null(recount_mismatch)",
        "  FAILED expect_column_values_to_be_null(rule_violation)",
        f"data quality FAILED (run {report.run_id}; results in {report.results_dir})",
    ):
        assert text in summary.splitlines(), text

    # Kept although the run failed: one row per expectation, and GX's full JSON per suite.
    kept = (
        tables.read_table(spark, live_copy.table_path(QUALITY_RESULTS))
        .where(F.col("run_id") == report.run_id)
        .collect()
    )
    assert len(kept) == 20
    assert sum(not r["success"] for r in kept) == len(failed)
    saved = json.loads((Path(report.results_dir or "") / "buckets.json").read_text())
    assert saved["success"] is False and saved["suite_name"] == "buckets"
