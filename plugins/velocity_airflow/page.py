"""The Velocity page's FastAPI app, mounted in Airflow's api-server at ``/velocity``.

Reads answer from Redis (alerts, lookups), the stream's status file (health) and the
Delta tables through delta-rs (rules, explanations): no JVM in the api-server. A rule
change goes through the versioned rule store (delta-rs) in this process, with the
``velocity_default`` connection's settings, the same validation and the same words as
`velocity rules`: it is applied in well under a second, and the stream takes it up on
its next micro-batch. Only a file that clears the state (CLEAR_STATE_ALL) runs
`velocity rules apply`, since deleting every bucket takes Spark.

An analyst's review of an alert goes to the append-only reviews table (delta-rs, in this
process too); the page shows each rule version's alerts, reviews and precision, and each
SHADOW candidate beside its rule in force (``velocity.analyst.shadow_compare``), to promote or
discard.

A preview of the add-rules form's rules (what they would have fired over the last hours
of the live events, ``velocity.delta.preview_reader``) is computed in this process too,
in a worker thread (the routes are plain functions, which FastAPI runs off the event
loop); it writes nothing, so any signed-in user may ask for one.

The page opens on the queue of cases (``velocity.analyst.case_queue``, the cases read through
``velocity.delta.case_store``): a case opens to its alerts, payments and history, and is
assigned, closed with a verdict (which reviews each of its alerts) or reopened here. A
backfill run is started from the page as a run of the backfill DAG, through Airflow's own
code in this process (``airflow.api.common.trigger_dag``), with the user's permissions.

One live feed per open page (``/api/page/live``) counts what changed since the page was
drawn (alerts published, cases updated) and the page says so; rows are drawn again only
when asked. Each click's moment travels in a short-lived cookie and ``ClickTiming`` notes
when the request reached this app (``/api/clicks``): the page's responsiveness, measured.

Airflow's authentication guards every route: the page needs a signed-in user; a change
(a rule change or a review) needs permission to edit the ``run_stream`` DAG
(SimpleAuthManager: roles user, op and admin, not viewer), since a rule change changes
what the stream does. A change must come from this page (its ``Origin``), so another
site cannot post one with the user's cookie.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import secrets
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Mapping,
    MutableMapping,
    Sequence,
)
from dataclasses import dataclass
from functools import cache
from itertools import islice
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from fastapi import Depends, FastAPI, Form, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)

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
from velocity_airflow import backfill_html, flash, queue_html
from velocity_airflow.alerts_html import AlertsView, alert_row, alert_rows
from velocity_airflow.page_html import (
    Flash,
    PageData,
    explanation_section,
    health_html,
    render_case,
    render_page,
)
from velocity_airflow.plans import rule_id_text

URL_PREFIX = "/velocity"
# Who may edit this DAG may change the rules it runs with.
RULES_DAG_ID = "run_stream"
# The DAG whose runs the page lists as backfill runs, and starts from its form.
BACKFILL_DAG_ID = backfill_html.BACKFILL_DAG_ID
# One state clearing at a time: each starts a Spark session in the api-server's process
# tree. (Rule changes need no lock: the rule store serialises concurrent appliers.)
_CLEAR_STATE = threading.Lock()
# One preview at a time: each holds the span's events in memory (up to the reader's
# 20M-event cap) and uses both cores for seconds; a second waits this long, then is told.
_PREVIEW = threading.Lock()
_PREVIEW_WAIT_S = 60.0
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
# Timed clicks kept for /api/clicks (the newest; one api-server process holds its own).
_CLICKS_KEPT = 2000
_CLICK_COOKIE = re.compile(
    r"(?:^|;\s*)velocity_click=([a-z0-9]{1,16})\.([0-9]{10,16})\.([A-Za-z0-9_-]{0,40})"
)
# Requests that do not answer a click (the live feed reconnecting carries the cookie too).
_UNTIMED = ("/api/page/live", "/api/alerts/live", "/api/clicks")


class ClickTiming:
    """ASGI middleware: a request carrying a click's cookie (the page's script sets it on
    each click, with the browser's clock) is noted once, with when this app received it,
    before anything else (authentication included) runs."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope.get("type") == "http":
            received = time.time() * 1000
            path = str(scope.get("path", ""))
            if not path.endswith(_UNTIMED):
                headers = dict(scope.get("headers") or ())
                cookie = headers.get(b"cookie")
                if cookie:
                    sent = headers.get(b"x-velocity-sent", b"").decode("latin-1")
                    _note_click(cookie.decode("latin-1"), scope, path, received, sent)
        await self.app(scope, receive, send)


_CLICKS: deque[dict[str, Any]] = deque(maxlen=_CLICKS_KEPT)
_CLICK_IDS: deque[str] = deque(maxlen=_CLICKS_KEPT)


def _note_click(
    cookie: str, scope: Mapping[str, Any], path: str, received: float, sent: str = ""
) -> None:
    found = _CLICK_COOKIE.search(cookie)
    if found is None or found.group(1) in _CLICK_IDS:
        return
    click_id, clicked, what = found.group(1), int(found.group(2)), found.group(3)
    _CLICK_IDS.append(click_id)
    _CLICKS.append(
        {
            "click": click_id,
            "what": what,
            "method": scope.get("method"),
            "path": path,
            "clickedAt": clicked,
            # When the page's script sent it (a change posted by fetch), by the same clock:
            # what the browser took apart from what the way to the server took.
            "sentAt": int(sent) if sent.isdigit() else None,
            "receivedAt": round(received, 1),
            "delayMs": round(received - clicked, 1),
        }
    )


# No docs pages (the Swagger UI would load its scripts from a CDN, and Airflow does not
# guard them): the schema is served at /api/openapi.json behind the login.
app = FastAPI(
    title="Velocity",
    description="Rules, alerts and the stream of Velocity",
    docs_url=None,
    redoc_url=None,
    openapi_url=None,
)
app.add_middleware(ClickTiming)


class _SignIn(Exception):
    """No signed-in user: an HTML request goes to Airflow's login page and back."""


async def _user(request: Request) -> Any:
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi.security import HTTPAuthorizationCredentials

    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    bearer = HTTPAuthorizationCredentials(scheme=scheme, credentials=token) if token else None
    try:
        return await get_user(request, None, bearer)
    except HTTPException as exc:
        if exc.status_code in (status.HTTP_401_UNAUTHORIZED, status.HTTP_403_FORBIDDEN):
            raise _SignIn from exc
        raise


