"""python verify.py [uniform|zipf] impl1 impl2 ...  -- exact equality of all 12 figures + brute force spot check"""
import sys, numpy as np, pyarrow.parquet as pq
from collections import defaultdict
from common import G, WINDOWS_MIN, NAMES
import os
WORK = os.environ.get("PROTO_WORK", "/tmp/velocity-kernel-prototypes")

dist = sys.argv[1]; impls = sys.argv[2:]
outs = {i: np.load(f"{WORK}/out_{i}_{dist}.npz") for i in impls}
ref = impls[0]
ok = True
for i in impls[1:]:
    for nme in NAMES:
        a, b = outs[ref][nme], outs[i][nme]
        nd = int((a != b).sum())
        if nd:
            ok = False; print(f"MISMATCH {ref} vs {i} {nme}: {nd} rows differ, e.g. row {np.flatnonzero(a != b)[0]}")
print(f"[{dist}] cross-check {impls}: {'ALL 12 x 1M IDENTICAL' if ok else 'DIFFERENCES'}")

# brute force on ~2000 events from a handful of keys
tb = pq.read_table(f"{WORK}/data_{dist}.parquet")
key = tb["key"].to_numpy(); t = tb["t"].to_numpy(); u = tb["units"].to_numpy()
ip = tb["ip"].to_pylist()
cnt = np.bincount(key)
rng = np.random.default_rng(7)
cand = np.flatnonzero((cnt >= 15) & (cnt <= 700))
rng.shuffle(cand)
keys, tot = [], 0
for k in cand:
    if tot >= 2000: break
    keys.append(int(k)); tot += int(cnt[k])
by = defaultdict(list)
for r in np.flatnonzero(np.isin(key, keys)):
    by[int(key[r])].append(int(r))
bad = 0; nev = 0
for k, rows in by.items():
    for r in rows:
        nev += 1
        for w in WINDOWS_MIN:
            L = int(t[r]) - int(t[r]) % G - w * G
            win = [x for x in rows if L <= t[x] <= t[r]]
            exp = (len(win), sum(int(u[x]) for x in win), max(int(u[x]) for x in win), len({ip[x] for x in win}))
            for i in impls:
                got = tuple(int(outs[i][f"{a}_{w}"][r]) for a in ("count", "sum", "max", "uniq"))
                if got != exp:
                    bad += 1
                    if bad < 5: print("BRUTE MISMATCH", i, k, r, w, got, exp)
print(f"[{dist}] brute force: {nev} events over {len(by)} keys x 3 windows x 4 aggs x {len(impls)} impls: "
      f"{'all match' if bad == 0 else f'{bad} mismatches'}")
ties = sum(1 for k, rows in by.items() for a in rows for b in rows if a < b and t[a] == t[b])
print(f"  (sample contains {ties} same-key equal-t pairs, {int((t[np.concatenate(list(by.values()))] % G == 0).sum())} bucket-edge events)")
