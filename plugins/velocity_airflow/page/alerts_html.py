"""The Velocity page's alerts: the filter form, the table (one row per alert, with its rule
version and what the rule checks, its key as ``payerId=p-4041, beneficiaryId=2034``, when
it was decided ("3 min ago", the UTC time in its title) and its event time in UTC, its
explanation link and review cell), and paging links (pure HTML from plain data;
everything shown is escaped).

Live: the newest page tells the page's live feed (``/api/page/live``) the alert stream's
position when it was drawn; the feed counts the alerts published since that pass the
filter, and the page says so ("12 new alerts — show"). The rows are drawn again only on
request (the newest page, its size at most): a row never moves under the analyst's hand.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any
from urllib.parse import urlencode

from velocity.analyst.alert_search import FILTER_FIELDS, AlertFilter, Cursor
from velocity.analyst.reviews import Review
from velocity.domain.alerts import AlertKind
from velocity.domain.rules import Rule, rule_summary
from velocity_airflow.page import review_html
from velocity_airflow.page.values_html import hidden_inputs, key_html, time_ago, time_text

__all__ = ["AlertsView", "alert_row", "alert_rows", "alerts_section", "time_text"]

STYLE = """
form.filter input { font-size: .85rem; } form.filter label { margin-right: .5rem; }
.rule-text { color: #718096; font-size: .8rem; display: block; }
tr.fresh { animation: fresh 3s ease-out; }
@keyframes fresh { from { background: #fefcbf; } to { background: transparent; } }
.paging a { margin-right: 1rem; }
.badge { font-size: .7rem; padding: 0 .3rem; border-radius: 3px; margin-left: .25rem; }
.badge.shadow { background: #e9d8fd; color: #553c9a; }
"""


@dataclass
class AlertsView:
    """What the alerts section shows, besides the alerts themselves."""

    base: str  # the app's URL prefix
    can_edit: bool
    query: AlertFilter = field(default_factory=AlertFilter)
    # Every version of every rule, by (ruleId, version): the rule beside each alert.
    rule_versions: Mapping[tuple[int, int], Rule] = field(default_factory=dict)
    limit: int | None = None  # a page size asked for in the URL (kept by the links)
    before: Cursor | None = None  # this page lists the alerts below this boundary
    older: Cursor | None = None  # the next page's boundary; None: this is the last page
    live_after: str | None = None  # the alert stream's position when drawn; None: not live
    filter_error: str | None = None
    # The page's other URL parameters (the queue's filter, …): every link and form keeps them.
    kept: Mapping[str, str] = field(default_factory=dict)
    now_ms: int | None = None  # when drawn: decision times read "3 min ago" (None: as UTC)
    csrf: str = ""  # the page's token, carried by each review form

    def link(self, **extra: str) -> str:
        """The page's URL with this filter (and page size), the page's other parameters
        and ``extra`` parameters."""
        params = {k: v for k, v in self.kept.items() if k not in _OWN}
        params.update(self.query.query())
        if self.limit is not None:
            params["limit"] = str(self.limit)
        params.update(extra)
        return f"{self.base}/?{urlencode(params)}" if params else f"{self.base}/"


# The parameters of the alerts section (its filter, page size and boundary, an explanation).
_OWN = (*FILTER_FIELDS, "limit", "before", "alert")


def _rule_cell(alert: Mapping[str, Any], view: AlertsView) -> str:
    rule_id, version = alert.get("ruleId"), alert.get("ruleVersion")
    rule = view.rule_versions.get((rule_id, version))  # type: ignore[arg-type]
    text = rule_summary(rule) if rule is not None else "(version not in the rules table)"
    return (
        f'<td data-testid="alert-rule">{escape(str(rule_id))} '
        f'<span data-testid="alert-version">v{escape(str(version))}</span>'
        f'<span class="rule-text">{escape(text)}</span></td>'
    )


def _shadow_badge(alert: Mapping[str, Any]) -> str:
    """The mark of a SHADOW candidate's alert; nothing for a rule in force's."""
    if not alert.get("shadow"):
        return ""
    return (
        ' <span class="badge shadow" data-testid="shadow-badge" title="a SHADOW candidate&#39;s '
        'alert: in the alerts table, not on the alert stream or topic">shadow</span>'
    )


def alert_row(
    alert: Mapping[str, Any], view: AlertsView, review: Review | None, fresh: bool = False
) -> str:
    """One alert's row: decided, kind (a SHADOW candidate's marked ``shadow``), rule version
    and what it checks, key, aggregate, transaction, event time, explain link, review cell."""
    alert_id = str(alert["alertId"])
    rule = view.rule_versions.get((alert.get("ruleId"), alert.get("ruleVersion")))  # type: ignore[arg-type]
    order = rule.grouping_keys if rule is not None else ()
    key = alert.get("key")
    shown_key = key_html(key, order) if isinstance(key, Mapping) else escape(str(key))
    decided = (
        time_text(alert.get("decisionTime"))
        if view.now_ms is None
        else time_ago(alert.get("decisionTime"), view.now_ms)
    )
    explain = ""
    if alert.get("kind") != AlertKind.RETRACTION:
        at = {"before": view.before.text()} if view.before is not None else {}
        link = view.link(alert=alert_id, **at)
        explain = f'<a href="{escape(link)}#explanation">explain</a>'
    cursor = Cursor.of(alert).text() if "decisionTime" in alert else ""
    review_cell = review_html.review_cell(alert, review, view.can_edit, view.base, view.csrf)
    return (
        f'<tr data-testid="alert-row"{" class=fresh" if fresh else ""} '
        f'data-alert-id="{escape(alert_id)}" data-cursor="{escape(cursor)}" '
        f'data-rule="{escape(str(alert["ruleId"]))}" '
        f'data-kind="{escape(str(alert.get("kind")))}" '
        f'data-tx="{escape(str(alert["transactionId"]))}"'
        f"{' data-shadow=1' if alert.get('shadow') else ''}>"
        f"<td>{decided}</td>"
        f"<td>{escape(str(alert.get('kind')))}{_shadow_badge(alert)}</td>{_rule_cell(alert, view)}"
        f'<td data-testid="alert-key">{shown_key}</td>'
        f"<td>{escape(str(alert['aggregateValue']))} {escape(str(alert['limitOperatorType']))} "
        f"{escape(str(alert['limit']))}</td><td>{escape(str(alert['transactionId']))}</td>"
        f"<td>{time_text(alert.get('eventTime'))}</td><td>{explain}</td>"
        f"<td>{review_cell}</td></tr>"
    )


def _filter_form(view: AlertsView) -> str:
    text = view.query.text
    rule_ids = sorted({rule_id for rule_id, _ in view.rule_versions})
    rules = ['<option value="">every rule</option>'] + [
        f'<option value="{r}"{" selected" if text.get("rule") == str(r) else ""}>ruleId {r}'
        "</option>"
        for r in rule_ids
    ]
    kinds = ['<option value="">every kind</option>'] + [
        f'<option value="{k.value}"'
        f"{' selected' if text.get('kind', '').upper() == k.value else ''}>{k.value}</option>"
        for k in AlertKind
    ]

    def box(name: str, label: str, size: int, placeholder: str) -> str:
        return (
            f'<label>{label} <input name="{name}" size="{size}" placeholder="{placeholder}" '
            f'value="{escape(text.get(name, ""))}" data-testid="filter-{name}"></label>'
        )

    kept = f'<input type="hidden" name="limit" value="{view.limit}">' if view.limit else ""
    kept += hidden_inputs(view.kept, _OWN)
    clear = {k: v for k, v in view.kept.items() if k not in _OWN}
    clear_url = f"{view.base}/?{urlencode(clear)}" if clear else f"{view.base}/"
    return (
        f'<form class="filter" method="get" action="{view.base}/" data-testid="alert-filter">'
        f'<label>Rule <select name="rule" data-testid="alert-rule">{"".join(rules)}</select>'
        f'</label><label>Kind <select name="kind" data-testid="filter-kind">{"".join(kinds)}'
        "</select></label>"
        f"{box('key', 'Key', 28, 'payerId=p-4041 or a value')}"
        f"{box('tx', 'Transaction', 12, 'transactionId')}"
        f"{box('from', 'Event time from', 18, '2026-01-01 10:00 (UTC)')}"
        f"{box('to', 'to', 18, '2026-01-01 11:00 (UTC)')}{kept}"
        '<button type="submit" data-testid="filter-submit">Show</button> '
        f'<a href="{escape(clear_url)}" data-testid="filter-clear">clear</a></form>'
    )


def alerts_section(
    alerts: Sequence[Mapping[str, Any]],
    view: AlertsView,
    reviews: Mapping[str, Review],
    error: str | None,
) -> str:
    """The filter form, then the table of ``alerts`` (newest first) with its paging links;
    the newest page (no boundary) is live: the page's feed says how many alerts came since
    (``data-after``: the alert stream's position when drawn), and ``data-rows`` draws the
    newest rows again on request."""
    form = _filter_form(view)
    if view.filter_error:
        return form + f'<p class="bad" data-testid="filter-error">{escape(view.filter_error)}</p>'
    problem = f'<p class="bad">{escape(error)}</p>' if error else ""
    where = (
        f"older than {time_text(view.before.decision_time)}"
        if view.before is not None
        else "newest first"
    )
    condition = " matching the filter" if not view.query.empty else ""
    caption = f'<p class="muted">Alerts{condition}, {where}, by decision time (UTC).'
    live = notice = ""
    if view.before is None and view.live_after is not None:
        params = {**view.query.query(), **({"limit": str(view.limit)} if view.limit else {})}
        rows_url = f"{view.base}/alerts/rows?{urlencode(params)}"
        live = f' data-after="{escape(view.live_after)}" data-rows="{escape(rows_url)}"'
        caption += ' <span data-testid="live-status">live: connecting…</span>'
        notice = (
            '<p class="notice" data-testid="alerts-notice" hidden>'
            '<span data-testid="alerts-notice-text"></span> — '
            '<button type="button" data-testid="alerts-show">show</button></p>'
        )
    elif view.before is not None:
        caption += " Live updates show on the newest page."
    caption += "</p>"
    none = (
        '<p class="muted" data-testid="no-alerts">No alerts.</p>'
        if not alerts
        else '<p class="muted" data-testid="no-alerts" hidden>No alerts.</p>'
    )
    head = (
        "<thead><tr><th>decided</th><th>kind</th><th>rule</th><th>key</th><th>aggregate</th>"
        "<th>transaction</th><th>event time</th><th></th><th>review</th></tr></thead>"
    )
    rows = alert_rows(alerts, view, reviews)
    table = f'<table data-testid="alerts"{live}>{head}<tbody>{rows}</tbody></table>'
    links = []
    if view.before is not None:
        links.append(f'<a href="{escape(view.link())}" data-testid="newest-alerts">newest</a>')
    if view.older is not None:
        older = view.link(before=view.older.text())
        links.append(f'<a href="{escape(older)}" data-testid="older-alerts">older alerts →</a>')
    paging = f'<p class="paging">{"".join(links)}</p>' if links else ""
    return f"{form}{problem}{caption}{notice}{none}{table}{paging}"


def alert_rows(
    alerts: Sequence[Mapping[str, Any]], view: AlertsView, reviews: Mapping[str, Review]
) -> str:
    """The rows of ``alerts`` alone (the live page draws them again on request)."""
    return "".join(alert_row(a, view, reviews.get(str(a["alertId"]))) for a in alerts)
