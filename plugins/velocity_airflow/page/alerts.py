"""The alerts: a page of them from the alerts table and the Redis alert stream, an alert's
explanation, an analyst's review of one, and each rule version's precision."""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Annotated, Any

from fastapi import APIRouter, Form, HTTPException, Request, status
from fastapi.responses import RedirectResponse, Response

from velocity.analyst.alert_search import (
    FILTER_FIELDS,
    AlertFilter,
    AlertPage,
    Cursor,
    InvalidFilterError,
    page_of,
    parse_cursor,
    parse_filter,
    parse_limit,
)
from velocity_airflow.page import access, common
from velocity_airflow.page.alerts_html import AlertsView, alert_rows
from velocity_airflow.page.common import URL_PREFIX
from velocity_airflow.page.home_html import PageData

# How far back the alert stream is searched for a rule's alerts, and for the record of an
# alert to explain (older ones are in the alerts table).
_ALERTS_SEARCHED = 20_000
_EXPLAINED_SEARCHED = 5_000
# An alert is published to Redis after it is decided, and written to Delta behind Redis:
# a stream entry lies within this much of its alert's decisionTime, and the alerts table
# holds every alert decided this much before its newest one.
_SLACK_MS = 300_000
# Fields a published alert must have to be listed (SPEC §4).
_ALERT_FIELDS = frozenset(
    (
        "alertId",
        "kind",
        "ruleId",
        "ruleVersion",
        "transactionId",
        "key",
        "eventTime",
        "aggregateValue",
        "limitOperatorType",
        "limit",
        "decisionTime",
    )
)

router = APIRouter()
# Reviews: an analyst's change.
changes = APIRouter(dependencies=[access.REVIEW])


@dataclass(frozen=True)
class AlertSearch:
    """What a page of alerts was asked for (``velocity.analyst.alert_search``)."""

    query: AlertFilter
    before: Cursor | None
    limit: int


def alert_search(params: Mapping[str, str], rule_ids: Collection[int] | None) -> AlertSearch:
    """The filter, page boundary and page size of URL parameters (``InvalidFilterError``
    names the field at fault)."""
    before = params.get("before")
    return AlertSearch(
        parse_filter(params, rule_ids),
        parse_cursor(before) if before else None,
        parse_limit(params.get("limit")),
    )


def search_alerts(settings: Any, search: AlertSearch) -> tuple[AlertPage, str | None]:
    """A page of alerts from the alerts table (delta-rs) and the newest entries of the
    Redis alert stream that the stream has not written to Delta yet, each alertId once;
    and what could not be read (the page then lists what the other source holds)."""
    from velocity.delta.reader import TableAlerts, newest_alerts

    table, table_error = common.read(
        "alerts table",
        lambda: newest_alerts(settings, search.query, search.before, search.limit),
    )
    if table is None:
        table = TableAlerts([], False, None)
    published, stream_error = common.read(
        "alert stream in Redis",
        lambda: _stream_alerts(settings, search, table.newest),
    )
    page = page_of(
        (published or []) + table.alerts,
        search.query,
        search.before,
        search.limit,
        more=table.more,
    )
    return page, "; ".join(e for e in (table_error, stream_error) if e) or None


def _stream_alerts(settings: Any, search: AlertSearch, table_newest: int | None) -> list[dict]:
    """The alert stream's matching alerts below the page boundary, newest first: from the
    entries published up to a while after the boundary, back to a while before the alerts
    table's newest decision (older ones are in the table), at most ``_ALERTS_SEARCHED``."""
    from velocity.redis import alert_feed, mirror

    newest = "+" if search.before is None else str(search.before.decision_time + _SLACK_MS)
    entries = alert_feed.newest_entries(mirror.connect(settings), settings.alert_stream, newest)
    found: list[dict] = []
    for entry_id, fields in islice(entries, _ALERTS_SEARCHED):
        if table_newest is not None and alert_feed.entry_ms(entry_id) < table_newest - _SLACK_MS:
            break
        alert = published_alert(fields)
        if alert is None or not search.query.matches(alert):
            continue
        if search.before is not None and Cursor.of(alert) >= search.before:
            continue
        found.append(alert)
        if len(found) > search.limit:
            break
    return found


