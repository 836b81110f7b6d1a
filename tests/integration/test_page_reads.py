"""The page's reads that do not grow with the alerts stored (issue 51), on real Delta
tables written as the stream's write-behind writes them (``Spool.write`` then
``Spool.flush``: a data file a group, alerts gathered into cases) plus a backfill's
amendments: each read equals the full computation over the same table (the scans the page
made before, kept here as the reference) after the first look, after more files were
appended, and after the table was rewritten whole (as OPTIMIZE rewrites it)."""

from __future__ import annotations

import random
from collections.abc import Collection
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from tests.builders import alert_row
from velocity.analyst.alert_search import AlertFilter, KeyPart, page_of
from velocity.analyst.cases import ALERT_TIME_ORDER
from velocity.analyst.reviews import DAY_MS, WEEK_MS, AlertRef, latest_reviews
from velocity.analyst.rule_rates import MINUTE_MS, minute_starts
from velocity.analyst.rule_rates import rule_rates as pure_rule_rates
from velocity.delta import reader
from velocity.delta.case_store import CaseStore
from velocity.delta.live import LiveTables, create_missing_tables
from velocity.delta.names import ALERTS, EVENTS
from velocity.delta.write_behind import ARROW_SCHEMAS, SPOOLED_TABLES, Spool
from velocity.domain.alerts import AlertKind
from velocity.settings import Settings, load_settings

pytestmark = pytest.mark.timeout(180)

NOW = 1_767_225_600_000 + 37_123  # mid-minute: the 24 h and 7 d bounds cut a minute
# Where the groups' decisions fall: around each bound the page counts from, and in the
# last ten minutes (rule rates).
CENTRES = [NOW - WEEK_MS, NOW - DAY_MS, NOW - 9 * DAY_MS, NOW - 300_000, NOW - 20_000]


def _group(rng: random.Random, batch: int, size: int) -> dict[str, pa.Table]:
    """One write-behind group: ``size`` payments, each firing rule 4 (v1 or v2), some rule
    5 too (a SHADOW candidate's alert now and then, a cooldown's suppressed one)."""
    centre = rng.choice(CENTRES)
    events, alerts = [], []
    for n in range(size):
        tx = f"t{batch}-{n}"
        at = centre + rng.randint(-90_000, 90_000)
        payer = f"p{rng.randint(1, 6)}"
        events.append(
            {
                "transactionId": tx, "eventTime": at - 50, "payerId": payer,
                "beneficiaryId": "b", "paymentAmount": Decimal("10.5"), "paymentType": "CRD",
                "ip": None, "deviceId": None, "action": None, "raw": "{}",
                "source_file": "f", "source_block": 0, "line_seq": n,
                "ingest_time": at - 20, "stream_batch": batch,
            }
        )  # fmt: skip
        fired = [(4, rng.choice([1, 2]), False)]
        if rng.random() < 0.5:
            fired.append((5, 1, rng.random() < 0.3))
        for rule_id, version, shadow in fired:
            row = alert_row(f"a{batch}-{n}-{rule_id}", (rule_id, version), at, "ALERT", tx)
            suppressed = not shadow and rng.random() < 0.3
            row.update(
                key=[("payerId", payer)], eventTime=at - 50, shadow=shadow,
                suppressed=suppressed, suppressedBy=tx if suppressed else None,
                caseId=None, outcome="ALERT",
            )  # fmt: skip
            alerts.append(row)
    rows = {name: ARROW_SCHEMAS[name].empty_table() for name in SPOOLED_TABLES}
    rows[EVENTS] = pa.Table.from_pylist(events, ARROW_SCHEMAS[EVENTS])
    rows[ALERTS] = pa.Table.from_pylist(alerts, ARROW_SCHEMAS[ALERTS])
    return rows


def _write_groups(settings: Settings, rng: random.Random, first: int, groups: int) -> None:
    create_missing_tables(LiveTables.of(settings))
    spool = Spool(settings)
    for batch in range(first, first + groups):
        spool.write(batch, _group(rng, batch, rng.randint(5, 40)), {})
        spool.flush(batch)


def _amendments(settings: Settings, rng: random.Random) -> None:
    """A backfill's CORRECTIONs and RETRACTIONs (no case), in a file of their own."""
    rows = []
    for n in range(30):
        at = rng.choice(CENTRES) + rng.randint(-90_000, 90_000)
        kind = rng.choice(["CORRECTION", "RETRACTION"])
        row = alert_row(f"x{n}", (4, rng.choice([1, 2])), at, kind)
        row.update(shadow=False, suppressed=None, suppressedBy=None, caseId=None, outcome=None)
        rows.append(row)
    table = pa.Table.from_pylist(rows, ARROW_SCHEMAS[ALERTS])
    write_deltalake(str(settings.table_path(ALERTS)), table, mode="append")


