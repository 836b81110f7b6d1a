"""The Velocity page's shadow rules: each SHADOW candidate beside its rule in force, with
the figures of ``velocity.analyst.shadow_compare`` and, for an editor, Promote and Discard (pure
HTML from plain data; everything shown is escaped).

A candidate is two rows of one ``<tbody>``: the rule in force, then the candidate; the
figures they share (both fired, only one, since when) span the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from velocity.analyst.shadow_compare import ShadowComparison, SideFigures
from velocity.domain.rules import Rule, rule_summary
from velocity_airflow.page import alerts_html
from velocity_airflow.page.review_html import percent_text
from velocity_airflow.page.values_html import token_input

STYLE = """
.state-SHADOW { color: #6b46c1; font-weight: 600; }
tbody.shadow { border-top: 2px solid #cbd5e0; }
"""

# In-flight words of each candidate action (the page's script shows them).
VERBS = {"promote": "Promoting the candidate of", "discard": "Discarding the candidate of"}


def _actions(comparison: ShadowComparison, base: str, token: str) -> str:
    rule_id = comparison.candidate.rule_id

    def button(action: str, label: str) -> str:
        return (
            f'<form class="inline" method="post" action="{base}/rules/{rule_id}/{action}" '
            f'data-progress="{escape(f"{VERBS[action]} ruleId {rule_id}…")}">{token_input(token)}'
            f'<button type="submit" data-testid="{action}-{rule_id}">{label}</button></form>'
        )

    version = comparison.candidate.version
    return button("promote", f"Promote v{version}") + button("discard", "Discard")


def _side(name: str, rule: Rule | None, figures: SideFigures) -> str:
    """The cells of one side: which, version and state, what it checks, its figures."""
    if rule is None:
        described = '<td></td><td class="muted">none: a new ruleId</td>'
    else:
        described = (
            f'<td data-testid="shadow-version">v{rule.version} '
            f'<span class="state-{rule.state.value}">{rule.state.value}</span></td>'
            f"<td>{escape(rule_summary(rule))}</td>"
        )
    precision = percent_text(figures.precision, figures.confirmed, figures.false_positives)
    return (
        f"<td>{name}</td>{described}"
        f'<td class="figure" data-testid="shadow-alerts">{figures.alerts}</td>'
        f'<td class="figure">{figures.reviewed}</td>'
        f'<td class="figure" data-testid="shadow-precision">{precision}</td>'
    )


def _data(figures: SideFigures) -> str:
    return (
        f'data-alerts="{figures.alerts}" data-reviewed="{figures.reviewed}" '
        f'data-confirmed="{figures.confirmed}" data-false-positives="{figures.false_positives}"'
    )


def shadow_section(
    comparisons: Sequence[ShadowComparison] | None,
    error: str | None,
    can_edit: bool,
    base: str,
    token: str = "",
) -> str:
    """Every candidate beside its rule in force (by ruleId), or why they cannot be shown;
    ``token``: the page's token, carried by each action's form."""
    if error:
        return f'<p class="bad">{escape(error)}</p>'
    if not comparisons:
        return (
            '<p class="muted" data-testid="no-shadow-rules">No shadow candidates. Add one with '
            "<b>Shadow</b> under Add or change rules, or <code>velocity rules shadow FILE</code>."
            "</p>"
        )
    head = (
        "<thead><tr><th>ruleId</th><th></th><th>version</th><th>rule</th><th>alerts</th>"
        "<th>reviewed</th><th>precision</th><th>both fired</th><th>only candidate</th>"
        f"<th>only in force</th><th>since</th>{'<th>actions</th>' if can_edit else ''}</tr>"
        "</thead>"
    )
    bodies = []
    for c in comparisons:
        rule_id = c.candidate.rule_id
        actions = f'<td rowspan="2">{_actions(c, base, token)}</td>' if can_edit else ""
        shared = (
            f'<td rowspan="2" class="figure" data-testid="shadow-both">{c.both}</td>'
            f'<td rowspan="2" class="figure" data-testid="shadow-only-candidate">'
            f"{c.only_candidate}</td>"
            f'<td rowspan="2" class="figure" data-testid="shadow-only-in-force">'
            f"{c.only_in_force}</td>"
            f'<td rowspan="2">{alerts_html.time_text(c.since)}</td>{actions}'
        )
        in_force = c.in_force
        bodies.append(
            f'<tbody class="shadow" data-testid="shadow-{rule_id}" '
            f'data-candidate-version="{c.candidate.version}" '
            f'data-in-force-version="{"" if in_force is None else in_force.version}" '
            f'data-both="{c.both}" data-only-candidate="{c.only_candidate}" '
            f'data-only-in-force="{c.only_in_force}">'
            f'<tr data-testid="shadow-{rule_id}-in-force" {_data(c.in_force_figures)}>'
            f'<td rowspan="2">{rule_id}</td>'
            f"{_side('in force', in_force, c.in_force_figures)}{shared}</tr>"
            f'<tr data-testid="shadow-{rule_id}-candidate" {_data(c.candidate_figures)}>'
            f"{_side('candidate', c.candidate, c.candidate_figures)}</tr></tbody>"
        )
    return (
        '<p class="muted">Each SHADOW candidate beside its rule in force, over the last 24 h '
        "(from when the candidate was applied, if later): the transactions each fired on "
        "(alerts in effect, by decision time), those both fired on or only one, and the "
        "precision of each, confirmed / (confirmed + false positives), on the payments "
        "analysts reviewed (a verdict on a payment counts for both). A candidate's alerts go to "
        "the alerts table and the shadow stream only; <b>Promote</b> makes it the ACTIVE "
        "version from the stream's next micro-batch.</p>"
        f'<table data-testid="shadow-rules">{head}{"".join(bodies)}</table>'
    )
