#!/usr/bin/env python
"""
Micro-benchmark: PySpark 4.1.1 Python transformWithState (Row-based StatefulProcessor API)
for a per-key velocity-check workload, local[2], RocksDB state store + changelog checkpointing.

Source: `rate-micro-batch` (exact rowsPerBatch rows per micro-batch, value = 0,1,2,...),
key = "k" + (value % KEYS). With rowsPerBatch == KEYS every key gets exactly one row per batch.
Trigger: processingTime "0 seconds" (batches run back to back). Sink: format("noop").
Batch timings come from query.recentProgress (durationMs.triggerExecution, numInputRows).

Why it is here: the stream's design choice (docs/architecture/decisions.md, "Why Redis is the
hot state") rests on these figures. Rerun (about 4 minutes on a quiet 2-core machine):
  .venv/bin/python -m benchmarks.tws_prototype --out /tmp/tws_proto/results.jsonl
  .venv/bin/python -m benchmarks.tws_prototype --sizes 1000 --modes tws --warmup 2 --measure 5
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import time

PY = sys.executable
os.environ.setdefault("PYSPARK_PYTHON", PY)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", PY)

from pyspark.sql import Row, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle  # noqa: E402

BASE = os.environ.get("TWS_PROTO_DIR", "/tmp/tws_proto")
BUCKET_MS = 3_600_000  # 1h buckets
WINDOW_MS = 24 * 3_600_000  # 24h window
ADVANCE_MS_PER_BATCH = 10 * 60_000  # event time advances 10 min per micro-batch


class VelocityProcessor(StatefulProcessor):
    """Per key: MapState<bucket_start long, (count long, sum double)> + ValueState(last_ts long).
    Per input row: get bucket, update bucket, iterate map summing buckets in the 24h window
    (removing expired buckets), emit (key, eventTimeMs, windowCount, windowSum).
    Per key per batch (1 row): last.get, buckets.getValue, buckets.updateValue,
    buckets.iterator, last.update  (+ removeKey for expired buckets)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.buckets = handle.getMapState("buckets", "bucket_start long", "cnt long, total double")
        self.last = handle.getValueState("last_ts", "ts long")

    def handleInputRows(self, key, rows, timerValues):
        k = key[0]
        last = self.last.get()
        last_ts = last[0] if last is not None else -1
        for r in rows:
            ts = r.ts_ms
            amt = r.amount
            b = ts - ts % BUCKET_MS
            cur = self.buckets.getValue((b,))
            if cur is None:
                self.buckets.updateValue((b,), (1, amt))
            else:
                self.buckets.updateValue((b,), (cur[0] + 1, cur[1] + amt))
            lo = ts - WINDOW_MS
            wc, ws = 0, 0.0
            expired = []
            for (bk,), (c, s) in self.buckets.iterator():
                if bk + BUCKET_MS <= lo:
                    expired.append(bk)
                else:
                    wc += c
                    ws += s
            for bk in expired:
                self.buckets.removeKey((bk,))
            if ts > last_ts:
                last_ts = ts
            yield Row(key=k, eventTimeMs=ts, windowCount=wc, windowSum=ws)
        self.last.update((last_ts,))

    def close(self) -> None:
        pass


