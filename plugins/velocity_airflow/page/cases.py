"""The queue of cases (``velocity.analyst.case_queue``, the cases read through
``velocity.delta.case_store``) and a case's own page: its alerts, payments and history;
assigned, closed with a verdict (which reviews each of its alerts) or reopened here."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Form, HTTPException, Request, status
from fastapi.responses import HTMLResponse, Response

from velocity.analyst.alert_search import InvalidFilterError
from velocity_airflow.page import access, alerts, cases_html, common, flash
from velocity_airflow.page.common import URL_PREFIX
from velocity_airflow.page.home_html import PageData, explanation_section, live_url, render_case

router = APIRouter()
# Assigning, closing and reopening a case: an analyst's change, as a review is.
changes = APIRouter(dependencies=[access.REVIEW])


def queue(
    settings: Any, data: PageData, history: Any
) -> tuple[cases_html.QueueView | None, Any, str | None]:
    """The queue's view, the page of cases the URL asks for, and what went wrong (a
    filter that cannot be read names its field; the form keeps what was written)."""
    from velocity.analyst.case_queue import CaseFilter, CaseQuery, parse_case_query, queue_page

    rule_ids = sorted({r.rule_id for r in history or []})
    view = cases_html.QueueView(
        base=URL_PREFIX,
        can_edit=data.can_edit,
        user=data.user,
        now_ms=data.now_ms,
        params=data.params,
        rule_versions=data.rule_versions,
        rule_ids=rule_ids,
        write_behind_seconds=settings.write_behind_seconds,
        csrf=data.csrf,
    )
    try:
        view.query = parse_case_query(data.params, None if history is None else set(rule_ids))
    except InvalidFilterError as exc:
        view.query = CaseQuery(CaseFilter(text=_case_text(data.params)))
        return view, None, str(exc)
    cases, error = common.read("cases", lambda: all_cases(settings))
    if cases is None:
        return view, None, error
    view.as_of = _newest_activity(cases)
    view.assignees = assignees(data.user, cases)
    return view, queue_page(cases, view.query), None


def assignees(user: str, cases: Iterable[Any]) -> cases_html.Assignees:
    """Who a case may be assigned to: the users Airflow's auth manager knows, anyone a case
    is assigned to, and the signed-in user; a closed list when the auth manager lists its
    users (SimpleAuthManager), else names offered, any accepted."""
    listed = access.known_users()
    names = {*(listed or ()), *(c.assignee for c in cases if c.assignee), user}
    return cases_html.Assignees(tuple(sorted(names, key=str.casefold)), listed is not None)


def chosen_assignee(given: str, known: cases_html.Assignees) -> str:
    """The name ``given`` as the known users spell it (any case); ``UsageError`` for a
    name nobody knows, when the list is closed."""
    from velocity.errors import UsageError

    name = given.strip()
    if not known.closed or not name:
        return name  # an empty name: the case store's own refusal says what is wrong
    found = next((n for n in known.names if n.casefold() == name.casefold()), None)
    if found is None:
        shown = ", ".join(known.names)
        raise UsageError(
            f"field 'assignee': {name!r} is not a user Airflow knows nor anyone a case is "
            f"assigned to; choose one of {shown}; the case is unchanged"
        )
    return found


def _case_text(params: Mapping[str, str]) -> dict[str, str]:
    from velocity.analyst.case_queue import CASE_FILTER_FIELDS

    return {k: params[k] for k in CASE_FILTER_FIELDS if params.get(k)}


def all_cases(settings: Any) -> list[Any]:
    from velocity.delta.case_store import CaseStore

    return list(CaseStore(settings).cases().values())


def _newest_activity(cases: list[Any]) -> int:
    from velocity.analyst.case_queue import newest_activity

    return newest_activity(cases)


def _page_view(
    request: Request, user: Any, settings: Any, params: Mapping[str, str] | None = None
) -> tuple[PageData, Any]:
    """What the queue and the alerts need of the page (user, URL parameters, rule
    versions) without the rest of the page's reads; and every rule version. ``params``:
    the page's URL parameters when not the request's (a change's ``back``)."""
    from velocity.delta.reader import rule_history

    history = rule_history(settings)
    data = PageData(
        user=user.get_name(),
        can_edit=access.can_edit(user),
        base=URL_PREFIX,
        params=common.params(request.query_params) if params is None else dict(params),
        now_ms=int(time.time() * 1000),
        csrf=access.csrf_token(request),
    )
    data.rule_versions = {(r.rule_id, r.version): r for r in history}
    return data, history


def _case_view(
    request: Request,
    user: Any,
    case_id: str,
    params: Mapping[str, str] | None = None,
    alerts_read: bool = True,
) -> cases_html.CaseView:
    """What a case's page shows (``params``: the page's URL parameters when not the
    request's); its alerts, payments and an explanation asked for only when
    ``alerts_read`` (an assign or a reopen changes none of them)."""
    from velocity.analyst.payment_groups import (
        parse_payment_cursor,
        parse_payment_limit,
        read_payment_page,
    )
    from velocity.delta.case_store import CaseStore
    from velocity.delta.reader import case_alerts, case_payments
    from velocity.errors import UsageError

    settings = access.settings()
    data, history = _page_view(request, user, settings, params)
    view, _, _ = queue(settings, data, history)
    if view is None:
        raise HTTPException(status.HTTP_500_INTERNAL_SERVER_ERROR, "no queue")
    try:
        case = CaseStore(settings).case(case_id)
    except UsageError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc
    shown = cases_html.CaseView(case=case, queue=view)
    if not alerts_read:
        return shown
    # The page's payments and their alerts, from the case's newest alerts read alone (more
    # only as a page further down needs): the page costs the same whatever the alerts
    # table holds.
    try:
        before_text = data.params.get("alerts_before", "").strip()
        before = parse_payment_cursor(before_text) if before_text else None
        limit = parse_payment_limit(data.params.get("alerts_limit", "").strip() or None)
    except InvalidFilterError as exc:
        shown.alerts_error = str(exc)
    else:
        page, shown.alerts_error = common.read(
            "the case's alerts",
            lambda: read_payment_page(
                lambda n: case_alerts(settings, case_id, newest=n), before, limit
            ),
        )
        shown.payment_page = page
        shown.alerts = [a for g in page.payments for a in g.alerts] if page else []
    paid = {str(a["transactionId"]) for a in shown.alerts}
    times = {int(a["eventTime"]) for a in shown.alerts}
    payments, shown.payments_error = common.read(
        "the case's payments", lambda: case_payments(settings, case.key, paid, times)
    )
    shown.payments = payments or []
    reviews, _ = common.read("reviews", lambda: alerts.latest_reviews(settings))
    shown.reviews = reviews or {}
    alert_id = data.params.get("alert")
    if alert_id:
        explained, error = common.read("explanation", lambda: alerts.explain(settings, alert_id))
        shown.explanation_html = explanation_section(explained, error)
    return shown


def _case_page(request: Request, user: Any, case_id: str) -> HTMLResponse:
    shown = _case_view(request, user, case_id)
    sealed = request.cookies.get(flash.COOKIE)
    said = flash.unseal(sealed, common.flash_key()) if sealed else None
    response = HTMLResponse(render_case(shown, said))
    if sealed:
        response.delete_cookie(flash.COOKIE, path=URL_PREFIX)  # shown once
    return response


def _case_words(case: Any) -> str:
    from velocity.analyst.alert_search import key_text

    return f"case {key_text(case.key)}"


def _case_change(
    request: Request,
    user: Any,
    case_id: str,
    back: str,
    return_to: str,
    change: Callable[[Any], Any],
    said: str,
    alerts_changed: bool = False,
) -> Response:
    """A case's change, answered by the redirect back to the page it came from (the case's
    with ``return_to`` "case", else the queue), or, in place, by the case's parts as they
    are after it (its alerts too when ``alerts_changed``: a close reviews each)."""
    from velocity.delta.case_store import CaseStore
    from velocity.errors import UsageError

    path = f"/cases/{quote(case_id, safe='')}" if return_to == "case" else "/"

    def parts() -> common.Parts:
        params = common.params_of(back)
        view = _case_view(request, user, case_id, params, alerts_read=alerts_changed)
        return cases_html.case_parts(view, alerts=alerts_changed)

    try:
        case = change(CaseStore(access.settings()))
    except UsageError as exc:
        return common.answer(request, False, f"error: {exc}", back, path, parts)
    return common.answer(request, True, f"{_case_words(case)}: {said}", back, path, parts)


def _queue_part(
    request: Request, user: Any, params: Mapping[str, str]
) -> tuple[str, str, str | None]:
    """The queue's section for the page's URL parameters ``params``, the page's live feed
    with its filter (``home_html.live_url``), and what went wrong (a filter field)."""
    settings = access.settings()
    data, history = _page_view(request, user, settings, params)
    view, page, error = queue(settings, data, history)
    if view is None:
        raise HTTPException(status.HTTP_500_INTERNAL_SERVER_ERROR, error or "no queue")
    return cases_html.queue_part(page, view, error), live_url(data), error


@router.get("/queue")
def queue_part_json(request: Request, user: access.User) -> Response:
    """The queue's section for the URL's filter, order and page (the page's filter, a
    column's head and its paging links read it in place): ``parts.queue``, and ``live``,
    the page's live feed for that filter; 400 (``ok`` false) names a field that is wrong,
    the section saying so beside the form."""
    html, live, error = _queue_part(request, user, common.params(request.query_params))
    refused = status.HTTP_400_BAD_REQUEST
    return common.parts_json(error is None, "", {"queue": html}, refused, live=live)


@router.get("/cases/rows")
def queue_rows_json(request: Request, user: access.User) -> dict[str, Any]:
    """The queue's rows as the page draws them (its filter and page, from the URL), for the
    open page to show on request: ``html``, ``asOf`` (the newest case activity: changes
    after it count as updates), ``matching``. 400 names a filter field that is wrong."""
    settings = access.settings()
    data, history = _page_view(request, user, settings)
    view, page, error = queue(settings, data, history)
    if error or view is None or page is None:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, error or "no queue")
    return {
        "html": cases_html.queue_rows(page.cases, view),
        "asOf": view.as_of,
        "matching": page.matching,
    }


