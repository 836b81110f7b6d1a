"""Kill -9 the streaming job in the middle of a micro-batch, restart it: nothing lost or doubled.

Two places to die: inside a batch Spark has not counted done (it replays it), and after
Spark counted a batch done but before it committed (the overlap: the restart decides it
from its spooled input)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.conftest import FAST_JVM
from velocity.delta import tables
from velocity.delta.live import LiveTables
from velocity.domain.rules import Rule, parse_rules
from velocity.generate import GenerateOptions, generate_events
from velocity.resources import sample_rules_path
from velocity.settings import Settings
from velocity.spark.backtest import backtest_root, run_backtest
from velocity.spark.evaluate import minute_buckets
from velocity.spark.stream import StreamJob

pytestmark = [pytest.mark.spark, pytest.mark.redis]

VELOCITY = str(Path(sys.executable).parent / "velocity")
# One file a micro-batch: two committed, one killed, and at least two more after the restart.
FILES = 5


def stream_command(events: Path, trigger: str = "available-now") -> list[str]:
    return [
        VELOCITY,
        "stream",
        "--events",
        str(events),
        "--rules",
        str(sample_rules_path()),
        "--trigger",
        trigger,
        "--max-files-per-trigger",
        "1",
        "--duration",
        "300",
    ]


def kill_mid_batch(command: list[str], env: dict[str, str], checkpoint: Path) -> int:
    """Start the job, SIGKILL it once a batch past the first has started but not committed."""

    def in_flight() -> int | None:
        started = {p.name for p in (checkpoint / "offsets").glob("[0-9]*")}
        committed = {p.name for p in (checkpoint / "commits").glob("[0-9]*")}
        in_flight = started - committed
        if committed and in_flight and max(map(int, in_flight)) >= 2:
            batch = max(map(int, in_flight))
            # Inside the batch (a 500-event batch takes about half a second since the
            # write-behind left Spark; 0.5 s here let most of them commit first).
            time.sleep(0.1)
            if not (checkpoint / "commits" / str(batch)).exists():
                return batch
        return None

    return kill_when(command, env, in_flight, 0.05)


def kill_after_handover(command: list[str], env: dict[str, str], data_dir: Path) -> int:
    """Start the job, SIGKILL it once Spark counts a batch past the first done while the
    batch is still deciding (its input spooled, not yet committed)."""
    checkpoint = data_dir / "checkpoints" / "stream"
    inputs = data_dir / "spool" / "stream-input"

    def handed_over() -> int | None:
        for path in inputs.glob("[0-9]*.arrow"):
            batch = int(path.stem)
            if batch >= 1 and (checkpoint / "commits" / str(batch)).exists():
                return batch
        return None

    return kill_when(command, env, handed_over, 0.005)


def kill_when(
    command: list[str], env: dict[str, str], moment: Callable[[], int | None], poll: float
) -> int:
    """Start the job and SIGKILL it at the first ``moment()`` that names a batch; that batch."""
    process = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            batch = moment()
            if batch is not None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
                return batch
            if process.poll() is not None:
                pytest.fail(f"stream ended (exit {process.returncode}) before it could be killed")
            time.sleep(poll)
        pytest.fail("no micro-batch in flight within 300 s")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Uninterrupted:
    """The events both kill tests stream, and the backtest's result over them."""

    events: Path
    alerts: list[tuple[object, ...]]
    buckets: list[tuple[object, ...]]
    transactions: list[tuple[object, ...]]


ALERT_COLUMNS = [
    "alertId", "ruleId", "transactionId", "aggregateValue", "windowStart", "suppressedBy",
]  # fmt: skip


def rows(spark, path: Path, columns: list[str]) -> list[tuple[object, ...]]:
    return sorted(tuple(r) for r in tables.read_table(spark, path).select(*columns).collect())


def merged_buckets(spark, path: Path, width: int) -> list[tuple[object, ...]]:
    """The bucket rows merged per bucket (the live table holds one per bucket and batch)."""
    merged = minute_buckets(tables.read_table(spark, path), width)
    return sorted(tuple(r) for r in merged.drop("distinct_values").collect())


