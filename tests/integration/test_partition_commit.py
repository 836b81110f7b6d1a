"""A key-partition's commit on the real redis-server: applied once per (batch, partition),
fenced by the state lock, its first outcome kept for a retried task or a replayed batch;
and the batch plan a replay is cut by."""

from __future__ import annotations

import threading
from dataclasses import replace
from decimal import Decimal

import pytest

from tests.builders import key_changes
from velocity.domain.buckets import BucketAggregate
from velocity.domain.stream_batch import KeyState
from velocity.redis import connection, mirror
from velocity.redis.commit_args import BucketChanges, PartitionCommit
from velocity.redis.keys import parse_bucket
from velocity.redis.lease import StateLockLost
from velocity.redis.lock import state_lock
from velocity.settings import Settings

pytestmark = pytest.mark.redis

ONE = BucketAggregate.of_event("2.5", Decimal("2.5"))


def partition_commit(
    settings: Settings, token: str, batch: int, count: int, outcome: str
) -> PartitionCommit:
    """Partition 1 of ``batch``: bucket 60 000 of keys p-0..p-4 holding ``count`` events."""
    keys = settings.redis_keys
    aggregate = BucketAggregate(count, count, Decimal(count), Decimal(1), Decimal(1))
    changed = {
        ("sig", f'["p-{i}"]'): (KeyState({60_000: aggregate}, {60_000: 60_001}), [60_000])
        for i in range(5)
    }
    return PartitionCommit(
        (keys.stream_progress, keys.state_lock, keys.partition_record(batch, 1)),
        token,
        batch,
        mirror.PARTITION_RECORD_TTL_MS,
        60_000,
        settings.bucket_width_ms,
        key_changes(keys, changed),
        outcome,
    )


def bucket_count(client, settings: Settings, key: str) -> int:  # type: ignore[no-untyped-def]
    value = mirror.key_fields(client, settings.redis_keys.bucket_hash("sig", key)).get("60000")
    return parse_bucket(value)[0].count


def test_a_partition_applies_once_and_its_first_outcome_counts(settings: Settings) -> None:
    client = connection.connect(settings)
    keys = settings.redis_keys
    record = keys.partition_record(3, 1)
    with state_lock(client, settings, "stream batch 3") as lease:
        assert mirror.partition_outcome(client, record) is None
        first = partition_commit(settings, lease.token, 3, 2, "first")
        assert mirror.commit_partition(client, settings, first) == "first"
        # A retried task decided again from the state its twin had changed: nothing of
        # it is applied, and the first outcome is what it returns.
        again = partition_commit(settings, lease.token, 3, 7, "second")
        assert mirror.commit_partition(client, settings, again) == "first"
        assert mirror.partition_outcome(client, record) == "first"
        assert {bucket_count(client, settings, f'["p-{i}"]') for i in range(5)} == {2}
        assert 0 < client.pttl(keys.bucket_hash("sig", '["p-0"]')) <= 60_000

        # The batch's own commit; its records go after it.
        commit = mirror.stream_commit(settings, 3, 10, BucketChanges(), [], [], 60, lease)
        assert mirror.send_stream_commit(client, settings, commit, lease) == 0
        mirror.forget_partitions(client, keys, 3, 2)
        assert client.exists(record) == 0
        # A straggler of a committed batch applies nothing.
        late = partition_commit(settings, lease.token, 3, 9, "late")
        assert mirror.commit_partition(client, settings, late) == "late"
        assert bucket_count(client, settings, '["p-0"]') == 2
        assert client.exists(record) == 0


def test_a_partition_commit_is_fenced_by_the_state_lock(settings: Settings) -> None:
    client = connection.connect(settings)
    with state_lock(client, settings, "stream batch 0"):
        stale = partition_commit(settings, "not-the-holder", 0, 1, "stale")
        with pytest.raises(StateLockLost):
            mirror.commit_partition(client, settings, stale)
    assert not mirror.key_fields(client, settings.redis_keys.bucket_hash("sig", '["p-0"]'))
    assert client.exists(settings.redis_keys.partition_record(0, 1)) == 0


def test_a_replayed_batch_gets_the_plan_of_its_first_attempt(settings: Settings) -> None:
    client = connection.connect(settings)
    with state_lock(client, settings, "stream batch 5") as lease:
        assert mirror.batch_plan(client, settings, lease, 5, '{"batch":"5","n":1}') == (
            '{"batch":"5","n":1}'
        )
        assert mirror.batch_plan(client, settings, lease, 5, '{"batch":"5","n":2}') == (
            '{"batch":"5","n":1}'
        )
        assert mirror.batch_plan(client, settings, lease, 6, '{"batch":"6","n":3}') == (
            '{"batch":"6","n":3}'
        )
    with state_lock(client, settings, "stream batch 7") as lease:
        stale = replace(lease, token="not-the-holder", lost=threading.Event())
        with pytest.raises(StateLockLost):
            mirror.batch_plan(client, settings, stale, 7, '{"batch":"7"}')


def test_a_rebuild_forgets_every_partition_record(settings: Settings) -> None:
    client = connection.connect(settings)
    keys = settings.redis_keys
    with state_lock(client, settings, "stream batch 4") as lease:
        mirror.commit_partition(
            client, settings, partition_commit(settings, lease.token, 4, 1, "x")
        )
    mirror.forget_partitions(client, keys)
    assert not list(client.scan_iter(match=keys.partition_records))