@router.get("/cases/{case_id}", response_class=HTMLResponse)
def case_page(case_id: str, request: Request, user: access.User) -> HTMLResponse:
    """A case: its facts, its alerts (each explained on request, ``?alert=ID``), its
    payments and its history; for an editor, assign, close with a verdict, reopen. The
    queue's URL parameters come along and go back with every link and form."""
    return _case_page(request, user, case_id)


@router.get("/api/cases")
def cases_json(request: Request) -> dict[str, Any]:
    """A page of the queue in ``case_sort``'s order (newest, oldest, amount, alerts,
    outcome; empty: newest activity first): ``case_rule``, ``case_status`` (open,
    assigned, closed, all; empty: not closed), ``case_assignee`` (a name, or none),
    ``case_key``, ``case_outcome``, ``case_limit`` (default 50, at most 200),
    ``case_before`` (the ``older`` of the previous page, in the same order). Each case
    as `velocity cases list --json` prints it; 400 names a bad field."""
    from velocity.analyst.case_queue import parse_case_query, queue_page
    from velocity.delta.reader import rule_history

    settings = access.settings()
    try:
        query = parse_case_query(
            common.params(request.query_params), {r.rule_id for r in rule_history(settings)}
        )
    except InvalidFilterError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc
    page = queue_page(all_cases(settings), query)
    return {
        "cases": [c.to_json() for c in page.cases],
        "older": None if page.older is None else page.older.text(),
        "matching": page.matching,
    }


