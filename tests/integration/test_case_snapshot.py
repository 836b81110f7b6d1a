"""The case book's snapshot on real Delta (delta-rs, no JVM): a fresh process's first look
at the cases reads the snapshot and the case events written after it, and sees exactly
what the fold of the whole ``case_events`` table says, whatever happened to the cases
since (alerts joined, assigned, closed, reopened, a backfill's corrections); a snapshot
that cannot stand for the table (missing, corrupt, older than a compaction or a vacuum,
of another table) is not used, the whole table is folded, and a log line says why."""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
import zlib
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql.pandas.types import to_arrow_schema

from tests.builders import alert_row
from tests.integration.test_case_store import group
from velocity.analyst.cases import Case, CaseEventKind, fold_cases, person_event
from velocity.delta import case_store, tables
from velocity.delta.case_snapshot import CURRENT, snapshot_root
from velocity.delta.case_store import CASE_EVENT_ARROW_SCHEMA, CaseStore
from velocity.delta.file_folds import forget_table
from velocity.delta.names import ALERTS
from velocity.settings import Settings

pytestmark = pytest.mark.timeout(120)

NOW = 1_767_225_600_000
ALERT_ARROW = to_arrow_schema(tables.ALERT_SCHEMA)
VELOCITY = str(Path(sys.executable).parent / "velocity")
WHOLE_FOLD = "every case event read"


def flush(store: CaseStore, batch: int, alerts: list[tuple[str, int, str, str]]) -> dict[str, str]:
    """A write-behind group of (alertId, ruleId, transactionId, payerId) alerts, gathered
    into cases and appended to the alerts table; each alert's case."""
    gathered = store.gather_alerts(*group(alerts), batch)
    write_deltalake(str(store.settings.table_path(ALERTS)), gathered, mode="append")
    return dict(zip(gathered["alertId"].to_pylist(), gathered["caseId"].to_pylist(), strict=True))


def backfill_joins(store: CaseStore, corrections: list[tuple[str, str, str]]) -> dict[str, str]:
    """A backfill's (alertId, transactionId, payerId) corrections, joining or opening cases."""
    rows = [
        {**alert_row(a, (7, 1), NOW + 90_000, "CORRECTION", tx), "caseId": None}
        for a, tx, _ in corrections
    ]
    amendments = pa.Table.from_pylist(rows, ALERT_ARROW)
    payments = pa.table(
        {
            "transactionId": [tx for _, tx, _ in corrections],
            "payerId": [p for _, _, p in corrections],
            "paymentAmount": pa.array(["5"] * len(corrections)).cast(pa.decimal128(26, 8)),
        }
    )
    assigned = store.assign_backfill(amendments, payments)
    ids = pa.array([assigned[a] for a, _, _ in corrections], pa.string())
    amendments = amendments.set_column(amendments.schema.get_field_index("caseId"), "caseId", ids)
    write_deltalake(str(store.settings.table_path(ALERTS)), amendments, mode="append")
    store.record_backfill(amendments, payments)
    return assigned


def first_look(store: CaseStore) -> dict[str, Case]:
    """The cases as a fresh process first sees them (nothing of this process's folds)."""
    forget_table(store.events_path)
    return store.cases()


def whole_fold(store: CaseStore) -> dict[str, Case]:
    return fold_cases(store.events())


def used_the_snapshot(caplog: pytest.LogCaptureFixture) -> bool:
    return not any(WHOLE_FOLD in r.getMessage() for r in caplog.records)


@pytest.fixture
def store(tmp_path: Path) -> CaseStore:
    return CaseStore(Settings(data_dir=tmp_path / "data"))


def worked_cases(store: CaseStore) -> dict[str, str]:
    """Four payers' cases: p1 assigned, p2 closed, p3 and p4 open; each payer's case."""
    case_of = flush(store, 1, [("a1", 4, "t1", "p1"), ("a2", 5, "t1", "p1"), ("a3", 4, "t2", "p2")])
    case_of |= flush(
        store, 2, [("a4", 4, "t3", "p3"), ("a5", 4, "t4", "p4"), ("a6", 4, "t5", "p2")]
    )
    payer = {"p1": case_of["a1"], "p2": case_of["a3"], "p3": case_of["a4"], "p4": case_of["a5"]}
    store.assign(payer["p1"], "ana", "lead")
    store.close(payer["p2"], "false positive", "a regular", "ana")
    return payer