def _can_edit(user: Any) -> bool:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails

    return bool(
        get_auth_manager().is_authorized_dag(
            method="PUT", user=user, details=DagDetails(id=RULES_DAG_ID)
        )
    )


def _may_change(what: str) -> Any:
    """The dependency of a route that changes something: a signed-in user with edit
    permission on the run_stream DAG, posting from this page (or with a bearer token)."""

    async def changer(request: Request) -> Any:
        user = await _user(request)
        if not _can_edit(user):
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                f"{user.get_name()} may not {what}: that needs edit permission on the "
                f"{RULES_DAG_ID} DAG",
            )
        # A browser's change must come from this page: the login cookie goes with any form
        # post to this host. A script authenticates with a bearer token instead.
        if not request.headers.get("authorization"):
            origin = request.headers.get("origin") or request.headers.get("referer") or ""
            if urlsplit(origin).netloc != request.url.netloc:
                raise HTTPException(status.HTTP_403_FORBIDDEN, "a change must come from this page")
        return user

    return changer


User = Annotated[Any, Depends(_user)]
Editor = Annotated[Any, Depends(_may_change("change rules"))]
# Reviewing an alert is an analyst's change: the same permission as a rule change.
Reviewer = Annotated[Any, Depends(_may_change("review alerts"))]
# So is starting a backfill from the page (Airflow then checks its own run permission).
Backfiller = Annotated[Any, Depends(_may_change("start a backfill"))]


@app.exception_handler(_SignIn)
async def _sign_in(request: Request, exc: _SignIn) -> Response:
    if "text/html" in request.headers.get("accept", ""):
        # Back to the page asked for; a post is not repeated: back to the page itself.
        here = request.url.path if request.method == "GET" else f"{URL_PREFIX}/"
        query = f"?{request.url.query}" if request.method == "GET" and request.url.query else ""
        back = urlencode({"next": f"/plugin/velocity{here}{query}"})
        return RedirectResponse(f"/api/v2/auth/login?{back}", status.HTTP_303_SEE_OTHER)
    return JSONResponse({"detail": "Not authenticated"}, status.HTTP_401_UNAUTHORIZED)


def _hook() -> Any:
    from velocity_airflow.hooks import VelocityHook

    return VelocityHook()


def _settings() -> Any:
    return _hook().get_conn()


