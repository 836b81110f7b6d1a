"""The stream's metrics without a server: counts from a batch's spooled rows, what a scrape
reads (parsed back with Prometheus's own text parser), the backlog from Spark's progress,
the write-behind delay."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from velocity.domain.schema import RejectReason
from velocity.operating.stream_metrics import (
    BATCH_SECONDS_BUCKETS,
    BatchCounts,
    RecentArrivals,
    RunTotals,
    StreamMetrics,
    batch_counts,
    kafka_lag,
)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(metrics: StreamMetrics) -> Samples:
    """Every sample of a scrape, by (name, sorted labels), as Prometheus would read it."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def spooled(
    accepted: int = 0,
    duplicates: int = 0,
    late: int = 0,
    reasons: tuple[str, ...] = (),
    alerts: tuple[tuple[int, str], ...] = (),
    out_of_order: int = 0,
    suppressed: tuple[bool, ...] = (),
) -> dict[str, pa.Table]:
    """A batch's spooled rows, reduced to the columns the counts read."""
    return {
        "events": pa.table({"transactionId": [f"tx-{i}" for i in range(accepted)]}),
        "duplicates": pa.table({"transactionId": [f"dup-{i}" for i in range(duplicates)]}),
        "late_events": pa.table(
            {
                "transactionId": [f"late-{i}" for i in range(late + out_of_order)],
                "reason": ["late"] * late + ["out_of_order"] * out_of_order,
            }
        ),
        "quarantine": pa.table({"reason_code": pa.array(reasons, pa.string())}),
        "alerts": pa.table(
            {
                "ruleId": pa.array([r for r, _ in alerts], pa.int64()),
                "kind": pa.array([k for _, k in alerts], pa.string()),
                # None: a row of an older Velocity (counted as notified)
                "suppressed": pa.array(
                    list(suppressed) + [None] * (len(alerts) - len(suppressed)), pa.bool_()
                ),
            }
        ),
        "buckets": pa.table({"key": pa.array([], pa.string())}),
    }


def kafka_progress(latest: Mapping[str, int], end: Mapping[str, int]) -> dict[str, Any]:
    """A micro-batch's progress as Spark writes it for a Kafka source (offsets by partition)."""
    return {
        "batchId": 4,
        "numInputRows": 9,
        "sources": [
            {
                "description": "KafkaV2[Subscribe[velocity.events]]",
                "startOffset": {"velocity.events": {"0": 0, "1": 0}},
                "endOffset": {"velocity.events": dict(end)},
                "latestOffset": {"velocity.events": dict(latest)},
                "numInputRows": 9,
                "metrics": {"maxOffsetsBehindLatest": "5"},
            }
        ],
    }


FOLDER_PROGRESS: dict[str, Any] = {
    "batchId": 2,
    "numInputRows": 50,
    "sources": [
        {
            "description": "FileStreamSource[file:/data/events]",
            "startOffset": {"logOffset": 1},
            "endOffset": {"logOffset": 2},
            "latestOffset": None,
            "numInputRows": 50,
        }
    ],
}


def test_batch_counts_are_the_spooled_tables_lengths_and_groups() -> None:
    rows = spooled(
        accepted=5,
        duplicates=2,
        late=1,
        reasons=("not_json", "wrong_type", "not_json"),
        alerts=((7, "ALERT"), (3, "ALERT"), (7, "ALERT")),
    )
    assert batch_counts(10, rows) == BatchCounts(
        lines=10,
        accepted=5,
        duplicates=2,
        late=1,
        quarantined={"not_json": 2, "wrong_type": 1},
        alerts={(7, "ALERT", False): 2, (3, "ALERT", False): 1},
    )
    assert batch_counts(0, spooled()) == BatchCounts(0, 0, 0, 0, {}, {})