def test_the_snapshot_and_the_events_after_it_are_the_whole_fold_case_by_case(
    store: CaseStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Every change after the snapshot shows in the first look: alerts joining a case
    (and opening one), an assignment, a close, a reopen, a backfill's corrections joining
    a case and opening one; a refresh from that snapshot holds too."""
    payer = worked_cases(store)
    written = store.write_snapshot()
    assert written is not None and (written.cases, written.events) == (4, 7)

    case_of = flush(store, 3, [("a7", 4, "t6", "p1"), ("a8", 4, "t7", "p3"), ("a9", 4, "t8", "p5")])
    store.assign(payer["p3"], "bo", "lead")
    store.close(payer["p1"], "confirmed fraud", "ring", "ana")
    store.reopen(payer["p2"], "lead")
    backfilled = backfill_joins(store, [("c1", "t9", "p4"), ("c2", "t10", "p6")])

    caplog.set_level(logging.INFO, "velocity.cases")

    caplog.clear()  # only what follows: an earlier look may have logged at INFO
    looked = first_look(store)
    assert used_the_snapshot(caplog), caplog.text
    assert looked == whole_fold(store)
    assert len(looked) == 6
    p1, p2, p3, p4 = (looked[payer[p]] for p in ("p1", "p2", "p3", "p4"))
    assert (p1.status.value, p1.alerts, p1.verdict and p1.verdict.value) == (
        "closed", 3, "CONFIRMED_FRAUD",
    )  # fmt: skip
    assert (p2.status.value, p2.verdict, p3.assignee, p4.alerts) == ("open", None, "bo", 2)
    assert looked[case_of["a9"]].history[0].event is CaseEventKind.OPENED
    assert looked[backfilled["c2"]].history[0].who == "velocity-backfill"
    assert [e.event.value for e in p1.history] == ["opened", "assigned", "joined", "closed"]

    # A change planned from a case read from the snapshot (its history read then).
    store.assign(payer["p4"], "cy", "lead")
    assert store.cases() == whole_fold(store)

    again = store.write_snapshot()  # from the first snapshot and the events after it
    assert again is not None and again.version > written.version
    caplog.clear()
    assert first_look(store) == whole_fold(store)
    assert used_the_snapshot(caplog), caplog.text
    # A refresh keeps the folder current until then (a reader may have just read its
    # name) and removes the older ones.
    third = store.write_snapshot()
    assert third is not None
    folders = {f.name for f in snapshot_root(store.settings.data_dir).iterdir() if f.is_dir()}
    assert folders == {Path(again.path).name, Path(third.path).name}


def test_events_appended_while_the_snapshot_is_written_are_read_after_it(
    store: CaseStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Another process appends (a person's assignment, as the page would) after the
    snapshot's fold read the table and before the snapshot is written: the snapshot is of
    the version it read, and the first look reads the appended file after it."""
    payer = worked_cases(store)
    writes = case_store.write_snapshot

    def write_meanwhile(*args: object) -> object:
        case = whole_fold(store)[payer["p4"]]
        event = person_event(case, CaseEventKind.ASSIGNED, "lead", NOW, assignee="dee")
        row = {**event.to_row(), "closeReviews": None}
        write_deltalake(
            str(store.events_path),
            pa.Table.from_pylist([row], CASE_EVENT_ARROW_SCHEMA),
            mode="append",
        )
        return writes(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(case_store, "write_snapshot", write_meanwhile)
    written = store.write_snapshot()
    assert written is not None and written.version < DeltaTable(str(store.events_path)).version()

    caplog.set_level(logging.INFO, "velocity.cases")

    caplog.clear()  # only what follows: an earlier look may have logged at INFO
    looked = first_look(store)
    assert used_the_snapshot(caplog), caplog.text
    assert looked[payer["p4"]].assignee == "dee"
    assert looked == whole_fold(store)


def test_a_snapshot_older_than_a_compaction_or_a_vacuum_is_not_used(
    store: CaseStore, caplog: pytest.LogCaptureFixture
) -> None:
    payer = worked_cases(store)
    store.write_snapshot()
    store.assign(payer["p3"], "bo", "lead")
    table = DeltaTable(str(store.events_path))
    table.optimize.compact()
    caplog.set_level(logging.INFO, "velocity.cases")
    caplog.clear()  # only what follows: an earlier look may have logged at INFO
    assert first_look(store) == whole_fold(store)
    assert "data files it folded are gone" in caplog.text and WHOLE_FOLD in caplog.text

    DeltaTable(str(store.events_path)).vacuum(0, enforce_retention_duration=False, dry_run=False)
    store.reopen(payer["p2"], "lead")
    caplog.clear()
    assert first_look(store) == whole_fold(store)
    assert "data files it folded are gone" in caplog.text

    store.write_snapshot()  # maintenance's next run: after the compaction
    store.close(payer["p3"], "confirmed fraud", "", "bo")
    caplog.clear()
    assert first_look(store) == whole_fold(store)
    assert used_the_snapshot(caplog), caplog.text


def test_a_missing_corrupt_or_foreign_snapshot_falls_back_to_the_whole_fold(
    store: CaseStore, caplog: pytest.LogCaptureFixture
) -> None:
    worked_cases(store)
    caplog.set_level(logging.INFO, "velocity.cases")
    caplog.clear()  # only what follows: an earlier look may have logged at INFO
    whole = whole_fold(store)
    assert first_look(store) == whole
    assert "no case snapshot" in caplog.text and WHOLE_FOLD in caplog.text

    root = snapshot_root(store.settings.data_dir)
    written = store.write_snapshot()
    assert written is not None
    folder = Path(written.path)
    current = json.loads((root / CURRENT).read_text())

    def falls_back(said: str) -> None:
        caplog.clear()
        assert first_look(store) == whole
        assert said in caplog.text and WHOLE_FOLD in caplog.text, caplog.text

    pickled = (folder / "cases.pickle").read_bytes()
    (folder / "cases.pickle").write_bytes(pickled[: len(pickled) // 2])
    falls_back("is corrupt")
    # A pickle that would build something else than cases, checksum and all, is refused.
    foreign = pickle.dumps({"x": os.getcwd, "y": Path("/")})
    (folder / "cases.pickle").write_bytes(foreign)
    (root / CURRENT).write_text(json.dumps({**current, "casesCrc32": zlib.crc32(foreign)}))
    falls_back("is not part of a case snapshot")
    (folder / "cases.pickle").write_bytes(pickled)
    (root / CURRENT).write_text(json.dumps(current))
    assert first_look(store) == whole

    events = bytearray((folder / "events.arrow").read_bytes())
    events[len(events) // 2] ^= 0xFF
    (folder / "events.arrow").write_bytes(bytes(events))
    falls_back("is corrupt")
    (root / CURRENT).write_text("{not json")
    falls_back("unreadable")
    (root / CURRENT).write_text(json.dumps({**current, "format": 99}))
    falls_back("format 99")
    (root / CURRENT).write_text(json.dumps({**current, "tableId": "another"}))
    falls_back("another case_events table")


def test_a_fresh_velocity_cases_reads_the_snapshot(store: CaseStore) -> None:
    payer = worked_cases(store)
    store.write_snapshot()
    store.close(payer["p4"], "confirmed fraud", "", "ana")
    listed = subprocess.run(
        [VELOCITY, "cases", "list", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "VELOCITY_DATA_DIR": str(store.settings.data_dir)},
        timeout=60,
        check=True,
    )
    assert WHOLE_FOLD not in listed.stderr, listed.stderr
    shown = {c["caseId"]: c for c in map(json.loads, listed.stdout.splitlines())}
    assert shown == {c.case_id: c.to_json() for c in whole_fold(store).values()}
    assert shown[payer["p4"]]["status"] == "closed"


def test_the_page_s_first_look_after_a_restart_reads_the_snapshot(
    store: CaseStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The api-server's queue (the page's ``all_cases``), as after a restart."""
    from velocity_airflow.page.cases import all_cases

    payer = worked_cases(store)
    store.write_snapshot()
    store.reopen(payer["p2"], "lead")
    forget_table(store.events_path)
    caplog.set_level(logging.INFO, "velocity.cases")
    caplog.clear()  # only what follows: an earlier look may have logged at INFO
    queue = {c.case_id: c for c in all_cases(store.settings)}
    assert used_the_snapshot(caplog), caplog.text
    assert queue == whole_fold(store) and queue[payer["p2"]].status.value == "open"
