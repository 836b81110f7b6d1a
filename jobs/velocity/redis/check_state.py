"""What a check's answer would rest on, read without a check: whether the rules it evaluates
are published, and the stream's progress as a check's ``stateAsOf`` shows it. The check
service's health (``GET /healthz``).

Two commands the read-only user may send (EXISTS, HMGET), read-only, bounded whatever the
state holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import redis

from velocity.redis.keys import RedisKeys


@dataclass(frozen=True)
class CheckState:
    rules_published: bool
    """False: a check would answer ``velocity_check unavailable`` (Redis emptied, the
    stream not started since)."""
    state_as_of: dict[str, int | None]
    """``eventTime``, ``committedAt``, ``batch``: the fields of a check's ``stateAsOf``,
    None before the stream's first committed micro-batch."""


def check_state(client: redis.Redis, keys: RedisKeys) -> CheckState:
    """Raises redis-py's errors when Redis does not answer or refuses the user."""
    published = bool(client.exists(keys.check_rules))
    newest, at, batch = cast(
        list[str | None], client.hmget(keys.stream_progress, ["newest", "at", "batch"])
    )
    return CheckState(
        published,
        {"eventTime": _number(newest), "committedAt": _number(at), "batch": _number(batch)},
    )


def _number(text: str | None) -> int | None:
    return None if text is None else int(text)