@changes.post("/cases/close")
def close_cases(
    request: Request,
    user: access.Reviewer,
    case_id: Annotated[list[str] | None, Form()] = None,
    verdict: Annotated[str, Form()] = "",
    note: Annotated[str, Form()] = "",
    back: Annotated[str, Form()] = "",
) -> Response:
    """Close each selected case with the verdict (each reviews every alert of its case);
    the page says how many closed and why any did not."""
    from velocity.analyst.reviews import parse_verdict
    from velocity.delta.case_store import CaseStore
    from velocity.errors import UsageError

    def parts() -> common.Parts:
        return {"queue": _queue_part(request, user, common.params_of(back))[0]}

    chosen = list(dict.fromkeys(c for c in case_id or [] if c))
    if not chosen:
        text = "error: no case selected; tick the cases to close"
        return common.answer(request, False, text, back)
    try:
        words = parse_verdict(verdict).words
    except UsageError as exc:
        return common.answer(request, False, f"error: {exc}; no case closed", back)
    store = CaseStore(access.settings())
    closed, refused = [], []
    for one in chosen:
        try:
            closed.append(store.close(one, verdict, note.strip() or None, user.get_name()))
        except UsageError as exc:
            refused.append(f"case {one}: {exc}")
    # What the closes committed: alerts still in the stream's write-behind are reviewed as
    # they land, and said apart.
    reviewed = sum(c.reviewed for c in closed)
    pending = sum(c.being_written for c in closed)
    figures = f"{reviewed} alerts reviewed"
    if pending:
        figures += f", {pending} being written (reviewed as they land)"
    text = f"{len(closed)} cases closed: {words} ({figures}), by {user.get_name()}"
    if len(closed) == 1:
        text = f"{_case_words(closed[0])} closed: {words} ({figures}), by {user.get_name()}"
    return common.answer(request, not refused, "\n".join([text, *refused]), back, "/", parts)


