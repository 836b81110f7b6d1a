"""Velocity on a real Redis Cluster (`infra/redis-cluster.sh`: three masters, a password):
the layout spreads keys over the masters and keeps a (signature, key) in one slot; the
Functions are on every master; the stream's staged commit is exactly once, fenced, and
finished by whoever comes next after a crash between its two halves."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from redis.cluster import RedisCluster
from starlette.testclient import TestClient

from tests.builders import asked_keys, key_changes
from tests.integration.test_check_decides_as_stream import (
    checks_equal_the_streams_decisions,
    random_events,
    random_rules,
)
from tests.integration.test_partition_commit import partition_commit
from velocity.domain.buckets import BucketAggregate
from velocity.domain.decimals import dumps_json
from velocity.domain.stream_batch import KeyState
from velocity.redis import cluster, connection, mirror
from velocity.redis.check import check_payment
from velocity.redis.keys import parse_bucket
from velocity.redis.lease import StateLockLost
from velocity.redis.lock import state_lock
from velocity.serving.app import check_app
from velocity.settings import Settings, load_settings

pytestmark = [pytest.mark.cluster, pytest.mark.redis]

ONE = BucketAggregate.of_event("12.5", Decimal("12.5"))


@pytest.fixture
def settings(redis_cluster_url: str, tmp_path: Path) -> Iterator[Settings]:
    settings = load_settings(data_dir=tmp_path / "data", redis_url=redis_cluster_url)
    client = connection.connect(settings)
    client.flushall()
    connection.load_functions(client)
    yield settings
    client.close()


def changes(payers: int) -> dict[tuple[str, str], tuple[KeyState, list[int]]]:
    return {
        ("sig", f'["p-{i}"]'): (KeyState({60_000: ONE, 120_000: ONE}, {60_000: 60_001}), [60_000])
        for i in range(payers)
    }


def test_keys_spread_over_the_masters_and_a_key_stays_in_one_slot(settings: Settings) -> None:
    client = connection.connect(settings)
    assert isinstance(client, RedisCluster)
    masters = {node.name for node in client.get_primaries()}
    assert len(masters) == 3
    libraries = client.function_list()  # each master's own list
    assert set(libraries) == masters
    assert all(library[0][1] == "velocity" for library in libraries.values())
    keys = settings.redis_keys
    names = [keys.bucket_hash("sig", f'["p-{i}"]') for i in range(60)]
    assert set(cluster.by_master(client, names)) == masters
    # Every key of one (signature, key) hashes by its tag alone.
    one = keys.bucket_hash("sig", '["p-7"]')
    assert client.keyslot(one) == client.keyslot('{sig:["p-7"]}')
    # The stream's own keys share the data dir's slot: its decide step is one call.
    own = [keys.stream_progress, keys.state_lock, keys.seen_prefix + "tx-1"]
    own += [cluster.pending_record(keys), keys.partition_record(3, 1), keys.batch_plan]
    assert len({client.keyslot(name) for name in own}) == 1


def test_a_staged_commit_is_read_back_and_a_replay_changes_nothing(settings: Settings) -> None:
    client = connection.connect(settings)
    alerts = [{"alertId": f"a-{i}", "n": i} for i in range(5)]
    accepted = [f"tx-{i}" for i in range(8)]
    with state_lock(client, settings, "stream batch 0") as lease:
        commit = mirror.stream_commit(
            settings,
            0,
            123,
            key_changes(settings.redis_keys, changes(40), [("sig", '["p-0"]', 60_000)]),
            accepted,
            [json.dumps(a) for a in alerts],
            60,
            lease,
            ['{"alertId":"s-0","shadow":true}'],
        )
        published = mirror.send_stream_commit(client, settings, commit, lease)
        again = mirror.send_stream_commit(client, settings, commit, lease)
    assert (published, again) == (5, -1)
    entries = client.xrange(settings.alert_stream)
    assert [json.loads(f["alert"])["n"] for _, f in entries] == list(range(5))
    # The shadow stream is in a slot of its own: published apart, once.
    shadowed = client.xrange(settings.shadow_alert_stream)
    assert [json.loads(f["alert"])["alertId"] for _, f in shadowed] == ["s-0"]
    read = mirror.read_stream_state(
        client, settings, ["tx-3", "tx-new"], asked_keys([("sig", f'["p-{i}"]') for i in range(40)])
    )
    assert (read.committed_batch, read.newest_event_time, read.seen) == (0, 123, {"tx-3"})
    # Only the changed bucket (60 000) is written; p-0's was dropped in the same batch.
    assert ("sig", '["p-0"]') not in read.hot.key_states()
    for i in range(1, 40):
        assert read.hot.key_states()[("sig", f'["p-{i}"]')].buckets == {60_000: ONE}
    assert not client.exists(cluster.pending_record(settings.redis_keys))
    assert mirror.committed_batch(client, settings) == 0


def test_a_batch_decided_but_not_finished_is_finished_by_the_next_reader(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = connection.connect(settings)
    finished = cluster._finish

    def crash(*args: object) -> int:
        raise KeyboardInterrupt("the stream dies between decide and finish")

    monkeypatch.setattr(cluster, "_finish", crash)
    with pytest.raises(KeyboardInterrupt), state_lock(client, settings, "stream batch 0") as lease:
        commit = mirror.stream_commit(
            settings,
            0,
            5,
            key_changes(settings.redis_keys, changes(30)),
            ["tx-a"],
            ['{"alertId":"x"}'],
            60,
            lease,
        )
        mirror.send_stream_commit(client, settings, commit, lease)
    # Decided (progress, seen) but no bucket or alert written yet.
    assert mirror.committed_batch(client, settings) == 0
    assert client.xlen(settings.alert_stream) == 0
    hash_name = settings.redis_keys.bucket_hash("sig", '["p-1"]')
    assert not mirror.key_fields(client, hash_name)

    monkeypatch.setattr(cluster, "_finish", finished)
    read = mirror.read_stream_state(client, settings, [], asked_keys([("sig", '["p-1"]')]))
    assert read.hot.key_states()[("sig", '["p-1"]')].buckets == {60_000: ONE}
    assert parse_bucket(mirror.key_fields(client, hash_name)["60000"]) == (ONE, 60_001)  # type: ignore[arg-type]
    assert client.xlen(settings.alert_stream) == 1
    # Finishing again (a second reader, or the lock's taker) changes nothing.
    cluster.finish_pending(client, settings)  # type: ignore[arg-type]
    with state_lock(client, settings, "compaction"):
        pass
    assert client.xlen(settings.alert_stream) == 1


def test_a_partition_recorded_but_not_applied_is_applied_by_its_next_attempt(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key-partition's keys live on several masters: its record is written first, then
    each master's changes. A task dying between the two leaves the record; the next
    attempt applies what is missing (each master once) and returns the first outcome."""
    client = connection.connect(settings)
    keys = settings.redis_keys
    finish = cluster.finish_partition

    def crash(*args: object) -> str:
        raise KeyboardInterrupt("the task dies between its record and the masters")

    monkeypatch.setattr(cluster, "finish_partition", crash)
    with state_lock(client, settings, "stream batch 3") as lease:
        first = partition_commit(settings, lease.token, 3, 2, "first")
        with pytest.raises(KeyboardInterrupt):
            mirror.commit_partition(client, settings, first)
        assert not mirror.key_fields(client, keys.bucket_hash("sig", '["p-0"]'))
        monkeypatch.setattr(cluster, "finish_partition", finish)
        assert mirror.partition_outcome(client, keys.partition_record(3, 1)) == "first"
        again = partition_commit(settings, lease.token, 3, 7, "second")
        assert mirror.commit_partition(client, settings, again) == "first"
    names = [keys.bucket_hash("sig", f'["p-{i}"]') for i in range(5)]
    assert len(cluster.by_master(client, names)) > 1, "the partition spans masters"
    for name in names:
        assert parse_bucket(mirror.key_fields(client, name)["60000"])[0].count == 2  # type: ignore[arg-type]


