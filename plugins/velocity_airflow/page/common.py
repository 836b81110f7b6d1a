"""What the page's routers share: where the app is mounted, the URL parameters kept from
page to page, a section read that may fail, and a change's answer: the redirect back to
the page with a message shown once (``flash``) for a plain form, or, for the page's script
(``in_place``), the outcome and the parts of the page the change redrew, as JSON."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any
from urllib.parse import parse_qsl, urlencode

from fastapi import Request, status
from fastapi.responses import JSONResponse, RedirectResponse, Response

from velocity_airflow.page import access, flash
from velocity_airflow.page.home_html import Flash

URL_PREFIX = "/velocity"
# The page's script asks for the parts a click changed with this header (a fetch); a plain
# form's post, without it, is answered with the redirect back to the page.
IN_PLACE_HEADER = "X-Velocity-In-Place"
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


def in_place(request: Request) -> bool:
    """Whether the page's script sent this request, to redraw in place what it changed."""
    return request.headers.get(IN_PLACE_HEADER) == "1"


Parts = Mapping[str, str]


def parts_json(ok: bool, text: str, parts: Parts, refused: int = 409, **more: Any) -> Response:
    """What the page's script draws in place: the outcome (``ok``, ``text``) and ``parts``,
    each the HTML of the page's element ``data-part="<name>"`` (empty: removed). Refused
    (``ok`` false): the status ``refused`` (409: the case's state did not allow it)."""
    body = {"ok": ok, "text": text, "parts": dict(parts), **more}
    return JSONResponse(body, status.HTTP_200_OK if ok else refused)


def answer(
    request: Request,
    ok: bool,
    text: str,
    back_query: str = "",
    path: str = "/",
    parts: Callable[[], Parts] | None = None,
    refused: int = 409,
) -> Response:
    """A change's answer: for the page's script, the outcome and the parts it redrew
    (``parts()``, read after the change; a part that cannot be read is left as it was);
    for a plain form, the redirect back to the page (``back``)."""
    if not in_place(request):
        return back(ok, text, back_query, path)
    drawn, error = read("page's parts", parts or dict)
    if error is not None:
        text = f"{text}\n({error}: reload the page to see it)"
    return parts_json(ok, text, drawn or {}, refused)
