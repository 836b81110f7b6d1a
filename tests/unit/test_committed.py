"""When Redis's progress is behind a batch known committed (a rollback), and when it is only
behind by a crash's replay (not one)."""

from __future__ import annotations

import pytest

from velocity.domain.committed import Rollback, known_committed, rolled_back

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("hot", "marks"),
    [
        # A new data dir: nothing committed anywhere.
        (None, {}),
        # In step: every store at batch 7.
        (7, {"process": 7, "checkpoint": 7, "delta": 7}),
        # Died after the Redis commit, before Spark counted the batch done and before the
        # write-behind appended it: Spark replays 8, which finds itself committed.
        (8, {"checkpoint": 7, "delta": 7}),
        # Died before the Redis commit: Redis at 7 while Spark replays 8 (not yet counted).
        (7, {"checkpoint": 7, "delta": 6}),
        # The write-behind trails Redis by a few batches (write_behind_seconds).
        (12, {"process": 12, "checkpoint": 12, "delta": 9}),
        # Overlap: Spark counted 8 done once its input was spooled, then the process died
        # before 8 committed; the start decides 8 from its input.
        (7, {"checkpoint": 8, "delta": 7, "undecided": [8]}),
        # ... and a backfill flushed 8's spooled rows meanwhile (it flushes through the
        # checkpoint): 8 is still decided from its input, not a lost batch.
        (7, {"checkpoint": 8, "delta": 8, "undecided": [8]}),
        # A rebuild with no batch committed yet leaves batch -1.
        (-1, {"checkpoint": None, "delta": None}),
        # The first batch handed over and never committed.
        (None, {"checkpoint": 0, "undecided": [0]}),
    ],
)
def test_a_replay_after_a_crash_is_not_a_rollback(hot: int | None, marks: dict) -> None:
    assert rolled_back(hot, **marks) is None


@pytest.mark.parametrize(
    ("hot", "marks", "committed"),
    [
        # Yesterday's AOF: Redis at 3, the checkpoint and Delta at 9.
        (3, {"checkpoint": 9, "delta": 9}, 9),
        # Delta ahead of Redis: only a batch Redis committed reaches Delta.
        (7, {"checkpoint": 7, "delta": 8}, 8),
        # The checkpoint ahead with no input waiting: the batch had committed.
        (7, {"checkpoint": 8, "delta": 7}, 8),
        # Ahead by more than the batch whose input waits.
        (5, {"checkpoint": 8, "delta": 6, "undecided": [8]}, 7),
        # Restored under the running stream: behind this process's last commit.
        (4, {"process": 6}, 6),
        # A snapshot from before the first commit, still naming the data dir.
        (None, {"checkpoint": 2, "delta": 2}, 2),
        (-1, {"process": 0}, 0),
    ],
)
def test_redis_behind_a_batch_known_committed_is_a_rollback(
    hot: int | None, marks: dict, committed: int
) -> None:
    rollback = rolled_back(hot, **marks)
    assert rollback is not None and rollback.committed == committed
    assert rollback.hot == hot


def test_the_message_says_where_redis_is_and_what_each_store_knows() -> None:
    rollback = rolled_back(3, checkpoint=9, delta=8)
    assert rollback == Rollback(3, 9, (("the checkpoint", 9), ("Delta", 8)))
    assert rollback.message() == (
        "Redis holds the state as of batch 3, but batch 9 is committed (the checkpoint at "
        "batch 9, Delta at batch 8): Redis lost committed batches (restored from an older "
        "snapshot?)"
    )


def test_known_committed_stops_below_the_first_undecided_batch() -> None:
    assert known_committed(None, None) is None
    assert known_committed(4, 6) == 6
    assert known_committed(9, 6, [9]) == 8
    assert known_committed(0, None, [0]) is None
    assert known_committed(-1, None) is None
