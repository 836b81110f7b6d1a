"""The stream on a real Kafka broker: payments from a topic, alerts to a topic.

Each test has topics of its own on the session's broker (``kafka_bootstrap``); the broker
restart test runs a broker of its own.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from tests.builders import generated_in_arrival_order
from tests.conftest import FAST_JVM, free_port_pair, poll_until
from tests.integration.test_stream_crash import VELOCITY, kill_mid_batch
from velocity.delta import tables
from velocity.delta.live import LiveTables
from velocity.domain.rules import Rule, parse_rules
from velocity.generate import GenerateOptions
from velocity.kafka.broker import kafka_down, kafka_up
from velocity.kafka.topics import EventProducer, ensure_topics
from velocity.operating.health import stream_health
from velocity.operating.stream_control import KafkaSource, StreamStatus, check_health
from velocity.operating.stream_metrics import kafka_lag
from velocity.resources import sample_rules_path
from velocity.settings import Settings
from velocity.spark.backtest import run_backtest
from velocity.spark.stream import StreamJob

pytestmark = [pytest.mark.spark, pytest.mark.redis, pytest.mark.kafka]

SAMPLE = parse_rules(sample_rules_path().read_text())
RULES = [r.with_version(1) for r in SAMPLE if isinstance(r, Rule)]
OUTCOMES = {r.rule_id: r.outcome.value for r in RULES}


def on_topics(settings: Settings, bootstrap: str, partitions: int = 4, **more: Any) -> Settings:
    """``settings`` with new events and alerts topics of their own on ``bootstrap``."""
    name = f"events-{uuid.uuid4().hex[:10]}"
    topical = settings.model_copy(
        update={
            "kafka_bootstrap": bootstrap,
            "kafka_events_topic": name,
            "kafka_alerts_topic": f"{name}.alerts",
            "kafka_partitions": partitions,
            **more,
        }
    )
    ensure_topics(topical)
    return topical


def produce_files(settings: Settings, folder: Path) -> int:
    """Every line of the folder's files, in file order, keyed by payerId."""
    producer = EventProducer(settings)
    for path in sorted(folder.glob("*.jsonl")):
        producer.send(path.read_text().splitlines())
    producer.close()
    return producer.sent