def test_a_commit_whose_lease_ran_out_writes_nothing_on_the_cluster(settings: Settings) -> None:
    client = connection.connect(settings)
    with (
        pytest.raises(StateLockLost),
        state_lock(client, settings, "stream batch 3", lease_ms=60_000) as lease,
    ):
        client.delete(lease.name)  # the lease ran out; someone else may hold it now
        changed = key_changes(settings.redis_keys, changes(5))
        commit = mirror.stream_commit(settings, 3, 1, changed, ["tx"], ['{"a":1}'], 60, lease)
        mirror.send_stream_commit(client, settings, commit, lease)
    assert mirror.committed_batch(client, settings) is None
    assert client.xlen(settings.alert_stream) == 0
    assert not client.exists(cluster.pending_record(settings.redis_keys))


def test_lookups_and_the_mirror_writes_work_on_the_cluster(settings: Settings) -> None:
    client = connection.connect(settings)
    keys = settings.redis_keys
    rows = [
        {
            "signature_id": "sig",
            "key": f'["p-{i}"]',
            "bucket_start": 60_000 * m,
            "event_count": 1,
            "value_count": 1,
            "value_sum": Decimal(i),
            "value_min": Decimal(i),
            "value_max": Decimal(i),
            "distinct_values": [],
        }
        for i in range(30)
        for m in range(1, 4)
    ]
    assert mirror.write_bucket_rows(client, keys, rows, 60_000, 3600) == 90
    drift = mirror.compare_buckets(client, keys, pa.Table.from_pylist(rows, mirror.BUCKET_ROWS))
    assert drift.clean and drift.checked == 90
    assert len(list(mirror.bucket_hashes(client, keys))) == 30
    window = ["SUM", "600000", "60000", "240000"]
    name = keys.bucket_hash("sig", '["p-7"]')
    result = json.loads(client.fcall("velocity_window", 1, name, *window))  # type: ignore[arg-type]
    assert result["aggregateValue"] == "21"