@pytest.fixture(scope="module")
def uninterrupted(
    spark, spark_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Uninterrupted:
    """The events (generated once: both places to die stream the same ones) and the
    uninterrupted result, the backtest over them (equal for in-order input), computed once."""
    work = tmp_path_factory.mktemp("crash")
    events = work / "events"
    generate_events(
        events,
        GenerateOptions(
            events=500 * FILES,
            rate=3.0,
            payers=30,
            files=FILES,
            spike_fraction=0.03,
            late_fraction=0.0,
            duplicate_fraction=0.02,
            malformed_fraction=0.02,
            seed=77,
        ),
    )
    sample = [
        e.with_version(1)
        for e in parse_rules(sample_rules_path().read_text())
        if isinstance(e, Rule)
    ]
    bt_settings = spark_settings.model_copy(update={"data_dir": work / "bt"})
    run_backtest(spark, bt_settings, sample, str(events), work / "bt.jsonl", keep_state=True)
    root = backtest_root(bt_settings)
    return Uninterrupted(
        events=events,
        alerts=rows(spark, root / tables.ALERTS, ALERT_COLUMNS),
        buckets=merged_buckets(spark, root / tables.BUCKETS, bt_settings.bucket_width_ms),
        transactions=rows(spark, root / tables.EVENTS, ["transactionId"]),
    )


@pytest.mark.parametrize("moment", ["mid-batch", "after-handover"])
def test_sigkill_then_restart_equals_uninterrupted(
    spark, data_settings: Settings, tmp_path: Path, moment: str, uninterrupted: Uninterrupted
) -> None:
    events = tmp_path / "events"  # a copy of its own: the stream may archive what it read
    shutil.copytree(uninterrupted.events, events)
    for order, path in enumerate(sorted(events.glob("*.jsonl"))):
        os.utime(path, (1_700_000_000 + order, 1_700_000_000 + order))
    env = {
        **os.environ,
        **FAST_JVM,
        "VELOCITY_DATA_DIR": str(data_settings.data_dir),
        "VELOCITY_REDIS_URL": data_settings.redis_url,
        "VELOCITY_SPARK_MASTER": "local[2]",
        "VELOCITY_SPARK_SHUFFLE_PARTITIONS": "2",
    }
    checkpoint = data_settings.data_dir / "checkpoints" / "stream"

    if moment == "mid-batch":
        killed_batch = kill_mid_batch(stream_command(events), env, checkpoint)
        assert not (checkpoint / "commits" / str(killed_batch)).exists()
    else:  # the continuous trigger overlaps batches; Spark will not replay this one
        data_dir = data_settings.data_dir
        killed_batch = kill_after_handover(stream_command(events, "continuous"), env, data_dir)
        assert (checkpoint / "commits" / str(killed_batch)).exists()
    finished = subprocess.run(
        stream_command(events), env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert len(list((checkpoint / "commits").glob("[0-9]*"))) == FILES
    assert not list((data_settings.data_dir / "spool" / "stream-input").glob("*.arrow"))
    if moment == "after-handover":
        assert f"finishing batch {killed_batch} from its spooled input" in finished.stderr

    # The uninterrupted result: the backtest over the same events.
    live = LiveTables.of(data_settings)
    streamed = rows(spark, live.alerts, ALERT_COLUMNS)
    assert streamed and streamed == uninterrupted.alerts
    width = data_settings.bucket_width_ms
    assert merged_buckets(spark, live.buckets, width) == uninterrupted.buckets
    assert rows(spark, live.events, ["transactionId"]) == uninterrupted.transactions

    # Redis: the mirror equals Delta, and each alert is on the stream exactly once.
    client = redis.Redis.from_url(data_settings.redis_url, decode_responses=True)
    published = [
        json.loads(fields["alert"])["alertId"]
        for _, fields in client.xrange(data_settings.alert_stream)
    ]
    # Notified alerts only: the sample rules' cooldowns suppressed the others, and a
    # notification is never sent twice nor lost across the kill (the last notified alert
    # per rule and key is committed with the key's buckets).
    notified = [r[0] for r in rows(spark, live.alerts, ["alertId", "suppressed"]) if not r[1]]
    assert len(notified) < len(streamed)
    assert sorted(published) == notified
    assert StreamJob(spark, data_settings).mirror.reconcile().clean
