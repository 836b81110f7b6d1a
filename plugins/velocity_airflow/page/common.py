"""What the page's routers share: where the app is mounted, the URL parameters kept from
page to page, a section read that may fail, and the redirect back to the page with a
message shown once (``flash``)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from functools import cache
from typing import Any
from urllib.parse import parse_qsl, urlencode

from fastapi import status
from fastapi.responses import RedirectResponse

from velocity_airflow.page import access, flash
from velocity_airflow.page.home_html import Flash

URL_PREFIX = "/velocity"
# A query string longer than this is not a page's: cut, never echoed back whole.
_PARAMS_MAX = 4000


def read(section: str, read: Any) -> tuple[Any, str | None]:
    """``read()``, or None and a message naming the section that could not be read."""
    try:
        return read(), None
    except Exception as exc:  # a page with one broken section still shows the others
        return None, f"cannot read the {section}: {exc}"


def params(query: Mapping[str, str]) -> dict[str, str]:
    """The page's URL parameters (the first value of each, non-empty), to keep."""
    kept: dict[str, str] = {}
    for name, value in query.items():
        if value and name not in kept and len(name) <= 40:
            kept[name] = value[:_PARAMS_MAX]
    return kept


def params_of(back: str) -> dict[str, str]:
    """A change's ``back`` field (the page's query string when the form was posted) as
    parameters; anything unreadable is left out."""
    return params(dict(parse_qsl(back[:_PARAMS_MAX], keep_blank_values=False)))


@cache
def flash_key() -> bytes:
    """A key of the page's own, derived from the page's secret (``access.page_secret``:
    the api-server's, else one kept in the data dir): the same on every api-server worker."""
    return hashlib.sha256(b"velocity-flash\0" + access.page_secret()).digest()


def back(ok: bool, text: str, back: str = "", path: str = "/") -> RedirectResponse:
    """Back to the page (``path`` under the app) with the URL parameters it was posted
    from (``back``: its query string), which shows ``text`` once."""
    query = urlencode(params_of(back))
    response = RedirectResponse(
        f"{URL_PREFIX}{path}" + (f"?{query}" if query else ""), status.HTTP_303_SEE_OTHER
    )
    response.set_cookie(
        flash.COOKIE, flash.seal(Flash(ok, text), flash_key()),
        max_age=300, path=URL_PREFIX, httponly=True, samesite="lax",
    )  # fmt: skip
    return response