@changes.post("/cases/{case_id}/close")
def close_case(
    case_id: str,
    request: Request,
    user: access.Reviewer,
    verdict: Annotated[str, Form()] = "",
    note: Annotated[str, Form()] = "",
    back: Annotated[str, Form()] = "",
) -> Response:
    """Close the case with the verdict and note, reviewing each of its alerts so; back to
    the queue (with its URL parameters)."""
    from velocity.analyst.reviews import Verdict

    words = {v.value: v.words for v in Verdict}.get(verdict.strip().upper(), verdict)
    return _case_change(
        request,
        user,
        case_id,
        back,
        "queue",
        lambda store: store.close(case_id, verdict, note.strip() or None, user.get_name()),
        f"closed: {words}, by {user.get_name()}",
        alerts_changed=True,
    )


@changes.post("/cases/{case_id}/assign")
def assign_case(
    case_id: str,
    request: Request,
    user: access.Reviewer,
    assignee: Annotated[str, Form()] = "",
    back: Annotated[str, Form()] = "",
    return_to: Annotated[str, Form()] = "",
) -> Response:
    """Assign the case to one of the users Airflow's auth manager knows (or anyone a case
    is assigned to already); an unknown name is refused, the case unchanged."""
    from velocity.errors import UsageError

    try:
        name = chosen_assignee(assignee, assignees(user.get_name(), all_cases(access.settings())))
    except UsageError as exc:
        path = f"/cases/{quote(case_id, safe='')}" if return_to == "case" else "/"
        return common.answer(request, False, f"error: {exc}", back, path)
    return _case_change(
        request,
        user,
        case_id,
        back,
        return_to,
        lambda store: store.assign(case_id, name, user.get_name()),
        f"assigned to {name}",
    )


@changes.post("/cases/{case_id}/reopen")
def reopen_case(
    case_id: str,
    request: Request,
    user: access.Reviewer,
    back: Annotated[str, Form()] = "",
    return_to: Annotated[str, Form()] = "",
) -> Response:
    return _case_change(
        request,
        user,
        case_id,
        back,
        return_to,
        lambda store: store.reopen(case_id, user.get_name()),
        "reopened",
    )
