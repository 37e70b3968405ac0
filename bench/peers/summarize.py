#!/usr/bin/env python3
"""summarize.py RAW [--json FILE]: medians (and per-round ratios) from run.sh's raw.txt;
with --json, also the run as JSON (docs/data/peers.json's format: `mrcache figures --import FILE`)."""
import sys, statistics as st, collections, re
raw = sys.argv[1]
rows = collections.defaultdict(list)   # (part, arm, cond, name, key) -> [values in round order]
loads, hung = [], []
for line in open(raw):
    f = line.split()
    if not f: continue
    if f[0] == 'load': loads.append(line.strip()); continue
    if f[0] in ('commit', 'machine', 'settings'): continue   # the run's metadata (--json)
    if 'HUNG' in line: hung.append(line.strip()); continue
    part, arm, cond, name = f[:4]
    for kv in f[4:]:
        if '=' in kv:
            k, v = kv.split('=', 1)
            try: rows[(part, arm, cond, name, k)].append(float(v))
            except ValueError: pass
med = lambda v: st.median(v) if v else float('nan')
def get(part, arm, cond, name, key): return rows.get((part, arm, cond, name, key), [])
def fmt(x, d=1): return '-' if x != x else f'{x:.{d}f}'
def pr_ratio(a, b):
    """median of per-round ratios (same round = same machine state), and min..max"""
    r = [x / y for x, y in zip(a, b) if y]
    return (med(r), min(r) if r else float('nan'), max(r) if r else float('nan'))

print('# load averages'); [print('  ' + l) for l in loads]
# ---- reconcile
if any(k[0] == 'reconcile' for k in rows):
    print('\n## Q1 reconcile: hit N=1e5 random, 8 KiB adjacent regions (ns per get+put; medians; ratio = mrcache/UCX, median of per-round ratios [min..max])')
    print(f"{'bench / condition':34s} {'metric':6s} {'UCX':>8s} {'mrcache':>8s} {'ratio':>6s} {'range':>13s}")
    for cond in ['quiet', 'quiet-2M', 'quiet-20M', 'thrash', 'thrash-2M', 'thrash-20M']:
        for bench, u, m, n, keys in [('steering (anchors/side-by-side)', 'steer_ucx', 'steer_mrc', None, ['ns_per_getput']),
                                   ('project (bench/ucx)', 'proj_ucx', 'proj_mrc', 'hit/100000', ['ns', 'cpu']),
                                   ('pb (this dir; mrcache via C API)', 'pb_ucx', 'pb_mrc', 'hit/100000', ['ns', 'cpu'])]:
            for key in keys:
                if n is None:
                    uv, mv = get('reconcile', u, cond, 'hitN', key), get('reconcile', m, cond, 'hitN', key)
                else:
                    uv, mv = get('reconcile', u, cond, n, key), get('reconcile', m, cond, n, key)
                if not uv: continue
                r, lo, hi = pr_ratio(mv, uv)
                metric = 'wall' if key in ('ns', 'ns_per_getput') else 'cpu'
                print(f"{bench[:22] + ' ' + cond:34s} {metric:6s} {fmt(med(uv)):>8s} {fmt(med(mv)):>8s} {fmt(r,2):>6s} {fmt(lo,2)+'..'+fmt(hi,2):>13s}")
# ---- peers
arms = [('pb_ucx', 'UCX'), ('pb_grdma', 'grdma'), ('pb_lf', 'libfabric'), ('pb_mrc', 'mrc-C'), ('proj_mrc', 'mrc-Rust')]
names = ['hit/100', 'hit/10000', 'hit/100000', 'hit-seq/100', 'hit-seq/10000', 'hit-seq/100000', 'fill/100000', 'evict/100000/1000']
if any(k[0] == 'peers' for k in rows):
    for key, label in [('cpu', 'process CPU time'), ('ns', 'wall clock')]:
        print(f'\n## Q2/Q4 peers, counting registrar: ns per get+put ({label}), medians of rounds (hits after an untimed warm pass); best = fastest of UCX/grdma/libfabric')
        print(f"{'workload':18s}" + ''.join(f'{a[1]:>10s}' for a in arms) + f"{'best':>10s}{'C/best':>8s}{'Rust/best':>10s}{'C/UCX':>7s}")
        for n in names:
            v = {a: med(get('peers', a, 'count', n, key)) for a, _ in arms}
            peers = {a: v[a] for a in ('pb_ucx', 'pb_grdma', 'pb_lf') if v[a] == v[a]}
            best = min(peers, key=peers.get) if peers else None
            bl = dict(arms)[best] if best else '-'
            # per-round ratios against the best peer's same round
            rc = pr_ratio(get('peers', 'pb_mrc', 'count', n, key), get('peers', best, 'count', n, key))[0] if best else float('nan')
            rr = pr_ratio(get('peers', 'proj_mrc', 'count', n, key), get('peers', best, 'count', n, key))[0] if best else float('nan')
            cu = pr_ratio(get('peers', 'pb_mrc', 'count', n, key), get('peers', 'pb_ucx', 'count', n, key))[0]
            print(f'{n:18s}' + ''.join(f'{fmt(v[a]):>10s}' for a, _ in arms) + f'{bl:>10s}{fmt(rc,2):>8s}{fmt(rr,2):>10s}{fmt(cu,2):>7s}')
