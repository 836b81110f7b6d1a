"""Who may do what on the page, declared once as FastAPI dependencies, and the settings.

Every route needs a signed-in user (``current_user``: the app's own dependency). A route
that changes something, or runs a preview, is on a router of changes, which declares one
write check for all its routes (``EDIT_RULES``, ``REVIEW``, ``START_BACKFILL``,
``PREVIEW``): edit permission on the ``run_stream`` DAG, and then either

- the request carries Airflow's session cookie (a browser): it must carry the page's token
  (``csrf_token``, a form field or the ``X-CSRF-Token`` header, an HMAC of the session
  cookie under the page's secret: no server-side state) and come from this page (its
  ``Origin``, else its ``Referer``), whatever other headers it carries;
- or it carries no session cookie and a bearer token (``Authorization: Bearer``, a
  script), which is then what signed the user in: nothing a browser sends by itself.

Anything else is refused with 403. ``check_routes`` refuses an app with a route that is
not a GET and has no write check, so a new endpoint cannot forget it.

Routers look ``settings``, ``hook`` and ``can_edit`` up here at call time
(``access.settings()``), so one replacement of the attribute here (a test's) holds for all.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Iterable
from functools import cache
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import Depends, HTTPException, Request, status
from fastapi.routing import APIRoute

# Who may edit this DAG may change the rules it runs with.
RULES_DAG_ID = "run_stream"
# Airflow's session cookie (``airflow.api_fastapi.auth.managers.base_auth_manager``'s
# COOKIE_NAME_JWT_TOKEN): the signed-in user's JWT, which the browser sends by itself.
SESSION_COOKIE = "_token"
# The page's token: the hidden field of every form it draws, and the header its script sends.
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"
# Where the page keeps its own secret when Airflow has no [api] secret_key.
SECRET_FILE = "page-secret"


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


def known_users() -> list[str] | None:
    """The users Airflow's auth manager knows, by name, to assign cases to: with
    SimpleAuthManager, its ``[core] simple_auth_manager_users``; None with an auth manager
    that cannot list its users (FAB, Keycloak, …)."""
    from airflow.configuration import conf

    manager = conf.get("core", "auth_manager", fallback="") or ""
    if manager.rpartition(".")[2] != "SimpleAuthManager":
        return None
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

    return [user.username for user in SimpleAuthManager.get_users()]


@cache
def page_secret() -> bytes:
    """The page's secret: Airflow's ``[api] secret_key`` (the same on every api-server
    worker), else one drawn once and kept in ``<data dir>/page-secret`` (readable by its
    owner only)."""
    from airflow.configuration import conf

    configured = conf.get("api", "secret_key", fallback="")
    if configured:
        return configured.encode()
    return _secret_file(settings().data_dir / SECRET_FILE)


def _secret_file(path: Any) -> bytes:
    """The secret in ``path``, drawn and written first when there is none (the first
    writer wins: a worker that comes second reads the first's)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        drawn = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        descriptor = os.open(drawn, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write(secrets.token_hex(32))
        try:
            os.link(drawn, path)
        except FileExistsError:
            pass
        finally:
            drawn.unlink()
    return path.read_text().strip().encode()


@cache
def _csrf_key() -> bytes:
    return hashlib.sha256(b"velocity-csrf\0" + page_secret()).digest()


def csrf_token(request: Request) -> str:
    """The page's token for the session ``request`` carries (an HMAC of its session
    cookie); empty without one (a script's request, signed in by a bearer token)."""
    session = request.cookies.get(SESSION_COOKIE)
    if not session:
        return ""
    return hmac.new(_csrf_key(), session.encode(), hashlib.sha256).hexdigest()


async def _sent_token(request: Request) -> str:
    """The token a request presents: its header, else its form's field."""
    sent = request.headers.get(CSRF_HEADER)
    if sent:
        return sent
    content_type = request.headers.get("content-type", "")
    if content_type.startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
        # FastAPI has read the form already for the route's fields: this is that form.
        value = (await request.form()).get(CSRF_FIELD)
        return value if isinstance(value, str) else ""
    return ""


async def write_refusal(request: Request) -> str | None:
    """Why this request may not change anything whoever signed in, or None: a request with
    the session cookie needs the page's token and the page's Origin; one without it, the
    bearer token that signed the user in."""
    if SESSION_COOKIE not in request.cookies:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return None  # current_user took the user from this token: a script's request
        return "a change needs the page's token (csrf_token) or a bearer token"
    # A browser's request: the cookie goes with any request to this host, from any site,
    # and an Authorization header beside it proves nothing about where it came from.
    expected, sent = csrf_token(request), await _sent_token(request)
    if not expected or not sent or not hmac.compare_digest(sent.encode(), expected.encode()):
        return "a change must carry the page's token (csrf_token): reload the page and try again"
    origin = request.headers.get("origin") or request.headers.get("referer") or ""
    if urlsplit(origin).netloc != request.url.netloc:
        return "a change must come from this page"
    return None


def may_change(what: str) -> Any:
    """The dependency of a route that changes something: a signed-in user with edit
    permission on the run_stream DAG, posting from this page with its token (or signed in
    by a bearer token, with no session cookie)."""

    async def changer(request: Request) -> Any:
        user = await current_user(request)
        if not can_edit(user):
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                f"{user.get_name()} may not {what}: that needs edit permission on the "
                f"{RULES_DAG_ID} DAG",
            )
        refusal = await write_refusal(request)
        if refusal is not None:
            raise HTTPException(status.HTTP_403_FORBIDDEN, refusal)
        return user

    return changer


SIGNED_IN = Depends(current_user)
EDIT_RULES = Depends(may_change("change rules"))
# Reviewing an alert is an analyst's change: the same permission as a rule change.
REVIEW = Depends(may_change("review alerts"))
# So is starting a backfill from the page (Airflow then checks its own run permission).
START_BACKFILL = Depends(may_change("start a backfill"))
# A preview writes nothing, but takes both cores for seconds: the same permission as a
# rule change, and the same check (another site cannot start one with the user's cookie).
PREVIEW = Depends(may_change("preview rules"))
WRITE_CHECKS = (EDIT_RULES, REVIEW, START_BACKFILL, PREVIEW)

# A route's user, as its parameter (the router's dependency already checked it; FastAPI
# runs a dependency once a request).
User = Annotated[Any, SIGNED_IN]
Editor = Annotated[Any, EDIT_RULES]
Reviewer = Annotated[Any, REVIEW]
Backfiller = Annotated[Any, START_BACKFILL]
Previewer = Annotated[Any, PREVIEW]


def check_routes(routes: Iterable[Any]) -> None:
    """Refuse (``RuntimeError``) a route without the signed-in user, or one that is not a
    GET (a post, a put, a delete …) without a write check."""
    checks = {check.dependency for check in WRITE_CHECKS}
    for route in routes:
        if not isinstance(route, APIRoute):
            continue
        calls = {d.call for d in route.dependant.dependencies}
        if current_user not in calls:
            raise RuntimeError(f"{route.path}: no signed-in user")
        if route.methods - {"GET", "HEAD"} and not calls & checks:
            raise RuntimeError(f"{route.path} is not a GET: it needs a write check")


def hook() -> Any:
    from velocity_airflow.hooks import VelocityHook

    return VelocityHook()


def settings() -> Any:
    return hook().get_conn()
