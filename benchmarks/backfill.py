"""Backfill replay and compaction benchmark (not a test): `make bench-backfill`.

A day of events (1M by default) is generated once (cached), backtested once to fill a
live data dir the way a day of streaming would leave it — events with batch ids, the
buckets written in many small commits (one per simulated micro-batch, as the stream's
MERGEs leave them), and the alerts minus every 50th one (so the backfill has
corrections to emit). Then it times, in one Spark session:

- ``velocity backfill`` over the whole day: replay speed in events/s (evaluated events
  over the run's wall time, lock waits included), and its steps;
- ``velocity maintain compact``: time, bucket rows and Delta files before and after;
- ``velocity maintain optimize`` on the buckets table: files before and after.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks import figures as figures_file

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from velocity.domain.rules import Rule

ROOT = Path(__file__).resolve().parents[1]
VELOCITY = str(Path(sys.executable).parent / "velocity")
REDIS_PORT = 6393


def _generate(events_dir: Path, events: int, keys: int) -> None:
    if (events_dir / ".complete").exists():
        return
    shutil.rmtree(events_dir, ignore_errors=True)
    started = time.monotonic()
    subprocess.run(
        [VELOCITY, "generate", "--out", str(events_dir), "--events", str(events),
         "--keys", str(keys), "--rate", str(events / 86_400), "--files", "8",
         "--spike-fraction", "0.01", "--late-fraction", "0", "--duplicate-fraction", "0.002",
         "--malformed-fraction", "0.002", "--seed", "3"],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    (events_dir / ".complete").write_text("")
    print(f"generated {events} events in {time.monotonic() - started:.1f} s", flush=True)


def live_events(events: DataFrame) -> DataFrame:
    """The backtest's events table as the live events table holds them (one stream batch)."""
    from pyspark.sql import functions as F

    return events.withColumn("stream_batch", F.lit(0).cast("long"))


def kept_alerts(alerts: DataFrame) -> DataFrame:
    """The backtest's alerts less every 50th one: the corrections the backfill must emit."""
    from pyspark.sql import functions as F

    return alerts.where(F.abs(F.hash("alertId")) % 50 != 0)


