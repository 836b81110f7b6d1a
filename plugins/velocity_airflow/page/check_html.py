"""The "Try a payment" page, rendered from plain data (pure: no Airflow, no I/O; everything
shown is escaped): the form (SPEC §1's fields, a bad one named beside it), then the check's
decision, how fresh its state is, and a row for every rule evaluated with its value, limit,
window and the working in words."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from html import escape
from typing import Any

from velocity.domain.schema import EVENT_FIELDS, FIELDS_BY_NAME
from velocity_airflow.page.home_html import document
from velocity_airflow.page.values_html import key_html, number_text, time_ago, time_text

# The form's fields: SPEC §1's, in its order.
FIELDS = tuple(spec.name for spec in EVENT_FIELDS)
_OPTIONAL = frozenset(spec.name for spec in EVENT_FIELDS if not spec.required)
_PAYMENT_TYPES = tuple(sorted(FIELDS_BY_NAME["paymentType"].allowed))
_PLACEHOLDERS = {
    "eventTime": "now; or epoch ms, or 2026-01-01 10:05 (UTC)",
    "paymentAmount": "120.50",
}
_DECISION_WORDS = {
    "BLOCK": "A rule that fires asks to block the payment",
    "REVIEW": "A rule that fires asks to review the payment before it is accepted",
    "ALLOW": "No rule that fires asks to block or review it",
}

STYLE = """
form.check th { text-align: right; background: none; border: none; font-weight: 500; }
form.check td { border: none; } form.check { max-width: 48rem; }
.field-error { color: #c53030; font-size: .85rem; }
.decision { font-size: 1.8rem; font-weight: 700; margin: .8rem 0 .2rem; }
.decision-BLOCK { color: #c53030; } .decision-REVIEW { color: #b7791f; }
.decision-ALLOW { color: #276749; }
tr.fired td { background: #fffaf0; }
"""


@dataclass
class CheckView:
    """What the page shows: the form as typed, and what the check said, if asked."""

    base: str
    user: str
    now_ms: int
    form: Mapping[str, str]
    field_errors: dict[str, str] = field(default_factory=dict)
    banner: str | None = None  # no check possible (no rules in Redis, Redis not reached)
    answer: Mapping[str, Any] | None = None  # check_payment's, each rule with its working
    event_time: int | None = None  # the eventTime checked (a blank one: now)
    csrf: str = ""  # the page's token (its script's; the check's form is a GET)


def render_check(view: CheckView) -> str:
    banner = (
        f'<div class="flash bad" data-testid="check-unavailable">{escape(view.banner)}</div>'
        if view.banner
        else ""
    )
    body = (
        f"<style>{STYLE}</style>"
        f'<p class="nav"><a href="{view.base}/" data-testid="back-to-page">← Velocity</a></p>'
        "<h1>Try a payment</h1>"
        '<p class="muted">Which rules in force would this payment fire now? The check '
        "service and <code>velocity check</code> give the same answer, from what the stream "
        "has committed to Redis. Nothing is recorded: the payment counts only when it "
        "reaches the stream.</p>"
        f"{banner}{_form(view)}{_result(view)}"
    )
    return document("Velocity: try a payment", body, csrf=view.csrf)


def _form(view: CheckView) -> str:
    errors = dict(view.field_errors)
    rows = "".join(
        _field_row(name, view.form.get(name, ""), errors.pop(name, None)) for name in FIELDS
    )
    # A fault of the payment as a whole (or of a field the form has no input for).
    whole = "".join(
        f'<div class="flash bad" data-testid="check-error">{escape(name)}: {escape(reason)}</div>'
        for name, reason in errors.items()
    )
    return (
        f'{whole}<form class="check" method="get" action="{view.base}/check" '
        f'data-testid="check-form"><table>{rows}</table>'
        '<button type="submit" name="check" value="1" data-testid="check-submit">Check</button>'
        "</form>"
    )


def _field_row(name: str, value: str, error: str | None) -> str:
    if name == "paymentType":
        options = "".join(
            f"<option{' selected' if value == kind else ''}>{kind}</option>"
            for kind in _PAYMENT_TYPES
        )
        control = f'<select name="{name}" id="f-{name}">{options}</select>'
    else:
        placeholder = _PLACEHOLDERS.get(name, "optional" if name in _OPTIONAL else "")
        shown = f' placeholder="{escape(placeholder)}"' if placeholder else ""
        control = f'<input name="{name}" id="f-{name}" size="40" value="{escape(value)}"{shown}>'
    said = ""
    if error:
        # Shown beside the field: "'abc' is not a decimal number", not "paymentAmount 'abc' …".
        reason = error.removeprefix(f"{name} ")
        said = (
            f' <span class="field-error" data-testid="field-error" data-field="{name}">'
            f"{escape(reason)}</span>"
        )
    return f'<tr><th><label for="f-{name}">{name}</label></th><td>{control}{said}</td></tr>'


def _result(view: CheckView) -> str:
    answer = view.answer
    if answer is None:
        return ""
    decision = str(answer["decision"])
    rules = answer["rules"]
    fired = sum(1 for r in rules if r["fired"])
    return (
        '<h2 id="decision">Decision</h2>'
        f'<p class="decision decision-{escape(decision)}" data-testid="check-decision" '
        f'data-decision="{escape(decision)}">{escape(decision)}</p>'
        f"<p>{escape(_DECISION_WORDS.get(decision, ''))}; {fired} of {len(rules)} rules "
        f"evaluated fire. Payment at {time_text(view.event_time)}.</p>"
        f"{_state_as_of(answer.get('stateAsOf') or {}, view.now_ms)}"
        f"<h2>Rules evaluated</h2>{_rules_table(rules)}"
    )


def _state_as_of(state: Mapping[str, Any], now_ms: int) -> str:
    """How fresh the state the answer rests on is (the stream's last committed batch)."""
    if state.get("batch") is None:
        text = (
            "state as of no committed micro-batch: the stream has not committed to this "
            "Redis since it was emptied or rebuilt"
        )
    else:
        text = (
            f"state as of {time_text(state.get('committedAt'))} "
            f"({time_ago(state.get('committedAt'), now_ms)}), batch {escape(str(state['batch']))}"
            f"; the newest payment it has seen is of {time_text(state.get('eventTime'))}"
        )
    return f'<p class="muted" data-testid="check-state-as-of">{text}</p>'


def _rules_table(rules: list[Mapping[str, Any]]) -> str:
    if not rules:
        return (
            '<p class="muted" data-testid="check-no-rules">No rule in force applies to this '
            "payment: no filter passes with all its grouping fields present.</p>"
        )
    head = (
        '<tr><th>rule</th><th>outcome</th><th>key</th><th class="figure">value</th>'
        "<th>limit</th><th>window (UTC)</th><th>fires</th><th>notified</th>"
        "<th>the working</th></tr>"
    )
    return f'<table data-testid="check-rules">{head}{"".join(map(_rule_row, rules))}</table>'


def _rule_row(rule: Mapping[str, Any]) -> str:
    value, key = rule.get("aggregateValue"), rule.get("key")
    shown = '<span class="muted">none</span>' if value is None else number_text(value)
    notified = "" if "notified" not in rule else ("yes" if rule["notified"] else "no (cooldown)")
    fired = bool(rule["fired"])
    outcome = escape(str(rule["outcome"]))
    marked = ' class="fired"' if fired else ""
    return (
        f'<tr data-testid="check-rule" data-rule-id="{escape(str(rule["ruleId"]))}" '
        f'data-fired="{str(fired).lower()}"{marked}>'
        f"<td>ruleId {escape(str(rule['ruleId']))} v{escape(str(rule['ruleVersion']))}</td>"
        f'<td><span class="outcome outcome-{outcome}">{outcome}</span></td>'
        f"<td>{key_html(key, tuple(key or ()))}</td>"
        f'<td class="figure" data-testid="check-value" data-value="{escape(str(value))}">'
        f"{shown}</td>"
        f'<td data-testid="check-limit"><code>{escape(str(rule["limitOperatorType"]))} '
        f"{number_text(rule['limit'])}</code></td>"
        f'<td data-testid="check-window">{time_text(rule.get("windowStart"))} … '
        f"{time_text(rule.get('windowEnd'))}</td>"
        f'<td data-testid="check-fired">{"fires" if fired else "no"}</td>'
        f'<td data-testid="check-notified">{notified}</td>'
        f'<td data-testid="check-working">{escape(str(rule.get("working", "")))}</td></tr>'
    )