def _read(section: str, read: Any) -> tuple[Any, str | None]:
    """``read()``, or None and a message naming the section that could not be read."""
    try:
        return read(), None
    except Exception as exc:  # a page with one broken section still shows the others
        return None, f"cannot read the {section}: {exc}"


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

    table, table_error = _read(
        "alerts table",
        lambda: newest_alerts(settings, search.query, search.before, search.limit),
    )
    if table is None:
        table = TableAlerts([], False, None)
    published, stream_error = _read(
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
        alert = _published_alert(fields)
        if alert is None or not search.query.matches(alert):
            continue
        if search.before is not None and Cursor.of(alert) >= search.before:
            continue
        found.append(alert)
        if len(found) > search.limit:
            break
    return found


def _published_alert(fields: Any) -> dict[str, Any] | None:
    """An entry of the alert stream as its record; None for an entry that is not one."""
    try:
        alert = json.loads(fields["alert"])
    except (KeyError, TypeError, ValueError):
        return None
    if not isinstance(alert, dict) or not alert.keys() >= _ALERT_FIELDS:
        return None
    return alert


def _alert_on_stream(settings: Any, alert_id: str) -> dict[str, Any] | None:
    """The record of ``alert_id`` on the Redis alert stream (the newest entries only);
    None when it is not there or Redis cannot be read."""
    from velocity.redis import mirror

    try:
        entries = mirror.newest_alert_entries(mirror.connect(settings), settings.alert_stream)
        for fields in islice(entries, _EXPLAINED_SEARCHED):
            if alert_id in fields.get("alert", ""):  # parse only the one entry that names it
                alert = _published_alert(fields)
                if alert is not None and alert["alertId"] == alert_id:
                    return alert
    except Exception:
        return None
    return None


def _explain(settings: Any, alert_id: str) -> dict[str, Any]:
    from velocity.delta.reader import explain

    # The alert may be newer than the alerts table (written behind Redis): take it from
    # Redis when Redis has it; the alerts table answers for the rest, Redis or not.
    return explain(settings, alert_id, _alert_on_stream(settings, alert_id)).to_json()


def _record_review(settings: Any, user: Any, alert_id: str, verdict: str, note: str) -> Any:
    """Record ``user``'s review of ``alert_id`` (``InvalidReviewError`` names the field
    at fault, and nothing is written). The alert is looked up in the alerts table, and on
    the alert stream when the stream has not written it to Delta yet."""
    from velocity.analyst.reviews import AlertRef, check_fields
    from velocity.delta.reader import alert_ref, review_store

    check_fields(verdict, note, user.get_name())  # a bad field: no table read
    alert = alert_ref(settings, alert_id)
    if alert is None:
        published = _alert_on_stream(settings, alert_id)
        if published is not None and published.keys() >= {"ruleVersion", "decisionTime"}:
            alert = AlertRef.of(published)
    return review_store(settings).record(alert_id, alert, verdict, note, user.get_name())


def _lookup(settings: Any, rule: str, key: str) -> dict[str, Any]:
    from velocity.domain.schema import parse_key_values
    from velocity.redis import mirror

    rule_id = rule_id_text(rule.strip())
    if rule_id is None:
        raise ValueError(f"ruleId must be a number, got {rule!r}")
    return mirror.lookup(
        mirror.connect(settings), settings.redis_keys, rule_id, parse_key_values(key)
    )


def _reviews(settings: Any) -> list[Any]:
    from velocity.delta.reader import review_store

    return review_store(settings).all()


def _precision(settings: Any, reviews: list[Any] | None = None) -> list[Any]:
    """Each rule version's figures as of now (``reviews``: every review, when read already)."""
    from velocity.delta.reader import precision_by_version

    return precision_by_version(settings, int(time.time() * 1000), reviews)


def _shadow(settings: Any, history: Any, reviews: list[Any] | None) -> list[Any]:
    """Each SHADOW candidate beside its rule in force, as of now (``history``: every rule
    version, read already; ``reviews``: every review, when read already)."""
    from velocity.delta.reader import shadow_comparisons

    return shadow_comparisons(settings, int(time.time() * 1000), history, reviews)


def _page_data(
    request: Request, user: Any, params: Mapping[str, str] | None = None, **extra: Any
) -> PageData:
    """Everything the page shows, for the URL parameters of ``request`` (or ``params``:
    a post's page drawn again, with those it was posted from)."""
    from velocity.analyst.reviews import latest_reviews
    from velocity.delta.reader import rule_history
    from velocity.domain.rule_changes import RuleBook
    from velocity.operating import stream_control

    query = params = _params(request.query_params) if params is None else dict(params)
    now_ms = int(time.time() * 1000)
    settings, settings_error = _read("Velocity settings", _settings)
    data = PageData(
        user=user.get_name(),
        can_edit=_can_edit(user),
        base=URL_PREFIX,
        params=params,
        now_ms=now_ms,
        **extra,
    )
    if settings is None:
        data.health_error = data.rules_error = data.alerts_error = settings_error
        data.precision_error = data.shadow_error = data.queue_error = settings_error
        return data
    data.write_behind_seconds = settings.write_behind_seconds
    health, data.health_error = _read(
        "stream status", lambda: stream_control.check_health(settings).to_json()
    )
    data.health = health
    history, data.rules_error = _read("rules", lambda: rule_history(settings))
    # The rules in force, one per ruleId: a SHADOW candidate is listed beside its rule.
    data.rules = [r for _, r in sorted(RuleBook.of(history or []).standing().items())]
    data.rule_versions = {(r.rule_id, r.version): r for r in history or []}
    data.queue, data.queue_page, data.queue_error = _queue(settings, data, history)
    data.rule_rates, data.rates_error = _read(
        "alerts a minute", lambda: _rule_rates(settings, [r.rule_id for r in data.rules], now_ms)
    )
    _alert_page(data, settings, query, history)
    reviews, data.reviews_error = _read("reviews", lambda: _reviews(settings))
    data.reviews = None if reviews is None else latest_reviews(reviews)
    data.precision, data.precision_error = _read(
        "alerts and reviews per rule version", lambda: _precision(settings, reviews)
    )
    if history is None:
        data.shadow_error = data.rules_error
    else:
        data.shadow, data.shadow_error = _read(
            "shadow rules", lambda: _shadow(settings, history, reviews)
        )
    data.backfills, data.backfills_error = _read(
        "backfill runs", lambda: _backfill_runs(settings, user)
    )
    if query.get("alert"):
        data.explanation, data.explanation_error = _read(
            "explanation", lambda: _explain(settings, query["alert"])
        )
    if query.get("lookup_rule") or query.get("lookup_key"):
        data.lookup_form = {k: query.get(k, "") for k in ("lookup_rule", "lookup_key")}
        data.lookup, data.lookup_error = _read(
            "window aggregate",
            lambda: _lookup(settings, query.get("lookup_rule", ""), query.get("lookup_key", "")),
        )
    return data


# A query string longer than this is not a page's: cut, never echoed back whole.
_PARAMS_MAX = 4000


def _params(query: Mapping[str, str]) -> dict[str, str]:
    """The page's URL parameters (the first value of each, non-empty), to keep."""
    params: dict[str, str] = {}
    for name, value in query.items():
        if value and name not in params and len(name) <= 40:
            params[name] = value[:_PARAMS_MAX]
    return params


def _params_of(back: str) -> dict[str, str]:
    """A change's ``back`` field (the page's query string when the form was posted) as
    parameters; anything unreadable is left out."""
    return _params(dict(parse_qsl(back[:_PARAMS_MAX], keep_blank_values=False)))


def _rule_rates(settings: Any, rule_ids: list[int], now_ms: int) -> Any:
    from velocity.delta.reader import rule_rates

    return rule_rates(settings, rule_ids, now_ms)


def _queue(
    settings: Any, data: PageData, history: Any
) -> tuple[queue_html.QueueView | None, Any, str | None]:
    """The queue's view, the page of cases the URL asks for, and what went wrong (a
    filter that cannot be read names its field; the form keeps what was written)."""
    from velocity.analyst.case_queue import CaseFilter, CaseQuery, parse_case_query, queue_page

    rule_ids = sorted({r.rule_id for r in history or []})
    view = queue_html.QueueView(
        base=URL_PREFIX,
        can_edit=data.can_edit,
        user=data.user,
        now_ms=data.now_ms,
        params=data.params,
        rule_versions=data.rule_versions,
        rule_ids=rule_ids,
        write_behind_seconds=settings.write_behind_seconds,
    )
    try:
        view.query = parse_case_query(data.params, None if history is None else set(rule_ids))
    except InvalidFilterError as exc:
        view.query = CaseQuery(CaseFilter(text=_case_text(data.params)))
        return view, None, str(exc)
    cases, error = _read("cases", lambda: _cases(settings))
    if cases is None:
        return view, None, error
    view.as_of = _newest_activity(cases)
    return view, queue_page(cases, view.query), None


def _case_text(params: Mapping[str, str]) -> dict[str, str]:
    from velocity.analyst.case_queue import CASE_FILTER_FIELDS

    return {k: params[k] for k in CASE_FILTER_FIELDS if params.get(k)}


def _cases(settings: Any) -> list[Any]:
    from velocity.delta.case_store import CaseStore

    return list(CaseStore(settings).cases().values())


def _newest_activity(cases: list[Any]) -> int:
    from velocity.analyst.case_queue import newest_activity

    return newest_activity(cases)


def _backfill_runs(settings: Any, user: Any) -> list[Any]:
    """The backfill runs, newest first: what each recorded in the ``backfills`` table
    (delta-rs) beside Airflow's runs of the backfill DAG (state, form, link)."""
    from velocity.analyst.backfill_runs import backfill_runs
    from velocity.delta.reader import recorded_backfills

    return backfill_runs(recorded_backfills(settings), _airflow_backfill_runs(user))


def _airflow_backfill_runs(user: Any, limit: int = 50) -> list[Any]:
    """The newest runs of the backfill DAG, from the metadata database of the api-server
    this page runs in; none when ``user`` may not read the DAG's runs."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import (
        DagAccessEntity,
        DagDetails,
    )
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from velocity.analyst.backfill_runs import AirflowRun

    if not get_auth_manager().is_authorized_dag(
        method="GET",
        user=user,
        access_entity=DagAccessEntity.RUN,
        details=DagDetails(id=BACKFILL_DAG_ID),
    ):
        return []
    with create_session() as session:
        runs = session.scalars(
            select(DagRun)
            .where(DagRun.dag_id == BACKFILL_DAG_ID)
            .order_by(DagRun.id.desc())
            .limit(limit)
        ).all()
        return [
            AirflowRun(
                run_id=run.run_id,
                state=str(getattr(run.state, "value", run.state)),
                conf=dict(run.conf or {}),
                started_at=None
                if run.start_date is None
                else int(run.start_date.timestamp() * 1000),
                url=f"/dags/{BACKFILL_DAG_ID}/runs/{quote(run.run_id, safe='')}",
            )
            for run in runs
        ]


def _alert_page(data: PageData, settings: Any, params: Mapping[str, str], history: Any) -> None:
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
        data.live_after, _ = _read(
            "alert stream",
            lambda: alert_feed.last_entry_id(mirror.connect(settings), settings.alert_stream),
        )
    page, data.alerts_error = search_alerts(settings, search)
    data.alerts = page.alerts
    data.alerts_older = page.older


@app.get("/", response_class=HTMLResponse)
def page(request: Request, user: User) -> HTMLResponse:
    data = _page_data(request, user)
    sealed = request.cookies.get(flash.COOKIE)
    if sealed:
        data.flash = flash.unseal(sealed, _flash_key())
    response = HTMLResponse(render_page(data))
    if sealed:
        response.delete_cookie(flash.COOKIE, path=URL_PREFIX)  # shown once
    return response


@cache
def _flash_key() -> bytes:
    """A key of the page's own, derived from the api-server's secret: the same on every
    api-server worker. Without a secret, a random one: a worker that did not seal a
    message then shows none, which is better than one anybody could seal."""
    from airflow.configuration import conf

    secret = conf.get("api", "secret_key", fallback="") or secrets.token_hex(32)
    return hashlib.sha256(b"velocity-flash\0" + secret.encode()).digest()


def _back(ok: bool, text: str, back: str = "", path: str = "/") -> RedirectResponse:
    """Back to the page (``path`` under the app) with the URL parameters it was posted
    from (``back``: its query string), which shows ``text`` once."""
    query = urlencode(_params_of(back))
    response = RedirectResponse(
        f"{URL_PREFIX}{path}" + (f"?{query}" if query else ""), status.HTTP_303_SEE_OTHER
    )
    response.set_cookie(
        flash.COOKIE, flash.seal(Flash(ok, text), _flash_key()),
        max_age=300, path=URL_PREFIX, httponly=True, samesite="lax",
    )  # fmt: skip
    return response


def _apply_rules(entries: Any) -> tuple[bool, str]:
    """Apply ``entries`` through the rule store (all or nothing) and say what happened, in
    the words `velocity rules` prints."""
    from velocity.delta.names import RULES
    from velocity.delta.rule_store import RuleStore
    from velocity.domain.rule_changes import outcome_lines

    try:
        result = RuleStore(_settings().table_path(RULES)).apply(entries)
    except Exception as exc:  # the page says why nothing changed, as the CLI would
        return False, f"error: {exc}"
    return True, "\n".join(outcome_lines(result, entries))


def _run_rules_command(args: list[str]) -> tuple[bool, str]:
    """`velocity rules …` with the connection's settings, one at a time."""
    with _CLEAR_STATE:
        try:
            return _command_outcome(_hook().run(args, timeout=300))
        except subprocess.TimeoutExpired:
            return False, (
                f"velocity {' '.join(args)} did not finish within 300 s; it may still have "
                "applied: check the rules in force before trying again"
            )


def _command_outcome(result: Any) -> tuple[bool, str]:
    """What the page says of a finished `velocity` command: what it printed on success,
    its error lines otherwise (the JVM's start-up chatter on stderr left out)."""
    if result.returncode == 0:
        return True, result.stdout.strip() or "done"
    noise = ("Picked up ", "WARNING: ", "Setting default log level", "To adjust logging level")
    lines = [
        line
        for line in result.stderr.splitlines()
        if line.strip() and not line.startswith(noise) and " WARN " not in line
    ]
    return False, "\n".join(lines[-12:]) or f"velocity exited {result.returncode}"


@app.post("/rules/{rule_id}/{action}")
def change_rule_state(
    rule_id: int, action: str, user: Editor, back: Annotated[str, Form()] = ""
) -> RedirectResponse:
    """Pause, activate or delete the rule in force; promote the SHADOW candidate of
    ``rule_id`` to its ACTIVE version, or discard it (`velocity rules ACTION ID`)."""
    from velocity.domain.rule_changes import RULE_ACTIONS, rule_action

    if action not in RULE_ACTIONS:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no rule action {action!r}")
    return _back(*_apply_rules([rule_action(action, rule_id)]), back)


@app.post("/rules", response_model=None)
def add_rules(
    request: Request,
    user: Editor,
    rules_json: Annotated[str, Form()] = "",
    intent: Annotated[str, Form()] = "validate",
    back: Annotated[str, Form()] = "",
) -> RedirectResponse | HTMLResponse:
    from velocity.domain.rules import Control, ControlType, parse_rules
    from velocity.errors import InvalidRuleError, UsageError

    try:
        entries = parse_rules(rules_json)
    except InvalidRuleError as exc:
        # The lines `velocity rules validate` prints, so the page and the CLI agree.
        text = "invalid rules, nothing applied:\n" + "\n".join(f"  {p}" for p in exc.problems)
        return _page_again(request, user, rules_json, Flash(False, text), back)
    except UsageError as exc:
        return _page_again(request, user, rules_json, Flash(False, f"error: {exc}"), back)
    if intent == "shadow":
        return _shadow_rules(request, user, rules_json, entries, back)
    if intent != "apply":
        text = f"{len(entries)} valid rule entries"
        return _page_again(request, user, rules_json, Flash(True, text), back)
    clear_state = ControlType.CLEAR_STATE_ALL
    if not any(isinstance(e, Control) and e.control_type is clear_state for e in entries):
        return _back(*_apply_rules(entries), back)
    with tempfile.TemporaryDirectory(prefix="velocity-rules-") as folder:
        path = Path(folder) / "rules.json"
        path.write_text(rules_json, encoding="utf-8")
        ok, text = _run_rules_command(["rules", "apply", str(path)])
    return _back(ok, text, back)


def _shadow_rules(
    request: Request, user: Any, rules_json: str, entries: Any, back: str = ""
) -> RedirectResponse | HTMLResponse:
    """Every rule of ``entries`` as a SHADOW candidate, whatever its ruleState says, as
    `velocity rules shadow` adds them."""
    from velocity.domain.rule_changes import as_candidates
    from velocity.errors import UsageError

    try:
        candidates = as_candidates(entries)
    except UsageError as exc:
        return _page_again(request, user, rules_json, Flash(False, f"error: {exc}"), back)
    return _back(*_apply_rules(candidates), back)


def _hours(text: str) -> float:
    """The preview's hours field as a number (``UsageError`` naming the field)."""
    from velocity.errors import UsageError

    try:
        return float(text.strip() or "1")
    except ValueError:
        raise UsageError(f"field 'hours': a positive number of hours, got {text!r}") from None


def _preview(settings: Any, rules_text: str, hours: float) -> dict[str, Any]:
    """``Preview.to_json()`` of ``rules_text``'s rules over the last ``hours`` of the live
    events (``InvalidRuleError``/``UsageError`` say what is wrong; nothing is written)."""
    from velocity.delta.preview_reader import preview
    from velocity.domain.rules import parse_rules
    from velocity.errors import UsageError

    entries = parse_rules(rules_text)  # a bad rule is refused before waiting for the lock
    if not _PREVIEW.acquire(timeout=_PREVIEW_WAIT_S):
        raise UsageError(
            f"another preview has been running for over {_PREVIEW_WAIT_S:.0f} s: try again "
            "when it has finished"
        )
    try:
        return preview(settings, entries, hours=hours).to_json()
    finally:
        _PREVIEW.release()


@app.post("/preview", response_class=HTMLResponse)
def preview_rules(
    request: Request,
    user: User,
    rules_json: Annotated[str, Form()] = "",
    hours: Annotated[str, Form()] = "1",
    back: Annotated[str, Form()] = "",
) -> HTMLResponse:
    """The page with what the form's rules would have fired over the last ``hours`` of the
    live events beside the versions in force; nothing is saved. A read: any signed-in user."""
    from velocity.errors import InvalidRuleError, UsageError

    shown: dict[str, Any] | None = None
    flash_shown = None
    try:
        shown = _preview(_settings(), rules_json, _hours(hours))
    except InvalidRuleError as exc:
        # The lines `velocity rules validate` prints, as Validate shows them.
        text = "invalid rules, nothing previewed:\n" + "\n".join(f"  {p}" for p in exc.problems)
        flash_shown = Flash(False, text)
    except UsageError as exc:
        flash_shown = Flash(False, f"error: {exc}")
    data = _page_data(
        request, user, _params_of(back), rule_text=rules_json, preview=shown, preview_hours=hours
    )
    data.flash = flash_shown
    ok = flash_shown is None
    return HTMLResponse(render_page(data), status_code=200 if ok else 422)


@app.post("/alerts/{alert_id}/review")
def review_alert(
    alert_id: str,
    user: Reviewer,
    verdict: Annotated[str, Form()] = "",
    note: Annotated[str, Form()] = "",
    back: Annotated[str, Form()] = "",
) -> RedirectResponse:
    from velocity.errors import UsageError

    try:
        review = _record_review(_settings(), user, alert_id, verdict, note)
    except UsageError as exc:  # the page says which field is wrong; nothing was recorded
        return _back(False, f"error: {exc}", back)
    return _back(True, _reviewed(review), back)


# --- cases ------------------------------------------------------------------------------


def _page_view(request: Request, user: Any, settings: Any) -> tuple[PageData, Any]:
    """What the queue and the alerts need of the page (user, URL parameters, rule
    versions) without the rest of the page's reads; and every rule version."""
    from velocity.delta.reader import rule_history

    history = rule_history(settings)
    data = PageData(
        user=user.get_name(),
        can_edit=_can_edit(user),
        base=URL_PREFIX,
        params=_params(request.query_params),
        now_ms=int(time.time() * 1000),
    )
    data.rule_versions = {(r.rule_id, r.version): r for r in history}
    return data, history


@app.get("/cases/rows")
def queue_rows_json(request: Request, user: User) -> dict[str, Any]:
    """The queue's rows as the page draws them (its filter and page, from the URL), for the
    open page to show on request: ``html``, ``asOf`` (the newest case activity: changes
    after it count as updates), ``matching``. 400 names a filter field that is wrong."""
    settings = _settings()
    data, history = _page_view(request, user, settings)
    view, page, error = _queue(settings, data, history)
    if error or view is None or page is None:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, error or "no queue")
    return {
        "html": queue_html.queue_rows(page.cases, view),
        "asOf": view.as_of,
        "matching": page.matching,
    }


