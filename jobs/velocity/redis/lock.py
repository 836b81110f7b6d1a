"""The state lock: one writer at a time rewrites a data dir's buckets.

The stream holds it for each micro-batch; compaction, OPTIMIZE of the buckets table,
eviction and the backfill's bucket rebuild hold it for their commit. Delta's optimistic
concurrency alone would turn a collision into a failed micro-batch (a stream restart),
and a rewrite computed from a snapshot older than its commit could drop a concurrent
delta; the lock rules out both. It lives in Redis because every Velocity process already
reaches Redis; it is a lease, renewed while its holder works, so a killed holder blocks the others
for at most the lease (30 s).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import redis
from redis.cluster import RedisCluster

from velocity.errors import VelocityError
from velocity.redis import cluster
from velocity.redis.connection import is_cluster, load_functions
from velocity.redis.lease import Lease
from velocity.settings import Settings

log = logging.getLogger("velocity.lock")
# A holder renews its lease every third of it while it works, so a holder killed mid-way
# (SIGKILL, a lost machine) blocks the others for at most this long.
LEASE_MS = 30 * 1000


class StateLockTimeout(VelocityError):
    """The state lock stayed taken for longer than the caller would wait."""


@contextmanager
def state_lock(
    client: redis.Redis,
    settings: Settings,
    holder: str,
    wait_seconds: float = 900.0,
    lease_ms: int = LEASE_MS,
) -> Iterator[Lease]:
    """Hold the data dir's state lock inside the block; waits for it up to ``wait_seconds``.

    Raises ``StateLockTimeout`` naming the current holder when the wait runs out. The
    lease is renewed while the block runs; a renewal that finds the lock gone or held by
    someone else marks the lease lost (``Lease.check`` raises from then on).
    """
    name = settings.redis_keys.state_lock
    token = uuid.uuid4().hex
    value = json.dumps(
        {
            "token": token,
            "holder": holder,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": int(time.time() * 1000),
        }
    )
    deadline = time.monotonic() + wait_seconds
    while not client.set(name, value, nx=True, px=lease_ms):
        if time.monotonic() >= deadline:
            raise StateLockTimeout(
                f"the state lock {name} of {settings.data_dir} is held by {client.get(name)}; "
                "wait for that job to finish, or delete the key if its holder is gone"
            )
        time.sleep(0.2)
    stop = threading.Event()
    lease = Lease(name, token, holder)
    if is_cluster(client):
        # A batch decided but not finished by a holder that died: finished before anyone
        # writes, so no write of ours is overtaken by that holder's stale one.
        cluster.finish_pending(cast(RedisCluster, client), settings)

    def renew() -> None:
        while not stop.wait(lease_ms / 3000):
            try:
                renewed = client.fcall("velocity_renew", 1, name, token, str(lease_ms))
            except redis.RedisError:
                continue  # the next renewal tries again; the lease has two more thirds
            if not renewed:
                log.error("%s lost the state lock %s: its lease ran out", holder, name)
                lease.lost.set()
                return

    renewer = threading.Thread(target=renew, name=f"state-lock-{holder}", daemon=True)
    renewer.start()
    try:
        yield lease
    finally:
        lease.released = time.monotonic()
        stop.set()
        renewer.join()
        try:
            client.fcall("velocity_unlock", 1, name, token)
        except redis.ResponseError:
            # The functions are gone (a flushed or new Redis): load them and release, so
            # a failed holder never leaves the lock to its lease.
            load_functions(client)
            client.fcall("velocity_unlock", 1, name, token)
