"""The check service's ASGI app (Starlette): ``POST /check``, ``GET /healthz``, ``GET /metrics``.

What callers rely on:
- ``POST /check`` takes one JSON event (SPEC §1) as its body and answers 200 with the
  check's JSON (``decision``, ``rules``, ``stateAsOf``), the answer of
  ``velocity.redis.check.check_payment``: the same function as `velocity check`'s.
- Every route but ``/healthz`` and ``/metrics`` needs ``Authorization: Bearer <token>``,
  declared once (``RequireToken``, around the whole app), so a new route cannot forget it;
  the token is compared in constant time. Missing or wrong: 401, ``WWW-Authenticate:
  Bearer``, and nothing read.
- A body that is not one JSON object, or a malformed payment: 400 with ``{"error": …,
  "field": …}``, the field named as the stream names it (``(payment)`` for the body as a
  whole), and Redis is not called. A body over ``MAX_BODY_BYTES``: 413, the same shape.
- Redis holding no rules, or not answering: 503 with ``{"error": …}``; never an ALLOW.
- ``GET /healthz``: 200 ``{"status": "ok", "stateAsOf": …}`` when Redis answers and holds the
  rules, else 503 ``{"status": "unavailable", "error": …}``. No token, as probes have none.
- ``GET /metrics``: the service's figures in Prometheus's text format (``metrics.py``).

A check is awaited on an asyncio client of Redis (on a Redis Cluster, and for ``/healthz``,
the blocking client's calls run in Starlette's thread pool), so a slow call never holds the
event loop and the other requests.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from decimal import Decimal
from typing import Any

import redis
import redis.asyncio
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from velocity.errors import InvalidFieldError
from velocity.redis.check import (
    CheckUnavailableError,
    check_payment,
    check_payment_text,
    decision_of,
)
from velocity.redis.check_state import check_state
from velocity.redis.keys import RedisKeys
from velocity.serving.metrics import CheckMetrics

log = logging.getLogger("velocity.serve")

# The routes a caller without the token may use: probes and scrapers carry none, and they
# show counts and freshness, never a payment or a rule.
OPEN_PATHS = frozenset({"/healthz", "/metrics"})
# An event is a few hundred bytes; the check takes at most 32 fields of 1 KiB each.
MAX_BODY_BYTES = 64 * 1024
WHOLE_PAYMENT = "(payment)"


class RequireToken:
    """ASGI middleware: every request but those to ``OPEN_PATHS`` presents the bearer token,
    or is answered 401 before any route sees it."""

    def __init__(self, app: ASGIApp, token: str, metrics: CheckMetrics) -> None:
        if not token:
            raise ValueError("the check service needs a token")
        self.app = app
        self._token = token.encode()
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        presented = bearer_token(Headers(scope=scope).get("authorization"))
        # compare_digest: the time taken says nothing about how much of a guess was right.
        if presented is None or not hmac.compare_digest(presented.encode("latin-1"), self._token):
            self._metrics.refused("unauthorized")
            problem = "no bearer token" if presented is None else "wrong bearer token"
            response = JSONResponse(
                {"error": f"{problem}: send the header Authorization: Bearer <token>"},
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer realm="velocity"'},
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (the scheme in any case),
    else None."""
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class _TooLarge(Exception):
    pass


async def _body(request: Request) -> bytes:
    """The request's body, read no further than ``MAX_BODY_BYTES``."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _payment(body: bytes) -> Any:
    """The body as JSON, numbers with a point as exact decimals (as `velocity check` reads
    a file, so an amount keeps every digit)."""
    try:
        return json.loads(body, parse_float=Decimal)
    except (ValueError, RecursionError) as exc:
        # UnicodeDecodeError is a ValueError; RecursionError: nesting too deep to parse.
        raise InvalidFieldError(
            WHOLE_PAYMENT, f"is not one JSON object: {exc}", "; nothing checked"
        ) from exc


def _field_error(status: int, field: str, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "field": field}, status_code=status)


def check_app(
    client: redis.Redis,
    keys: RedisKeys,
    token: str,
    metrics: CheckMetrics | None = None,
    async_client: redis.asyncio.Redis | None = None,
) -> Starlette:
    """The service over ``client`` (the read-only user's is enough) and ``keys`` (the data
    dir's layout); ``token`` is the bearer token of every route but the open ones. With
    ``async_client`` (one Redis, the same user) a check is awaited on it, and the
    Function's JSON sent on as it is: the thread hop and the decode and encode again were
    about half of the service's CPU a check."""
    figures = metrics or CheckMetrics()

    async def answer_of(payment: Any) -> str:
        if async_client is not None:
            return await check_payment_text(async_client, keys, payment)
        answer = await run_in_threadpool(check_payment, client, keys, payment)
        return json.dumps(answer, separators=(",", ":"), ensure_ascii=False)

    async def check(request: Request) -> Response:
        began = time.perf_counter()
        try:
            answer = await answer_of(_payment(await _body(request)))
        except _TooLarge:
            figures.refused("bad_request")
            return _field_error(
                413, WHOLE_PAYMENT, f"the body is over {MAX_BODY_BYTES} bytes: send one event"
            )
        except InvalidFieldError as exc:
            figures.refused("bad_request")
            return _field_error(400, exc.field, str(exc))
        except (CheckUnavailableError, redis.RedisError) as exc:
            figures.refused("unavailable")
            log.warning("check unavailable: %s", exc)
            return JSONResponse({"error": _unavailable(exc)}, status_code=503)
        figures.answered(decision_of(answer), time.perf_counter() - began)
        return Response(answer, media_type="application/json")

    async def healthz(request: Request) -> Response:
        try:
            state = await run_in_threadpool(check_state, client, keys)
        except redis.RedisError as exc:
            return JSONResponse(
                {"status": "unavailable", "error": _unavailable(exc)}, status_code=503
            )
        if not state.rules_published:
            return JSONResponse(
                {
                    "status": "unavailable",
                    "error": f"Redis holds no rules at {keys.check_rules}: a check would "
                    "answer 503 until the stream publishes them (at its next micro-batch)",
                    "stateAsOf": state.state_as_of,
                },
                status_code=503,
            )
        return JSONResponse({"status": "ok", "stateAsOf": state.state_as_of})

    async def metrics_text(request: Request) -> Response:
        return Response(generate_latest(figures.registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(
        routes=[
            Route("/check", check, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/metrics", metrics_text, methods=["GET"]),
        ],
        middleware=[Middleware(RequireToken, token=token, metrics=figures)],
    )


def _unavailable(exc: Exception) -> str:
    if isinstance(exc, CheckUnavailableError):
        return f"velocity_check unavailable: {exc}"
    if isinstance(exc, redis.AuthenticationError | redis.exceptions.NoPermissionError):
        return (
            f"Redis refused the read-only user: {exc} (its password is "
            "VELOCITY_REDIS_READER_PASSWORD; `velocity up` creates the user)"
        )
    return f"Redis did not answer: {type(exc).__name__}: {exc}"