def test_a_scrape_adds_up_the_batches() -> None:
    metrics = StreamMetrics(clock=lambda: 1_800_000_000.0)
    first = batch_counts(6, spooled(3, 1, 0, ("not_json", "not_json"), ((1, "ALERT"),)))
    second = batch_counts(
        4,
        spooled(
            3,
            0,
            2,
            ("unknown_enum",),
            ((1, "ALERT"), (2, "ALERT"), (2, "ALERT")),
            out_of_order=1,
            suppressed=(False, False, True),
        ),
    )
    metrics.batch_done(0, 0.3, first, redis_commit_seconds=0.002)
    metrics.batch_done(1, 12.0, second, redis_commit_seconds=0.2)
    samples = scrape(metrics)

    assert value(samples, "velocity_events_read_total") == 10
    assert value(samples, "velocity_events_accepted_total") == 6
    assert value(samples, "velocity_events_duplicate_total") == 1
    assert value(samples, "velocity_events_late_total", reason="late") == 2
    assert value(samples, "velocity_events_late_total", reason="out_of_order") == 1
    assert metrics.recent_arrivals() == RecentArrivals(
        batches=2, accepted=6, late=2, out_of_order=1
    )
    quarantined = {
        reason.value: value(samples, "velocity_events_quarantined_total", reason=reason.value)
        for reason in RejectReason
    }
    # Every reason is there from the start (at 0), so a first quarantined line shows as a rate.
    assert quarantined == {r.value: 0 for r in RejectReason} | {"not_json": 2, "unknown_enum": 1}

    def alerts(rule_id: str, suppressed: str) -> float | None:
        return value(
            samples, "velocity_alerts_total", rule_id=rule_id, kind="ALERT", suppressed=suppressed
        )

    assert alerts("1", "false") == 2 and alerts("1", "true") is None
    assert alerts("2", "false") == 1 and alerts("2", "true") == 1

    assert value(samples, "velocity_batch_duration_seconds_count") == 2
    assert value(samples, "velocity_batch_duration_seconds_sum") == 12.3
    by_bound = {
        bound: value(samples, "velocity_batch_duration_seconds_bucket", le=str(bound))
        for bound in BATCH_SECONDS_BUCKETS
    }
    assert by_bound[0.25] == 0 and by_bound[0.5] == 1 and by_bound[10.0] == 1
    assert by_bound[30.0] == 2 and by_bound[60.0] == 2
    assert value(samples, "velocity_redis_commit_seconds_count") == 2
    assert value(samples, "velocity_redis_commit_seconds_bucket", le="0.005") == 1
    assert value(samples, "velocity_committed_batch_id") == 1
    assert value(samples, "velocity_heartbeat_timestamp_seconds") == 1_800_000_000.0


def test_a_replayed_batch_counts_only_its_duration() -> None:
    metrics = StreamMetrics()
    metrics.batch_done(8, 0.1, None)
    samples = scrape(metrics)
    assert value(samples, "velocity_batch_duration_seconds_count") == 1
    assert value(samples, "velocity_redis_commit_seconds_count") == 0
    assert value(samples, "velocity_committed_batch_id") == 8
    assert value(samples, "velocity_events_read_total") == 0
    assert not any(name == "velocity_alerts_total" for name, _ in samples)


def test_gauges_of_the_moment_appear_once_known() -> None:
    samples = scrape(StreamMetrics())
    for name in (
        "velocity_backlog_files",
        "velocity_kafka_lag_messages",
        "velocity_write_behind_delay_seconds",
        "velocity_committed_batch_id",
        "velocity_heartbeat_timestamp_seconds",
    ):
        assert not any(sample == name for sample, _ in samples), name
    # Counters are there at 0, and the process's own figures.
    assert value(samples, "velocity_events_read_total") == 0
    assert value(samples, "process_cpu_seconds_total") is not None


def test_kafka_lag_is_each_partitions_latest_offset_past_the_batch_end() -> None:
    progress = kafka_progress(latest={"0": 120, "1": 40}, end={"0": 100, "1": 40})
    assert kafka_lag(progress) == {("velocity.events", "0"): 20, ("velocity.events", "1"): 0}
    assert kafka_lag(FOLDER_PROGRESS) is None
    assert kafka_lag({"sources": []}) is None


