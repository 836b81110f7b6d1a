"""Reading the Redis alert stream for people: pages of its newest entries and the entries
after a position, blocking until one comes (read-only: the stream and the backfill are its
writers, ``velocity.redis.mirror`` the owner of its layout).

Entry ids are Redis stream ids (``<ms>-<seq>``, the ms of the XADD), which the Velocity
page uses as positions: an entry after a position is one published after it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import redis
import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from velocity.redis.connection import cluster_url
from velocity.settings import Settings

_PAGE = 500
# An empty stream's position: every entry comes after it.
START = "0-0"


def entry_ms(entry_id: str) -> int:
    """When the entry was published (ms), from its id."""
    return int(entry_id.split("-", 1)[0])


def newest_entries(
    client: redis.Redis, stream: str, newest: str = "+"
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(id, fields) of the stream's entries at or before ``newest`` (an id, or ms: every
    entry of that ms), newest first, read 500 at a time as the caller consumes them."""
    upper = newest
    while True:
        page = cast(list[Any], client.xrevrange(stream, max=upper, min="-", count=_PAGE))
        yield from page
        if len(page) < _PAGE:
            return
        upper = "(" + page[-1][0]


def last_entry_id(client: redis.Redis, stream: str) -> str:
    """The id of the newest entry (``START`` for an empty or missing stream): the entries
    published later are those after it."""
    newest = cast(list[Any], client.xrevrange(stream, count=1))
    return str(newest[0][0]) if newest else START


def async_connect(settings: Settings, block_ms: int) -> aredis.Redis:
    """An asyncio client of ``VELOCITY_REDIS_URL`` (cluster or not, as
    ``velocity.redis.connection.connect``) whose reads outlast a ``block_ms`` XREAD."""
    timeout = block_ms / 1000 + 10
    if settings.redis_cluster:
        return cast(
            aredis.Redis,
            AsyncRedisCluster.from_url(
                cluster_url(settings), decode_responses=True, socket_timeout=timeout
            ),
        )
    return aredis.Redis.from_url(settings.redis_url, decode_responses=True, socket_timeout=timeout)


async def entries_after(
    client: aredis.Redis, stream: str, after: str, block_ms: int, count: int = _PAGE
) -> list[tuple[str, dict[str, Any]]]:
    """(id, fields) of up to ``count`` entries published after ``after``, oldest first;
    waits up to ``block_ms`` for one when there is none yet (then returns none)."""
    found = await client.xread({stream: after}, count=count, block=block_ms)
    if not found:
        return []
    # One [stream, entries] pair (RESP2, the clients' protocol here).
    return list(found[0][1])