def signature_rows(spark: SparkSession, in_force: list[Rule]) -> DataFrame:
    """The signatures table's rows as the stream records them after its first batch, by
    the stream's own maker (``signature_records``)."""
    from velocity.delta import tables
    from velocity.domain.rules import rules_by_signature
    from velocity.spark.signature_builds import signature_records

    widest = max(r.window_ms for r in in_force)
    records = signature_records(list(rules_by_signature(in_force)), in_force, widest, 0)
    return spark.createDataFrame(records, tables.SIGNATURE_SCHEMA)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the day")
    parser.add_argument("--keys", type=int, default=100_000, help="distinct payers")
    parser.add_argument("--commits", type=int, default=96, help="bucket commits to simulate")
    parser.add_argument("--work-dir", default=str(ROOT / "data" / "bench-backfill"))
    parser.add_argument("--redis-port", type=int, default=REDIS_PORT, help="its own Redis")
    figures_file.add_option(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    run(parser().parse_args(argv))
    return 0


def run(args: argparse.Namespace, spark: Any = None) -> dict[str, Any]:
    """The benchmark; its figures. ``spark``: a session to use (a caller's, shared by
    several benchmarks in one process, and left running); else one of its own."""
    from pyspark.sql import functions as F

    from velocity.delta import tables
    from velocity.delta.live import LiveTables
    from velocity.domain.rules import Rule, deciding_rules, parse_rules
    from velocity.redis import connection
    from velocity.redis.lock import state_lock
    from velocity.redis.server import redis_down, redis_up
    from velocity.settings import load_settings
    from velocity.spark import maintenance
    from velocity.spark.backfill import Backfill
    from velocity.spark.backtest import backtest_root, run_backtest
    from velocity.spark.session import build_spark
    from velocity.spark.stream import StreamJob

    work = Path(args.work_dir)
    events_dir = work / f"events-{args.events}-{args.keys}"
    _generate(events_dir, args.events, args.keys)
    data_dir = work / "data"
    redis_url = f"redis://:velocity-bench@127.0.0.1:{args.redis_port}/0"
    settings = load_settings(data_dir=data_dir, redis_url=redis_url)
    redis_down(settings)  # a previous run's server keeps its files in the data dir
    shutil.rmtree(data_dir, ignore_errors=True)
    redis_up(settings)
    own_session = spark is None
    if own_session:
        spark = build_spark(settings, "velocity-bench-backfill")

    sample = parse_rules((ROOT / "jobs/velocity/resources/sample_rules.json").read_text())
    rules = [r.with_version(1) for r in sample if isinstance(r, Rule)]
    started = time.monotonic()
    run_backtest(spark, settings, rules, str(events_dir), work / "complete.jsonl", keep_state=True)
    print(f"backtest (fills the day) {time.monotonic() - started:.1f} s", flush=True)

    # A live data dir as a day of streaming leaves it.
    job = StreamJob(spark, settings)
    job.rule_store.apply(sample)
    live = LiveTables.of(settings)
    done = backtest_root(settings)
    events = tables.read_table(spark, done / tables.EVENTS)
    tables.overwrite_table(live_events(events), live.events)
    alerts = tables.read_table(spark, done / tables.ALERTS)
    kept = kept_alerts(alerts)
    tables.overwrite_table(kept, live.alerts)
    buckets = tables.read_table(spark, done / tables.BUCKETS)
    first, last = buckets.agg(F.min("bucket_start"), F.max("bucket_start")).first()
    step = (last - first) // args.commits + 1

    def write_buckets_as_the_stream_does() -> None:
        """The day's buckets in ``--commits`` appends, one per slice of time."""
        shutil.rmtree(live.buckets, ignore_errors=True)
        tables.overwrite_table(spark.createDataFrame([], tables.BUCKET_SCHEMA), live.buckets)
        for n in range(args.commits):
            lo = first + n * step
            buckets.where(F.col("bucket_start").between(lo, lo + step - 1)).write.format(
                "delta"
            ).mode("append").save(str(live.buckets))

    write_buckets_as_the_stream_does()
    in_force = deciding_rules(job.rule_store.in_force())
    signature_rows(spark, in_force).write.format("delta").mode("append").save(str(live.signatures))
    day = events.agg(F.min("eventTime"), F.max("eventTime")).first()

    backfill = Backfill(spark, settings)
    waits: list[float] = []
    probing = threading.Event()

    def probe() -> None:
        """Take and release the state lock every 0.2 s, as the stream's commits do: the
        longest wait is the longest the stream would have paused."""
        client = connection.connect(settings)
        while not probing.is_set():
            asked = time.monotonic()
            with state_lock(client, settings, "bench probe (a micro-batch's commit)"):
                waits.append(time.monotonic() - asked)
            probing.wait(0.2)

    prober = threading.Thread(target=probe, daemon=True)
    started = time.monotonic()
    prober.start()
    summary = backfill.run(int(day[0]), int(day[1]))
    seconds = time.monotonic() - started
    probing.set()
    prober.join()
    print(
        f"backfill of a day: {summary.events_evaluated} events in {seconds:.1f} s = "
        f"{summary.events_evaluated / seconds:,.0f} events/s; {summary.corrections} "
        f"corrections, {summary.retractions} retractions, {summary.buckets_rebuilt} buckets "
        f"repaired; state lock held {summary.lock_seconds:.1f} s; longest wait of a "
        f"commit beside it {max(waits, default=0.0):.1f} s ({len(waits)} commits); "
        f"steps {summary.step_seconds}",
        flush=True,
    )

    # Compaction is measured on the day as the stream left it (many small commits).
    write_buckets_as_the_stream_does()
    compaction = maintenance.compact_buckets(spark, settings)
    print(
        f"compaction: {compaction.seconds:.1f} s; bucket rows {compaction.rows_before:,} -> "
        f"{compaction.rows_after:,}; Delta files {compaction.files_before} -> "
        f"{compaction.files_after}; bytes {compaction.bytes_before:,} -> "
        f"{compaction.bytes_after:,}",
        flush=True,
    )
    optimized = maintenance.optimize_tables(spark, settings, ["buckets"])["buckets"]
    print(
        f"optimize buckets: files {optimized.files_before} -> {optimized.files_after}; bytes "
        f"{optimized.bytes_before:,} -> {optimized.bytes_after:,}",
        flush=True,
    )
    if own_session:
        spark.stop()
    redis_down(settings)
    figures: dict[str, Any] = {
        "events": args.events,
        "events_evaluated": summary.events_evaluated,
        "backfill_seconds": round(seconds, 2),
        "events_per_s": round(summary.events_evaluated / seconds),
        "corrections": summary.corrections,
        "retractions": summary.retractions,
        "buckets_rebuilt": summary.buckets_rebuilt,
        "lock_seconds": round(summary.lock_seconds, 2),
        "longest_commit_wait_s": round(max(waits, default=0.0), 2),
        "step_seconds": {k: round(v, 2) for k, v in summary.step_seconds.items()},
        "compaction_seconds": round(compaction.seconds, 2),
        "bucket_rows_before": compaction.rows_before,
        "bucket_rows_after": compaction.rows_after,
        "files_before": compaction.files_before,
        "files_after": compaction.files_after,
        "optimize_files_before": optimized.files_before,
        "optimize_files_after": optimized.files_after,
    }
    figures_file.write(args.figures, figures)
    return figures


if __name__ == "__main__":
    raise SystemExit(main())
