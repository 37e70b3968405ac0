#!/usr/bin/env python3
"""Medians and mrcache/UCX ratios of bench/ucx/run.sh's raw lines; checks the
targets of issue 12 (with --check) and exits 1 when one is missed.

A raw line is `<workload> <metric>=<value> [more=...]`; the first metric is
the figure. mrcache's `unmap-uffd-*` rows are paired with UCX's `unmap-*`."""
import os, statistics, sys
from collections import defaultdict

out = sys.argv[1]
check = "--check" in sys.argv[2:]

def load(name):
    vals = defaultdict(list)
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return vals
    for line in open(path):
        w = line.split()
        if len(w) < 2 or "=" not in w[1]:
            continue
        metric, v = w[1].split("=", 1)
        vals[(w[0], metric)].append(float(v))
    return vals

ucx, mrc = load("ucx.txt"), load("mrc.txt")
med = lambda xs: statistics.median(xs) if xs else None

def ucx_key(key):
    return (key[0].replace("unmap-uffd-", "unmap-"), key[1])

def order(key):
    w = key[0]
    groups = ["hit64k", "hit/", "hit-seq", "hit2t", "overlap-hit", "fill", "marginal", "evict", "overlap-fill", "rss", "unmap-none", "unmap-one", "unmap-uffd", "munmap"]
    g = next((i for i, p in enumerate(groups) if w.startswith(p)), len(groups))
    n = w.split("/")[1] if "/" in w else "0"
    return (g, int(n) if n.isdigit() else 0, w)

# Targets (issue 12): ratio mrcache/UCX, met within 5 %.
TARGETS = {
    "hit64k": 0.5, "hit/1": 0.5, "hit/100": 0.5,
    "hit/10000": 1.0, "hit/100000": 1.0, "hit-seq/100000": 1.0,
    "fill/100000": 0.5, "evict/100000/1000": 0.5,
    # Not in the list, but it asks the overlapping case to show that
    # the hit targets do not rest on disjoint entries: held to the hit target.
    "overlap-hit/10000": 1.0,
}
GROWTH = ("marginal/1000", "marginal/100000", 2.0)

rows, missed = [], []
print(f"{'workload':<26}{'metric':<8}{'UCX':>11}{'mrcache':>11}{'ratio':>8}{'target':>9}  rounds")
for key in sorted(mrc, key=order):
    m = med(mrc[key])
    u = med(ucx.get(ucx_key(key), []))
    ratio = m / u if (u and m is not None) else None
    t = TARGETS.get(key[0])
    verdict = ""
    if t is not None and ratio is not None:
        ok = ratio <= t * 1.05
        verdict = f"<= {t:.1f} " + ("ok" if ok else "MISSED")
        if not ok:
            missed.append(f"{key[0]}: {ratio:.2f} > {t}")
    f = lambda x: f"{x:11.1f}" if x is not None else f"{'-':>11}"
    r = f"{ratio:8.2f}" if ratio is not None else f"{'-':>8}"
    unit = "ns" if key[1] == "ns" else key[1]
    print(f"{key[0]:<26}{unit:<8}{f(u)}{f(m)}{r}{verdict:>14}  {len(mrc[key])}")

lo, hi, limit = GROWTH
a, b = med(mrc.get((lo, "ns"), [])), med(mrc.get((hi, "ns"), []))
if a and b:
    g = b / a
    ok = g <= limit * 1.05
    ua, ub = med(ucx.get((lo, "ns"), [])), med(ucx.get((hi, "ns"), []))
    ucx_g = f" (UCX {ub / ua:.2f})" if ua and ub else ""
    print(f"growth: marginal miss at N=10^5 / at N=10^3: mrcache {g:.2f}{ucx_g}; target <= {limit:.1f} {'ok' if ok else 'MISSED'}")
    if check and not ok:
        missed.append(f"growth {g:.2f} > {limit}")

if not check:
    print("no UCX arm: targets not checked")
    sys.exit(0)
if missed:
    print("targets MISSED: " + "; ".join(missed))
    sys.exit(1)
print("all targets met")
