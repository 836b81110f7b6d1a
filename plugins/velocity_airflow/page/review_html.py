"""The Velocity page's reviews: a verdict form beside each alert, and each rule version's
alerts, reviews and precision (pure HTML from plain data; everything shown is escaped).

A review form carries its in-flight words (``data-progress``) like a rule change, so the
page's script shows it in flight and then the outcome. Only an editor gets the forms; the
server refuses a viewer's post whatever the page shows.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from html import escape
from typing import Any
from urllib.parse import quote

from velocity.analyst.reviews import NOTE_MAX, Review, Verdict, VersionPrecision
from velocity_airflow.page.values_html import token_input

STYLE = """
.verdict-CONFIRMED_FRAUD { color: #c53030; font-weight: 600; }
.verdict-FALSE_POSITIVE { color: #276749; font-weight: 600; }
.verdict-NEEDS_REVIEW { color: #b7791f; font-weight: 600; }
form.review select, form.review input { font-size: .8rem; }
td.figure { text-align: right; }
"""


def review_cell(
    alert: Mapping[str, Any], review: Review | None, can_review: bool, base: str, token: str = ""
) -> str:
    """The alert's latest verdict (by whom), and for an editor the form to review it."""
    shown = ""
    if review is not None:
        note = f' title="{escape(review.note)}"' if review.note else ""
        shown = (
            f'<span data-testid="review-shown" class="verdict-{review.verdict.value}"{note}>'
            f"{escape(review.verdict.words)}</span> "
            f'<span class="muted">by {escape(review.who)}</span> '
        )
    if not can_review or alert.get("kind") == "RETRACTION":
        return shown
    alert_id = str(alert["alertId"])
    # No verdict is chosen for the analyst: a click must not record one by default.
    unchosen = '<option value="" disabled selected>verdict…</option>' if review is None else ""
    options = unchosen + "".join(
        f'<option value="{v.value}"'
        f"{' selected' if review is not None and review.verdict is v else ''}>{v.words}</option>"
        for v in Verdict
    )
    progress = f"Recording the review of alert {alert_id}…"
    return (
        f'{shown}<form class="inline review" method="post" '
        f'action="{base}/alerts/{escape(quote(alert_id, safe=""))}/review" '
        f'data-progress="{escape(progress)}" data-testid="review-form" '
        f'data-alert="{escape(alert_id)}">{token_input(token)}'
        f'<select name="verdict" required data-testid="review-verdict">{options}</select> '
        f'<input name="note" size="16" maxlength="{NOTE_MAX}" placeholder="note" '
        'data-testid="review-note"> '
        '<button type="submit" data-testid="review-submit">Review</button></form>'
    )


def percent_text(precision: float | None, confirmed: int, false_positives: int) -> str:
    """A precision as shown: ``67% (2/3)``, or a dash while there is none."""
    if precision is None:
        return '<span class="muted">—</span>'
    decided = confirmed + false_positives
    return f'{precision:.0%} <span class="muted">({confirmed}/{decided})</span>'


def _candidate(figures: VersionPrecision, shadow: Collection[tuple[int, int]]) -> str:
    if (figures.rule_id, figures.rule_version) not in shadow:
        return ""
    return ' <span class="badge shadow" data-testid="shadow-version-badge">shadow</span>'


def _percent(figures: VersionPrecision) -> str:
    return percent_text(figures.precision, figures.confirmed, figures.false_positives)


def precision_table(
    figures: Sequence[VersionPrecision] | None,
    error: str | None,
    shadow: Collection[tuple[int, int]] = (),
) -> str:
    """One row per rule version: alerts in the last 24 h and 7 days (ALERT and CORRECTION,
    by decision time), and the latest reviews of its alerts, whenever raised; a version in
    ``shadow`` (ruleId, version) is marked as a SHADOW candidate's."""
    if error:
        return f'<p class="bad">{escape(error)}</p>'
    if not figures:
        return (
            '<p class="muted" data-testid="no-precision">'
            "No alerts in the last 7 days, and no reviews.</p>"
        )
    head = (
        "<tr><th>ruleId</th><th>version</th><th>alerts 24 h</th><th>alerts 7 d</th>"
        "<th>reviewed</th><th>confirmed</th><th>false positives</th><th>needs review</th>"
        "<th>precision</th></tr>"
    )
    rows = []
    for f in figures:
        cells = (f.alerts_24h, f.alerts_7d, f.reviewed, f.confirmed, f.false_positives)
        numbers = "".join(f'<td class="figure">{n}</td>' for n in (*cells, f.needs_review))
        rows.append(
            f'<tr data-testid="precision-{f.rule_id}-{f.rule_version}" '
            f'data-reviewed="{f.reviewed}" data-confirmed="{f.confirmed}" '
            f'data-false-positives="{f.false_positives}">'
            f"<td>{f.rule_id}</td><td>{f.rule_version}{_candidate(f, shadow)}</td>{numbers}"
            f'<td class="figure" data-testid="precision-value">{_percent(f)}</td></tr>'
        )
    return (
        '<p class="muted">Precision = confirmed / (confirmed + false positives), over the '
        "latest review of each alert of the version.</p>"
        f'<table data-testid="precision">{head}{"".join(rows)}</table>'
    )
