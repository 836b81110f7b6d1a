"""The Velocity page's preview: what the rules of the add-rules form would have fired over
the last hours of the live events, beside the versions in force (pure HTML from
``velocity.analyst.preview.Preview.to_json()``; everything shown is escaped). Nothing is saved.

Per rule: its alerts and those of the version in force, their counts per hour (a row per
hour with a bar), the difference by transaction (added, removed, changed value: counts
and the first few), and a sample of alerts each with its explanation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from html import escape
from typing import Any

from velocity.analyst.alert_search import key_text
from velocity_airflow.page.alerts_html import time_text

STYLE = """
.bar { display: inline-block; height: .7em; background: #805ad5; vertical-align: middle; }
.bar.in-force { background: #a0aec0; }
.preview-rule { border-top: 2px solid #cbd5e0; margin-top: 1rem; }
.preview-rule table { width: auto; min-width: 40%; }
"""

# The widest bar of a per-hour table, in pixels.
_BAR_PX = 160
_KINDS = (("added", "addedShown"), ("removed", "removedShown"), ("changed", "changedShown"))


def _bar(count: int, widest: int, side: str) -> str:
    width = 0 if widest == 0 else max(1, round(_BAR_PX * count / widest)) if count else 0
    return f'<span class="bar {side}" style="width:{width}px"></span>'


def _notified(hour: Mapping[str, Any]) -> int:
    """The hour's alerts the rule's cooldown would notify (a preview of an older
    Velocity has no such count: all of them)."""
    return int(hour.get("notified", hour["alerts"]))


def _per_hour(rule: Mapping[str, Any], in_force: bool) -> str:
    """A row per hour of the span, oldest first: the candidate's alerts and those its
    cooldown would notify and, when there is a version in force, its own, each with a bar."""
    theirs = rule["inForcePerHour"] if in_force else [None] * len(rule["perHour"])
    widest = max(
        [h["alerts"] for h in rule["perHour"]] + [h["alerts"] for h in theirs if h is not None],
        default=0,
    )
    rows = []
    for mine, other in zip(rule["perHour"], theirs, strict=True):
        cells = (
            f"<td>{time_text(mine['start'])} … {time_text(mine['end'])}</td>"
            f'<td class="figure" data-testid="preview-hour-alerts">{mine["alerts"]}</td>'
            f'<td class="figure" data-testid="preview-hour-notified">{_notified(mine)}</td>'
            f"<td>{_bar(mine['alerts'], widest, 'candidate')}</td>"
        )
        if other is not None:
            cells += (
                f'<td class="figure" data-testid="preview-hour-in-force">{other["alerts"]}</td>'
                f'<td class="figure">{_notified(other)}</td>'
                f"<td>{_bar(other['alerts'], widest, 'in-force')}</td>"
            )
        rows.append(f'<tr data-testid="preview-hour" data-alerts="{mine["alerts"]}">{cells}</tr>')
    head = "<tr><th>hour (eventTime, UTC)</th><th>candidate</th><th>notified</th><th></th>"
    head += "<th>in force</th><th>notified</th><th></th></tr>" if in_force else "</tr>"
    return f'<table data-testid="preview-per-hour">{head}{"".join(rows)}</table>'


def _diff(rule: Mapping[str, Any]) -> str:
    """Counts of each kind of difference and, against a version in force, the first few of
    each (without one every alert is added: the sample shows them)."""
    diff = rule["diff"]
    counts = (
        f'<p data-testid="preview-diff">Difference by transaction: '
        f'<b data-testid="preview-added">{diff["added"]}</b> added, '
        f'<b data-testid="preview-removed">{diff["removed"]}</b> removed, '
        f'<b data-testid="preview-changed">{diff["changed"]}</b> changed value, '
        f"{diff['unchanged']} the same.</p>"
    )
    if rule["inForce"] is None:
        return counts
    rows = []
    for kind, shown in _KINDS:
        for entry in diff[shown]:
            tx = escape(entry["transactionId"])
            rows.append(
                f'<tr data-testid="preview-{kind}-entry" data-tx="{tx}">'
                f"<td>{kind}</td><td>{tx}</td>"
                f"<td>{time_text(entry['eventTime'])}</td>"
                f"<td>{escape(entry['inForceValue'] or '–')}</td>"
                f"<td>{escape(entry['candidateValue'] or '–')}</td></tr>"
            )
    if not rows:
        return counts
    head = (
        "<tr><th>difference</th><th>transaction</th><th>event time</th>"
        "<th>value in force</th><th>candidate's value</th></tr>"
    )
    return f'{counts}<table data-testid="preview-diff-entries">{head}{"".join(rows)}</table>'


def _sample(rule: Mapping[str, Any], explanation_html: Callable[[Mapping[str, Any]], str]) -> str:
    if not rule["sample"]:
        return '<p class="muted">No alert to sample.</p>'
    out = []
    for sampled in rule["sample"]:
        alert = sampled["alert"]
        explained = (
            explanation_html(sampled["explanation"])
            if sampled["explanation"] is not None
            else f'<p class="muted">{sampled["windowEvents"]} events in the window (too many '
            "to recount here)</p>"
        )
        out.append(
            f'<div data-testid="preview-sample" data-tx="{escape(alert["transactionId"])}">'
            f"<p><b>{escape(alert['transactionId'])}</b> at {time_text(alert['eventTime'])}, "
            f"key <code>{escape(key_text(alert['key']))}</code>: "
            f"{escape(str(alert['aggregatorFunctionType']))} "
            f"{escape(str(alert['aggregateValue']))} {escape(str(alert['limitOperatorType']))} "
            f"{escape(str(alert['limit']))}, window {time_text(alert['windowStart'])} … "
            f"{time_text(alert['windowEnd'])}</p>{explained}</div>"
        )
    return "".join(out)


def _rule(rule: Mapping[str, Any], explanation_html: Callable[[Mapping[str, Any]], str]) -> str:
    rule_id = rule["rule"]["ruleId"]
    base = rule["inForce"]
    against = (
        '<span class="muted">no version in force: every alert is added</span>'
        if base is None
        else f"v{base['version']} in force ({escape(str(base['ruleState']))}): "
        f'<b data-testid="preview-in-force-alerts">{rule["inForceAlerts"]}</b> alerts'
    )
    return (
        f'<div class="preview-rule" data-testid="preview-rule-{rule_id}" '
        f'data-alerts="{rule["alerts"]}" data-in-force-alerts="{rule["inForceAlerts"]}">'
        f"<h3>ruleId {rule_id} (unsaved) {escape(rule['summary'])}</h3>"
        f'<p><b data-testid="preview-alerts">{rule["alerts"]}</b> alerts; {against}</p>'
        f"{_per_hour(rule, base is not None)}{_diff(rule)}"
        f"<h4>Sample of its alerts, with their explanations</h4>"
        f"{_sample(rule, explanation_html)}</div>"
    )


def _seconds(preview: Mapping[str, Any]) -> str:
    steps = ", ".join(f"{escape(k)} {v:.1f} s" for k, v in preview["stepSeconds"].items())
    return f"{preview['seconds']:.1f} s" + (f" ({steps})" if steps else "")


def preview_section(
    preview: Mapping[str, Any] | None,
    error: str | None,
    explanation_html: Callable[[Mapping[str, Any]], str],
) -> str:
    """The preview (``Preview.to_json()``), or why there is none; empty when none was
    asked for. ``explanation_html`` renders a sample's explanation as the page renders an
    alert's."""
    if error:
        return (
            '<h2 id="preview">Preview</h2>'
            f'<p class="bad" data-testid="preview-error">{escape(error)}</p>'
        )
    if preview is None:
        return ""
    span = preview["span"]
    skipped = "".join(f'<p class="muted">skipped: {escape(s)}</p>' for s in preview["skipped"])
    rules: Sequence[Mapping[str, Any]] = preview["rules"]
    return (
        '<h2 id="preview">Preview (nothing saved)</h2>'
        f'<p data-testid="preview-span">The last {preview["hours"]:g} h of accepted events: '
        f"eventTime in ({time_text(span['start'])}, {time_text(span['end'])}], anchored on "
        f"the newest eventTime in the events table; {preview['eventsInSpan']} events decided, "
        f"{preview['eventsRead']} read (history for the widest window), with the backtest's "
        f'engine, in <span data-testid="preview-seconds">{_seconds(preview)}</span>.</p>'
        f"{skipped}{''.join(_rule(r, explanation_html) for r in rules)}"
    )
