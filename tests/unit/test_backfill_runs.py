"""Backfill runs as the page lists them (pure): one row per Airflow run with the figures
its backfill recorded, runs without Airflow listed too, newest first."""

from __future__ import annotations

import pytest

from velocity.analyst.backfill_runs import AirflowRun, RecordedRun, asked_text, backfill_runs

pytestmark = pytest.mark.timeout(60)

T = 1_767_225_600_000


def _recorded(run_id: str, started: int, airflow: str | None = None) -> RecordedRun:
    return RecordedRun.from_row(
        {
            "run_id": run_id,
            "from_ms": T,
            "to_ms": T + 3_600_000,
            "rule_ids": [5, 7],
            "events_evaluated": 8904,
            "corrections": 20,
            "retractions": 1,
            "started_at": started,
            "finished_at": started + 30_000,
            "late_through_batch": None,
            "lock_seconds": 12.46,
            "airflow_run_id": airflow,
        }
    )


def _airflow(run_id: str, state: str, started: int | None) -> AirflowRun:
    conf = {"from_time": "2026-01-01T00:00:00Z", "to_time": "2026-01-01T01:00:00Z"}
    return AirflowRun(run_id, state, {**conf, "rule_ids": ["5", "7"]}, started, f"/r/{run_id}")


def test_each_airflow_run_shows_the_figures_its_backfill_recorded_newest_first() -> None:
    recorded = [
        _recorded("a", T + 1000, airflow="manual__1"),
        _recorded("b", T + 5000),  # `velocity backfill` by hand
        _recorded("republish-c", T + 7000),
        _recorded("d", T + 500, airflow="manual__gone"),
    ]
    airflow = [
        _airflow("manual__1", "success", T + 900),
        _airflow("manual__2", "failed", T + 3000),
        _airflow("manual__3", "queued", None),
    ]
    runs = backfill_runs(recorded, airflow)
    assert [(r.state, r.url) for r in runs] == [
        ("queued", "/r/manual__3"),
        ("recovery", None),
        ("done", None),
        ("failed", "/r/manual__2"),
        ("success", "/r/manual__1"),
        ("done (Airflow run gone)", None),
    ]
    done = runs[-2]
    assert done.recorded is not None and done.recorded.events_evaluated == 8904
    assert (done.recorded.corrections, done.recorded.retractions) == (20, 1)
    assert done.recorded.lock_seconds == 12.46 and done.rules_text == "5, 7"
    failed = runs[3]
    assert failed.recorded is None, "a failed run recorded nothing: no figures"
    assert failed.asked == "2026-01-01T00:00:00Z … 2026-01-01T01:00:00Z, rules 5, 7"
    assert len(backfill_runs(recorded, airflow, limit=2)) == 2


def test_a_run_recorded_before_lock_time_and_airflow_ids_reads_without_them() -> None:
    old = RecordedRun.from_row(
        {
            "run_id": "x",
            "from_ms": 0,
            "to_ms": 5,
            "rule_ids": [],
            "events_evaluated": 0,
            "corrections": 0,
            "retractions": 0,
            "started_at": T,
            "finished_at": T,
        }
    )
    assert old.lock_seconds is None and old.airflow_run_id is None
    [view] = backfill_runs([old], [])
    assert view.state == "done" and view.rules_text == "none ACTIVE"
    assert asked_text({}) == (
        "the late and out-of-order events not yet backfilled, every rule in force"
    )


def test_a_late_run_says_how_many_late_and_out_of_order_events_it_covered() -> None:
    base = {
        "run_id": "r", "from_ms": T, "to_ms": T + 1, "rule_ids": [], "events_evaluated": 1,
        "corrections": 0, "retractions": 0, "started_at": T, "finished_at": T,
    }  # fmt: skip
    late = {**base, "late_through_batch": 9, "late_events": 3, "out_of_order_events": 1598}
    assert RecordedRun.from_row(late).covered_text == "late events: 3 late, 1598 out of order"
    # Recorded before the counts (a null or no column): only that it covered late events.
    assert RecordedRun.from_row({**base, "late_through_batch": 9}).covered_text == "late events"
    assert RecordedRun.from_row({**base, "late_through_batch": None}).covered_text == ""
