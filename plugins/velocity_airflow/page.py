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
SHADOW candidate beside its rule in force (``velocity.shadow_compare``), to promote or
discard.

A preview of the add-rules form's rules (what they would have fired over the last hours
of the live events, ``velocity.delta.preview_reader``) is computed in this process too,
in a worker thread (the routes are plain functions, which FastAPI runs off the event
loop); it writes nothing, so any signed-in user may ask for one.

Airflow's authentication guards every route: the page needs a signed-in user; a change
(a rule change or a review) needs permission to edit the ``run_stream`` DAG
(SimpleAuthManager: roles user, op and admin, not viewer), since a rule change changes
what the stream does. A change must come from this page (its ``Origin``), so another
site cannot post one with the user's cookie.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import subprocess
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Collection, Mapping
from dataclasses import dataclass
from functools import cache
from itertools import islice
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode, urlsplit

from fastapi import Depends, FastAPI, Form, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)

from velocity.alert_search import (
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
from velocity_airflow import flash
from velocity_airflow.alerts_html import AlertsView, alert_row
from velocity_airflow.page_html import Flash, PageData, health_html, render_page
from velocity_airflow.plans import rule_id_text

URL_PREFIX = "/velocity"
# Who may edit this DAG may change the rules it runs with.
RULES_DAG_ID = "run_stream"
# The DAG whose runs the page lists as backfill runs.
BACKFILL_DAG_ID = "backfill_alerts"
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

# No docs pages (the Swagger UI would load its scripts from a CDN, and Airflow does not
# guard them): the schema is served at /api/openapi.json behind the login.
app = FastAPI(
    title="Velocity",
    description="Rules, alerts and the stream of Velocity",
    docs_url=None,
    redoc_url=None,
    openapi_url=None,
)


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
    """What a page of alerts was asked for (``velocity.alert_search``)."""

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
    from velocity.delta.reader import alert_ref, review_store
    from velocity.reviews import AlertRef, check_fields

    check_fields(verdict, note, user.get_name())  # a bad field: no table read
    alert = alert_ref(settings, alert_id)
    if alert is None:
        published = _alert_on_stream(settings, alert_id)
        if published is not None and published.keys() >= {"ruleVersion", "decisionTime"}:
            alert = AlertRef.of(published)
    return review_store(settings).record(alert_id, alert, verdict, note, user.get_name())


def _lookup(settings: Any, rule: str, key: str) -> dict[str, Any]:
    from velocity.redis import mirror
    from velocity.schema import parse_key_values

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


def _page_data(request: Request, user: Any, **extra: Any) -> PageData:
    from velocity import stream_control
    from velocity.delta.reader import rule_history
    from velocity.reviews import latest_reviews
    from velocity.rule_changes import RuleBook

    query = request.query_params
    settings, settings_error = _read("Velocity settings", _settings)
    data = PageData(user=user.get_name(), can_edit=_can_edit(user), base=URL_PREFIX, **extra)
    if settings is None:
        data.health_error = data.rules_error = data.alerts_error = settings_error
        data.precision_error = data.shadow_error = settings_error
        return data
    health, data.health_error = _read(
        "stream status", lambda: stream_control.check_health(settings).to_json()
    )
    data.health = health
    history, data.rules_error = _read("rules", lambda: rule_history(settings))
    # The rules in force, one per ruleId: a SHADOW candidate is listed beside its rule.
    data.rules = [r for _, r in sorted(RuleBook.of(history or []).standing().items())]
    data.rule_versions = {(r.rule_id, r.version): r for r in history or []}
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


def _backfill_runs(settings: Any, user: Any) -> list[Any]:
    """The backfill runs, newest first: what each recorded in the ``backfills`` table
    (delta-rs) beside Airflow's runs of the backfill DAG (state, form, link)."""
    from velocity.backfill_runs import backfill_runs
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

    from velocity.backfill_runs import AirflowRun

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


def _back(ok: bool, text: str) -> RedirectResponse:
    """Back to the page, which shows ``text`` once."""
    response = RedirectResponse(f"{URL_PREFIX}/", status.HTTP_303_SEE_OTHER)
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
    from velocity.rule_changes import outcome_lines

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
def change_rule_state(rule_id: int, action: str, user: Editor) -> RedirectResponse:
    """Pause, activate or delete the rule in force; promote the SHADOW candidate of
    ``rule_id`` to its ACTIVE version, or discard it (`velocity rules ACTION ID`)."""
    from velocity.rule_changes import RULE_ACTIONS, rule_action

    if action not in RULE_ACTIONS:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no rule action {action!r}")
    return _back(*_apply_rules([rule_action(action, rule_id)]))


@app.post("/rules", response_model=None)
def add_rules(
    request: Request,
    user: Editor,
    rules_json: Annotated[str, Form()] = "",
    intent: Annotated[str, Form()] = "validate",
) -> RedirectResponse | HTMLResponse:
    from velocity.errors import InvalidRuleError, UsageError
    from velocity.rules import Control, ControlType, parse_rules

    try:
        entries = parse_rules(rules_json)
    except InvalidRuleError as exc:
        # The lines `velocity rules validate` prints, so the page and the CLI agree.
        text = "invalid rules, nothing applied:\n" + "\n".join(f"  {p}" for p in exc.problems)
        return _page_again(request, user, rules_json, Flash(False, text))
    except UsageError as exc:
        return _page_again(request, user, rules_json, Flash(False, f"error: {exc}"))
    if intent == "shadow":
        return _shadow_rules(request, user, rules_json, entries)
    if intent != "apply":
        text = f"{len(entries)} valid rule entries"
        return _page_again(request, user, rules_json, Flash(True, text))
    clear_state = ControlType.CLEAR_STATE_ALL
    if not any(isinstance(e, Control) and e.control_type is clear_state for e in entries):
        return _back(*_apply_rules(entries))
    with tempfile.TemporaryDirectory(prefix="velocity-rules-") as folder:
        path = Path(folder) / "rules.json"
        path.write_text(rules_json, encoding="utf-8")
        ok, text = _run_rules_command(["rules", "apply", str(path)])
    return _back(ok, text)


def _shadow_rules(
    request: Request, user: Any, rules_json: str, entries: Any
) -> RedirectResponse | HTMLResponse:
    """Every rule of ``entries`` as a SHADOW candidate, whatever its ruleState says, as
    `velocity rules shadow` adds them."""
    from velocity.errors import UsageError
    from velocity.rule_changes import as_candidates

    try:
        candidates = as_candidates(entries)
    except UsageError as exc:
        return _page_again(request, user, rules_json, Flash(False, f"error: {exc}"))
    return _back(*_apply_rules(candidates))


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
    from velocity.errors import UsageError
    from velocity.rules import parse_rules

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
    data = _page_data(request, user, rule_text=rules_json, preview=shown, preview_hours=hours)
    data.flash = flash_shown
    ok = flash_shown is None
    return HTMLResponse(render_page(data), status_code=200 if ok else 422)


@app.post("/alerts/{alert_id}/review")
def review_alert(
    alert_id: str,
    user: Reviewer,
    verdict: Annotated[str, Form()] = "",
    note: Annotated[str, Form()] = "",
) -> RedirectResponse:
    from velocity.errors import UsageError

    try:
        review = _record_review(_settings(), user, alert_id, verdict, note)
    except UsageError as exc:  # the page says which field is wrong; nothing was recorded
        return _back(False, f"error: {exc}")
    return _back(True, _reviewed(review))


def _reviewed(review: Any) -> str:
    return (
        f"alert {review.alert_id}: {review.verdict.words} (ruleId {review.rule_id} "
        f"v{review.rule_version}), recorded by {review.who}"
    )


def _page_again(request: Request, user: Any, rule_text: str, flash: Flash) -> HTMLResponse:
    """The page with the rule text kept in the form and what was wrong with it."""
    data = _page_data(request, user, rule_text=rule_text)
    data.flash = flash
    return HTMLResponse(render_page(data), status_code=200 if flash.ok else 422)


# JSON for scripts and tests: the same data the page shows.


@app.get("/api/rules")
def rules_json(user: User) -> Response:
    """The rules in force and the SHADOW candidates beside them (a candidate shares its
    ruleId with the rule it would replace: ``ruleState`` tells them apart), by (ruleId,
    version), each with its version."""
    from velocity.decimals import dumps_json
    from velocity.delta.reader import rules_in_force

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
    from velocity.decimals import dumps_json
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


@app.get("/api/alerts/live", response_model=None)
async def alerts_live(request: Request, user: User) -> StreamingResponse:
    """Server-sent events for the page open in a browser: ``alert`` (the row of each alert
    published after ``after`` — an alert stream id — that passes the filter, the same
    fields as /api/alerts), ``health`` (the stream's figures, every 5 s) and ``failed``
    (the alert stream cannot be read). The connection ends after 30 s and the browser
    resumes from the last event's id (``Last-Event-ID``)."""
    from velocity.delta.reader import rule_history
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
                sent = position
                for entry_id, fields in entries:
                    position = entry_id
                    alert = _published_alert(fields)
                    if alert is None or not search.query.matches(alert):
                        continue
                    if (alert["ruleId"], alert["ruleVersion"]) not in view.rule_versions:
                        # A rule version applied since the connection opened.
                        latest = await run_in_threadpool(rule_history, settings)
                        view.rule_versions = {(r.rule_id, r.version): r for r in latest}
                    row = alert_row(alert, view, None, fresh=True)
                    yield _sse("alert", {"alertId": alert["alertId"], "html": row}, entry_id)
                    sent = entry_id
                if sent != position:  # entries that did not pass: resume after them
                    yield _sse("position", {}, position)
        finally:
            await client.aclose()

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


def _health_html(settings: Any) -> str:
    from velocity import stream_control

    health, error = _read("stream status", lambda: stream_control.check_health(settings).to_json())
    return health_html(health, error)


@app.get("/api/alerts/{alert_id}/explanation")
def explanation_json(alert_id: str, user: User) -> Response:
    from velocity.decimals import dumps_json
    from velocity.delta.reader import NotWrittenYetError
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
    from velocity.reviews import InvalidReviewError

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
    from velocity import stream_control

    return stream_control.check_health(_settings()).to_json()


@app.get("/api/lookup")
def lookup_json(user: User, rule: str, key: str) -> dict[str, Any]:
    from velocity.errors import UsageError

    try:
        return _lookup(_settings(), rule, key)
    except (ValueError, KeyError, UsageError) as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc
