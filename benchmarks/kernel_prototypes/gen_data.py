"""Generate the synthetic event set.  python gen_data.py [uniform|zipf]
Columns: id (row index), key int64, t int64 epoch ms, units int64 (= amount*1e8), ip string.
"""
import sys, numpy as np, pyarrow as pa, pyarrow.parquet as pq
import os
WORK = os.environ.get("PROTO_WORK", "/tmp/velocity-kernel-prototypes")

dist = sys.argv[1] if len(sys.argv) > 1 else "uniform"
N, K, G = 1_000_000, 100_000, 60_000
BASE = 1_704_067_200_000            # 2024-01-01T00:00Z, a multiple of 60000
rng = np.random.default_rng(20240601)

if dist == "uniform":
    key = rng.integers(0, K, N, dtype=np.int64)
else:  # zipf-ish: P(rank r) ~ r^-1.1 over 100k keys, ranks shuffled onto ids
    p = 1.0 / np.arange(1, K + 1) ** 1.1
    p /= p.sum()
    key = rng.permutation(K)[rng.choice(K, N, p=p)].astype(np.int64)

t = BASE + rng.integers(0, 86_400_000, N, dtype=np.int64)
# exercise the edge semantics: ~2% exact same-key time ties, ~1% exactly on a bucket edge
o = np.lexsort((t, key))
dup = np.flatnonzero(rng.random(N) < 0.02)
dup = dup[dup > 0]
same = key[o[dup]] == key[o[dup - 1]]
t[o[dup[same]]] = t[o[dup[same] - 1]]
edge = rng.random(N) < 0.01
t[edge] -= t[edge] % G

# amount 0.01 .. 100000.00 with up to 8 decimals -> units 1e6 .. 1e13
units = rng.integers(1_000_000, 10_000_000_000_001, N, dtype=np.int64)
pool = np.array([f"10.{i // 256}.{i % 256}.{(i * 37) % 251}" for i in range(200)], dtype=object)
ip = pool[rng.integers(0, 200, N)]

tbl = pa.table({"id": np.arange(N, dtype=np.int64), "key": key, "t": t, "units": units,
                "ip": pa.array(ip, pa.string())})
pq.write_table(tbl, f"{WORK}/data_{dist}.parquet")
vc = np.bincount(key)
print(dist, "rows", N, "keys used", (vc > 0).sum(), "max/key", vc.max(),
      "same-key-time ties", N - len(np.unique(key * 2**28 + (t - BASE))), "edge", edge.sum())
