"""`velocity up` and `velocity down`: the local Redis, the Kafka broker and the HTTP check
service."""

from __future__ import annotations

import argparse

from velocity.cli.shared import EXIT_OK, settings_from


def up(args: argparse.Namespace) -> int:
    from velocity.redis.server import READER_USER, redis_up

    settings = settings_from(args)
    status = redis_up(settings)
    host, port, _ = settings.redis_address
    state = "started" if status.started else "already running"
    ahead = f", {status.priority}" if status.priority else ""
    print(f"redis {status.version} {state} on {host}:{port} (pid {status.pid}{ahead})")
    print(status.url)
    print(
        f"read-only user for downstream services: {READER_USER} "
        f"(redis://{READER_USER}:VELOCITY_REDIS_READER_PASSWORD@{host}:{port}/0)"
    )
    print(f"data dir: {settings.data_dir}")
    print(f"key prefix: {settings.redis_keys.prefix} (alerts: {settings.alert_stream})")
    from velocity.kafka.broker import kafka_up

    broker = kafka_up(settings)
    if broker is not None:
        state = "started" if broker.started else "already running"
        print(f"kafka {broker.version} {state} (pid {broker.pid}, log {broker.log_path})")
    elif settings.kafka_bootstrap:
        print(f"kafka: using the broker at {settings.kafka_bootstrap} (not started here)")
    if settings.kafka_bootstrap:
        print(f"bootstrap.servers={settings.kafka_bootstrap}")
        print(f"topics: events {settings.kafka_events_topic}, alerts {settings.kafka_alerts_topic}")
    from velocity.serving.service import service_up

    service = service_up(settings)
    if service is None:
        print("check service: none (VELOCITY_CHECK_PORT=0)")
    else:
        state = "started" if service.started else "already running"
        token = service.token_file or "VELOCITY_CHECK_TOKEN"
        print(f"check service {state} on {service.url} (pid {service.pid}; token: {token})")
    return EXIT_OK


def down(args: argparse.Namespace) -> int:
    from velocity.kafka.broker import kafka_down
    from velocity.redis.server import redis_down
    from velocity.serving.service import service_down

    settings = settings_from(args)
    # The service first: it reads Redis until it stops.
    stopped = service_down(settings)
    print("check service stopped" if stopped else "check service was not running")
    stopped = kafka_down(settings)
    print("kafka stopped" if stopped else "kafka was not running")
    stopped = redis_down(settings)
    print("redis stopped" if stopped else "redis was not running")
    return EXIT_OK
