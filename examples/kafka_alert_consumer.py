"""A downstream consumer of Velocity's alerts topic that drops repeats (not a test).

Velocity publishes every alert, correction and retraction to the topic at least once: a
micro-batch replayed after a crash publishes its alerts again, with the same alertId (ids
are deterministic, SPEC §4). A consumer keeps the alertIds it handled and skips a repeat.
Here the ids live in memory; a real service keeps them where it keeps its own results (a
unique key in its database makes the handling and the de-duplication one write), and
commits its offsets only after handling.

    python examples/kafka_alert_consumer.py [--bootstrap HOST:PORT] [--topic TOPIC]
        [--group my-service] [--idle-seconds 5]

The bootstrap servers and the topic default to Velocity's settings
(VELOCITY_KAFKA_BOOTSTRAP, VELOCITY_KAFKA_ALERTS_TOPIC, or the VELOCITY_CONFIG file).
"""

from __future__ import annotations

import argparse
import json

from confluent_kafka import Consumer

from velocity.settings import load_settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="default: the setting VELOCITY_KAFKA_BOOTSTRAP")
    parser.add_argument("--topic", help="default: the setting VELOCITY_KAFKA_ALERTS_TOPIC")
    parser.add_argument("--group", default="velocity-example-consumer")
    parser.add_argument("--idle-seconds", type=float, default=5.0, help="stop after this quiet")
    args = parser.parse_args()
    settings = load_settings()
    bootstrap = args.bootstrap or settings.kafka_bootstrap
    topic = args.topic or settings.kafka_alerts_topic
    if not bootstrap:
        parser.error("no Kafka: VELOCITY_KAFKA_BOOTSTRAP is empty and --bootstrap not given")
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": args.group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,  # commit after handling: at least once here too
        }
    )
    consumer.subscribe([topic])
    handled: set[str] = set()
    repeats = 0
    try:
        while True:
            messages = consumer.consume(500, timeout=args.idle_seconds)
            if not messages and consumer.assignment():  # joined its group, then quiet
                break
            read = 0
            for message in messages:
                value = message.value()
                if message.error() is not None or value is None:
                    continue
                read += 1
                alert = json.loads(value)
                if alert["alertId"] in handled:  # == message.key()
                    repeats += 1
                    continue
                handled.add(alert["alertId"])
                # ... act on the alert: block the card, open a case, page an analyst ...
            if read:  # a commit with no offset stored fails (_NO_OFFSET): only after reading
                consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    print(f"{len(handled)} alerts handled from {topic} at {bootstrap}, {repeats} repeats dropped")


if __name__ == "__main__":
    main()
