"""A data dir whose Redis state a Velocity before packed keys wrote (every (signature,
key) a hash) is migrated once by `velocity mirror migrate` on the real redis-server:
sparse hashes become packed strings with their fields and TTLs, dense ones stay hashes
with their roll-ups, every window reads the same, and the stream reads the same state."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pyarrow as pa
import pytest
import redis

from tests.integration.test_rollups import SIGNATURE, T0, G, random_bucket, rows
from velocity.redis import connection, mirror
from velocity.redis.keys import bucket_value, packed_fields, recent_fragment
from velocity.rules import Aggregator
from velocity.settings import Settings
from velocity.windows import KeyedEvent

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]


def old_layout(client: redis.Redis, settings: Settings, rng: random.Random) -> list[str]:
    """Key states as the layout before 0.3 wrote them: 40 sparse hashes (buckets, a new
    bucket's raw events, a rule's last notified alert) and one dense hash (roll-ups)."""
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
    dense = {T0 + i * G: random_bucket(rng) for i in range(300)}
    mirror.write_bucket_rows(client, keys, rows('["dense"]', dense), G, 7_200)
    names.append(keys.bucket_hash(SIGNATURE, '["dense"]'))
    return names


def windows(client: redis.Redis, names: list[str]) -> list[str]:
    at = T0 + 400 * G
    return [
        client.fcall_ro("velocity_window", 1, name, a.value, w, G, at)  # type: ignore[misc]
        for name in names
        for a in (Aggregator.SUM, Aggregator.MAX, Aggregator.UNIQUE_COUNT)
        for w in (10_000, 120_000, 3_600_000)
    ]


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
    fields = {name: mirror.key_fields(client, name) for name in names}
    ttls = {name: client.pttl(name) for name in names}
    before = windows(client, names)
    asked = pa.table(
        {
            "signature_id": [SIGNATURE] * len(names),
            "key": [settings.redis_keys.parse_bucket_hash(n)[1] for n in names],  # type: ignore[index]
        }
    )
    hot = mirror.read_stream_state(client, settings, [], asked).hot

    assert migrate(settings).startswith("40 of 41 key states packed")

    sparse, dense = names[:-1], names[-1]
    assert all(client.type(name) == "string" for name in sparse)
    assert client.type(dense) == "hash" and client.hexists(dense, "rollups")
    for name in sparse:
        assert packed_fields(client.get(name)) == fields[name]  # type: ignore[arg-type]
        assert 0 <= ttls[name] - client.pttl(name) < 10_000  # the TTL kept
    assert {name: mirror.key_fields(client, name) for name in names} == fields
    assert windows(client, names) == before
    after = mirror.read_stream_state(client, settings, [], asked).hot
    assert after.key_states() == hot.key_states()
    assert after.notified.sort_by("key").equals(hot.notified.sort_by("key"))

    assert migrate(settings).startswith("0 of 41 key states packed")  # once
