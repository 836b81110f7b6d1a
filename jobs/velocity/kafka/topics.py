"""Velocity's Kafka topics through confluent-kafka (librdkafka): the events topic the
stream reads, the alerts topic it publishes to.

What callers rely on:
- ``AlertPublisher.publish`` returns only once the broker acknowledged every record
  (``acks=all``, idempotent producer) and raises ``VelocityError`` when one could not be
  delivered within ``kafka_delivery_timeout_seconds``: a caller that publishes before it
  records a batch as done publishes at least once. Records are the SPEC §4 JSON, keyed by
  ``alertId``, so a consumer drops repeats by key.
- ``EventProducer`` produces event lines keyed by their payerId (one payer, one partition,
  so the first arrival of a payer's transactionId is well defined).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from velocity.domain.alerts import is_shadow
from velocity.domain.schema import canonical_value
from velocity.errors import VelocityError
from velocity.settings import Settings


def kafka_alerts_on(settings: Settings, source_is_kafka: bool) -> bool:
    """Whether alerts go to the alerts topic too (``VELOCITY_KAFKA_ALERTS``): on, off, or
    auto = when the data dir's stream reads Kafka."""
    if not settings.kafka_bootstrap or settings.kafka_alerts == "off":
        return False
    return settings.kafka_alerts == "on" or source_is_kafka


def cluster_id_of(bootstrap: str, *, timeout_seconds: float) -> str | None:
    """The cluster id of the broker at ``bootstrap``; None when none answers in time."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, "logger": _quiet()})
    try:
        metadata = admin.list_topics(timeout=timeout_seconds)
    except KafkaException:
        return None
    return str(metadata.cluster_id) if metadata.cluster_id else None


def ensure_topics(settings: Settings, timeout_seconds: float = 30.0) -> list[str]:
    """Create the events and alerts topics when missing; returns the ones created."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap, "logger": _quiet()})
    wanted = [settings.kafka_events_topic, settings.kafka_alerts_topic]
    present = set(admin.list_topics(timeout=timeout_seconds).topics)
    missing = [t for t in dict.fromkeys(wanted) if t not in present]
    if not missing:
        return []
    futures = admin.create_topics(
        [NewTopic(t, num_partitions=settings.kafka_partitions) for t in missing],
        operation_timeout=timeout_seconds,
        request_timeout=timeout_seconds,
    )
    for topic, future in futures.items():
        try:
            future.result()
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # a race: fine
                raise VelocityError(f"could not create Kafka topic {topic}: {exc}") from exc
    return missing


def producer(settings: Settings, **overrides: Any) -> Any:
    """An idempotent producer of ``kafka_bootstrap`` that waits for every replica."""
    from confluent_kafka import Producer

    config = {
        "bootstrap.servers": settings.kafka_bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "compression.type": "lz4",
        "message.timeout.ms": int(settings.kafka_delivery_timeout_seconds * 1000),
        "logger": _quiet(),
        **overrides,
    }
    return Producer(config)


class TopicWriter:
    """Produces messages to one topic; ``flush`` waits for the broker's acknowledgements
    and raises ``VelocityError`` for any message not delivered in time."""

    def __init__(self, settings: Settings, topic: str, **overrides: Any) -> None:
        self._settings = settings
        self.topic = topic
        self._producer = producer(settings, **overrides)
        self._failures: list[str] = []
        self.sent = 0

    def send(self, value: str, key: str | None, partition: int | None = None) -> None:
        """Queue one message (waiting only while the local queue is full); into
        ``partition`` when given, else where librdkafka's partitioner puts its key."""
        where = {} if partition is None else {"partition": partition}
        while True:
            try:
                self._producer.produce(
                    self.topic, value=value, key=key, on_delivery=self._delivered, **where
                )
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                self._producer.poll(0.1)
        self.sent += 1

    def flush(self) -> None:
        """Wait for every queued message; raises if one was not delivered."""
        waited = self._settings.kafka_delivery_timeout_seconds + 5
        left = self._producer.flush(waited)
        if left:
            self._failures.append(f"{left} messages still unacknowledged after {waited:g}s")
        if self._failures:
            failures, self._failures = self._failures, []
            raise VelocityError(
                f"producing to Kafka topic {self.topic} at {self._settings.kafka_bootstrap} "
                f"failed: {'; '.join(failures[:3])}"
            )

    def _delivered(self, error: Any, message: Any) -> None:
        if error is not None:
            self._failures.append(f"{message.key()!r}: {error}")


class AlertPublisher:
    """Publishes SPEC §4 records to the alerts topic, at least once, keyed by alertId."""

    def __init__(self, settings: Settings) -> None:
        self._writer = TopicWriter(settings, settings.kafka_alerts_topic)

    def publish(self, records: Iterable[Mapping[str, Any] | str]) -> int:
        """Produce every record and wait for the broker's acknowledgements; returns how
        many were published. A record may be a dict or its JSON text already. A SHADOW
        rule's alert is never produced: the topic is what downstream services consume."""
        sent = 0
        for record in records:
            if isinstance(record, str):
                text, parsed = record, json.loads(record)
            else:
                text, parsed = json.dumps(record, separators=(",", ":")), record
            if is_shadow(parsed):
                continue
            self._writer.send(text, str(parsed["alertId"]))
            sent += 1
        if sent:
            self._writer.flush()
        return sent


class EventProducer:
    """Produces event lines to the events topic, keyed by payerId (a line that is not an
    event's JSON goes with no key). Used by ``velocity generate --kafka``."""

    def __init__(self, settings: Settings, topic: str | None = None) -> None:
        self._writer = TopicWriter(
            settings, topic or settings.kafka_events_topic,
            **{"linger.ms": 20, "batch.num.messages": 10000},
        )  # fmt: skip
        self.topic = self._writer.topic

    @property
    def sent(self) -> int:
        return self._writer.sent

    def send(self, lines: Iterable[str]) -> int:
        """Queue the lines (waiting only while the local queue is full); returns how many."""
        count = 0
        for line in lines:
            self._writer.send(line, payer_key(line))
            count += 1
        return count

    def close(self) -> None:
        """Wait for every queued line; raises ``VelocityError`` if one was not delivered."""
        self._writer.flush()


def payer_key(line: str) -> str | None:
    """The canonical payerId of an event line (as keys compare it: 17 and "17" are one
    payer, so one partition), the message key; None for a line that has none."""
    try:
        value = json.loads(line, parse_float=Decimal)
        return canonical_value("payerId", value.get("payerId")) if isinstance(value, dict) else None
    except ValueError:
        return None


def _quiet() -> Any:
    """librdkafka logs through Python logging (not straight to stderr)."""
    import logging

    return logging.getLogger("velocity.kafka.client")