# ---- RSS per entry after the fill
if any(k[0] == 'peers' and k[4] == 'rss_per_entry' for k in rows):
    print('\n## RSS per entry after fill/100000 (bytes; the cache\'s own memory, regions untouched), medians')
    print('  ' + '  '.join(f"{l}={fmt(med(get('peers', a, 'count', 'fill/100000', 'rss_per_entry')), 0)}" for a, l in arms))
# ---- regcost + mt
if any(k[0] in ('mt', 'regcost') for k in rows):
    print('\n## registrar alone (reg+dereg of 256 KiB, no cache), us')
    for reg in ['uring', 'spin']:
        v = [med(get('regcost', a, reg, 'regcost', 'ns')) for a in ('pb_ucx', 'pb_grdma', 'pb_lf', 'pb_mrc')]
        print(f'  {reg}: ' + ' '.join(fmt(x / 1e3, 2) for x in v if x == x))
    for part, reg in [('mt', 'uring'), ('mt', 'spin'), ('mtne', 'spin')]:
        if not any(k[0] == part and k[2] == reg for k in rows): continue
        what = ('A misses on 64 x 256 KiB buffers (limit 32 entries: every miss evicts)' if part == 'mt'
                else 'A misses on fresh 8 KiB regions, no limit (misses without evictions)')
        print(f'\n## Q3 two threads, REG={reg}: {what}, B hits 8 x 64 KiB; medians of rounds')
        print(f"{'arm':10s} {'B alone Mhit/s':>14s} {'B p99 ns':>9s} | {'A alone kmiss/s':>15s} | {'A+B: A kmiss/s':>14s} {'B Mhit/s':>9s} {'B p50':>7s} {'B p99':>9s} {'B p99.9':>9s} {'B max us':>9s} {'B misses':>8s} {'B deregs':>8s} {'cpu':>5s}")
        for a, label in arms[:4]:
            g = lambda ph, k: med(get(part, a, reg, 'mt-' + ph, k))
            if not get(part, a, reg, 'mt-Balone', 'B_hit_per_s'): continue
            ab = get(part, a, reg, 'mt-AB', 'A_miss_per_s')
            if not ab:
                print(f"{label:10s} {fmt(g('Balone','B_hit_per_s')/1e6,2):>14s} {fmt(g('Balone','B_p99_ns')):>9s} | {fmt(g('Aalone','A_miss_per_s')/1e3,1):>15s} | A+B phase HUNG (deadlock), killed"); continue
            print(f"{label:10s} {fmt(g('Balone','B_hit_per_s')/1e6,2):>14s} {fmt(g('Balone','B_p99_ns')):>9s} | {fmt(g('Aalone','A_miss_per_s')/1e3,1):>15s} | "
                  f"{fmt(g('AB','A_miss_per_s')/1e3,1):>14s} {fmt(g('AB','B_hit_per_s')/1e6,2):>9s} {fmt(g('AB','B_p50_ns')):>7s} {fmt(g('AB','B_p99_ns')):>9s} {fmt(g('AB','B_p999_ns')):>9s} {fmt(g('AB','B_max_us')):>9s} {fmt(g('AB','B_misses'),0):>8s} {fmt(g('AB','B_deregs'),0):>8s} {fmt(g('AB','cpu_util'),2):>5s}")
    if hung:
        print('\n' + '\n'.join(hung))