def published_alert(fields: Any) -> dict[str, Any] | None:
    """An entry of the alert stream as its record; None for an entry that is not one."""
    try:
        alert = json.loads(fields["alert"])
    except (KeyError, TypeError, ValueError):
        return None
    if not isinstance(alert, dict) or not alert.keys() >= _ALERT_FIELDS:
        return None
    return alert


def alert_on_stream(settings: Any, alert_id: str) -> dict[str, Any] | None:
    """The record of ``alert_id`` on the Redis alert stream (the newest entries only);
    None when it is not there or Redis cannot be read."""
    from velocity.redis import mirror

    try:
        entries = mirror.newest_alert_entries(mirror.connect(settings), settings.alert_stream)
        for fields in islice(entries, _EXPLAINED_SEARCHED):
            if alert_id in fields.get("alert", ""):  # parse only the one entry that names it
                alert = published_alert(fields)
                if alert is not None and alert["alertId"] == alert_id:
                    return alert
    except Exception:
        return None
    return None


def explain(settings: Any, alert_id: str) -> dict[str, Any]:
    from velocity.delta.reader import explain

    # The alert may be newer than the alerts table (written behind Redis): take it from
    # Redis when Redis has it; the alerts table answers for the rest, Redis or not.
    return explain(settings, alert_id, alert_on_stream(settings, alert_id)).to_json()


def record_review(settings: Any, user: Any, alert_id: str, verdict: str, note: str) -> Any:
    """Record ``user``'s review of ``alert_id`` (``InvalidReviewError`` names the field
    at fault, and nothing is written). The alert is looked up in the alerts table, and on
    the alert stream when the stream has not written it to Delta yet."""
    from velocity.analyst.reviews import AlertRef, check_fields
    from velocity.delta.reader import alert_ref, review_store

    check_fields(verdict, note, user.get_name())  # a bad field: no table read
    alert = alert_ref(settings, alert_id)
    if alert is None:
        published = alert_on_stream(settings, alert_id)
        if published is not None and published.keys() >= {"ruleVersion", "decisionTime"}:
            alert = AlertRef.of(published)
    return review_store(settings).record(alert_id, alert, verdict, note, user.get_name())


def reviewed(review: Any) -> str:
    return (
        f"alert {review.alert_id}: {review.verdict.words} (ruleId {review.rule_id} "
        f"v{review.rule_version}), recorded by {review.who}"
    )


def latest_reviews(settings: Any) -> Mapping[str, Any]:
    """The review that counts for each reviewed alert (the review store keeps them up to
    date as reviews are recorded: no read of every review)."""
    from velocity.delta.reader import review_store

    return review_store(settings).latest()


def precision(settings: Any, reviews: list[Any] | None = None) -> list[Any]:
    """Each rule version's figures as of now (``reviews``: every review, when read already)."""
    from velocity.delta.reader import precision_by_version

    return precision_by_version(settings, int(time.time() * 1000), reviews)


def alert_page(data: PageData, settings: Any, params: Mapping[str, str], history: Any) -> None:
    """The page of alerts the URL asks for, and the alert stream's position for the live
    updates of the newest page (read first: an alert published meanwhile comes twice, and
    the page lists it once)."""
    from velocity.redis import alert_feed, mirror

    try:
        search = alert_search(params, None if history is None else {r.rule_id for r in history})
    except InvalidFilterError as exc:
        data.filter_error = str(exc)
        # The form keeps what was written, so the person can correct it.
        data.alert_filter = AlertFilter(text={k: params.get(k, "") for k in FILTER_FIELDS})
        return
    data.alert_filter = search.query
    data.alert_limit = search.limit if params.get("limit") else None
    data.alerts_before = search.before
    if search.before is None:
        data.live_after, _ = common.read(
            "alert stream",
            lambda: alert_feed.last_entry_id(mirror.connect(settings), settings.alert_stream),
        )
    page, data.alerts_error = search_alerts(settings, search)
    data.alerts = page.alerts
    data.alerts_older = page.older


