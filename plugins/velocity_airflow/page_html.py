"""The Velocity page in the Airflow UI, rendered from plain data (pure: no Airflow, no I/O).

``velocity_airflow.page`` gathers the data (rules, alerts, health, lookups) and hands it to
``render_page``; everything shown is escaped here. Forms post back to the page's own app;
the Airflow UI shows it in a sandboxed iframe that blocks ``confirm()``, so a delete is
confirmed by a second button inside a ``<details>`` instead.

A rule change in flight is shown: a form that changes something carries the words for it
(``data-progress``); a few lines of script show them at the top, disable the change
buttons and post the form with ``fetch``, and the page that comes back, with the
outcome, replaces this one. Without script the forms post as plain forms.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

from velocity.alert_search import PAGE_SIZE, AlertFilter, Cursor, duration_text, key_text
from velocity.backfill_runs import BackfillRunView
from velocity.reviews import Review, VersionPrecision
from velocity.rules import Rule, RuleState, rule_summary
from velocity.shadow_compare import ShadowComparison
from velocity_airflow import alerts_html, backfill_html, preview_html, review_html, shadow_html

# How many alerts a page lists, newest first.
ALERTS_SHOWN = PAGE_SIZE

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1rem 1.5rem; color: #1a202c; }
h1 { font-size: 1.4rem; margin: 0 0 .5rem; } h2 { font-size: 1.1rem; margin: 1.5rem 0 .5rem; }
table { border-collapse: collapse; width: 100%; font-size: .9rem; }
th, td { text-align: left; padding: .3rem .5rem; border-bottom: 1px solid #e2e8f0; }
td { vertical-align: top; }
th { background: #f7fafc; } code, pre { font-size: .85rem; }
.ok { color: #276749; } .bad { color: #c53030; } .muted { color: #718096; }
.flash { padding: .5rem .75rem; border-radius: 4px; margin: .5rem 0; white-space: pre-wrap; }
.flash.ok { background: #f0fff4; border: 1px solid #9ae6b4; }
.flash.bad { background: #fff5f5; border: 1px solid #feb2b2; }
.flash.busy { background: #ebf8ff; border: 1px solid #90cdf4; }
.flash.busy::before { content: ""; display: inline-block; width: .8em; height: .8em;
  margin-right: .5em; border: 2px solid #3182ce; border-right-color: transparent;
  border-radius: 50%; animation: spin .8s linear infinite; vertical-align: -.1em; }
@keyframes spin { to { transform: rotate(360deg); } }
.state-ACTIVE { color: #276749; font-weight: 600; }
.state-PAUSE { color: #b7791f; font-weight: 600; }
form.inline { display: inline; } button { cursor: pointer; margin-right: .25rem; }
textarea { width: 100%; font-family: monospace; }
.health { display: flex; gap: 1.5rem; flex-wrap: wrap; }
"""


# A change in flight: the words of the form (or button) that posted it at the top, the
# change buttons disabled, the post sent by fetch() so the page stays; the page that comes
# back (the outcome, or the form again with what is wrong) replaces this one. Should
# fetch fail, the form is posted as a plain form.
_PROGRESS_SCRIPT = """
document.addEventListener("submit", function (event) {
  var form = event.target, submitter = event.submitter;
  var source = submitter && submitter.dataset.progress ? submitter : form;
  var words = source.dataset && source.dataset.progress;
  if (!words || form.dataset.plain) { return; }
  event.preventDefault();
  var body = new FormData(form, submitter);
  // A button may post the form elsewhere (Preview: a read, not a change).
  var action = submitter && submitter.hasAttribute("formaction") ? submitter.formAction
    : form.action;
  if (window.velocityLive) { window.velocityLive.close(); }
  var shown = document.querySelector('[data-testid="flash"]');
  if (shown) { shown.hidden = true; }
  var busy = document.getElementById("change-progress");
  busy.textContent = words;
  busy.hidden = false;
  document.querySelectorAll("form[data-progress] button").forEach(function (button) {
    button.disabled = true;
  });
  fetch(action, {method: "POST", body: body, credentials: "same-origin"})
    .then(function (reply) {
      return reply.text().then(function (html) {
        document.open();
        document.write(html);
        document.close();
        if (reply.redirected) { history.replaceState(null, "", reply.url); }
      });
    })
    .catch(function () {
      form.dataset.plain = "1";
      form.action = action;
      if (submitter && submitter.name) {
        var kept = document.createElement("input");
        kept.type = "hidden"; kept.name = submitter.name; kept.value = submitter.value;
        form.appendChild(kept);
      }
      form.submit();
    });
});
"""