def topic_messages(bootstrap: str, topic: str) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """(partition, offset, key, value) of every message in ``topic``."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}",
         "enable.auto.commit": False, "auto.offset.reset": "earliest"}
    )  # fmt: skip
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in partitions}  # fmt: skip
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        out = []
        deadline = time.monotonic() + 60
        while sum(1 for _ in out) < sum(ends.values()) and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=1):
                if message.error() is None:
                    out.append((message.partition(), message.offset(), message.key(),
                                message.value()))  # fmt: skip
        return sorted(out)
    finally:
        consumer.close()


def run_kafka_available_now(job: StreamJob, settings: Settings) -> list[dict[str, Any]]:
    """The topic read to its end; returns each micro-batch's (start, end) offsets by
    partition, its lag (``velocity.operating.stream_metrics.kafka_lag`` of its progress) and its
    progress (as JSON), for the batches that had messages."""
    source = KafkaSource(settings.kafka_bootstrap, settings.kafka_events_topic)
    query = job.start(source, available_now=True)
    try:
        query.awaitTermination()
    finally:
        query.stop()
    ranges = []
    for progress in query.recentProgress:
        if progress["numInputRows"] == 0:
            continue
        figures = json.loads(progress.json)
        (read,) = figures["sources"]
        topic = settings.kafka_events_topic
        start = read["startOffset"] or {}  # None before the first batch
        ranges.append(
            {"start": start.get(topic, {}), "end": read["endOffset"][topic],
             "lag": kafka_lag(figures), "progress": figures}
        )  # fmt: skip
    return ranges


def alert_ids_on_topic(settings: Settings) -> list[str]:
    """The alertIds of every message on the alerts topic (repeats kept); each message's key
    is its alertId."""
    ids = []
    for _, _, key, value in topic_messages(settings.kafka_bootstrap, settings.kafka_alerts_topic):
        assert value is not None and key is not None
        record = json.loads(value)
        assert key.decode() == record["alertId"]
        assert record["outcome"] == OUTCOMES[record["ruleId"]], "its rule's (SPEC §4)"
        ids.append(record["alertId"])
    return ids


def delta_alerts(spark, settings: Settings) -> dict[tuple[int, str], tuple[str, int, str]]:
    rows = tables.read_table(spark, LiveTables.of(settings).alerts).collect()
    return {(r["ruleId"], r["transactionId"]):
            (r["aggregateValue"], r["windowStart"], r["alertId"], r["suppressedBy"])
            for r in rows}  # fmt: skip


def backtest_alerts(spark, settings: Settings, events: Path, out: Path):
    bt = settings.model_copy(update={"data_dir": settings.data_dir / "bt"})
    run_backtest(spark, bt, RULES, str(events), out)
    alerts = [json.loads(line) for line in out.read_text().splitlines()]
    return {(a["ruleId"], a["transactionId"]):
            (a["aggregateValue"], a["windowStart"], a["alertId"], a.get("suppressedBy"))
            for a in alerts}  # fmt: skip


@pytest.fixture(scope="module")
def in_order_events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Per-key strictly increasing eventTimes, with duplicates and malformed lines.

    Strictly: SPEC §3's stream equals the complete-data result when each key's events
    arrive in increasing eventTime order, and a burst's equal eventTimes split between two
    micro-batches (Kafka batches end at any offset) would not (the first cannot count the
    second; the backtest does). No bursts, then; the sample's COUNT rules fire anyway."""
    return generated_in_arrival_order(
        tmp_path_factory.mktemp("kafka-events"),
        GenerateOptions(
            events=1600, rate=2.0, payers=25, files=4, spike_fraction=0.0, late_fraction=0.0,
            duplicate_fraction=0.02, malformed_fraction=0.02, seed=31,
        ),
    )  # fmt: skip


Alerts = dict[tuple[int, str], tuple[str, int, str]]


@pytest.fixture(scope="module")
def in_order_backtest(
    spark, spark_settings: Settings, in_order_events: Path, tmp_path_factory: pytest.TempPathFactory
) -> Alerts:
    """The backtest over ``in_order_events`` in file order (on one partition, the arrival
    order): the reference of the one-partition tests, computed once."""
    base = tmp_path_factory.mktemp("kafka-backtest")
    settings = spark_settings.model_copy(update={"data_dir": base})
    return backtest_alerts(spark, settings, in_order_events, base / "bt.jsonl")


