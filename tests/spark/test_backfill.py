"""The backfill on real Spark + Delta + Redis: after it, the effective alerts of a stream
that saw late events equal the complete-data result (SPEC §3), and a rerun amends nothing."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.builders import generated_in_arrival_order
from velocity.cli import sample_rules_path
from velocity.delta import tables
from velocity.delta.live import LiveTables
from velocity.errors import UsageError
from velocity.generate import GenerateOptions
from velocity.rules import Rule, parse_rules
from velocity.settings import Settings
from velocity.spark.backfill import Backfill
from velocity.spark.backtest import run_backtest
from velocity.spark.stream import StreamJob

pytestmark = pytest.mark.spark


def effective_alerts(spark, settings: Settings) -> dict[tuple[int, str], int]:
    """ALERT + CORRECTION − RETRACTION per (rule, transaction), zeros left out."""
    net: Counter[tuple[int, str]] = Counter()
    for row in tables.read_table(spark, LiveTables.of(settings).alerts).collect():
        net[(row["ruleId"], row["transactionId"])] += -1 if row["kind"] == "RETRACTION" else 1
    return {pair: n for pair, n in net.items() if n}


@pytest.fixture(scope="module")
def late_events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Events with late arrivals (10–60 min behind), duplicates and malformed lines."""
    folder = tmp_path_factory.mktemp("backfill-events")
    return generated_in_arrival_order(
        folder,
        GenerateOptions(
            events=2400,
            rate=0.5,
            payers=20,
            files=6,
            spike_fraction=0.05,
            late_fraction=0.04,
            duplicate_fraction=0.02,
            malformed_fraction=0.01,
            seed=33,
        ),
    )


def test_backfill_makes_the_stream_equal_the_complete_data_result(
    spark, data_settings: Settings, late_events: Path, tmp_path: Path
) -> None:
    sample = parse_rules(sample_rules_path().read_text())
    job = StreamJob(spark, data_settings)
    job.rule_store.apply(sample)
    query = job.start(late_events, available_now=True, max_files_per_trigger=1)
    try:
        query.awaitTermination()
    finally:
        query.stop()

    rules = [r.with_version(1) for r in sample if isinstance(r, Rule)]
    backtest_settings = data_settings.model_copy(update={"data_dir": tmp_path / "bt"})
    out = tmp_path / "bt.jsonl"
    run_backtest(spark, backtest_settings, rules, str(late_events), out)
    complete = {
        (a["ruleId"], a["transactionId"]): a for a in map(json.loads, out.read_text().splitlines())
    }
    live = LiveTables.of(data_settings)
    assert tables.read_table(spark, live.late_events).count() > 0
    before = effective_alerts(spark, data_settings)
    assert set(before) != set(complete), "late events must make the stream differ"

    backfill = Backfill(spark, data_settings)
    pending = backfill.pending_late_range()
    assert pending is not None
    from_ms, to_ms, through = pending
    summary = backfill.run(from_ms, to_ms, late_through_batch=through)
    assert summary.corrections + summary.retractions > 0
    assert summary.buckets_rebuilt > 0

    after = effective_alerts(spark, data_settings)
    assert set(after) == set(complete)
    assert all(n == 1 for n in after.values()), "each decision in effect exactly once"
    amendments = [
        r.asDict()
        for r in tables.read_table(spark, live.alerts).where("kind != 'ALERT'").collect()
    ]
    assert len(amendments) == summary.corrections + summary.retractions
    for amendment in amendments:
        if amendment["kind"] == "CORRECTION":
            expected = complete[(amendment["ruleId"], amendment["transactionId"])]
            assert amendment["aggregateValue"] == expected["aggregateValue"]
            assert amendment["windowStart"] == expected["windowStart"]

    # Published once to the Redis alert stream, marked as a backfill's.
    entries = job.redis.xrange(data_settings.redis_alert_stream)
    published = [json.loads(f["alert"]) for _, f in entries if f.get("backfill") == "1"]
    assert sorted(a["alertId"] for a in published) == sorted(a["alertId"] for a in amendments)

    # Covered: nothing pending, and a rerun of the same range amends nothing.
    assert backfill.pending_late_range() is None
    again = backfill.run(from_ms, to_ms)
    assert (again.corrections, again.retractions, again.republished) == (0, 0, 0)
    assert effective_alerts(spark, data_settings) == after


def test_backfill_rejects_a_bad_range_and_unknown_rules(spark, data_settings: Settings) -> None:
    backfill = Backfill(spark, data_settings)
    backfill.state.rule_store.apply(parse_rules(sample_rules_path().read_text()))
    with pytest.raises(UsageError, match="not a time range"):
        backfill.run(10, 5)
    with pytest.raises(UsageError, match=r"\[99\]"):
        backfill.run(0, 5, rule_ids=[1, 99])
