"""The backfill on real Spark + Delta + Redis: after it, the effective alerts of a stream
that saw late events equal the complete-data result (SPEC §3), and a rerun amends nothing."""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from tests.builders import generated_in_arrival_order
from tests.spark.streaming import run_available_now
from velocity.analyst.cases import CaseEventKind, CaseStatus, case_key_text
from velocity.delta import tables
from velocity.delta.case_store import CaseStore
from velocity.delta.live import LiveState, LiveTables
from velocity.delta.reader import case_alerts
from velocity.domain.rules import Rule, RuleState, StateChange, parse_rules
from velocity.errors import UsageError
from velocity.generate import GenerateOptions
from velocity.resources import sample_rules_path
from velocity.settings import Settings
from velocity.spark import maintenance
from velocity.spark.backfill import Backfill
from velocity.spark.backtest import run_backtest
from velocity.spark.stream import StreamJob

pytestmark = pytest.mark.spark


def effective_alerts(spark, settings: Settings) -> dict[tuple[int, str], int]:
    """ALERT + CORRECTION − RETRACTION per (rule, transaction), zeros left out."""
    net: Counter[tuple[int, str]] = Counter()
    for row in tables.read_table(spark, LiveTables.of(settings).alerts).collect():
        net[(row["ruleId"], row["transactionId"])] += -1 if row["kind"] == "RETRACTION" else 1
    return {pair: n for pair, n in net.items() if n}


@pytest.mark.timeout(300)
def test_backfill_makes_the_stream_equal_the_complete_data_result(
    spark, data_settings: Settings, late_events: Path, late_complete: Complete
) -> None:
    """And its amendments reach the cases as the stream's alerts do (SPEC §4a): see
    ``assert_amendments_are_in_cases``."""
    job, complete = stream_sample_rules(spark, data_settings, late_events), late_complete
    live = LiveTables.of(data_settings)
    assert tables.read_table(spark, live.late_events).count() > 0
    before = effective_alerts(spark, data_settings)
    assert set(before) != set(complete), "late events must make the stream differ"
    # Every other case of the stream closed: the corrections of those keys open new cases.
    job.flush()
    store = CaseStore(data_settings)
    streamed = {c.case_id: c.case_key for c in store.cases().values()}
    closed = sorted(streamed)[::2]
    for case_id in closed:
        store.close(case_id, "false positive", None, "ana")
    open_before = {k: c for c, k in streamed.items() if c not in closed}

    backfill = Backfill(spark, data_settings)
    pending = backfill.pending_late_range()
    assert pending is not None
    recorded = tables.read_table(spark, live.late_events).groupBy("reason").count().collect()
    assert {r["reason"]: r["count"] for r in recorded} == {
        "late": pending.late,
        **({"out_of_order": pending.out_of_order} if pending.out_of_order else {}),
    }
    from_ms, to_ms = pending.from_ms, pending.to_ms
    summary = backfill.run(from_ms, to_ms, late=pending)
    assert (summary.late_events, summary.out_of_order_events) == (
        pending.late,
        pending.out_of_order,
    )
    assert summary.corrections + summary.retractions > 0
    # The stream counted its late events into the buckets: the recount finds nothing to
    # repair, and the lock is held for the commit only.
    assert summary.buckets_rebuilt == 0
    assert 0 < summary.lock_seconds < summary.seconds

    after = effective_alerts(spark, data_settings)
    assert set(after) == set(complete)
    assert all(n == 1 for n in after.values()), "each decision in effect exactly once"
    amendments = [
        r.asDict() for r in tables.read_table(spark, live.alerts).where("kind != 'ALERT'").collect()
    ]
    assert len(amendments) == summary.corrections + summary.retractions
    for amendment in amendments:
        if amendment["kind"] == "CORRECTION":
            expected = complete[(amendment["ruleId"], amendment["transactionId"])]
            assert (amendment["aggregateValue"], amendment["windowStart"]) == expected

    # Published once to the Redis alert stream, marked as a backfill's.
    entries = job.redis.xrange(data_settings.alert_stream)
    published = [json.loads(f["alert"]) for _, f in entries if f.get("backfill") == "1"]
    assert sorted(a["alertId"] for a in published) == sorted(a["alertId"] for a in amendments)
    # Each amendment carries the outcome of the rule version it amends (SPEC §4).
    outcomes = {1: "REVIEW", 6: "BLOCK"}  # the sample rules'; the others' are ALERT
    for amendment in [*amendments, *published]:
        assert amendment["outcome"] == outcomes.get(amendment["ruleId"], "ALERT"), amendment

    assert_amendments_are_in_cases(spark, data_settings, streamed, open_before, closed)

    # Covered: nothing pending, and a rerun of the same range amends nothing.
    assert backfill.pending_late_range() is None
    case_events = len(store.events())
    again = backfill.run(from_ms, to_ms)
    assert (again.corrections, again.retractions, again.republished) == (0, 0, 0)
    assert effective_alerts(spark, data_settings) == after
    assert len(store.events()) == case_events, "nothing new for the cases either"


