"""A key-partition's commit on the real redis-server: applied once per (batch, partition),
fenced by the state lock, its first outcome kept for a retried task or a replayed batch;
and the batch plan a replay is cut by."""

from __future__ import annotations

import threading
from dataclasses import replace
from decimal import Decimal

import pytest
import redis

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
    settings: Settings,
    token: str,
    batch: int,
    count: int,
    outcome: str,
    keys_changed: int = 5,
    pieces: int = 1,
) -> PartitionCommit:
    """Partition 1 of ``batch``: bucket 60 000 of keys p-0, p-1, … holding ``count``
    events, committed in ``pieces``."""
    keys = settings.redis_keys
    aggregate = BucketAggregate(count, count, Decimal(count), Decimal(1), Decimal(1))
    changed = {
        ("sig", f'["p-{i}"]'): (KeyState({60_000: aggregate}, {60_000: 60_001}), [60_000])
        for i in range(keys_changed)
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
        pieces,
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


def test_a_partition_committed_in_pieces_writes_what_one_call_writes(settings: Settings) -> None:
    client = connection.connect(settings)
    keys = settings.redis_keys
    with state_lock(client, settings, "stream batch 3") as lease:
        commit = partition_commit(settings, lease.token, 3, 2, "whole", 40, pieces=4)
        calls = commit.calls()
        assert len(calls) == 4
        # Every key in exactly one piece, and each piece in reach (none holds them all).
        in_pieces = [len(piece) for piece in commit.changes.pieces(4)]
        assert [int(call[11].as_py()) for call in calls] == in_pieces
        assert sum(in_pieces) == 40 and max(in_pieces) < 40
        assert mirror.commit_partition(client, settings, commit) == "whole"
        assert mirror.partition_outcome(client, keys.partition_record(3, 1)) == "whole"
        assert [bucket_count(client, settings, f'["p-{i}"]') for i in range(40)] == [2] * 40
        mirror.forget_partitions(client, keys, 3, 2)
        assert not list(client.scan_iter(match=keys.partition_records))


def test_a_retried_task_finishes_the_pieces_a_dead_one_began(settings: Settings) -> None:
    """A task died after its record and piece 2 of 4: the partition is not committed yet
    (no outcome to return), and its retry applies pieces 3 and 4 from its own decisions,
    none of pieces 1 and 2 again, and returns the first attempt's outcome."""
    client = connection.connect(settings)
    keys = settings.redis_keys
    record = keys.partition_record(3, 1)
    with state_lock(client, settings, "stream batch 3") as lease:
        first = partition_commit(settings, lease.token, 3, 2, "first", 40, pieces=4)
        pieces = first.changes.pieces(4)
        for call in first.calls()[:2]:
            client.execute_command(*call.to_pylist())
        assert mirror.partition_outcome(client, record) is None
        retry = partition_commit(settings, lease.token, 3, 7, "retry", 40, pieces=4)
        assert mirror.commit_partition(client, settings, retry) == "first"
        assert mirror.partition_outcome(client, record) == "first"
        count_of = {
            change.base: n for n, piece in enumerate(pieces) for change in piece.key_changes()
        }
        for i in range(40):
            expected = 2 if count_of[keys.key_base("sig", f'["p-{i}"]')] < 2 else 7
            assert bucket_count(client, settings, f'["p-{i}"]') == expected
        # Every piece is applied now: a third attempt changes nothing.
        third = partition_commit(settings, lease.token, 3, 9, "third", 40, pieces=4)
        assert mirror.commit_partition(client, settings, third) == "first"
        assert {bucket_count(client, settings, f'["p-{i}"]') for i in range(40)} == {2, 7}


def test_a_piece_out_of_turn_is_refused(settings: Settings) -> None:
    client = connection.connect(settings)
    with state_lock(client, settings, "stream batch 3") as lease:
        commit = partition_commit(settings, lease.token, 3, 2, "first", 40, pieces=4)
        calls = commit.calls()
        with pytest.raises(redis.ResponseError, match="whose record has no pieces"):
            client.execute_command(*calls[1].to_pylist())
        client.execute_command(*calls[0].to_pylist())
        with pytest.raises(redis.ResponseError, match="piece 3 before piece 2"):
            client.execute_command(*calls[2].to_pylist())
        stale = replace(commit, token="not-the-holder")
        assert client.execute_command(*stale.calls()[1].to_pylist()) == -2
