"""A preview of the add-rules form's rules: what they would have fired over the last hours
of the live events (``velocity.delta.preview_reader``), computed in this process in a
worker thread (the routes are plain functions, which FastAPI runs off the event loop). It
writes nothing, but it holds up to the reader's cap of events in memory and both cores for
seconds: it needs the role that may change rules and passes the same write check as a
change (``access.PREVIEW``: the page's token from a browser, or a bearer token), so
another site cannot start one with a signed-in user's cookie."""

from __future__ import annotations

import json
import threading
from typing import Annotated, Any

from fastapi import APIRouter, Form, HTTPException, Request, status
from fastapi.responses import HTMLResponse, Response

from velocity_airflow.page import access, common, home
from velocity_airflow.page.home_html import Flash, render_page

# One preview at a time: each holds the span's events in memory (up to the reader's
# 20M-event cap) and uses both cores for seconds; a second waits this long, then is told.
_PREVIEW = threading.Lock()
_PREVIEW_WAIT_S = 60.0

router = APIRouter(dependencies=[access.PREVIEW])


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
    from velocity.domain.rules import parse_rules
    from velocity.errors import UsageError

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


@router.post("/preview", response_class=HTMLResponse)
def preview_rules(
    request: Request,
    user: access.Previewer,
    rules_json: Annotated[str, Form()] = "",
    hours: Annotated[str, Form()] = "1",
    back: Annotated[str, Form()] = "",
) -> HTMLResponse:
    """The page with what the form's rules would have fired over the last ``hours`` of the
    live events beside the versions in force; nothing is saved. Whoever may change rules."""
    from velocity.errors import InvalidRuleError, UsageError

    shown: dict[str, Any] | None = None
    flash_shown = None
    try:
        shown = _preview(access.settings(), rules_json, _hours(hours))
    except InvalidRuleError as exc:
        # The lines `velocity rules validate` prints, as Validate shows them.
        text = "invalid rules, nothing previewed:\n" + "\n".join(f"  {p}" for p in exc.problems)
        flash_shown = Flash(False, text)
    except UsageError as exc:
        flash_shown = Flash(False, f"error: {exc}")
    data = home.page_data(
        request,
        user,
        common.params_of(back),
        rule_text=rules_json,
        preview=shown,
        preview_hours=hours,
    )
    data.flash = flash_shown
    ok = flash_shown is None
    return HTMLResponse(render_page(data), status_code=200 if ok else 422)


@router.post("/api/preview")
def preview_json(body: dict[str, Any]) -> Response:
    """What rules would have fired, saving nothing: ``{"rules": <a rule, an array of rules,
    or their JSON text>, "hours": 1}`` (hours before the newest accepted event, default 1).
    Per rule: its alerts and the version in force's, per hour, a sample with explanations,
    and the difference by transaction (added, removed, changed value); ``seconds`` it took.
    400 names what is wrong (a rule's field, the hours, too many events). Whoever may
    change rules, with a bearer token (or the page's token)."""
    from velocity.domain.decimals import dumps_json
    from velocity.errors import UsageError

    rules = body.get("rules", "")
    text = rules if isinstance(rules, str) else json.dumps(rules)
    try:
        hours = body.get("hours", 1)
        shown = _preview(
            access.settings(),
            text,
            hours if isinstance(hours, (int, float)) else _hours(str(hours)),
        )
    except UsageError as exc:  # InvalidRuleError too: every bad field named
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc
    return Response(dumps_json(shown), media_type="application/json")