# ---- JSON (--json FILE): the run as docs/data/peers.json holds it (`mrcache figures --import FILE`)
def run_json(path):
    import json
    meta = {}
    for line in open(raw):
        f = line.split()
        if f and f[0] in ('commit', 'machine', 'settings'):
            meta[f[0]] = line.split(None, 1)[1].strip() if len(f) > 1 else ''
    load, start, end = [], '', ''
    for l in loads:
        f = l.split()
        one = float(f[1])
        if 'start' in f:
            start = f[f.index('start') + 1]; load.append({'when': 'at the start', 'one_minute': one})
        elif 'end' in f:
            end = f[f.index('end') + 1]; load.append({'when': 'at the end', 'one_minute': one})
        else:
            load.append({'when': ' '.join(f[4:]).replace('mt round', 'two-thread round'), 'one_minute': one})
    peer_arms = [('pb_ucx', 'UCX'), ('pb_grdma', 'grdma'), ('pb_lf', 'libfabric')]
    mrc_arms = [('pb_mrc', 'C'), ('proj_mrc', 'Rust')]
    def row(id, group, label, unit, better, target, series, scale=1.0):
        """series(arm) -> per-round values; the best peer is the best median."""
        sig = lambda x: float(f'{x:.4g}')   # four significant digits, as the tables print them
        peers = {n: med(series(a)) / scale for a, n in peer_arms if series(a)}
        r = {'id': id, 'group': group, 'label': label, 'unit': unit, 'better': better}
        if target is not None: r['target'] = target
        if peers:
            best = (min if better == 'lower' else max)(peers, key=peers.get)
            r['best_peer'] = best
            best_arm = dict((n, a) for a, n in peer_arms)[best]
        r['peers'] = {n: sig(v) for n, v in sorted(peers.items())}
        r['mrcache'] = {}
        for a, n in mrc_arms:
            v = series(a)
            if not v: continue
            arm = {'value': sig(med(v) / scale)}
            if peers and target is not None:
                arm['ratio'] = round(pr_ratio(v, series(best_arm))[0], 3)
            r['mrcache'][n] = arm
        return r
    rows = []
    for part, reg, group in [('mt', 'uring', 'two threads, io_uring'), ('mt', 'spin', 'two threads, busy-wait'),
                             ('mtne', 'spin', 'two threads, no eviction')]:
        if not any(k[0] == part and k[2] == reg for k in rows_all()): continue
        t = 1.0 if part == 'mt' else None
        p = f'{part}/{reg}'
        rows.append(row(f'{p}/B-hits', group, "B's hits with A running", 'M hits/s', 'higher', t,
                        lambda a: get(part, a, reg, 'mt-AB', 'B_hit_per_s'), 1e6))
        if part == 'mt':
            rows.append(row(f'{p}/B-p99', group, "B's p99 with A running", 'ns', 'lower', t,
                            lambda a: get(part, a, reg, 'mt-AB', 'B_p99_ns')))
        rows.append(row(f'{p}/A-misses', group, "A's misses with B running", 'k misses/s', 'higher', t,
                        lambda a: get(part, a, reg, 'mt-AB', 'A_miss_per_s'), 1e3))
    labels = {'hit/100': 'hit, 100 buffers, random', 'hit/10000': 'hit, 10⁴ buffers, random',
              'hit/100000': 'hit, 10⁵ buffers, random', 'hit-seq/100': 'hit, 100 buffers, in order',
              'hit-seq/10000': 'hit, 10⁴ buffers, in order', 'hit-seq/100000': 'hit, 10⁵ buffers, in order',
              'fill/100000': 'fill to 10⁵, per miss', 'evict/100000/1000': 'miss + evict, limit 1,000'}
    for n in names:
        if any(k[0] == 'peers' and k[3] == n for k in rows_all()):
            rows.append(row(n, 'one thread', labels[n], 'ns', 'lower', 1.0, lambda a: get('peers', a, 'count', n, 'cpu')))
    if any(k[0] == 'peers' and k[4] == 'rss_per_entry' for k in rows_all()):
        rows.append(row('fill/100000/rss', 'one thread', 'memory per entry after the fill', 'B', 'lower', None,
                        lambda a: get('peers', a, 'count', 'fill/100000', 'rss_per_entry')))
    out = {'mrcache_bench': 'peers', 'version': 1, 'start': start, 'end': end, 'commit': meta.get('commit', ''),
           'machine': meta.get('machine', ''), 'load': load,
           'settings': dict(kv.split('=', 1) for kv in meta.get('settings', '').split() if '=' in kv),
           'notes': hung, 'rows': rows}
    with open(path, 'w') as f:
        json.dump(out, f, indent=2, ensure_ascii=False)
        f.write('\n')
    print(f'\nwrote {path}')

def rows_all(): return rows.keys()
if '--json' in sys.argv:
    run_json(sys.argv[sys.argv.index('--json') + 1])
