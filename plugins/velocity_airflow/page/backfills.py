"""A backfill run started from the page: a run of the backfill DAG, through Airflow's own
code in this process (``airflow.api.common.trigger_dag``), with the user's permissions.
(The page lists the runs: ``home.backfill_runs``.)"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from velocity.analyst.alert_search import InvalidFilterError
from velocity_airflow.page import access, common, home
from velocity_airflow.page.backfills_html import BACKFILL_DAG_ID
from velocity_airflow.page.home_html import Flash, render_page

changes = APIRouter(dependencies=[access.START_BACKFILL])


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


@changes.post("/backfills", response_model=None)
def start_backfill(
    request: Request,
    user: access.Backfiller,
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
        data = home.page_data(request, user, common.params_of(back), backfill_form=written)
        data.flash = Flash(False, f"error: {exc}; no backfill started")
        return HTMLResponse(render_page(data), status_code=422)
    return common.back(True, f"backfill run {run_id} queued: {asked_text(conf)}", back)
