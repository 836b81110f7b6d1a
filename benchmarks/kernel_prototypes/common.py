import sys, time, resource, numpy as np, pyarrow.parquet as pq
import os
WORK = os.environ.get("PROTO_WORK", "/tmp/velocity-kernel-prototypes")

G = 60_000
WINDOWS_MIN = (10, 60, 1440)
AGGS = ("count", "sum", "max", "uniq")
NAMES = [f"{a}_{w}" for w in WINDOWS_MIN for a in AGGS]

def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

def load(dist):
    return pq.read_table(f"{WORK}/data_{dist}.parquet")

def main(impl_name, prepare, compute, runs=3):
    dist = sys.argv[1] if len(sys.argv) > 1 else "uniform"
    tbl = load(dist)
    inp = prepare(tbl)                      # untimed: convert to the library's natural in-memory input
    base = rss_mb()
    times, out = [], None
    for r in range(runs):
        t0 = time.perf_counter()
        out = compute(inp)
        times.append(time.perf_counter() - t0)
        if r == 0:
            stages = getattr(compute, "stages", None)
    assert set(out) == set(NAMES), sorted(out)
    np.savez(f"{WORK}/out_{impl_name}_{dist}.npz", **{k: np.asarray(v, dtype=np.int64) for k, v in out.items()})
    print(f"{impl_name} [{dist}] runs(s)={['%.3f' % x for x in times]} best={min(times):.3f}s "
          f"rss_after_load={base:.0f}MB peak_rss={rss_mb():.0f}MB")
    st = getattr(compute, "stages", None)
    if st:
        print("  stage times (last run):", {k: round(v, 3) for k, v in st.items()})
