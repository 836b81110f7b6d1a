"""The Velocity page's backfill runs: one row a run, newest first (pure HTML from plain
data; everything shown is escaped). What each run did comes from the ``backfills`` Delta
table, its state and link from Airflow (``velocity.analyst.backfill_runs``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from velocity.analyst.backfill_runs import BackfillRunView
from velocity.domain.rules import Rule, rule_summary
from velocity_airflow.page.values_html import time_ago, time_text, token_input

# The DAG the form starts a run of (Airflow's own trigger form for it stays).
BACKFILL_DAG_ID = "backfill_alerts"


def _range(view: BackfillRunView) -> str:
    recorded = view.recorded
    if recorded is None:
        return escape(view.asked) or '<span class="muted">—</span>'
    if recorded.from_ms == recorded.to_ms == 0:
        return '<span class="muted">none (a recovery)</span>'
    covered = recorded.covered_text
    late = f' <span data-testid="late-covered">({escape(covered)})</span>' if covered else ""
    return f"{time_text(recorded.from_ms)} … {time_text(recorded.to_ms)}{late}"


def backfill_form(
    rules: Sequence[Rule], written: Mapping[str, Any], base: str, back: str, token: str = ""
) -> str:
    """The form that starts a backfill run from the page: the rules in force to replay
    (none chosen: every one), and the event-time range in UTC (both empty: the recorded
    late and out-of-order events). ``written``: the fields as last written, kept when
    the server refused them; ``back``: the hidden field that brings the page back;
    ``token``: the page's token."""
    chosen = {str(r) for r in written.get("rule_ids") or ()}
    boxes = "".join(
        f'<label class="choice"><input type="checkbox" name="rule_ids" value="{r.rule_id}"'
        f"{' checked' if str(r.rule_id) in chosen else ''} "
        f'data-testid="backfill-rule-{r.rule_id}"> {r.rule_id} · {escape(rule_summary(r))}'
        "</label>"
        for r in rules
    )

    def box(name: str, label: str) -> str:
        return (
            f'<label>{label} <input name="{name}" size="20" '
            f'placeholder="2026-01-01 10:00 (UTC)" value="{escape(str(written.get(name, "")))}" '
            f'data-testid="backfill-{name}"></label> '
        )

    return (
        f'<form method="post" action="{base}/backfills" data-testid="backfill-form" '
        'data-progress="Starting the backfill run…">'
        f"{back}{token_input(token)}<div>{boxes}</div>"
        f"{box('from_time', 'From')}{box('to_time', 'to')}"
        '<button type="submit" data-testid="backfill-submit">Start backfill</button>'
        '<p class="muted">Starts a run of the <code>backfill_alerts</code> DAG through '
        "Airflow, as its trigger form does (which stays: "
        f'<a href="/dags/{BACKFILL_DAG_ID}" target="_top">the DAG in Airflow</a>; a paused '
        "DAG is unpaused, as that form does by default). From and to: event times in UTC, "
        "both inclusive (<code>2026-01-01 10:05</code>, a time copied from the page, or "
        "epoch ms); both empty: the recorded late and out-of-order events. No rule chosen: "
        "every rule in force.</p></form>"
    )


def backfill_table(
    runs: Sequence[BackfillRunView] | None, error: str | None, now_ms: int = 0
) -> str:
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
            f"<td>{time_ago(run.started_at, now_ms) if now_ms else time_text(run.started_at)}"
            f"</td><td>{escape(run.state)}</td>"
            f"<td>{_range(run)}</td><td>{escape(run.rules_text)}</td>{cells}<td>{link}</td></tr>"
        )
    return f'<table data-testid="backfill-runs">{head}{"".join(rows)}</table>'
