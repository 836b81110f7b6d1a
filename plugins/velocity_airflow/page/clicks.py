"""The page's responsiveness, measured: ``ClickTiming`` notes when each request reached
this app, and once the signed-in user is known (``TIMED``, an app dependency after
``access.current_user``) a request carrying a click's cookie (the click's moment, which the
page's script sets) is recorded; ``/api/clicks`` lists the clicks recorded. A request
nobody signed in to records nothing."""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from velocity_airflow.page import access

# Timed clicks kept for /api/clicks (the newest; one api-server process holds its own).
_CLICKS_KEPT = 2000
_CLICK_COOKIE = re.compile(
    r"(?:^|;\s*)velocity_click=([a-z0-9]{1,16})\.([0-9]{10,16})\.([A-Za-z0-9_-]{0,40})"
)
# Requests that do not answer a click (the live feed reconnecting carries the cookie too).
_UNTIMED = ("/api/page/live", "/api/alerts/live", "/api/clicks")
# Where ClickTiming leaves when a request reached the app (the request's state).
_RECEIVED = "velocity_received_ms"

router = APIRouter()


class ClickTiming:
    """ASGI middleware: notes when each request reached this app, before anything else
    (authentication included) runs; ``timed_click`` records it once the user is known."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope.get("type") == "http":
            scope.setdefault("state", {})[_RECEIVED] = time.time() * 1000
        await self.app(scope, receive, send)


async def timed_click(request: Request, user: Annotated[Any, Depends(access.current_user)]) -> None:
    """Records the click a signed-in user's request answers (its cookie), once, with when
    the request reached this app. Runs after ``access.current_user``: a request nobody
    signed in to stops there and records nothing."""
    path = str(request.scope.get("path", ""))
    cookie = request.headers.get("cookie")
    if not cookie or path.endswith(_UNTIMED):
        return
    received = request.scope.get("state", {}).get(_RECEIVED) or time.time() * 1000
    sent = request.headers.get("x-velocity-sent", "")
    _note_click(cookie, request.scope, path, received, sent)


TIMED = Depends(timed_click)


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


@router.get("/api/clicks")
def clicks_json(what: str = "") -> list[dict[str, Any]]:
    """The newest timed clicks this api-server process received (at most 2 000, oldest
    first): what was clicked (its data-testid), when in the browser (``clickedAt``, epoch
    ms), when the request reached the page's app (``receivedAt``) and the difference
    (``delayMs``); ``what`` narrows to one kind."""
    return [c for c in list(_CLICKS) if not what or c["what"] == what]
