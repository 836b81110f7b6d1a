"""The Velocity page's queue of cases, a case's page, the rules' alerts a minute, the window
lookup, the backfill form and the click timing: their HTML from plain data (what each
role sees, nothing unescaped, every link and form keeping the page's URL), and the routes
in process over real Delta tables."""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest
from tests.builders import alert_row, make_rule

from velocity.analyst.case_queue import CaseCursor, CasePage, parse_case_query
from velocity.analyst.cases import Case, CaseEvent, CaseEventKind, CaseStatus, case_key_text
from velocity.analyst.reviews import Verdict
from velocity.analyst.rule_rates import rule_rates
from velocity.domain.rules import Outcome
from velocity.settings import Settings
from velocity_airflow.page import cases_html
from velocity_airflow.page.home_html import PageData, lookup_html, render_case, render_page

pytestmark = pytest.mark.timeout(120)

NOW = 1_767_225_600_000  # 2026-01-01T00:00:00Z
RULES = [make_rule(ruleId=4), make_rule(ruleId=5, ruleState="PAUSE")]
PARAMS = {"rule": "4", "case_status": "all", "alert": "a-9"}


def now_ms() -> int:
    return int(time.time() * 1000)


class Analyst:
    def get_name(self) -> str:
        return "ana"


def _case(**fields: Any) -> Case:
    base = Case(
        case_id="c-1",
        case_key=case_key_text("payerId", "p<1>"),
        opened_at=NOW - 185_000,
        latest_alert_at=NOW - 20_000,
        latest_activity_at=NOW - 20_000,
        alerts=15,
        rule_counts={5: 3, 4: 12},
        amount=Decimal("1234567.5"),
    )
    return replace(base, **fields)


def _view(can_edit: bool = True, params: dict[str, str] | None = None) -> cases_html.QueueView:
    params = PARAMS if params is None else params
    return cases_html.QueueView(
        base="/velocity",
        can_edit=can_edit,
        user="ana",
        now_ms=NOW,
        query=parse_case_query(params, None),
        params=params,
        rule_versions={(r.rule_id, 1): replace(r, version=1) for r in RULES},
        rule_ids=[4, 5],
        write_behind_seconds=30,
        as_of=NOW - 20_000,
    )


def _queue(cases: list[Case], **view: Any) -> str:
    return cases_html.queue_section(CasePage(cases, None, len(cases)), _view(**view))


def test_a_case_row_reads_as_people_read_it() -> None:
    row = cases_html.queue_row(_case(), _view())
    assert 'data-testid="queue-row" data-case-id="c-1" data-status="open"' in row
    # The key, never wrapped inside its value; escaped.
    assert '<span class="kv">payerId=p&lt;1&gt;</span>' in row and "p<1>" not in row
    # Its rules as badges by ruleId, each with its alert count and what the rule checks.
    assert row.index('data-rule="4"') < row.index('data-rule="5"')
    assert "<b>×12</b>" in row and "<b>×3</b>" in row
    assert 'title="ruleId 4: SUM(paymentAmount) &gt; 200000 over 1440 min' in row
    assert '<td class="figure" data-testid="case-amount">1,234,567.5</td>' in row
    # First and latest alert relative, the UTC time in the title.
    assert 'title="2025-12-31 23:56:55.000Z">3 min ago</time>' in row
    assert 'title="2025-12-31 23:59:40.000Z">20 s ago</time>' in row
    assert '<td class="status-open">open</td>' in row
    assert 'data-testid="case-select"' in row and 'form="bulk-close"' in row
    # Its link keeps the page's URL (filters of both tables), less an open explanation.
    assert 'href="/velocity/cases/c-1?rule=4&amp;case_status=all"' in row
    closed = cases_html.queue_row(
        _case(status=CaseStatus.CLOSED, verdict=Verdict.FALSE_POSITIVE, assignee="<bo>"), _view()
    )
    assert '<td class="status-closed">closed (false positive)</td>' in closed
    assert "<td>&lt;bo&gt;</td>" in closed


def test_the_queue_keeps_the_page_s_url_in_every_form_and_link() -> None:
    html = _queue([_case()])
    form = html.split('data-testid="queue-filter"')[1].split("</form>")[0]
    assert '<input type="hidden" name="rule" value="4">' in form, "the alerts' filter kept"
    assert 'name="alert"' not in form, "an open explanation is not"
    assert '<option value="all" selected>all</option>' in form
    assert '<option value="" >' not in form and '<option value="">not closed</option>' in form
    assert 'href="/velocity/?rule=4" data-testid="queue-filter-clear"' in form
    assert 'href="/velocity/?rule=4&amp;case_assignee=ana" data-testid="queue-mine"' in form
    bulk = html.split('data-testid="bulk-close"')[1].split("</form>")[0]
    assert 'action="/velocity/cases/close"' in html
    assert '<input type="hidden" name="back" value="rule=4&amp;case_status=all">' in bulk
    assert '<option value="" disabled selected>verdict…</option>' in bulk, "none by default"
    # Live: the page counts changes since it was drawn and draws rows only on request.
    table = html.split('<table class="queue"')[1].split(">")[0]
    assert f'data-as-of="{NOW - 20_000}"' in table
    assert 'data-rows="/velocity/cases/rows?rule=4&amp;case_status=all"' in table
    assert 'data-testid="queue-notice" hidden' in html and 'data-testid="queue-show"' in html
    assert "up to 30 s after it is on the alert stream" in html
    paged = cases_html.queue_section(
        CasePage([_case()], CaseCursor(NOW - 20_000, "c-1"), 60), _view()
    )
    older = paged.split(' data-testid="queue-older"')[0].rsplit('href="', 1)[1]
    assert older == f'/velocity/?rule=4&amp;case_status=all&amp;case_before={NOW - 20_000}_c-1"'