_VERBS = {"pause": "Pausing", "activate": "Activating", "delete": "Deleting"}


@dataclass(frozen=True)
class Flash:
    """The outcome of the last action, shown once at the top."""

    ok: bool
    text: str


@dataclass
class PageData:
    """Everything the page shows; a section whose data could not be read carries its error."""

    user: str
    can_edit: bool
    base: str  # the app's URL prefix, e.g. /velocity
    health: Mapping[str, Any] | None = None
    health_error: str | None = None
    rules: Sequence[Rule] = ()  # the rules in force (ACTIVE, PAUSE), one per ruleId
    rules_error: str | None = None
    # Each SHADOW candidate beside its rule in force, by ruleId.
    shadow: Sequence[ShadowComparison] | None = None
    shadow_error: str | None = None
    alerts: Sequence[Mapping[str, Any]] = ()
    alerts_error: str | None = None
    alert_filter: AlertFilter = field(default_factory=AlertFilter)
    filter_error: str | None = None  # the filter could not be read: no alerts listed
    alert_limit: int | None = None  # a page size asked for in the URL
    alerts_before: Cursor | None = None  # this page lists the alerts below it
    alerts_older: Cursor | None = None  # the next page's boundary, None at the last
    live_after: str | None = None  # the alert stream's position when read; None: not live
    # Every version of every rule, by (ruleId, version): the rule beside each alert.
    rule_versions: Mapping[tuple[int, int], Rule] = field(default_factory=dict)
    explanation: Mapping[str, Any] | None = None
    explanation_error: str | None = None
    lookup_form: Mapping[str, str] = field(default_factory=dict)
    lookup: Mapping[str, Any] | None = None
    lookup_error: str | None = None
    rule_text: str = ""
    flash: Flash | None = None
    reviews: Mapping[str, Review] | None = None  # the latest review of each reviewed alert
    reviews_error: str | None = None
    precision: Sequence[VersionPrecision] | None = None
    precision_error: str | None = None
    backfills: Sequence[BackfillRunView] | None = None  # newest first
    backfills_error: str | None = None
    # What the rules of the add-rules form would have fired (``Preview.to_json()``).
    preview: Mapping[str, Any] | None = None
    preview_error: str | None = None
    preview_hours: str = "1"


_time = alerts_html.time_text


def _error(text: str | None) -> str:
    return f'<p class="bad">{escape(text)}</p>' if text else ""


def health_html(h: Mapping[str, Any] | None, error: str | None) -> str:
    """The stream's verdict and figures (durations for people: "42 s", "5 min 8 s")."""
    if h is None:
        return _error(error or "no stream status")
    verdict_class = "ok" if h.get("healthy") else "bad"
    figures = [
        ("state", h.get("state")),
        ("batch", h.get("batch")),
        ("heartbeat age", duration_text(h.get("heartbeatAgeMs"))),
        ("lag", duration_text(h.get("lagMs"))),
        ("last batch", duration_text(h.get("lastBatchDurationMs"))),
        ("rows/s", h.get("processedRowsPerSecond")),
    ]
    shown = "".join(
        f"<span>{escape(name)}: <b>{escape(str(value))}</b></span>"
        for name, value in figures
        if value is not None
    )
    return (
        f'<p data-testid="stream-verdict" class="{verdict_class}">'
        f"<b>{escape(str(h.get('verdict')))}</b> — {escape(str(h.get('reason', '')))}</p>"
        f'<div class="health" data-testid="stream-figures">{shown}</div>'
    )


def _rule_actions(rule: Rule, base: str) -> str:
    def button(action: str, label: str) -> str:
        progress = f"{_VERBS[action]} ruleId {rule.rule_id}…"
        return (
            f'<form class="inline" method="post" action="{base}/rules/{rule.rule_id}/{action}" '
            f'data-progress="{escape(progress)}">'
            f'<button type="submit" data-testid="{action}-{rule.rule_id}">{label}</button></form>'
        )

    toggle = (
        button("pause", "Pause")
        if rule.state is RuleState.ACTIVE
        else button("activate", "Activate")
    )
    confirm = button("delete", f"Delete ruleId {rule.rule_id}")
    delete = f'<details class="inline"><summary>Delete…</summary>{confirm}</details>'
    return toggle + delete


