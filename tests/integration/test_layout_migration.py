"""A data dir whose Redis state a Velocity before packed keys wrote (every (signature,
key) a hash) is migrated once by `velocity mirror migrate` on the real redis-server:
sparse hashes become packed strings with their fields and TTLs, a dense one moves beside
its state string with its roll-ups, every window reads what the buckets say, and the
stream, which refused the old layout, reads the same state."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import pyarrow as pa
import pytest
import redis

from tests.integration.test_rollups import (
    SIGNATURE,
    T0,
    G,
    dense,
    expected_window,
    random_bucket,
    read_window,
    rows,
)
from velocity.domain.rules import Aggregator
from velocity.domain.windows import KeyedEvent
from velocity.errors import VelocityError
from velocity.redis import connection, mirror
from velocity.redis.keys import bucket_value, packed_fields, parse_bucket_value, recent_fragment
from velocity.settings import Settings

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]


def old_layout(client: redis.Redis, settings: Settings, rng: random.Random) -> list[str]:
    """Key states as the layout before 0.3 wrote them, each a hash "<base>:buckets": 40
    sparse ones (buckets, a new bucket's raw events, a rule's last notified alert) and one
    dense one with roll-ups (written as now, then moved where 0.2 kept it)."""
    keys = settings.redis_keys
    names = []
    for n in range(40):
        name = keys.bucket_hash(SIGNATURE, f'["p-{n}"]')
        starts = [T0 + (i * 7 + n) * G for i in range(1 + n % 9)]
        fields = {str(s): bucket_value(random_bucket(rng), s + 5) for s in starts}
        fields[f"~{starts[-1]}"] = recent_fragment((KeyedEvent(starts[-1] + 5, f"tx-{n}"),))
        if n % 3 == 0:
            fields["n:4:1"] = f'[{starts[-1] + 5},"tx-{n}"]'
        client.hset(name, mapping=fields)
        client.pexpire(name, 3_600_000 + n)
        names.append(name)
    many = {T0 + i * G: random_bucket(rng) for i in range(300)}
    mirror.write_bucket_rows(client, keys, rows('["dense"]', many), G, 7_200)
    name = keys.bucket_hash(SIGNATURE, '["dense"]')
    client.delete(name)
    client.rename(dense(name), name)
    names.append(name)
    client.hset(settings.redis_keys.stream_progress, mapping={"batch": 7, "newest": T0})
    return names


def old_fields(client: redis.Redis, name: str) -> dict[str, str]:
    """An old hash's fields but roll-ups (buckets, raw events, last notified alerts)."""
    stored = client.hgetall(name)
    return {f: v for f, v in stored.items() if f[0].isdigit() or f[0] == "~" or f[:2] == "n:"}  # type: ignore[union-attr]


def migrate(settings: Settings) -> str:
    env = {
        **os.environ,
        "VELOCITY_DATA_DIR": str(settings.data_dir),
        "VELOCITY_REDIS_URL": settings.redis_url,
    }
    done = subprocess.run(
        [sys.executable, "-m", "velocity.cli", "mirror", "migrate"],
        env=env, capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return done.stdout


def test_mirror_migrate_packs_the_old_hashes_once(settings: Settings) -> None:
    client = connection.connect(settings)
    names = old_layout(client, settings, random.Random(11))
    fields = {name: old_fields(client, name) for name in names}
    ttls = {name: client.pttl(name) for name in names}
    ttls_read = time.monotonic()
    asked = pa.table(
        {
            "signature_id": [SIGNATURE] * len(names),
            "key": [settings.redis_keys.parse_bucket_hash(n)[1] for n in names],  # type: ignore[index]
        }
    )
    # The stream refuses the old layout rather than read its hashes as absent keys.
    with pytest.raises(VelocityError, match="velocity mirror migrate"):
        mirror.read_stream_state(client, settings, [], asked)

    said = migrate(settings)
    assert said.startswith("40 of 41 key states packed into one string each, 1 made dense"), said

    sparse, dense = names[:-1], names[-1]
    assert all(client.type(name) == "string" for name in names)
    assert client.get(dense) == "#\t\n" and client.hexists(
        dense[: -len("buckets")] + "dense", "rollups"
    )
    for name in sparse:
        assert packed_fields(client.get(name)) == fields[name]  # type: ignore[arg-type]
    # The TTL kept: down by no more than the time since it was read (the migration is a
    # `velocity` process: on a loaded machine it took over 10 s).
    since_ms = (time.monotonic() - ttls_read) * 1000 + 1000
    for name in names:
        assert 0 <= ttls[name] - client.pttl(name) <= since_ms
    assert {name: mirror.key_fields(client, name) for name in names} == fields
    for name in names:  # every window as the buckets say
        buckets = {int(f): parse_bucket_value(v) for f, v in fields[name].items() if f.isdigit()}
        for aggregator in (Aggregator.SUM, Aggregator.MAX, Aggregator.UNIQUE_COUNT):
            for window in (10_000, 120_000, 3_600_000):
                at = T0 + 290 * G
                assert read_window(client, name, aggregator, window, at) == expected_window(
                    buckets, aggregator, window, at
                )
    hot = mirror.read_stream_state(client, settings, [], asked).hot
    assert {slot: state.buckets for slot, state in hot.key_states().items()} == {
        (SIGNATURE, settings.redis_keys.parse_bucket_hash(name)[1]): {  # type: ignore[index]
            int(f): parse_bucket_value(v) for f, v in fields[name].items() if f.isdigit()
        }
        for name in names
    }
    assert hot.notified.num_rows == 14

    assert migrate(settings).startswith("0 of 41 key states packed into one string each, 0 made")
