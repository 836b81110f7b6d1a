"""Out-of-order arrivals on real Spark + Delta + Redis (SPEC §3): a source that reads one
partition behind another leaves the stream's alerts wrong for the rules keyed by anything
but the partition's key; the stream records those events (reason ``out_of_order``), and
`backfill --late` then makes the alerts in effect equal the complete-data result, values
included, for any arrival order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.builders import (
    lagging_reads,
    landed_in_order,
    payer_partitions,
    rule_obj,
    two_groups_one_chunk_apart,
)
from tests.spark.streaming import run_available_now
from tests.spark.test_backfill import complete_data as backtest_of
from tests.spark.test_backfill import in_effect as records_in_effect
from velocity.delta import tables
from velocity.delta.live import LiveTables
from velocity.domain.rules import parse_rules
from velocity.generate import GenerateOptions, generate_events
from velocity.settings import Settings
from velocity.spark.backfill import Backfill
from velocity.spark.stream import StreamJob

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
DAY_S = 86_400
# The project's rules that fire on most events (keyed by payer, beneficiary, device and
# the three-valued action), and one keyed by paymentType.
RULES = [
    *json.loads((ROOT / "benchmarks" / "rules" / "fire_often.json").read_text()),
    rule_obj(ruleId=109, groupingKeyNames=["paymentType"], aggregatorFunctionType="COUNT",
             limitOperatorType=">", limit=40, windowMinutes=10, filter=None),
]  # fmt: skip

Decisions = dict[tuple[int, str], tuple[str, int]]  # (ruleId, tx) -> (value, windowStart)


def in_order_lines(folder: Path, events: int, payers: int, seed: int) -> list[str]:
    """Generated events in eventTime order (nothing late, duplicated or malformed)."""
    generate_events(
        folder,
        GenerateOptions(events=events, rate=0.2, payers=payers, files=1, spike_fraction=0.05,
                        late_fraction=0.0, duplicate_fraction=0.0, malformed_fraction=0.0,
                        seed=seed),
    )  # fmt: skip
    return [line for p in sorted(folder.glob("*.jsonl")) for line in p.read_text().splitlines()]


def complete_data(spark, settings: Settings, events: Path, work: Path) -> Decisions:
    """The backtest of ``RULES`` over ``events`` (``test_backfill.complete_data``)."""
    return backtest_of(spark, settings, events, work, json.dumps(RULES))


def in_effect(spark, settings: Settings) -> Decisions:
    """(value, windowStart) of each decision in effect (``test_backfill.in_effect``)."""
    return {
        decision: (record["aggregateValue"], record["windowStart"])
        for decision, record in records_in_effect(spark, settings).items()
    }


def recorded_reasons(spark, settings: Settings) -> dict[str, int]:
    rows = tables.read_table(spark, LiveTables.of(settings).late_events)
    return {r["reason"]: r["count"] for r in rows.groupBy("reason").count().collect()}


def stream(spark, settings: Settings, events: Path) -> StreamJob:
    """``RULES`` applied, then streamed over ``events``, one file a micro-batch."""
    job = StreamJob(spark, settings)
    job.rule_store.apply(parse_rules(json.dumps(RULES)))
    run_available_now(job, events)
    return job


def backfilled_late_equals_complete(spark, settings: Settings, complete: Decisions) -> int:
    """`backfill --late`, then: the alerts in effect equal ``complete``, values included,
    and a second `--late` finds nothing to cover (a rerun of a range amends nothing:
    ``test_backfill``). Returns the out-of-order events the run covered."""
    backfill = Backfill(spark, settings)
    summary = backfill.run_late()
    assert summary is not None and summary.from_ms is not None and summary.to_ms is not None
    assert summary.late_events == 0, "a day's lateness: nothing is late, only out of order"
    assert in_effect(spark, settings) == complete
    assert backfill.run_late() is None, "a second --late finds nothing to cover"
    assert summary.out_of_order_events is not None
    return summary.out_of_order_events


@pytest.mark.timeout(600)
def test_a_source_one_chunk_behind_for_half_the_payers_is_made_whole_by_backfill_late(
    spark, data_settings: Settings, tmp_path: Path
) -> None:
    """The issue's lagging source: payers in two groups, each file holding one group's
    events of chunk i and the other's of chunk i − 1 (every payer in order), 500-event
    chunks, lateness a day so nothing is late."""
    settings_ = data_settings.model_copy(update={"allowed_lateness_seconds": DAY_S})
    lines = in_order_lines(tmp_path / "generated", 2000, 40, seed=38)
    events = landed_in_order(tmp_path / "events", two_groups_one_chunk_apart(lines, 500))
    stream(spark, settings_, events)
    complete = complete_data(spark, settings_, events, tmp_path)
    streamed = in_effect(spark, settings_)
    assert set(complete) - set(streamed), "the lag must hide some alerts from the stream"
    reasons = recorded_reasons(spark, settings_)
    assert set(reasons) == {"out_of_order"} and reasons["out_of_order"] > 0

    covered = backfilled_late_equals_complete(spark, settings_, complete)
    assert covered == reasons["out_of_order"]


@pytest.mark.timeout(900)
@settings(
    max_examples=2,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 10_000),
    reads=st.lists(st.tuples(st.integers(40, 150), st.integers(0, 3)), min_size=2, max_size=4),
)
def test_any_interleaving_of_payer_ordered_partitions_is_made_whole_by_backfill_late(
    spark, data_settings: Settings, tmp_path_factory: pytest.TempPathFactory, seed: int,
    reads: list[tuple[int, int]],
) -> None:  # fmt: skip
    """Random per-payer-ordered streams in two to four partitions, each read at its own
    pace (events a batch) after its own pause (batches): after `backfill --late` the
    alerts in effect equal the backtest's, values included."""
    import redis

    work = tmp_path_factory.mktemp("interleaved")
    redis.Redis.from_url(data_settings.redis_url).flushall()
    # Small batches decided in the driver's process, as the stream does by default: the
    # same kernel as in the executors (the tests above), without a Spark job a batch.
    settings_ = data_settings.model_copy(
        update={
            "data_dir": work / "data",
            "allowed_lateness_seconds": DAY_S,
            "stream_executor_min_rows": Settings.model_fields["stream_executor_min_rows"].default,
        }
    )
    lines = in_order_lines(work / "generated", 500, 12, seed)
    parts = payer_partitions(lines, len(reads))
    batches = lagging_reads(parts, [pace for pace, _ in reads], [pause for _, pause in reads])
    events = landed_in_order(work / "events", batches)
    stream(spark, settings_, events)
    complete = complete_data(spark, settings_, events, work)
    if not recorded_reasons(spark, settings_):
        assert in_effect(spark, settings_) == complete, "nothing out of order: already equal"
        return
    backfilled_late_equals_complete(spark, settings_, complete)


