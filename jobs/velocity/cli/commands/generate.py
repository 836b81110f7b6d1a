"""`velocity generate`: synthetic events as JSON-lines files, or over real time to Kafka."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from velocity.cli.shared import EXIT_OK, settings_from
from velocity.errors import UsageError
from velocity.settings import Settings


def generate(args: argparse.Namespace) -> int:
    from velocity.generate import GenerateOptions, generate_events

    given = {
        "events": args.events,
        "rate": args.rate,
        "payers": args.keys,
        "files": args.files,
        "start_ms": args.start,
        "spike_fraction": args.spike_fraction,
        "late_fraction": args.late_fraction,
        "duplicate_fraction": args.duplicate_fraction,
        "malformed_fraction": args.malformed_fraction,
        "seed": args.seed,
        "overwrite": args.overwrite,
    }
    options = GenerateOptions(**{k: v for k, v in given.items() if v is not None})
    if args.kafka:
        return _generate_to_kafka(settings_from(args), options, args)
    if not args.out:
        raise UsageError("give --out FOLDER for the event files, or --kafka for the topic")
    if args.follow:
        from velocity.generate import stream_events

        deadline = time.monotonic() + args.duration if args.duration else None
        summary = stream_events(
            Path(args.out),
            options,
            interval_seconds=args.interval,
            should_stop=lambda: deadline is not None and time.monotonic() >= deadline,
        )
    else:
        from velocity.operating.progress import Progress

        with Progress() as progress:
            progress.step("generate", options.events)
            summary = generate_events(Path(args.out), options, on_lines=progress.update)
    print(json.dumps(summary.to_dict()))
    return EXIT_OK


def _generate_to_kafka(settings: Settings, options: Any, args: argparse.Namespace) -> int:
    """``generate --kafka``: events over real time (``--rate`` a second, eventTime = now)
    to the events topic, keyed by payerId, with a progress line every few seconds."""
    from velocity.generate import follow
    from velocity.kafka.topics import EventProducer, ensure_topics

    if not settings.kafka_bootstrap:
        raise UsageError("--kafka needs VELOCITY_KAFKA_BOOTSTRAP (`velocity up` starts a broker)")
    ensure_topics(settings)
    sink = EventProducer(settings, args.topic)
    began = time.monotonic()
    deadline = began + args.duration if args.duration else None
    shown = began

    def land(source: Any, count: int) -> None:
        nonlocal shown
        sink.send(line for chunk in source.chunks(count) for line in chunk.splitlines())
        now = time.monotonic()
        if now - shown >= 5:
            shown = now
            rate = sink.sent / (now - began)
            print(
                f"produced {sink.sent} events to {sink.topic} ({rate:.0f}/s)",
                file=sys.stderr,
                flush=True,
            )

    source = follow(
        options,
        land,
        interval_seconds=args.interval,
        should_stop=lambda: deadline is not None and time.monotonic() >= deadline,
    )
    sink.close()
    summary = source.summary(())
    print(json.dumps({**summary.to_dict(), "topic": sink.topic, "produced": sink.sent}))
    return EXIT_OK
