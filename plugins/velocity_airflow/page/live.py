"""The live feed, one per open page (server-sent events): what changed since the page was
drawn (alerts published, cases updated), and the stream's health; the page says so, and
draws its rows again only when asked."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from velocity.analyst.alert_search import AlertFilter, InvalidFilterError, parse_filter
from velocity_airflow.page import access, alerts, cases, common, health
from velocity_airflow.page.alerts_html import AlertsView, alert_row
from velocity_airflow.page.common import URL_PREFIX

# A live connection (server-sent events) ends after this long and the browser reconnects
# from where it was: an expired login, a closed tab or an api-server shutting down never
# holds one for longer. Each wait on the alert stream is at most _LIVE_BLOCK_MS.
_LIVE_SECONDS = 30.0
_LIVE_BLOCK_MS = 1000
_LIVE_HEALTH_SECONDS = 5.0
_STREAM_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")

# The live feed counts up to this many alert stream entries a read, and says how many came
# at most once a second (a storm of alerts is a number that grows, not a flood of rows).
_LIVE_COUNT = 2_000
_LIVE_SAY_SECONDS = 1.0
_LIVE_CASES_SECONDS = 2.0

router = APIRouter()


def _sse(event: str, data: Mapping[str, Any], entry_id: str | None = None) -> str:
    """One server-sent event; its id is the alert stream position the browser resumes at."""
    position = f"id: {entry_id}\n" if entry_id else ""
    return f"event: {event}\n{position}data: {json.dumps(data)}\n\n"


def _live_rows(
    entries: Sequence[tuple[str, Mapping[str, Any]]],
    search: alerts.AlertSearch,
    view: AlertsView,
    settings: Any,
) -> list[tuple[str, str, str]]:
    """(alertId, stream id, row) of each entry that passes the search. Run in a worker
    thread: a storm's entries parsed in the event loop held a page's click for seconds."""
    from velocity.delta.reader import rule_history

    rows = []
    for entry_id, fields in entries:
        alert = alerts.published_alert(fields)
        if alert is None or not search.query.matches(alert):
            continue
        if (alert["ruleId"], alert["ruleVersion"]) not in view.rule_versions:
            # A rule version applied since the connection opened.
            view.rule_versions = {(r.rule_id, r.version): r for r in rule_history(settings)}
        rows.append((alert["alertId"], entry_id, alert_row(alert, view, None, fresh=True)))
    return rows


def _updated_cases(settings: Any, case_filter: Any, since_ms: int) -> list[str]:
    from velocity.analyst.case_queue import updated_since

    return updated_since(cases.all_cases(settings), case_filter, since_ms)


def _matching(entries: list[tuple[str, dict[str, Any]]], query: AlertFilter) -> int:
    """How many of the alert stream's ``entries`` are alerts that pass ``query``."""
    if query.empty:
        return sum(1 for _, fields in entries if "alert" in fields)
    found = 0
    for _, fields in entries:
        alert = alerts.published_alert(fields)
        if alert is not None and query.matches(alert):
            found += 1
    return found


def _count_after(
    client: Any, stream: str, position: str, block_ms: int, query: AlertFilter
) -> tuple[str, int]:
    """The alert stream's position after its next entries (up to ``_LIVE_COUNT``; waits up
    to ``block_ms`` for one) and how many of them are alerts that pass ``query``."""
    found = client.xread({stream: position}, count=_LIVE_COUNT, block=block_ms)
    if not found:
        return position, 0
    entries = found[0][1]
    return str(entries[-1][0]), _matching(entries, query)


@router.get("/api/alerts/live", response_model=None)
async def alerts_live(request: Request, user: access.User) -> StreamingResponse:
    """Server-sent events for the page open in a browser: ``alert`` (the row of each alert
    published after ``after`` — an alert stream id — that passes the filter, the same
    fields as /api/alerts), ``health`` (the stream's figures, every 5 s) and ``failed``
    (the alert stream cannot be read). The connection ends after 30 s and the browser
    resumes from the last event's id (``Last-Event-ID``)."""
    from velocity.redis import alert_feed

    settings = await run_in_threadpool(access.settings)
    search, history = await run_in_threadpool(alerts.search_or_400, request.query_params, settings)
    after = request.headers.get("last-event-id") or request.query_params.get("after")
    if not after or not _STREAM_ID.fullmatch(after):
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "field 'after': an alert stream id")
    view = AlertsView(
        base=URL_PREFIX,
        can_edit=access.can_edit(user),
        query=search.query,
        csrf=access.csrf_token(request),
    )
    view.rule_versions = {(r.rule_id, r.version): r for r in history}

    async def events() -> AsyncIterator[str]:
        position = after
        client = alert_feed.async_connect(settings, _LIVE_BLOCK_MS)
        ends = time.monotonic() + _LIVE_SECONDS
        health_due = 0.0
        try:
            yield "retry: 100\n\n"  # a connection the server ended: the browser resumes at once
            while time.monotonic() < ends:
                if time.monotonic() >= health_due:
                    health_due = time.monotonic() + _LIVE_HEALTH_SECONDS
                    yield _sse(
                        "health", {"html": await run_in_threadpool(health.health_section, settings)}
                    )
                try:
                    entries = await alert_feed.entries_after(
                        client, settings.alert_stream, position, _LIVE_BLOCK_MS
                    )
                except Exception as exc:  # the page says so; the browser tries again
                    yield "retry: 5000\n\n"
                    yield _sse("failed", {"error": f"cannot read the alert stream: {exc}"})
                    return
                if not entries:
                    continue
                rows = await run_in_threadpool(_live_rows, entries, search, view, settings)
                for alert_id, entry_id, row in rows:
                    yield _sse("alert", {"alertId": alert_id, "html": row}, entry_id)
                position = entries[-1][0]
                if not rows or rows[-1][1] != position:
                    # entries that did not pass: resume after them
                    yield _sse("position", {}, position)
        finally:
            await client.aclose()

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


