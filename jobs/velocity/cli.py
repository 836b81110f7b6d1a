"""`velocity`: the one console script, and the only place that parses arguments.

Exit codes (SPEC §6): 0 success, 2 bad input or usage (the message names what
is wrong), 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any

from velocity.domain.decimals import dumps_json
from velocity.domain.rule_changes import (
    RULE_ACTIONS,
    RuleBook,
    as_candidates,
    outcome_lines,
    plan_changes,
    rule_action,
    rules_file_text,
)
from velocity.domain.rules import Rule, RuleEntry, parse_rules
from velocity.domain.schema import parse_key_values
from velocity.errors import InvalidRuleError, UsageError, VelocityError
from velocity.settings import Settings, load_settings

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError (exit 2 with our message) instead of exiting itself."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def sample_rules_path() -> Path:
    return Path(str(resources.files("velocity") / "resources" / "sample_rules.json"))


def _read_rules_file(path: str) -> list[RuleEntry]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read rules file {path!r}: {exc.strerror}") from exc
    return parse_rules(text)


def _settings(args: argparse.Namespace) -> Settings:
    """The settings ``main`` loaded for this command (flags over environment over file)."""
    settings: Settings = args.settings
    return settings


def _spark(settings: Settings, app: str) -> Any:
    from velocity.spark.session import build_spark

    return build_spark(settings, app)


def _rule_store(settings: Settings) -> Any:
    """The rule store (delta-rs: no Spark session, so a rule change takes well under 2 s)."""
    from velocity.delta.names import RULES
    from velocity.delta.rule_store import RuleStore

    return RuleStore(settings.table_path(RULES))


def _review_store(settings: Settings) -> Any:
    """The reviews of alerts (delta-rs, like the rule store)."""
    from velocity.delta.names import ALERT_REVIEWS
    from velocity.delta.review_store import ReviewStore

    return ReviewStore(settings.table_path(ALERT_REVIEWS))


# --- commands -----------------------------------------------------------------------------


def cmd_up(args: argparse.Namespace) -> int:
    from velocity.redis.server import READER_USER, redis_up

    settings = _settings(args)
    status = redis_up(settings)
    host, port, _ = settings.redis_address
    state = "started" if status.started else "already running"
    print(f"redis {status.version} {state} on {host}:{port} (pid {status.pid})")
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
    return EXIT_OK


def cmd_down(args: argparse.Namespace) -> int:
    from velocity.kafka.broker import kafka_down
    from velocity.redis.server import redis_down

    settings = _settings(args)
    stopped = kafka_down(settings)
    print("kafka stopped" if stopped else "kafka was not running")
    stopped = redis_down(settings)
    print("redis stopped" if stopped else "redis was not running")
    return EXIT_OK


def cmd_rules_validate(args: argparse.Namespace) -> int:
    entries = _read_rules_file(args.file)
    print(f"{args.file}: {len(entries)} valid rule entries")
    return EXIT_OK


def cmd_rules_preview(args: argparse.Namespace) -> int:
    from velocity.delta.preview_reader import preview
    from velocity.domain.rules import rule_summary

    entries = _read_rules_file(args.file)
    result = preview(_settings(args), entries, hours=args.hours, sample_size=args.sample)
    if args.json:
        print(result.to_json_text())
        return EXIT_OK
    span = result.span
    print(
        f"last {args.hours:g} h of accepted events: eventTime in ({span.start}, {span.end}], "
        f"anchored on the newest eventTime in the events table; {result.events_in_span} events "
        f"decided, {result.events_read} read (history from {result.read_from} for the widest "
        f"window), {result.seconds:.1f} s"
    )
    for note in result.skipped:
        print(f"skipped: {note}")
    for rule in result.rules:
        base = rule.in_force
        against = (
            "no version in force: every alert is added"
            if base is None
            else f"against v{base.version} in force ({base.state.value}, "
            f"{rule.in_force_alerts} alerts)"
        )
        print(
            f"\nruleId {rule.rule.rule_id} v{rule.rule.version} (unsaved) {rule_summary(rule.rule)}"
        )
        print(f"  {rule.alerts} alerts, {rule.notified} notified; {against}")
        print(
            "  per hour (alerts/notified): "
            + ", ".join(f"{h.alerts}/{h.notified}" for h in rule.per_hour)
            + " (oldest first)"
        )
        diff = rule.diff
        print(
            f"  difference: {diff.added} added, {diff.removed} removed, "
            f"{diff.changed} changed value, {diff.unchanged} the same"
        )
        shown_kinds = (
            ("added", diff.added_shown),
            ("removed", diff.removed_shown),
            ("changed", diff.changed_shown),
        )
        # Without a version in force every alert is added: the sample below shows them.
        for kind, shown in shown_kinds if base is not None else ():
            for entry in shown:
                print(
                    f"    {kind} {entry.transaction_id} at {entry.event_time}: "
                    f"in force {entry.in_force or '-'}, candidate {entry.candidate or '-'}"
                )
        for sample in rule.sample:
            alert = sample.alert
            print(
                f"  alert {alert['alertId']} transaction {alert['transactionId']} key "
                f"{json.dumps(alert['key'])} at {alert['eventTime']}: "
                f"{alert['aggregatorFunctionType']} {alert['aggregateValue']} "
                f"{alert['limitOperatorType']} {alert['limit']}"
            )
            if sample.explanation is None:
                print(f"    {sample.window_events} events in the window (too many to list)")
            else:
                print(f"    {sample.explanation.arithmetic}")
    return EXIT_OK


def _print_rules(rules: Sequence[Rule]) -> None:
    if not rules:
        print("no rules in force")
    for rule in rules:
        print(dumps_json({"version": rule.version, **rule.to_json()}))


def cmd_rules_apply(args: argparse.Namespace) -> int:
    entries = _read_rules_file(args.file)
    settings = _settings(args)
    result = _rule_store(settings).apply(entries)
    for line in outcome_lines(result, entries):
        print(line)
    if result.clear_state:
        _clear_state(settings)
    return EXIT_OK


def cmd_rules_shadow(args: argparse.Namespace) -> int:
    """Every rule of FILE as a SHADOW candidate, whatever its ruleState says."""
    candidates = as_candidates(_read_rules_file(args.file))
    for line in outcome_lines(_rule_store(_settings(args)).apply(candidates), candidates):
        print(line)
    return EXIT_OK


def _clear_state(settings: Settings) -> None:
    """CLEAR_STATE_ALL: forget every bucket of the live system (rules stay)."""
    from velocity.delta.tables import BUCKETS, table_exists

    spark = _spark(settings, "velocity-rules")
    path = settings.table_path(BUCKETS)
    if table_exists(spark, path):
        spark.sql(f"DELETE FROM delta.`{path}`")
    print("state cleared: every bucket deleted")


def cmd_rules_list(args: argparse.Namespace) -> int:
    store = _rule_store(_settings(args))
    _print_rules(store.history() if args.all else store.in_force())
    return EXIT_OK


def _export(text: str, out: str | None, written: str) -> int:
    """``text`` to the file ``out`` (then say ``written`` and where), or to standard output."""
    if out:
        Path(out).write_text(text, encoding="utf-8")
        print(f"{written} written to {out}")
    else:
        sys.stdout.write(text)
    return EXIT_OK


def cmd_rules_export(args: argparse.Namespace) -> int:
    rules = _rule_store(_settings(args)).in_force()
    return _export(rules_file_text([r.to_json() for r in rules]), args.out, f"{len(rules)} rules")


def _change(action: str) -> Callable[[argparse.Namespace], int]:
    """`velocity rules pause|activate|delete|promote|discard ID`."""

    def run(args: argparse.Namespace) -> int:
        entries = [rule_action(action, args.rule_id)]
        for line in outcome_lines(_rule_store(_settings(args)).apply(entries), entries):
            print(line)
        return EXIT_OK

    return run


def cmd_reviews_export(args: argparse.Namespace) -> int:
    store = _review_store(_settings(args))
    # The review that counts per alert, or with --all every review ever recorded.
    reviews = store.all() if args.all else store.latest().values()
    ordered = sorted(reviews, key=lambda r: (r.when, r.alert_id))
    text = "".join(dumps_json(r.to_json()) + "\n" for r in ordered)
    return _export(text, args.out, f"{len(ordered)} reviews")


def _case_store(settings: Settings) -> Any:
    from velocity.delta.case_store import CaseStore

    return CaseStore(settings)


def _case_line(case: Any) -> str:
    rules = " ".join(f"r{rule}×{n}" for rule, n in sorted(case.rule_counts.items()))
    key = ",".join(f"{k}={v}" for k, v in case.key.items())
    who = f" {case.assignee}" if case.assignee else ""
    verdict = f" {case.verdict.words}" if case.verdict else ""
    return (
        f"{case.case_id}  {case.status.value}{who}{verdict}  {key}  {case.alerts} alerts "
        f"({rules})  amount {case.amount}  latest alert {case.latest_alert_at}"
    )


def cmd_cases_list(args: argparse.Namespace) -> int:
    from velocity.analyst.cases import CaseStatus

    status = None if args.status is None else CaseStatus(args.status.lower())
    for case in _case_store(_settings(args)).listed(status):
        print(dumps_json(case.to_json()) if args.json else _case_line(case))
    return EXIT_OK


def cmd_cases_show(args: argparse.Namespace) -> int:
    from velocity.domain.alerts import record_of_stored

    store = _case_store(_settings(args))
    case = store.case(args.case_id)
    alerts = [record_of_stored(r) for r in store.alerts(args.case_id).to_pylist()]
    if args.json:
        print(dumps_json({**case.to_json(history=True), "alertRecords": alerts}))
        return EXIT_OK
    print(_case_line(case))
    for alert in alerts:
        flag = " (suppressed)" if alert.get("suppressed") else ""
        print(
            f"  alert {alert['alertId']} rule {alert['ruleId']} v{alert['ruleVersion']} "
            f"tx {alert['transactionId']} {alert['aggregatorFunctionType']} "
            f"{alert['aggregateValue']} {alert['limitOperatorType']} {alert['limit']}{flag}"
        )
    for event in case.history:
        detail = event.assignee or (event.verdict.words if event.verdict else "") or ""
        alerts_part = f" {event.alerts} alerts" if event.alerts else ""
        print(f"  {event.at} {event.event.value} by {event.who}{alerts_part} {detail}".rstrip())
    return EXIT_OK


def _who(args: argparse.Namespace) -> str:
    return str(args.who or os.environ.get("USER") or "cli")


def cmd_cases_assign(args: argparse.Namespace) -> int:
    case = _case_store(_settings(args)).assign(args.case_id, args.assignee, _who(args))
    print(_case_line(case))
    return EXIT_OK


def cmd_cases_close(args: argparse.Namespace) -> int:
    store = _case_store(_settings(args))
    case = store.close(args.case_id, args.verdict, args.note, _who(args))
    print(_case_line(case))
    print(f"{case.alerts} alerts reviewed as {case.verdict.words}")
    return EXIT_OK


def cmd_cases_reopen(args: argparse.Namespace) -> int:
    case = _case_store(_settings(args)).reopen(args.case_id, _who(args))
    print(_case_line(case))
    return EXIT_OK


def cmd_generate(args: argparse.Namespace) -> int:
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
        return _generate_to_kafka(_settings(args), options, args)
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


def cmd_backtest(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if args.rules:
        # Versioned as if applied to an empty rules table: a rule and its SHADOW candidate
        # in one file get versions 1 and 2, as the store would give them.
        rules = RuleBook.of(plan_changes(RuleBook(), _read_rules_file(args.rules))[0]).in_force()
    else:
        rules = _rule_store(settings).in_force()
    if not Path(args.events).exists():
        raise UsageError(
            f"--events {args.events!r} does not exist; give a JSON-lines file or folder"
        )
    from velocity.operating.progress import Progress
    from velocity.spark.backtest import run_backtest

    spark = _spark(settings, "velocity-backtest")
    with Progress() as progress:
        summary = run_backtest(
            spark,
            settings,
            rules,
            str(Path(args.events).resolve()),
            Path(args.out),
            progress=progress,
            keep_state=args.keep_state,
        )
    print(
        f"backtest: {summary.lines} lines, {summary.accepted} accepted, "
        f"{summary.quarantined} quarantined, {summary.duplicates} duplicates dropped"
    )
    if summary.quarantine_reasons:
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(summary.quarantine_reasons.items()))
        print(f"quarantine reasons: {reasons}")
    if summary.kept_state:
        per_bucket = summary.bucket_bytes / summary.buckets if summary.buckets else 0.0
        print(
            f"buckets: {summary.buckets} ({summary.bucket_bytes} bytes in Delta, "
            f"{per_bucket:.1f} bytes per bucket)"
        )
    print(f"alerts: {summary.alerts}")
    for rule_id, count in summary.alerts_by_rule.items():
        print(f"  rule {rule_id}: {count} alerts")
    print(f"alerts file: {summary.alerts_file}")
    print(f"delta tables: {summary.tables_dir}")
    print(f"took {summary.seconds:.1f} s")
    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps(asdict(summary), indent=2) + "\n")
    return EXIT_OK


def cmd_stream(args: argparse.Namespace) -> int:
    """Run the stream until it ends, is asked to stop, or --duration passes.

    Keeps ``<data_dir>/status/stream.json`` current and stops cleanly on
    ``velocity stream-stop`` or SIGTERM (exit 0); a failed query exits 1 (status FAILED).
    """
    settings = _settings(args)
    from velocity.operating import stream_control

    source = _event_source(args, settings)
    entries = _read_rules_file(args.rules) if args.rules else []

    stream_control.refuse_if_running(settings)
    started_ms = stream_control.now_ms()
    stale = stream_control.clear_stale_stop_request(settings.data_dir, started_ms)
    if stale is not None:
        print(f"removed a stop request left from before this start: {json.dumps(stale)}")
    status = stream_control.StreamStatus(settings.data_dir, source, started_ms)
    status.starting()
    terminate = _sigterm_flag()
    try:
        from velocity.spark import lifecycle
        from velocity.spark.stream import StreamJob

        spark = _spark(settings, "velocity-stream")
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


def cmd_stream_status(args: argparse.Namespace) -> int:
    from velocity.operating import stream_control

    health = stream_control.check_health(_settings(args), args.stale_seconds)
    print(json.dumps(health.to_json()))
    return EXIT_OK if health.healthy else EXIT_FAILURE


def cmd_stream_stop(args: argparse.Namespace) -> int:
    from velocity.operating import stream_control
    from velocity.operating.health import LIVE_STATES

    settings = _settings(args)
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


def cmd_watch(args: argparse.Namespace) -> int:
    """Print alerts as they reach the Redis stream: rule, key, value and how old the event is."""
    from velocity.redis import connection

    settings = _settings(args)
    client = connection.connect(settings)
    stream = settings.shadow_alert_stream if args.shadow else settings.alert_stream
    last = "0-0" if args.from_start else "$"
    deadline = time.monotonic() + args.duration if args.duration else None
    seen = 0
    try:
        while deadline is None or time.monotonic() < deadline:
            replies = client.xread({stream: last}, block=1000, count=500)
            for _, entries in replies or []:  # type: ignore[union-attr]
                for entry_id, fields in entries:
                    last = entry_id
                    alert = json.loads(fields["alert"])
                    published_ms = int(entry_id.split("-")[0])
                    seen += 1
                    print(
                        f"rule {alert['ruleId']:>3} v{alert['ruleVersion']:<3} "
                        f"{alert['aggregatorFunctionType']:<12} "
                        f"{json.dumps(alert['key'], separators=(',', ':')):<40} "
                        f"{alert['aggregateValue']:>14} {alert['limitOperatorType']} "
                        f"{alert['limit']:<10} tx {alert['transactionId']:<12} "
                        f"event-to-Redis {published_ms - alert['eventTime']:>6} ms",
                        flush=True,
                    )
    except KeyboardInterrupt:
        pass
    print(f"{seen} alerts seen on {stream}")
    return EXIT_OK


def cmd_alerts(args: argparse.Namespace) -> int:
    from pyspark.sql import functions as F

    from velocity.delta.tables import ALERTS, read_table, table_exists
    from velocity.spark.backtest import write_alerts_jsonl
    from velocity.spark.evaluate import alert_line_rows

    settings = _settings(args)
    spark = _spark(settings, "velocity-alerts")
    path = settings.table_path(ALERTS)
    if not table_exists(spark, path):
        raise UsageError(f"no alerts table at {path}; run `velocity stream` first")
    alerts = read_table(spark, path)
    if args.kind:
        alerts = alerts.where(F.col("kind") == args.kind.upper())
    lines = alert_line_rows(alerts)
    count = write_alerts_jsonl(lines, Path(args.out), settings.data_dir / "alerts-export")
    print(f"{count} alerts written to {args.out}")
    return EXIT_OK


def cmd_lookup(args: argparse.Namespace) -> int:
    from velocity.redis import connection, mirror

    settings = _settings(args)
    client = connection.connect(settings)
    try:
        key = parse_key_values(args.key)
    except ValueError as exc:
        raise UsageError(f"--key {exc}") from exc
    try:
        result = mirror.lookup(client, settings.redis_keys, args.rule, key, args.at)
    except KeyError as exc:
        raise UsageError(f"--key: {exc.args[0]}") from exc
    print(json.dumps(result))
    return EXIT_OK


def cmd_explain(args: argparse.Namespace) -> int:
    from velocity.delta.reader import explain

    explanation = explain(_settings(args), args.alert_id)
    shown = explanation.to_json()
    if args.json:
        print(dumps_json(shown))
        return EXIT_OK
    alert = explanation.alert
    print(
        f"{alert['kind']} {alert['alertId']}: ruleId {alert['ruleId']} v{alert['ruleVersion']} "
        f"{alert['aggregatorFunctionType']} {alert['aggregateValue']} "
        f"{alert['limitOperatorType']} {alert['limit']}, key {json.dumps(alert['key'])}, "
        f"window {alert['windowStart']}..{alert['windowEnd']}, transaction {alert['transactionId']}"
    )
    for event in shown["events"]:
        value = "" if event["value"] is None else f"  {event['value']}"
        print(f"  {event['eventTime']}  {event['transactionId']}{value}")
    print(shown["arithmetic"])
    print(shown["verdict"])
    if shown["notification"]:
        print(shown["notification"])
    return EXIT_OK if explanation.agrees else EXIT_FAILURE


def _redis_state(settings: Settings) -> Any:
    from velocity.delta.live import LiveState
    from velocity.redis import connection
    from velocity.spark.redis_state import RedisState

    client = connection.connect(settings)
    connection.load_functions(client)
    return RedisState(LiveState(_spark(settings, "velocity-mirror"), settings), client)


def cmd_mirror_rebuild(args: argparse.Namespace) -> int:
    written = _redis_state(_settings(args)).rebuild()
    print(f"mirror rebuilt from Delta: {written} buckets written to Redis")
    return EXIT_OK


def cmd_mirror_migrate(args: argparse.Namespace) -> int:
    from velocity.redis import connection, mirror

    settings = _settings(args)
    client = connection.connect(settings)
    connection.load_functions(client)
    packed, dense, seen = mirror.pack_hashes(client, settings)
    print(
        f"{packed} of {seen} key states packed into one string each, {dense} made dense "
        f"({mirror.DENSE_MIN_BUCKETS}+ buckets: a hash beside the string); the rest were "
        "migrated already"
    )
    return EXIT_OK


def cmd_mirror_reconcile(args: argparse.Namespace) -> int:
    redis_state = _redis_state(_settings(args))
    if args.repair:
        drift, written = redis_state.repair()
    else:
        drift = redis_state.reconcile()
    print(
        f"checked {drift.checked} buckets: {len(drift.missing)} missing in Redis, "
        f"{len(drift.different)} different, {len(drift.extra)} only in Redis"
    )
    for label, slots in (
        ("missing", drift.missing),
        ("different", drift.different),
        ("extra", drift.extra),
    ):
        for signature_id, key, start in slots[:20]:
            print(f"  {label}: signature {signature_id} key {key} bucket {start}")
    if drift.clean:
        return EXIT_OK
    if args.repair:
        print(f"repaired: {written} buckets rewritten from Delta, {len(drift.extra)} removed")
        return EXIT_OK
    return EXIT_FAILURE


def cmd_quality_check(args: argparse.Namespace) -> int:
    """Exit 0 when every expectation passed, 1 when any failed; results are kept either way."""
    from velocity.quality import format_summary, run_quality_checks

    settings = _settings(args)
    report = run_quality_checks(
        _spark(settings, "velocity-quality"), settings, args.suite or ["all"], args.run_id
    )
    print(format_summary(report))
    return EXIT_OK if report.success else EXIT_FAILURE


def _rule_ids(text: str | None) -> list[int] | None:
    """``--rules 1,2,3`` as ids; None when not given."""
    if not text:
        return None
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise UsageError(f"--rules {text!r}: give rule ids separated by commas, e.g. 1,4") from exc
    if not ids or any(i <= 0 for i in ids):
        raise UsageError(f"--rules {text!r}: rule ids are positive integers, e.g. 1,4")
    return ids


def cmd_backfill(args: argparse.Namespace) -> int:
    from velocity.spark.backfill import Backfill

    settings = _settings(args)
    if args.late == (args.from_ms is not None or args.to_ms is not None):
        raise UsageError("give either --from MS --to MS, or --late (the uncovered late events)")
    if not args.late and (args.from_ms is None or args.to_ms is None):
        raise UsageError("--from and --to go together: give both (epoch ms)")
    backfill = Backfill(_spark(settings, "velocity-backfill"), settings)
    from velocity.operating.progress import Progress

    with Progress() as progress:
        options: dict[str, Any] = {"progress": progress, "airflow_run_id": args.airflow_run}
        if args.late:
            summary = backfill.run_late(_rule_ids(args.rules), **options)
        else:
            summary = backfill.run(args.from_ms, args.to_ms, _rule_ids(args.rules), **options)
    if summary is None:
        message = "no late or out-of-order events to backfill"
        print(json.dumps({"late_events": 0, "out_of_order_events": 0, "message": message}))
        return EXIT_OK
    print(json.dumps(summary.to_json()))
    return EXIT_OK


def cmd_maintain(args: argparse.Namespace) -> int:
    from velocity.spark import maintenance

    settings = _settings(args)
    spark = _spark(settings, f"velocity-maintain-{args.step}")
    result: Any
    match args.step:
        case "compact":
            result = asdict(maintenance.compact_buckets(spark, settings))
        case "optimize":
            result = {k: asdict(v) for k, v in maintenance.optimize_tables(spark, settings).items()}
        case "vacuum":
            tables_done = maintenance.vacuum_tables(spark, settings, args.retention_hours)
            result = {k: asdict(v) for k, v in tables_done.items()}
        case "evict":
            result = asdict(maintenance.evict_state(spark, settings))
        case _:
            summary = maintenance.reconcile_state(spark, settings, args.repair)
            print(json.dumps(asdict(summary)))
            return EXIT_OK if summary.clean_after else EXIT_FAILURE
    print(json.dumps({"step": args.step, **result}))
    return EXIT_OK


# --- parser -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="velocity", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    sub.add_parser(
        "up", help="start the local Redis and Kafka broker (installed if missing)"
    ).set_defaults(run=cmd_up)
    sub.add_parser("down", help="stop the local Redis and Kafka broker").set_defaults(run=cmd_down)

    rules = sub.add_parser("rules", help="validate and manage the rules in force")
    rules_sub = rules.add_subparsers(dest="rules_command", required=True, parser_class=_Parser)
    validate = rules_sub.add_parser("validate", help="exit 0 when every rule in FILE is valid")
    validate.add_argument("file")
    validate.set_defaults(run=cmd_rules_validate)
    preview = rules_sub.add_parser(
        "preview", help="the alerts FILE's rules would have fired over the last hours of events"
    )
    preview.add_argument("file")
    preview.add_argument("--hours", type=float, default=1.0, help="hours before the newest event")
    preview.add_argument("--sample", type=int, default=5, help="alerts shown with explanations")
    preview.add_argument("--json", action="store_true", help="one JSON object")
    preview.set_defaults(run=cmd_rules_preview)
    apply = rules_sub.add_parser("apply", help="apply FILE as new rule versions, all or nothing")
    apply.add_argument("file")
    apply.set_defaults(run=cmd_rules_apply)
    listing = rules_sub.add_parser("list", help="the rules in force (JSON lines)")
    listing.add_argument("--all", action="store_true", help="every version, deleted ones too")
    listing.set_defaults(run=cmd_rules_list)
    export = rules_sub.add_parser("export", help="the rules in force as a re-appliable file")
    export.add_argument("--out", help="write to this file instead of standard output")
    export.set_defaults(run=cmd_rules_export)
    shadow = rules_sub.add_parser(
        "shadow", help="add FILE's rules as SHADOW candidates (decided, kept from downstream)"
    )
    shadow.add_argument("file")
    shadow.set_defaults(run=cmd_rules_shadow)
    for name, text in RULE_ACTIONS.items():
        change = rules_sub.add_parser(name, help=text)
        change.add_argument("rule_id", type=int, metavar="ID")
        change.set_defaults(run=_change(name))

    reviews = sub.add_parser("reviews", help="analysts' reviews of alerts")
    reviews_sub = reviews.add_subparsers(
        dest="reviews_command", required=True, parser_class=_Parser
    )
    reviews_export = reviews_sub.add_parser(
        "export", help="the latest review of each reviewed alert as JSON lines, oldest first"
    )
    reviews_export.add_argument("--out", help="write to this file (default: standard output)")
    reviews_export.add_argument(
        "--all", action="store_true", help="every review ever recorded, not only the latest"
    )
    reviews_export.set_defaults(run=cmd_reviews_export)

    cases = sub.add_parser("cases", help="cases: the alerts of a case key, worked as one")
    cases_sub = cases.add_subparsers(dest="cases_command", required=True, parser_class=_Parser)
    cases_list = cases_sub.add_parser("list", help="the cases, newest activity first")
    cases_list.add_argument("--status", choices=["open", "assigned", "closed"], type=str.lower)
    cases_list.add_argument("--json", action="store_true", help="one JSON object a line")
    cases_list.set_defaults(run=cmd_cases_list)
    cases_show = cases_sub.add_parser("show", help="a case: its alerts and its history")
    cases_show.add_argument("case_id")
    cases_show.add_argument("--json", action="store_true")
    cases_show.set_defaults(run=cmd_cases_show)
    cases_assign = cases_sub.add_parser("assign", help="assign a case to someone")
    cases_assign.add_argument("case_id")
    cases_assign.add_argument("assignee")
    cases_close = cases_sub.add_parser(
        "close", help="close a case with a verdict, which reviews each of its alerts"
    )
    cases_close.add_argument("case_id")
    cases_close.add_argument(
        "verdict", help="CONFIRMED_FRAUD, FALSE_POSITIVE or NEEDS_REVIEW (any case)"
    )
    cases_close.add_argument("--note", default=None)
    cases_reopen = cases_sub.add_parser("reopen", help="reopen a closed case")
    cases_reopen.add_argument("case_id")
    for change_parser, run in (
        (cases_assign, cmd_cases_assign),
        (cases_close, cmd_cases_close),
        (cases_reopen, cmd_cases_reopen),
    ):
        change_parser.add_argument("--who", help="who does it (default: $USER)")
        change_parser.set_defaults(run=run)

    generate = sub.add_parser("generate", help="write synthetic events as JSON lines")
    generate.add_argument("--out", help="folder to write the event files into")
    generate.add_argument(
        "--kafka",
        action="store_true",
        help="produce to the events topic instead, over real time (--rate a second)",
    )
    generate.add_argument("--topic", help="--kafka: topic (default VELOCITY_KAFKA_EVENTS_TOPIC)")
    generate.add_argument("--events", type=int, default=100_000, help="number of events")
    generate.add_argument(
        "--rate", type=float, default=100.0, help="events per second of event time"
    )
    generate.add_argument("--keys", type=int, default=1_000, help="number of distinct payers")
    generate.add_argument("--files", type=int, default=4, help="number of files to split into")
    generate.add_argument("--start", type=int, default=None, help="first eventTime (epoch ms)")
    generate.add_argument("--spike-fraction", type=float, help="fraud bursts (default 0.01)")
    generate.add_argument("--late-fraction", type=float, help="late events (default 0.01)")
    generate.add_argument("--duplicate-fraction", type=float, help="repeated ids (default 0.005)")
    generate.add_argument("--malformed-fraction", type=float, help="bad lines (default 0.005)")
    generate.add_argument("--seed", type=int, help="seed for a reproducible run (default: drawn)")
    generate.add_argument("--overwrite", action="store_true", help="replace existing files")
    generate.add_argument(
        "--follow",
        action="store_true",
        help="write over real time: --rate per wall-clock second, eventTime = now",
    )
    generate.add_argument("--interval", type=float, default=1.0, help="--follow: seconds a file")
    generate.add_argument("--duration", type=float, help="--follow: stop after this many seconds")
    generate.set_defaults(run=cmd_generate)

    backtest = sub.add_parser(
        "backtest", help="complete-data alerts of rules over events, on Spark"
    )
    backtest.add_argument("--rules", help="rules file (default: the rules in force)")
    backtest.add_argument("--events", required=True, help="JSON-lines file or folder")
    backtest.add_argument("--out", required=True, help="alerts JSON-lines file to write")
    backtest.add_argument("--bucket-seconds", type=int, default=None)
    backtest.add_argument("--summary-json", help="also write the run's summary as JSON here")
    backtest.add_argument(
        "--keep-state",
        action="store_true",
        help="also write the accepted events, the duplicates, the buckets and the alerts as "
        "Delta tables",
    )
    backtest.set_defaults(run=cmd_backtest)

    stream = sub.add_parser(
        "stream", help="the streaming job over a folder of JSON lines or a Kafka topic"
    )
    stream.add_argument(
        "--source", choices=["folder", "kafka"], default="folder", help="where events come from"
    )
    stream.add_argument("--events", help="--source folder: the folder event files land in")
    stream.add_argument(
        "--topic", help="--source kafka: the topic (default VELOCITY_KAFKA_EVENTS_TOPIC)"
    )
    stream.add_argument(
        "--starting-offsets",
        choices=["earliest", "latest"],
        default="earliest",
        help="--source kafka: where a new checkpoint starts (an existing one resumes)",
    )
    stream.add_argument("--rules", help="rules file to apply before starting")
    stream.add_argument(
        "--trigger",
        choices=["continuous", "available-now"],
        default="continuous",
        help="available-now: process what is there, then stop",
    )
    stream.add_argument("--bucket-seconds", type=int, default=None)
    stream.add_argument(
        "--max-files-per-trigger", type=int, default=None, help="files per micro-batch at most"
    )
    stream.add_argument("--duration", type=float, help="stop after this many seconds")
    stream.set_defaults(run=cmd_stream)
    stream_status = sub.add_parser(
        "stream-status", help="the stream's health as JSON; exit 0 healthy, 1 not"
    )
    stream_status.add_argument(
        "--stale-seconds",
        type=int,
        default=None,
        help="heartbeat older than this is stalled (default VELOCITY_STREAM_STALE_SECONDS)",
    )
    stream_status.set_defaults(run=cmd_stream_status)
    stream_stop = sub.add_parser(
        "stream-stop", help="ask the running stream to stop after its micro-batch in flight"
    )
    stream_stop.add_argument("--reason", help="recorded in the request and the status file")
    stream_stop.add_argument(
        "--wait", type=float, default=0, help="wait up to this many seconds for it to stop"
    )
    stream_stop.add_argument(
        "--force",
        action="store_true",
        help="SIGKILL it (this host only) if it has not stopped after --wait",
    )
    stream_stop.set_defaults(run=cmd_stream_stop)

    watch = sub.add_parser("watch", help="print alerts live from the Redis alert stream")
    watch.add_argument("--duration", type=float, help="stop after this many seconds")
    watch.add_argument("--from-start", action="store_true", help="replay the whole stream first")
    watch.add_argument(
        "--shadow", action="store_true", help="the SHADOW rules' alerts (<alert stream>:shadow)"
    )
    watch.set_defaults(run=cmd_watch)

    alerts = sub.add_parser("alerts", help="export the alerts table as JSON lines")
    alerts.add_argument("--out", required=True)
    alerts.add_argument("--kind", choices=["ALERT", "CORRECTION", "RETRACTION"], type=str.upper)
    alerts.set_defaults(run=cmd_alerts)

    lookup = sub.add_parser("lookup", help="a rule's window aggregate for a key, from Redis")
    lookup.add_argument("--rule", type=int, required=True, metavar="ID")
    lookup.add_argument("--key", required=True, help="field=value[,field=value]")
    lookup.add_argument("--at", type=int, default=None, help="as of this time (epoch ms)")
    lookup.set_defaults(run=cmd_lookup)

    explain = sub.add_parser(
        "explain", help="the events of an alert's window and the figures that make its value"
    )
    explain.add_argument("alert_id", metavar="ALERT_ID")
    explain.add_argument("--json", action="store_true", help="one JSON object")
    explain.set_defaults(run=cmd_explain)

    mirror_cmd = sub.add_parser("mirror", help="the Redis mirror of the Delta buckets")
    mirror_sub = mirror_cmd.add_subparsers(
        dest="mirror_command", required=True, parser_class=_Parser
    )
    mirror_sub.add_parser("rebuild", help="refill Redis from Delta").set_defaults(
        run=cmd_mirror_rebuild
    )
    mirror_sub.add_parser(
        "migrate",
        help="pack the key states a Velocity before 0.3 wrote as hashes (once, idempotent)",
    ).set_defaults(run=cmd_mirror_migrate)
    reconcile = mirror_sub.add_parser(
        "reconcile", help="compare Redis with Delta; exit 1 on drift unless --repair"
    )
    reconcile.add_argument("--repair", action="store_true", help="rewrite Redis from Delta")
    reconcile.set_defaults(run=cmd_mirror_reconcile)

    backfill = sub.add_parser(
        "backfill", help="replay a time range: emit CORRECTION / RETRACTION alerts (SPEC §3)"
    )
    backfill.add_argument("--from", dest="from_ms", type=int, help="first eventTime (epoch ms)")
    backfill.add_argument("--to", dest="to_ms", type=int, help="last eventTime (epoch ms)")
    backfill.add_argument(
        "--late", action="store_true", help="the range of the late events no backfill covered"
    )
    backfill.add_argument("--rules", help="only these rule ids, e.g. 1,4 (default: all ACTIVE)")
    backfill.add_argument(
        "--airflow-run",
        help="the Airflow DAG run that runs this backfill, recorded with it (the Velocity "
        "page links the run's figures to it)",
    )
    backfill.set_defaults(run=cmd_backfill)

    maintain = sub.add_parser("maintain", help="compact, optimize, vacuum, evict, reconcile")
    maintain_sub = maintain.add_subparsers(dest="step", required=True, parser_class=_Parser)
    maintain_sub.add_parser(
        "compact", help="fold sealed g-wide buckets into hour buckets"
    ).set_defaults(run=cmd_maintain)
    maintain_sub.add_parser("optimize", help="OPTIMIZE every live table").set_defaults(
        run=cmd_maintain
    )
    vacuum = maintain_sub.add_parser("vacuum", help="VACUUM every live table")
    vacuum.add_argument(
        "--retention-hours", type=int, default=168, help="keep files younger (at least 168)"
    )
    vacuum.set_defaults(run=cmd_maintain)
    maintain_sub.add_parser(
        "evict", help="drop Delta and Redis buckets outside the horizon"
    ).set_defaults(run=cmd_maintain)
    reconcile_state = maintain_sub.add_parser(
        "reconcile", help="compare Redis with Delta (exit 1 on drift left)"
    )
    reconcile_state.add_argument("--repair", action="store_true", help="rewrite Redis from Delta")
    reconcile_state.set_defaults(run=cmd_maintain)

    quality = sub.add_parser("quality", help="data-quality suites on the live tables")
    quality_sub = quality.add_subparsers(
        dest="quality_command", required=True, parser_class=_Parser
    )
    quality_check = quality_sub.add_parser(
        "check", help="run the suites; exit 1 with a summary when an expectation fails"
    )
    quality_check.add_argument(
        "--suite",
        action="append",
        choices=["all", "events", "quarantine", "buckets", "alerts"],
        help="suite to run (repeatable; default all)",
    )
    quality_check.add_argument("--run-id", help="name of this run (default: time + random)")
    quality_check.set_defaults(run=cmd_quality_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Velocity's own progress lines (one per micro-batch) go to standard error.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("velocity").setLevel(logging.INFO)
    try:
        args = build_parser().parse_args(argv)
        # Loaded before any command runs, so a bad setting fails every command the same way.
        args.settings = load_settings(bucket_seconds=getattr(args, "bucket_seconds", None))
        return int(args.run(args))
    except InvalidRuleError as exc:
        print("invalid rules, nothing applied:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return EXIT_USAGE
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except VelocityError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
