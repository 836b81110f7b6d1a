"""single-thread comparison: python threads1.py [uniform|zipf]  (DuckDB threads=1, Polars POLARS_MAX_THREADS=1)"""
import os, sys, time
os.environ["POLARS_MAX_THREADS"] = "1"
dist = sys.argv[1] if len(sys.argv) > 1 else "uniform"
sys.argv = [sys.argv[0], dist, "bigint"]
import impl_duckdb, impl_polars, polars as pl
from common import load
tbl = load(dist)
impl_duckdb.con.execute("SET threads=1")
for name, mod in [("duckdb", impl_duckdb), ("polars", impl_polars)]:
    inp = mod.prepare(tbl); ts = []
    for _ in range(3):
        t0 = time.perf_counter(); mod.compute(inp); ts.append(time.perf_counter() - t0)
    print(f"{name} 1 thread [{dist}] best {min(ts):.3f}s  (polars pool={pl.thread_pool_size()})")