@router.get("/api/page/live", response_model=None)
async def page_live(request: Request) -> StreamingResponse:
    """Server-sent events for the page open in a browser, which never moves its rows by
    itself: ``alerts`` (``count``: alerts published after ``after`` — an alert stream id —
    that pass the alerts' filter, said at most once a second; the event's id is the
    stream position), ``position`` (entries passed that did not), ``cases`` (``count``,
    ``ids``: the cases passing the queue's filter that changed after ``cases_since``, ms;
    said when it changes, read every 2 s), ``health`` (the stream's figures, every 5 s),
    ``failed``. Either of ``after`` and ``cases_since`` may be left out. The connection
    ends after 30 s and the browser resumes from the last event's id (``Last-Event-ID``)."""
    from velocity.analyst.case_queue import parse_case_filter
    from velocity.delta.reader import rule_history
    from velocity.redis import mirror

    settings = await run_in_threadpool(access.settings)
    params = common.params(request.query_params)
    history = await run_in_threadpool(rule_history, settings)
    rule_ids = {r.rule_id for r in history}
    try:
        alert_filter = parse_filter(params, rule_ids)
        case_filter = parse_case_filter(params, rule_ids)
    except InvalidFilterError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc
    after = request.headers.get("last-event-id") or params.get("after")
    if after is not None and not _STREAM_ID.fullmatch(after):
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "field 'after': an alert stream id")
    since_text = params.get("cases_since")
    if since_text is not None and not (since_text.isascii() and since_text.isdigit()):
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "field 'cases_since': epoch ms")
    since = None if since_text is None else int(since_text)
    if after is None and since is None:
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST, "give 'after' (an alert stream id), 'cases_since', or both"
        )

    async def events() -> AsyncIterator[str]:
        position = after
        client = mirror.connect(settings) if after else None
        ends = time.monotonic() + _LIVE_SECONDS
        health_due = cases_due = said_at = 0.0
        said_cases: int | None = None
        pending = 0
        said_position = position
        try:
            yield "retry: 100\n\n"  # a connection the server ended: the browser resumes at once
            while time.monotonic() < ends:
                now = time.monotonic()
                if now >= health_due:
                    health_due = now + _LIVE_HEALTH_SECONDS
                    yield _sse(
                        "health", {"html": await run_in_threadpool(health.health_section, settings)}
                    )
                if since is not None and now >= cases_due:
                    cases_due = now + _LIVE_CASES_SECONDS
                    changed, _ = await run_in_threadpool(
                        common.read, "cases", lambda: _updated_cases(settings, case_filter, since)
                    )
                    if changed is not None and len(changed) != said_cases:
                        said_cases = len(changed)
                        yield _sse("cases", {"count": len(changed), "ids": changed[:20]})
                if client is None or position is None:
                    await asyncio.sleep(max(0.0, min(1.0, ends - time.monotonic())))
                    continue
                wait_ms = _LIVE_BLOCK_MS
                if pending:  # say it when a second has passed since the last time
                    wait_ms = max(1, int((said_at + _LIVE_SAY_SECONDS - now) * 1000))
                try:
                    # Read and counted in a worker thread: parsing thousands of entries a
                    # second (a storm of alerts) in the event loop would hold every other
                    # request of the api-server back meanwhile.
                    position, counted = await run_in_threadpool(
                        _count_after, client, settings.alert_stream, position,
                        min(wait_ms, _LIVE_BLOCK_MS), alert_filter,
                    )  # fmt: skip
                except Exception as exc:  # the page says so; the browser tries again
                    yield "retry: 5000\n\n"
                    yield _sse("failed", {"error": f"cannot read the alert stream: {exc}"})
                    return
                pending += counted
                now = time.monotonic()
                if pending and now - said_at >= _LIVE_SAY_SECONDS:
                    yield _sse("alerts", {"count": pending}, position)
                    pending, said_at, said_position = 0, now, position
                elif not pending and position != said_position and now - said_at >= 5.0:
                    yield _sse("position", {}, position)  # resume after what did not pass
                    said_at, said_position = now, position
            if pending:
                yield _sse("alerts", {"count": pending}, position)
            elif position != said_position:
                yield _sse("position", {}, position)
        finally:
            if client is not None:
                client.close()

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