def search_or_400(params: Mapping[str, str], settings: Any) -> tuple[AlertSearch, Any]:
    """The search a request asks for and every rule version, or 400 naming the field."""
    from velocity.delta.reader import rule_history

    history = rule_history(settings)
    try:
        return alert_search(params, {r.rule_id for r in history}), history
    except InvalidFilterError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc


@router.get("/alerts/rows")
def alert_rows_json(request: Request, user: access.User) -> dict[str, Any]:
    """The newest page's alert rows as the page draws them (its filter, from the URL), for
    the open page to show on request: ``html``, ``position`` (the alert stream's position
    read before them: the alerts published after it are new), ``error``."""
    from velocity.redis import alert_feed, mirror

    settings = access.settings()
    search, history = search_or_400(request.query_params, settings)
    position, _ = common.read(
        "alert stream",
        lambda: alert_feed.last_entry_id(mirror.connect(settings), settings.alert_stream),
    )
    page, error = search_alerts(settings, AlertSearch(search.query, None, search.limit))
    reviews, _ = common.read("reviews", lambda: latest_reviews(settings))
    view = AlertsView(
        base=URL_PREFIX,
        can_edit=access.can_edit(user),
        query=search.query,
        rule_versions={(r.rule_id, r.version): r for r in history},
        limit=search.limit if request.query_params.get("limit") else None,
        kept=common.params(request.query_params),
        now_ms=int(time.time() * 1000),
        csrf=access.csrf_token(request),
    )
    html = alert_rows(page.alerts, view, reviews or {})
    return {"html": html, "position": position, "error": error}


@router.get("/api/alerts")
def alerts_json(request: Request) -> dict[str, Any]:
    """A page of alerts, newest first by decision time: ``rule``, ``kind``, ``key``
    (``payerId=p-1`` or a value), ``tx``, ``from`` and ``to`` (eventTime, UTC, inclusive),
    ``limit`` (default 50), ``before`` (the ``older`` of the previous page). 400 names a
    bad field."""
    settings = access.settings()
    search, _ = search_or_400(request.query_params, settings)
    page, error = search_alerts(settings, search)
    return {
        "alerts": list(page.alerts),
        "older": None if page.older is None else page.older.text(),
        "error": error,
    }


@router.get("/api/alerts/{alert_id}/explanation")
def explanation_json(alert_id: str) -> Response:
    from velocity.delta.reader import NotWrittenYetError
    from velocity.domain.decimals import dumps_json
    from velocity.errors import UsageError

    try:
        explained = explain(access.settings(), alert_id)
    except NotWrittenYetError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from exc
    except UsageError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc
    except ValueError as exc:  # a RETRACTION: explain the alert it withdraws
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc
    return Response(dumps_json(explained), media_type="application/json")


@router.get("/api/precision")
def precision_json() -> list[dict[str, Any]]:
    """Each rule version's alerts in the last 24 h and 7 days and its review figures."""
    return [p.to_json() for p in precision(access.settings())]


@changes.post("/alerts/{alert_id}/review")
def review_alert(
    alert_id: str,
    user: access.Reviewer,
    verdict: Annotated[str, Form()] = "",
    note: Annotated[str, Form()] = "",
    back: Annotated[str, Form()] = "",
) -> RedirectResponse:
    from velocity.errors import UsageError

    try:
        review = record_review(access.settings(), user, alert_id, verdict, note)
    except UsageError as exc:  # the page says which field is wrong; nothing was recorded
        return common.back(False, f"error: {exc}", back)
    return common.back(True, reviewed(review), back)


@changes.post("/api/alerts/{alert_id}/reviews", status_code=status.HTTP_201_CREATED)
def review_json(alert_id: str, user: access.Reviewer, body: dict[str, Any]) -> dict[str, Any]:
    """Record a review, ``{"verdict": ..., "note": ...}``: the review as recorded, or 400
    naming the field at fault (nothing recorded)."""
    from velocity.analyst.reviews import InvalidReviewError

    try:
        review = record_review(
            access.settings(), user, alert_id, body.get("verdict", ""), body.get("note", "")
        )
    except InvalidReviewError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc
    return dict(review.to_json())
