"""Streaming benchmark (not a test): `make bench-stream` or `python -m benchmarks.stream`.

Measured from outside the job, as a fraud team would see it:

- the events are generated once (in eventTime order, 8 sample rules, ``--keys`` payers)
  into a staging folder, and their complete-data alerts computed by `velocity backtest`:
  for in-order events these, less the ones a cooldown suppresses or a shadow rule raises
  (recorded, never published), are exactly the alerts the stream must publish;
- a lander copies one file a second into the stream's folder at ``--rate`` events/s
  (copy, then rename: a file lands whole) and notes when each landed; with ``--source
  kafka`` a producer sends one file's lines a second to the events topic of a local
  broker instead (keyed by payerId) and notes when the broker acknowledged them all;
- latency of an alert = its entry time in the Redis stream ``velocity:alerts`` minus the
  landing (or production) of its event's file. Every expected alert counts; one never
  published counts as infinitely late (so p99 is infinite when more than 1% never arrive);
- the stream's process tree is sampled for its peak RSS and for the CPU each of its
  processes spent while the files landed and were decided (the driver's Python, the JVM,
  the Python workers), and Redis reports its memory and CPU: CPU µs an event per
  process, the budget two cores set (100 µs an event at 20 000 events/s).

``--design new`` runs this checkout's stream; ``--design old`` runs the design of an
earlier commit (``--old-ref``, the Delta-MERGE-per-batch stream) from a git worktree,
with the same packages, JARs and data. ``--design both`` runs both on the same files.
``--source both`` runs this checkout's stream on the folder, then on Kafka, same events.
``--redis cluster`` runs it against a Redis Cluster of three masters on this machine
(``infra/redis-cluster.sh``: the staged commit of ``velocity.redis.cluster``) instead of one
Redis; ``--redis both`` runs one Redis, then the cluster, same events.

``--lag-partition-seconds S`` (``--source kafka`` only) measures what a lagging partition
costs (SPEC §3, out-of-order events): every line goes to the partition librdkafka's
default partitioner gives its key (CRC-32 of the payerId modulo the events topic's
partitions, so a payer stays on one partition), and the lines of partition 0 are produced
S seconds after the others of their file, by a second producer in a thread of its own (the
others keep their one file a second). A lagged line's latency counts from when the broker
acknowledged IT. Once the stream is stopped the run reports the late_events table's rows
by reason (``late``, ``out_of_order``) and their share of the accepted events, times a
``velocity backfill --late`` from outside (its corrections, retractions, events
evaluated), and counts the expected alerts missing from ``velocity:alerts`` before the
backfill and after it (a CORRECTION for the (ruleId, transactionId) counts as arriving),
and the alerts in effect that are not expected, before and after.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from benchmarks import figures as figures_file
from benchmarks.charts import latency_histogram
from velocity.kafka.topics import TopicWriter

ROOT = Path(__file__).resolve().parents[1]
REDIS_CLUSTER_SH = ROOT / "infra" / "redis-cluster.sh"
PYTHON = sys.executable
RULES = ROOT / "jobs" / "velocity" / "resources" / "sample_rules.json"
# The last commit of the Delta-MERGE-per-batch stream (before the in-memory hot path).
OLD_REF = "4b5e5b0"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else math.inf


def velocity(
    *args: str, env: dict[str, str], check: bool = True, **kwargs: object
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [PYTHON, "-m", "velocity.cli", *args],
        env=env,
        check=check,
        **kwargs,  # type: ignore[call-overload]
    )


@dataclass
class Dataset:
    staging: Path
    files: list[Path]
    tx_file: dict[str, str]
    expected: set[tuple[int, str]]
    events: int
    keys: dict[str, list[str]]  # file name -> its lines' payerIds (the message keys)
    rules: Path  # the rule file the backtest and the stream apply
    payers: dict[str, str] = field(default_factory=dict)  # transactionId -> payerId


def prepared_dataset(args: Any, rules: Path) -> tuple[Path, Dataset]:
    """The work folder of a run's sizes (``args.work_dir``, ``rate``, ``seconds``, ``keys``)
    and rules, and its dataset (generated and backtested there once)."""
    named = "" if rules == RULES else f"-{rules.stem}"
    work = Path(args.work_dir) / f"r{args.rate}-s{args.seconds}-k{args.keys}{named}"
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "VELOCITY_DATA_DIR": str(work / "gen")}
    return work, make_dataset(work, args.rate, args.seconds, args.keys, env, rules)


def make_dataset(
    work: Path, rate: int, seconds: int, keys: int, env: dict[str, str], rules: Path = RULES
) -> Dataset:
    """Generate ``seconds`` files of ``rate`` in-order events and their expected alerts."""
    staging = work / "staging"
    shutil.rmtree(staging, ignore_errors=True)
    start = int(time.time() * 1000)
    velocity(
        "generate", "--out", str(staging), "--events", str(rate * seconds), "--rate", str(rate),
        "--keys", str(keys), "--files", str(seconds), "--start", str(start),
        "--spike-fraction", "0.01", "--late-fraction", "0", "--duplicate-fraction", "0",
        "--malformed-fraction", "0", "--seed", "3",
        env=env, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    files = sorted(staging.glob("*.jsonl"))
    tx_file, keys, payers = {}, {}, {}
    for path in files:
        keys[path.name] = []
        for line in path.read_text().splitlines():
            event = json.loads(line)
            tx_file[str(event["transactionId"])] = path.name
            keys[path.name].append(str(event["payerId"]))
            payers[str(event["transactionId"])] = str(event["payerId"])
    reference = work / "expected.jsonl"
    velocity(
        "backtest", "--rules", str(rules), "--events", str(staging), "--out", str(reference),
        env={**env, "VELOCITY_DATA_DIR": str(work / "backtest")}, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    # Published alerts only: one a cooldown suppressed (SPEC §3) or a shadow rule raised is
    # recorded but never reaches ``velocity:alerts``, so waiting for it would count it as
    # never arriving and keep the stream's idle CPU in the figures.
    expected = {
        (a["ruleId"], a["transactionId"])
        for a in map(json.loads, reference.open())
        if not a.get("suppressed") and not a.get("shadow")
    }
    return Dataset(staging, files, tx_file, expected, len(tx_file), keys, rules, payers)


def process_tree(root_pid: int) -> list[int]:
    """``root_pid`` and its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def cpu_seconds(pid: int) -> float | None:
    """The user + system CPU ``pid`` has spent so far (None: it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_kind(pid: int, root_pid: int) -> str:
    """Which part of the stream a process of its tree is."""
    if pid == root_pid:
        return "driver_python"
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "other"
    return "jvm" if name == "java" else "python_workers" if name.startswith("python") else "other"


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


@dataclass
class Run:
    design: str
    source: str
    redis: str
    rate: int
    seconds: int
    keys: int
    latencies: list[float] = field(default_factory=list)
    file_latencies: list[tuple[str, float]] = field(default_factory=list)  # (its file, latency)
    missing: int = 0
    published: int = 0
    peak_rss_mb: float = 0.0
    peak_rss_python_mb: float = 0.0  # the driver's Python process alone (the hot buckets)
    redis_mb: float = 0.0
    bucket_hashes: int = 0
    batches: int = 0
    batch_p50: float = 0.0
    batch_max: float = 0.0
    processed_per_s: float = 0.0
    hot_keys: int = 0
    lookups: str = ""
    cpu_seconds: dict[str, float] = field(default_factory=dict)  # per process kind, landing on
    redis_commands: dict[str, float] = field(default_factory=dict)  # CPU s by command
    decided_lines: int = 0
    # --lag-partition-seconds: the lagging partition and what it cost.
    lag_seconds: float = 0.0
    lagged_events: int = 0
    lagged_latencies: list[float] = field(default_factory=list)
    accepted_events: int = 0
    late_reasons: dict[str, int] = field(default_factory=dict)
    backfill_seconds: float = 0.0
    backfill: dict[str, Any] = field(default_factory=dict)  # its JSON line
    backfill_exit: int = 0
    extra_before: int = 0  # alerts in effect that are not expected, before the backfill
    missing_after: int = 0
    extra_after: int = 0

    def summary(self) -> dict[str, object]:
        def s(ms: float) -> float | str:
            return "inf" if math.isinf(ms) else round(ms / 1000, 2)

        return {
            "design": self.design,
            "source": self.source,
            "redis": self.redis,
            "rate": self.rate,
            "seconds": self.seconds,
            "keys": self.keys,
            "expected_alerts": len(self.latencies),
            "never_published": self.missing,
            "p50_s": s(percentile(self.latencies, 0.5)),
            "p99_s": s(percentile(self.latencies, 0.99)),
            "max_s": s(max(self.latencies, default=math.inf)),
            "processed_events_per_s": round(self.processed_per_s),
            "micro_batches": self.batches,
            "batch_p50_s": round(self.batch_p50, 2),
            "batch_max_s": round(self.batch_max, 2),
            "peak_rss_mb": round(self.peak_rss_mb),
            "peak_rss_python_mb": round(self.peak_rss_python_mb),
            "redis_used_mb": round(self.redis_mb),
            "bucket_hashes": self.bucket_hashes,
            "hot_keys": self.hot_keys,
            "lookups": self.lookups,
            "cpu_s": {k: round(v, 1) for k, v in sorted(self.cpu_seconds.items())},
            "cpu_us_per_event": {
                k: round(v / self.decided_lines * 1e6, 1)
                for k, v in sorted(self.cpu_seconds.items())
                if self.decided_lines
            },
            # Redis's CPU by command (a function's includes the commands it calls).
            "redis_us_per_event_by_command": {
                name: round(spent / self.decided_lines * 1e6, 1)
                for name, spent in sorted(self.redis_commands.items(), key=lambda item: -item[1])
                if self.decided_lines and spent / self.decided_lines * 1e6 >= 0.1
            },
            **(self.lag_summary() if self.lag_seconds else {}),
        }

    def lag_summary(self) -> dict[str, object]:
        def s(ms: float) -> float | str:
            return "inf" if math.isinf(ms) else round(ms / 1000, 2)

        def share(count: int) -> float:
            return round(100 * count / self.accepted_events, 3) if self.accepted_events else 0.0

        late = self.late_reasons.get("late", 0)
        out_of_order = self.late_reasons.get("out_of_order", 0)
        others = {k: v for k, v in self.late_reasons.items() if k not in ("late", "out_of_order")}
        figures: dict[str, object] = {
            "lag_partition_seconds": self.lag_seconds,
            "lagged_events": self.lagged_events,
            "lagged_expected_alerts": len(self.lagged_latencies),
            "lagged_p50_s": s(percentile(self.lagged_latencies, 0.5)),
            "lagged_p99_s": s(percentile(self.lagged_latencies, 0.99)),
            "accepted_events": self.accepted_events,
            "late_events": late,
            "late_pct": share(late),
            "out_of_order_events": out_of_order,
            "out_of_order_pct": share(out_of_order),
            **({"late_events_other_reasons": others} if others else {}),
            "backfill_s": round(self.backfill_seconds, 1),
        }
        if self.backfill_exit:
            figures["backfill_exit"] = self.backfill_exit
        for name in (
            "corrections",
            "retractions",
            "events_evaluated",
            "late_events",
            "out_of_order_events",
        ):
            if self.backfill.get(name) is not None:
                figures[f"backfill_{name}"] = self.backfill[name]
        figures.update(
            missing_before_backfill=self.missing,
            missing_after_backfill=self.missing_after,
            unexpected_in_effect_before=self.extra_before,
            unexpected_in_effect_after=self.extra_after,
        )
        return figures


class DuringRun(Protocol):
    """What another benchmark does while `run_design`'s stream runs (``benchmarks.check``
    sends checks): each step is called once, in this order, ``close`` always."""

    def before_stream(self, env: dict[str, str], client: Any) -> None:
        """Redis is up and empty, the data dir not made yet; the stream starts on return
        (``benchmarks.page`` fills the tables the stream then writes to)."""

    def prepare(self, env: dict[str, str], client: Any) -> None:
        """The stream is starting: Redis is up (``env`` is the stream's environment)."""

    def start(self) -> None:
        """The first file lands as this returns."""

    def landed(self, times: dict[str, float]) -> None:
        """The last file has landed; ``times``: each file's landing, epoch ms."""

    def stream_stopped(self, client: Any) -> None:
        """The stream is stopped and measured; Redis still holds the state it left."""

    def close(self) -> None:
        """Stop whatever is still running (also after a failure)."""


def run_design(
    design: str,
    source: str,
    redis_kind: str,
    data: Dataset,
    rate: int,
    seconds: int,
    keys: int,
    work: Path,
    port: int,
    lag_seconds: float = 0.0,
    during: DuringRun | None = None,
    extra_env: dict[str, str] | None = None,
    until_decided: bool = False,
) -> Run:
    run = Run(design, source, redis_kind, rate, seconds, keys, lag_seconds=lag_seconds)
    home = work / f"{design}-{source}-{redis_kind}"
    shutil.rmtree(home, ignore_errors=True)
    events = home / "events"
    events.mkdir(parents=True)
    on_cluster = redis_kind == "cluster"
    redis_url = (
        f"redis+cluster://:velocity-bench@127.0.0.1:{port + 1000}/0"
        if on_cluster
        else f"redis://:velocity-bench@127.0.0.1:{port}/0"
    )
    env = {
        **os.environ,
        "VELOCITY_DATA_DIR": str(home / "data"),
        "VELOCITY_REDIS_URL": redis_url,
        "VELOCITY_JARS_DIR": str(ROOT / ".cache" / "jars"),
        # The old design's fixed key names, for both designs: one harness reads both.
        "VELOCITY_REDIS_KEY_PREFIX": "velocity",
        **(extra_env or {}),
        "VELOCITY_REDIS_ALERT_STREAM": "velocity:alerts",
        # A broker only where it is read: an idle one would still take CPU and memory.
        "VELOCITY_KAFKA_BOOTSTRAP": f"127.0.0.1:{port + 3000}" if source == "kafka" else "",
        # Its metrics on a port of its own, beside a stream on the default one.
        "VELOCITY_METRICS_PORT": str(port + 2000),
    }
    if design == "old":
        tree = work / "old-tree"
        if not tree.exists():
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(tree), OLD_REF],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        env["PYTHONPATH"] = str(tree / "jobs")
    if on_cluster:
        env.update(
            VELOCITY_REDIS_CLUSTER_PORT=str(port + 1000),
            VELOCITY_REDIS_CLUSTER_PASSWORD="velocity-bench",
            VELOCITY_REDIS_CLUSTER_DIR=str(home / "redis-cluster"),
        )
    redis_service(on_cluster, "down", env)
    redis_service(on_cluster, "up", env)
    client = redis_client(redis_url)
    if not on_cluster:
        client.flushall()  # the cluster's nodes start empty: `down` removed their files
    if during is not None:
        during.before_stream(env, client)
    log = home / "stream.log"
    reads = ["--source", "kafka"] if source == "kafka" else ["--events", str(events)]
    stream = subprocess.Popen(
        [PYTHON, "-m", "velocity.cli", "stream", *reads, "--rules", str(data.rules)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
        start_new_session=True,
    )
    landed: dict[str, float] = {}
    lagged_landed: dict[str, float] = {}  # --lag-partition-seconds: file -> its lagged lines'
    lagging: LaggingProducer | None = None
    peak = [0.0, 0.0]  # the stream's process tree (Python + the JVM), Python alone
    sampling = threading.Event()
    # CPU per process of the stream's tree: at the first landing, and the latest seen.
    cpu_at_landing: dict[int, float] = {}
    cpu_latest: dict[int, tuple[str, float]] = {}
    landing = threading.Event()

    def sample() -> None:
        while not sampling.wait(1.0):
            tree = process_tree(stream.pid)
            peak[0] = max(peak[0], rss_mb(tree))
            peak[1] = max(peak[1], rss_mb([stream.pid]))
            for pid in tree:
                spent = cpu_seconds(pid)
                if spent is None:
                    continue
                if not landing.is_set():
                    cpu_at_landing[pid] = spent
                cpu_latest[pid] = (process_kind(pid, stream.pid), spent)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        if during is not None:
            during.prepare(env, client)
        # Ready: the rules are applied and the query has started (its checkpoint exists).
        checkpoint = home / "data" / "checkpoints" / "stream"
        deadline = time.monotonic() + 300
        while not (checkpoint / "metadata").exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(3)
        land: Callable[[Path], None]
        if source == "kafka" and lag_seconds:
            land = lagging = LaggingProducer(env, data, lag_seconds)
        else:
            land = kafka_producer(env, data) if source == "kafka" else folder_lander(events)
        time.sleep(1.5)  # a sample of every process's CPU before the first landing
        landing.set()
        redis_cpu_at_landing = redis_cpu(client, on_cluster)
        commands_at_landing = redis_command_cpu(client, on_cluster)
        if during is not None:
            during.start()
        started = time.monotonic()
        for index, path in enumerate(data.files):
            pause = started + index * (seconds / len(data.files)) - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            land(path)
            landed[path.name] = time.time() * 1000
        if during is not None:
            during.landed(landed)
        if lagging is not None:  # the lagged lines of the last files are still to go
            lagged_landed = lagging.finish()
        # Wait for the expected alerts; anything later than this counts as never.
        wait_until = time.monotonic() + max(60.0, seconds * 0.5)
        while time.monotonic() < wait_until:
            # Alerts may be missing or extra (a lagging partition), or the alert stream holds
            # others too (``until_decided``): wait for every line decided.
            if lagging is not None or until_decided:
                if logged_lines(log) >= data.events:
                    break
            elif client.xlen("velocity:alerts") >= len(data.expected):
                break
            time.sleep(1)
        time.sleep(2)
        run.cpu_seconds["redis"] = redis_cpu(client, on_cluster) - redis_cpu_at_landing
        run.redis_commands = {
            name: spent - commands_at_landing.get(name, 0.0)
            for name, spent in redis_command_cpu(client, on_cluster).items()
        }
    finally:
        sampling.set()
        if lagging is not None:
            lagging.close()
        if during is not None:
            during.close()
        os.killpg(stream.pid, 15)
        try:
            stream.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(stream.pid, 9)
    run.peak_rss_mb, run.peak_rss_python_mb = peak
    for pid, (kind, spent) in cpu_latest.items():
        run.cpu_seconds[kind] = run.cpu_seconds.get(kind, 0.0) + spent - cpu_at_landing.get(pid, 0)

    first_seen: dict[tuple[int, str], float] = {}
    for entry_id, fields in client.xrange("velocity:alerts"):
        alert = json.loads(fields["alert"])
        pair = (alert["ruleId"], alert["transactionId"])
        first_seen.setdefault(pair, float(entry_id.split("-")[0]))
    run.published = len(first_seen)
    for pair in data.expected:
        lagged = lagging is not None and lagging.lagged(data.payers[pair[1]])
        if pair in first_seen:
            produced = (lagged_landed if lagged else landed)[data.tx_file[pair[1]]]
            run.latencies.append(first_seen[pair] - produced)
        else:
            run.latencies.append(math.inf)
            run.missing += 1
        run.file_latencies.append((data.tx_file[pair[1]], run.latencies[-1]))
        if lagged:
            run.lagged_latencies.append(run.latencies[-1])
    per_node = masters_info(client, on_cluster, "memory")
    run.redis_mb = sum(int(node["used_memory"]) for node in per_node) / 2**20
    run.bucket_hashes = sum(1 for _ in client.scan_iter(match="velocity:{*}:buckets", count=5000))

    batch_seconds, lines, finished = [], 0, 0
    for text in log.read_text().splitlines():
        if "velocity.stream" in text and '"batch"' in text:
            record = json.loads(text[text.index("{") :])
            batch_seconds.append(record["seconds"])
            lines += record.get("lines", 0)
            finished = max(finished, record["finished"])
            run.hot_keys = max(run.hot_keys, record.get("hot_keys", 0))
    if batch_seconds:
        run.batches = len(batch_seconds)
        run.batch_p50 = statistics.median(batch_seconds)
        run.batch_max = max(batch_seconds)
    first_landing = min(landed.values())
    if finished > first_landing:
        # Lines decided by the last logged batch, over the time since the first landing
        # (the old design logs no line counts: all of them, once every alert arrived).
        decided = lines or (data.events if not run.missing else 0)
        run.decided_lines = decided
        run.processed_per_s = decided / ((finished - first_landing) / 1000)
    # The cluster's lookups take velocity.redis.cluster's path: `make bench-lookup` is one Redis.
    run.lookups = "" if on_cluster else lookup_latency(client, 2000)
    if lagging is not None:
        run.lagged_events = lagging.lagged_lines
        lagged_partition_costs(run, data, client, env, home)
    if during is not None:
        try:
            during.stream_stopped(client)
        finally:
            during.close()
    redis_service(on_cluster, "down", env)
    return run


def logged_lines(log: Path) -> int:
    """The lines the stream's logged batches decided so far (a batch logs once committed:
    its alerts are published)."""
    lines = 0
    for text in log.read_text().splitlines():
        if "velocity.stream" in text and '"batch"' in text:
            lines += json.loads(text[text.index("{") :]).get("lines", 0)
    return lines


def lagged_partition_costs(
    run: Run, data: Dataset, client: Any, env: dict[str, str], home: Path
) -> None:
    """What the lagging partition left to the backfill of late events, the stream stopped:
    the late_events table's rows by reason, a timed `velocity backfill --late`, and the
    expected alerts still missing from the alert stream after it."""
    run.late_reasons, run.accepted_events = late_events_by_reason(Path(env["VELOCITY_DATA_DIR"]))
    if not run.accepted_events:
        run.accepted_events = data.events
    run.extra_before = len(in_effect(client) - data.expected)
    run.backfill_exit, run.backfill_seconds, run.backfill = backfill_late(env, home)
    arrived: set[tuple[int, str]] = set()
    for _, fields in client.xrange("velocity:alerts"):
        alert = json.loads(fields["alert"])
        if alert.get("kind", "ALERT") in ("ALERT", "CORRECTION"):
            arrived.add((alert["ruleId"], alert["transactionId"]))
    run.missing_after = len(data.expected - arrived)
    run.extra_after = len(in_effect(client) - data.expected)


def in_effect(client: Any) -> set[tuple[int, str]]:
    """The (ruleId, transactionId) of the alerts in effect in ``velocity:alerts``: per
    decision, ALERT + CORRECTION - RETRACTION above 0 (SPEC §3)."""
    count: Counter[tuple[int, str, object]] = Counter()
    for _, fields in client.xrange("velocity:alerts"):
        alert = json.loads(fields["alert"])
        decision = (alert["ruleId"], alert["transactionId"], alert.get("ruleVersion"))
        count[decision] += -1 if alert.get("kind") == "RETRACTION" else 1
    return {(rule, tx) for (rule, tx, _), n in count.items() if n > 0}


def late_events_by_reason(data_dir: Path) -> tuple[dict[str, int], int]:
    """The late_events table's rows by reason (null, or a table without the column: late)
    and the events table's rows (the accepted events; 0 when unreadable)."""
    from deltalake import DeltaTable

    tables = data_dir / "tables"
    reasons: Counter[str] = Counter({"late": 0, "out_of_order": 0})
    late = tables / "late_events"
    if DeltaTable.is_deltatable(str(late)):
        table = DeltaTable(str(late))
        if "reason" in {f.name for f in table.schema().fields}:
            column = table.to_pyarrow_table(columns=["reason"]).column("reason")
            reasons.update("late" if r is None else str(r) for r in column.to_pylist())
        else:
            reasons["late"] += table.count()
    events = tables / "events"
    accepted = DeltaTable(str(events)).count() if DeltaTable.is_deltatable(str(events)) else 0
    return dict(reasons), accepted


def backfill_late(env: dict[str, str], home: Path) -> tuple[int, float, dict[str, Any]]:
    """`velocity backfill --late` (the venv's console script) timed from outside, with the
    stream's environment: its exit status, wall seconds and the JSON line it printed last."""
    script = Path(PYTHON).with_name("velocity")
    command = [str(script)] if script.exists() else [PYTHON, "-m", "velocity.cli"]
    log = home / "backfill.log"
    began = time.monotonic()
    with log.open("w") as stderr:
        result = subprocess.run(
            [*command, "backfill", "--late"],
            env=env, stdout=subprocess.PIPE, stderr=stderr, text=True, check=False,
        )  # fmt: skip
    seconds = time.monotonic() - began
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    try:
        summary = json.loads(lines[-1]) if lines else {}
    except ValueError:
        summary = {}
    if result.returncode or not isinstance(summary, dict):
        tail = log.read_text().strip().splitlines()[-5:]
        print(
            f"velocity backfill --late exited {result.returncode} ({log}):",
            *tail,
            sep="\n  ",
            file=sys.stderr,
        )
    return result.returncode, seconds, summary if isinstance(summary, dict) else {}


def masters_info(client: Any, on_cluster: bool, section: str) -> list[dict[str, Any]]:
    """INFO ``section`` of the one Redis, or of every master of the cluster."""
    if on_cluster:
        return list(client.info(section, target_nodes=client.PRIMARIES).values())
    return [client.info(section)]


def redis_cpu(client: Any, on_cluster: bool) -> float:
    """CPU seconds the Redis server(s) spent so far (every master's, summed)."""
    nodes = masters_info(client, on_cluster, "cpu")
    return sum(float(n["used_cpu_user"]) + float(n["used_cpu_sys"]) for n in nodes)


def redis_command_cpu(client: Any, on_cluster: bool) -> dict[str, float]:
    """Each command's CPU seconds so far (every master's, summed; INFO commandstats)."""
    out: dict[str, float] = {}
    for node in masters_info(client, on_cluster, "commandstats"):
        for name, stats in node.items():
            command = name.removeprefix("cmdstat_")
            out[command] = out.get(command, 0.0) + float(stats["usec"]) / 1e6
    return out


def redis_service(on_cluster: bool, action: str, env: dict[str, str]) -> None:
    """`velocity up|down` (one Redis, and the broker when Kafka is read), or
    `infra/redis-cluster.sh up|down` (the cluster's settings are in ``env``)."""
    if not on_cluster:
        velocity(action, env=env, check=action == "up", stdout=subprocess.DEVNULL)
        return
    subprocess.run(
        ["bash", str(REDIS_CLUSTER_SH), action],
        env=env, check=action == "up", stdout=subprocess.DEVNULL,
    )  # fmt: skip


def redis_client(redis_url: str) -> Any:
    import redis
    from redis.cluster import RedisCluster

    if redis_url.startswith("redis+cluster://"):
        url = "redis://" + redis_url.split("://", 1)[1]
        return RedisCluster.from_url(url, decode_responses=True)
    return redis.Redis.from_url(redis_url, decode_responses=True)


def folder_lander(events: Path) -> Any:
    """Lands a file whole in the stream's folder: a copy, then a rename."""

    def land(path: Path) -> None:
        hidden = events / f".{path.name}"
        shutil.copyfile(path, hidden)
        os.rename(hidden, events / path.name)

    return land


def kafka_producer(env: dict[str, str], data: Dataset) -> Any:
    """Produces a file's lines to the events topic, keyed by payerId, and waits until the
    broker acknowledged them all (the messages are there from then on)."""
    from velocity.settings import load_settings

    settings = load_settings(kafka_bootstrap=env["VELOCITY_KAFKA_BOOTSTRAP"])
    sink = TopicWriter(settings, settings.kafka_events_topic, **{"batch.num.messages": 10000})

    def land(path: Path) -> None:
        for line, key in zip(path.read_text().splitlines(), data.keys[path.name], strict=True):
            sink.send(line, key)
        sink.flush()

    return land


class LaggingProducer:
    """Produces a file's lines to the events topic keyed by payerId like `kafka_producer`,
    each to the partition librdkafka's default partitioner gives its key (consistent:
    CRC-32 of the key modulo the partitions; one payer, one partition), but the lines of
    partition 0 ``lag_seconds`` after the others of their file were acknowledged, by a
    second producer in a thread of its own. ``finish`` waits for the last of them and
    returns when each file's lagged lines were acknowledged (epoch ms)."""

    def __init__(self, env: dict[str, str], data: Dataset, lag_seconds: float) -> None:
        from velocity.settings import load_settings

        settings = load_settings(kafka_bootstrap=env["VELOCITY_KAFKA_BOOTSTRAP"])
        self._data = data
        self._lag = lag_seconds
        self._on_time = PartitionWriter(settings, settings.kafka_events_topic)
        self._late = PartitionWriter(settings, settings.kafka_events_topic)
        self.partitions = self._on_time.partitions()
        if self.partitions < 2:
            print(f"the events topic has {self.partitions} partition: every line lags")
        self.lagged_lines = 0
        self._due: queue.Queue[tuple[float, str, list[tuple[str, str]]] | None] = queue.Queue()
        self._acknowledged: dict[str, float] = {}
        self._errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._send_late, daemon=True)
        self._thread.start()

    def partition(self, payer: str) -> int:
        return zlib.crc32(payer.encode()) % self.partitions

    def lagged(self, payer: str) -> bool:
        return self.partition(payer) == 0

    def __call__(self, path: Path) -> None:
        late = []
        for line, key in zip(
            path.read_text().splitlines(), self._data.keys[path.name], strict=True
        ):
            partition = self.partition(key)
            if partition:
                self._on_time.send(line, key, partition)
            else:
                late.append((line, key))
        self._on_time.flush()
        if self._errors:
            raise RuntimeError("producing the lagged partition failed") from self._errors[0]
        if late:
            self.lagged_lines += len(late)
            self._due.put((time.monotonic() + self._lag, path.name, late))

    def _send_late(self) -> None:
        while (item := self._due.get()) is not None:
            due, name, lines = item
            if self._errors:
                continue
            time.sleep(max(0.0, due - time.monotonic()))
            try:
                for line, key in lines:
                    self._late.send(line, key, 0)
                self._late.flush()
            except Exception as exc:  # raised again in the landing thread
                self._errors.append(exc)
                continue
            self._acknowledged[name] = time.time() * 1000

    def finish(self) -> dict[str, float]:
        self.close()
        if self._errors:
            raise RuntimeError("producing the lagged partition failed") from self._errors[0]
        return dict(self._acknowledged)

    def close(self) -> None:
        if self._thread.is_alive():
            self._due.put(None)
            self._thread.join()


