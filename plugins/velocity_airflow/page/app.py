"""The Velocity page's FastAPI app: one router a resource, included here; the signed-in
user is the app's dependency (every route needs one), then the click a request answers is
timed (``clicks.TIMED``: signed-in users' only), and each router of changes declares its
write check (``access``). Exports ``URL_PREFIX`` and ``app`` for the plugin."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from fastapi import FastAPI, Request, status
from fastapi.responses import JSONResponse, RedirectResponse, Response

from velocity_airflow.page import (
    access,
    alerts,
    backfills,
    cases,
    check,
    clicks,
    health,
    home,
    live,
    lookups,
    preview,
    rules,
    shadow,
)
from velocity_airflow.page.common import URL_PREFIX

__all__ = ["URL_PREFIX", "app"]

# No docs pages (the Swagger UI would load its scripts from a CDN, and Airflow does not
# guard them): the schema is served at /api/openapi.json behind the login.
app = FastAPI(
    title="Velocity",
    description="Rules, alerts and the stream of Velocity",
    docs_url=None,
    redoc_url=None,
    openapi_url=None,
    dependencies=[access.SIGNED_IN, clicks.TIMED],
)
app.add_middleware(clicks.ClickTiming)


@app.exception_handler(access.SignIn)
async def _sign_in(request: Request, exc: access.SignIn) -> Response:
    if "text/html" in request.headers.get("accept", ""):
        # Back to the page asked for; a post is not repeated: back to the page itself.
        here = request.url.path if request.method == "GET" else f"{URL_PREFIX}/"
        query = f"?{request.url.query}" if request.method == "GET" and request.url.query else ""
        back = urlencode({"next": f"/plugin/velocity{here}{query}"})
        return RedirectResponse(f"/api/v2/auth/login?{back}", status.HTTP_303_SEE_OTHER)
    return JSONResponse({"detail": "Not authenticated"}, status.HTTP_401_UNAUTHORIZED)


for router in (
    home.router,
    rules.changes,
    preview.router,
    alerts.changes,
    cases.router,
    alerts.router,
    cases.changes,
    backfills.changes,
    rules.router,
    shadow.router,
    live.router,
    clicks.router,
    health.router,
    lookups.router,
    check.router,
):
    app.include_router(router)


@app.get("/api/openapi.json", include_in_schema=False)
def openapi_json() -> dict[str, Any]:
    return app.openapi()


access.check_routes(app.routes)
