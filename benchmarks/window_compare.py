"""Velocity's buckets vs Spark's built-in sliding window() (not a test): `make bench-window`.

One run, one Spark session, the same events and the 4 signatures of the 8 sample rules:
- Velocity: the streaming job (available-now, one micro-batch per file), state = the
  Delta buckets table (rows and bytes);
- Spark: per signature, a streaming groupBy(window(eventTime, "24 hours", "1 minute"),
  keys) with count/sum/min/max/approx_count_distinct and a 5-minute watermark on the
  RocksDB state store, state = the state operator's rows and memory.
Prints events/s of each and the ratios. Spark's query only aggregates (no per-event
decision), so the throughput ratio flatters it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import figures as figures_file

ROOT = Path(__file__).resolve().parents[1]
VELOCITY = str(Path(sys.executable).parent / "velocity")
# The event lines as Spark's own window() reads them (a test holds it to the event fields).
EVENT_LINE_SCHEMA = (
    "transactionId string, eventTime long, payerId string, beneficiaryId string, "
    "paymentAmount string, paymentType string, ip string, deviceId string, action string"
)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=4_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--rate", type=float, default=10.0, help="events per second of event time")
    parser.add_argument("--work-dir", default=str(ROOT / "data" / "bench-window"))
    parser.add_argument("--port", type=int, default=6393, help="the benchmark's own Redis")
    parser.add_argument(
        "--files", type=int, default=4, help="event files: micro-batches of each query"
    )
    parser.add_argument(
        "--signatures",
        type=int,
        help="Spark's window() on the first N signatures only (a smoke: each query is about "
        "20 s of Spark's failed code generation for the 1 440 slides, whatever the size)",
    )
    figures_file.add_option(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    run(parser().parse_args(argv))
    return 0


def run(args: argparse.Namespace, spark: Any = None) -> dict[str, Any]:
    """The benchmark; its figures. ``spark``: a session to use (a caller's, shared by
    several benchmarks in one process; its settings are put back, it is left running)."""
    work = Path(args.work_dir)
    redis_url = f"redis://:velocity-bench@127.0.0.1:{args.port}/0"
    env = {
        **os.environ,
        "VELOCITY_DATA_DIR": str(work / "data"),
        "VELOCITY_REDIS_URL": redis_url,
        "VELOCITY_KAFKA_BOOTSTRAP": "",  # `velocity up` starts no broker: nothing reads one
    }
    subprocess.run([VELOCITY, "down"], check=False, env=env, stdout=subprocess.DEVNULL)
    shutil.rmtree(work, ignore_errors=True)
    events = work / "events"
    subprocess.run(
        [
            VELOCITY,
            "generate",
            "--out",
            str(events),
            "--events",
            str(args.events),
            "--keys",
            str(args.keys),
            "--rate",
            str(args.rate),
            "--files",
            str(args.files),
            "--late-fraction",
            "0",
            "--duplicate-fraction",
            "0",
            "--malformed-fraction",
            "0",
            "--seed",
            "4",
        ],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    subprocess.run([VELOCITY, "up"], check=True, env=env, stdout=subprocess.DEVNULL)
    environ = dict(os.environ)
    os.environ.update({k: v for k, v in env.items() if k.startswith("VELOCITY_")})
    try:
        return _compare(args, work, events, env, spark)
    finally:
        os.environ.clear()
        os.environ.update(environ)


def _compare(
    args: argparse.Namespace, work: Path, events: Path, env: dict[str, str], spark: Any
) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from velocity.delta import tables
    from velocity.delta.tables import AMOUNT_TYPE
    from velocity.domain.rules import Rule, parse_rules, rules_by_signature
    from velocity.resources import sample_rules_path
    from velocity.settings import load_settings
    from velocity.spark.session import build_spark
    from velocity.spark.stream import StreamJob

    settings = load_settings()
    own_session = spark is None
    if own_session:
        spark = build_spark(settings, "velocity-window-compare")
    spark.conf.set(
        "spark.sql.streaming.stateStore.providerClass",
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    )
    rules = [e for e in parse_rules(sample_rules_path().read_text()) if isinstance(e, Rule)]

    job = StreamJob(spark, settings)
    job.rule_store.apply(rules)
    started = time.monotonic()
    job.start(events, available_now=True, max_files_per_trigger=1).awaitTermination()
    velocity_seconds = time.monotonic() - started
    bucket_bytes, _ = tables.table_size(spark, settings.table_path(tables.BUCKETS))
    bucket_rows = tables.read_table(spark, settings.table_path(tables.BUCKETS)).count()
    print(
        f"  velocity: {velocity_seconds:.1f} s, {bucket_rows} bucket rows, {bucket_bytes} bytes",
        flush=True,
    )

    parsed = (
        spark.readStream.option("maxFilesPerTrigger", 1)
        .format("text")
        .load(str(events))
        .select(F.from_json("value", EVENT_LINE_SCHEMA).alias("e"))
        .select("e.*")
        .withColumn("ts", F.timestamp_millis("eventTime"))
        .withColumn("amount", F.col("paymentAmount").cast(AMOUNT_TYPE))
        .withWatermark("ts", "5 minutes")
    )
    spark_seconds = 0.0
    state_rows = state_bytes = 0
    for signature in list(rules_by_signature(rules))[: args.signatures]:
        frame = parsed
        for name, allowed in signature.filter:
            frame = frame.where(F.col(name).isin(list(allowed)))
        value = F.col(signature.aggregate_field or "transactionId")
        aggregated = frame.groupBy(
            F.window("ts", "24 hours", "1 minute"), *signature.grouping_keys
        ).agg(
            F.count(F.lit(1)),
            F.sum("amount"),
            F.min("amount"),
            F.max("amount"),
            F.approx_count_distinct(value),
        )
        checkpoint = work / "spark-checkpoints" / signature.signature_id
        started = time.monotonic()
        query = (
            aggregated.writeStream.outputMode("update")
            .format("noop")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        spark_seconds += time.monotonic() - started
        operator = query.lastProgress["stateOperators"][0]
        state_rows += int(operator["numRowsTotal"])
        state_bytes += int(operator["memoryUsedBytes"])
        checkpoint_bytes = sum(p.stat().st_size for p in checkpoint.rglob("*") if p.is_file())
        state_bytes = max(state_bytes, 0)
        print(
            f"  spark window(), signature {signature.signature_id}: "
            f"{operator['numRowsTotal']} state rows, checkpoint {checkpoint_bytes} bytes"
        )

    n = args.events
    print(f"{n} events, {args.keys} payers, 8 rules / 4 signatures, 24 h window, 1 min slide")
    print(
        f"velocity buckets:    {velocity_seconds:7.1f} s  {n / velocity_seconds:8,.0f} events/s  "
        f"state {bucket_rows} rows, {bucket_bytes} bytes (Delta)"
    )
    print(
        f"spark window():      {spark_seconds:7.1f} s  {n / spark_seconds:8,.0f} events/s  "
        f"state {state_rows} rows, {state_bytes} bytes (state store memory)"
    )
    print(
        f"throughput ratio velocity/spark: {spark_seconds / velocity_seconds:.2f}; "
        f"state rows ratio spark/velocity: {state_rows / max(bucket_rows, 1):.0f}"
    )
    subprocess.run([VELOCITY, "down"], check=False, env=env, stdout=subprocess.DEVNULL)
    if not own_session:
        spark.conf.unset("spark.sql.streaming.stateStore.providerClass")
    figures = {
        "events": n,
        "keys": args.keys,
        "velocity_seconds": round(velocity_seconds, 2),
        "velocity_events_per_s": round(n / velocity_seconds),
        "bucket_rows": bucket_rows,
        "bucket_bytes": bucket_bytes,
        "spark_seconds": round(spark_seconds, 2),
        "spark_events_per_s": round(n / spark_seconds),
        "state_rows": state_rows,
        "state_bytes": state_bytes,
        "spark_signatures": len(list(rules_by_signature(rules))[: args.signatures]),
        "throughput_ratio": round(spark_seconds / velocity_seconds, 3),
        "state_rows_ratio": round(state_rows / max(bucket_rows, 1), 1),
    }
    figures_file.write(args.figures, figures)
    return figures


if __name__ == "__main__":
    sys.exit(main())
