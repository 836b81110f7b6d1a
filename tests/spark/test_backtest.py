"""The backtest on real Spark + Delta equals the naive reference on generated data."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path

import pytest

from tests.reference import reference_alerts
from velocity.arrival import Arrivals, Verdict
from velocity.buckets import BucketAggregate, bucket_start
from velocity.cli import sample_rules_path
from velocity.delta import tables
from velocity.generate import GenerateOptions, generate_events
from velocity.rules import Rule, distinct_counted, key_text, parse_rules, rules_by_signature
from velocity.schema import Event, Rejection, is_blank, parse_event_line
from velocity.settings import Settings
from velocity.spark.backtest import backtest_root, run_backtest, write_alerts_jsonl
from velocity.spark.ingest import parse_events, read_event_lines
from velocity.windows import format_aggregate

pytestmark = pytest.mark.spark

# Small windows and limits so that every rule fires on a few thousand events,
# next to the sample rules; together they cover every aggregator and operator spelling.
EXTRA_RULES = [
    {
        "ruleId": 11,
        "groupingKeyNames": ["payerId"],
        "aggregatorFunctionType": "COUNT",
        "limitOperatorType": ">=",
        "limit": 3,
        "windowMinutes": 5,
    },
    {
        "ruleId": 12,
        "groupingKeyNames": ["payerId"],
        "aggregatorFunctionType": "sum",
        "aggregateFieldName": "paymentAmount",
        "limitOperatorType": "GREATER",
        "limit": 20000,
        "windowMinutes": 10,
        "filter": {"paymentType": "CRD"},
    },
    {
        "ruleId": 13,
        "groupingKeyNames": ["beneficiaryId"],
        "aggregatorFunctionType": "AVG",
        "aggregateFieldName": "paymentAmount",
        "limitOperatorType": "lt",
        "limit": 500.5,
        "windowMinutes": 2,
    },
    {
        "ruleId": 14,
        "groupingKeyNames": [],
        "aggregatorFunctionType": "MIN",
        "aggregateFieldName": "paymentAmount",
        "limitOperatorType": "lte",
        "limit": 10,
        "windowMinutes": 1,
    },
    {
        "ruleId": 15,
        "groupingKeyNames": ["payerId", "deviceId"],
        "aggregatorFunctionType": "MAX",
        "aggregateFieldName": "paymentAmount",
        "limitOperatorType": "gte",
        "limit": 5000,
        "windowMinutes": 3,
    },
    {
        "ruleId": 16,
        "groupingKeyNames": ["payerId"],
        "aggregatorFunctionType": "UNIQUE_COUNT",
        "aggregateFieldName": "ip",
        "limitOperatorType": "GREATER_EQUAL",
        "limit": 2,
        "windowMinutes": 15,
    },
    {
        "ruleId": 17,
        "groupingKeyNames": ["payerId"],
        "aggregatorFunctionType": "COUNT",
        "limitOperatorType": "=",
        "limit": 2,
        "windowMinutes": 1,
    },
    {
        "ruleId": 18,
        "groupingKeyNames": ["action"],
        "aggregatorFunctionType": "UNIQUE_COUNT",
        "aggregateFieldName": "beneficiaryId",
        "limitOperatorType": "ne",
        "limit": 1,
        "windowMinutes": 1,
        "filter": {"paymentType": ["CSH", "CRD"]},
    },
    {
        "ruleId": 19,
        "groupingKeyNames": ["beneficiaryId"],
        "aggregatorFunctionType": "SUM",
        "aggregateFieldName": "paymentAmount",
        "limitOperatorType": "LESS_EQUAL",
        "limit": 100,
        "windowMinutes": 1,
    },
    {
        "ruleId": 20,
        "groupingKeyNames": ["payerId"],
        "aggregatorFunctionType": "COUNT",
        "limitOperatorType": "<",
        "limit": 2,
        "windowMinutes": 1,
        "filter": {"paymentType": "CSH"},
    },
]


def all_rules() -> list[Rule]:
    extra = [{"ruleState": "ACTIVE", **r} for r in EXTRA_RULES]
    sample = json.loads(sample_rules_path().read_text())
    entries = parse_rules(json.dumps(sample + extra))
    return [e.with_version(1) for e in entries if isinstance(e, Rule)]


def accepted_events(folder: Path) -> tuple[list[Event], list[tuple[str, Rejection]], int]:
    """First arrival of each transactionId, in arrival order, far-future events quarantined
    (``velocity.arrival``); (events, (raw line, rejection)s, duplicates)."""
    arrivals = Arrivals((), None, Settings.model_fields["max_future_seconds"].default * 1000)
    events: list[Event] = []
    rejected: list[tuple[str, Rejection]] = []
    duplicates = 0
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if is_blank(line):
                continue
            parsed = parse_event_line(line)
            if not isinstance(parsed, Event):
                rejected.append((line, parsed))
                continue
            verdict = arrivals.admit(parsed.transaction_id, parsed.event_time)
            if verdict is Verdict.FUTURE:
                rejected.append((line, arrivals.future_rejection(parsed.event_time)))
            elif verdict is Verdict.DUPLICATE:
                duplicates += 1
            else:
                events.append(parsed)
    return events, rejected, duplicates


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("events")
    generate_events(
        folder,
        GenerateOptions(
            events=4000,
            rate=3.0,
            payers=40,
            files=3,
            spike_fraction=0.03,
            late_fraction=0.02,
            duplicate_fraction=0.02,
            malformed_fraction=0.02,
            seed=11,
        ),
    )
    return folder


@pytest.mark.parametrize("bucket_seconds", [60, 15])
def test_backtest_equals_reference(
    spark, data_settings: Settings, generated: Path, tmp_path: Path, bucket_seconds: int
) -> None:
    settings = data_settings.model_copy(update={"bucket_seconds": bucket_seconds})
    rules = all_rules()
    out = tmp_path / "alerts.jsonl"

    summary = run_backtest(spark, settings, rules, str(generated), out)
    # A backtest answers what the rules would have fired: the state it decided from is
    # written only when asked (keep_state, test_backtest_tables).
    root = backtest_root(settings)
    assert (root / tables.ALERTS).is_dir() and (root / tables.QUARANTINE).is_dir()
    assert not any((root / name).exists() for name in (tables.EVENTS, tables.BUCKETS))
    assert not summary.kept_state and summary.buckets == 0

    events, rejected, duplicates = accepted_events(generated)
    expected = reference_alerts(events, rules, bucket_seconds)
    alerts = [json.loads(line) for line in out.read_text().splitlines()]
    got = {(a["ruleId"], a["transactionId"]) for a in alerts}
    assert len(alerts) == len(got), "one alert per (rule, event)"
    assert got == expected.fired
    fired_rules = {rule_id for rule_id, _ in got}
    assert fired_rules >= {r["ruleId"] for r in EXTRA_RULES}, "every extra rule must fire"
    for alert in alerts:
        pair = (alert["ruleId"], alert["transactionId"])
        assert alert["aggregateValue"] == format_aggregate(expected.values[pair])
        assert alert["windowStart"] == expected.window_starts[pair]
        assert alert["windowEnd"] == alert["eventTime"]
        assert alert["ruleVersion"] == 1 and alert["kind"] == "ALERT"

    assert (summary.accepted, summary.quarantined, summary.duplicates) == (
        len(events),
        len(rejected),
        duplicates,
    )
    assert summary.quarantined > 0 and summary.duplicates > 0
    assert summary.alerts == len(alerts)


def test_backtest_tables(spark, data_settings: Settings, generated: Path, tmp_path: Path) -> None:
    rules = all_rules()
    run_backtest(
        spark, data_settings, rules, str(generated), tmp_path / "alerts.jsonl", keep_state=True
    )
    root = backtest_root(data_settings)
    events, rejected, _ = accepted_events(generated)

    quarantine = tables.read_table(spark, root / tables.QUARANTINE).collect()
    assert len(quarantine) == len(rejected)
    why = dict(rejected)
    for row in quarantine:
        expected = why[row["raw"]]
        assert (row["reason_code"], row["reason"]) == (expected.code.value, expected.message)

    stored = tables.read_table(spark, root / tables.EVENTS)
    assert sorted(r["transactionId"] for r in stored.select("transactionId").collect()) == sorted(
        e.transaction_id for e in events
    )
    amounts = {r["transactionId"]: r["paymentAmount"] for r in stored.collect()}
    assert all(amounts[e.transaction_id] == e.amount for e in events)

    # Buckets equal the pure BucketAggregate over the same events, signature by signature.
    width = data_settings.bucket_width_ms
    expected_buckets: dict[tuple[str, str, int], BucketAggregate] = defaultdict(BucketAggregate)
    counted = distinct_counted(rules)
    for signature in rules_by_signature(rules):
        field = signature.aggregate_field
        for event in events:
            key = signature.key_of(event.values)
            if key is None or not signature.passes_filter(event.values):
                continue
            value = event.value(field) if field else None
            number = event.amount if field == "paymentAmount" else None
            slot = (signature.signature_id, key_text(key), bucket_start(event.event_time, width))
            one = BucketAggregate.of_event(value, number)
            if signature.signature_id not in counted:  # no UNIQUE_COUNT rule reads them
                one = one._replace(distinct=frozenset())
            expected_buckets[slot] = expected_buckets[slot].merge(one)
    rows = tables.read_table(spark, root / tables.BUCKETS).collect()
    got = {
        (r["signature_id"], r["key"], r["bucket_start"]): BucketAggregate(
            r["event_count"],
            r["value_count"],
            r["value_sum"],
            r["value_min"],
            r["value_max"],
            frozenset(r["distinct_values"]),
        )
        for r in rows
    }
    assert len(rows) == len(got)
    assert got == dict(expected_buckets)
    assert Counter(r["bucket_width_ms"] for r in rows) == {width: len(rows)}
    assert isinstance(rows[0]["event_count"], int) and rows[0]["event_count"] > 0
    assert Decimal(0) <= min(r["value_min"] for r in rows if r["value_min"] is not None)


def test_each_line_is_parsed_once(spark, generated: Path) -> None:
    """The parser runs once per line: Spark's optimizer copies a deterministic UDF into
    every expression that uses its result (the blank-line filter and each column)."""
    parsed = parse_events(read_event_lines(spark, str(generated)))
    plan = parsed._jdf.queryExecution().executedPlan().toString()
    assert plan.count("ArrowEvalPython") == 1, plan


def test_alert_file_of_many_parts_is_in_alert_order(
    spark, data_settings: Settings, generated: Path, tmp_path: Path
) -> None:
    run_backtest(spark, data_settings, all_rules(), str(generated), tmp_path / "alerts.jsonl")
    stored = tables.read_table(spark, backtest_root(data_settings) / tables.ALERTS)
    out = tmp_path / "many.jsonl"
    count = write_alerts_jsonl(stored, out, tmp_path / "parts", alerts_per_part=50)
    lines = out.read_text(encoding="utf-8").splitlines()
    assert count == len(lines) == stored.count() > 150
    records = [json.loads(line) for line in lines]
    order = [(r["eventTime"], r["ruleId"], r["transactionId"], r["kind"]) for r in records]
    assert order == sorted(order)
    assert lines == (tmp_path / "alerts.jsonl").read_text(encoding="utf-8").splitlines()
    assert not (tmp_path / "parts").exists()