def test_each_case_shows_its_strongest_outcome_and_the_queue_filters_and_sorts_by_it() -> None:
    row = cases_html.queue_row(_case(outcome=Outcome.BLOCK), _view())
    assert 'data-outcome="BLOCK"' in row
    assert '<span class="outcome outcome-BLOCK" data-testid="case-outcome">BLOCK</span>' in row
    params = {"case_outcome": "review", "case_sort": "outcome", "rule": "4"}
    html = _queue([_case(outcome=Outcome.REVIEW)], params=params)
    form = html.split('data-testid="queue-filter"')[1].split("</form>")[0]
    assert '<option value="REVIEW" selected>REVIEW</option>' in form
    assert '<option value="outcome" selected>strongest outcome first</option>' in form
    assert 'name="case_sort" value' not in form, "the form's own choice, not a hidden copy"
    assert "1 case matching the filter, strongest outcome first." in html
    # The next page keeps the order, its boundary the outcome's.
    older = CaseCursor(NOW - 20_000, "c-1", Outcome.REVIEW)
    paged = cases_html.queue_section(CasePage([_case()], older, 60), _view(params=params))
    assert f"case_sort=outcome&amp;rule=4&amp;case_before=REVIEW_{NOW - 20_000}_c-1" in paged
    assert "newest activity first." in _queue([_case()])


@pytest.mark.parametrize("sort", ["newest", "oldest", "amount", "alerts", "outcome"])
def test_each_order_is_a_column_head_and_a_choice_and_its_pages_keep_it(sort: str) -> None:
    params = {"rule": "4", "case_sort": sort, "case_before": "x"}
    view = _view(params={"rule": "4", "case_sort": sort})
    view.params = params  # a page below the first: a new order starts again at the top
    html = cases_html.queue_section(CasePage([_case()], None, 1), view)
    head = html.split("<thead>")[1].split("</thead>")[0]
    marked = re.findall(r'data-testid="queue-sorted-by" data-sort="(\w+)"', head)
    assert marked == [sort], "the current order's head is marked, not a link"
    others = re.findall(r'href="([^"]+)" data-testid="queue-sort-(\w+)"', head)
    assert sorted(o for _, o in others) == sorted(
        {"newest", "oldest", "amount", "alerts", "outcome"} - {sort}
    )
    for href, other in others:
        assert href == f"/velocity/?rule=4&amp;case_sort={other}", "the first page"
    form = html.split('data-testid="queue-filter"')[1].split("</form>")[0]
    assert f'<option value="{sort}" selected>' in form
    query = parse_case_query({"case_sort": sort}, None)
    older = CaseCursor.of(_case(), query.sort)
    paged = cases_html.queue_section(
        CasePage([_case()], older, 60), _view(params={"case_sort": sort})
    )
    link = paged.split(' data-testid="queue-older"')[0].rsplit('href="', 1)[1]
    assert link == f'/velocity/?case_sort={sort}&amp;case_before={older.text()}"'
    assert parse_case_query({"case_sort": sort, "case_before": older.text()}, None).before == older


def test_the_assignee_is_chosen_from_the_known_users_or_offered() -> None:
    view = _view()
    view.assignees = cases_html.Assignees(("admin", "ana", "<bo>"), closed=True)
    field = cases_html.assignee_field(view, "<bo>")
    assert field.startswith('<select name="assignee"')
    assert '<option value="&lt;bo&gt;" selected>&lt;bo&gt;</option>' in field
    assert '<option value="ana">ana</option>' in field
    view.assignees = cases_html.Assignees(("admin", "ana"), closed=False)
    field = cases_html.assignee_field(view, None)
    assert '<input name="assignee" size="12" value="ana" list="case-users"' in field
    assert '<datalist id="case-users"><option value="admin"></option>' in field
    form = _queue([_case()]).split('data-testid="queue-filter"')[1].split("</form>")[0]
    assert 'list="queue-users"' in form and '<option value="none"></option>' in form


def test_a_viewer_sees_the_queue_but_cannot_close_anything() -> None:
    html = _queue([_case()], can_edit=False)
    assert 'data-testid="queue-row"' in html
    assert "bulk-close" not in html and "case-select" not in html and "/cases/close" not in html


def test_an_empty_queue_and_a_filter_that_cannot_be_read() -> None:
    assert 'data-testid="no-cases"' in _queue([])
    view = _view(params={})
    html = cases_html.queue_section(None, view, "field 'case_status': 'pending' is not a status")
    assert 'data-testid="queue-filter-error"' in html and "&#x27;pending&#x27;" in html


