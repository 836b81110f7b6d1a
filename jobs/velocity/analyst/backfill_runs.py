"""Backfill runs as people follow them (pure: no Spark, Delta, Redis or Airflow).

Two records meet here. The ``backfills`` Delta table holds what each finished run did
(written by the run itself, in the lock in which it appends its amendments: time range,
rules, events evaluated, corrections, retractions, lock time, and the Airflow run that ran
it, if any). Airflow's DAG runs of ``backfill_alerts`` hold what Airflow knows: the state
(queued, running, success, failed), the form's values, and where the run's page is.

Invariants:

- One row per Airflow run, and one per recorded run that no Airflow run claims (run by
  `velocity backfill` itself, or a recovery that republished a crashed run's amendments).
- Newest first, by when the run started (Airflow's start, else the record's).
- A run's figures are those it recorded; a run with no record (still running, or failed
  before recording) shows none, and its state is Airflow's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# A recovery's run id (velocity.spark.backfill: republishing a crashed run's amendments).
RECOVERY_PREFIX = "republish-"


@dataclass(frozen=True)
class RecordedRun:
    """One row of the ``backfills`` table."""

    run_id: str
    from_ms: int
    to_ms: int
    rule_ids: tuple[int, ...]
    events_evaluated: int
    corrections: int
    retractions: int
    started_at: int
    finished_at: int
    late_through_batch: int | None = None
    lock_seconds: float | None = None  # None: recorded by a Velocity that did not say
    airflow_run_id: str | None = None
    # A ``--late`` run's late and out-of-order events; None for a range, or a run
    # recorded by a Velocity that did not count them.
    late_events: int | None = None
    out_of_order_events: int | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> RecordedRun:
        lock = row.get("lock_seconds")
        return cls(
            run_id=str(row["run_id"]),
            from_ms=int(row["from_ms"]),
            to_ms=int(row["to_ms"]),
            rule_ids=tuple(int(r) for r in row.get("rule_ids") or ()),
            events_evaluated=int(row["events_evaluated"]),
            corrections=int(row["corrections"]),
            retractions=int(row["retractions"]),
            started_at=int(row["started_at"]),
            finished_at=int(row["finished_at"]),
            late_through_batch=row.get("late_through_batch"),
            lock_seconds=None if lock is None else float(lock),
            airflow_run_id=row.get("airflow_run_id") or None,
            late_events=_count(row.get("late_events")),
            out_of_order_events=_count(row.get("out_of_order_events")),
        )

    @property
    def covered_text(self) -> str:
        """What a ``--late`` run covered: ``late events: 3 late, 120 out of order``;
        empty for a range."""
        if self.late_through_batch is None:
            return ""
        if self.late_events is None or self.out_of_order_events is None:
            return "late events"
        return f"late events: {self.late_events} late, {self.out_of_order_events} out of order"


def _count(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class AirflowRun:
    """What Airflow holds of one run of the backfill DAG."""

    run_id: str
    state: str
    conf: Mapping[str, Any]
    started_at: int | None  # epoch ms; None while queued
    url: str  # the run's page in the Airflow UI


@dataclass(frozen=True)
class BackfillRunView:
    """One row of the page's backfill runs."""

    state: str
    started_at: int | None
    finished_at: int | None
    asked: str  # the range and rules as asked for (Airflow's form), when known
    recorded: RecordedRun | None
    url: str | None  # the Airflow run's page

    @property
    def rules_text(self) -> str:
        if self.recorded is None:
            return ""
        return ", ".join(str(r) for r in self.recorded.rule_ids) or "none ACTIVE"


def asked_text(conf: Mapping[str, Any]) -> str:
    """A run's form as people read it: ``2026-01-01T00:00:00Z … 2026-01-01T01:00:00Z, rules
    5, 7``; the late events when no range was given."""
    start, end, rules = conf.get("from_time"), conf.get("to_time"), conf.get("rule_ids")
    span = (
        f"{start} … {end}"
        if start or end
        else "the late and out-of-order events not yet backfilled"
    )
    chosen = f"rules {', '.join(str(r) for r in rules)}" if rules else "every rule in force"
    return f"{span}, {chosen}"


def backfill_runs(
    recorded: Iterable[RecordedRun], airflow: Sequence[AirflowRun], limit: int = 50
) -> list[BackfillRunView]:
    """The runs to show, newest first (see the module's invariants)."""
    by_airflow: dict[str, RecordedRun] = {}
    alone: list[RecordedRun] = []
    for done in recorded:
        if done.airflow_run_id:
            by_airflow[done.airflow_run_id] = done
        else:
            alone.append(done)
    views = []
    claimed = {run.run_id for run in airflow}
    for run in airflow:
        record = by_airflow.get(run.run_id)
        views.append(
            BackfillRunView(
                state=run.state,
                started_at=run.started_at,
                finished_at=None if record is None else record.finished_at,
                asked=asked_text(run.conf),
                recorded=record,
                url=run.url,
            )
        )
    # Records of Airflow runs that Airflow no longer lists (deleted, or an older page).
    orphans = [r for key, r in by_airflow.items() if key not in claimed]
    for record in alone + orphans:
        how = "recovery" if record.run_id.startswith(RECOVERY_PREFIX) else "done"
        views.append(
            BackfillRunView(
                state=how if record.airflow_run_id is None else f"{how} (Airflow run gone)",
                started_at=record.started_at,
                finished_at=record.finished_at,
                asked="",
                recorded=record,
                url=None,
            )
        )
    views.sort(key=lambda v: v.started_at if v.started_at is not None else 2**62, reverse=True)
    return views[:limit]
