"""The page's responsiveness, measured: ``ClickTiming`` notes when a click's request
reached this app (the click's moment travels in a short-lived cookie the page's script
sets), and ``/api/clicks`` lists the clicks noted."""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from fastapi import APIRouter

# Timed clicks kept for /api/clicks (the newest; one api-server process holds its own).
_CLICKS_KEPT = 2000
_CLICK_COOKIE = re.compile(
    r"(?:^|;\s*)velocity_click=([a-z0-9]{1,16})\.([0-9]{10,16})\.([A-Za-z0-9_-]{0,40})"
)
# Requests that do not answer a click (the live feed reconnecting carries the cookie too).
_UNTIMED = ("/api/page/live", "/api/alerts/live", "/api/clicks")

router = APIRouter()


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


@router.get("/api/clicks")
def clicks_json(what: str = "") -> list[dict[str, Any]]:
    """The newest timed clicks this api-server process received (at most 2 000, oldest
    first): what was clicked (its data-testid), when in the browser (``clickedAt``, epoch
    ms), when the request reached the page's app (``receivedAt``) and the difference
    (``delayMs``); ``what`` narrows to one kind."""
    return [c for c in list(_CLICKS) if not what or c["what"] == what]