def test_the_backlog_follows_progress_and_idle_events() -> None:
    clock = iter([10.0, 20.0, 30.0, 40.0])
    metrics = StreamMetrics(clock=lambda: next(clock))

    metrics.source_progress(kafka_progress(latest={"0": 9, "1": 7}, end={"0": 4, "1": 7}), None)
    samples = scrape(metrics)
    topic = "velocity.events"
    assert value(samples, "velocity_kafka_lag_messages", topic=topic, partition="0") == 5
    assert value(samples, "velocity_kafka_lag_messages", topic=topic, partition="1") == 0
    assert value(samples, "velocity_heartbeat_timestamp_seconds") == 10.0
    assert value(samples, "velocity_backlog_files") is None

    # Idle: Spark found nothing new in the topic, so nothing is behind.
    metrics.source_progress(None, None)
    samples = scrape(metrics)
    assert value(samples, "velocity_kafka_lag_messages", topic=topic, partition="0") == 0
    assert value(samples, "velocity_heartbeat_timestamp_seconds") == 20.0

    folder = StreamMetrics(clock=lambda: next(clock))
    folder.source_progress(FOLDER_PROGRESS, 3)
    samples = scrape(folder)
    assert value(samples, "velocity_backlog_files") == 3
    assert not any(name == "velocity_kafka_lag_messages" for name, _ in samples)
    folder.source_progress(None, 0)
    assert value(scrape(folder), "velocity_backlog_files") == 0


def test_the_write_behind_delay_is_the_oldest_spooled_batch_age_at_the_scrape() -> None:
    now = [1000.0]
    oldest: list[float | None] = [None]
    metrics = StreamMetrics(clock=lambda: now[0])
    metrics.follow_spool(lambda: oldest[0])
    assert value(scrape(metrics), "velocity_write_behind_delay_seconds") == 0
    oldest[0] = 990.0
    assert value(scrape(metrics), "velocity_write_behind_delay_seconds") == 10
    now[0] = 1012.5  # read when scraped, not when a batch ended
    assert value(scrape(metrics), "velocity_write_behind_delay_seconds") == 22.5


def test_the_stream_names_its_source_and_data_dir() -> None:
    metrics = StreamMetrics()
    metrics.stream_info("kafka://127.0.0.1:9392/velocity.events", "/var/lib/velocity")
    labels = {"source": "kafka://127.0.0.1:9392/velocity.events", "data_dir": "/var/lib/velocity"}
    assert value(scrape(metrics), "velocity_stream_info", **labels) == 1


@pytest.mark.timeout(30)
def test_the_run_totals_are_what_the_metrics_count_past_sparks_recent_progress() -> None:
    """The closing line once summed Spark's recentProgress, which keeps the last 100
    batches: "99 batches, 13950 lines read" after a run of 1 469 batches."""
    metrics = StreamMetrics()
    assert metrics.run_totals() == RunTotals(0, 0, None)
    assert metrics.run_totals().text() == "no micro-batch this run, 0 lines read"
    metrics.batch_done(1_319, 0.1, None)  # a replay Redis had committed: no lines counted
    for batch in range(1_320, 1_470):  # 150 batches, more than Spark keeps
        metrics.batch_done(batch, 0.1, batch_counts(7, spooled(accepted=7)))
    totals = metrics.run_totals()
    samples = scrape(metrics)
    assert totals == RunTotals(batches=151, lines=1_050, last_batch=1_469)
    assert totals.batches == value(samples, "velocity_batch_duration_seconds_count")
    assert totals.lines == value(samples, "velocity_events_read_total")
    assert totals.last_batch == value(samples, "velocity_committed_batch_id")
    assert totals.text() == "151 micro-batches this run (the last is batch 1469), 1050 lines read"