@pytest.mark.kafka
@pytest.mark.timeout(600)
def test_a_kafka_partition_paused_for_a_few_batches_is_made_whole_by_backfill_late(
    spark, data_settings: Settings, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Four partitions keyed by payer; one is produced only after the stream has read the
    others for a few micro-batches (a paused partition, then its catch-up): end to end on
    a real broker, `backfill --late` leaves the alerts in effect equal to the backtest."""
    from tests.spark.test_kafka import on_topics, run_kafka_available_now
    from velocity.kafka.topics import TopicWriter, payer_key

    settings_ = on_topics(
        data_settings.model_copy(update={"allowed_lateness_seconds": DAY_S}),
        kafka_bootstrap,
        partitions=4,
        kafka_max_offsets_per_trigger=200,
    )
    lines = in_order_lines(tmp_path / "generated", 1000, 25, seed=4)
    parts = payer_partitions(lines, 4)
    sink = TopicWriter(settings_, settings_.kafka_events_topic)

    def produce(partition: int, part: list[str]) -> None:
        for line in part:
            sink.send(line, payer_key(line), partition)
        sink.flush()

    job = StreamJob(spark, settings_)
    job.rule_store.apply(parse_rules(json.dumps(RULES)))
    cut = [len(part) * 2 // 3 for part in parts]
    for partition in (0, 1, 2):
        produce(partition, parts[partition][: cut[partition]])
    assert len(run_kafka_available_now(job, settings_)) >= 3, "partition 3 paused a while"
    produce(3, parts[3])
    for partition in (0, 1, 2):
        produce(partition, parts[partition][cut[partition] :])
    run_kafka_available_now(job, settings_)

    everything = landed_in_order(tmp_path / "all", [lines])
    complete = complete_data(spark, settings_, everything, tmp_path)
    assert in_effect(spark, settings_) != complete, "the paused partition's payers lagged"
    reasons = recorded_reasons(spark, settings_)
    assert set(reasons) == {"out_of_order"}
    assert backfilled_late_equals_complete(spark, settings_, complete) == reasons["out_of_order"]
