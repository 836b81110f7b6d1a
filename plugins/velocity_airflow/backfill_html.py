"""The Velocity page's backfill runs: one row a run, newest first (pure HTML from plain
data; everything shown is escaped). What each run did comes from the ``backfills`` Delta
table, its state and link from Airflow (``velocity.backfill_runs``)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from velocity.backfill_runs import BackfillRunView
from velocity_airflow.alerts_html import time_text


def _range(view: BackfillRunView) -> str:
    recorded = view.recorded
    if recorded is None:
        return escape(view.asked) or '<span class="muted">—</span>'
    if recorded.from_ms == recorded.to_ms == 0:
        return '<span class="muted">none (a recovery)</span>'
    covered = recorded.covered_text
    late = f' <span data-testid="late-covered">({escape(covered)})</span>' if covered else ""
    return f"{time_text(recorded.from_ms)} … {time_text(recorded.to_ms)}{late}"


def backfill_table(runs: Sequence[BackfillRunView] | None, error: str | None) -> str:
    """The runs, or why they cannot be read; a run's figures are blank until it records
    them (running, or failed before its end)."""
    if error:
        return f'<p class="bad">{escape(error)}</p>'
    if not runs:
        return '<p class="muted" data-testid="no-backfills">No backfill has run.</p>'
    head = (
        "<tr><th>started</th><th>state</th><th>range (event time, UTC)</th><th>rules</th>"
        "<th>events evaluated</th><th>corrections</th><th>retractions</th><th>lock time</th>"
        "<th>Airflow run</th></tr>"
    )
    rows = []
    for run in runs:
        recorded = run.recorded
        figures = ["", "", "", ""]
        if recorded is not None:
            lock = "" if recorded.lock_seconds is None else f"{recorded.lock_seconds:.2f} s"
            figures = [
                str(recorded.events_evaluated),
                str(recorded.corrections),
                str(recorded.retractions),
                lock,
            ]
        cells = "".join(f'<td class="figure">{escape(f)}</td>' for f in figures)
        # The page is in the Airflow UI's frame: the run's page opens in the whole window.
        link = (
            f'<a href="{escape(run.url)}" target="_top" data-testid="backfill-run-link">open</a>'
            if run.url
            else '<span class="muted">(velocity backfill)</span>'
        )
        rows.append(
            f'<tr data-testid="backfill-run" data-state="{escape(run.state)}">'
            f"<td>{time_text(run.started_at)}</td><td>{escape(run.state)}</td>"
            f"<td>{_range(run)}</td><td>{escape(run.rules_text)}</td>{cells}<td>{link}</td></tr>"
        )
    return f'<table data-testid="backfill-runs">{head}{"".join(rows)}</table>'