@app.get("/alerts/rows")
def alert_rows_json(request: Request, user: User) -> dict[str, Any]:
    """The newest page's alert rows as the page draws them (its filter, from the URL), for
    the open page to show on request: ``html``, ``position`` (the alert stream's position
    read before them: the alerts published after it are new), ``error``."""
    from velocity.analyst.reviews import latest_reviews
    from velocity.redis import alert_feed, mirror

    settings = _settings()
    search, history = _search_or_400(request.query_params, settings)
    position, _ = _read(
        "alert stream",
        lambda: alert_feed.last_entry_id(mirror.connect(settings), settings.alert_stream),
    )
    page, error = search_alerts(settings, AlertSearch(search.query, None, search.limit))
    reviews, _ = _read("reviews", lambda: _reviews(settings))
    view = AlertsView(
        base=URL_PREFIX,
        can_edit=_can_edit(user),
        query=search.query,
        rule_versions={(r.rule_id, r.version): r for r in history},
        limit=search.limit if request.query_params.get("limit") else None,
        kept=_params(request.query_params),
        now_ms=int(time.time() * 1000),
    )
    html = alert_rows(page.alerts, view, latest_reviews(reviews or []))
    return {"html": html, "position": position, "error": error}


def _case_page(request: Request, user: Any, case_id: str) -> HTMLResponse:
    from velocity.analyst.reviews import latest_reviews
    from velocity.delta.case_store import CaseStore
    from velocity.delta.reader import case_alerts, case_payments
    from velocity.errors import UsageError

    settings = _settings()
    data, history = _page_view(request, user, settings)
    view, _, _ = _queue(settings, data, history)
    if view is None:
        raise HTTPException(status.HTTP_500_INTERNAL_SERVER_ERROR, "no queue")
    try:
        case = CaseStore(settings).case(case_id)
    except UsageError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc
    shown = queue_html.CaseView(case=case, queue=view)
    alerts, shown.alerts_error = _read("the case's alerts", lambda: case_alerts(settings, case_id))
    shown.alerts = alerts or []
    paid = {str(a["transactionId"]) for a in shown.alerts}
    payments, shown.payments_error = _read(
        "the case's payments", lambda: case_payments(settings, case.key, paid)
    )
    shown.payments = payments or []
    reviews, _ = _read("reviews", lambda: _reviews(settings))
    shown.reviews = latest_reviews(reviews or [])
    alert_id = data.params.get("alert")
    if alert_id:
        explained, error = _read("explanation", lambda: _explain(settings, alert_id))
        shown.explanation_html = explanation_section(explained, error)
    sealed = request.cookies.get(flash.COOKIE)
    said = flash.unseal(sealed, _flash_key()) if sealed else None
    response = HTMLResponse(render_case(shown, said))
    if sealed:
        response.delete_cookie(flash.COOKIE, path=URL_PREFIX)  # shown once
    return response


