"""The alerts the stream made: `velocity watch` (live, from Redis), `velocity alerts` (the
alerts table exported as JSON lines) and `velocity explain` (an alert's window and figures)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from velocity.cli.shared import EXIT_FAILURE, EXIT_OK, settings_from, spark_session
from velocity.domain.decimals import dumps_json
from velocity.errors import UsageError


def watch(args: argparse.Namespace) -> int:
    """Print alerts as they reach the Redis stream: rule, key, value and how old the event is."""
    from velocity.redis import connection

    settings = settings_from(args)
    client = connection.connect(settings)
    stream = settings.shadow_alert_stream if args.shadow else settings.alert_stream
    last = "0-0" if args.from_start else "$"
    if args.from_start:
        print(stream_start(client, stream, settings.redis_alert_stream_retention), flush=True)
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


def stream_start(client: object, stream: str, retention: str) -> str:
    """What a replay from the start of the alert stream begins with: the stream keeps only
    its retention, and what it trimmed is in the alerts table."""
    first = client.xrange(stream, count=1)  # type: ignore[attr-defined]
    kept = f"{stream} keeps {retention} (VELOCITY_REDIS_ALERT_STREAM_RETENTION)"
    if not first:
        return f"{kept}; it is empty"
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(int(first[0][0].split("-")[0]) / 1000))
    return (
        f"{kept}; its oldest entry was published {at}: alerts before it are in the alerts "
        "table (`velocity alerts --out FILE`)"
    )


def export_alerts(args: argparse.Namespace) -> int:
    from pyspark.sql import functions as F

    from velocity.delta.tables import ALERTS, read_table, table_exists
    from velocity.spark.backtest import write_alerts_jsonl
    from velocity.spark.evaluate import alert_line_rows

    settings = settings_from(args)
    spark = spark_session(settings, "velocity-alerts")
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


def explain(args: argparse.Namespace) -> int:
    from velocity.delta import reader

    explanation = reader.explain(settings_from(args), args.alert_id)
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
