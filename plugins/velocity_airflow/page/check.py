"""Try a payment: the pre-authorization check (SPEC §5a) of a payment typed into the page,
with each rule it evaluated shown with its value, limit, window and the working in words.

One semantics, three doors: the page calls ``velocity.redis.check.check_payment``, as
`velocity check` and the check service do; the words are
``velocity.analyst.explain.check_working``'s. A check records nothing.

The form is a GET with the payment in its query, never a post: a check is a read, so any
signed-in user (a viewer too) may run it, and as a GET it needs no write check (every post
of the page needs one, a preview's too: issue 53). Another site can make a browser send the
GET, but cannot read its answer, and the check changes nothing. The check signs in to
Redis as the read-only user (``velocity-reader``), as the check service does: the one
Redis call a viewer drives with input of their choosing can read, never write (besides
``FCALL_RO``, which refuses a write whatever the user).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.responses import HTMLResponse

from velocity_airflow.page import access, common
from velocity_airflow.page.check_html import FIELDS, CheckView, render_check

router = APIRouter()


def payment_of(query: Mapping[str, str], now_ms: int) -> dict[str, Any]:
    """The form's payment as ``check_payment`` takes it: each field as typed, a blank one
    left out (``check_payment`` names a required one), eventTime blank for ``now_ms``, or
    epoch ms, or a time (UTC unless it names an offset; ``InvalidFieldError`` names it)."""
    from velocity.analyst.alert_search import parse_time

    payment: dict[str, Any] = {}
    for name in FIELDS:
        text = query.get(name, "").strip()
        if name == "eventTime":
            payment[name] = parse_time(text, name, upper=False) if text else now_ms
        elif text:
            payment[name] = text
    return payment


def check(settings: Any, payment: Mapping[str, Any]) -> dict[str, Any]:
    """``check_payment``'s answer, each rule with its ``working`` in words (by the rule
    version from the rules table; a version not found there is named by its id)."""
    from velocity.analyst.explain import check_working
    from velocity.delta.reader import rule_history
    from velocity.redis.check import check_payment, valid_payment
    from velocity.redis.connection import connect
    from velocity.redis.server import READER_USER

    reader = connect(settings, user=(READER_USER, settings.redis_reader_password))
    answer = check_payment(reader, settings.redis_keys, payment)
    history, _ = common.read("rules", lambda: rule_history(settings))
    versions = {(r.rule_id, r.version): r for r in history or []}
    event = valid_payment(payment)
    for checked in answer["rules"]:
        rule = versions.get((checked["ruleId"], checked["ruleVersion"]))
        if rule is not None:  # the key's fields in the rule's order, as the page shows keys
            key = checked["key"]
            checked["key"] = {n: key[n] for n in rule.grouping_keys if n in key} | key
        checked["working"] = check_working(checked, rule, event)
    return answer


def _new_transaction_id() -> str:
    return f"try-{secrets.token_hex(6)}"


@router.get("/check", response_class=HTMLResponse)
def check_page(request: Request, user: access.User) -> HTMLResponse:
    """The form; with ``check`` in the query (its button), the payment's check below it: the
    decision, how fresh the state is, and every rule evaluated. A bad field is named beside
    it (422); no rules in Redis, or no Redis, is said at the top (503)."""
    from redis import RedisError
    from redis.exceptions import AuthenticationError, NoPermissionError

    from velocity.errors import InvalidFieldError, UsageError
    from velocity.redis.check import CheckUnavailableError
    from velocity.redis.server import READER_USER

    query = common.params(request.query_params)
    asked = "check" in request.query_params
    now_ms = int(time.time() * 1000)
    form = {name: query.get(name, "") for name in FIELDS}
    if not asked:
        form["transactionId"] = _new_transaction_id()
    view = CheckView(
        base=common.URL_PREFIX,
        user=user.get_name(),
        now_ms=now_ms,
        form=form,
        csrf=access.csrf_token(request),
    )
    code = status.HTTP_200_OK
    if asked:
        try:
            payment = payment_of(query, now_ms)
            view.event_time = payment["eventTime"]
            view.answer = check(access.settings(), payment)
        except InvalidFieldError as exc:
            view.field_errors[exc.field] = exc.reason
            code = status.HTTP_422_UNPROCESSABLE_CONTENT
        except CheckUnavailableError as exc:
            view.banner = f"No check possible now: {exc}"
            code = status.HTTP_503_SERVICE_UNAVAILABLE
        except (AuthenticationError, NoPermissionError) as exc:
            view.banner = (
                f"No check possible now: Redis refused the read-only user {READER_USER}: {exc} "
                "(its password is VELOCITY_REDIS_READER_PASSWORD; `velocity up` creates it)"
            )
            code = status.HTTP_503_SERVICE_UNAVAILABLE
        except RedisError as exc:
            view.banner = f"No check possible now: cannot reach Redis: {exc}"
            code = status.HTTP_503_SERVICE_UNAVAILABLE
        except UsageError as exc:  # the page's settings cannot be read
            view.banner = f"No check possible now: {exc}"
            code = status.HTTP_503_SERVICE_UNAVAILABLE
    return HTMLResponse(render_check(view), status_code=code)


@router.get("/api/check")
def check_json(request: Request) -> dict[str, Any]:
    """The check of the payment in the query (the form's fields; eventTime as the form takes
    it, blank for now): ``check_payment``'s answer, each rule with its ``working``. 400
    names a bad field; 503 when Redis holds no rules or cannot be reached. Nothing recorded."""
    from redis import RedisError

    from velocity.errors import InvalidFieldError, UsageError
    from velocity.redis.check import CheckUnavailableError

    try:
        payment = payment_of(common.params(request.query_params), int(time.time() * 1000))
        return check(access.settings(), payment)
    except InvalidFieldError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc
    except (CheckUnavailableError, RedisError, UsageError) as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(exc)) from exc
