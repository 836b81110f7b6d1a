"""Roll-ups of dense bucket hashes on the real redis-server: every write path keeps them
equal to the merge of their buckets, and a window read through them equals the merge of
the window's buckets, value for value, for every aggregator."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from decimal import Decimal

import pytest
import redis

from tests.builders import asked_keys, key_changes
from velocity.domain.buckets import BucketAggregate, merge_all
from velocity.domain.decimals import format_decimal
from velocity.domain.rules import Aggregator
from velocity.domain.stream_batch import KeyState
from velocity.domain.windows import KeyedEvent, aggregate_value, format_aggregate
from velocity.redis import connection, mirror
from velocity.redis.keys import RedisKeys, packed_fields, parse_bucket_value, parse_recent
from velocity.redis.lock import state_lock
from velocity.settings import Settings

pytestmark = pytest.mark.redis

G = 1_000  # g = 1 s: the width at which a 24 h window spans 86 400 buckets
HOUR = 3_600_000
T0 = 1_767_225_600_000  # 2026-01-01, a whole day: blocks of every size align on it
SIGNATURE = "sig"
WINDOWS_MS = [1_000, 10_000, 59_000, 60_000, 600_000, 3_660_000, 2 * HOUR, 24 * HOUR]


def random_bucket(rng: random.Random) -> BucketAggregate:
    """1 to 4 events; some without a value, some huge (the exact digit-string sums)."""
    result = BucketAggregate(0)
    for _ in range(rng.randint(1, 4)):
        roll = rng.random()
        if roll < 0.1:
            event = BucketAggregate.of_event(None)
        else:
            places = rng.randint(0, 8)
            whole = rng.randint(0, 10**17) if roll > 0.97 else rng.randint(0, 5_000)
            number = Decimal(whole * 10**places + rng.randint(0, 10**places - 1)).scaleb(-places)
            event = BucketAggregate.of_event(format_decimal(number), number)
        result = result.merge(event)
    return result


def rows(key: str, buckets: Mapping[int, BucketAggregate]) -> list[dict[str, object]]:
    return [
        {
            "signature_id": SIGNATURE,
            "key": key,
            "bucket_start": start,
            "event_count": b.count,
            "value_count": b.value_count,
            "value_sum": b.total,
            "value_min": b.minimum,
            "value_max": b.maximum,
            "distinct_values": sorted(b.distinct),
        }
        for start, b in buckets.items()
    ]


def expected_windows(
    buckets: Mapping[int, BucketAggregate], window_ms: int, at: int
) -> dict[Aggregator, str | None]:
    """Every aggregator's value of the window, from its buckets merged once (the merge of
    thousands of buckets is most of this module's time)."""
    lower = at - window_ms - (at - window_ms) % G
    merged = merge_all(b for start, b in buckets.items() if lower <= start <= at)
    values = {aggregator: aggregate_value(merged, aggregator) for aggregator in Aggregator}
    return {a: None if v is None else format_aggregate(v) for a, v in values.items()}


def expected_window(
    buckets: Mapping[int, BucketAggregate], aggregator: Aggregator, window_ms: int, at: int
) -> str | None:
    return expected_windows(buckets, window_ms, at)[aggregator]


def read_window(
    client: redis.Redis, name: str, aggregator: Aggregator, window_ms: int, at: int
) -> str | None:
    reply = client.fcall_ro(  # type: ignore[arg-type]
        "velocity_window", 1, name, aggregator.value, str(window_ms), str(G), str(at)
    )
    value: str | None = json.loads(reply)["aggregateValue"]
    return value


dense = RedisKeys.dense_hash_of


def assert_rollups_merge_their_buckets(client: redis.Redis, name: str) -> None:
    assert client.get(name) == "#\t\n"  # a dense key's state string: the mark only
    fields = connection.read_hash(client, dense(name))
    buckets = {int(f): parse_bucket_value(v) for f, v in fields.items() if f.isdigit()}
    sizes = [int(n) for n in fields["rollups"].split(":")[1].split(",")]
    for size in sizes:
        span = size * G
        blocks: dict[int, list[BucketAggregate]] = {}
        for start, bucket in buckets.items():
            blocks.setdefault(start - start % span, []).append(bucket)
        stored = {
            int(f.split(":")[1]): parse_bucket_value(v)
            for f, v in fields.items()
            if f.startswith(f"r{size}:")
        }
        assert stored == {block: merge_all(bs) for block, bs in blocks.items()}, size


def assert_windows_match(
    client: redis.Redis, name: str, buckets: Mapping[int, BucketAggregate], rng: random.Random
) -> None:
    first, last = min(buckets), max(buckets)
    for _ in range(120):
        at = rng.randint(first - 5 * G, last + 5 * G)
        window_ms = rng.choice(WINDOWS_MS)
        expected = expected_windows(buckets, window_ms, at)
        for aggregator in Aggregator:
            got = read_window(client, name, aggregator, window_ms, at)
            assert got == expected[aggregator], (aggregator, window_ms, at)


