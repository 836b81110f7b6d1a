"""The Velocity page's queue of cases and a case's own page (pure HTML from plain data;
everything shown is escaped).

The queue: one compact row per case (its strongest outcome, its key, its rules as badges
with their alert counts, the sum of its payments, its first and latest alert, assignee,
status), in the order asked for (newest activity, oldest open, payments' total, alert
count, strongest outcome: the filter's choice or a column's head), filtered and paged on
the server (``velocity.analyst.case_queue``). A case's alerts: a row a payment, paged by
payment (``velocity.analyst.payment_groups``); its assignee chosen from the known users. Every link
and form keeps the page's URL parameters, so a filter, a page or the alerts' filter
survive every action. An editor selects cases to close them together, and works the
queue from the keyboard (``QUEUE_SCRIPT``): j/k move, x selects, o (or Enter) opens, c
closes as confirmed fraud, f as a false positive.

Live: the page never moves a row under the analyst's hand. The server says how many
cases changed since the page was drawn ("12 cases updated — show"), and the rows are
drawn again only on request, the page's size at most (``velocity.analyst.case_queue``'s cap).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any
from urllib.parse import quote

from velocity.analyst.case_queue import (
    CASE_FILTER_FIELDS,
    CASE_PAGE_FIELDS,
    STATUS_CHOICES,
    UNASSIGNED,
    CasePage,
    CaseQuery,
    CaseSort,
)
from velocity.analyst.cases import Case, CaseEvent, CaseEventKind, strongest
from velocity.analyst.payment_groups import PAYMENT_PAGE_FIELDS, PaymentPage, group_by_payment
from velocity.analyst.reviews import NOTE_MAX, Review, Verdict
from velocity.domain.rules import Outcome, Rule, rule_summary
from velocity_airflow.page.alerts_html import time_text
from velocity_airflow.page.values_html import (
    hidden_inputs,
    key_html,
    number_text,
    query_string,
    time_ago,
    token_input,
)

# Parameters of one view that another view's links leave out: an open explanation, the
# page of a case's alerts.
TRANSIENT = ("alert", *PAYMENT_PAGE_FIELDS)
# What the queue's filter, its orders and its pages set in the page's URL (the rest kept).
QUEUE_FIELDS = (*CASE_FILTER_FIELDS, *CASE_PAGE_FIELDS, *TRANSIENT)

STYLE = """
.badge.rule { background: #edf2f7; color: #2d3748; white-space: nowrap; }
.badge.suppressed { background: #fefcbf; color: #744210; }
.status-open { color: #c05621; font-weight: 600; }
.status-assigned { color: #2b6cb0; font-weight: 600; }
.status-closed { color: #718096; }
table.queue td { padding: .2rem .4rem; white-space: nowrap; }
table.queue td.rules { white-space: normal; }
table.queue tr.focused { outline: 2px solid #3182ce; outline-offset: -2px; background: #ebf8ff; }
.notice { background: #fffbea; border: 1px solid #f6e05e; padding: .3rem .6rem;
  border-radius: 4px; display: inline-block; margin: .3rem 0; }
.notice button { margin-left: .3rem; } .notice[hidden] { display: none; }
.keys { font-size: .8rem; } kbd { border: 1px solid #cbd5e0; border-radius: 3px;
  padding: 0 .25rem; font-size: .75rem; background: #f7fafc; }
table.facts { width: auto; } table.facts th { text-align: right; }
.alert-item { display: inline-block; margin: 0 .6rem .2rem 0; white-space: nowrap; }
"""

_VERDICT_WORDS = {
    Verdict.CONFIRMED_FRAUD: "confirmed fraud",
    Verdict.FALSE_POSITIVE: "false positive",
    Verdict.NEEDS_REVIEW: "not sure (needs review)",
}


@dataclass(frozen=True)
class Assignees:
    """Who a case may be assigned to (``names``); ``closed``: only they (the auth manager
    lists its users), else any name, these offered."""

    names: Sequence[str] = ()
    closed: bool = False


@dataclass
class QueueView:
    """What the queue section shows, besides the cases themselves."""

    base: str  # the app's URL prefix
    can_edit: bool
    user: str
    now_ms: int
    query: CaseQuery = field(default_factory=CaseQuery)
    # The page's URL parameters (the alerts' filter, the queue's, …), kept by every link.
    params: Mapping[str, str] = field(default_factory=dict)
    rule_versions: Mapping[tuple[int, int], Rule] = field(default_factory=dict)
    rule_ids: Sequence[int] = ()  # the ruleIds the filter offers
    write_behind_seconds: float = 30.0
    as_of: int = 0  # the newest case activity when drawn: "updated since" counts from it
    csrf: str = ""  # the page's token, carried by each form that posts
    assignees: Assignees = field(default_factory=Assignees)

    def link(self, path: str = "/", leave_out: Sequence[str] = TRANSIENT, **extra: str) -> str:
        """``path`` under the app with the page's parameters (less ``leave_out``) and
        ``extra``."""
        params = {k: v for k, v in self.params.items() if k not in leave_out}
        params.update(extra)
        query = query_string(params)
        return f"{self.base}{path}?{query}" if query else f"{self.base}{path}"

    def case_link(self, case_id: str) -> str:
        return self.link(f"/cases/{quote(case_id, safe='')}")

    def rule_text(self, rule_id: int) -> str:
        versions = [r for (i, _), r in self.rule_versions.items() if i == rule_id]
        if not versions:
            return f"ruleId {rule_id}"
        newest = max(versions, key=lambda r: r.version)
        return f"ruleId {rule_id}: {rule_summary(newest)}"


def back_field(params: Mapping[str, str]) -> str:
    """The hidden field by which a change's redirect comes back to this page's URL."""
    value = query_string(params, TRANSIENT)
    return f'<input type="hidden" name="back" value="{escape(value)}">'


def rule_badges(counts: Mapping[int, int], view: QueueView) -> str:
    """A case's rules, each a badge with its alert count, by ruleId."""
    return " ".join(
        f'<span class="badge rule" data-rule="{rule_id}" '
        f'title="{escape(view.rule_text(rule_id))}">{rule_id} <b>×{n}</b></span>'
        for rule_id, n in sorted(counts.items())
    )


def outcome_badge(outcome: object, test_id: str = "outcome") -> str:
    """An outcome (ALERT, REVIEW, BLOCK) as the page marks it."""
    word = escape(str(outcome))
    return f'<span class="outcome outcome-{word}" data-testid="{test_id}">{word}</span>'


def _status(case: Case) -> str:
    verdict = f" ({case.verdict.words})" if case.verdict is not None else ""
    return f'<td class="status-{case.status.value}">{case.status.value}{escape(verdict)}</td>'


def queue_row(case: Case, view: QueueView) -> str:
    """One case's row (``data-case-id``; its key links to the case's page)."""
    select = (
        f'<td><input type="checkbox" form="bulk-close" name="case_id" '
        f'value="{escape(case.case_id)}" data-testid="case-select" '
        f'aria-label="select this case"></td>'
        if view.can_edit
        else ""
    )
    assignee = escape(case.assignee) if case.assignee else '<span class="muted">—</span>'
    return (
        f'<tr data-testid="queue-row" data-case-id="{escape(case.case_id)}" '
        f'data-status="{case.status.value}" data-activity="{case.latest_activity_at}" '
        f'data-outcome="{case.outcome.value}">'
        f"{select}<td>{outcome_badge(case.outcome.value, 'case-outcome')}</td>"
        f'<td><a href="{escape(view.case_link(case.case_id))}" data-testid="case-link">'
        f"{key_html(case.key)}</a></td>"
        f'<td class="rules">{rule_badges(case.rule_counts, view)}</td>'
        f'<td class="figure" data-testid="case-amount">{number_text(case.amount)}</td>'
        f'<td class="figure">{case.alerts}</td>'
        f"<td>{time_ago(case.opened_at, view.now_ms)}</td>"
        f"<td>{time_ago(case.latest_alert_at, view.now_ms)}</td>"
        f"<td>{assignee}</td>{_status(case)}</tr>"
    )


def queue_rows(cases: Sequence[Case], view: QueueView) -> str:
    if not cases:
        width = 10 if view.can_edit else 9
        return (
            f'<tr data-testid="no-cases"><td colspan="{width}" class="muted">No cases match.'
            "</td></tr>"
        )
    return "".join(queue_row(c, view) for c in cases)


def _filter_form(view: QueueView) -> str:
    text = view.query.filter.text
    rules = ['<option value="">every rule</option>'] + [
        f'<option value="{r}"{" selected" if text.get("case_rule") == str(r) else ""}>'
        f"ruleId {r}</option>"
        for r in view.rule_ids
    ]
    chosen = text.get("case_status", "").lower()
    statuses = [
        f'<option value="{value}"{" selected" if chosen == value else ""}>'
        f"{value or 'not closed'}</option>"
        for value in STATUS_CHOICES
    ]

    chosen_outcome = text.get("case_outcome", "").upper()
    outcomes = ['<option value="">every outcome</option>'] + [
        f'<option value="{o.value}"{" selected" if chosen_outcome == o.value else ""}>'
        f"{o.value}</option>"
        for o in Outcome
    ]
    sort = view.query.sort
    sorts = "".join(
        f'<option value="{value.value}"{" selected" if sort is value else ""}>{words}</option>'
        for value, words in _SORT_WORDS.items()
    )

    def box(name: str, label: str, size: int, placeholder: str, listed: str = "") -> str:
        offered = f' list="{listed}"' if listed else ""
        return (
            f'<label>{label} <input name="{name}" size="{size}" placeholder="{placeholder}" '
            f'value="{escape(text.get(name, ""))}" data-testid="queue-{name}"{offered}></label>'
        )

    kept = hidden_inputs(view.params, QUEUE_FIELDS)
    clear = view.link(leave_out=QUEUE_FIELDS)
    mine = view.link(leave_out=QUEUE_FIELDS, case_assignee=view.user)
    in_place = f'data-in-place="{view.base}/queue"'
    return (
        f'<form class="filter" method="get" action="{view.base}/" data-testid="queue-filter" '
        f'{in_place} data-owns="{" ".join(QUEUE_FIELDS)}">{kept}'
        f'<label>Rule <select name="case_rule" data-testid="queue-case_rule">{"".join(rules)}'
        "</select></label>"
        f'<label>Status <select name="case_status" data-testid="queue-case_status">'
        f"{''.join(statuses)}</select></label>"
        f'<label>Outcome <select name="case_outcome" data-testid="queue-case_outcome">'
        f"{''.join(outcomes)}</select></label>"
        f"{box('case_assignee', 'Assignee', 12, f'a name, or {UNASSIGNED}', 'queue-users')}"
        f"{_datalist('queue-users', (*view.assignees.names, UNASSIGNED))}"
        f"{box('case_key', 'Key', 24, 'payerId=p-4041 or a value')}"
        f'<label>Order <select name="case_sort" data-testid="queue-case_sort">{sorts}'
        "</select></label>"
        '<button type="submit" data-testid="queue-filter-submit">Show</button> '
        f'<a href="{escape(clear)}" data-testid="queue-filter-clear" {in_place}>clear</a> · '
        f'<a href="{escape(mine)}" data-testid="queue-mine" {in_place}>mine</a></form>'
    )


def _datalist(list_id: str, names: Sequence[str]) -> str:
    options = "".join(f'<option value="{escape(n)}"></option>' for n in names)
    return f'<datalist id="{list_id}">{options}</datalist>'


def assignee_field(view: QueueView, current: str | None) -> str:
    """The assign form's field: a choice of the known users when the list is closed (the
    current assignee, else the signed-in user, chosen), else a name with them offered."""
    chosen = current or view.user
    known = view.assignees
    if known.closed:
        names = list(known.names) + ([chosen] if chosen not in known.names else [])
        options = "".join(
            f'<option value="{escape(n)}"{" selected" if n == chosen else ""}>{escape(n)}</option>'
            for n in names
        )
        return (
            f'<select name="assignee" data-testid="assignee" aria-label="assignee">{options}'
            "</select>"
        )
    return (
        f'<input name="assignee" size="12" value="{escape(chosen)}" list="case-users" '
        f'data-testid="assignee" aria-label="assignee">{_datalist("case-users", known.names)}'
    )


# The queue's orders as the form offers them.
_SORT_WORDS = {
    CaseSort.NEWEST: "newest activity first",
    CaseSort.OLDEST: "opened longest ago first",
    CaseSort.AMOUNT: "largest payments total first",
    CaseSort.ALERTS: "most alerts first",
    CaseSort.OUTCOME: "strongest outcome first",
}


def _sort_head(view: QueueView, sort: CaseSort, words: str, css: str = "", title: str = "") -> str:
    """A column's head that orders the queue by it (a link, the first page; the other
    parameters kept); the current order's head is marked, not a link."""
    attrs = (f' class="{css}"' if css else "") + (f' title="{title}"' if title else "")
    if view.query.sort is sort:
        return (
            f'<th{attrs} aria-sort="{"ascending" if sort is CaseSort.OLDEST else "descending"}" '
            f'data-testid="queue-sorted-by" data-sort="{sort.value}">{words} '
            f'<span class="muted">{"▲" if sort is CaseSort.OLDEST else "▼"}</span></th>'
        )
    href = view.link(leave_out=("case_before", *TRANSIENT), case_sort=sort.value)
    return (
        f'<th{attrs}><a href="{escape(href)}" data-testid="queue-sort-{sort.value}" '
        f'data-in-place="{view.base}/queue" title="{escape(_SORT_WORDS[sort])}">{words}</a></th>'
    )


def _verdict_options(chosen: Verdict | None = None) -> str:
    unchosen = '<option value="" disabled selected>verdict…</option>' if chosen is None else ""
    return unchosen + "".join(
        f'<option value="{v.value}"{" selected" if v is chosen else ""}>{_VERDICT_WORDS[v]}'
        "</option>"
        for v in Verdict
    )


def _bulk_form(view: QueueView) -> str:
    return (
        f'<form id="bulk-close" class="inline" method="post" action="{view.base}/cases/close" '
        'data-progress="Closing the selected cases…" data-testid="bulk-close" data-in-place>'
        f"{back_field(view.params)}{token_input(view.csrf)}"
        f'<select name="verdict" required data-testid="bulk-verdict">{_verdict_options()}'
        "</select> "
        f'<input name="note" size="24" maxlength="{NOTE_MAX}" placeholder="note" '
        'data-testid="bulk-note"> '
        '<button type="submit" data-testid="bulk-close-submit">Close selected</button></form>'
        ' <span class="keys muted">keys: <kbd>j</kbd>/<kbd>k</kbd> move, <kbd>x</kbd> select, '
        "<kbd>o</kbd> open, <kbd>c</kbd> close as confirmed fraud, <kbd>f</kbd> as a false "
        "positive (the selected cases, else the one under the cursor)</span>"
    )


def queue_part(page: CasePage | None, view: QueueView, error: str | None = None) -> str:
    """The queue's section as the part a filter, an order, a page or a close redraws in
    place (``data-part="queue"``)."""
    return f'<div data-part="queue">{queue_section(page, view, error)}</div>'


def queue_section(page: CasePage | None, view: QueueView, error: str | None = None) -> str:
    """The filter, then the cases of ``page`` (or why they cannot be read) with the bulk
    close, the live notice and the paging links."""
    form = _filter_form(view)
    if error:
        test_id = "queue-filter-error" if error.startswith("field ") else "queue-error"
        return f'{form}<p class="bad" data-testid="{test_id}">{escape(error)}</p>'
    if page is None:
        return form
    condition = " matching the filter" if view.query.filter.query() else " not closed"
    where = " (below the previous page)" if view.query.before is not None else ""
    cases = "1 case" if page.matching == 1 else f"{page.matching} cases"
    caption = (
        f'<p class="muted" data-testid="queue-caption">{cases}{condition}, '
        f"{_SORT_WORDS[view.query.sort]}{where}. An alert joins its case when the stream writes it "
        f"to Delta, up to {view.write_behind_seconds:g} s after it is on the alert stream "
        "(write_behind_seconds); changes show below on request, never under the cursor.</p>"
    )
    notice = (
        '<p class="notice" data-testid="queue-notice" hidden>'
        '<span data-testid="queue-notice-text"></span> — '
        '<button type="button" data-testid="queue-show">show</button></p>'
    )
    select_head = '<th><input type="checkbox" data-testid="select-all" ' if view.can_edit else ""
    if select_head:
        select_head += 'aria-label="select every case shown"></th>'
    strongest = "the strongest outcome of its alerts"
    head = (
        f"<thead><tr>{select_head}"
        f"{_sort_head(view, CaseSort.OUTCOME, 'outcome', title=strongest)}"
        "<th>case</th><th>rules (alerts)</th>"
        f"{_sort_head(view, CaseSort.AMOUNT, 'payments', 'figure')}"
        f"{_sort_head(view, CaseSort.ALERTS, 'alerts', 'figure')}"
        f"{_sort_head(view, CaseSort.OLDEST, 'first alert')}"
        f"{_sort_head(view, CaseSort.NEWEST, 'latest alert')}"
        "<th>assignee</th><th>status</th></tr></thead>"
    )
    rows = queue_rows(page.cases, view)
    rows_url = view.link("/cases/rows")
    table = (
        f'<table class="queue" data-testid="queue" data-as-of="{view.as_of}" '
        f'data-rows="{escape(rows_url)}" data-cap="{view.query.limit}">'
        f"{head}<tbody>{rows}</tbody></table>"
    )
    links = []
    if view.query.before is not None:
        first = view.link(leave_out=("case_before", *TRANSIENT))
        links.append(
            f'<a href="{escape(first)}" data-testid="queue-newest" '
            f'data-in-place="{view.base}/queue">newest</a>'
        )
    if page.older is not None:
        older = view.link(case_before=page.older.text())
        links.append(
            f'<a href="{escape(older)}" data-testid="queue-older" '
            f'data-in-place="{view.base}/queue">older cases →</a>'
        )
    paging = f'<p class="paging">{"".join(links)}</p>' if links else ""
    bulk = f"<p>{_bulk_form(view)}</p>" if view.can_edit else ""
    return f"{form}{caption}{bulk}{notice}{table}{paging}"


# --- a case's page ---------------------------------------------------------------------


@dataclass
class CaseView:
    """Everything a case's page shows."""

    case: Case
    queue: QueueView  # the queue's parameters: every link and form goes back to them
    alerts: Sequence[Mapping[str, Any]] = ()  # the alerts listed, in time order
    payment_page: PaymentPage | None = None  # the alerts listed, a group a payment
    alerts_error: str | None = None
    payments: Sequence[Mapping[str, Any]] = ()
    payments_error: str | None = None
    reviews: Mapping[str, Review] = field(default_factory=dict)
    explanation_html: str = ""  # an alert's explanation asked for (the page's own HTML)


def _history_what(event: CaseEvent) -> str:
    match event.event:
        case CaseEventKind.OPENED:
            return f"opened with {event.alerts} alerts"
        case CaseEventKind.JOINED:
            return f"{event.alerts} alerts joined"
        case CaseEventKind.ASSIGNED:
            return f"assigned to {event.assignee}"
        case CaseEventKind.CLOSED:
            verdict = event.verdict.words if event.verdict is not None else "closed"
            return f"closed: {verdict}" + (f" — {event.note}" if event.note else "")
        case CaseEventKind.REOPENED:
            return "reopened"
    return event.event.value


def _history(case: Case, now_ms: int) -> str:
    rows = "".join(
        f'<tr data-testid="case-history-row" data-event="{e.event.value}">'
        f"<td>{time_ago(e.at, now_ms)}</td><td>{escape(e.who)}</td>"
        f"<td>{escape(_history_what(e))}</td></tr>"
        for e in reversed(case.history)
    )
    return (
        '<table data-testid="case-history"><thead><tr><th>when</th><th>who</th><th>what</th>'
        f"</tr></thead><tbody>{rows}</tbody></table>"
    )


def _alert_item(view: CaseView, alert: Mapping[str, Any]) -> str:
    """One alert of a payment's row: its rule as a badge with its outcome, what it
    measured, explain and its review (``data-testid="case-alert"``)."""
    queue = view.queue
    alert_id = str(alert["alertId"])
    rule = queue.rule_versions.get((alert.get("ruleId"), alert.get("ruleVersion")))  # type: ignore[arg-type]
    suppressed = (
        ' <span class="badge suppressed" data-testid="suppressed-badge" title="its rule&#39;s '
        'cooldown suppressed it: recorded, not published">suppressed</span>'
        if alert.get("suppressed")
        else ""
    )
    review = view.reviews.get(alert_id)
    verdict = (
        f' <span class="verdict-{review.verdict.value}">{escape(review.verdict.words)}</span>'
        if review is not None
        else ""
    )
    kept = {k: v for k, v in queue.params.items() if k in PAYMENT_PAGE_FIELDS}
    explain = queue.link(
        f"/cases/{quote(view.case.case_id, safe='')}", leave_out=TRANSIENT, alert=alert_id, **kept
    )
    measured = (
        f"{alert.get('aggregateValue')} {alert.get('limitOperatorType')} {alert.get('limit')}"
    )
    kind = str(alert.get("kind"))
    kind_html = "" if kind == "ALERT" else f' <span class="muted">{escape(kind)}</span>'
    if alert.get("retracted"):  # a backfill took it back: its RETRACTION is in the case too
        kind_html += (
            ' <span class="badge suppressed" data-testid="retracted-badge" title="a backfill '
            'found it should not have fired">retracted</span>'
        )
    title = f"{kind}, decided {time_text(alert.get('decisionTime'))} UTC: {measured}"
    if rule is not None:
        title += f" ({rule_summary(rule)})"
    return (
        f'<span class="alert-item" data-testid="case-alert" data-alert-id="{escape(alert_id)}" '
        f'data-rule="{escape(str(alert.get("ruleId")))}"'
        f"{' data-suppressed=1' if alert.get('suppressed') else ''}>"
        f'<span class="badge rule" title="{escape(title)}">{escape(str(alert.get("ruleId")))} '
        f"v{escape(str(alert.get('ruleVersion')))}</span> "
        f"{outcome_badge(alert.get('outcome') or Outcome.ALERT.value)}"
        f"{kind_html}"
        f'{suppressed} <span class="muted">{escape(measured)}</span> '
        f'<a href="{escape(explain)}#explanation" data-testid="case-explain">explain</a>'
        f"{verdict}</span>"
    )


def _alert_rows(view: CaseView) -> str:
    """The case's alerts, a row a payment (newest payment first), its alerts in time
    order; paged by payment."""
    queue = view.queue
    page = view.payment_page
    groups = list(page.payments) if page is not None else group_by_payment(view.alerts)[::-1]
    amounts = {str(p["transactionId"]): p.get("paymentAmount") for p in view.payments}
    rows = []
    for group in groups:
        first = group.alerts[0]
        key = first.get("key")
        rule = queue.rule_versions.get((first.get("ruleId"), first.get("ruleVersion")))  # type: ignore[arg-type]
        order = rule.grouping_keys if rule is not None else ()
        outcome = strongest(
            Outcome(str(a.get("outcome") or Outcome.ALERT.value)) for a in group.alerts
        )
        amount = amounts.get(group.transaction_id)
        rows.append(
            f'<tr data-testid="case-payment-alerts" data-tx="{escape(group.transaction_id)}">'
            f"<td>{time_text(group.event_time)}</td>"
            f"<td>{escape(group.transaction_id)}</td>"
            f'<td class="figure">{"" if amount is None else number_text(amount)}</td>'
            f"<td>{outcome_badge(outcome.value, 'payment-outcome')}</td>"
            f"<td>{key_html(key, order) if isinstance(key, Mapping) else escape(str(key))}</td>"
            f'<td class="rules">{" ".join(_alert_item(view, a) for a in group.alerts)}</td>'
            f"<td>{time_ago(group.alerts[-1].get('decisionTime'), queue.now_ms)}</td></tr>"
        )
    path = f"/cases/{quote(view.case.case_id, safe='')}"
    size = {k: v for k, v in queue.params.items() if k == "alerts_limit"}
    links = []
    if queue.params.get("alerts_before"):
        newest = queue.link(path, **size)
        links.append(
            f'<a href="{escape(newest)}" data-testid="case-alerts-newest">newest payments</a>'
        )
    if page is not None and page.older is not None:
        older = queue.link(path, alerts_before=page.older.text(), **size)
        links.append(
            f'<a href="{escape(older)}" data-testid="case-alerts-older">older payments →</a>'
        )
    paging = f'<p class="paging">{" ".join(links)}</p>' if links else ""
    return (
        '<table data-testid="case-alerts"><thead><tr><th>event time (UTC)</th>'
        '<th>transaction</th><th class="figure">amount</th><th>outcome</th><th>key</th>'
        "<th>alerts (rule, outcome, value, explain, review), in time order</th>"
        f"<th>decided</th></tr></thead><tbody>{''.join(rows)}</tbody></table>{paging}"
    )


def _payments(view: CaseView) -> str:
    if view.payments_error:
        return f'<p class="bad">{escape(view.payments_error)}</p>'
    if not view.payments:
        return (
            '<p class="muted" data-testid="no-payments">No payments in the events table yet '
            "(the stream writes it behind Redis).</p>"
        )
    rows = "".join(
        f'<tr data-testid="case-payment" data-tx="{escape(str(p["transactionId"]))}">'
        f"<td>{time_text(p.get('eventTime'))}</td><td>{escape(str(p['transactionId']))}</td>"
        f"<td>{escape(str(p.get('beneficiaryId')))}</td>"
        f"<td>{escape(str(p.get('paymentType')))}</td>"
        f'<td class="figure">{number_text(p.get("paymentAmount"))}</td></tr>'
        for p in view.payments
    )
    return (
        '<table data-testid="case-payments"><thead><tr><th>event time (UTC)</th>'
        '<th>transaction</th><th>beneficiary</th><th>type</th><th class="figure">amount</th>'
        f"</tr></thead><tbody>{rows}</tbody></table>"
    )


def _case_actions(view: CaseView) -> str:
    case, queue = view.case, view.queue
    if not queue.can_edit:
        return '<p class="muted">Your role may read cases but not change them.</p>'
    path = f"{queue.base}/cases/{quote(case.case_id, safe='')}"
    back = back_field(queue.params) + token_input(queue.csrf)
    assign = (
        f'<form class="inline" method="post" action="{path}/assign" '
        f'data-progress="Assigning the case…" data-testid="assign-form" data-in-place>{back}'
        '<input type="hidden" name="return_to" value="case">'
        f'{assignee_field(queue, case.assignee)} <button type="submit" '
        'data-testid="assign-submit">Assign</button></form>'
    )
    if case.status.value == "closed":
        reopen = (
            f'<form class="inline" method="post" action="{path}/reopen" '
            f'data-progress="Reopening the case…" data-in-place>{back}'
            '<input type="hidden" name="return_to" value="case">'
            '<button type="submit" data-testid="reopen-submit">Reopen</button></form>'
        )
        return f"<p>{reopen}</p>"
    close = (
        f'<form id="close-form-case" class="inline" method="post" action="{path}/close" '
        'data-progress="Closing the case…" data-testid="close-form" data-in-place>'
        f'{back}<select name="verdict" required data-testid="close-verdict">'
        f"{_verdict_options()}</select> "
        f'<input name="note" size="28" maxlength="{NOTE_MAX}" placeholder="note" '
        'data-testid="close-note"> '
        '<button type="submit" data-testid="close-submit">Close</button></form>'
    )
    keys = (
        ' <span class="keys muted">keys: <kbd>c</kbd> close as confirmed fraud, <kbd>f</kbd> '
        "as a false positive, <kbd>u</kbd> back to the queue</span>"
    )
    return f"<p>{assign}</p><p>{close}{keys}</p>"


def _case_facts(view: CaseView) -> str:
    case, queue = view.case, view.queue
    verdict = (
        f"<tr><th>verdict</th><td>{escape(case.verdict.words)}</td></tr>"
        if case.verdict is not None
        else ""
    )
    return (
        '<table class="facts" data-testid="case-facts">'
        f"<tr><th>status</th>{_status(case)}</tr>"
        f'<tr><th title="the strongest outcome of its alerts">outcome</th>'
        f"<td>{outcome_badge(case.outcome.value, 'case-outcome')}</td></tr>"
        f"<tr><th>assignee</th><td>{escape(case.assignee or '—')}</td></tr>"
        f"<tr><th>first alert</th><td>{time_ago(case.opened_at, queue.now_ms)}</td></tr>"
        f"<tr><th>latest alert</th><td>{time_ago(case.latest_alert_at, queue.now_ms)}</td></tr>"
        f"<tr><th>alerts</th><td>{case.alerts} {rule_badges(case.rule_counts, queue)}</td></tr>"
        f'<tr><th>payments</th><td class="figure" data-testid="case-amount">'
        f"{number_text(case.amount)}</td></tr>{verdict}</table>"
    )


def case_parts(view: CaseView, alerts: bool = False) -> dict[str, str]:
    """The parts of a case's page that its assign, close or reopen redraws in place (each
    ``data-part``): its title (with its status), facts and actions, history; and its
    alerts (``alerts``: a close reviews each)."""
    case, queue = view.case, view.queue
    parts = {
        "case-title": (
            f'<h1 data-part="case-title" data-testid="case-title" '
            f'data-case-id="{escape(case.case_id)}" data-status="{case.status.value}">'
            f"Case {key_html(case.key)}</h1>"
        ),
        "case-state": (
            f'<div data-part="case-state">{_case_facts(view)}{_case_actions(view)}</div>'
        ),
        "case-history": (f'<div data-part="case-history">{_history(case, queue.now_ms)}</div>'),
    }
    if alerts:
        shown = (
            f'<p class="bad">{escape(view.alerts_error)}</p>'
            if view.alerts_error
            else _alert_rows(view)
        )
        parts["case-alerts"] = f'<div data-part="case-alerts">{shown}</div>'
    return parts


def case_section(view: CaseView) -> str:
    """A case: its facts, the actions an editor may take, its alerts (each explained on
    request), its payments and its history."""
    queue = view.queue
    parts = case_parts(view, alerts=True)
    back = queue.link()
    return (
        f'<p><a href="{escape(back)}" data-testid="back-to-queue">← the queue</a></p>'
        f"{parts['case-title']}"
        f'<p class="muted">case <code>{escape(view.case.case_id)}</code></p>'
        f"{view.explanation_html}{parts['case-state']}"
        f'<h2>Alerts</h2><p class="muted">Notified and suppressed, every rule, a row a '
        "payment, newest payment first, its alerts in time order, as the stream wrote them "
        f"to Delta (up to {queue.write_behind_seconds:g} s behind "
        "the alert stream).</p>"
        f"{parts['case-alerts']}<h2>Payments</h2>{_payments(view)}<h2>History</h2>"
        f"{parts['case-history']}"
    )


# The keyboard of the queue and of a case's page. j/k move the cursor over the queue's
# rows, x selects the row under it, o or Enter opens its case, c and f close the selected
# cases (else the one under the cursor) as confirmed fraud or a false positive; on a
# case's page c and f close it, u goes back to the queue. Keys typed in a field are the
# field's. A close redraws in place what it changed (the queue, or the case): the keys go
# on working on what is drawn.
QUEUE_SCRIPT = """
(function () {
  function rows() {
    return Array.prototype.slice.call(document.querySelectorAll('tr[data-testid="queue-row"]'));
  }
  function focused() { return document.querySelector('tr[data-testid="queue-row"].focused'); }
  function focus(row) {
    var was = focused();
    if (was) { was.classList.remove("focused"); }
    if (row) {
      row.classList.add("focused");
      row.scrollIntoView({block: "nearest"});
      window.velocityFocusedCase = row.dataset.caseId;
      window.velocityFocusedAt = rows().indexOf(row);
    }
  }
  window.velocityFocusRow = focus;
  function close(verdict, what, event) {
    var form = document.getElementById("close-form-case") || document.getElementById("bulk-close");
    if (!form) { return; }
    var checked = document.querySelectorAll('input[name="case_id"]:checked');
    if (form.id === "bulk-close" && !checked.length) {
      var row = focused();
      if (!row) { return; }
      var box = row.querySelector('input[name="case_id"]');
      if (box) { box.checked = true; }
    }
    form.querySelector('select[name="verdict"]').value = verdict;
    if (window.velocityClicked) { window.velocityClicked(what, event); }
    form.requestSubmit();
  }
  document.addEventListener("keydown", function (event) {
    var target = event.target;
    if (event.ctrlKey || event.metaKey || event.altKey) { return; }
    if (target && /^(INPUT|SELECT|TEXTAREA|BUTTON)$/.test(target.tagName)) { return; }
    var list = rows(), row = focused(), at = row ? list.indexOf(row) : -1;
    switch (event.key) {
      case "j": focus(list[Math.min(list.length - 1, at + 1)]); break;
      case "k": focus(list[Math.max(0, at - 1)]); break;
      case "x":
        if (row) {
          var box = row.querySelector('input[name="case_id"]');
          if (box) { box.checked = !box.checked; }
        }
        break;
      case "o": case "Enter":
        if (row) {
          var link = row.querySelector('a[data-testid="case-link"]');
          if (window.velocityClicked) { window.velocityClicked("key-open", event); }
          if (link) { window.location.href = link.href; }
        }
        break;
      case "c": close("CONFIRMED_FRAUD", "key-c", event); break;
      case "f": close("FALSE_POSITIVE", "key-f", event); break;
      case "u":
        var back = document.querySelector('[data-testid="back-to-queue"]');
        if (back) { back.click(); }
        break;
      default: return;
    }
    event.preventDefault();
  });
  // (On the document: the queue may be drawn again in place.)
  document.addEventListener("change", function (event) {
    var all = event.target;
    if (!all.matches || !all.matches('[data-testid="select-all"]')) { return; }
    document.querySelectorAll('input[name="case_id"]').forEach(function (box) {
      box.checked = all.checked;
    });
  });
  // Drawn again (after a close, a filter, or the rows shown anew): the cursor stays on its
  // case, or where it was when that case has gone.
  function refocus() {
    if (!window.velocityFocusedCase) { return; }
    var list = rows();
    var again = list.filter(function (r) {
      return r.dataset.caseId === window.velocityFocusedCase;
    })[0];
    focus(again || list[Math.min(window.velocityFocusedAt || 0, list.length - 1)]);
  }
  window.velocityRefocus = refocus;
  refocus();
})();
"""