@app.get("/cases/{case_id}", response_class=HTMLResponse)
def case_page(case_id: str, request: Request, user: User) -> HTMLResponse:
    """A case: its facts, its alerts (each explained on request, ``?alert=ID``), its
    payments and its history; for an editor, assign, close with a verdict, reopen. The
    queue's URL parameters come along and go back with every link and form."""
    return _case_page(request, user, case_id)


def _case_words(case: Any) -> str:
    from velocity.analyst.alert_search import key_text

    return f"case {key_text(case.key)}"


@app.post("/cases/close")
def close_cases(
    user: Reviewer,
    case_id: Annotated[list[str] | None, Form()] = None,
    verdict: Annotated[str, Form()] = "",
    note: Annotated[str, Form()] = "",
    back: Annotated[str, Form()] = "",
) -> RedirectResponse:
    """Close each selected case with the verdict (each reviews every alert of its case);
    the page says how many closed and why any did not."""
    from velocity.analyst.reviews import parse_verdict
    from velocity.delta.case_store import CaseStore
    from velocity.errors import UsageError

    chosen = list(dict.fromkeys(c for c in case_id or [] if c))
    if not chosen:
        return _back(False, "error: no case selected; tick the cases to close", back)
    try:
        words = parse_verdict(verdict).words
    except UsageError as exc:
        return _back(False, f"error: {exc}; no case closed", back)
    store = CaseStore(_settings())
    closed, refused = [], []
    for one in chosen:
        try:
            closed.append(store.close(one, verdict, note.strip() or None, user.get_name()))
        except UsageError as exc:
            refused.append(f"case {one}: {exc}")
    alerts = sum(c.alerts for c in closed)
    text = f"{len(closed)} cases closed: {words} ({alerts} alerts reviewed), by {user.get_name()}"
    if len(closed) == 1:
        text = f"{_case_words(closed[0])} closed: {words} ({alerts} alerts reviewed), by "
        text += user.get_name()
    return _back(not refused, "\n".join([text, *refused]), back)