def _case_view(**fields: Any) -> cases_html.CaseView:
    history = [
        CaseEvent("c-1", "k", CaseEventKind.OPENED, NOW - 185_000, "velocity-stream", alerts=3),
        CaseEvent("c-1", "k", CaseEventKind.ASSIGNED, NOW - 60_000, "ana", assignee="bo"),
    ]
    alerts = [
        {**alert_row("a-1", (4, 1), NOW - 185_000), "key": {"payerId": "p<1>"}, "outcome": "BLOCK"},
        {**alert_row("a-2", (4, 1), NOW - 20_000), "key": {"payerId": "p<1>"}, "suppressed": True},
    ]
    payments = [
        {"transactionId": "tx-a-1", "eventTime": NOW - 185_005, "beneficiaryId": "b<2>",
         "paymentType": "CRD", "paymentAmount": "1234.50000000"},
    ]  # fmt: skip
    view = cases_html.CaseView(
        case=_case(
            history=history, assignee="bo", status=CaseStatus.ASSIGNED, outcome=Outcome.BLOCK
        ),
        queue=_view(),
        alerts=alerts,
        payments=payments,
    )
    for name, value in fields.items():
        setattr(view, name, value)
    return view


def test_a_case_opens_to_its_alerts_payments_and_history() -> None:
    html = render_case(_case_view())
    assert 'data-testid="case-title" data-case-id="c-1" data-status="assigned"' in html
    assert 'href="/velocity/?rule=4&amp;case_status=all" data-testid="back-to-queue"' in html
    alerts = html.split('data-testid="case-alerts"')[1]
    assert alerts.index('data-alert-id="a-2"') < alerts.index('data-alert-id="a-1"'), "newest first"
    assert 'data-alert-id="a-2" data-rule="4" data-suppressed=1' in alerts
    assert 'data-testid="suppressed-badge"' in alerts
    # The case's strongest outcome among its facts, and each alert's own.
    facts = html.split('data-testid="case-facts"')[1].split("</table>")[0]
    assert 'data-testid="case-outcome">BLOCK</span>' in facts
    first = alerts.split('data-alert-id="a-1"')[1].split("</tr>")[0]
    assert 'data-testid="outcome">BLOCK</span>' in first
    second = alerts.split('data-alert-id="a-2"')[1].split("</tr>")[0]
    assert 'data-testid="outcome">ALERT</span>' in second, "a row without one: ALERT"
    # A row a payment, newest first; a payment's alerts in one row, in time order.
    assert alerts.count('data-testid="case-payment-alerts"') == 2
    view = _case_view()
    view.alerts = [*view.alerts, {**view.alerts[0], "alertId": "a-3", "ruleId": 5}]
    grouped = render_case(view).split('data-testid="case-alerts"')[1]
    assert grouped.count('data-testid="case-payment-alerts"') == 2
    row = grouped.split('data-tx="tx-a-1"')[1].split("</tr>")[0]
    assert row.index('data-alert-id="a-1"') < row.index('data-alert-id="a-3"')
    assert 'data-testid="payment-outcome">BLOCK</span>' in row
    # Each alert explained on this page, with the queue's URL kept.
    assert 'href="/velocity/cases/c-1?rule=4&amp;case_status=all&amp;alert=a-1#explanation"' in html
    payment = html.split('data-testid="case-payment"')[1].split("</tr>")[0]
    assert "b&lt;2&gt;" in payment and '<td class="figure">1,234.50000000</td>' in payment
    history = html.split('data-testid="case-history"')[1]
    assert history.index("assigned to bo") < history.index("opened with 3 alerts"), "newest first"
    close = html.split('data-testid="close-form"')[0].rsplit("<form", 1)[1]
    assert 'action="/velocity/cases/c-1/close"' in close
    assert '<input type="hidden" name="back" value="rule=4&amp;case_status=all">' in html
    assert 'name="assignee" size="12" value="bo" list="case-users"' in html, "to change"
    assert "<kbd>c</kbd> close as confirmed fraud" in html


def test_a_closed_case_offers_reopen_and_a_viewer_no_change() -> None:
    closed = _case_view()
    closed.case = replace(closed.case, status=CaseStatus.CLOSED, verdict=Verdict.CONFIRMED_FRAUD)
    html = render_case(closed)
    assert 'data-testid="reopen-submit"' in html and 'data-testid="close-form"' not in html
    assert "<tr><th>verdict</th><td>confirmed fraud</td></tr>" in html
    viewer = _case_view(queue=_view(can_edit=False))
    shown = render_case(viewer)
    assert "/assign" not in shown and "/close" not in shown and "may read cases" in shown


def _posts(html: str) -> list[str]:
    return re.findall(r'<form[^>]*method="post".*?</form>', html, re.S)


def test_the_queue_s_and_a_case_s_forms_carry_the_page_s_token() -> None:
    token = "cd" * 32
    field = f'<input type="hidden" name="csrf_token" value="{token}">'
    queue = cases_html.queue_section(CasePage([_case()], None, 1), replace(_view(), csrf=token))
    [bulk] = _posts(queue)
    assert 'action="/velocity/cases/close"' in bulk and field in bulk
    case = render_case(_case_view(queue=replace(_view(), csrf=token)))
    assert len(_posts(case)) == 2 and all(field in form for form in _posts(case))  # assign, close
    assert f'<meta name="csrf-token" content="{token}">' in case
    closed = _case_view(queue=replace(_view(), csrf=token))
    closed.case = replace(closed.case, status=CaseStatus.CLOSED)
    posts = _posts(render_case(closed))
    assert len(posts) == 1 and "/reopen" in posts[0] and field in posts[0]


def _page(**fields: Any) -> str:
    data = PageData(user="ana", can_edit=True, base="/velocity", rules=RULES, now_ms=NOW)
    data.rule_versions = {(r.rule_id, 1): replace(r, version=1) for r in RULES}
    for name, value in fields.items():
        setattr(data, name, value)
    return render_page(data)