def assert_amendments_are_in_cases(
    spark,
    settings: Settings,
    streamed: dict[str, str],
    open_before: dict[str, str],
    closed: list[str],
) -> None:
    """After a backfill: each CORRECTION (a new alert, or a value corrected) joined the
    open case of its payment's payerId (``open_before``, by case key) or, the key having
    none, opened a new one (by the backfill); each RETRACTION is in the case of the record
    it retracts, whose alert list shows it beside that record, marked retracted; each
    case counts its alerts in the table (retractions aside) and its payments' amount (each
    once); the ``closed`` stay so."""
    rows = [r.asDict() for r in tables.read_table(spark, LiveTables.of(settings).alerts).collect()]
    payments = tables.read_table(spark, LiveTables.of(settings).events).collect()
    payer_of = {r["transactionId"]: r["payerId"] for r in payments}
    amount_of = {r["transactionId"]: r["paymentAmount"] for r in payments}
    cases = CaseStore(settings).cases()
    stream_fired = {(r["ruleId"], r["ruleVersion"], r["transactionId"]) for r in rows
                    if r["kind"] == "ALERT"}  # fmt: skip
    joined, opened, new_alerts = set(), set(), 0
    for row in (r for r in rows if r["kind"] == "CORRECTION"):
        key = case_key_text("payerId", payer_of[row["transactionId"]])
        case = cases[row["caseId"]]
        assert case.case_key == key, row
        if key in open_before:
            assert row["caseId"] == open_before[key], row
            joined.add(row["caseId"])
        else:
            assert row["caseId"] not in streamed and case.history[0].who == "velocity-backfill"
            opened.add(row["caseId"])
        new_alerts += (row["ruleId"], row["ruleVersion"], row["transactionId"]) not in stream_fired
    assert joined and opened and new_alerts, (joined, opened, new_alerts)

    fired: dict[tuple[int, int, str], list[dict]] = {}
    for r in rows:
        if r["kind"] != "RETRACTION":
            fired.setdefault((r["ruleId"], r["ruleVersion"], r["transactionId"]), []).append(r)
    retractions: dict[str, list[tuple[dict, dict]]] = {}
    for retraction in (r for r in rows if r["kind"] == "RETRACTION"):
        decision = (retraction["ruleId"], retraction["ruleVersion"], retraction["transactionId"])
        taken_back = max(
            (r for r in fired[decision] if r["decisionTime"] < retraction["decisionTime"]),
            key=lambda r: r["decisionTime"],
        )
        assert retraction["caseId"] == taken_back["caseId"] is not None
        retractions.setdefault(retraction["caseId"], []).append((retraction, taken_back))
    assert retractions
    for case_id, pairs in retractions.items():
        assert any(e.event is CaseEventKind.RETRACTED for e in cases[case_id].history)
        listed = {a["alertId"]: a for a in case_alerts(settings, case_id)}
        for retraction, taken_back in pairs:
            assert listed[retraction["alertId"]]["kind"] == "RETRACTION"
            assert listed[taken_back["alertId"]]["retracted"] is True

    in_table = Counter(r["caseId"] for r in rows if r["kind"] != "RETRACTION")
    assert {c.case_id: c.alerts for c in cases.values()} == dict(in_table)
    paid: dict[str, set[str]] = {}
    for row in (r for r in rows if r["kind"] != "RETRACTION"):
        paid.setdefault(row["caseId"], set()).add(row["transactionId"])
    # A payment counts once in its case's amount, however many of its alerts joined.
    assert {c.case_id: c.amount for c in cases.values()} == {
        case_id: sum(amount_of[tx] for tx in txs) for case_id, txs in paid.items()
    }
    assert all(cases[c].status is CaseStatus.CLOSED for c in closed)


def test_backfill_rejects_a_bad_range_and_unknown_rules(spark, data_settings: Settings) -> None:
    backfill = Backfill(spark, data_settings)
    backfill.state.rule_store.apply(parse_rules(sample_rules_path().read_text()))
    with pytest.raises(UsageError, match="not a time range"):
        backfill.run(10, 5)
    with pytest.raises(UsageError, match=r"\[99\]"):
        backfill.run(0, 5, rule_ids=[1, 99])


@pytest.mark.timeout(300)
def test_a_backfill_records_its_airflow_run_and_lock_time_in_an_older_backfills_table(
    spark, data_settings: Settings
) -> None:
    """A backfills table made before lock_seconds and airflow_run_id gains them when the
    backfill opens it, and the run records both (the Velocity page reads them)."""
    from pyspark.sql.types import StructType

    from velocity.delta.reader import recorded_backfills

    live = LiveTables.of(data_settings)
    later = ("lock_seconds", "airflow_run_id")
    older = StructType([f for f in tables.BACKFILL_SCHEMA.fields if f.name not in later])
    spark.createDataFrame([], older).write.format("delta").mode("append").save(str(live.backfills))
    summary = Backfill(spark, data_settings).run(0, 5, airflow_run_id="manual__2026-01-01")
    [run] = recorded_backfills(data_settings)  # no rule in force: recorded at once
    assert (run.run_id, run.airflow_run_id) == (summary.run_id, "manual__2026-01-01")
    assert run.lock_seconds == summary.lock_seconds
    assert summary.to_json()["airflow_run_id"] == "manual__2026-01-01"


def test_backfill_decides_each_event_with_the_rule_versions_its_batch_was_decided_with(
    spark, data_settings: Settings, tmp_path: Path
) -> None:
    """The sequence found by hand (issue 22): rule 4 paused, then re-activated with the
    same body (version 3), after the stream decided with version 1; a backfill of the
    range re-sent every version-1 ALERT as a version-3 CORRECTION. Now it amends nothing:
    events of batches decided under version 1 are decided with version 1, those streamed
    after the re-activation with version 3 (SPEC §3)."""
    staging = generated_in_arrival_order(
        tmp_path / "staging",
        GenerateOptions(events=1600, rate=0.5, payers=20, files=4, late_fraction=0.0,
                        duplicate_fraction=0.01, malformed_fraction=0.01, seed=44),
    )  # fmt: skip
    files = sorted(staging.glob("*.jsonl"))
    events = tmp_path / "events"
    events.mkdir()
    for order, path in enumerate(files[:3]):
        shutil.copy(path, events / path.name)
        os.utime(events / path.name, (1_700_000_000 + order, 1_700_000_000 + order))
    stream_sample_rules(spark, data_settings, events)
    store = LiveState(spark, data_settings).rule_store
    store.apply([StateChange(4, RuleState.PAUSE)])  # `velocity rules pause 4`
    store.apply([StateChange(4, RuleState.ACTIVE)])  # `velocity rules activate 4`
    assert {r.rule_id: r.version for r in store.in_force()}[4] == 3
    shutil.copy(files[3], events / files[3].name)
    os.utime(events / files[3].name, (1_700_000_010, 1_700_000_010))
    run_available_now(StreamJob(spark, data_settings), events)

    alerts = [r.asDict() for r in tables.read_table(spark, LiveTables.of(data_settings).alerts)
              .where("ruleId = 4").collect()]  # fmt: skip
    versions = Counter(a["ruleVersion"] for a in alerts)
    assert versions[1] > 0 and versions[3] > 0, versions
    epochs = LiveState(spark, data_settings).rule_epochs()
    assert [dict(v)[4] for v in epochs.versions] == [1, 3]

    newest = max(a["eventTime"] for a in alerts)
    summary = Backfill(spark, data_settings).run(0, newest)
    assert (summary.corrections, summary.retractions) == (0, 0)
    assert summary.decisions_fired >= len(alerts)


