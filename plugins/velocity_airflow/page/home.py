"""The whole page: everything it shows (``page_data``: the queue, health, rules, alerts,
reviews, shadow rules, backfill runs, a lookup), read section by section (a section that
cannot be read says so and the others are shown), and drawn by ``home_html``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from velocity_airflow.page import access, alerts, cases, common, flash, lookups, shadow
from velocity_airflow.page.backfills_html import BACKFILL_DAG_ID
from velocity_airflow.page.common import URL_PREFIX
from velocity_airflow.page.home_html import Flash, PageData, render_page

router = APIRouter()


def page_data(
    request: Request, user: Any, params: Mapping[str, str] | None = None, **extra: Any
) -> PageData:
    """Everything the page shows, for the URL parameters of ``request`` (or ``params``:
    a post's page drawn again, with those it was posted from)."""
    from velocity.delta.reader import rule_history
    from velocity.domain.rule_changes import RuleBook
    from velocity.operating import stream_control

    query = params = common.params(request.query_params) if params is None else dict(params)
    now_ms = int(time.time() * 1000)
    settings, settings_error = common.read("Velocity settings", access.settings)
    data = PageData(
        user=user.get_name(),
        can_edit=access.can_edit(user),
        base=URL_PREFIX,
        params=params,
        now_ms=now_ms,
        csrf=access.csrf_token(request),
        **extra,
    )
    if settings is None:
        data.health_error = data.rules_error = data.alerts_error = settings_error
        data.precision_error = data.shadow_error = data.queue_error = settings_error
        return data
    data.write_behind_seconds = settings.write_behind_seconds
    health, data.health_error = common.read(
        "stream status", lambda: stream_control.check_health(settings).to_json()
    )
    data.health = health
    history, data.rules_error = common.read("rules", lambda: rule_history(settings))
    # The rules in force, one per ruleId: a SHADOW candidate is listed beside its rule.
    data.rules = [r for _, r in sorted(RuleBook.of(history or []).standing().items())]
    data.rule_versions = {(r.rule_id, r.version): r for r in history or []}
    data.queue, data.queue_page, data.queue_error = cases.queue(settings, data, history)
    data.rule_rates, data.rates_error = common.read(
        "alerts a minute", lambda: rule_rates(settings, [r.rule_id for r in data.rules], now_ms)
    )
    alerts.alert_page(data, settings, query, history)
    data.reviews, data.reviews_error = common.read(
        "reviews", lambda: alerts.latest_reviews(settings)
    )
    data.precision, data.precision_error = common.read(
        "alerts and reviews per rule version", lambda: alerts.precision(settings)
    )
    if history is None:
        data.shadow_error = data.rules_error
    else:
        # The reviews are read only when a candidate stands (most pages have none).
        data.shadow, data.shadow_error = common.read(
            "shadow rules", lambda: shadow.comparisons(settings, history, None)
        )
    data.backfills, data.backfills_error = common.read(
        "backfill runs", lambda: backfill_runs(settings, user)
    )
    if query.get("alert"):
        data.explanation, data.explanation_error = common.read(
            "explanation", lambda: alerts.explain(settings, query["alert"])
        )
    if query.get("lookup_rule") or query.get("lookup_key"):
        data.lookup_form = {k: query.get(k, "") for k in ("lookup_rule", "lookup_key")}
        data.lookup, data.lookup_error = common.read(
            "window aggregate",
            lambda: lookups.lookup(
                settings, query.get("lookup_rule", ""), query.get("lookup_key", "")
            ),
        )
    return data


def rule_rates(settings: Any, rule_ids: list[int], now_ms: int) -> Any:
    from velocity.delta.reader import rule_rates

    return rule_rates(settings, rule_ids, now_ms)


def backfill_runs(settings: Any, user: Any) -> list[Any]:
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


def page_again(
    request: Request, user: Any, rule_text: str, said: Flash, back: str = ""
) -> HTMLResponse:
    """The page (with the URL parameters it was posted from) with the rule text kept in
    the form and what was wrong with it."""
    data = page_data(request, user, common.params_of(back), rule_text=rule_text)
    data.flash = said
    return HTMLResponse(render_page(data), status_code=200 if said.ok else 422)


@router.get("/", response_class=HTMLResponse)
def page(request: Request, user: access.User) -> HTMLResponse:
    data = page_data(request, user)
    sealed = request.cookies.get(flash.COOKIE)
    if sealed:
        data.flash = flash.unseal(sealed, common.flash_key())
    response = HTMLResponse(render_page(data))
    if sealed:
        response.delete_cookie(flash.COOKIE, path=URL_PREFIX)  # shown once
    return response