def test_the_page_opens_on_the_queue() -> None:
    html = _page(queue=_view(), queue_page=CasePage([_case()], None, 1), params=PARAMS)
    assert html.index('<h2 id="queue">Queue</h2>') < html.index('<h2 id="rules">')
    assert html.index('<h2 id="queue">') < html.index('<h2 id="alerts">')
    assert html.count('<tr data-testid="queue-row"') == 1
    # One live feed with the filters of both tables.
    assert '<body data-live="/velocity/api/page/live?rule=4&amp;case_status=all">' in html
    # A change posted by the page's script comes back to the page's URL.
    assert 'body.append("back", location.search' in html
    assert "velocity_click=" in html, "each click leaves its moment for the server to time"


def test_each_rule_shows_its_alerts_a_minute_and_a_warning_when_it_fires_often() -> None:
    now = NOW + 9 * 60_000 + 5_000
    counts = [(4, NOW + 8 * 60_000, False, 1200), (4, NOW + 8 * 60_000, True, 2400)]
    rates = rule_rates(counts, {4: 3600}, 4000, [4, 5], now)
    html = _page(rule_rates=rates, write_behind_seconds=30)
    cell = html.split('data-testid="rates-4"')[1].split("</td>")[0]
    assert 'data-notified="0,0,0,0,0,0,0,0,1200,0"' in cell
    assert 'data-suppressed="0,0,0,0,0,0,0,0,2400,0"' in cell and 'data-share="0.9000"' in cell
    assert "1,200 notified, 2,400 suppressed" in cell, "the last whole minute's"
    assert 'title="00:08 UTC: 1,200 notified, 2,400 suppressed"' in cell
    assert "⚠ fires on 90% of payments (3,600 of 4,000)" in cell
    quiet = html.split('data-testid="rates-5"')[1].split("</td>")[0]
    assert "fires-often" not in quiet and "0 notified, 0 suppressed" in quiet
    caption = html.split('data-testid="rates-caption">')[1].split("</p>")[0]
    assert "behind Redis by up to 30 s (write_behind_seconds)" in caption
    assert "suppressed alerts are only there" in caption
    assert "cannot read" in _page(rates_error="cannot read the alerts a minute: boom")


def test_the_window_lookup_shows_its_value_as_a_number_and_its_times_as_dates() -> None:
    found = {
        "ruleId": 1, "key": {"payerId": "p-1"}, "aggregateValue": "250000.5",
        "windowStart": NOW - 86_400_000, "windowEnd": NOW,
    }  # fmt: skip
    html = lookup_html(found)
    assert (
        '<td class="figure" data-testid="lookup-value" data-value="250000.5">250,000.5</td>' in html
    )
    assert "2025-12-31 00:00:00.000Z … 2026-01-01 00:00:00.000Z" in html
    assert '<span class="kv">payerId=p-1</span>' in html and "{" not in html
    empty = lookup_html({**found, "aggregateValue": None})
    assert "none (an empty window)" in empty
    page = _page(lookup=found, lookup_form={"lookup_rule": "1"}, params={"case_rule": "4"})
    form = page.split('data-testid="lookup"')[1].split("</form>")[0]
    assert '<input type="hidden" name="case_rule" value="4">' in form


def test_a_backfill_is_started_from_the_page_s_own_form() -> None:
    html = _page(params={"rule": "4"}, backfill_form={"rule_ids": ["5"], "to_time": "<x>"})
    form = html.split('data-testid="backfill-form"')[1].split("</form>")[0]
    assert 'action="/velocity/backfills"' in html
    assert 'value="4" data-testid="backfill-rule-4">' in form
    assert 'value="5" checked data-testid="backfill-rule-5">' in form
    assert 'value="&lt;x&gt;" data-testid="backfill-to_time"' in form
    assert '<input type="hidden" name="back" value="rule=4">' in form
    assert "backfill-form" not in _page(can_edit=False)


def test_the_backfill_form_becomes_the_dag_s_conf_or_names_its_field() -> None:
    from velocity.errors import UsageError
    from velocity_airflow.page.backfills import backfill_conf

    conf = backfill_conf(["7", "5", " "], "2026-01-01 10:05", "2026-01-01 11:00")
    assert conf == {
        "from_time": "2026-01-01T10:05:00.000Z",
        "to_time": "2026-01-01T11:00:59.999Z",  # a minute written covers the whole minute
        "rule_ids": ["5", "7"],
    }
    assert backfill_conf([], "", "") == {"from_time": None, "to_time": None, "rule_ids": None}
    for args, words in [
        (([], "2026-01-01", ""), "give both From and To"),
        (([], "yesterday", "2026-01-01"), "field 'from': 'yesterday' is not a time"),
        (([], "2026-01-02", "2026-01-01"), "is after To"),
        ((["x"], "", ""), r"Rules\[0\] must be an integer"),
    ]:
        with pytest.raises(UsageError, match=words):
            backfill_conf(*args)