def stream_sample_rules(spark, settings: Settings, events: Path) -> StreamJob:
    """The sample rules applied and streamed over ``events``: one file a batch, available now."""
    job = StreamJob(spark, settings)
    job.rule_store.apply(parse_rules(sample_rules_path().read_text()))
    run_available_now(job, events)
    return job


Complete = dict[tuple[int, str], tuple[str, int]]


def complete_data(
    spark, settings: Settings, events: Path, tmp_path: Path, rules_text: str | None = None
) -> Complete:
    """The backtest of the sample rules (or the rules of ``rules_text``) over ``events``:
    the complete-data (value, windowStart) per (rule, transaction)."""
    entries = parse_rules(rules_text or sample_rules_path().read_text())
    rules = [r.with_version(1) for r in entries if isinstance(r, Rule)]
    out = tmp_path / "bt.jsonl"
    run_backtest(spark, settings.model_copy(update={"data_dir": tmp_path / "bt"}), rules,
                 str(events), out)  # fmt: skip
    return {
        (a["ruleId"], a["transactionId"]): (a["aggregateValue"], a["windowStart"])
        for a in map(json.loads, out.read_text().splitlines())
    }


@pytest.fixture(scope="module")
def late_complete(
    spark, spark_settings: Settings, late_events: Path, tmp_path_factory: pytest.TempPathFactory
) -> Complete:
    """``complete_data`` of ``late_events``, once a module: the backtest reads only the
    events, the rules and the bucket width, which the tests' settings share."""
    return complete_data(spark, spark_settings, late_events, tmp_path_factory.mktemp("late-bt"))


def stream_then_backtest(
    spark, settings: Settings, events: Path, tmp_path: Path
) -> tuple[StreamJob, Complete]:
    """The sample rules streamed over ``events`` (``stream_sample_rules``), and
    ``complete_data`` of them."""
    job = stream_sample_rules(spark, settings, events)
    return job, complete_data(spark, settings, events, tmp_path)


def in_effect(spark, settings: Settings) -> dict[tuple[int, str], dict]:
    """Per (rule, transaction) whose net count is 1, its latest record by decisionTime (the
    value in effect); asserts every net count is 0 or 1."""
    records: dict[tuple[int, str], list[dict]] = {}
    for row in tables.read_table(spark, LiveTables.of(settings).alerts).collect():
        records.setdefault((row["ruleId"], row["transactionId"]), []).append(row.asDict())
    out = {}
    for pair, rows in records.items():
        net = sum(-1 if r["kind"] == "RETRACTION" else 1 for r in rows)
        assert net in (0, 1), (pair, rows)
        latest = max(rows, key=lambda r: r["decisionTime"])
        if net:
            assert latest["kind"] != "RETRACTION", (pair, rows)
            out[pair] = latest
    return out


