"""Cases on real Delta (delta-rs, no JVM), as the stream's write-behind gathers alerts into
them and as people work them through `velocity cases` (SPEC §4a, §6): a case per payer
while open, one case id per key through a redone flush, a close that reviews every alert
of the case, a new case for the key's next alert."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql.pandas.types import to_arrow_schema

from tests.builders import alert_row
from velocity.analyst.reviews import Verdict
from velocity.delta import tables
from velocity.delta.case_store import CaseStore
from velocity.delta.names import ALERT_REVIEWS, ALERTS, CASE_EVENTS, CASES
from velocity.delta.review_store import ReviewStore
from velocity.settings import Settings

pytestmark = pytest.mark.timeout(180)

VELOCITY = str(Path(sys.executable).parent / "velocity")
NOW = 1_767_225_600_000
ALERT_ARROW = to_arrow_schema(tables.ALERT_SCHEMA)


def group(alerts: list[tuple[str, int, str, str]]) -> tuple[pa.Table, pa.Table]:
    """A flushed group: (alertId, ruleId, transactionId, payerId) alerts and their events."""
    # Rule 5's alerts are BLOCK; the others have none (a row of an older Velocity: ALERT).
    rows = [
        {**alert_row(a, (rule, 1), NOW + i, transaction_id=tx), "caseId": None}
        | ({"outcome": "BLOCK"} if rule == 5 else {})
        for i, (a, rule, tx, _) in enumerate(alerts)
    ]
    payers = {tx: payer for _, _, tx, payer in alerts}
    events = pa.table(
        {
            "transactionId": list(payers),
            "payerId": list(payers.values()),
            "paymentAmount": pa.array(["100.5"] * len(payers)).cast(pa.decimal128(26, 8)),
        }
    )
    return pa.Table.from_pylist(rows, ALERT_ARROW), events


def velocity(data_dir: Path, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    """``velocity <args>`` on the data dir, as a user runs it."""
    return subprocess.run(
        [VELOCITY, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "VELOCITY_DATA_DIR": str(data_dir)},
        timeout=120,
        check=check,
    )


def cases(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return velocity(data_dir, "cases", *args)


def test_alerts_gather_into_cases_that_people_assign_and_close(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    store = CaseStore(settings)
    alerts, events = group(
        [("a1", 4, "t1", "p1"), ("a2", 5, "t1", "p1"), ("a3", 4, "t2", "p1"), ("a4", 4, "t3", "p2")]
    )
    gathered = store.gather_alerts(alerts, events, batch=3)
    case_ids = dict(
        zip(gathered["alertId"].to_pylist(), gathered["caseId"].to_pylist(), strict=True)
    )
    assert case_ids["a1"] == case_ids["a2"] == case_ids["a3"] != case_ids["a4"]
    # A flush redone after a crash (its case events committed, its alerts not): the same cases.
    redone = store.gather_alerts(alerts, events, batch=3)
    assert redone["caseId"].to_pylist() == gathered["caseId"].to_pylist()
    assert len(store.events()) == 2
    write_deltalake(str(settings.table_path(ALERTS)), gathered)

    listed = cases(settings.data_dir, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    by_key = {json.dumps(c["caseKey"]): c for c in map(json.loads, listed.stdout.splitlines())}
    p1 = by_key['{"payerId": "p1"}']
    assert p1["caseId"] == case_ids["a1"] and p1["status"] == "open"
    assert (p1["alerts"], p1["alertsByRule"], p1["amount"]) == (3, {"4": 2, "5": 1}, "201")
    assert p1["openedAt"] == NOW and p1["latestAlertAt"] == NOW + 2
    # p1's strongest outcome is its rule 5 alert's; p2 has only ALERTs.
    assert (p1["outcome"], by_key['{"payerId": "p2"}']["outcome"]) == ("BLOCK", "ALERT")
    by_outcome = cases(settings.data_dir, "list", "--sort", "outcome")
    assert by_outcome.stdout.splitlines()[0].startswith(f"{p1['caseId']}  BLOCK  open")
    only_alert = cases(settings.data_dir, "list", "--outcome", "alert", "--json")
    assert [json.loads(x)["caseKey"] for x in only_alert.stdout.splitlines()] == [{"payerId": "p2"}]

    assigned = cases(settings.data_dir, "assign", p1["caseId"], "bo", "--who", "ana")
    assert assigned.returncode == 0 and " assigned bo " in assigned.stdout
    bad = cases(settings.data_dir, "close", p1["caseId"], "maybe")
    assert bad.returncode == 2 and "verdict" in bad.stderr
    closed = cases(
        settings.data_dir, "close", p1["caseId"], "confirmed fraud", "--note", "mule", "--who", "bo"
    )
    assert closed.returncode == 0, closed.stderr
    assert "3 alerts reviewed as confirmed fraud" in closed.stdout
    exported = velocity(settings.data_dir, "reviews", "export", check=True)
    reviews = [json.loads(line) for line in exported.stdout.splitlines()]
    assert sorted(r["alertId"] for r in reviews) == ["a1", "a2", "a3"]
    assert {(r["verdict"], r["note"], r["who"]) for r in reviews} == {
        ("CONFIRMED_FRAUD", "mule", "bo")
    }

    shown = cases(settings.data_dir, "show", p1["caseId"], "--json")
    case = json.loads(shown.stdout)
    assert [h["event"] for h in case["history"]] == ["opened", "assigned", "closed"]
    assert case["status"] == "closed" and case["verdict"] == "CONFIRMED_FRAUD"
    assert sorted(a["alertId"] for a in case["alertRecords"]) == ["a1", "a2", "a3"]
    assert {a["alertId"]: a["outcome"] for a in case["alertRecords"]} == {
        "a1": "ALERT", "a2": "BLOCK", "a3": "ALERT",
    }  # fmt: skip

    # The key's next alert opens a new case; p2's joins its open one.
    later, later_events = group([("a5", 7, "t5", "p1"), ("a6", 4, "t6", "p2")])
    again = store.gather_alerts(later, later_events, batch=4)
    new = dict(zip(again["alertId"].to_pylist(), again["caseId"].to_pylist(), strict=True))
    assert new["a5"] not in case_ids.values() and new["a6"] == case_ids["a4"]
    opened = cases(settings.data_dir, "list", "--status", "open", "--json")
    assert sorted(json.loads(x)["caseId"] for x in opened.stdout.splitlines()) == sorted(
        [new["a5"], new["a6"]]
    )
    assert settings.table_path(CASE_EVENTS).is_dir()
    missing = cases(settings.data_dir, "show", "no-such-case")
    assert missing.returncode == 2 and "no case" in missing.stderr


def test_alerts_that_land_after_their_case_was_closed_are_reviewed_with_its_verdict(
    tmp_path: Path,
) -> None:
    """A close racing the write-behind: the group's alerts joined the case (its case
    events committed), the case was closed (reviewing the rows in the alerts table then),
    and only then did the group's rows land. The flush reviews them as the close would
    have; once, however often it is redone."""
    settings = Settings(data_dir=tmp_path / "data")
    store = CaseStore(settings)
    first, first_events = group([("a1", 4, "t1", "p1")])
    write_deltalake(str(settings.table_path(ALERTS)), store.gather_alerts(first, first_events, 1))
    late, late_events = group([("a2", 5, "t2", "p1"), ("a3", 4, "t3", "p2")])
    joined = store.gather_alerts(late, late_events, batch=2)
    case_id = joined["caseId"].to_pylist()[0]
    closed = store.close(case_id, "false positive", "known merchant", "ana")
    assert closed.status.value == "closed"
    write_deltalake(str(settings.table_path(ALERTS)), joined, mode="append")

    assert store.review_late_alerts(joined) == 1  # a2; a3's case (p2) is open
    assert store.review_late_alerts(joined) == 0  # a redone flush
    reviews = ReviewStore(settings.table_path(ALERT_REVIEWS)).all()
    assert sorted((r.alert_id, r.verdict.value, r.who, r.note) for r in reviews) == [
        ("a1", "FALSE_POSITIVE", "ana", "known merchant"),
        ("a2", "FALSE_POSITIVE", "ana", "known merchant"),
    ]


def test_a_case_events_table_of_an_older_velocity_gains_the_outcome_column(
    tmp_path: Path,
) -> None:
    """A data dir made before cases had outcomes: its case_events table lacks the column.
    The next flush adds it (delta-rs, one commit) and writes the outcome; the older events
    read as ALERT, which their alerts were."""
    from deltalake import DeltaTable

    from velocity.delta.case_store import CASE_EVENT_ARROW_SCHEMA

    settings = Settings(data_dir=tmp_path / "data")
    store = CaseStore(settings)
    older = pa.schema([f for f in CASE_EVENT_ARROW_SCHEMA if f.name != "outcome"])
    first, first_events = group([("a1", 4, "t1", "p1")])
    gathered = store.gather_alerts(first, first_events, 1)
    rows = pa.Table.from_pylist(
        [{k: v for k, v in e.to_row().items() if k != "outcome"} for e in store.events()], older
    )
    path = str(settings.table_path(CASE_EVENTS))
    write_deltalake(path, rows, mode="overwrite", schema_mode="overwrite")
    assert "outcome" not in DeltaTable(path).schema().to_arrow().names
    (case,) = store.cases().values()
    assert case.outcome.value == "ALERT" and case.case_id == gathered["caseId"][0].as_py()

    later, later_events = group([("a2", 5, "t2", "p1")])
    joined = store.gather_alerts(later, later_events, 2)
    assert joined["caseId"].to_pylist() == [case.case_id]
    assert "outcome" in DeltaTable(path).schema().to_arrow().names
    (case,) = store.cases().values()
    assert (case.alerts, case.outcome.value) == (2, "BLOCK")


def test_the_cli_takes_a_case_s_short_id_prints_iso_times_and_alerts_in_time_order(
    tmp_path: Path,
) -> None:
    """`velocity cases` as the docs show it: a case named by the start of its id (`8c1f…`),
    times as ISO-8601 UTC in text (epoch ms in JSON), a case's alerts by their payment's
    eventTime, then ruleId, whatever order they were decided in."""
    from velocity.analyst.cases import case_id, case_key_text

    settings = Settings(data_dir=tmp_path / "data")
    store = CaseStore(settings)
    # p2's first alert named so that its case id starts like p1's: a prefix of one
    # character is then ambiguous.
    p1_id = case_id(case_key_text("payerId", "p1"), "a1")
    p2_first = next(
        f"b{n}"
        for n in range(1000)
        if case_id(case_key_text("payerId", "p2"), f"b{n}")[0] == p1_id[0]
    )
    # Decided a1, a2, a3 (decisionTime NOW, +1, +2); their payments: t2 a minute before t1.
    alerts, events = group(
        [
            ("a1", 7, "t1", "p1"),
            ("a2", 4, "t1", "p1"),
            ("a3", 5, "t2", "p1"),
            (p2_first, 4, "t3", "p2"),
        ]
    )
    paid = {"t1": NOW - 1_000, "t2": NOW - 61_000, "t3": NOW}
    event_times = pa.array([paid[tx] for tx in alerts["transactionId"].to_pylist()], pa.int64())
    alerts = alerts.set_column(alerts.schema.get_field_index("eventTime"), "eventTime", event_times)
    gathered = store.gather_alerts(alerts, events, batch=1)
    write_deltalake(str(settings.table_path(ALERTS)), gathered)
    p2_id = case_id(case_key_text("payerId", "p2"), p2_first)
    assert set(gathered["caseId"].to_pylist()) == {p1_id, p2_id}

    listed = cases(settings.data_dir, "list")
    assert listed.returncode == 0, listed.stderr
    p1_line = next(line for line in listed.stdout.splitlines() if line.startswith(p1_id))
    assert p1_line.endswith("latest alert 2026-01-01T00:00:00.002Z"), p1_line
    as_json = [
        json.loads(x) for x in cases(settings.data_dir, "list", "--json").stdout.splitlines()
    ]
    assert {c["caseId"]: c["latestAlertAt"] for c in as_json}[p1_id] == NOW + 2  # epoch ms

    # The docs' shortened form, and the plain start, name the case as its whole id does.
    unique = next(n for n in range(4, len(p1_id)) if not p2_id.startswith(p1_id[:n]))
    short = p1_id[:unique]
    shown = cases(settings.data_dir, "show", f"{short}…")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == cases(settings.data_dir, "show", p1_id).stdout
    lines = shown.stdout.splitlines()
    alert_lines = [words for words in map(str.split, lines[1:]) if words[1] == "alert"]
    # (eventTime, ruleId): t2's rule 5 a minute before t1's rules 4 and 7.
    assert [(words[0], words[2], words[5]) for words in alert_lines] == [
        ("2025-12-31T23:58:59.000Z", "a3", "5"),
        ("2025-12-31T23:59:59.000Z", "a2", "4"),
        ("2025-12-31T23:59:59.000Z", "a1", "7"),
    ], shown.stdout
    opened = next(line for line in lines if " opened by " in line)
    assert re.match(r"  \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z opened by velocity-stream", opened)
    records = json.loads(cases(settings.data_dir, "show", short, "--json").stdout)["alertRecords"]
    assert [(r["alertId"], r["eventTime"]) for r in records] == [
        ("a3", NOW - 61_000), ("a2", NOW - 1_000), ("a1", NOW - 1_000),
    ]  # fmt: skip

    assigned = cases(settings.data_dir, "assign", f"{short}...", "bo", "--who", "ana")
    assert assigned.returncode == 0 and assigned.stdout.startswith(p1_id), assigned.stderr
    # One character is the start of both ids: exit 2, naming both; an unknown start alike.
    ambiguous = cases(settings.data_dir, "close", f"{p1_id[0]}…", "false positive")
    assert ambiguous.returncode == 2, ambiguous
    assert f"'{p1_id[0]}' starts 2 case ids" in ambiguous.stderr
    assert p1_id in ambiguous.stderr and p2_id in ambiguous.stderr
    assert "payerId=p1 assigned" in ambiguous.stderr and "payerId=p2 open" in ambiguous.stderr
    unknown = cases(settings.data_dir, "reopen", "zzzz…")
    assert unknown.returncode == 2 and "no case id starts with 'zzzz'" in unknown.stderr
    closed = cases(settings.data_dir, "close", p2_id[: unique + 4], "false positive")
    assert closed.returncode == 0 and closed.stdout.startswith(p2_id), closed.stderr


def test_a_close_is_one_commit_that_carries_the_reviews_of_its_alerts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closing writes the verdict and the reviews of every alert of the case in the alerts
    table in one commit to case_events (its ``closed`` row lists them): a commit that
    fails leaves the case open and nothing reviewed; one that lands, the case closed and
    every such alert reviewed, later than any review before. An alert still written
    behind is reported as such, not as reviewed, and is reviewed as it lands."""
    from deltalake import DeltaTable

    from velocity.analyst.reviews import AlertRef
    from velocity.delta import small_tables

    settings = Settings(data_dir=tmp_path / "data")
    store = CaseStore(settings)
    reviews = ReviewStore(settings.table_path(ALERT_REVIEWS))
    landed, landed_events = group([("a1", 4, "t1", "p1"), ("a2", 5, "t2", "p1")])
    gathered = store.gather_alerts(landed, landed_events, 1)
    write_deltalake(str(settings.table_path(ALERTS)), gathered)
    # a2 reviewed alone first, by a clock an hour ahead: the close's review still counts.
    ahead = NOW + 3_600_000 * 24 * 365 * 10
    reviews.record("a2", AlertRef.of(gathered.to_pylist()[1]), "needs review", "", "bo", ahead)
    late, late_events = group([("a3", 4, "t3", "p1")])
    still_spooled = store.gather_alerts(late, late_events, 2)  # joined; its row not landed
    (case_id,) = {c for c in still_spooled["caseId"].to_pylist()}
    events_path = str(settings.table_path(CASE_EVENTS))
    version = DeltaTable(events_path).version()

    real_write = small_tables.write_deltalake

    def disk_gone(*args: object, **kwargs: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(small_tables, "write_deltalake", disk_gone)
    with pytest.raises(OSError, match="disk gone"):
        store.close(case_id, "confirmed fraud", "mule", "ana")
    monkeypatch.setattr(small_tables, "write_deltalake", real_write)
    assert store.case(case_id).status.value == "open"
    assert {a: r.verdict.value for a, r in reviews.latest().items()} == {"a2": "NEEDS_REVIEW"}
    assert DeltaTable(events_path).version() == version

    reviews_version = DeltaTable(str(reviews.path)).version()
    closed = store.close(case_id, "confirmed fraud", " mule ", "ana")
    assert DeltaTable(events_path).version() == version + 1, "one commit"
    assert DeltaTable(str(reviews.path)).version() == reviews_version, "none to alert_reviews"
    assert (closed.status.value, closed.alerts, closed.reviewed, closed.being_written) == (
        "closed", 3, 2, 1,
    )  # fmt: skip
    latest = reviews.latest()
    assert {a: (r.verdict.value, r.note, r.who) for a, r in latest.items()} == {
        "a1": ("CONFIRMED_FRAUD", "mule", "ana"),
        "a2": ("CONFIRMED_FRAUD", "mule", "ana"),
    }
    assert latest["a2"].when == ahead + 1
    counted = {v: {k: n for k, n in found.items() if n} for v, found in reviews.verdicts().items()}
    assert counted == {(4, 1): {Verdict.CONFIRMED_FRAUD: 1}, (5, 1): {Verdict.CONFIRMED_FRAUD: 1}}
    assert len(reviews.all()) == 3, "a2's own review is kept in its history"

    # The write-behind appends a3 and reviews it with the case's verdict.
    write_deltalake(str(settings.table_path(ALERTS)), still_spooled, mode="append")
    assert store.review_late_alerts(still_spooled) == 1
    assert reviews.latest()["a3"].verdict is Verdict.CONFIRMED_FRAUD
    exported = velocity(settings.data_dir, "reviews", "export", check=True)
    assert sorted(json.loads(x)["alertId"] for x in exported.stdout.splitlines()) == [
        "a1", "a2", "a3",
    ]  # fmt: skip

    # `velocity cases close` says what it reviewed and what is still being written.
    more, more_events = group([("b1", 4, "u1", "p2")])
    write_deltalake(
        str(settings.table_path(ALERTS)), store.gather_alerts(more, more_events, 3), mode="append"
    )
    spooled, spooled_events = group([("b2", 4, "u2", "p2"), ("b3", 7, "u3", "p2")])
    p2 = store.gather_alerts(spooled, spooled_events, 4)["caseId"][0].as_py()
    said = cases(settings.data_dir, "close", p2, "false positive", "--who", "bo")
    assert said.returncode == 0, said.stderr
    assert "1 alerts reviewed as false positive, 2 more being written" in said.stdout


def test_alerts_that_land_while_a_close_commits_are_reviewed_by_the_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The close read the case's alerts; then the write-behind appended a3 (which had
    joined) and looked for closed cases before the close was in, finding none. The close
    reviews a3 right after its commit, reading only the data file added since its read."""
    settings = Settings(data_dir=tmp_path / "data")
    store = CaseStore(settings)
    first, first_events = group([("a1", 4, "t1", "p1")])
    write_deltalake(str(settings.table_path(ALERTS)), store.gather_alerts(first, first_events, 1))
    late, late_events = group([("a3", 4, "t3", "p1")])
    joined = store.gather_alerts(late, late_events, 2)
    read_alerts = CaseStore._reviewable
    flushed: list[int] = []

    def then_the_flush_lands(self: CaseStore, case_id: str) -> list:
        found = read_alerts(self, case_id)
        if not flushed:
            write_deltalake(str(settings.table_path(ALERTS)), joined, mode="append")
            flushed.append(store.review_late_alerts(joined))
        return found

    monkeypatch.setattr(CaseStore, "_reviewable", then_the_flush_lands)
    from velocity.delta import case_store

    read_files = case_store.case_rows_of_files
    files_read_again: list[str] = []

    def reading(uris: list[str], *args: object) -> object:
        files_read_again.extend(uris)
        return read_files(uris, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(case_store, "case_rows_of_files", reading)
    closed = store.close(joined["caseId"][0].as_py(), "false positive", None, "ana")
    assert flushed == [0], "the flush found the case open"
    assert len(files_read_again) == 1, "after the commit, only the file the flush added"
    assert (closed.reviewed, closed.being_written) == (2, 0)
    latest = ReviewStore(settings.table_path(ALERT_REVIEWS)).latest()
    assert {a: r.verdict for a, r in latest.items()} == {
        "a1": Verdict.FALSE_POSITIVE, "a3": Verdict.FALSE_POSITIVE,
    }  # fmt: skip


def test_a_backfill_s_amendments_open_join_and_are_noted_in_cases_once(tmp_path: Path) -> None:
    """A backfill's corrections take the open case of their payer (p1), or open one (p2);
    its retraction of a1 is noted in a1's case, whose alert list shows it and marks a1
    retracted. Recording them again (a recovery after a crash) writes nothing; a
    correction whose case someone closed after it was assigned (p3) is reviewed with the
    case's verdict; a close reviews corrections, never a retraction."""
    from velocity.delta.reader import case_alerts

    settings = Settings(data_dir=tmp_path / "data")
    store = CaseStore(settings)
    streamed, streamed_events = group([("a1", 4, "t1", "p1"), ("a9", 4, "t9", "p3")])
    gathered = store.gather_alerts(streamed, streamed_events, 1)
    write_deltalake(str(settings.table_path(ALERTS)), gathered)
    case_of = dict(
        zip(gathered["alertId"].to_pylist(), gathered["caseId"].to_pylist(), strict=True)
    )
    p1, p3 = case_of["a1"], case_of["a9"]

    decided = NOW + 60_000
    a1_time = {"eventTime": NOW - 5}  # an amendment repeats its decision's payment time
    rows = [
        {**alert_row("r1", (4, 1), decided, "RETRACTION", "t1"), "caseId": p1, **a1_time},
        {**alert_row("c1", (4, 1), decided + 1, "CORRECTION", "t1"), "caseId": None, **a1_time},
        {
            **alert_row("c2", (5, 1), decided + 1, "CORRECTION", "t2"),
            "caseId": None,
            "outcome": "BLOCK",
        },
        {**alert_row("c3", (4, 1), decided + 1, "CORRECTION", "t3"), "caseId": None},
    ]
    amendments = pa.Table.from_pylist(rows, ALERT_ARROW)
    payments = pa.table(
        {
            "transactionId": ["t1", "t2", "t3"],
            "payerId": ["p1", "p2", "p3"],
            "paymentAmount": pa.array(["100.5", "7", "3"]).cast(pa.decimal128(26, 8)),
        }
    )
    corrections = amendments.filter(pa.compute.equal(amendments["kind"], "CORRECTION"))
    assigned = store.assign_backfill(corrections, payments)
    assert assigned["c1"] == p1 and assigned["c3"] == p3 and assigned["c2"] not in (p1, p3)
    given = zip(amendments["alertId"].to_pylist(), amendments["caseId"].to_pylist(), strict=True)
    ids = [assigned.get(a, c) for a, c in given]
    amendments = amendments.set_column(
        amendments.schema.get_field_index("caseId"), "caseId", pa.array(ids, pa.string())
    )
    write_deltalake(str(settings.table_path(ALERTS)), amendments, mode="append")
    store.close(p3, "confirmed fraud", "ring", "ana")  # after the assignment

    # t1 is in p1's case already (a1): its amount is not counted twice.
    assert store.record_backfill(amendments, payments, {(p1, "t1")}) == 4
    assert store.record_backfill(amendments, payments, {(p1, "t1")}) == 0, "once"
    cases_now = store.cases()
    assert [(e.event.value, e.who) for e in cases_now[p1].history] == [
        ("opened", "velocity-stream"), ("joined", "velocity-backfill"),
        ("retracted", "velocity-backfill"),
    ]  # fmt: skip
    assert (cases_now[p1].alerts, str(cases_now[p1].amount)) == (2, "100.5")
    p2 = cases_now[assigned["c2"]]
    assert (p2.key, p2.alerts, p2.outcome.value, p2.history[0].who) == (
        {"payerId": "p2"}, 1, "BLOCK", "velocity-backfill",
    )  # fmt: skip
    from deltalake import DeltaTable

    in_cases = DeltaTable(str(settings.table_path(CASES))).to_pyarrow_table()
    assert assigned["c2"] in in_cases["caseId"].to_pylist()
    reviews = ReviewStore(settings.table_path(ALERT_REVIEWS))
    assert reviews.latest()["c3"].note == "ring"  # reviewed as its case's close would have

    listed = case_alerts(settings, p1)
    assert [(a["alertId"], a["kind"], a.get("retracted", False)) for a in listed] == [
        ("a1", "ALERT", True), ("c1", "CORRECTION", False), ("r1", "RETRACTION", False),
    ]  # fmt: skip
    shown = cases(settings.data_dir, "show", p1)
    assert " retraction r1 " in shown.stdout and "a1 ALERT rule 4" in shown.stdout
    assert "(retracted)" in next(line for line in shown.stdout.splitlines() if " a1 " in line)
    closed = store.close(p1, "false positive", None, "bo")
    assert (closed.reviewed, closed.being_written) == (2, 0)
    assert "r1" not in reviews.latest()