def _case_change(
    case_id: str, back: str, return_to: str, change: Callable[[Any], Any], said: str
) -> RedirectResponse:
    from velocity.delta.case_store import CaseStore
    from velocity.errors import UsageError

    path = f"/cases/{quote(case_id, safe='')}" if return_to == "case" else "/"
    try:
        case = change(CaseStore(_settings()))
    except UsageError as exc:
        return _back(False, f"error: {exc}", back, path)
    return _back(True, f"{_case_words(case)}: {said}", back, path)


@app.post("/cases/{case_id}/close")
def close_case(
    case_id: str,
    user: Reviewer,
    verdict: Annotated[str, Form()] = "",
    note: Annotated[str, Form()] = "",
    back: Annotated[str, Form()] = "",
) -> RedirectResponse:
    """Close the case with the verdict and note, reviewing each of its alerts so; back to
    the queue (with its URL parameters)."""
    from velocity.analyst.reviews import Verdict

    words = {v.value: v.words for v in Verdict}.get(verdict.strip().upper(), verdict)
    return _case_change(
        case_id,
        back,
        "queue",
        lambda store: store.close(case_id, verdict, note.strip() or None, user.get_name()),
        f"closed: {words}, by {user.get_name()}",
    )


@app.post("/cases/{case_id}/assign")
def assign_case(
    case_id: str,
    user: Reviewer,
    assignee: Annotated[str, Form()] = "",
    back: Annotated[str, Form()] = "",
    return_to: Annotated[str, Form()] = "",
) -> RedirectResponse:
    return _case_change(
        case_id,
        back,
        return_to,
        lambda store: store.assign(case_id, assignee, user.get_name()),
        f"assigned to {assignee.strip()}",
    )


@app.post("/cases/{case_id}/reopen")
def reopen_case(
    case_id: str,
    user: Reviewer,
    back: Annotated[str, Form()] = "",
    return_to: Annotated[str, Form()] = "",
) -> RedirectResponse:
    return _case_change(
        case_id, back, return_to, lambda store: store.reopen(case_id, user.get_name()), "reopened"
    )


# --- a backfill run from the page -------------------------------------------------------


def backfill_conf(rule_ids: list[str], from_time: str, to_time: str) -> dict[str, Any]:
    """The backfill DAG's conf of the page's form: From and To in UTC as the page writes
    times (or epoch ms) to ISO 8601, the rules as the DAG's form sends them; checked as the
    DAG's first task checks it (``UsageError`` names the field)."""
    from velocity.analyst.alert_search import parse_time
    from velocity.errors import UsageError
    from velocity_airflow.plans import backfill_args

    def moment(text: str, name: str, upper: bool) -> str | None:
        if not text.strip():
            return None
        try:
            ms = parse_time(text, name, upper)
        except InvalidFilterError as exc:
            raise UsageError(str(exc)) from None
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"

    conf: dict[str, Any] = {
        "from_time": moment(from_time, "from", upper=False),
        "to_time": moment(to_time, "to", upper=True),
        "rule_ids": sorted({r.strip() for r in rule_ids if r.strip()}, key=_rule_order) or None,
    }
    backfill_args(conf["from_time"], conf["to_time"], conf["rule_ids"])  # refuses a bad form
    return conf


def _rule_order(text: str) -> tuple[int, str]:
    return (int(text), text) if text.isdigit() else (0, text)


