"""The pure part of the Kafka edge: which broker is local, its config, message keys."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from velocity.errors import UsageError
from velocity.kafka.broker import (
    broker_command,
    format_command,
    local_kafka,
    new_cluster_id,
    render_config,
)
from velocity.kafka.topics import kafka_alerts_on, payer_key
from velocity.operating.stream_control import (
    KafkaSource,
    StreamStatus,
    read_status,
    source_is_kafka,
)
from velocity.settings import load_settings


def settings_for(tmp_path: Path, bootstrap: str, **more: str):
    return load_settings(data_dir=tmp_path, kafka_bootstrap=bootstrap, **more)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "127.0.0.2"])
def test_a_loopback_bootstrap_is_the_local_broker_of_the_data_dir(tmp_path, host) -> None:
    broker = local_kafka(settings_for(tmp_path, f"{host}:9400"))
    assert broker is not None
    assert broker.host == ("127.0.0.1" if host == "localhost" else host)
    assert (broker.port, broker.controller_port) == (9400, 9401)
    assert broker.home == tmp_path / "kafka"


@pytest.mark.parametrize(
    "bootstrap", ["", "kafka.example.com:9092", "10.0.0.5:9092", "127.0.0.1:9092,127.0.0.1:9094"]
)
def test_no_local_broker_for_none_a_remote_one_or_a_cluster(tmp_path, bootstrap) -> None:
    assert local_kafka(settings_for(tmp_path, bootstrap)) is None


@pytest.mark.parametrize("bootstrap", ["127.0.0.1", "127.0.0.1:x", "127.0.0.1:70000"])
def test_a_local_bootstrap_without_a_valid_port_is_refused(tmp_path, bootstrap) -> None:
    with pytest.raises(UsageError, match="VELOCITY_KAFKA_BOOTSTRAP"):
        local_kafka(settings_for(tmp_path, bootstrap))


def test_the_config_listens_on_loopback_only_and_keeps_its_log_in_the_data_dir(tmp_path) -> None:
    broker = local_kafka(settings_for(tmp_path, "127.0.0.1:9400"))
    assert broker is not None
    lines = render_config(broker, partitions=3).splitlines()
    assert "process.roles=broker,controller" in lines
    assert "listeners=PLAINTEXT://127.0.0.1:9400,CONTROLLER://127.0.0.1:9401" in lines
    assert "advertised.listeners=PLAINTEXT://127.0.0.1:9400" in lines
    assert "controller.quorum.voters=1@127.0.0.1:9401" in lines
    assert f"log.dirs={tmp_path / 'kafka' / 'data'}" in lines
    assert "num.partitions=3" in lines
    assert "offsets.topic.replication.factor=1" in lines
    command = broker_command("java", tmp_path / "libs", broker)
    assert command[-2:] == ["kafka.Kafka", str(broker.config_path)]
    assert str(tmp_path / "libs" / "*") in command


def test_a_message_key_is_the_canonical_payer() -> None:
    assert payer_key('{"payerId": 17, "x": 1}') == payer_key('{"payerId": "17"}') == "17"
    for not_an_event in ("not json", "[1, 2]", '{"payerId": null}', '{"payerId": true}', ""):
        assert payer_key(not_an_event) is None


def test_alerts_go_to_kafka_when_the_stream_reads_it_unless_told_otherwise(tmp_path) -> None:
    on_broker = "127.0.0.1:9400"
    assert kafka_alerts_on(settings_for(tmp_path, on_broker), source_is_kafka=True)
    assert not kafka_alerts_on(settings_for(tmp_path, on_broker), source_is_kafka=False)
    assert kafka_alerts_on(settings_for(tmp_path, on_broker, kafka_alerts="on"), False)
    assert not kafka_alerts_on(settings_for(tmp_path, on_broker, kafka_alerts="off"), True)
    assert not kafka_alerts_on(settings_for(tmp_path, "", kafka_alerts="on"), True)


def test_the_status_file_says_which_source_the_stream_reads(tmp_path) -> None:
    assert not source_is_kafka(tmp_path)
    StreamStatus(tmp_path, tmp_path / "events", 1).starting()
    assert not source_is_kafka(tmp_path)
    StreamStatus(tmp_path, KafkaSource("127.0.0.1:9400", "velocity.events"), 1).starting()
    status = read_status(tmp_path)
    assert status is not None
    assert status["source"] == "kafka://127.0.0.1:9400/velocity.events"
    assert status["eventsDir"] is None and source_is_kafka(tmp_path)
    assert KafkaSource.from_text(status["source"]) == KafkaSource(
        "127.0.0.1:9400", "velocity.events"
    )
    assert KafkaSource.from_text(str(tmp_path / "events")) is None


def test_a_new_cluster_id_never_starts_with_a_dash(monkeypatch) -> None:
    """0xF8 encodes as "-" first; a command line would read such an id as an option."""
    draws = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=b"\x01" * 16)])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(draws))
    cluster_id = new_cluster_id()
    assert cluster_id == "AQEBAQEBAQEBAQEBAQEBAQ"
    assert len(cluster_id) == 22


def test_the_storage_is_formatted_with_the_id_fused_to_its_option(tmp_path) -> None:
    broker = local_kafka(settings_for(tmp_path, "127.0.0.1:9400"))
    assert broker is not None
    command = format_command("java", tmp_path / "libs", broker, "-dashFirst")
    assert "--cluster-id=-dashFirst" in command
    assert "-dashFirst" not in command


def kafka_progress(rows: int, latest: dict[str, int], end: dict[str, int]) -> dict[str, Any]:
    """A Kafka batch's StreamingQueryProgress as JSON, reduced to what the status reads."""
    return {
        "batchId": 3, "numInputRows": rows, "batchDuration": 100,
        "timestamp": "2026-11-27T10:00:00.000Z",
        "sources": [{"latestOffset": {"t": latest}, "endOffset": {"t": end}}],
    }  # fmt: skip


@pytest.mark.timeout(30)
def test_the_status_of_a_kafka_stream_holds_its_consumer_lag(tmp_path) -> None:
    status = StreamStatus(tmp_path, KafkaSource("127.0.0.1:9400", "t"), 1)
    status.starting()
    status.running("q", "r")

    def lag() -> tuple[Any, Any, Any]:
        now = read_status(tmp_path) or {}
        return now["offsetsBehindLatest"], now["maxOffsetsBehindLatest"], now["backlogFiles"]

    assert lag() == (None, None, None)  # not known before a batch or an idle trigger
    status.progress(kafka_progress(500, {"0": 900, "1": 400}, {"0": 300, "1": 400}))
    assert lag() == (600, 600, None)
    status.progress(kafka_progress(600, {"0": 1000, "1": 450}, {"0": 900, "1": 420}))
    assert lag() == (130, 100, None)
    status.heartbeat()  # idle: the source had nothing new, so nothing is behind
    assert lag() == (0, 0, None)
    # A folder's stream counts files and has no consumer lag.
    folder = tmp_path / "folder"
    StreamStatus(folder, folder / "events", 1).running("q", "r")
    now = read_status(folder) or {}
    assert (now["offsetsBehindLatest"], now["backlogFiles"]) == (None, 0)