def _rules(data: PageData) -> str:
    if data.rules_error:
        return _error(data.rules_error)
    if not data.rules:
        return '<p class="muted">No rules in force.</p>'
    head = "<tr><th>ruleId</th><th>version</th><th>state</th><th>rule</th>"
    head += "<th>actions</th></tr>" if data.can_edit else "</tr>"
    rows = []
    candidates = {c.candidate.rule_id: c.candidate for c in data.shadow or ()}
    for rule in data.rules:
        actions = f"<td>{_rule_actions(rule, data.base)}</td>" if data.can_edit else ""
        candidate = candidates.get(rule.rule_id)
        beside = (
            f' <a href="#shadow" class="muted" data-testid="candidate-of-{rule.rule_id}">'
            f"candidate v{candidate.version} in shadow</a>"
            if candidate is not None
            else ""
        )
        rows.append(
            f'<tr data-testid="rule-{rule.rule_id}"><td>{rule.rule_id}</td><td>{rule.version}</td>'
            f'<td class="state-{rule.state.value}">{rule.state.value}</td>'
            f"<td>{escape(rule_summary(rule))}{beside}</td>{actions}</tr>"
        )
    return f'<table data-testid="rules">{head}{"".join(rows)}</table>'


def _preview_controls(data: PageData) -> str:
    """The hours field and the Preview button: the form posted to the preview (a read)."""
    return (
        f'<label>last <input name="hours" size="4" value="{escape(data.preview_hours)}" '
        'data-testid="preview-hours"> hours</label> '
        f'<button type="submit" name="intent" value="preview" formaction="{data.base}/preview" '
        'data-testid="preview-rule" data-progress="Previewing the rules over the events…">'
        "Preview</button>"
    )


_PREVIEW_WORDS = (
    "<b>Preview</b> shows, saving nothing, what the rules would have fired over the last "
    "hours of the live events (the backtest's engine), beside the versions in force, as "
    "<code>velocity rules preview</code>."
)


def _add_rule(data: PageData) -> str:
    if not data.can_edit:
        # A preview writes nothing: a viewer may try a rule, not apply it.
        return (
            '<p class="muted">Your role may read the rules but not change them.</p>'
            f'<form method="post" action="{data.base}/preview" '
            'data-progress="Previewing the rules over the events…">'
            f"<p>{_PREVIEW_WORDS}</p>"
            f'<textarea name="rules_json" rows="6" data-testid="rule-json">'
            f"{escape(data.rule_text)}</textarea><br>{_preview_controls(data)}</form>"
        )
    return (
        f'<form method="post" action="{data.base}/rules" data-progress="Applying the rules…">'
        "<p>A rule or an array of rules as JSON (SPEC §2), applied all or nothing as new "
        "versions, exactly as <code>velocity rules apply</code>; or added as SHADOW "
        "candidates beside the rules in force (decided like ACTIVE rules, their alerts kept "
        "from the alert stream and topic), as <code>velocity rules shadow</code>.</p>"
        f'<textarea name="rules_json" rows="6" data-testid="rule-json">{escape(data.rule_text)}'
        "</textarea><br>"
        '<button type="submit" name="intent" value="validate" data-testid="validate-rule" '
        'data-progress="Validating the rules…">'
        "Validate</button>"
        '<button type="submit" name="intent" value="apply" data-testid="apply-rule">Apply</button>'
        '<button type="submit" name="intent" value="shadow" data-testid="shadow-rule" '
        'data-progress="Adding the shadow candidates…">Shadow</button>'
        f' {_preview_controls(data)}<p class="muted">{_PREVIEW_WORDS}</p>'
        "</form>"
    )


def _alerts(data: PageData) -> str:
    view = alerts_html.AlertsView(
        base=data.base,
        can_edit=data.can_edit,
        query=data.alert_filter,
        rule_versions=data.rule_versions,
        limit=data.alert_limit,
        before=data.alerts_before,
        older=data.alerts_older,
        live_after=data.live_after,
        filter_error=data.filter_error,
    )
    error = "; ".join(e for e in (data.alerts_error, data.reviews_error) if e) or None
    return alerts_html.alerts_section(data.alerts, view, data.reviews or {}, error)