def _trigger_backfill(user: Any, conf: Mapping[str, Any]) -> str:
    """A run of the backfill DAG with ``conf``, as Airflow's trigger form makes one (a
    paused DAG unpaused first, as that form does by default): its run id. The user needs
    Airflow's permission to run the DAG (and to edit it, to unpause it)."""
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import (
        DagAccessEntity,
        DagDetails,
    )
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from airflow.utils.types import DagRunTriggeredByType

    from velocity.errors import UsageError

    auth = get_auth_manager()
    details = DagDetails(id=BACKFILL_DAG_ID)
    if not auth.is_authorized_dag(
        method="POST", user=user, access_entity=DagAccessEntity.RUN, details=details
    ):
        raise UsageError(f"{user.get_name()} may not run the {BACKFILL_DAG_ID} DAG")
    with create_session() as session:
        model = DagModel.get_current(BACKFILL_DAG_ID, session=session)
        if model is None:
            raise UsageError(
                f"Airflow does not know the {BACKFILL_DAG_ID} DAG yet (the dag-processor "
                "parses dags/ every 30 s): try again shortly"
            )
        if model.is_paused:
            if not auth.is_authorized_dag(method="PUT", user=user, details=details):
                raise UsageError(
                    f"the {BACKFILL_DAG_ID} DAG is paused and {user.get_name()} may not unpause it"
                )
            model.is_paused = False
    run = trigger_dag(
        BACKFILL_DAG_ID,
        triggered_by=DagRunTriggeredByType.UI,
        triggering_user_name=user.get_name(),
        conf=dict(conf),
    )
    if run is None:
        raise UsageError(f"Airflow made no run of {BACKFILL_DAG_ID}")
    return str(run.run_id)


@app.post("/backfills", response_model=None)
def start_backfill(
    request: Request,
    user: Backfiller,
    rule_ids: Annotated[list[str] | None, Form()] = None,
    from_time: Annotated[str, Form()] = "",
    to_time: Annotated[str, Form()] = "",
    back: Annotated[str, Form()] = "",
) -> RedirectResponse | HTMLResponse:
    """Start a run of the backfill DAG from the page's form; the page lists it with the
    other backfill runs. A form that cannot be read comes back as written, the field
    named, and nothing runs."""
    from velocity.analyst.backfill_runs import asked_text
    from velocity.errors import UsageError

    written = {"rule_ids": rule_ids or [], "from_time": from_time, "to_time": to_time}
    try:
        conf = backfill_conf(rule_ids or [], from_time, to_time)
        run_id = _trigger_backfill(user, conf)
    except (UsageError, ValueError) as exc:
        data = _page_data(request, user, _params_of(back), backfill_form=written)
        data.flash = Flash(False, f"error: {exc}; no backfill started")
        return HTMLResponse(render_page(data), status_code=422)
    return _back(True, f"backfill run {run_id} queued: {asked_text(conf)}", back)


def _reviewed(review: Any) -> str:
    return (
        f"alert {review.alert_id}: {review.verdict.words} (ruleId {review.rule_id} "
        f"v{review.rule_version}), recorded by {review.who}"
    )


def _page_again(
    request: Request, user: Any, rule_text: str, flash: Flash, back: str = ""
) -> HTMLResponse:
    """The page (with the URL parameters it was posted from) with the rule text kept in
    the form and what was wrong with it."""
    data = _page_data(request, user, _params_of(back), rule_text=rule_text)
    data.flash = flash
    return HTMLResponse(render_page(data), status_code=200 if flash.ok else 422)


# JSON for scripts and tests: the same data the page shows.


@app.get("/api/rules")
def rules_json(user: User) -> Response:
    """The rules in force and the SHADOW candidates beside them (a candidate shares its
    ruleId with the rule it would replace: ``ruleState`` tells them apart), by (ruleId,
    version), each with its version."""
    from velocity.delta.reader import rules_in_force
    from velocity.domain.decimals import dumps_json

    # dumps_json keeps a decimal limit exact (a float would round it).
    rules = [{"version": r.version, **r.to_json()} for r in rules_in_force(_settings())]
    return Response(dumps_json(rules), media_type="application/json")


@app.post("/api/preview")
def preview_json(user: User, body: dict[str, Any]) -> Response:
    """What rules would have fired, saving nothing: ``{"rules": <a rule, an array of rules,
    or their JSON text>, "hours": 1}`` (hours before the newest accepted event, default 1).
    Per rule: its alerts and the version in force's, per hour, a sample with explanations,
    and the difference by transaction (added, removed, changed value); ``seconds`` it took.
    400 names what is wrong (a rule's field, the hours, too many events)."""
    from velocity.domain.decimals import dumps_json
    from velocity.errors import UsageError

    rules = body.get("rules", "")
    text = rules if isinstance(rules, str) else json.dumps(rules)
    try:
        hours = body.get("hours", 1)
        shown = _preview(
            _settings(), text, hours if isinstance(hours, (int, float)) else _hours(str(hours))
        )
    except UsageError as exc:  # InvalidRuleError too: every bad field named
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc
    return Response(dumps_json(shown), media_type="application/json")


@app.get("/api/shadow")
def shadow_json(user: User) -> list[dict[str, Any]]:
    """Each SHADOW candidate beside its rule in force over the last 24 h (from when the
    candidate was applied, if later): per side its alerts (transactions fired on), reviews
    and precision, and the transactions both fired on, only the candidate, only the rule in
    force. Promote or discard one with `POST /velocity/rules/ID/promote|discard`."""
    from velocity.delta.reader import rule_history

    settings = _settings()
    return [c.to_json() for c in _shadow(settings, rule_history(settings), None)]


def _search_or_400(params: Mapping[str, str], settings: Any) -> tuple[AlertSearch, Any]:
    """The search a request asks for and every rule version, or 400 naming the field."""
    from velocity.delta.reader import rule_history

    history = rule_history(settings)
    try:
        return alert_search(params, {r.rule_id for r in history}), history
    except InvalidFilterError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc


@app.get("/api/alerts")
def alerts_json(request: Request, user: User) -> dict[str, Any]:
    """A page of alerts, newest first by decision time: ``rule``, ``kind``, ``key``
    (``payerId=p-1`` or a value), ``tx``, ``from`` and ``to`` (eventTime, UTC, inclusive),
    ``limit`` (default 50), ``before`` (the ``older`` of the previous page). 400 names a
    bad field."""
    settings = _settings()
    search, _ = _search_or_400(request.query_params, settings)
    page, error = search_alerts(settings, search)
    return {
        "alerts": list(page.alerts),
        "older": None if page.older is None else page.older.text(),
        "error": error,
    }


def _sse(event: str, data: Mapping[str, Any], entry_id: str | None = None) -> str:
    """One server-sent event; its id is the alert stream position the browser resumes at."""
    position = f"id: {entry_id}\n" if entry_id else ""
    return f"event: {event}\n{position}data: {json.dumps(data)}\n\n"


