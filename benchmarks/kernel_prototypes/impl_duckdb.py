"""DuckDB: window functions with a per-row RANGE offset.
window(e) = PARTITION BY key ORDER BY t RANGE BETWEEN (t % 60000 + W) PRECEDING AND CURRENT ROW
  (t - (t%g + W) = floor_g(t) - W exactly; CURRENT ROW in RANGE mode = all peers with equal t)
python impl_duckdb.py [uniform|zipf] [bigint|decimal]"""
import sys, time, numpy as np, duckdb
from common import G, WINDOWS_MIN, main

MODE = sys.argv[2] if len(sys.argv) > 2 else "bigint"
con = duckdb.connect()

def prepare(tbl):
    con.register("ev", tbl)                           # arrow table, scanned zero-copy by DuckDB
    if MODE == "decimal":                             # untimed: amount stored as DECIMAL(18,8) like a real schema
        con.execute("CREATE OR REPLACE TABLE ev_dec AS SELECT id, key, t, ip, "
                    "CAST(CAST(units AS DECIMAL(18,0)) / 100000000 AS DECIMAL(18,8)) AS amount FROM ev")
    return tbl

def sql(select_aggs=("count", "sum", "max", "uniq")):
    amt = "units" if MODE == "bigint" else "amount"
    parts, wins = ["id"], []
    for w in WINDOWS_MIN:
        wn = f"w{w}"
        wins.append(f"{wn} AS (PARTITION BY key ORDER BY t RANGE BETWEEN (t % {G} + {w * G}) PRECEDING AND CURRENT ROW)")
        if "count" in select_aggs: parts.append(f"count(*) OVER {wn} AS count_{w}")
        if "sum" in select_aggs:
            parts.append(f"CAST(sum(units) OVER {wn} AS BIGINT) AS sum_{w}" if MODE == "bigint" else
                         f"CAST(sum(amount) OVER {wn} * 100000000 AS BIGINT) AS sum_{w}")   # DECIMAL(38,8) sum
        if "max" in select_aggs:
            parts.append(f"max(units) OVER {wn} AS max_{w}" if MODE == "bigint" else
                         f"CAST(CAST(max(amount) OVER {wn} AS DECIMAL(38,8)) * 100000000 AS BIGINT) AS max_{w}")
        if "uniq" in select_aggs: parts.append(f"count(DISTINCT ip) OVER {wn} AS uniq_{w}")
    src = "ev" if MODE == "bigint" else "ev_dec"
    return f"SELECT {', '.join(parts)} FROM {src} WINDOW {', '.join(wins)}"

def compute(tbl, aggs=("count", "sum", "max", "uniq")):
    res = con.sql(sql(aggs)).fetchnumpy()
    idx = res.pop("id")
    n = len(idx); out = {}
    for k, v in res.items():
        r = np.empty(n, dtype=np.int64); r[idx] = np.asarray(v, dtype=np.int64); out[k] = r
    return out

if __name__ == "__main__":
    dist = sys.argv[1] if len(sys.argv) > 1 else "uniform"
    if "--groups" in sys.argv:                        # per-figure-group timing (separate queries)
        from common import load
        tbl = prepare(load(dist))
        for aggs in [("count",), ("sum",), ("max",), ("uniq",), ("count", "sum", "max")]:
            ts = []
            for _ in range(3):
                t0 = time.perf_counter(); compute(tbl, aggs); ts.append(time.perf_counter() - t0)
            print(f"duckdb[{dist}] only {aggs} (3 windows): best {min(ts):.3f}s")
        sys.exit()
    print("duckdb", duckdb.__version__, "threads", con.execute("select current_setting('threads')").fetchall())
    main("duckdb" + ("" if MODE == "bigint" else "_decimal"), prepare, compute)
