"""The state lock on the real redis-server: one holder at a time, named when it blocks,
released only by its own holder, and never shared between data dirs."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from velocity.redis import connection, mirror
from velocity.redis.keys import RedisKeys
from velocity.redis.lease import StateLockLost
from velocity.redis.lock import StateLockTimeout, state_lock
from velocity.settings import Settings

pytestmark = pytest.mark.redis


def test_lock_key_is_a_cluster_hash_tag_of_the_data_dir() -> None:
    keys = RedisKeys("velocity:x", "/var/lib/velocity")
    assert keys.state_lock == "velocity:x:lock:{8479e586182f5e40}"
    assert keys.state_lock != RedisKeys("velocity:x", "/var/lib/velocity2").state_lock


def test_one_holder_at_a_time(settings: Settings) -> None:
    client = connection.connect(settings)
    inside: list[str] = []
    overlap = threading.Event()

    def hold(name: str) -> None:
        with state_lock(connection.connect(settings), settings, name, wait_seconds=30):
            if inside:
                overlap.set()
            inside.append(name)
            time.sleep(0.3)
            inside.remove(name)

    workers = [threading.Thread(target=hold, args=(f"w{i}",)) for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not overlap.is_set()
    assert client.get(settings.redis_keys.state_lock) is None, "released"


def test_a_waiter_gives_up_naming_the_holder(settings: Settings) -> None:
    client = connection.connect(settings)
    with (
        state_lock(client, settings, "compaction"),
        pytest.raises(StateLockTimeout, match="compaction"),
        state_lock(client, settings, "backfill", wait_seconds=0.5),
    ):
        pass


def test_a_working_holder_keeps_its_lock_past_the_lease(settings: Settings) -> None:
    client = connection.connect(settings)
    # A lease of 1.5 s (renewed every 0.5 s) so that a GC pause or a busy core cannot
    # let it lapse; the holder works for three leases.
    with state_lock(client, settings, "long batch", lease_ms=1500):
        time.sleep(4.5)
        with (
            pytest.raises(StateLockTimeout, match="long batch"),
            state_lock(client, settings, "compaction", wait_seconds=1.5),
        ):
            pass


def test_a_holder_whose_lease_ran_out_touches_nobody_elses_lock(settings: Settings) -> None:
    client = connection.connect(settings)
    name = settings.redis_keys.state_lock
    with state_lock(client, settings, "killed", lease_ms=300):
        client.delete(name)  # as if its lease ran out while it hung
        with state_lock(client, settings, "next", wait_seconds=1):
            pass
        client.set(name, '{"token": "someone-else"}')
        time.sleep(0.3)  # a renewal in between must not extend someone else's lock
        assert client.pttl(name) == -1
    assert client.get(name) == '{"token": "someone-else"}', "the old holder left it alone"


def test_two_data_dirs_do_not_block_each_other(settings: Settings, tmp_path: Path) -> None:
    other = settings.model_copy(update={"data_dir": tmp_path / "other"})
    client = connection.connect(settings)
    with state_lock(client, settings, "a"), state_lock(client, other, "b", wait_seconds=0.5):
        pass


def test_a_holder_releases_even_when_redis_lost_its_functions(settings: Settings) -> None:
    client = connection.connect(settings)
    with pytest.raises(RuntimeError), state_lock(client, settings, "compaction"):
        client.function_flush()
        raise RuntimeError("the step failed")
    assert client.get(settings.redis_keys.state_lock) is None


def test_only_the_exact_token_releases_or_renews(settings: Settings) -> None:
    """The lock's value is its holder's JSON: a token that merely appears in it (a prefix of
    the real token, or the holder's name) is not the holder's."""
    client = connection.connect(settings)
    name = settings.redis_keys.state_lock
    value = '{"token": "abcdef", "holder": "stream batch 12"}'
    client.set(name, value)
    for token in ("abc", "def", "stream", "12", '"abcdef"'):
        assert client.fcall("velocity_renew", 1, name, token, "1000") == 0
        assert client.fcall("velocity_unlock", 1, name, token) == 0
    assert client.get(name) == value and client.pttl(name) == -1
    assert client.fcall("velocity_renew", 1, name, "abcdef", "1000") == 1
    assert client.fcall("velocity_unlock", 1, name, "abcdef") == 1
    client.set(name, "not json")
    assert client.fcall("velocity_unlock", 1, name, "not json") == 0


def test_a_holder_learns_that_its_lease_was_lost(settings: Settings) -> None:
    client = connection.connect(settings)
    with state_lock(client, settings, "stalled batch", lease_ms=1500) as lease:
        lease.check()
        client.set(lease.name, '{"token": "next-holder"}')  # its lease ran out meanwhile
        time.sleep(2)  # a renewal (every 0.5 s) finds the lock someone else's
        assert lease.lost.is_set()
        with pytest.raises(StateLockLost, match="stalled batch"):
            lease.check()


def test_a_stream_commit_whose_lease_ran_out_writes_nothing(settings: Settings) -> None:
    """The micro-batch commit is fenced by the lock's token, inside Redis: a holder that
    stalled past its lease cannot write over the next holder's work."""
    client = connection.connect(settings)
    with state_lock(client, settings, "stream batch 3", lease_ms=60_000) as lease:
        client.set(lease.name, '{"token": "next-holder"}')
        with pytest.raises(StateLockLost):
            commit = mirror.stream_commit(
                settings, 3, 5, mirror.BucketChanges(), ["tx-1"], ['{"alertId":"a"}'], 60, lease
            )
            mirror.send_stream_commit(client, settings, commit, lease)
    assert client.xlen(settings.alert_stream) == 0
    assert not mirror.read_stream_state(client, settings, ["tx-1"]).seen
    assert mirror.committed_batch(client, settings) is None
    assert client.get(lease.name) == '{"token": "next-holder"}'