def _live_rows(
    entries: Sequence[tuple[str, Mapping[str, Any]]],
    search: AlertSearch,
    view: AlertsView,
    settings: Any,
) -> list[tuple[str, str, str]]:
    """(alertId, stream id, row) of each entry that passes the search. Run in a worker
    thread: a storm's entries parsed in the event loop held a page's click for seconds."""
    from velocity.delta.reader import rule_history

    rows = []
    for entry_id, fields in entries:
        alert = _published_alert(fields)
        if alert is None or not search.query.matches(alert):
            continue
        if (alert["ruleId"], alert["ruleVersion"]) not in view.rule_versions:
            # A rule version applied since the connection opened.
            view.rule_versions = {(r.rule_id, r.version): r for r in rule_history(settings)}
        rows.append((alert["alertId"], entry_id, alert_row(alert, view, None, fresh=True)))
    return rows


@app.get("/api/alerts/live", response_model=None)
async def alerts_live(request: Request, user: User) -> StreamingResponse:
    """Server-sent events for the page open in a browser: ``alert`` (the row of each alert
    published after ``after`` — an alert stream id — that passes the filter, the same
    fields as /api/alerts), ``health`` (the stream's figures, every 5 s) and ``failed``
    (the alert stream cannot be read). The connection ends after 30 s and the browser
    resumes from the last event's id (``Last-Event-ID``)."""
    from velocity.redis import alert_feed

    settings = await run_in_threadpool(_settings)
    search, history = await run_in_threadpool(_search_or_400, request.query_params, settings)
    after = request.headers.get("last-event-id") or request.query_params.get("after")
    if not after or not _STREAM_ID.fullmatch(after):
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "field 'after': an alert stream id")
    view = AlertsView(base=URL_PREFIX, can_edit=_can_edit(user), query=search.query)
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
                    yield _sse("health", {"html": await run_in_threadpool(_health_html, settings)})
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


def _updated_cases(settings: Any, case_filter: Any, since_ms: int) -> list[str]:
    from velocity.analyst.case_queue import updated_since

    return updated_since(_cases(settings), case_filter, since_ms)


def _matching(entries: list[tuple[str, dict[str, Any]]], query: AlertFilter) -> int:
    """How many of the alert stream's ``entries`` are alerts that pass ``query``."""
    if query.empty:
        return sum(1 for _, fields in entries if "alert" in fields)
    found = 0
    for _, fields in entries:
        alert = _published_alert(fields)
        if alert is not None and query.matches(alert):
            found += 1
    return found


@app.get("/api/page/live", response_model=None)
async def page_live(request: Request, user: User) -> StreamingResponse:
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

    settings = await run_in_threadpool(_settings)
    params = _params(request.query_params)
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
                    yield _sse("health", {"html": await run_in_threadpool(_health_html, settings)})
                if since is not None and now >= cases_due:
                    cases_due = now + _LIVE_CASES_SECONDS
                    changed, _ = await run_in_threadpool(
                        _read, "cases", lambda: _updated_cases(settings, case_filter, since)
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


@app.get("/api/cases")
def cases_json(request: Request, user: User) -> dict[str, Any]:
    """A page of the queue, newest activity first: ``case_rule``, ``case_status`` (open,
    assigned, closed, all; empty: not closed), ``case_assignee`` (a name, or none),
    ``case_key``, ``case_limit`` (default 50, at most 200), ``case_before`` (the ``older``
    of the previous page). Each case as `velocity cases list --json` prints it; 400 names a
    bad field."""
    from velocity.analyst.case_queue import parse_case_query, queue_page
    from velocity.delta.reader import rule_history

    settings = _settings()
    try:
        query = parse_case_query(
            _params(request.query_params), {r.rule_id for r in rule_history(settings)}
        )
    except InvalidFilterError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc
    page = queue_page(_cases(settings), query)
    return {
        "cases": [c.to_json() for c in page.cases],
        "older": None if page.older is None else page.older.text(),
        "matching": page.matching,
    }


@app.get("/api/clicks")
def clicks_json(user: User, what: str = "") -> list[dict[str, Any]]:
    """The newest timed clicks this api-server process received (at most 2 000, oldest
    first): what was clicked (its data-testid), when in the browser (``clickedAt``, epoch
    ms), when the request reached the page's app (``receivedAt``) and the difference
    (``delayMs``); ``what`` narrows to one kind."""
    return [c for c in list(_CLICKS) if not what or c["what"] == what]


def _health_html(settings: Any) -> str:
    from velocity.operating import stream_control

    health, error = _read("stream status", lambda: stream_control.check_health(settings).to_json())
    return health_html(health, error)


@app.get("/api/alerts/{alert_id}/explanation")
def explanation_json(alert_id: str, user: User) -> Response:
    from velocity.delta.reader import NotWrittenYetError
    from velocity.domain.decimals import dumps_json
    from velocity.errors import UsageError

    try:
        explained = _explain(_settings(), alert_id)
    except NotWrittenYetError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from exc
    except UsageError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc
    except ValueError as exc:  # a RETRACTION: explain the alert it withdraws
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc
    return Response(dumps_json(explained), media_type="application/json")


@app.post("/api/alerts/{alert_id}/reviews", status_code=status.HTTP_201_CREATED)
def review_json(alert_id: str, user: Reviewer, body: dict[str, Any]) -> dict[str, Any]:
    """Record a review, ``{"verdict": ..., "note": ...}``: the review as recorded, or 400
    naming the field at fault (nothing recorded)."""
    from velocity.analyst.reviews import InvalidReviewError

    try:
        review = _record_review(
            _settings(), user, alert_id, body.get("verdict", ""), body.get("note", "")
        )
    except InvalidReviewError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc
    return dict(review.to_json())


@app.get("/api/precision")
def precision_json(user: User) -> list[dict[str, Any]]:
    """Each rule version's alerts in the last 24 h and 7 days and its review figures."""
    return [p.to_json() for p in _precision(_settings())]


@app.get("/api/openapi.json", include_in_schema=False)
def openapi_json(user: User) -> dict[str, Any]:
    return app.openapi()


@app.get("/api/health")
def health_json(user: User) -> dict[str, Any]:
    from velocity.operating import stream_control

    return stream_control.check_health(_settings()).to_json()


@app.get("/api/lookup")
def lookup_json(user: User, rule: str, key: str) -> dict[str, Any]:
    from velocity.errors import UsageError

    try:
        return _lookup(_settings(), rule, key)
    except (ValueError, KeyError, UsageError) as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc
