"""Per-event cost of the stream's batch steps, without Spark (not a test):
`make bench-stream-steps` or `python -m benchmarks.stream_steps`.

The stream's hot path is one Python process; this runs its steps on generated in-order
events, batch by batch, as ``velocity.spark.stream.StreamJob`` does in ``_prepare`` and
``_commit`` (parse, the seen-ids read, admission and the events'
rows, the fan-out, one key-partition decided in this process as an executor task would
(its Redis read and the kernel, and its alerts' JSON), spool, the commit's arguments, then the
collection while Redis runs the commit),
against a real Redis started by ``velocity up`` on its own port, and prints microseconds
per event for each step. No JVM, no write-behind: the floor the whole stream stands on.
``--before REV`` runs this loop on that revision's engine (its ``jobs/`` from a git
worktree, on the same events and Redis) alternately with this checkout's, ``--rounds``
times each, and prints the ratio. ``--rules FILE``: other rules than the sample ones (e.g.
``benchmarks/rules/fire_often.json``, whose alerts' records and JSON cost the most).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import redis

from benchmarks import figures as figures_file
from benchmarks.preview import raw_lines
from velocity.domain.windows import horizon_seconds

ROOT = Path(__file__).resolve().parents[1]


def run(events_dir: Path, rules_file: Path) -> dict[str, float]:
    from benchmarks.stream import redis_cpu
    from velocity.delta import batch_rows
    from velocity.delta.write_behind import Spool
    from velocity.domain.rules import deciding_rules, parse_rules, rules_by_signature
    from velocity.domain.stream_batch import collect_batch_garbage
    from velocity.engine.admission import admit_batch
    from velocity.engine.event_lines import parsed_in_arrival_order
    from velocity.redis import connection, mirror
    from velocity.redis.commit_args import BucketChanges
    from velocity.redis.lock import state_lock
    from velocity.settings import load_settings
    from velocity.spark.ingest import VERDICT_ARROW
    from velocity.spark.stream_decide import BatchPlan, batch_keyed_rows, decide_batch

    settings = load_settings()
    client = connection.connect(settings)
    client.flushall()
    connection.load_functions(client)
    rules = deciding_rules(parse_rules(rules_file.read_text()))  # type: ignore[arg-type]
    signatures = list(rules_by_signature(rules))
    spool = Spool(settings)
    gc.set_threshold(1_000_000, 1000, 1000)  # as the stream (StreamJob.start)
    horizon_s = horizon_seconds(rules, settings)
    spent: dict[str, float] = {}
    total = 0

    redis_cpu_before = redis_cpu(client, on_cluster=False)

    def mark(step: str, began: float) -> float:
        now = time.perf_counter()
        spent[step] = spent.get(step, 0.0) + now - began
        return now

    for batch_id, path in enumerate(sorted(events_dir.glob("*.jsonl"))):
        raws = pa.array(path.read_text().splitlines(), pa.string())
        t = time.perf_counter()
        taken = raw_lines(raws, path, 0)
        lines = parsed_in_arrival_order(taken, VERDICT_ARROW)
        count = lines.num_rows
        t = mark("parse", t)
        valid = lines.filter(lines.column("accepted"))
        ids = valid.column("transactionId")
        read = mirror.read_stream_state(client, settings, pc.unique(ids).to_pylist())
        t = mark("redis-read (seen ids)", t)
        seen = pc.is_in(ids, value_set=pa.array(sorted(read.seen), pa.string()))
        admitted = admit_batch(
            valid, seen.to_numpy(zero_copy_only=False), read.newest_event_time,
            settings.allowed_lateness_ms, settings.max_future_ms, int(time.time() * 1000),
        )  # fmt: skip
        accepted = batch_rows.live_rows(
            "events", admitted.accepted, ingest_time=0, stream_batch=batch_id
        )
        t = mark("admit+rows", t)
        keyed = batch_keyed_rows(accepted, signatures, admitted.watermark)
        t = mark("fan-out", t)
        newest = read.newest_event_time
        cutoff = None if newest is None else newest - horizon_s * 1000
        with state_lock(client, settings, f"bench batch {batch_id}") as lease:
            plan = BatchPlan(
                settings, tuple(rules), 0, cutoff, batch_id, lease.token, horizon_s * 1000
            )
            # One key-partition in this process: what each executor task does, all of it
            # (its Redis read, decision and commit).
            decided = decide_batch(None, keyed, None, plan, 1, in_executors=False)  # type: ignore[arg-type]
            t = mark("key-partition (Redis read + decide + commit)", t)
            alerts = decided.published
            rejected = lines.filter(pc.invert(lines.column("accepted")))
            rows = batch_rows.spooled_rows(
                accepted, rejected, admitted, decided.deltas, decided.alerts,
                decided.out_of_order, 0, batch_id,
            )  # fmt: skip
            spool.write(batch_id, rows, {})
            t = mark("spool", t)
            commit = mirror.stream_commit(
                settings, batch_id, admitted.newest, BucketChanges(),
                admitted.accepted.column("transactionId").to_pylist(), alerts, horizon_s, lease,
            )  # fmt: skip
            t = mark("commit-args", t)
            # As the stream: Redis runs the commit while this process collects.
            pending = mirror.PendingCommit(client, commit, lease)
            del raws, taken, lines, valid, read, admitted, decided, rows, commit, keyed
            collect_batch_garbage()
            t = mark("gc", t)
            pending.result()
            mirror.forget_partitions(client, settings.redis_keys, batch_id, 1)
        mark("redis-commit", t)
        total += count
    lua = {k: v for k, v in client.info("commandstats").items() if "fcall" in k}
    out = {step: round(seconds / total * 1e6, 1) for step, seconds in spent.items()}
    out["total"] = round(sum(spent.values()) / total * 1e6, 1)
    # Redis's own CPU (commands, Lua, protocol and networking) while this ran.
    out["Redis CPU"] = round((redis_cpu(client, False) - redis_cpu_before) / total * 1e6, 1)
    out["of which Lua"] = round(sum(v["usec"] for v in lua.values()) / total, 1)
    for name, stats in lua.items():  # the commit (fcall) apart from the reads (fcall_ro)
        out[f"{name.removeprefix('cmdstat_')} µs"] = round(stats["usec"] / total, 1)
    # What the Lua spends it on: each command's calls and µs an event (scripts' calls count).
    for name, stats in sorted(client.info("commandstats").items()):
        if stats["usec"] >= total / 10 and "fcall" not in name:  # 0.1 µs an event or more
            command = name.removeprefix("cmdstat_")
            out[f"{command} calls"] = round(stats["calls"] / total, 2)
            out[f"{command} µs"] = round(stats["usec"] / total, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=20_000, help="events a micro-batch")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--keys", type=int, default=1_000_000, help="distinct payers")
    parser.add_argument(
        "--before", default="6e3d77a", help="git revision to compare with ('' for none)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="runs of each, alternating")
    parser.add_argument("--port", type=int, default=6393, help="the benchmark's own Redis")
    parser.add_argument(
        "--rules",
        default=str(ROOT / "jobs" / "velocity" / "resources" / "sample_rules.json"),
        help="the rules file (default: the sample rules)",
    )
    parser.add_argument("--inner", help=argparse.SUPPRESS)  # one measured run (subprocess)
    parser.add_argument("--work-dir", type=Path, default=ROOT / "data" / "bench-stream-steps")
    figures_file.add_option(parser)
    args = parser.parse_args()
    work = args.work_dir.resolve()
    redis_url = f"redis://:velocity-bench@127.0.0.1:{args.port}/0"
    env = {
        **os.environ,
        "VELOCITY_DATA_DIR": str(work / "data"),
        "VELOCITY_REDIS_URL": redis_url,
        "VELOCITY_KAFKA_BOOTSTRAP": "",  # `velocity up` starts no broker: nothing reads one
        "VELOCITY_CHECK_PORT": "0",  # nor the check service
    }
    if args.inner:
        # --inner: its value is a run's name
        print(json.dumps(run(work / "events", Path(args.rules))))
        return
    velocity = [sys.executable, "-m", "velocity.cli"]
    shutil.rmtree(work, ignore_errors=True)
    subprocess.run(
        [*velocity, "generate", "--out", str(work / "events"),
         "--events", str(args.batch * args.batches), "--rate", str(args.batch),
         "--keys", str(args.keys), "--files", str(args.batches), "--spike-fraction", "0.01",
         "--late-fraction", "0", "--duplicate-fraction", "0", "--malformed-fraction", "0",
         "--seed", "3", "--start", str(int(time.time() * 1000) - 3_600_000)],
        env=env, check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    trees = {"now": ROOT}
    if args.before:
        tree = trees["before"] = work / "before-tree"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(tree), args.before],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    subprocess.run([*velocity, "up"], env=env, check=True, stdout=subprocess.DEVNULL)
    client = redis.Redis.from_url(redis_url)
    totals: dict[str, list[float]] = {name: [] for name in trees}
    figures: dict[str, Any] = {
        "events": args.batch * args.batches, "batches": args.batches, "keys": args.keys,
        "rules": str(args.rules), "runs": [],
    }  # fmt: skip
    try:
        for _ in range(args.rounds):
            for name, tree in sorted(trees.items()):  # "before" first, then "now"
                # Each in a fresh process: the heap of one must not slow the next.
                # Not the files of what `velocity up` started (it runs; `down` finds it by
                # them): a check service whose pidfile went was left running.
                for old in (work / "data").glob("*"):
                    if old.name not in ("redis", "serve"):
                        shutil.rmtree(old, ignore_errors=True)
                client.config_resetstat()  # Lua time of this run only
                inner = subprocess.run(
                    [sys.executable, "-m", "benchmarks.stream_steps", "--inner", "freeze",
                     "--port", str(args.port), "--rules", str(Path(args.rules).resolve()),
                     "--work-dir", str(work)],
                    env={**env, "PYTHONPATH": f"{tree / 'jobs'}:{ROOT}"}, cwd=ROOT,
                    check=True, capture_output=True, text=True,
                )  # fmt: skip
                result = json.loads(inner.stdout.splitlines()[-1])
                totals[name].append(result["total"])
                figures["runs"].append({"design": name, "us_per_event": result})
                print(json.dumps({"design": name, "µs_per_event": result}, ensure_ascii=False))
        if args.before:
            before, now = min(totals["before"]), min(totals["now"])
            figures["before_over_now"] = round(before / now, 3)
            print(
                f"before ({args.before}) / now: {before / now:.2f}× "
                f"(best of {args.rounds}: {before} vs {now} µs an event; "
                f"{args.batches} batches of {args.batch}, {args.keys} payers)"
            )
        figures_file.write(args.figures, figures)
    finally:
        subprocess.run([*velocity, "down"], env=env, check=False, stdout=subprocess.DEVNULL)
        if args.before:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(trees["before"])],
                check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip


if __name__ == "__main__":
    main()
