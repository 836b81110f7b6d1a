"""Who may do what on the page, declared once as FastAPI dependencies, and the settings.

Every route needs a signed-in user (``current_user``: the app's own dependency). A route
that changes something is on a router of changes, which declares one write check for all
its routes (``EDIT_RULES``, ``REVIEW``, ``START_BACKFILL``): edit permission on the
``run_stream`` DAG, and a post from this page (its ``Origin``) unless the request carries
an ``Authorization`` header. ``check_routes`` refuses an app with a route that changes
something and has no write check, so a new endpoint cannot forget it.

Routers look ``settings``, ``hook`` and ``can_edit`` up here at call time
(``access.settings()``), so one replacement of the attribute here (a test's) holds for all.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import Depends, HTTPException, Request, status
from fastapi.routing import APIRoute

# Who may edit this DAG may change the rules it runs with.
RULES_DAG_ID = "run_stream"
# Posts that change nothing: a preview is a read, open to any signed-in user (a viewer too).
READS_BY_POST = frozenset({"/preview", "/api/preview"})


class SignIn(Exception):
    """No signed-in user: an HTML request goes to Airflow's login page and back."""


async def current_user(request: Request) -> Any:
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi.security import HTTPAuthorizationCredentials

    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    bearer = HTTPAuthorizationCredentials(scheme=scheme, credentials=token) if token else None
    try:
        return await get_user(request, None, bearer)
    except HTTPException as exc:
        if exc.status_code in (status.HTTP_401_UNAUTHORIZED, status.HTTP_403_FORBIDDEN):
            raise SignIn from exc
        raise


def can_edit(user: Any) -> bool:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails

    return bool(
        get_auth_manager().is_authorized_dag(
            method="PUT", user=user, details=DagDetails(id=RULES_DAG_ID)
        )
    )


def may_change(what: str) -> Any:
    """The dependency of a route that changes something: a signed-in user with edit
    permission on the run_stream DAG, posting from this page (or with a bearer token)."""

    async def changer(request: Request) -> Any:
        user = await current_user(request)
        if not can_edit(user):
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


SIGNED_IN = Depends(current_user)
EDIT_RULES = Depends(may_change("change rules"))
# Reviewing an alert is an analyst's change: the same permission as a rule change.
REVIEW = Depends(may_change("review alerts"))
# So is starting a backfill from the page (Airflow then checks its own run permission).
START_BACKFILL = Depends(may_change("start a backfill"))

# A route's user, as its parameter (the router's dependency already checked it; FastAPI
# runs a dependency once a request).
User = Annotated[Any, SIGNED_IN]
Editor = Annotated[Any, EDIT_RULES]
Reviewer = Annotated[Any, REVIEW]
Backfiller = Annotated[Any, START_BACKFILL]


def check_routes(routes: Iterable[Any]) -> None:
    """Refuse (``RuntimeError``) a route without the signed-in user, or one that changes
    something (a method other than GET) without a write check, unless it is a read by post."""
    checks = {EDIT_RULES.dependency, REVIEW.dependency, START_BACKFILL.dependency}
    for route in routes:
        if not isinstance(route, APIRoute):
            continue
        calls = {d.call for d in route.dependant.dependencies}
        if current_user not in calls:
            raise RuntimeError(f"{route.path}: no signed-in user")
        changes = bool(route.methods - {"GET", "HEAD"}) and route.path not in READS_BY_POST
        if changes and not calls & checks:
            raise RuntimeError(f"{route.path} changes something: it needs a write check")


def hook() -> Any:
    from velocity_airflow.hooks import VelocityHook

    return VelocityHook()


def settings() -> Any:
    return hook().get_conn()