def test_stream_from_kafka_equals_the_backtest_in_its_arrival_order(
    spark, data_settings: Settings, kafka_bootstrap: str, in_order_events: Path, tmp_path: Path
) -> None:
    settings = on_topics(data_settings, kafka_bootstrap, kafka_max_offsets_per_trigger=450)
    produced = produce_files(settings, in_order_events)
    job = StreamJob(spark, settings)
    job.rule_store.apply(SAMPLE)

    ranges = run_kafka_available_now(job, settings)
    assert len(ranges) >= 3, "several micro-batches"
    messages = topic_messages(settings.kafka_bootstrap, settings.kafka_events_topic)
    assert len(messages) == produced

    # Every message was there before the start: after each batch, the lag of a partition
    # (the metrics' figure from Spark's progress) is what it holds past the batch's end.
    ends: dict[str, int] = {}
    for partition, offset, _, _ in messages:
        ends[str(partition)] = max(ends.get(str(partition), 0), offset + 1)
    for batch in ranges:
        assert batch["lag"] == {
            (settings.kafka_events_topic, p): ends.get(p, 0) - end
            for p, end in batch["end"].items()
        }
    assert sum(ranges[0]["lag"].values()) > 0 and set(ranges[-1]["lag"].values()) == {0}
    # The status file (`velocity stream-status`) states that lag, not "? files waiting":
    # the messages behind over all partitions, and the most in one as Spark's Kafka source
    # reports it in its own progress metrics.
    status = StreamStatus(tmp_path / "status", KafkaSource(kafka_bootstrap, "t"), 1)
    status.running("q", "r")
    for batch in ranges:
        status.progress(batch["progress"])
        now = status.snapshot()
        (source,) = batch["progress"]["sources"]
        assert now["offsetsBehindLatest"] == sum(batch["lag"].values())
        assert now["maxOffsetsBehindLatest"] == float(source["metrics"]["maxOffsetsBehindLatest"])
        health = stream_health(now, now["updatedAt"], 60_000)
        assert health.reason.endswith(
            f", {now['offsetsBehindLatest']} messages behind the topic's latest offsets"
            + (f", at most {now['maxOffsetsBehindLatest']} in one partition"
               if now["offsetsBehindLatest"] else "")
        ), health.reason  # fmt: skip
    assert status.snapshot()["offsetsBehindLatest"] == 0
    read = [
        sample.value
        for family in text_string_to_metric_families(job.metrics.render().decode())
        for sample in family.samples
        if sample.name == "velocity_events_read_total"
    ]
    assert read == [produced], "every message is a line read"

    # The reference: the backtest over the messages in the stream's arrival order, one
    # file a micro-batch, each ordered by (partition, offset) as SPEC's Kafka arrival says.
    arrived = tmp_path / "arrived"
    arrived.mkdir()
    for index, batch in enumerate(ranges):
        lines = [
            value.decode()
            for partition, offset, _, value in sorted(messages, key=lambda m: (str(m[0]), m[1]))
            if value is not None
            and batch["start"].get(str(partition), 0) <= offset < batch["end"][str(partition)]
        ]
        (arrived / f"batch-{index:04d}.jsonl").write_text("\n".join(lines) + "\n")
        os.utime(arrived / f"batch-{index:04d}.jsonl", (1_700_000_000 + index,) * 2)
    expected = backtest_alerts(spark, settings, arrived, tmp_path / "bt.jsonl")
    streamed = delta_alerts(spark, settings)
    # Messages are keyed by payer, so a payer's events arrive in eventTime order and the
    # rules grouped by payerId equal the complete-data result (SPEC §3). A beneficiary's
    # events come from many payers, so many partitions: out of order across micro-batches
    # (the one-partition tests below compare every rule).
    by_payer = {r.rule_id for r in RULES if "payerId" in r.grouping_keys}
    assert by_payer == {1, 2, 3, 4, 5, 6, 7}
    assert {k: v for k, v in streamed.items() if k[0] in by_payer} == {
        k: v for k, v in expected.items() if k[0] in by_payer
    }
    assert streamed

    # Every alert is on the alerts topic, keyed by its alertId, and on the Redis stream.
    notified = sorted(a[2] for a in streamed.values() if a[3] is None)  # cooldowns: SPEC §3
    assert sorted(set(alert_ids_on_topic(settings))) == notified
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    assert client.xlen(settings.alert_stream) == len(notified)

    # A rerun reads nothing new and publishes nothing.
    published = len(alert_ids_on_topic(settings))
    assert run_kafka_available_now(job, settings) == []
    assert len(alert_ids_on_topic(settings)) == published


