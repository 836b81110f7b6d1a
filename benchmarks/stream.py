"""Streaming benchmark (not a test): `make bench-stream` or `python -m benchmarks.stream`.

Starts the local Redis, a fresh data dir with the 8 sample rules (4 signatures), the
streaming job, and the generator writing one file a second at ``--rate`` events/s over
``--keys`` payers for ``--seconds``. Then prints:
- latency from an event's file landing (its modification time) to its alert's entry in
  the Redis stream (the entry id's time): p50 / p99 / max over every alert;
- the sustained throughput (events accepted / wall time from the first file landing to
  the last batch committed) and the micro-batch durations;
- Redis lookup latency p50 / p99 of `velocity_window` for 24 h windows (rule 1), from a
  client on this machine, one round trip each.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VELOCITY = str(Path(sys.executable).parent / "velocity")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000, help="events per second")
    parser.add_argument("--keys", type=int, default=100_000, help="distinct payers")
    parser.add_argument("--seconds", type=int, default=60, help="how long the generator runs")
    parser.add_argument("--work-dir", default=str(ROOT / "data" / "bench-stream"))
    parser.add_argument("--lookups", type=int, default=2000)
    args = parser.parse_args()

    work = Path(args.work_dir)
    redis_url = "redis://:velocity-bench@127.0.0.1:6392/0"
    env = {**os.environ, "VELOCITY_DATA_DIR": str(work / "data"), "VELOCITY_REDIS_URL": redis_url}
    subprocess.run([VELOCITY, "down"], check=False, env=env, stdout=subprocess.DEVNULL)
    shutil.rmtree(work, ignore_errors=True)
    events = work / "events"
    events.mkdir(parents=True)
    # Its own Redis server (port 6392), so the figures are not shared with a demo's keys.
    subprocess.run([VELOCITY, "up"], check=True, env=env, stdout=subprocess.DEVNULL)

    import redis

    from velocity.settings import load_settings

    settings = load_settings(data_dir=work / "data", redis_url=redis_url)
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    client.delete(settings.redis_alert_stream)
    rules = ROOT / "jobs" / "velocity" / "resources" / "sample_rules.json"
    stream = subprocess.Popen(
        [VELOCITY, "stream", "--events", str(events), "--rules", str(rules)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(work / "stream.log", "w"),  # noqa: SIM115
    )
    checkpoint = work / "data" / "checkpoints" / "stream"
    try:
        deadline = time.monotonic() + 120
        while not (checkpoint / "metadata").exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(5)
        subprocess.run(
            [
                VELOCITY,
                "generate",
                "--out",
                str(events),
                "--follow",
                "--rate",
                str(args.rate),
                "--keys",
                str(args.keys),
                "--duration",
                str(args.seconds),
                "--events",
                str(args.rate * (args.seconds + 5)),
                "--spike-fraction",
                "0.01",
                "--late-fraction",
                "0",
                "--duplicate-fraction",
                "0",
                "--malformed-fraction",
                "0",
                "--seed",
                "3",
            ],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )
        files = sorted(p for p in events.glob("*.jsonl"))
        landed = {p.name: p.stat().st_mtime_ns / 1e6 for p in files}
        # Done when the last batch has committed and no new batch started for 20 s.
        deadline = time.monotonic() + 900
        last_offsets, quiet_since = -1, time.monotonic()
        while time.monotonic() < deadline:
            commits = sorted(int(p.name) for p in (checkpoint / "commits").glob("[0-9]*"))
            offsets = sorted(int(p.name) for p in (checkpoint / "offsets").glob("[0-9]*"))
            if offsets and offsets[-1] != last_offsets:
                last_offsets, quiet_since = offsets[-1], time.monotonic()
            if commits and commits[-1] == last_offsets and time.monotonic() - quiet_since > 20:
                break
            time.sleep(1)
        last_commit = checkpoint / "commits" / str(last_offsets)
        finished = last_commit.stat().st_mtime_ns / 1e6
    finally:
        stream.terminate()
        stream.wait(timeout=60)

    tx_file: dict[str, str] = {}
    for path in files:
        for line in path.read_text().splitlines():
            tx_file[str(json.loads(line)["transactionId"])] = path.name
    latencies = []
    for entry_id, fields in client.xrange(settings.redis_alert_stream):
        alert = json.loads(fields["alert"])
        published = int(entry_id.split("-")[0])
        latencies.append(published - landed[tx_file[alert["transactionId"]]])

    batch_seconds = []
    for line in (work / "stream.log").read_text().splitlines():
        if "velocity.stream" in line and '"batch"' in line:
            batch_seconds.append(json.loads(line[line.index("{") :])["seconds"])
    events_total = len(tx_file)
    first_landing = min(landed.values())
    print(
        f"rate {args.rate}/s for {args.seconds} s over {args.keys} payers; 8 rules, "
        f"4 signatures; {events_total} events in {len(files)} files"
    )
    if latencies:
        print(
            f"file landed -> alert in Redis: p50 {percentile(latencies, 0.5) / 1000:.2f} s, "
            f"p99 {percentile(latencies, 0.99) / 1000:.2f} s, max {max(latencies) / 1000:.2f} s "
            f"over {len(latencies)} alerts"
        )
    print(
        f"sustained: {events_total / ((finished - first_landing) / 1000):,.0f} events/s "
        f"(first file landed -> last batch committed)"
    )
    if batch_seconds:
        print(
            f"micro-batches: {len(batch_seconds)}, duration p50 "
            f"{statistics.median(batch_seconds):.1f} s, max {max(batch_seconds):.1f} s"
        )

    entry = client.hgetall("velocity:rule:1")
    names = [k for k in client.scan_iter(match=f"velocity:{{{entry['signatureId']}:*", count=5000)]
    random.seed(1)
    sample = [random.choice(names) for _ in range(args.lookups)]
    timings = []
    for name in sample:
        started = time.perf_counter()
        client.fcall("velocity_window", 1, name, "SUM", entry["windowMs"], entry["bucketMs"])
        timings.append((time.perf_counter() - started) * 1000)
    print(
        f"lookup velocity_window (SUM, 24 h, {len(names)} keys): "
        f"p50 {statistics.median(timings):.3f} ms, p99 {percentile(timings, 0.99):.3f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