def explanation_body(e: Mapping[str, Any]) -> str:
    """Why an alert fired (an explanation's JSON): the verdict, the arithmetic and the
    events of its window."""
    rows = "".join(
        f"<tr><td>{_time(ev['eventTime'])}</td><td>{escape(ev['transactionId'])}</td>"
        f"<td>{escape(ev['value'] or '')}</td></tr>"
        for ev in e["events"]
    )
    more = e["eventCount"] - len(e["events"])
    more_text = f'<p class="muted">… and {more} more events</p>' if more > 0 else ""
    verdict_class = "ok" if e["agrees"] else "bad"
    notification = e.get("notification")
    cooldown = (
        f'<p data-testid="explanation-notification">{escape(notification)}</p>'
        if notification
        else ""
    )
    return (
        f'<p data-testid="explanation-verdict" class="{verdict_class}">{escape(e["verdict"])}</p>'
        f"{cooldown}"
        f'<p data-testid="explanation-arithmetic"><code>{escape(e["arithmetic"])}</code></p>'
        f'<table data-testid="explanation-events"><tr><th>event time</th><th>transaction</th>'
        f"<th>value</th></tr>{rows}</table>{more_text}"
    )


def _explanation(data: PageData) -> str:
    if data.explanation_error:
        return f'<h2 id="explanation">Explanation</h2>{_error(data.explanation_error)}'
    if data.explanation is None:
        return ""
    alert = data.explanation["alert"]
    return (
        f'<h2 id="explanation">Explanation of {escape(alert["kind"])} '
        f"<code>{escape(alert['alertId'])}</code></h2>"
        f"<p>ruleId {escape(str(alert['ruleId']))} v{escape(str(alert['ruleVersion']))}, key "
        f"<code>{escape(key_text(alert['key']))}</code>, window {_time(alert['windowStart'])} "
        f"… {_time(alert['windowEnd'])}</p>{explanation_body(data.explanation)}"
    )


def _lookup(data: PageData) -> str:
    form = data.lookup_form
    result = ""
    if data.lookup_error:
        result = _error(data.lookup_error)
    elif data.lookup is not None:
        shown = escape(json.dumps(data.lookup, indent=1))
        result = f'<pre data-testid="lookup-result">{shown}</pre>'
    return (
        f'<form method="get" action="{data.base}/" data-testid="lookup">'
        f'ruleId <input name="lookup_rule" size="5" value="{escape(form.get("lookup_rule", ""))}"> '
        f'key <input name="lookup_key" size="40" placeholder="payerId=25,beneficiaryId=12" '
        f'value="{escape(form.get("lookup_key", ""))}"> '
        '<button type="submit">Look up</button></form>'
        f"{result}"
    )


def _shadow(data: PageData) -> set[tuple[int, int]]:
    """The (ruleId, version)s of SHADOW candidates, standing or not."""
    return {key for key, rule in data.rule_versions.items() if rule.state is RuleState.SHADOW}


def render_page(data: PageData) -> str:
    flash = ""
    if data.flash is not None:
        kind = "ok" if data.flash.ok else "bad"
        flash = f'<div class="flash {kind}" data-testid="flash">{escape(data.flash.text)}</div>'
    role = "may change rules" if data.can_edit else "read-only"
    # Every role may preview: the words of a preview in flight show here too.
    progress = (
        '<div class="flash busy" id="change-progress" data-testid="change-progress" '
        'role="status" aria-live="polite" hidden></div>'
    )
    return (
        '<!doctype html><html><head><meta charset="utf-8"><title>Velocity</title>'
        f"<style>{_STYLE}{review_html.STYLE}{alerts_html.STYLE}{shadow_html.STYLE}{preview_html.STYLE}</style>"
        f"<script>{_PROGRESS_SCRIPT}</script></head><body>"
        f'<h1>Velocity</h1><p class="muted">Signed in as {escape(data.user)} ({role}).</p>'
        f"{progress}{flash}"
        # An explanation is what the analyst just asked for: first.
        f"{_explanation(data)}"
        # So is a preview.
        f"{preview_html.preview_section(data.preview, data.preview_error, explanation_body)}"
        f'<h2>Stream</h2><div id="health">{health_html(data.health, data.health_error)}</div>'
        f"<h2>Rules in force</h2>{_rules(data)}"
        '<h2 id="shadow">Shadow rules</h2>'
        f"{shadow_html.shadow_section(data.shadow, data.shadow_error, data.can_edit, data.base)}"
        "<h2>Alerts and precision by rule version</h2>"
        f"{review_html.precision_table(data.precision, data.precision_error, _shadow(data))}"
        f"<h2>Add or change rules</h2>{_add_rule(data)}"
        f'<h2 id="backfills">Backfill runs</h2>'
        f"{backfill_html.backfill_table(data.backfills, data.backfills_error)}"
        f"<h2>Window lookup</h2>{_lookup(data)}"
        f'<h2 id="alerts">Alerts</h2>{_alerts(data)}'
        "</body></html>"
    )
