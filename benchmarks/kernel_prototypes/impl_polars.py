"""Polars: no per-row variable frame exists (rolling/rolling_*_by take a constant period), so:
 COUNT/SUM/MAX: bucket decomposition. window(e) = complete buckets [b-k, b-1]  (k = W/g)
     -> per-(key,bucket) count/sum/max, then rolling_{sum,max}_by over a composite key*stride+bucket index
        with window 'ki', closed='left' (stride > bucket span + k so windows never cross keys; no .over())
   + own-bucket part [b*g, t] -> per-(key,t) aggregates (so equal-t peers are all included), then a
     rolling window of g over index (key,bucket)*2g + (t mod g)  (covers exactly [b*g, t]).
 UNIQUE_COUNT: interval coverage. occurrence x is in window(t) iff t in [x.t, (b_x+k+1)*g) (both window
   edges are monotone in t), so for each (key,ip) occurrence add +1 at x.t and -1 at min((b_x+k+1)*g, next
   occurrence t); distinct at t = #starts<=t - #ends<=t within the key (sorted Series.search_sorted on a key*2^30+t composite).
python impl_polars.py [uniform|zipf]"""
import sys, time, numpy as np, polars as pl
from common import G, WINDOWS_MIN, main

SH = 1 << 30                                          # composite (key, t-tmin) key; t-tmin+2days < 2^30

def prepare(tbl):
    return pl.from_arrow(tbl)

def compute(df):
    st = {}; T = time.perf_counter; t0 = T()
    tmin, tmax = df["t"].min(), df["t"].max()
    bmin, bmax = tmin // G, tmax // G
    NBS = bmax - bmin + 1                             # buckets spanned
    STR = NBS + max(WINDOWS_MIN) + 1                  # key stride for a bucket-composite index: windows never cross keys
    key, t, b = pl.col("key"), pl.col("t"), pl.col("t") // G
    # per-(key,t) aggregates (so equal-t peers are always all in), own-bucket prefix [b*g, t] via a rolling
    # window of g over by2 = (key, bucket) slot of width 2g + offset-in-bucket: never reaches the previous bucket
    A = (df.group_by(["key", "t"]).agg(c=pl.len(), s=pl.col("units").sum(), m=pl.col("units").max())
           .sort(["key", "t"])
           .with_columns(ck=key * SH + (t - tmin), gb=key * STR + (b - bmin),
                         by2=(key * NBS + (b - bmin)) * (2 * G) + (t - b * G))
           .with_columns(oc=pl.col("c").rolling_sum_by("by2", f"{G}i"),
                         os=pl.col("s").rolling_sum_by("by2", f"{G}i"),
                         om=pl.col("m").rolling_max_by("by2", f"{G}i")))
    B = (df.group_by(gb=key * STR + (b - bmin))
           .agg(c=pl.len(), s=pl.col("units").sum(), m=pl.col("units").max()).sort("gb"))
    D = (df.select("key", "t", "ip").sort(["key", "ip", "t"])
           .with_columns(nt=pl.when((key == key.shift(-1)) & (pl.col("ip") == pl.col("ip").shift(-1)))
                            .then(t.shift(-1)).otherwise(None)))
    starts = D.select(s=key * SH + (t - tmin)).to_series().sort()
    q = A["ck"]
    n_starts = starts.search_sorted(q, side="right")
    st["prep"] = T() - t0
    cols = []
    for w in WINDOWS_MIN:
        t0 = T()
        # complete buckets [b-k, b-1]: constant-width rolling over the (key,bucket) composite index
        Bk = B.select("gb", pc=pl.col("c").rolling_sum_by("gb", f"{w}i", closed="left"),
                            ps=pl.col("s").rolling_sum_by("gb", f"{w}i", closed="left"),
                            pm=pl.col("m").rolling_max_by("gb", f"{w}i", closed="left"))
        A = (A.join(Bk, on="gb", how="left")
              .with_columns((pl.col("oc") + pl.col("pc")).cast(pl.Int64).alias(f"count_{w}"),
                            (pl.col("os") + pl.col("ps")).alias(f"sum_{w}"),
                            pl.max_horizontal("om", "pm").alias(f"max_{w}"))
              .drop("pc", "ps", "pm"))
        st[f"cnt/sum/max_{w}"] = T() - t0; t0 = T()
        # distinct: (#interval starts <= t) - (#interval ends <= t), per key via the composite ck
        end = pl.min_horizontal((b + (w + 1)) * G, pl.col("nt"))        # nt null -> ignored
        ends = D.select(e=key * SH + (end - tmin)).to_series().sort()
        A = A.with_columns(pl.Series(f"uniq_{w}", (n_starts - ends.search_sorted(q, side="right")).cast(pl.Int64)))
        st[f"uniq_{w}"] = T() - t0
        cols += [f"count_{w}", f"sum_{w}", f"max_{w}", f"uniq_{w}"]
    t0 = T()
    R = df.select("id", "key", "t").join(A.select(["key", "t"] + cols), on=["key", "t"], how="left")
    idx = R["id"].to_numpy(); n = len(idx); out = {}
    for c in cols:
        r = np.empty(n, dtype=np.int64); r[idx] = R[c].to_numpy(); out[c] = r
    st["final_join+scatter"] = T() - t0
    compute.stages = st
    return out

if __name__ == "__main__":
    main("polars", prepare, compute)
