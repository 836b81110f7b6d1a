"""The backtest on real Spark + Delta equals the naive reference on generated data."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from tests.reference import reference_alerts
from velocity.delta import tables
from velocity.domain.arrival import Arrivals, Verdict
from velocity.domain.buckets import BucketAggregate, bucket_start
from velocity.domain.rules import Rule, distinct_counted, key_text, parse_rules, rules_by_signature
from velocity.domain.schema import Event, Rejection, is_blank, parse_event_line
from velocity.domain.windows import format_aggregate
from velocity.generate import GenerateOptions, generate_events
from velocity.resources import sample_rules_path
from velocity.settings import Settings
from velocity.spark.backtest import backtest_root, run_backtest, write_alerts_jsonl
from velocity.spark.evaluate import alert_line_rows

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
    (``velocity.domain.arrival``); (events, (raw line, rejection)s, duplicates)."""
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
    assert (root / tables.QUARANTINE).is_dir()
    kept = (tables.EVENTS, tables.DUPLICATES, tables.BUCKETS, tables.ALERTS)
    assert not any((root / name).exists() for name in kept)
    assert not summary.kept_state and summary.buckets == 0

    events, rejected, duplicates = accepted_events(generated)
    expected = reference_alerts(events, rules, bucket_seconds)
    alerts = [json.loads(line) for line in out.read_text().splitlines()]
    got = {(a["ruleId"], a["transactionId"]) for a in alerts}
    assert len(alerts) == len(got), "one alert per (rule, event)"
    assert got == expected.fired
    fired_rules = {rule_id for rule_id, _ in got}
    outcomes = {rule.rule_id: rule.outcome.value for rule in rules}
    assert {outcomes[rule_id] for rule_id in fired_rules} == {"ALERT", "REVIEW", "BLOCK"}
    assert fired_rules >= {r["ruleId"] for r in EXTRA_RULES}, "every extra rule must fire"
    for alert in alerts:
        pair = (alert["ruleId"], alert["transactionId"])
        assert alert["aggregateValue"] == format_aggregate(expected.values[pair])
        assert alert["windowStart"] == expected.window_starts[pair]
        assert alert["windowEnd"] == alert["eventTime"]
        assert alert["ruleVersion"] == 1 and alert["kind"] == "ALERT"
        assert alert["outcome"] == outcomes[alert["ruleId"]], "its rule's (SPEC §4)"

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


def test_the_one_pass_reads_and_admits_lines_as_spark_and_the_reference_would(
    spark, generated: Path, tmp_path: Path
) -> None:
    """Lines as Spark's text source gives them (a nested folder, a gzip file, "\\r\\n"
    and "\\r" line ends, bytes that are not UTF-8, blank lines; files starting with "."
    or "_" skipped), in arrival order, each with the verdict of the per-line reference
    (``parse_event_line``, then ``Arrivals``: duplicates across files, an event too far
    ahead of the newest accepted one)."""
    import gzip

    folder = tmp_path / "lines"
    (folder / "b").mkdir(parents=True)
    base = [line for f in sorted(generated.glob("*.jsonl")) for line in f.read_bytes().splitlines()]
    first, second = base[:300], base[300:600]
    far = json.loads(
        next(line for line in first if isinstance(parse_event_line(line.decode()), Event))
    )
    far.update(transactionId="far-ahead", eventTime=far["eventTime"] + 10 * 86_400_000)
    (folder / "a.jsonl").write_bytes(
        b"\r\n".join(first[:100]) + b"\r\n\r\n" + b"\r".join(first[100:200]) + b"\n"
        + json.dumps(far).encode() + b"\n" + b'{"transactionId": "t\xff"}\n'
        + b"\n".join(first[200:]) + b"\n"
    )  # fmt: skip
    (folder / "b" / "c.jsonl.gz").write_bytes(gzip.compress(b"\n".join(second + first[:50])))
    (folder / ".hidden.jsonl").write_bytes(first[0] + b"\n")
    (folder / "_SUCCESS").write_bytes(b"")

    from velocity.spark.ingest import ADMITTED_SCHEMA, admitted_lines, split_admitted

    staged = admitted_lines(
        spark, str(folder), 3_600_000, keep_raw=True, staging=tmp_path / "staged"
    )
    # In arrival order: (file, block, line).
    admitted = sorted(staged.collect(), key=lambda r: (r["source_file"], r["line_seq"]))
    assert admitted and list(admitted[0].asDict()) == ADMITTED_SCHEMA.fieldNames()
    # Spark's text source: the same lines, in the same order (file by name, line by line).
    text = spark.read.option("recursiveFileLookup", "true").text(str(folder))
    spark_lines = [
        (r["path"], r["value"])
        for r in text.select("value", F.col("_metadata.file_path").alias("path")).collect()
    ]
    spark_lines.sort(key=lambda line: line[0])  # stable: each file's lines stay in order
    non_blank = [(path, line) for path, line in spark_lines if not is_blank(line)]
    assert [(r["source_file"], r["raw"]) for r in admitted] == non_blank
    assert [r["line_seq"] for r in admitted if r["source_file"].endswith(".gz")] == list(range(350))

    arrivals = Arrivals((), None, 3_600_000)
    expected = []
    for _, line in non_blank:
        parsed = parse_event_line(line)
        if not isinstance(parsed, Event):
            expected.append(("rejected", parsed.code.value))
        elif (verdict := arrivals.admit(parsed.transaction_id, parsed.event_time)) is (
            Verdict.FUTURE
        ):
            expected.append(("future", arrivals.future_rejection(parsed.event_time).code.value))
        else:
            expected.append((verdict.value, None))
    assert [(r["fate"], r["reason_code"]) for r in admitted] == expected
    assert {"future", "duplicate", "rejected", "accepted"} <= {fate for fate, _ in expected}

    ingested = split_admitted(spark.createDataFrame(admitted, ADMITTED_SCHEMA))
    fates = Counter(fate for fate, _ in expected)
    assert ingested.events.count() == fates["accepted"]
    assert ingested.duplicates.count() == fates["duplicate"] >= 50  # the gzip file's repeats
    assert ingested.quarantine.count() == fates["rejected"] + fates["future"]
    lean = admitted_lines(
        spark, str(folder), 3_600_000, keep_raw=False, staging=tmp_path / "lean"
    ).collect()
    assert all(r["raw"] is None for r in lean if r["fate"] == "accepted")
    assert all(r["raw"] for r in lean if r["fate"] != "accepted")


def test_alert_file_of_many_parts_is_in_alert_order(
    spark, data_settings: Settings, generated: Path, tmp_path: Path
) -> None:
    run_backtest(
        spark,
        data_settings,
        all_rules(),
        str(generated),
        tmp_path / "alerts.jsonl",
        keep_state=True,
    )
    stored = tables.read_table(spark, backtest_root(data_settings) / tables.ALERTS)
    out = tmp_path / "many.jsonl"
    # As `velocity alerts --out` exports a table.
    count = write_alerts_jsonl(alert_line_rows(stored), out, tmp_path / "parts", alerts_per_part=50)
    lines = out.read_text(encoding="utf-8").splitlines()
    assert count == len(lines) == stored.count() > 150
    records = [json.loads(line) for line in lines]
    order = [(r["eventTime"], r["ruleId"], r["transactionId"], r["kind"]) for r in records]
    assert order == sorted(order)
    assert lines == (tmp_path / "alerts.jsonl").read_text(encoding="utf-8").splitlines()
    assert not (tmp_path / "parts").exists()