def test_the_reader_reads_the_cluster_and_cannot_change_anything(
    settings: Settings, redis_cluster_url: str
) -> None:
    """`infra/redis-cluster.sh` gives every master the read-only user of `velocity up`."""
    from urllib.parse import urlsplit

    from redis.exceptions import NoPermissionError

    from velocity.redis.server import READER_USER

    owner = connection.connect(settings)
    keys = settings.redis_keys
    names = [keys.bucket_hash("sig", f'["p-{i}"]') for i in range(12)]
    for name in names:
        owner.set(name, '60000\t[2,2,"30.5","10","20.5",[]]\n')
    owner.hset(keys.rule_entry(901), mapping={"signatureId": "sig", "windowMs": "600000"})
    owner.xadd(keys.alert_stream, {"alert": "{}", "batch": "0"})
    parts = urlsplit(redis_cluster_url)
    reader = RedisCluster(
        host=parts.hostname,
        port=parts.port,
        username=READER_USER,
        password=Settings.model_fields["redis_reader_password"].default,
        decode_responses=True,
    )
    try:
        # Lookups on every master (the names spread over all three).
        assert len({owner.keyslot(n) for n in names}) > 1
        assert set(cluster.by_master(owner, names)) == {n.name for n in owner.get_primaries()}
        for name in names:
            window = reader.fcall_ro("velocity_window", 1, name, "SUM", "600000", "60000",
                                     "90000")  # fmt: skip
            assert json.loads(str(window))["aggregateValue"] == "30.5"
        assert reader.hgetall(keys.rule_entry(901))["signatureId"] == "sig"
        assert reader.xrange(keys.alert_stream)
        forbidden = [
            lambda: reader.hset(names[0], "1", "x"),
            lambda: reader.delete(names[1]),
            lambda: reader.xadd(keys.alert_stream, {"alert": "{}"}),
            lambda: reader.fcall("velocity_evict", 1, names[2], "9999999999999"),
            lambda: reader.get("other:key"),
            lambda: reader.flushall(),
            lambda: reader.function_flush(),
        ]
        for attempt in forbidden:
            with pytest.raises(NoPermissionError):
                attempt()
    finally:
        reader.close()
    assert owner.get(names[0]) == '60000\t[2,2,"30.5","10","20.5",[]]\n'


def test_a_check_on_the_cluster_decides_as_the_stream_there(settings: Settings) -> None:
    """One call on each master, merged: the same answer as one Redis (both equal the
    stream's decision of the payment), the rules' keys spread over the three masters."""
    rng = random.Random(7)
    rules = random_rules(rng, 8)
    events = random_events(rng, 40, settings.bucket_width_ms)
    compared, fired = checks_equal_the_streams_decisions(settings, rules, events)
    assert fired > 5 and compared - fired > 5, (fired, compared)
    client = connection.connect(settings)
    assert isinstance(client, RedisCluster)
    copies = cluster.rules_copies(client, settings.redis_keys)
    assert len({client.keyslot(c.name) for c in copies.values()}) == 3
    assert all(client.get_node_from_key(c.name).name == m for m, c in copies.items())
    # The HTTP service answers as check_payment there (its cluster path: the blocking
    # client's calls in the thread pool, the answer encoded from check_payment's).
    token = "cluster-token-0123456789"
    with TestClient(check_app(client, settings.redis_keys, token)) as http:
        for event in events[-6:]:
            sent = {**event, "transactionId": f"http-{event['transactionId']}"}
            answer = http.post("/check", content=dumps_json(sent),
                               headers={"Authorization": f"Bearer {token}"})  # fmt: skip
            assert answer.status_code == 200, answer.text
            assert answer.json() == check_payment(client, settings.redis_keys, sent)