def _rewrite_whole(settings: Settings) -> None:
    """Every row of the alerts table in new files, as OPTIMIZE leaves it."""
    path = str(settings.table_path(ALERTS))
    rows = DeltaTable(path).to_pyarrow_table()
    write_deltalake(path, rows, mode="overwrite")


# --- the full computations (what the page read before) --------------------------------


def _all_alerts(settings: Settings) -> pa.Table:
    return DeltaTable(str(settings.table_path(ALERTS))).to_pyarrow_table()


def scanned_rule_rates(settings: Settings, rule_ids: Collection[int], now_ms: int) -> Any:
    since = minute_starts(now_ms)[0]
    counts: dict[tuple[int, int, bool], int] = {}
    fired: dict[int, set[str]] = {}
    for r in _all_alerts(settings).to_pylist():
        if r["decisionTime"] < since or r["kind"] != "ALERT" or r["shadow"]:
            continue
        minute = r["decisionTime"] - r["decisionTime"] % MINUTE_MS
        key = (r["ruleId"], minute, bool(r["suppressed"]))
        counts[key] = counts.get(key, 0) + 1
        fired.setdefault(r["ruleId"], set()).add(r["transactionId"])
    events = DeltaTable(str(settings.table_path(EVENTS))).to_pyarrow_table()
    payments = events.filter(pc.field("ingest_time") >= since).num_rows
    return pure_rule_rates(
        [(*k, n) for k, n in counts.items()],
        {rule: len(txs) for rule, txs in fired.items()},
        payments,
        rule_ids,
        now_ms,
    )


def scanned_volumes(settings: Settings, now_ms: int) -> dict[tuple[int, int], tuple[int, int]]:
    out: dict[tuple[int, int], list[int]] = {}
    for r in _all_alerts(settings).to_pylist():
        if r["kind"] == "RETRACTION" or r["decisionTime"] < now_ms - WEEK_MS:
            continue
        counted = out.setdefault((r["ruleId"], r["ruleVersion"]), [0, 0])
        counted[1] += 1
        counted[0] += r["decisionTime"] >= now_ms - DAY_MS
    return {version: (day, week) for version, (day, week) in out.items()}


def _records(settings: Settings) -> list[dict[str, Any]]:
    """Every alert as the page lists it (a SPEC §4 record of the columns it reads)."""
    rows = _all_alerts(settings).select(reader._RECORD_COLUMNS)
    return [reader._alert_record(r) for r in rows.to_pylist()]


FILTERS = [
    AlertFilter(),
    AlertFilter(rule_id=5),
    AlertFilter(kind=AlertKind.CORRECTION),
    AlertFilter(key=(KeyPart("payerId", "p3"),)),
    AlertFilter(rule_id=4, from_ms=NOW - DAY_MS - 60_000, to_ms=NOW),
    AlertFilter(transaction_id="t3-2"),
    AlertFilter(transaction_id="no-such-payment"),
    AlertFilter(rule_id=99),  # nothing matches: the whole table is read, the page is empty
]


def _agrees(settings: Settings, search: bool = True) -> None:
    rule_ids = [4, 5, 6]
    for now in (NOW, NOW + 45_000):
        assert reader.rule_rates(settings, rule_ids, now) == scanned_rule_rates(
            settings, rule_ids, now
        )
    volumes = reader.alert_volumes(settings, NOW)
    assert {v: (c.last_24h, c.last_7d) for v, c in volumes.items()} == scanned_volumes(
        settings, NOW
    )
    assert any(c.last_24h < c.last_7d for c in volumes.values()), "both bounds count"

    records = _records(settings)
    # Every page of 50, and the first pages of one alert (spans of a row or two), of each
    # filter (the search keeps nothing between looks: once is enough).
    for query in FILTERS if search else ():
        for limit, most in ((50, 100), (1, 6)):
            before = None
            for _ in range(most):
                expected = page_of(records, query, before, limit)
                found = reader.newest_alerts(settings, query, before, limit)
                assert found.alerts == list(expected.alerts), (query, limit, before)
                assert found.more == (expected.older is not None), (query, limit, before)
                if expected.older is None:
                    break
                before = expected.older

    by_id = {r["alertId"]: r for r in records}
    for alert_id in random.Random(3).sample(sorted(by_id), 40):
        found = reader.find_alert(settings, alert_id)
        assert {k: v for k, v in found.items() if k in by_id[alert_id]} == by_id[alert_id]
        assert reader.alert_ref(settings, alert_id) == AlertRef.of(by_id[alert_id])
    assert reader.alert_ref(settings, "no-such-alert") is None

    every = _all_alerts(settings)
    store = CaseStore(settings)
    for case in store.cases().values():
        mine = every.filter(pc.field("caseId") == case.case_id)
        ordered = mine.sort_by([(n, "ascending") for n in ALERT_TIME_ORDER])
        assert store.alerts(case.case_id).equals(
            ordered.select(store.alerts(case.case_id).column_names)
        )
        for newest in (1, 5, 20):
            shown = store.alerts(case.case_id, newest)
            assert (
                shown.column("alertId").to_pylist()
                == ordered.column("alertId").to_pylist()[-newest:]
            ), (case.case_id, newest)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return load_settings(data_dir=tmp_path / "data dir")  # a space: percent-encoded URIs