def test_a_click_is_timed_from_the_browser_to_the_server_once() -> None:
    from fastapi.testclient import TestClient

    from velocity_airflow.page import access
    from velocity_airflow.page.app import app

    app.dependency_overrides[access.current_user] = Analyst
    try:
        client = TestClient(app, follow_redirects=False)
        clicked = int(time.time() * 1000) - 250
        cookie = {"cookie": f"other=1; velocity_click=k1x.{clicked}.pause-4"}
        # Refused by the write check (no session, no bearer token), but the user is known
        # (the overridden current_user): timed.
        client.post("/rules/4/pause", headers=cookie)
        client.get("/api/page/live", headers=cookie)  # the feed is never a click's answer
        client.get("/api/clicks", headers=cookie)  # the same click again: noted once
        [noted] = client.get("/api/clicks", params={"what": "pause-4"}).json()
        assert (noted["method"], noted["path"]) == ("POST", "/rules/4/pause")
        assert noted["clickedAt"] == clicked
        assert 250 <= noted["delayMs"] < 10_000
        assert noted["receivedAt"] - noted["clickedAt"] == pytest.approx(noted["delayMs"], abs=1)
    finally:
        app.dependency_overrides.clear()


# --- the routes over real Delta tables ------------------------------------------------


def _cases_settings(data_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Rules 4 and 5 in the rules table; payers p1 (three alerts) and p2 (one) gathered
    into their cases as the stream's write-behind does, their alerts in the alerts table
    and their payments in the events table."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from velocity.delta.case_store import CaseStore
    from velocity.delta.names import ALERTS, EVENTS, RULES
    from velocity.delta.rule_store import RuleStore
    from velocity.delta.write_behind import ARROW_SCHEMAS
    from velocity_airflow.page import access

    RuleStore(data_settings.table_path(RULES)).apply(
        [make_rule(ruleId=4), make_rule(ruleId=5, outcome="BLOCK")]
    )
    alerts = [("a1", 4, "t1", "p1"), ("a2", 5, "t1", "p1"), ("a3", 4, "t2", "p1")]
    alerts.append(("a4", 4, "t3", "p2"))
    now = int(time.time() * 1000)
    rows = [
        {**alert_row(a, (rule, 1), now + i, transaction_id=tx), "key": [("payerId", payer)],
         "shadow": False, "suppressed": a == "a3", "suppressedBy": "t1" if a == "a3" else None,
         "caseId": None, "outcome": "BLOCK" if rule == 5 else "ALERT"}
        for i, (a, rule, tx, payer) in enumerate(alerts)
    ]  # fmt: skip
    payers = {tx: payer for _, _, tx, payer in alerts}
    events = pa.Table.from_pylist(
        [
            {
                "transactionId": tx,
                "eventTime": now - 5,
                "payerId": payer,
                "beneficiaryId": "b",
                "paymentAmount": Decimal("100.5"),
                "paymentType": "CRD",
                "ip": None,
                "deviceId": None,
                "action": None,
                "raw": "{}",
                "source_file": "f",
                "source_block": 0,
                "line_seq": i,
                "ingest_time": now,
                "stream_batch": 1,
            }
            for i, (tx, payer) in enumerate(payers.items())
        ],
        ARROW_SCHEMAS["events"],
    )
    gathered = CaseStore(data_settings).gather_alerts(
        pa.Table.from_pylist(rows, ARROW_SCHEMAS["alerts"]), events, batch=1
    )
    write_deltalake(str(data_settings.table_path(ALERTS)), gathered)
    write_deltalake(str(data_settings.table_path(EVENTS)), events)
    monkeypatch.setattr(access, "settings", lambda: data_settings)
    monkeypatch.setattr(access, "can_edit", lambda user: True)
    return data_settings


@pytest.mark.redis
def test_an_analyst_works_the_queue_in_process(
    data_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue lists both cases; p1's page shows its three alerts (one suppressed), its
    two payments and its history; assign, close (every alert reviewed), reopen and a bulk
    close each come back to the page's URL with what happened; a bad verdict closes
    nothing and says so; the JSON lists the same cases; the rules' figures count the
    alerts a minute."""
    from fastapi.testclient import TestClient

    from velocity.delta.case_store import CaseStore
    from velocity.delta.reader import review_store
    from velocity_airflow.page import access, common, flash, live
    from velocity_airflow.page.app import app

    settings = _cases_settings(data_settings, monkeypatch)
    monkeypatch.setattr(live, "_LIVE_SECONDS", 1.5)
    reviewer = access.Reviewer.__metadata__[0].dependency
    app.dependency_overrides.update({access.current_user: Analyst, reviewer: Analyst})

    def said(reply: Any) -> tuple[str, str]:
        assert reply.status_code == 303, reply.text
        shown = flash.unseal(reply.cookies[flash.COOKIE].strip('"'), common.flash_key())
        assert shown is not None
        return reply.headers["location"], shown.text

    try:
        client = TestClient(app, follow_redirects=False)
        html = client.get("/", params={"rule": "4"}).text
        assert html.count('<tr data-testid="queue-row"') == 2
        by_key = {c.key["payerId"]: c for c in CaseStore(settings).cases().values()}
        p1 = by_key["p1"]
        row = html.split(f'data-case-id="{p1.case_id}"')[1].split("</tr>")[0]
        assert "<b>×2</b>" in row and "<b>×1</b>" in row
        assert 'data-testid="case-amount">201' in row, "t1 once, though it fired two rules"
        rates = html.split('data-testid="rates-4"')[1].split("</td>")[0]
        assert "⚠ fires on 100% of payments (3 of 3)" in rates
        # p1's rule 5 alert is BLOCK: so is its case, first when sorted by outcome.
        assert (p1.outcome.value, by_key["p2"].outcome.value) == ("BLOCK", "ALERT")
        assert 'data-outcome="BLOCK"' in row
        blocked = client.get("/api/cases", params={"case_outcome": "BLOCK"}).json()
        assert [c["caseKey"] for c in blocked["cases"]] == [{"payerId": "p1"}]
        assert blocked["cases"][0]["outcome"] == "BLOCK"
        by_outcome = client.get("/api/cases", params={"case_sort": "outcome"}).json()["cases"]
        assert [c["caseKey"]["payerId"] for c in by_outcome] == ["p1", "p2"]

        shown = client.get(f"/cases/{p1.case_id}", params={"rule": "4"}).text
        assert shown.count('data-testid="case-alert"') == 3
        assert shown.count("data-suppressed=1") == 1
        assert shown.count('data-testid="case-payment"') == 2
        # A row a payment (t1 fired two rules: one row, two alerts), paged by payment.
        assert shown.count('data-testid="case-payment-alerts"') == 2
        t1 = shown.split('data-testid="case-payment-alerts" data-tx="t1"')[1].split("</tr>")[0]
        assert t1.count('data-testid="case-alert"') == 2
        first = client.get(f"/cases/{p1.case_id}", params={"rule": "4", "alerts_limit": "1"})
        assert first.text.count('data-testid="case-payment-alerts"') == 1
        older = re.search(r'href="([^"]+)" data-testid="case-alerts-older"', first.text)
        assert older is not None and "alerts_limit=1" in older[1] and "rule=4" in older[1]
        second = client.get(older[1].replace("&amp;", "&").removeprefix("/velocity")).text
        assert second.count('data-testid="case-payment-alerts"') == 1
        assert 'data-testid="case-alerts-older"' not in second
        assert 'data-testid="case-alerts-newest"' in second
        rows = [
            re.findall(r'case-payment-alerts" data-tx="(\w+)"', t) for t in (first.text, second)
        ]
        assert sorted(rows[0] + rows[1]) == ["t1", "t2"]
        bad = client.get(f"/cases/{p1.case_id}", params={"alerts_before": "x"}).text
        assert "field &#x27;alerts_before&#x27;" in bad
        explained = client.get(f"/cases/{p1.case_id}", params={"alert": "a1"}).text
        assert 'id="explanation"' in explained
        assert client.get("/cases/nope").status_code == 404

        # The assignee is chosen from the users Airflow knows (the test env's
        # simple_auth_manager_users: admin, viewer) and anyone assigned already.
        assign_form = shown.split('data-testid="assign-form"')[1].split("</form>")[0]
        assert '<select name="assignee" data-testid="assignee"' in assign_form
        assert '<option value="admin">admin</option>' in assign_form
        assert '<option value="ana" selected>ana</option>' in assign_form, "the user, chosen"
        where, text = said(
            client.post(
                f"/cases/{p1.case_id}/assign",
                data={"assignee": "bo", "back": "rule=4", "return_to": "case"},
            )
        )
        assert where == f"/velocity/cases/{p1.case_id}?rule=4"
        assert text.startswith("error: field 'assignee': 'bo' is not a user Airflow knows")
        assert "choose one of admin, ana, viewer; the case is unchanged" in text
        assert CaseStore(settings).case(p1.case_id).assignee is None
        where, text = said(
            client.post(
                f"/cases/{p1.case_id}/assign",
                data={"assignee": " Viewer ", "back": "rule=4", "return_to": "case"},
            )
        )
        assert where == f"/velocity/cases/{p1.case_id}?rule=4"
        assert text == "case payerId=p1: assigned to viewer", "as Airflow spells the name"
        assert CaseStore(settings).case(p1.case_id).assignee == "viewer"
        where, text = said(
            client.post(f"/cases/{p1.case_id}/close", data={"verdict": "fraud", "back": "rule=4"})
        )
        assert where == "/velocity/?rule=4" and "field 'verdict'" in text
        assert not review_store(settings).all(), "nothing closed, nothing reviewed"
        where, text = said(
            client.post(
                f"/cases/{p1.case_id}/close",
                data={"verdict": "CONFIRMED_FRAUD", "note": "card stolen", "back": "rule=4"},
            )
        )
        assert (where, text) == (
            "/velocity/?rule=4",
            "case payerId=p1: closed: confirmed fraud, by ana",
        )
        assert {r.alert_id for r in review_store(settings).all()} == {"a1", "a2", "a3"}
        assert [c["caseKey"] for c in client.get("/api/cases").json()["cases"]] == [
            {"payerId": "p2"}
        ]
        _, text = said(client.post(f"/cases/{p1.case_id}/reopen", data={"return_to": "case"}))
        assert text == "case payerId=p1: reopened"

        _, text = said(client.post("/cases/close", data={"verdict": "FALSE_POSITIVE"}))
        assert text == "error: no case selected; tick the cases to close"
        where, text = said(
            client.post(
                "/cases/close",
                data={
                    "case_id": [p1.case_id, by_key["p2"].case_id],
                    "verdict": "false positive",
                    "back": "case_status=all&rule=4",
                },
            )
        )
        assert where == "/velocity/?case_status=all&rule=4"
        assert text == "2 cases closed: false positive (4 alerts reviewed), by ana"
        listed = client.get("/api/cases", params={"case_status": "closed"}).json()
        assert {c["verdict"] for c in listed["cases"]} == {"FALSE_POSITIVE"}
        assert client.get("/api/cases", params={"case_status": "x"}).status_code == 400

        rows = client.get("/cases/rows", params={"case_status": "all"}).json()
        assert rows["matching"] == 2 and rows["html"].count('data-testid="queue-row"') == 2
        assert rows["asOf"] >= max(c.latest_activity_at for c in by_key.values())
        live = client.get("/api/page/live", params={"case_status": "all", "cases_since": "0"})
        assert "event: cases" in live.text and '"count": 2' in live.text
        # Alerts published after the page was drawn are counted, those of its filter only.
        from velocity.redis import alert_feed, mirror

        redis_client = mirror.connect(settings)
        after = alert_feed.last_entry_id(redis_client, settings.alert_stream)
        for n, rule in enumerate((4, 5, 4)):
            record = {**alert_row(f"new-{n}", (rule, 1), now_ms()), "key": {"payerId": "p1"}}
            record.pop("signature_id")
            redis_client.xadd(settings.alert_stream, {"alert": json.dumps(record), "batch": "9"})
        counted = client.get("/api/page/live", params={"rule": "4", "after": after}).text
        said = [e for e in counted.split("\n\n") if e.startswith("event: alerts")]
        assert len(said) == 1 and '"count": 2' in said[0], counted
        assert "id: " in said[0], "the position the browser resumes from"
        refused = client.get("/api/page/live", params={"rule": "4"})
        assert refused.status_code == 400 and "'after'" in refused.text
    finally:
        app.dependency_overrides.clear()


def test_the_case_routes_need_a_login() -> None:
    from fastapi.testclient import TestClient

    from velocity_airflow.page.app import app

    client = TestClient(app)
    for path in ("/cases/c-1", "/cases/rows", "/alerts/rows", "/api/cases", "/api/clicks"):
        assert client.get(path).status_code == 401, path
    for path in ("/cases/close", "/cases/c-1/close", "/cases/c-1/assign", "/backfills"):
        assert client.post(path).status_code == 401, path


IN_PLACE = {"X-Velocity-In-Place": "1"}


@pytest.mark.redis
def test_each_click_answers_only_what_it_changed_in_process(
    data_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the page's script (X-Velocity-In-Place), assign, close, reopen, a bulk close,
    pause and delete answer JSON: the outcome and the parts of the page each changed (a
    case's title, facts and history, its alerts after a close; the queue; a rule's row),
    no flash cookie and no redirect, and write nothing but their change; a refusal is a
    409 (or 422 for a rule) saying why, the case drawn as it is. The queue's filter and
    the window lookup read their part."""
    from fastapi.testclient import TestClient

    from velocity.delta.case_store import CaseStore
    from velocity.delta.names import RULES
    from velocity.delta.reader import review_store
    from velocity.delta.rule_store import RuleStore
    from velocity_airflow.page import access, common
    from velocity_airflow.page.app import app

    settings = _cases_settings(data_settings, monkeypatch)
    reviewer = access.Reviewer.__metadata__[0].dependency
    editor = access.Editor.__metadata__[0].dependency
    app.dependency_overrides.update(
        {access.current_user: Analyst, reviewer: Analyst, editor: Analyst}
    )
    store, rules = CaseStore(settings), RuleStore(settings.table_path(RULES))
    by_key = {c.key["payerId"]: c for c in store.cases().values()}
    p1, p2 = by_key["p1"].case_id, by_key["p2"].case_id

    def written() -> tuple[int, int, int]:
        """Case events, reviews and rule versions: what a click may write."""
        return len(store.events()), len(review_store(settings).all()), len(rules.history())

    def in_place(reply: Any, status: int = 200) -> dict[str, Any]:
        assert reply.status_code == status, reply.text
        assert reply.headers["content-type"] == "application/json"
        assert "set-cookie" not in reply.headers, "no flash: the script says the outcome"
        return dict(reply.json())

    try:
        client = TestClient(app, follow_redirects=False)
        page = client.get("/", params={"rule": "4"}).text
        # What the script draws in place is marked on the page, and the forms that ask.
        for part in ('data-part="queue"', 'data-part="rule-4"', 'data-part="lookup-result"'):
            assert part in page, part
        assert 'data-in-place="/velocity/queue" data-owns="case_rule ' in page
        assert 'data-in-place="/velocity/lookup" data-owns="lookup_rule lookup_key alert"' in page
        assert page.count("data-in-place>") >= 3, "pause, delete, outcome, bulk close"
        case_page = client.get(f"/cases/{p1}", params={"rule": "4"}).text
        for part in ("case-title", "case-state", "case-alerts", "case-history"):
            assert f'data-part="{part}"' in case_page, part

        before = written()
        assigned = in_place(
            client.post(
                f"/cases/{p1}/assign",
                data={"assignee": "viewer", "back": "rule=4", "return_to": "case"},
                headers=IN_PLACE,
            )
        )
        assert assigned["ok"] and assigned["text"] == "case payerId=p1: assigned to viewer"
        parts = assigned["parts"]
        assert set(parts) == {"case-title", "case-state", "case-history"}, "not its alerts"
        assert parts["case-title"].startswith('<h1 data-part="case-title"')
        assert 'data-status="assigned"' in parts["case-title"]
        assert "<th>assignee</th><td>viewer</td>" in parts["case-state"]
        assert '<option value="viewer" selected>' in parts["case-state"]
        assert 'value="rule=4"' in parts["case-state"], "its forms keep the page's URL"
        assert parts["case-history"].count('data-testid="case-history-row"') == 2
        assert written() == (before[0] + 1, before[1], before[2]), "one case event, no more"

        unknown = client.post(f"/cases/{p1}/assign", data={"assignee": "bo"}, headers=IN_PLACE)
        refused = in_place(unknown, 409)
        assert not refused["ok"] and "'bo' is not a user Airflow knows" in refused["text"]
        wrong = in_place(
            client.post(f"/cases/{p1}/close", data={"verdict": "fraud"}, headers=IN_PLACE), 409
        )
        assert "field 'verdict'" in wrong["text"]
        assert 'data-status="assigned"' in wrong["parts"]["case-title"], "drawn as it is"
        assert written() == (before[0] + 1, before[1], before[2]), "refused: nothing written"

        closed = in_place(
            client.post(
                f"/cases/{p1}/close",
                data={"verdict": "CONFIRMED_FRAUD", "note": "card stolen", "back": "rule=4"},
                headers=IN_PLACE,
            )
        )
        assert closed["text"] == "case payerId=p1: closed: confirmed fraud, by ana"
        parts = closed["parts"]
        assert set(parts) == {"case-title", "case-state", "case-history", "case-alerts"}
        assert 'data-status="closed"' in parts["case-title"]
        assert 'data-testid="reopen-submit"' in parts["case-state"]
        assert 'data-testid="close-form"' not in parts["case-state"]
        assert parts["case-alerts"].count("confirmed fraud") == 3, "each alert reviewed"
        assert written() == (before[0] + 2, before[1] + 3, before[2])
        again = client.post(
            f"/cases/{p1}/close", data={"verdict": "FALSE_POSITIVE"}, headers=IN_PLACE
        )
        conflict = in_place(again, 409)
        assert "is closed already" in conflict["text"], conflict
        assert 'data-status="closed"' in conflict["parts"]["case-title"]
        reopened = in_place(
            client.post(f"/cases/{p1}/reopen", data={"return_to": "case"}, headers=IN_PLACE)
        )
        assert reopened["text"] == "case payerId=p1: reopened"
        assert 'data-status="assigned"' in reopened["parts"]["case-title"], "to its assignee"
        assert 'data-testid="close-form"' in reopened["parts"]["case-state"]
        assert written() == (before[0] + 3, before[1] + 3, before[2])

        # The bulk close (the queue's keys too): the queue drawn again for the page's URL.
        none = in_place(client.post("/cases/close", data={"verdict": "x"}, headers=IN_PLACE), 409)
        assert none["text"] == "error: no case selected; tick the cases to close"
        bulk = in_place(
            client.post(
                "/cases/close",
                data={"case_id": [p2], "verdict": "FALSE_POSITIVE", "back": "rule=4"},
                headers=IN_PLACE,
            )
        )
        assert bulk["text"].startswith("case payerId=p2 closed: false positive (1 alerts")
        queue = bulk["parts"]["queue"]
        assert set(bulk["parts"]) == {"queue"} and queue.startswith('<div data-part="queue">')
        assert re.findall(r'data-case-id="([^"]+)"', queue) == [p1], "p2 closed: gone"
        assert '<input type="hidden" name="rule" value="4">' in queue, "the URL kept"
        assert written() == (before[0] + 4, before[1] + 4, before[2])

        # The filter reads the queue's part and the live feed of that filter.
        shown = in_place(client.get("/queue", params={"case_status": "closed", "rule": "4"}))
        assert shown["ok"] and shown["live"] == "/velocity/api/page/live?case_status=closed&rule=4"
        assert re.findall(r'data-case-id="([^"]+)"', shown["parts"]["queue"]) == [p2]
        bad = in_place(client.get("/queue", params={"case_status": "pending"}), 400)
        assert 'data-testid="queue-filter-error"' in bad["parts"]["queue"]
        looked = in_place(
            client.get("/lookup", params={"lookup_rule": "x", "lookup_key": "a=1"}), 400
        )
        assert "ruleId must be a number" in looked["parts"]["lookup-result"]
        assert looked["parts"]["lookup-result"].startswith('<div data-part="lookup-result">')

        # A rule's pause: its row, paused, with its alerts a minute; a delete removes it.
        paused = in_place(client.post("/rules/4/pause", headers=IN_PLACE))
        row = paused["parts"]["rule-4"]
        assert set(paused["parts"]) == {"rule-4"} and "ruleId 4: version 2 PAUSE" in paused["text"]
        assert row.startswith('<tr data-testid="rule-4" data-part="rule-4">')
        assert '<td class="state-PAUSE">PAUSE</td>' in row and 'data-testid="activate-4"' in row
        assert 'data-testid="rates-4"' in row
        unknown_rule = in_place(client.post("/rules/9/pause", headers=IN_PLACE), 422)
        assert not unknown_rule["ok"] and unknown_rule["text"].startswith("error: ")
        assert unknown_rule["parts"] == {"rule-9": ""}, "no such rule in force"
        deleted = in_place(client.post("/rules/5/delete", headers=IN_PLACE))
        assert deleted["parts"] == {"rule-5": ""}
        assert written() == (before[0] + 4, before[1] + 4, before[2] + 2)
        # Without the script's header: the redirect back to the page, as a plain form.
        plain = client.post("/rules/4/activate", data={"back": "rule=4"})
        assert plain.status_code == 303 and plain.headers["location"] == "/velocity/?rule=4"
        assert common.IN_PLACE_HEADER == "X-Velocity-In-Place"
    finally:
        app.dependency_overrides.clear()
