"""Connections to Redis: the client of ``VELOCITY_REDIS_URL`` and the `velocity` Function
library. The base of ``velocity.redis``: it imports none of the package's other modules
(``lease`` <- ``cluster`` <- ``lock`` and ``mirror`` build on it, in that direction)."""

from __future__ import annotations

from importlib import resources
from typing import cast
from urllib.parse import quote, urlsplit, urlunsplit

import redis
import redis.asyncio
from redis.cluster import RedisCluster

from velocity.settings import Settings


def cluster_url(settings: Settings) -> str:
    """A ``redis+cluster://`` setting as the ``redis://`` URL redis-py's cluster clients take."""
    return "redis://" + settings.redis_url.split("://", 1)[1]


def connect(settings: Settings, *, user: tuple[str, str] | None = None) -> redis.Redis:
    """A client of ``VELOCITY_REDIS_URL`` answering str; fails fast instead of retrying.

    A ``redis+cluster://`` URL names a Redis Cluster (any of its masters): the client is
    then redis-py's ``RedisCluster``, which routes each command by its key's slot and
    answers the commands this package sends; the stream's read and commit take the
    cluster's own path (``velocity.redis.cluster``).

    ``user`` (name, password) signs in as that user instead of the URL's (the read-only
    user of a service that only checks and reads).
    """
    url = _signed_in_url(settings, user)
    if settings.redis_cluster:
        return cast(
            redis.Redis,
            RedisCluster.from_url(
                "redis://" + url.split("://", 1)[1], decode_responses=True, socket_timeout=10
            ),
        )
    return redis.Redis.from_url(
        url, decode_responses=True, socket_timeout=10, retry_on_timeout=False
    )


def connect_async(
    settings: Settings, *, user: tuple[str, str] | None = None
) -> redis.asyncio.Redis:
    """``connect``'s client of one Redis for asyncio code (the HTTP check service): the
    same URL, user and timeouts. Not for a Redis Cluster."""
    if settings.redis_cluster:
        raise ValueError("connect_async serves one Redis; a cluster's client is connect's")
    url = _signed_in_url(settings, user)
    return redis.asyncio.Redis.from_url(
        url, decode_responses=True, socket_timeout=10, retry_on_timeout=False
    )


def _signed_in_url(settings: Settings, user: tuple[str, str] | None) -> str:
    """``VELOCITY_REDIS_URL``, signed in as ``user`` (name, password) when one is given."""
    return settings.redis_url if user is None else with_user(settings.redis_url, *user)


def with_user(url: str, username: str, password: str) -> str:
    """``url`` with its credentials replaced by ``username`` and ``password`` (encoded)."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    credentials = f"{quote(username, safe='')}:{quote(password, safe='')}"
    return urlunsplit(parts._replace(netloc=f"{credentials}@{host}"))


def read_hash(client: redis.Redis, name: str) -> dict[str, str]:
    """HGETALL with the synchronous client's type (redis-py types it sync-or-async)."""
    return cast(dict[str, str], client.hgetall(name))


def load_functions(client: redis.Redis) -> None:
    """Load (or replace) the `velocity` Redis Function library; idempotent."""
    code = (resources.files("velocity") / "redis" / "velocity.lua").read_text(encoding="utf-8")
    client.function_load(code, replace=True)


def is_cluster(client: object) -> bool:
    return isinstance(client, RedisCluster)