def test_the_page_s_reads_equal_the_full_computation_as_the_table_grows_and_is_rewritten(
    settings: Settings,
) -> None:
    rng = random.Random(51)
    _write_groups(settings, rng, 0, 12)
    _amendments(settings, rng)
    _agrees(settings)  # the first look: every file read once
    _write_groups(settings, rng, 12, 4)
    _agrees(settings, search=False)  # only the new files read
    _rewrite_whole(settings)
    _agrees(settings, search=False)  # the rewritten files' parts forgotten, new ones read


def test_the_latest_reviews_and_precision_follow_each_review_recorded(settings: Settings) -> None:
    rng = random.Random(7)
    _write_groups(settings, rng, 0, 3)
    store = reader.review_store(settings)
    alert_ids = [r["alertId"] for r in _records(settings) if r["kind"] == "ALERT"]
    for n in range(25):
        alert_id = rng.choice(alert_ids[:10])
        verdict = rng.choice(["CONFIRMED_FRAUD", "FALSE_POSITIVE", "NEEDS_REVIEW"])
        store.record(alert_id, reader.alert_ref(settings, alert_id), verdict, "", f"r{n}")
        assert store.latest() == latest_reviews(store.all())
    figures = reader.precision_by_version(settings, NOW)
    assert figures == reader.precision_by_version(settings, NOW, store.all())
    assert sum(f.reviewed for f in figures) == len(store.latest())


def _fresh_process() -> None:
    """What a new process knows of the tables: nothing (the folds are this process's)."""
    from velocity.delta import file_folds

    with file_folds.FOLDS_LOCK:
        file_folds._FOLDS.clear()


def test_a_fresh_process_reads_each_data_file_s_kept_parts_not_the_file(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first look of a restarted api-server: the alert counts and id fingerprints come
    from the parts the first reader kept beside the table; a part unreadable is made again
    from its file; the parts of files a rewrite removed are removed."""
    from velocity.delta import alert_files

    rng = random.Random(52)
    _write_groups(settings, rng, 0, 6)
    _amendments(settings, rng)
    _agrees(settings, search=False)  # the first reader: every data file read, parts kept
    table = DeltaTable(str(settings.table_path(ALERTS)))
    names = {unquote(u.rsplit("/", 1)[-1]) + ".arrow" for u in table.file_uris()}
    roots = [alert_files.FileParts(table, fold).root for fold in ("alert_minutes", "alert_ids")]
    for root in roots:
        assert root is not None and {p.name for p in root.iterdir()} == names

    def no_data_file(uri: str, columns: Any) -> pa.Table:
        raise AssertionError(f"a data file read: {uri}")

    _fresh_process()
    with monkeypatch.context() as patched:
        patched.setattr(alert_files, "_read_file", no_data_file)
        _agrees(settings, search=False)

    # A part torn (a disk's fault): read from its data file again, and kept whole again.
    torn = sorted(roots[1].iterdir())[0]  # type: ignore[union-attr]
    torn.write_bytes(torn.read_bytes()[:20])
    _fresh_process()
    _agrees(settings, search=False)
    assert alert_files.FileParts(table, "alert_ids").read(torn.name.removesuffix(".arrow"))

    _rewrite_whole(settings)
    _fresh_process()
    _agrees(settings, search=False)
    table = DeltaTable(str(settings.table_path(ALERTS)))
    names = {unquote(u.rsplit("/", 1)[-1]) + ".arrow" for u in table.file_uris()}
    for root in roots:
        assert {p.name for p in root.iterdir()} == names, "the removed files' parts gone"


def test_fingerprints_are_the_same_in_every_process() -> None:
    """Kept in the parts: a change of the function must come with a new PARTS_FORMAT."""
    from velocity.delta.alert_files import PARTS_FORMAT, fingerprint, fingerprints

    assert (PARTS_FORMAT, fingerprint("a"), fingerprint("bp-123456")) == (
        "v1",
        3926504341,
        1874972591,
    )
    texts = pa.array(["x", "", None, "payerId=p-7", "ü-ñ"] * 3).slice(2, 9)
    assert list(fingerprints(texts)) == sorted(fingerprint(t or "") for t in texts.to_pylist())