class EmitOnlyProcessor(StatefulProcessor):
    """Same operator, zero explicit state calls: isolates the TWS operator/Python-worker overhead
    (the framework still does set/remove implicit key per grouping key)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        pass

    def handleInputRows(self, key, rows, timerValues):
        for r in rows:
            yield Row(key=key[0], eventTimeMs=r.ts_ms, windowCount=1, windowSum=r.amount)

    def close(self) -> None:
        pass


OUT_SCHEMA = "key string, eventTimeMs long, windowCount long, windowSum double"


def build_spark(uds=False):
    b = (
        SparkSession.builder.master("local[2]")
        .appName("tws_bench")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows", "false")
        .config("spark.driver.memory", "2g")
    )
    if uds:  # optional variant: Unix domain sockets for Python worker / state-server traffic
        b = b.config("spark.python.unix.domain.socket.enabled", "true")
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def source(spark, rows):
    keys = rows  # rows per batch == distinct keys per batch
    return (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", rows)
        .option("numPartitions", 2)
        .option("startTimestamp", 1_700_000_000_000)
        .option("advanceMillisPerBatch", ADVANCE_MS_PER_BATCH)
        .load()
        .select(
            F.concat(F.lit("k"), (F.col("value") % keys).cast("string")).alias("key"),
            (F.unix_micros("timestamp") / 1000).cast("long").alias("ts_ms"),
            ((F.col("value") * 7919 % 100000) / 100.0).alias("amount"),
        )
    )


def run_one(spark, mode, rows, warmup, measure, timeout_s):
    ckpt = f"{BASE}/ckpt/{mode}_{rows}"
    shutil.rmtree(ckpt, ignore_errors=True)
    df = source(spark, rows)
    if mode in ("tws", "tws_emit_only"):
        out = df.groupBy("key").transformWithState(
            statefulProcessor=VelocityProcessor() if mode == "tws" else EmitOnlyProcessor(),
            outputStructType=OUT_SCHEMA,
            outputMode="Update",
            timeMode="None",
        )
        w = out.writeStream.format("noop").outputMode("update")
    elif mode == "noop_sink":
        # same source+projection, stateless, plan actually executed, rows dropped
        w = df.writeStream.format("noop").outputMode("append")
    elif mode == "foreachbatch_noop":
        # trivial foreachBatch that does nothing (no job runs on the batch's data)
        w = df.writeStream.foreachBatch(lambda bdf, bid: None)
    else:
        raise ValueError(mode)
    need = warmup + measure
    load0 = os.getloadavg()[0]
    t0 = time.time()
    q = w.option("checkpointLocation", ckpt).trigger(processingTime="0 seconds").start()
    err = None
    try:
        while True:
            if q.awaitTermination(0.5):
                break
            if len(q.recentProgress) >= need:
                break
            if time.time() - t0 > timeout_s:
                err = f"timeout after {timeout_s}s with {len(q.recentProgress)} batches"
                break
    except Exception as e:  # query failed
        err = repr(e)[:2000]
    progs = list(q.recentProgress)
    try:
        q.stop()
    except Exception as e:
        err = (err or "") + " stop: " + repr(e)[:500]
    if q.exception() is not None and err is None:
        err = str(q.exception())[:2000]
    wall = time.time() - t0
    load1 = os.getloadavg()[0]
    batches = [
        (
            p["batchId"],
            p["numInputRows"] or rows,
            p["durationMs"].get("triggerExecution", 0),
            p["durationMs"],
        )
        for p in progs
        if p["numInputRows"] > 0
        or mode == "foreachbatch_noop"  # noop foreachBatch never reads rows
    ]
    meas = batches[warmup:need]
    res = {
        "mode": mode,
        "rows": rows,
        "keys": rows,
        "n_batches_total": len(batches),
        "n_measured": len(meas),
        "first_batch_ms": batches[0][2] if batches else None,
        "batch_ms_all": [b[2] for b in batches],
        "wall_s": round(wall, 1),
        "loadavg_start_end": (round(load0, 2), round(load1, 2)),
        "error": err,
    }
    if meas:
        ms = [b[2] for b in meas]
        med = statistics.median(ms)
        res.update(
            median_ms=med,
            min_ms=min(ms),
            max_ms=max(ms),
            rows_per_s=round(statistics.median([b[1] for b in meas]) / (med / 1000.0), 1)
            if med
            else None,
        )
        # breakdown of the median batch
        mid = sorted(meas, key=lambda b: b[2])[len(meas) // 2]
        res["median_batch_durationMs"] = mid[3]
    if mode == "tws" and progs:
        sop = progs[-1].get("stateOperators") or []
        if sop:
            res["last_state_op"] = {
                k: sop[0].get(k)
                for k in ("numRowsTotal", "numRowsUpdated", "memoryUsedBytes", "customMetrics")
            }
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000,50000")
    ap.add_argument("--modes", default="foreachbatch_noop,noop_sink,tws")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--measure", type=int, default=8)
    ap.add_argument(
        "--measure-large", type=int, default=3, help="measured batches for sizes >= 50000"
    )
    ap.add_argument(
        "--warmup-large", type=int, default=1, help="warm-up batches for sizes >= 50000"
    )
    ap.add_argument("--timeout", type=int, default=420, help="per-run wall timeout (s)")
    ap.add_argument(
        "--timeout-large", type=int, default=900, help="per-run wall timeout for sizes >= 50000"
    )
    ap.add_argument(
        "--uds", action="store_true", help="spark.python.unix.domain.socket.enabled=true"
    )
    ap.add_argument("--out", default=f"{BASE}/results.jsonl")
    a = ap.parse_args()
    spark = build_spark(a.uds)
    print(
        "uds",
        a.uds,
        "spark",
        spark.version,
        "python",
        sys.version.split()[0],
        "nproc",
        os.cpu_count(),
        flush=True,
    )
    results = []
    for rows in [int(s) for s in a.sizes.split(",")]:
        for mode in a.modes.split(","):
            big = rows >= 50000
            r = run_one(
                spark,
                mode,
                rows,
                a.warmup_large if big else a.warmup,
                a.measure_large if big else a.measure,
                a.timeout_large if big else a.timeout,
            )
            r["uds"] = a.uds
            results.append(r)
            print(json.dumps(r, default=str), flush=True)
            with open(a.out, "a") as f:
                f.write(json.dumps(r, default=str) + "\n")
    print()
    print(
        f"{'mode':<18} {'rows/batch':>10} {'keys':>7} {'median ms':>10} {'min':>7} {'max':>7} "
        f"{'rows/s':>10}  n  load"
    )
    for r in results:
        print(
            f"{r['mode']:<18} {r['rows']:>10} {r['keys']:>7} {r.get('median_ms')!s:>10} "
            f"{r.get('min_ms')!s:>7} {r.get('max_ms')!s:>7} {r.get('rows_per_s')!s:>10} "
            f"{r['n_measured']:>2}  {r['loadavg_start_end']}"
            + (f"  ERR {r['error'][:120]}" if r["error"] else "")
        )
    spark.stop()


if __name__ == "__main__":
    main()