def test_messages_that_are_not_events_are_quarantined_with_their_offsets(
    spark, data_settings: Settings, kafka_bootstrap: str
) -> None:
    from confluent_kafka import Producer

    settings = on_topics(data_settings, kafka_bootstrap, partitions=1)
    topic = settings.kafka_events_topic
    event = {
        "transactionId": "tx-1", "eventTime": 1_700_000_000_000, "payerId": "p1",
        "beneficiaryId": "b1", "paymentAmount": 10.5, "paymentType": "CRD",
    }  # fmt: skip
    values: list[bytes | None] = [
        b"not json",
        None,
        b"",
        b"[1, 2]",
        json.dumps(event).encode(),
        b'{"transactionId": 1',
        b"\xff\xfe{}",
    ]
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for value in values:
        producer.produce(topic, value=value)
    assert producer.flush(30) == 0

    job = StreamJob(spark, settings)
    job.rule_store.apply(SAMPLE)
    assert len(run_kafka_available_now(job, settings)) == 1

    live = LiveTables.of(settings)
    quarantined = {
        r["source_block"]: r for r in tables.read_table(spark, live.quarantine).collect()
    }
    assert sorted(quarantined) == [0, 1, 2, 3, 5, 6], "every offset but the event's"
    assert {r["source_file"] for r in quarantined.values()} == {f"kafka://{topic}/0"}
    assert quarantined[0]["raw"] == "not json" and quarantined[0]["reason_code"] == "not_json"
    assert quarantined[1]["raw"] == "" and quarantined[1]["reason_code"] == "not_json"
    assert quarantined[3]["reason_code"] == "not_object"
    assert quarantined[6]["raw"].endswith("{}"), "bytes that are not UTF-8 are kept as text"
    events = tables.read_table(spark, live.events).collect()
    assert [(e["transactionId"], e["source_file"], e["source_block"]) for e in events] == [
        ("tx-1", f"kafka://{topic}/0", 4)
    ]


def kafka_env(settings: Settings, **more: str) -> dict[str, str]:
    return {
        **os.environ,
        **FAST_JVM,
        "VELOCITY_DATA_DIR": str(settings.data_dir),
        "VELOCITY_REDIS_URL": settings.redis_url,
        "VELOCITY_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "VELOCITY_KAFKA_EVENTS_TOPIC": settings.kafka_events_topic,
        "VELOCITY_KAFKA_ALERTS_TOPIC": settings.kafka_alerts_topic,
        "VELOCITY_KAFKA_MAX_OFFSETS_PER_TRIGGER": str(settings.kafka_max_offsets_per_trigger),
        "VELOCITY_SPARK_MASTER": "local[2]",
        "VELOCITY_SPARK_SHUFFLE_PARTITIONS": "2",
        **more,
    }


def kafka_stream_command(*more: str) -> list[str]:
    return [VELOCITY, "stream", "--source", "kafka", "--rules", str(sample_rules_path()), *more]


def assert_nothing_lost_or_doubled(spark, settings: Settings, expected: Alerts):
    """Delta's alerts equal ``expected``, the backtest's over the files (one partition: file
    order is arrival order), the alerts topic holds each at least once, Redis exactly once."""
    streamed = delta_alerts(spark, settings)
    assert streamed and streamed == expected
    live = LiveTables.of(settings)
    stored = [r["transactionId"] for r in tables.read_table(spark, live.events).collect()]
    assert len(stored) == len(set(stored)), "no event stored twice"
    ids = sorted(a[2] for a in streamed.values() if a[3] is None)  # the notified ones
    assert sorted(set(alert_ids_on_topic(settings))) == ids
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    published = [json.loads(f["alert"])["alertId"] for _, f in client.xrange(settings.alert_stream)]
    assert sorted(published) == ids


def test_sigkill_mid_batch_then_restart_loses_and_doubles_nothing(
    spark,
    data_settings: Settings,
    kafka_bootstrap: str,
    in_order_events: Path,
    in_order_backtest: Alerts,
) -> None:
    # Batches of 250 of the 1 600 messages: a few past the second for the kill to land in.
    settings = on_topics(
        data_settings, kafka_bootstrap, partitions=1, kafka_max_offsets_per_trigger=250
    )
    produce_files(settings, in_order_events)
    env = kafka_env(settings)
    checkpoint = settings.data_dir / "checkpoints" / "stream"
    command = kafka_stream_command("--trigger", "available-now")

    killed = kill_mid_batch(command, env, checkpoint)
    assert not (checkpoint / "commits" / str(killed)).exists()
    finished = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr[-3000:]

    assert_nothing_lost_or_doubled(spark, settings, in_order_backtest)
    assert StreamJob(spark, settings).mirror.reconcile().clean


