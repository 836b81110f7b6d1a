"""A downstream consumer of Velocity's alerts topic that drops repeats (not a test).

Velocity publishes every alert, correction and retraction to the topic at least once: a
micro-batch replayed after a crash publishes its alerts again, with the same alertId (ids
are deterministic, SPEC §4). A consumer keeps the alertIds it handled and skips a repeat.
Here the ids live in memory; a real service keeps them where it keeps its own results (a
unique key in its database makes the handling and the de-duplication one write), and
commits its offsets only after handling.

    python examples/kafka_alert_consumer.py [--bootstrap 127.0.0.1:9392]
        [--topic velocity.alerts] [--group my-service] [--idle-seconds 5]
"""

from __future__ import annotations

import argparse
import json

from confluent_kafka import Consumer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9392")
    parser.add_argument("--topic", default="velocity.alerts")
    parser.add_argument("--group", default="velocity-example-consumer")
    parser.add_argument("--idle-seconds", type=float, default=5.0, help="stop after this quiet")
    args = parser.parse_args()
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,  # commit after handling: at least once here too
        }
    )
    consumer.subscribe([args.topic])
    handled: set[str] = set()
    repeats = 0
    try:
        while True:
            messages = consumer.consume(500, timeout=args.idle_seconds)
            if not messages and consumer.assignment():  # joined its group, then quiet
                break
            for message in messages:
                if message.error() is not None:
                    continue
                alert = json.loads(message.value())
                if alert["alertId"] in handled:  # == message.key()
                    repeats += 1
                    continue
                handled.add(alert["alertId"])
                # ... act on the alert: block the card, open a case, page an analyst ...
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    print(f"{len(handled)} alerts handled from {args.topic}, {repeats} repeats dropped")


if __name__ == "__main__":
    main()
