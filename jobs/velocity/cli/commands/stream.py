"""`velocity stream`, `stream-status` and `stream-stop`: run the streaming job, report its
health, and stop it.

`stream-status` and `stream-stop` import no pyspark, so they answer at once.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from velocity.cli.shared import (
    EXIT_FAILURE,
    EXIT_OK,
    read_rules_file,
    settings_from,
    spark_session,
)
from velocity.errors import UsageError
from velocity.settings import Settings


def stream(args: argparse.Namespace) -> int:
    """Run the stream until it ends, is asked to stop, or --duration passes.

    Keeps ``<data_dir>/status/stream.json`` current and stops cleanly on
    ``velocity stream-stop`` or SIGTERM (exit 0); a failed query exits 1 (status FAILED).
    """
    settings = settings_from(args)
    from velocity.operating import stream_control

    source = _event_source(args, settings)
    entries = read_rules_file(args.rules) if args.rules else []

    stream_control.refuse_if_running(settings)
    started_ms = stream_control.now_ms()
    stale = stream_control.clear_stale_stop_request(settings.data_dir, started_ms)
    if stale is not None:
        print(f"removed a stop request left from before this start: {json.dumps(stale)}")
    status = stream_control.StreamStatus(settings.data_dir, source, started_ms)
    status.starting()
    status.beat_while_starting(settings.stream_heartbeat_seconds)
    terminate = _sigterm_flag()
    try:
        from velocity.spark import lifecycle
        from velocity.spark.stream import StreamJob

        spark = spark_session(settings, "velocity-stream")
        job = StreamJob(spark, settings)
        if entries:
            for change in job.rule_store.apply(entries).changes:
                print(f"ruleId {change.rule_id}: version {change.version} {change.state.value}")
        lifecycle.attach_status_listener(
            spark,
            status,
            settings.stream_heartbeat_seconds,
            job.metrics,
            lambda batch: job.wait_for_commit(batch, settings.stream_stale_seconds),
        )
        query = job.start(source, args.trigger == "available-now", args.max_files_per_trigger)
    except KeyboardInterrupt:
        status.stopped("interrupted (Ctrl-C) while starting", final=True)
        raise
    except Exception as exc:
        # Startup failed (bad Redis URL, Spark, Delta): say so in the status file too.
        status.failed(f"startup failed: {exc}", final=True)
        raise
    metrics = (
        f"; metrics on http://127.0.0.1:{settings.metrics_port}/metrics"
        if settings.metrics_port
        else ""
    )
    print(
        f"stream running over {source} (data dir {settings.data_dir}{metrics}); "
        "`velocity stream-stop` or Ctrl-C stops it",
        flush=True,
    )
    try:
        reason = lifecycle.supervise(
            query,
            status,
            settings.data_dir,
            duration_seconds=args.duration,
            grace_seconds=settings.stream_stale_seconds,
            terminate_requested=terminate.is_set,
            batch_failure=job.batch_failure,
        )
    finally:
        job.close()  # the committed batches still spooled reach Delta
    # The metrics' counts: Spark's recentProgress keeps the last 100 batches only.
    print(f"stream stopped ({reason}): {job.metrics.run_totals().text()}")
    return EXIT_OK


def _event_source(args: argparse.Namespace, settings: Settings) -> Any:
    """The folder (``--events``) or Kafka topic (``--source kafka``) the stream reads."""
    from velocity.operating.stream_control import KafkaSource

    if args.source == "kafka":
        if args.events:
            raise UsageError("--events names a folder; with --source kafka use --topic")
        if not settings.kafka_bootstrap:
            raise UsageError(
                "--source kafka needs a broker: set VELOCITY_KAFKA_BOOTSTRAP (`velocity up` "
                "starts one on the default 127.0.0.1:9392)"
            )
        from velocity.kafka.topics import cluster_id_of

        if cluster_id_of(settings.kafka_bootstrap, timeout_seconds=10) is None:
            raise UsageError(
                f"no Kafka broker answers at {settings.kafka_bootstrap}: run `velocity up` "
                "(a local bootstrap) or check VELOCITY_KAFKA_BOOTSTRAP"
            )
        topic = args.topic or settings.kafka_events_topic
        return KafkaSource(settings.kafka_bootstrap, topic, args.starting_offsets)
    if args.topic:
        raise UsageError("--topic is for --source kafka")
    if not args.events:
        raise UsageError("give --events FOLDER (the folder events land in), or --source kafka")
    events_dir = Path(args.events)
    if not events_dir.is_dir():
        raise UsageError(
            f"--events {args.events!r} is not a folder; give the folder events land in"
        )
    return events_dir.resolve()


def _sigterm_flag() -> threading.Event:
    """An event set on SIGTERM, so a scheduler's kill stops the stream like stream-stop."""
    flag = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: flag.set())
    return flag


def stream_status(args: argparse.Namespace) -> int:
    from velocity.operating import stream_control

    health = stream_control.check_health(settings_from(args), args.stale_seconds)
    print(json.dumps(health.to_json()))
    return EXIT_OK if health.healthy else EXIT_FAILURE


def stream_stop(args: argparse.Namespace) -> int:
    from velocity.operating import stream_control
    from velocity.operating.health import LIVE_STATES

    settings = settings_from(args)
    health = stream_control.check_health(settings)
    if stream_control.stream_ended(health):
        print(f"no stream is running with data dir {settings.data_dir}: {health.reason}")
        return EXIT_OK
    if health.state in LIVE_STATES and health.verdict != "dead":
        request = stream_control.request_stop(settings.data_dir, args.reason)
        print(
            f"stop requested ({request['requestedBy']}) for the stream, pid {health.pid} on "
            f"{health.host}; it stops after its micro-batch in flight"
        )
    else:
        print(f"the stream's query has stopped ({health.reason}); its process, pid {health.pid}, "
              "is still exiting")  # fmt: skip
    deadline = time.monotonic() + args.wait
    while True:
        health = stream_control.check_health(settings)
        # Stopped means its process has exited too (this host): STOPPED is written first.
        if stream_control.stream_ended(health):
            exited = "; its process exited" if health.host == stream_control.local_host() else ""
            print(f"stream {health.verdict}: {health.reason}{exited}")
            return EXIT_OK
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    if not args.force:
        if args.wait:
            still = (
                f"the stream is still {health.state}"
                if health.state in LIVE_STATES
                else f"the stream's query stopped but its process, pid {health.pid}, has not "
                "exited (it appends its last batches to Delta first)"
            )
            print(
                f"error: {still} after {args.wait} s: {health.reason}; --force kills it",
                file=sys.stderr,
            )
            return EXIT_FAILURE
        return EXIT_OK
    if health.pid is None or health.host != stream_control.local_host():
        print(
            f"error: --force can only kill a stream on this host; it runs as pid {health.pid} "
            f"on {health.host}: stop it there",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    if not stream_control.kill_stream(health.pid):
        print(f"error: pid {health.pid} survived SIGKILL for 30 s", file=sys.stderr)
        return EXIT_FAILURE
    print(
        f"killed the stream (pid {health.pid}) after {args.wait} s; `velocity stream` "
        "resumes from its checkpoint"
    )
    return EXIT_OK
