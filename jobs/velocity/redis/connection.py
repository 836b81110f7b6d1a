"""Connections to Redis: the client of ``VELOCITY_REDIS_URL`` and the `velocity` Function
library. The base of ``velocity.redis``: it imports none of the package's other modules
(``lease`` <- ``cluster`` <- ``lock`` and ``mirror`` build on it, in that direction)."""

from __future__ import annotations

from importlib import resources
from typing import cast

import redis
from redis.cluster import RedisCluster

from velocity.settings import Settings


def cluster_url(settings: Settings) -> str:
    """A ``redis+cluster://`` setting as the ``redis://`` URL redis-py's cluster clients take."""
    return "redis://" + settings.redis_url.split("://", 1)[1]


def connect(settings: Settings) -> redis.Redis:
    """A client of ``VELOCITY_REDIS_URL`` answering str; fails fast instead of retrying.

    A ``redis+cluster://`` URL names a Redis Cluster (any of its masters): the client is
    then redis-py's ``RedisCluster``, which routes each command by its key's slot and
    answers the commands this package sends; the stream's read and commit take the
    cluster's own path (``velocity.redis.cluster``).
    """
    if settings.redis_cluster:
        return cast(
            redis.Redis,
            RedisCluster.from_url(cluster_url(settings), decode_responses=True, socket_timeout=10),
        )
    return redis.Redis.from_url(
        settings.redis_url, decode_responses=True, socket_timeout=10, retry_on_timeout=False
    )


def read_hash(client: redis.Redis, name: str) -> dict[str, str]:
    """HGETALL with the synchronous client's type (redis-py types it sync-or-async)."""
    return cast(dict[str, str], client.hgetall(name))


def load_functions(client: redis.Redis) -> None:
    """Load (or replace) the `velocity` Redis Function library; idempotent."""
    code = (resources.files("velocity") / "redis" / "velocity.lua").read_text(encoding="utf-8")
    client.function_load(code, replace=True)


def is_cluster(client: object) -> bool:
    return isinstance(client, RedisCluster)