class PartitionWriter(TopicWriter):
    """``TopicWriter`` with the partition named per message: the same idempotent producer
    and settings as `kafka_producer`'s."""

    def __init__(self, settings: Any, topic: str) -> None:
        super().__init__(settings, topic, **{"batch.num.messages": 10000})

    def partitions(self) -> int:
        metadata = self._producer.list_topics(self.topic, timeout=30).topics[self.topic]
        if metadata.error is not None:
            raise RuntimeError(f"Kafka topic {self.topic}: {metadata.error}")
        return len(metadata.partitions)


def lookup_latency(client: Any, lookups: int) -> str:
    """Redis window lookups (the lowest-numbered SUM rule's keys, a SUM over its window),
    one round trip each, from this machine."""
    entries = [client.hgetall(name) for name in client.scan_iter(match="velocity:rule:*")]
    sums = [e for e in entries if e.get("aggregatorFunctionType") == "SUM"]
    if not sums:  # (bench-page's clicks may leave its SUM rule paused)
        return "no lookup: no SUM rule in force"
    entry = min(sums, key=lambda e: int(e["ruleId"]))
    hashes = f"velocity:{{{entry['signatureId']}:*}}:buckets"  # not the raw-event strings
    names = list(client.scan_iter(match=hashes, count=5000))
    random.seed(1)
    timings = []
    for name in (random.choice(names) for _ in range(lookups)):
        began = time.perf_counter()
        client.fcall("velocity_window", 1, name, "SUM", entry["windowMs"], entry["bucketMs"])
        timings.append((time.perf_counter() - began) * 1000)
    return (
        f"lookup velocity_window (SUM, rule {entry['ruleId']}, {len(names)} keys): "
        f"p50 {statistics.median(timings):.3f} ms, p99 {percentile(timings, 0.99):.3f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000, help="events per second offered")
    parser.add_argument("--seconds", type=int, default=300, help="how long files land")
    parser.add_argument("--keys", type=int, default=100_000, help="distinct payers")
    parser.add_argument("--design", choices=["new", "old", "both"], default="new")
    parser.add_argument(
        "--source",
        choices=["folder", "kafka", "both"],
        default="folder",
        help="where the new design reads: files landing in a folder, or a Kafka topic",
    )
    parser.add_argument(
        "--redis",
        choices=["single", "cluster", "both"],
        default="single",
        help="one Redis (`velocity up`), a Redis Cluster of three masters, or each in turn",
    )
    parser.add_argument(
        "--rules", default=str(RULES), help="rule file (benchmarks/rules/fire_often.json fires)"
    )
    parser.add_argument(
        "--lag-partition-seconds",
        type=float,
        default=0.0,
        metavar="S",
        help="--source kafka: produce the lines of the events topic's partition 0 S seconds "
        "after the others of their file (a lagging partition), then report the late and "
        "out-of-order events and time `velocity backfill --late`",
    )
    parser.add_argument("--work-dir", default=str(ROOT / "data" / "bench-stream"))
    parser.add_argument(
        "--port",
        type=int,
        default=6392,
        help="the benchmark's own Redis (its cluster +1000, the stream's metrics +2000, the "
        "Kafka broker +3000)",
    )
    figures_file.add_option(parser)
    args = parser.parse_args()
    if args.redis != "single" and (args.source != "folder" or args.design != "new"):
        parser.error("--redis cluster|both runs this checkout's stream on a folder only")
    if args.lag_partition_seconds < 0:
        parser.error("--lag-partition-seconds: give seconds >= 0")
    if args.lag_partition_seconds and args.source != "kafka":
        parser.error(
            "--lag-partition-seconds lags a partition of the Kafka events topic: give it with "
            "--source kafka (a folder has no partitions)"
        )

    rules = Path(args.rules).resolve()
    began = time.monotonic()
    work, data = prepared_dataset(args, rules)
    print(
        f"{data.events} in-order events in {len(data.files)} files ({args.rate}/s for "
        f"{args.seconds} s, {args.keys} payers, {rules.name}); {len(data.expected)} expected "
        f"alerts (velocity backtest, {time.monotonic() - began:.0f} s)",
        flush=True,
    )
    sources = ["folder", "kafka"] if args.source == "both" else [args.source]
    kinds = ["single", "cluster"] if args.redis == "both" else [args.redis]
    runs = [("old", "folder", "single")] if args.design in ("old", "both") else []
    if args.design != "old":
        runs += [("new", source, kind) for source in sources for kind in kinds]
    results, latencies = [], []
    lag = args.lag_partition_seconds
    for design, source, kind in runs:
        run = run_design(
            design, source, kind, data, args.rate, args.seconds, args.keys, work, args.port,
            lag if source == "kafka" else 0.0,
        )  # fmt: skip
        results.append(run.summary())
        label = f"{design}/{source}" + ("/cluster" if kind == "cluster" else "")
        label += f" (partition 0 {lag:g} s late)" if lag and source == "kafka" else ""
        latencies.append((label, run.latencies))
        print(json.dumps(results[-1]), flush=True)
    lagged = f"-lag{lag:g}" if lag else ""  # beside, not over, the figures without a lag
    figures = work / f"figures{lagged}.jsonl"
    figures.write_text("".join(json.dumps(r) + "\n" for r in results))
    chart = latency_histogram(
        latencies,
        work / f"latency{lagged}.png",
        f"Velocity stream: {args.rate} events/s for {args.seconds} s, {args.keys} payers, "
        "8 rules (2 cores)",
    )
    print(f"figures: {figures}; latency histogram: {chart}")
    if len(results) == 2:
        first, second = results
        ratio = {
            k: (
                f"{first[k] / second[k]:.1f}x"
                if isinstance(first[k], float | int) and second[k]
                else "-"
            )
            for k in ("p50_s", "p99_s", "batch_p50_s", "processed_events_per_s")
        }
        names = [label for label, _ in latencies]
        print(f"{names[0]} / {names[1]}: {json.dumps(ratio)}")
    figures = {"events": data.events, "expected_alerts": len(data.expected), "runs": results}
    figures_file.write(args.figures, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