def shuffled_batches(source: Path, folder: Path, seed: int = 5) -> Path:
    """``source``'s events in a full shuffle of their eventTimes, about 3% redelivered
    (a third of those with another amount), 12 malformed lines, 400 lines a file, files
    landing in name order one second apart."""
    rng = random.Random(seed)
    lines = [
        line
        for path in sorted(source.glob("*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    rng.shuffle(lines)
    arrivals = list(lines)
    for line in rng.sample(lines, len(lines) * 3 // 100):
        event = json.loads(line)
        if rng.random() < 1 / 3:
            event["paymentAmount"] = "12345.67"
        arrivals.insert(rng.randrange(len(arrivals) + 1), json.dumps(event))
    for i in range(12):
        arrivals.insert(rng.randrange(len(arrivals) + 1), f'{{"transactionId": "bad-{i}", ')
    folder.mkdir()
    for index in range(0, len(arrivals), 400):
        path = folder / f"batch-{index // 400:04d}.jsonl"
        path.write_text("\n".join(arrivals[index : index + 400]) + "\n")
        os.utime(path, (1_700_000_000 + index // 400, 1_700_000_000 + index // 400))
    return folder


def test_backfill_after_shuffled_arrival_restores_the_complete_data_values(
    spark, data_settings: Settings, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """Alerts in effect after `backfill --from 0 --to <far future>` equal the backtest's,
    values included: a decision the stream made on partial data is retracted and
    corrected (SPEC §3)."""
    source = generated_in_arrival_order(
        tmp_path_factory.mktemp("in-order"),
        GenerateOptions(
            events=5000, rate=0.5, payers=25, files=1, spike_fraction=0.05,
            late_fraction=0.0, duplicate_fraction=0.0, malformed_fraction=0.0, seed=8,
        ),
    )  # fmt: skip
    events = shuffled_batches(source, tmp_path / "shuffled")
    _, complete = stream_then_backtest(spark, data_settings, events, tmp_path)
    streamed = in_effect(spark, data_settings)
    partial = {p for p, r in streamed.items() if p in complete and
               r["aggregateValue"] != complete[p][0]}  # fmt: skip
    assert partial, "the stream must have decided some alerts on partial data"

    summary = Backfill(spark, data_settings).run(0, 2**62)
    after = in_effect(spark, data_settings)
    assert {p: (r["aggregateValue"], r["windowStart"]) for p, r in after.items()} == complete
    assert summary.retractions >= len(partial)
    # The run's amendments are new alerts: ids unique over the table.
    ids = [r["alertId"] for r in tables.read_table(spark, LiveTables.of(data_settings).alerts)
           .select("alertId").collect()]  # fmt: skip
    assert len(ids) == len(set(ids))
    again = Backfill(spark, data_settings).run(0, 2**62)
    assert (again.corrections, again.retractions) == (0, 0)


class BackfillWithArrivalAfterPin(Backfill):
    """A backfill during which the stream takes one more file, after the pin."""

    def __init__(self, spark, settings: Settings, job: StreamJob, file: Path, events: Path):
        super().__init__(spark, settings)
        self.job, self.file, self.events = job, file, events

    def _decide(self, *args, **kwargs):
        decisions = super()._decide(*args, **kwargs)
        shutil.copy(self.file, self.events / self.file.name)
        os.utime(self.events / self.file.name, (1_800_000_000, 1_800_000_000))
        run_available_now(self.job, self.events, files_per_batch=None)
        return decisions


def test_backfill_leaves_alone_the_alerts_of_events_that_arrived_after_its_pin(
    spark, data_settings: Settings, late_events: Path, tmp_path: Path
) -> None:
    files = sorted(late_events.glob("*.jsonl"))
    events = tmp_path / "events"
    events.mkdir()
    for order, path in enumerate(files[:-1]):
        shutil.copy(path, events / path.name)
        os.utime(events / path.name, (1_700_000_000 + order, 1_700_000_000 + order))
    job = stream_sample_rules(spark, data_settings, events)

    live = LiveTables.of(data_settings)
    before = {r["alertId"] for r in tables.read_table(spark, live.alerts).collect()}
    backfill = BackfillWithArrivalAfterPin(spark, data_settings, job, files[-1], events)
    backfill.run(0, 2**62)
    alerts = tables.read_table(spark, live.alerts).collect()
    after_pin = [r for r in alerts if r["kind"] == "ALERT" and r["alertId"] not in before]
    assert after_pin, "the file landed during the backfill must have fired alerts"
    retracted = {(r["ruleId"], r["transactionId"]) for r in alerts if r["kind"] == "RETRACTION"}
    assert not retracted & {(r["ruleId"], r["transactionId"]) for r in after_pin}


def test_two_overlapping_backfills_end_as_one_after_the_other(
    spark, data_settings: Settings, late_events: Path, late_complete: Complete
) -> None:
    job, complete = stream_sample_rules(spark, data_settings, late_events), late_complete

    summaries: list = []
    runs = [
        threading.Thread(
            target=lambda: summaries.append(Backfill(spark, data_settings).run(0, 2**62))
        )
        for _ in range(2)
    ]
    for run in runs:
        run.start()
    for run in runs:
        run.join()
    assert len(summaries) == 2
    after = in_effect(spark, data_settings)
    assert {p: (r["aggregateValue"], r["windowStart"]) for p, r in after.items()} == complete
    amended = sorted(s.corrections + s.retractions for s in summaries)
    assert amended[0] == 0 < amended[1], "the later run finds the earlier one's amendments"
    published = [
        json.loads(f["alert"])["alertId"]
        for _, f in job.redis.xrange(data_settings.alert_stream)
        if f.get("backfill") == "1"
    ]
    assert len(published) == len(set(published)) == amended[1]


def test_backfill_repairs_only_the_buckets_that_differ_from_the_recount(
    spark, data_settings: Settings, late_events: Path
) -> None:
    """Two stored buckets made wrong (one inside a compacted hour, one plain): the backfill
    rewrites those two, in Delta and Redis, and nothing else."""
    stream_sample_rules(spark, data_settings, late_events).flush()
    compacted = maintenance.compact_buckets(spark, data_settings)
    state = LiveState(spark, data_settings)
    stored = state.read("buckets")
    assert stored.where(F.col("parts").isNotNull()).count() > 0, "an hour must be compacted"
    before = {
        (r["signature_id"], r["key"], r["bucket_start"]): r.asDict()
        for r in state.window_buckets(stored).collect()
    }
    hour_row = stored.where(F.col("parts").isNotNull()).first()
    in_hour = (hour_row["signature_id"], hour_row["key"], hour_row["parts"][0]["bucket_start"])
    plain_row = stored.where(F.col("parts").isNull()).orderBy(F.desc("bucket_start")).first()
    plain = (plain_row["signature_id"], plain_row["key"], plain_row["bucket_start"])
    wrong = [
        {
            "signature_id": sig, "key": key, "bucket_start": start,
            "bucket_width_ms": data_settings.bucket_width_ms, "event_count": 7,
            "value_count": 0, "value_sum": None, "value_min": None, "value_max": None,
            "distinct_values": [], "parts": None,
        }
        for sig, key, start in (in_hour, plain)
    ]  # fmt: skip
    spark.createDataFrame(wrong, tables.BUCKET_SCHEMA).write.format("delta").mode("append").save(
        str(state.live.buckets)
    )

    first = state.read("events").agg(F.min("eventTime"), F.max("eventTime")).first()
    backfill = Backfill(spark, data_settings)
    summary = backfill.run(int(first[0]), int(first[1]))

    assert summary.buckets_rebuilt == 2
    after = {
        (r["signature_id"], r["key"], r["bucket_start"]): r.asDict()
        for r in state.window_buckets(state.read("buckets")).collect()
    }
    assert after == before, "the two wrong buckets are their recount again, the rest as was"
    assert compacted.hours_written > 0
    assert backfill.mirror.reconcile().clean
    assert backfill.run(int(first[0]), int(first[1])).buckets_rebuilt == 0