def test_every_write_path_keeps_a_dense_hashs_rollups_exact(settings: Settings) -> None:
    rng = random.Random(12)
    client = connection.connect(settings)
    keys = settings.redis_keys
    name = keys.bucket_hash(SIGNATURE, '["dense"]')
    # Three hours of g = 1 s buckets, a third of them with events, written in two parts:
    # the hash becomes dense (roll-ups built whole), then grows (roll-ups refreshed).
    starts = [T0 + i * G for i in range(3 * 3600) if rng.random() < 0.33]
    buckets = {start: random_bucket(rng) for start in starts}
    half = dict(list(buckets.items())[: len(buckets) // 2])
    mirror.write_bucket_rows(client, keys, rows('["dense"]', half), G, 86_400)
    mirror.write_bucket_rows(client, keys, rows('["dense"]', buckets), G, 86_400)
    assert_rollups_merge_their_buckets(client, name)
    assert_windows_match(client, name, buckets, rng)

    # Overwrites (a backfill's or rebuild's absolute values), removals (a repair) and an
    # eviction below a cutoff (maintenance), each refreshing only the blocks it touched.
    for start in rng.sample(sorted(buckets), 300):
        buckets[start] = random_bucket(rng)
    mirror.write_bucket_rows(client, keys, rows('["dense"]', buckets), G, 86_400)
    removed = rng.sample(sorted(buckets), 200)
    mirror.remove_buckets(client, keys, [(SIGNATURE, '["dense"]', s) for s in removed])
    for start in removed:
        del buckets[start]
    cutoff = T0 + 1234 * G
    client.fcall("velocity_evict", 1, name, str(cutoff))  # type: ignore[arg-type]
    buckets = {s: b for s, b in buckets.items() if s >= cutoff}
    # A rebuild's write that also drops what fell below the horizon.
    cutoff = T0 + 2000 * G
    fresh = {start: random_bucket(rng) for start in rng.sample(sorted(buckets), 20)}
    fresh = {s: b for s, b in fresh.items() if s >= cutoff}
    mirror.write_bucket_rows(client, keys, rows('["dense"]', fresh), G, 86_400, cutoff)
    buckets = {s: fresh.get(s, b) for s, b in buckets.items() if s >= cutoff}
    assert_rollups_merge_their_buckets(client, name)
    assert_windows_match(client, name, buckets, rng)

    # The stream's commit: changed buckets and buckets dropped below its horizon.
    state = KeyState(dict(buckets), {})
    changed_starts = rng.sample(sorted(buckets), 50)
    # With the raw events of a changed bucket beside its hash.
    state.recent = {changed_starts[0]: (KeyedEvent(changed_starts[0], "tx-raw"),)}
    for start in changed_starts:
        state.buckets[start] = buckets[start] = buckets[start].merge(random_bucket(rng))
    dropped = sorted(buckets)[:40]
    for start in dropped:
        del buckets[start]
    g1 = settings.model_copy(update={"bucket_seconds": 1})
    with state_lock(client, g1, "stream batch 0") as lease:
        commit = mirror.stream_commit(
            g1,
            0,
            None,
            key_changes(
                g1.redis_keys,
                {(SIGNATURE, '["dense"]'): (state, changed_starts)},
                [(SIGNATURE, '["dense"]', s) for s in dropped],
            ),
            [],
            [],
            86_400,
            lease,
        )
        mirror.send_stream_commit(client, g1, commit, lease)
    assert_rollups_merge_their_buckets(client, name)
    assert_windows_match(client, name, buckets, rng)

    # The stream reads a hash's buckets only, never its roll-ups; beside packed keys and
    # keys Redis does not hold, each key's state its own (the packed ones by an MGET).
    few = {start: buckets[start] for start in sorted(buckets)[:5]}
    mirror.write_bucket_rows(client, keys, rows('["packed"]', few), G, 86_400)
    asked = [(SIGNATURE, k) for k in ('["none"]', '["dense"]', '["packed"]', '["none-2"]')]
    states = mirror.read_stream_state(client, g1, [], asked_keys(asked)).hot.key_states()
    assert set(states) == {(SIGNATURE, '["dense"]'), (SIGNATURE, '["packed"]')}
    assert states[(SIGNATURE, '["dense"]')].buckets == buckets
    assert states[(SIGNATURE, '["packed"]')].buckets == few
    # A bucket's raw events written whole stay in its hash (field "~<start>"), beside its
    # roll-ups, and survive the roll-ups' upkeep.
    start = changed_starts[0]
    assert parse_recent(client.hget(dense(name), f"~{start}")) == state.recent[start]


def test_a_packed_key_has_no_rollups_until_it_is_dense(settings: Settings) -> None:
    rng = random.Random(7)
    client = connection.connect(settings)
    keys = settings.redis_keys
    name = keys.bucket_hash(SIGNATURE, '["sparse"]')
    buckets = {T0 + i * 7 * G: random_bucket(rng) for i in range(127)}
    mirror.write_bucket_rows(client, keys, rows('["sparse"]', buckets), G, 86_400)
    assert client.type(name) == "string"  # packed: one string, buckets only
    assert sorted(packed_fields(client.get(name))) == sorted(str(s) for s in buckets)  # type: ignore[arg-type]
    assert 86_000_000 < client.pttl(name) <= 86_400_000
    assert_windows_match(client, name, buckets, rng)

    buckets[T0 + 127 * 7 * G] = random_bucket(rng)
    mirror.write_bucket_rows(client, keys, rows('["sparse"]', buckets), G, 86_400)
    assert client.hexists(dense(name), "rollups")
    assert_rollups_merge_their_buckets(client, name)
    assert_windows_match(client, name, buckets, rng)

    # Sparse again (fewer than 64 fields, roll-ups included): its roll-ups go, so that a
    # hash the stream only grows needs one HLEN to know it has none. (The stream packs a
    # dense key again below mirror.DENSE_KEEP_BUCKETS; a hash keeps this for old data.)
    removed = sorted(buckets)[:-10]
    mirror.remove_buckets(client, keys, [(SIGNATURE, '["sparse"]', s) for s in removed])
    for start in removed:
        del buckets[start]
    assert sorted(client.hkeys(dense(name))) == sorted(str(s) for s in buckets)
    assert_windows_match(client, name, buckets, rng)

    # Once its last bucket is gone the key is gone, its state string and its hash.
    mirror.remove_buckets(client, keys, [(SIGNATURE, '["sparse"]', s) for s in buckets])
    assert not client.exists(name) and not client.exists(dense(name))
