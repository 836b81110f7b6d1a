"""The pre-authorization check (SPEC §5a) from Python: which ACTIVE rules in force a payment
would fire now, in one call of the Redis Function ``velocity_check``.

What callers rely on:
- ``check_payment`` validates the payment exactly as the stream does (SPEC §1, ``velocity.
  domain.schema``): a malformed one raises ``InvalidFieldError`` naming the field, and Redis
  is not called. Otherwise one round trip, read-only (``FCALL_RO``, so the read-only user may
  make it, and a replica may answer it); nothing is recorded.
- ``CheckUnavailableError`` when Redis holds no rules at all (emptied, the stream not
  started since): never a silent ALLOW.
- On a Redis Cluster, one call on each master, sent together; the answer is the same.
- The answer is the Function's JSON as a dict: ``decision`` (ALLOW, REVIEW or BLOCK),
  ``rules`` (each evaluated rule: ruleId, ruleVersion, outcome, key, fired, aggregateValue,
  limitOperatorType, limit, windowStart, windowEnd, and ``notified`` for a firing rule with
  a cooldown) and ``stateAsOf`` (the stream's newest eventTime, the time and number of its
  last committed micro-batch).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, cast

import redis
import redis.asyncio
from redis.cluster import RedisCluster

from velocity.domain.schema import (
    EVENT_FIELDS,
    FIELDS_BY_NAME,
    Event,
    Rejection,
    parse_event_object,
)
from velocity.errors import InvalidFieldError, VelocityError
from velocity.redis.cluster import rules_copies
from velocity.redis.connection import is_cluster
from velocity.redis.keys import RedisKeys

CHECK_FUNCTION = "velocity_check"
# The field of a check's arguments naming the slots a cluster master serves (velocity.lua's
# CHECK_SLOTS_FIELD).
CHECK_SLOTS_FIELD = "~slots"
DECISIONS = ("ALLOW", "REVIEW", "BLOCK")  # weakest first


class CheckUnavailableError(VelocityError):
    """Redis holds no rules to check against (emptied, or the stream not started since):
    the answer would be no answer, not ALLOW."""


def payment_arguments(event: Event) -> list[str]:
    """The payment as ``velocity_check``'s arguments: field, canonical value, … for every
    declared field it has."""
    args: list[str] = []
    for spec in EVENT_FIELDS:
        value = event.value(spec.name)
        if value is not None:
            args += [spec.name, value]
    return args


def valid_payment(payment: object) -> Event:
    """The payment validated as the stream validates an event; ``InvalidFieldError`` names
    the first bad field."""
    parsed = parse_event_object(payment)
    if isinstance(parsed, Rejection):
        raise InvalidFieldError(_field_of(parsed), parsed.message, "; nothing checked")
    return parsed


def _field_of(rejection: Rejection) -> str:
    """The field a rejection's message names first (messages start with it), else
    ``(payment)`` for the payment as a whole."""
    first = rejection.message.split(" ", 1)[0]
    return first if first in FIELDS_BY_NAME else "(payment)"


def check_payment(
    client: redis.Redis, keys: RedisKeys, payment: Mapping[str, Any]
) -> dict[str, Any]:
    """Which rules in force ``payment`` (a decoded SPEC §1 event) would fire now."""
    arguments = payment_arguments(valid_payment(payment))
    with _check_errors():
        if is_cluster(client):
            return _cluster_check(cast(RedisCluster, client), keys, arguments)
        reply = client.fcall_ro(CHECK_FUNCTION, 1, keys.check_rules, *arguments)
    answer: dict[str, Any] = json.loads(cast(str, reply))
    return answer


async def check_payment_text(
    client: redis.asyncio.Redis, keys: RedisKeys, payment: Mapping[str, Any]
) -> str:
    """``check_payment``'s answer as the Function's JSON text, from an asyncio client of
    one Redis: what the HTTP service sends on, with no thread to hand the call to and
    nothing decoded to be encoded again."""
    arguments = payment_arguments(valid_payment(payment))
    with _check_errors():
        # redis-py types its commands sync-or-async; this client's are awaitable.
        call = client.fcall_ro(CHECK_FUNCTION, 1, keys.check_rules, *arguments)
        reply = await cast(Awaitable[str], call)
    return cast(str, reply)


def decision_of(answer: str) -> str:
    """The ``decision`` of a check's JSON text: velocity_check's reply starts with it."""
    head = '{"decision":"'
    if not answer.startswith(head):
        raise ValueError(f"not a check's answer: {answer[:40]!r}")
    return answer[len(head) : answer.index('"', len(head))]


@contextmanager
def _check_errors() -> Iterator[None]:
    """The Function's error replies as this module's errors: no rules (unavailable), or a
    payment field it refused (named first: "velocity_check: <field> <reason>")."""
    try:
        yield
    except redis.ResponseError as exc:
        message = str(exc)
        if "velocity_check unavailable:" in message:
            raise CheckUnavailableError(message.split("unavailable:", 1)[1].strip()) from exc
        if "velocity_check:" not in message:
            raise
        field, _, reason = message.split("velocity_check:", 1)[1].strip().partition(" ")
        raise InvalidFieldError(field, reason, "; nothing checked") from exc


def _cluster_check(client: RedisCluster, keys: RedisKeys, arguments: list[str]) -> dict[str, Any]:
    """On a Redis Cluster: one call on every master, sent together (a pipeline writes to
    each master before it reads any answer), each evaluating the rules whose keys it serves
    from its own copy of the rules; the answers merged as one master's would be."""
    copies = rules_copies(client, keys)
    pipe = client.pipeline(transaction=False)
    for copy in copies.values():
        pipe.fcall_ro(CHECK_FUNCTION, 1, copy.name, *arguments, CHECK_SLOTS_FIELD, copy.slot_ranges)
    answers = [json.loads(reply) for reply in pipe.execute(raise_on_error=True)]
    rules = sorted((r for a in answers for r in a["rules"]), key=lambda r: r["ruleId"])
    decisions = [a["decision"] for a in answers]
    progress = [a["stateAsOf"] for a in answers if a["stateAsOf"]["batch"] is not None]
    return {
        "decision": max(decisions, key=DECISIONS.index),
        "rules": rules,
        "stateAsOf": progress[0] if progress else answers[0]["stateAsOf"],
    }
