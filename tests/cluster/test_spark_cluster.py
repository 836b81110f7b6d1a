"""Velocity on a real Spark standalone cluster (`infra/cluster.sh`: a master and two
one-core workers on loopback) with a real Redis Cluster (`infra/redis-cluster.sh`: three
masters): the stream and the backfill run there, and decide exactly what a local-mode
backtest decides, though one worker's executor is killed in the middle of a micro-batch;
eviction walks every Redis master; lookups through the cluster client equal Delta. (A
backtest on the cluster is `make bench-cluster`'s; here it would add a minute of Spark
start-up. Eviction runs in this process, its Spark local: a driver of its own on the
cluster costs half a minute, and check_quality's DAG test submits a batch job there.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict
from decimal import Decimal
from pathlib import Path

import pytest

from tests.conftest import FAST_JVM, SparkCluster
from velocity.delta import tables
from velocity.delta.live import LiveTables
from velocity.domain.rules import Rule, parse_rules
from velocity.generate import GenerateOptions, generate_events
from velocity.redis import connection, mirror
from velocity.resources import sample_rules_path
from velocity.settings import Settings
from velocity.spark.backtest import backtest_root, run_backtest
from velocity.spark.evaluate import minute_buckets
from velocity.spark.maintenance import evict_state, reconcile_state

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.redis]

VELOCITY = str(Path(sys.executable).parent / "velocity")
KILL_EXECUTOR = Path(__file__).parent / "kill_executor"


def killing_interpreter(folder: Path, marker: Path) -> str:
    """A Python for the executors that loads ``kill_executor/sitecustomize.py``: the first
    key-partition task on worker 1 SIGKILLs its executor (once; ``marker`` records it)."""
    script = folder / "python-killing-worker-1"
    script.write_text(
        "#!/bin/sh\n"
        f"export VELOCITY_TEST_KILL_MARKER='{marker}'\n"
        f"export PYTHONPATH='{KILL_EXECUTOR}'${{PYTHONPATH:+:$PYTHONPATH}}\n"
        f"exec '{sys.executable}' \"$@\"\n"
    )
    script.chmod(0o755)
    return str(script)


def velocity(
    args: list[str], env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """One `velocity` process; its seconds are printed (pytest shows them on failure)."""
    started = time.monotonic()
    done = subprocess.run(
        [VELOCITY, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    print(f"velocity {' '.join(args[:2])}: {time.monotonic() - started:.1f} s")
    assert done.returncode == 0, f"velocity {args[0]}: {done.stderr[-3000:]}"
    return done


def test_cluster_decides_what_local_mode_decides(
    spark,
    spark_cluster: SparkCluster,
    redis_cluster_url: str,
    data_settings: Settings,
    tmp_path: Path,
) -> None:
    """Spark standalone cluster and Redis Cluster together, as a platform team deploys."""
    settings = data_settings.model_copy(update={"redis_url": redis_cluster_url})
    redis_cluster = connection.connect(settings)
    redis_cluster.flushall()
    state = spark_cluster.state()
    assert state["aliveworkers"] == 2 and state["cores"] == 2

    events = tmp_path / "events"
    # Held-out style input: spikes, duplicates and malformed lines, in order (so the
    # stream must decide what the backtest decides).
    generated = generate_events(
        events,
        GenerateOptions(
            events=3000,
            rate=3.0,
            payers=40,
            files=3,
            spike_fraction=0.03,
            late_fraction=0.0,
            duplicate_fraction=0.02,
            malformed_fraction=0.02,
            seed=1010,
        ),
    )
    for order, path in enumerate(sorted(events.glob("*.jsonl"))):
        os.utime(path, (1_700_000_000 + order, 1_700_000_000 + order))
    rules = str(sample_rules_path())
    env = {
        **os.environ,
        **FAST_JVM,
        "VELOCITY_DATA_DIR": str(settings.data_dir),
        "VELOCITY_REDIS_URL": redis_cluster_url,
        "VELOCITY_SPARK_MASTER": spark_cluster.master,
        "VELOCITY_SPARK_SHUFFLE_PARTITIONS": "4",
        "VELOCITY_SPARK_DRIVER_MEMORY": "2g",
        "VELOCITY_SPARK_EXECUTOR_MEMORY": "1g",
        # Every micro-batch's key-partitions are Spark tasks on the workers.
        "VELOCITY_STREAM_EXECUTOR_MIN_ROWS": "0",
    }

    # The reference: this session's local Spark.
    sample = [
        e.with_version(1) for e in parse_rules(Path(rules).read_text()) if isinstance(e, Rule)
    ]
    local = data_settings.model_copy(update={"data_dir": tmp_path / "local"})
    run_backtest(spark, local, sample, str(events), tmp_path / "local.jsonl", keep_state=True)

    stream = ["stream", "--events", str(events), "--rules", rules, "--trigger", "available-now"]
    # The executors' Python kills worker 1's executor in its first key-partition task,
    # after deciding and committing its keys' buckets, before the result is back: a
    # machine lost in the middle of a batch.
    killed = tmp_path / "killed"
    stream_env = {**env, "PYSPARK_PYTHON": killing_interpreter(tmp_path, killed)}
    # (An executor lost costs a minute or so: Spark notices, the worker starts another.)
    streamed = velocity([*stream, "--max-files-per-trigger", "1"], stream_env, timeout=600)
    # The decisions ran in the executors of both workers (each batch logs where each of
    # its key-partitions ran: host, Python worker, the executor's working folder, and the
    # task's attempt).
    batches = [
        json.loads(line[line.index("{") :])
        for line in streamed.stderr.splitlines()
        if "velocity.stream" in line and '"partitions"' in line
    ]
    parts = [p for b in batches for p in b["partitions"]]
    assert killed.exists(), "no key-partition task ran on worker 1"
    # The lost task ran again and returned the outcome its first attempt recorded with
    # its commit (applying nothing twice), and the stream went on: every assertion below
    # holds as if nothing happened.
    assert any(p["attempt"] > 0 and p.get("recorded") for p in parts), parts
    ran_on = {p["executor"].rsplit(":", 1)[-1] for p in parts}  # executor ids
    assert len(batches) >= 3 and len(ran_on) >= 2, ran_on
    assert not any(p["executor"].startswith("driver") for p in parts)
    day = ["--from", str(generated.min_event_time), "--to", str(generated.max_event_time)]
    backfilled = json.loads(velocity(["backfill", *day], env).stdout)
    evicted = asdict(evict_state(spark, settings))

    ran = spark_cluster.applications()
    assert len(ran) >= 2, f"the commands ran on the cluster: {ran}"

    def rows(path: Path, columns: list[str]) -> list[tuple[object, ...]]:
        return sorted(tuple(r) for r in tables.read_table(spark, path).select(*columns).collect())

    live = LiveTables.of(settings)
    columns = ["alertId", "ruleId", "transactionId", "aggregateValue", "windowStart"]
    local_root = backtest_root(local)
    # The backfill over the whole range agrees with the stream: nothing to amend.
    assert backfilled["corrections"] == backfilled["retractions"] == 0
    assert backfilled["buckets_rebuilt"] == 0
    assert rows(live.alerts, columns) == rows(local_root / tables.ALERTS, columns)
    width = settings.bucket_width_ms

    def buckets(path: Path) -> list[tuple[object, ...]]:
        merged = minute_buckets(tables.read_table(spark, path), width)
        return sorted(tuple(r) for r in merged.drop("distinct_values").collect())

    assert buckets(live.buckets) == buckets(local_root / tables.BUCKETS)
    # Eviction walked every master's hashes (all inside the horizon: nothing dropped).
    assert evicted["redis_buckets_dropped"] == evicted["redis_hashes_dropped"] == 0
    assert evicted["bucket_rows_after"] == evicted["bucket_rows_before"] > 0
    # Redis Cluster: every bucket equals Delta's (reconcile reads each hash through the
    # cluster client, the buckets from Delta in this process), the alerts are on its
    # stream once each, and a lookup of a SUM rule through the cluster client equals the
    # sum of the Delta buckets of its window.
    reconciled = reconcile_state(spark, settings, repair=False)  # here, not on the cluster
    assert reconciled.checked > 0 and reconciled.clean_after
    published = [json.loads(f["alert"]) for _, f in redis_cluster.xrange(settings.alert_stream)]
    notified = [r[0] for r in rows(live.alerts, ["alertId", "suppressed"]) if not r[1]]
    assert sorted(a["alertId"] for a in published) == notified
    rule = next(r for r in sample if r.aggregator.value == "SUM")
    signature = rule.signature
    merged = minute_buckets(tables.read_table(spark, live.buckets), width)
    stored = merged.where(merged.signature_id == signature.signature_id).collect()
    busiest = Counter(row["key"] for row in stored).most_common(1)[0][0]
    at = max(row["bucket_start"] for row in stored if row["key"] == busiest) + width - 1
    lower = (at - rule.window_ms) // width * width
    expected = sum(
        (
            row["value_sum"] or Decimal(0)
            for row in stored
            if row["key"] == busiest and lower <= row["bucket_start"] <= at
        ),
        Decimal(0),
    )
    key_values = dict(zip(signature.grouping_keys, json.loads(busiest), strict=True))
    looked_up = mirror.lookup(redis_cluster, settings.redis_keys, rule.rule_id, key_values, at)
    assert Decimal(looked_up["aggregateValue"]) == expected > 0
