"""The alert_reviews table on real Delta (delta-rs, no JVM), beside an alerts table of the
stream's schema (``tests.builders.append_alerts``): append-only reviews, the latest wins,
refusals write nothing, concurrent reviewers never tie, precision per rule version,
`velocity reviews export`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from tests.builders import alert_row, append_alerts
from velocity.analyst.reviews import DAY_MS, NOTE_MAX, InvalidReviewError, Verdict
from velocity.delta import reader
from velocity.delta.names import ALERTS
from velocity.delta.review_store import ReviewStore
from velocity.settings import Settings, load_settings

pytestmark = pytest.mark.timeout(120)

NOW = 1_767_225_600_000


def _alert(alert_id: str, rule: tuple[int, int], age_ms: int, kind: str = "ALERT") -> dict:
    return alert_row(alert_id, rule, NOW - age_ms, kind)


ALERTS_WRITTEN = [
    _alert("a1", (4, 2), 1000),
    _alert("a2", (4, 2), 2 * DAY_MS),  # this week, not today
    _alert("a3", (4, 2), 8 * DAY_MS),  # older than a week: counted nowhere but reviewable
    _alert("a4", (4, 1), 1000),
    _alert("r1", (4, 2), 500, kind="RETRACTION"),  # raises nothing, cannot be reviewed
    _alert("c1", (5, 1), 3000, kind="CORRECTION"),
]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # A space in the path: delta-rs names the data files by percent-encoded URIs.
    settings = load_settings(data_dir=tmp_path / "data dir")
    # Two commits, as the stream's micro-batches make them.
    alerts = settings.table_path(ALERTS)
    for part in (ALERTS_WRITTEN[:3], ALERTS_WRITTEN[3:]):
        append_alerts(alerts, part)
    return settings


def _record(store: ReviewStore, settings: Settings, alert_id: str, verdict: str, **kw: Any) -> Any:
    alert = reader.alert_ref(settings, alert_id)
    return store.record(alert_id, alert, verdict, kw.pop("note", ""), kw.pop("who", "ana"), **kw)


def test_reviews_append_and_the_latest_of_each_alert_counts(settings: Settings) -> None:
    store = reader.review_store(settings)
    assert store.all() == [] and store.latest() == {}, "no table yet: no reviews"
    first = _record(store, settings, "a1", "false positive", note="regular payee", now_ms=NOW)
    assert (first.rule_id, first.rule_version, first.when) == (4, 2, NOW), "from the alert"
    version = DeltaTable(str(store.path)).version()
    _record(store, settings, "a1", "CONFIRMED_FRAUD", note="card reported stolen", now_ms=NOW)
    _record(store, settings, "a2", "needs review", who="bo", now_ms=NOW + 5)
    assert DeltaTable(str(store.path)).version() == version + 2, "one commit a review"

    history = store.all()
    assert [(r.alert_id, r.verdict, r.when) for r in history] == [
        ("a1", Verdict.FALSE_POSITIVE, NOW),
        ("a1", Verdict.CONFIRMED_FRAUD, NOW + 1),  # same millisecond: 1 ms after the first
        ("a2", Verdict.NEEDS_REVIEW, NOW + 5),
    ]
    latest = store.latest()
    assert latest["a1"].verdict is Verdict.CONFIRMED_FRAUD
    assert latest["a1"].note == "card reported stolen" and latest["a2"].who == "bo"
    # Append-only: every commit of the table only adds files.
    operations = [c["operation"] for c in DeltaTable(str(store.path)).history()]
    assert set(operations) == {"CREATE TABLE", "WRITE"}


@pytest.mark.parametrize(
    ("alert_id", "verdict", "note", "field"),
    [
        pytest.param("a1", "FRAUD", "", "verdict", id="unknown-verdict"),
        pytest.param("nope", "CONFIRMED_FRAUD", "", "alertId", id="unknown-alert"),
        pytest.param("r1", "CONFIRMED_FRAUD", "", "alertId", id="retraction"),
        pytest.param("a1", "CONFIRMED_FRAUD", "x" * (NOTE_MAX + 1), "note", id="long-note"),
    ],
)
def test_invalid_input_names_its_field_and_writes_nothing(
    settings: Settings, alert_id: str, verdict: str, note: str, field: str
) -> None:
    store = reader.review_store(settings)
    _record(store, settings, "a4", "CONFIRMED_FRAUD", now_ms=NOW)
    before = DeltaTable(str(store.path)).version()
    with pytest.raises(InvalidReviewError) as refused:
        _record(store, settings, alert_id, verdict, note=note)
    assert refused.value.field == field
    assert DeltaTable(str(store.path)).version() == before
    assert [r.alert_id for r in store.all()] == ["a4"]


def test_an_invalid_review_does_not_create_the_table(settings: Settings) -> None:
    store = reader.review_store(settings)
    with pytest.raises(InvalidReviewError):
        _record(store, settings, "a1", "maybe")
    assert not store.path.exists()


def test_concurrent_reviewers_of_one_alert_never_tie(settings: Settings) -> None:
    """Six reviews of one alert at once, all stamped the same millisecond: each lands, in
    its own commit, 1 ms after the one before, so exactly one is the latest."""
    store = reader.review_store(settings)
    alert = reader.alert_ref(settings, "a1")
    store.record("a1", alert, "NEEDS_REVIEW", "", "first", now_ms=NOW)  # the table exists
    start = threading.Barrier(6)
    errors: list[BaseException] = []

    def review(n: int) -> None:
        try:
            start.wait()
            ReviewStore(store.path).record("a1", alert, "FALSE_POSITIVE", "", f"r{n}", now_ms=NOW)
        except BaseException as exc:  # the test reports it below
            errors.append(exc)

    threads = [threading.Thread(target=review, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    history = store.all()
    assert [r.when for r in history] == [NOW + i for i in range(7)]
    assert sorted(r.who for r in history[1:]) == [f"r{n}" for n in range(6)]
    assert store.latest()["a1"] == history[-1]


def test_precision_per_rule_version_from_the_alerts_and_reviews_tables(
    settings: Settings,
) -> None:
    store = reader.review_store(settings)
    assert reader.alert_ref(settings, "c1") is not None
    for alert_id, verdict in [
        ("a1", "CONFIRMED_FRAUD"),
        ("a2", "FALSE_POSITIVE"),
        ("a3", "CONFIRMED_FRAUD"),  # raised 8 days ago: its review still counts
        ("a4", "FALSE_POSITIVE"),
        ("c1", "NEEDS_REVIEW"),
    ]:
        _record(store, settings, alert_id, verdict, now_ms=NOW)
    figures = {
        (f.rule_id, f.rule_version): f.to_json() for f in reader.precision_by_version(settings, NOW)
    }
    assert list(figures) == [(4, 1), (4, 2), (5, 1)]
    v2 = figures[(4, 2)]
    assert (v2["alerts24h"], v2["alerts7d"]) == (1, 2), "the retraction and the old alert left out"
    assert (v2["reviewed"], v2["confirmed"], v2["falsePositives"]) == (3, 2, 1)
    assert v2["precision"] == pytest.approx(2 / 3)
    assert (figures[(4, 1)]["alerts24h"], figures[(4, 1)]["precision"]) == (1, 0.0)
    assert (figures[(5, 1)]["alerts7d"], figures[(5, 1)]["precision"]) == (1, None)


def test_a_review_is_recorded_in_well_under_two_seconds(settings: Settings) -> None:
    store = reader.review_store(settings)
    for n in range(40):  # a table of some history, one file a review
        _record(store, settings, "a1", "NEEDS_REVIEW", note=f"look {n}", now_ms=NOW + n)
    started = time.perf_counter()
    alert = reader.alert_ref(settings, "a2")
    store.record("a2", alert, "CONFIRMED_FRAUD", "", "ana")
    took = time.perf_counter() - started
    print(f"review recorded (alert looked up, 41st review) in {took:.3f} s")
    assert took < 2.0


def test_velocity_reviews_export_latest_or_all_without_a_jvm(
    settings: Settings, tmp_path: Path
) -> None:
    store = reader.review_store(settings)
    _record(store, settings, "a1", "FALSE_POSITIVE", now_ms=NOW)
    _record(store, settings, "a2", "NEEDS_REVIEW", note='says "hi"\nbye', now_ms=NOW + 10)
    _record(store, settings, "a1", "CONFIRMED_FRAUD", now_ms=NOW + 20)
    probe = (
        "import sys\n"
        "from velocity.cli.main import main\n"
        "codes = [main(['reviews', 'export', '--out', sys.argv[1]]),\n"
        "         main(['reviews', 'export', '--all', '--out', sys.argv[2]])]\n"
        "heavy = sorted(m for m in ('pyspark', 'pandas', 'py4j') if m in sys.modules)\n"
        "print('codes', codes, 'heavy', heavy)\n"
    )
    latest_out, all_out = tmp_path / "latest.jsonl", tmp_path / "all.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", probe, str(latest_out), str(all_out)],
        env={**os.environ, "VELOCITY_DATA_DIR": str(settings.data_dir)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "codes [0, 0] heavy []" in done.stdout
    assert "2 reviews written to" in done.stdout and "3 reviews written to" in done.stdout
    latest = [json.loads(line) for line in latest_out.read_text().splitlines()]
    assert [(r["alertId"], r["verdict"], r["when"]) for r in latest] == [
        ("a2", "NEEDS_REVIEW", NOW + 10),
        ("a1", "CONFIRMED_FRAUD", NOW + 20),
    ], "the latest per alert, oldest first"
    assert latest[0] == {
        "alertId": "a2",
        "ruleId": 4,
        "ruleVersion": 2,
        "verdict": "NEEDS_REVIEW",
        "note": 'says "hi"\nbye',
        "who": "ana",
        "when": NOW + 10,
    }
    every = [json.loads(line) for line in all_out.read_text().splitlines()]
    assert [r["verdict"] for r in every] == ["FALSE_POSITIVE", "NEEDS_REVIEW", "CONFIRMED_FRAUD"]
