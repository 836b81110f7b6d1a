"""numpy kernel: lexsort + composite key + searchsorted windows, prefix sums, sparse-table max,
merge-sort-tree dominance count for exact distinct.   python impl_numpy.py [uniform|zipf] [lexsort|merge]"""
import sys, time, numpy as np
from common import G, WINDOWS_MIN, main

TREE_BUILD = sys.argv[2] if len(sys.argv) > 2 else "merge"

def prepare(tbl):
    return dict(key=tbl["key"].to_numpy(), t=tbl["t"].to_numpy(), units=tbl["units"].to_numpy(),
                ip=tbl["ip"].to_numpy(zero_copy_only=False).astype("S15"))   # fixed-width bytes, numpy-native

def build_tree(prev, n):
    """levels[l] = sorted( (i>>l)*(n+1) + prev[i]+1 ) ; blocks of size 2^l each sorted by prev."""
    i = np.arange(n, dtype=np.int64)
    pv = prev + 1
    levels = [i * (n + 1) + pv]
    nlev = max(1, int(n - 1).bit_length())            # 2^(nlev-1) < n <= 2^nlev
    for l in range(1, nlev + 1):
        blk = i >> l
        if TREE_BUILD == "lexsort":                   # as in the brief: np.lexsort per level
            p = np.lexsort((pv, blk))
            levels.append(blk * (n + 1) + pv[p])
        else:                                         # same result: re-key previous level, stable sort merges
            prevlev = levels[-1] % (n + 1)            # the runs of length 2^(l-1) are already sorted (timsort)
            levels.append(np.sort(blk * (n + 1) + prevlev, kind="stable"))
    return levels

def dominance_minus_lo(levels, hi, lo, n):
    """#{i<hi : prev[i] < lo} - lo, vectorised per level."""
    acc = np.zeros(len(hi), dtype=np.int64)
    for l in range(len(levels)):
        bit = (hi >> l) & 1
        if not bit.any():
            continue
        end = (hi >> l) << l                          # block [end-2^l, end) of the prefix decomposition of hi
        full = (bit == 1) & (end <= lo)               # block entirely left of lo: every prev < i < lo
        acc[full] += 1 << l
        part = np.flatnonzero((bit == 1) & (end > lo))
        if len(part):
            blk = (hi[part] >> l) - 1
            cnt = np.searchsorted(levels[l], blk * (n + 1) + lo[part] + 1, "left") - (blk << l)
            acc[part] += cnt
    return acc - lo

def compute(d):
    st = {}; T = time.perf_counter
    t0 = T()
    key, t, units, ip = d["key"], d["t"], d["units"], d["ip"]
    n = len(t)
    o = np.lexsort((t, key))
    ks, ts, us = key[o], t[o], units[o]
    kr = np.zeros(n, dtype=np.int64); np.cumsum(ks[1:] != ks[:-1], out=kr[1:])
    s_ = np.sort(t); ut = s_[np.r_[True, s_[1:] != s_[:-1]]]; U = len(ut)   # np.unique(t) is ~9x slower in numpy 2.4
    rt = np.searchsorted(ut, ts)
    C = kr * (U + 1) + rt                             # nondecreasing; max ~1e5*8.6e7 < 2^63
    hi = np.searchsorted(C, C, "right")               # upper edge exact & inclusive of equal-t peers
    lows = {}
    # rank(floor_g(t) - W) depends only on the bucket: look it up in a small per-bucket table
    b = ts // G; b0 = int(b.min()) - max(WINDOWS_MIN)
    BR = np.searchsorted(ut, np.arange(b0, int(b.max()) + 1, dtype=np.int64) * G, "left")
    for w in WINDOWS_MIN:
        rl = BR[b - w - b0]                           # == np.searchsorted(ut, floor_g(t) - W, 'left')
        lows[w] = np.searchsorted(C, kr * (U + 1) + rl, "left")
    st["sort+bounds"] = T() - t0; t0 = T()

    P = np.zeros(n + 1, dtype=np.int64); np.cumsum(us, out=P[1:])   # may wrap mod 2^64; differences still exact
    st["prefix"] = T() - t0; t0 = T()

    maxlen = int(max((hi - lows[w]).max() for w in WINDOWS_MIN))
    sp = [us]
    j = 1
    while (1 << j) <= maxlen:                         # only levels that some query needs
        a = sp[-1]; h = 1 << (j - 1)
        sp.append(np.maximum(a[:-h], a[h:]))
        j += 1
    lg = np.zeros(maxlen + 1, dtype=np.int64)
    for j in range(1, len(sp)):
        lg[1 << j:] += 1
    st["sparse_build"] = T() - t0; t0 = T()

    _, ipc = np.unique(ip, return_inverse=True)
    st["ip_factorize"] = T() - t0; t0 = T()
    ics = ipc[o].astype(np.int64)
    nip = int(ics.max()) + 1
    g2 = np.argsort(kr * nip + ics, kind="stable")    # group (key, ip), positions ascending inside
    same = (kr[g2[1:]] == kr[g2[:-1]]) & (ics[g2[1:]] == ics[g2[:-1]])
    prev = np.full(n, -1, dtype=np.int64)
    prev[g2[1:][same]] = g2[:-1][same]
    levels = build_tree(prev, n)
    st["mstree_build"] = T() - t0

    res_sorted = {}
    for w in WINDOWS_MIN:
        lo = lows[w]
        t0 = T()
        res_sorted[f"count_{w}"] = hi - lo
        res_sorted[f"sum_{w}"] = P[hi] - P[lo]
        ln = hi - lo
        j = lg[ln]
        mx = np.empty(n, dtype=np.int64)
        for jj in np.unique(j):
            m = np.flatnonzero(j == jj); a = sp[jj]
            mx[m] = np.maximum(a[lo[m]], a[hi[m] - (1 << jj)])
        res_sorted[f"max_{w}"] = mx
        st[f"cnt/sum/max_{w}"] = T() - t0; t0 = T()
        res_sorted[f"uniq_{w}"] = dominance_minus_lo(levels, hi, lo, n)
        st[f"uniq_{w}"] = T() - t0
    t0 = T()
    out = {}
    for k, v in res_sorted.items():
        r = np.empty(n, dtype=np.int64); r[o] = v; out[k] = r
    st["scatter"] = T() - t0
    compute.stages = st
    return out

if __name__ == "__main__":
    main("numpy" + ("" if TREE_BUILD == "merge" else "_lexsort"), prepare, compute)