def caught_up(checkpoint: Path, settings: Settings, produced: int) -> bool:
    """Whether the stream committed a batch that ends at ``produced`` (one partition)."""
    commits = sorted((int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")), reverse=True)
    if not commits:
        return False
    offsets = (checkpoint / "offsets" / str(commits[0])).read_text().splitlines()[-1]
    return int(json.loads(offsets)[settings.kafka_events_topic]["0"]) >= produced


def test_a_broker_restart_while_the_stream_runs_loses_nothing(
    spark, data_settings: Settings, in_order_events: Path, in_order_backtest: Alerts, tmp_path: Path
) -> None:
    broker = data_settings.model_copy(
        update={
            "data_dir": tmp_path / "broker",
            "kafka_bootstrap": f"127.0.0.1:{free_port_pair()}",
        }
    )
    kafka_up(broker)
    stream = None
    try:
        settings = on_topics(
            data_settings, broker.kafka_bootstrap, partitions=1, kafka_max_offsets_per_trigger=500
        )
        files = sorted(in_order_events.glob("*.jsonl"))
        first, second = tmp_path / "first", tmp_path / "second"
        for folder, part in ((first, files[:2]), (second, files[2:])):
            folder.mkdir()
            for path in part:
                (folder / path.name).write_bytes(path.read_bytes())
        produced = produce_files(settings, first)
        checkpoint = settings.data_dir / "checkpoints" / "stream"
        log = tmp_path / "stream.log"  # a file: a pipe nobody reads would fill and block it
        stream = subprocess.Popen(
            kafka_stream_command("--duration", "600"),
            env=kafka_env(settings, VELOCITY_WRITE_BEHIND_SECONDS="2"),
            stdout=subprocess.DEVNULL, stderr=log.open("w"), start_new_session=True,
        )  # fmt: skip

        def wait_for(produced: int) -> None:
            deadline = time.monotonic() + 300
            while not caught_up(checkpoint, settings, produced):
                assert stream is not None and stream.poll() is None, "the stream ended"
                assert time.monotonic() < deadline, "the stream did not catch up in 300 s"
                time.sleep(0.5)

        wait_for(produced)
        assert kafka_down(broker)
        time.sleep(2)  # the stream polls a broker that is gone
        kafka_up(broker)
        produced += produce_files(settings, second)
        wait_for(produced)
        # Caught up, `velocity stream-status` says so in messages (the listener's status).
        level = poll_until(
            "no messages behind",
            lambda: (health := check_health(settings)).offsetsBehindLatest == 0 and health,
            60,
        )
        assert "0 messages behind the topic's latest offsets" in level.reason, level
        stop = subprocess.run(
            [VELOCITY, "stream-stop", "--wait", "120"], env=kafka_env(settings),
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert stream.wait(timeout=60) == 0, log.read_text()[-3000:]
        assert_nothing_lost_or_doubled(spark, settings, in_order_backtest)
    finally:
        if stream is not None and stream.poll() is None:
            os.killpg(stream.pid, signal.SIGKILL)
        kafka_down(broker)


@pytest.mark.timeout(180)
def test_a_data_dir_whose_cluster_id_starts_with_a_dash_formats_and_starts(
    data_settings: Settings, tmp_path: Path
) -> None:
    """One id in 64 starts with "-" (URL-safe base64); the storage tool once read it as an
    option and the broker never started. Ids made now never start so, but one stored by an
    older version must still work."""
    from velocity.kafka.topics import cluster_id_of

    broker = data_settings.model_copy(
        update={"data_dir": tmp_path / "broker", "kafka_bootstrap": f"127.0.0.1:{free_port_pair()}"}
    )
    home = tmp_path / "broker" / "kafka"
    home.mkdir(parents=True)
    stored = "-" + base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")[1:]
    (home / "cluster.id").write_text(stored + "\n")
    try:
        assert kafka_up(broker) is not None
        assert cluster_id_of(broker.kafka_bootstrap, timeout_seconds=10) == stored
    finally:
        kafka_down(broker)
