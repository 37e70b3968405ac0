#!/bin/bash
# run.sh: mrcache beside UCX, Open MPI grdma and libfabric on identical workloads, in one run. Builds (build.sh), then
#   part "peers": pb (UCX, grdma, libfabric, mrcache C API) + the project's Rust arm (Rust API)
#       on hit/N random + in order (N = 100, 1e4, 1e5), fill/1e5, evict/1e5/1000
#   part "mt": 2-thread workload (thread A: misses on 256 KiB buffers, B: hits on a hot set)
#       with REG=uring (real io_uring long-term pins) and REG=spin (30 us busy-wait)
# Rounds are interleaved (the order of arms rotates every round); summarize.py prints medians and writes
# $OUT/peers.json (date, commit, machine, load, every figure); `mrcache figures --import $OUT/peers.json` makes it
# the latest run of docs/performance.md and the README.
#   from the project root: ROUNDS=3 PARTS="peers mt" bash bench/peers/run.sh
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
proj=${PROJ:-$(git rev-parse --show-toplevel)}
W=${OUTDIR:-$proj/target/peers}; B=$W/bin
ROUNDS=${ROUNDS:-3}; MT_ROUNDS=${MT_ROUNDS:-2}
PARTS=${PARTS:-"peers mt"}
# The one-thread rows run pinned to CPU $PIN (every arm alike; PIN= pins nothing). Unpinned, single runs of
# "evict 100000 1000" swung by up to a third for every cache (rounds of 345, 247 and 329 ns for one arm, one of
# 334 ns in six for libfabric's), with the scheduler moving the process between the two cores; pinned and
# interleaved they stayed within a few per cent. The two-thread part is never pinned (it needs both cores).
PIN=${PIN-1}
pin=(); [ -n "$PIN" ] && pin=(taskset -c "$PIN")
HITS=${HITS:-2000000}; EVICTS=${EVICTS:-300000}; MT_SECS=${MT_SECS:-2}
OUT=${OUT:-$W/results}; mkdir -p "$OUT"; raw=$OUT/raw.txt; : > "$raw"
[ "${SKIP_BUILD:-0}" = 1 ] || bash "$here/build.sh" >&2 || exit 1
load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "load $(load) start $(date -u +%FT%TZ) nproc $(nproc) pin ${PIN:-none}" >> "$raw"
# What summarize.py --json records beside the figures (docs/data/peers.json).
echo "commit $(git -C "$proj" rev-parse HEAD)$(git -C "$proj" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')" >> "$raw"
echo "machine $(nproc) CPUs, $(uname -sr)$(. /etc/os-release 2>/dev/null && echo ", $PRETTY_NAME")" >> "$raw"
echo "settings ROUNDS=$ROUNDS MT_ROUNDS=$MT_ROUNDS PIN=${PIN:-none} HITS=$HITS EVICTS=$EVICTS MT_SECS=$MT_SECS PARTS=${PARTS// /,}" >> "$raw"
# rec PART ARM COND cmd...: run, tag every result line
rec() { local part=$1 arm=$2 cond=$3; shift 3
  "$@" 2>>"$OUT/stderr.txt" | grep -v '^#' | sed "s|^|$part $arm $cond |" >> "$raw"; }
rotate() { local r=$1; shift; local a=("$@") n=$#; for ((i=0;i<n;i++)); do echo "${a[$(( (i + r) % n ))]}"; done; }

for round in $(seq "$ROUNDS"); do
  echo "round $round/$ROUNDS load $(load)" >&2
  if [[ " $PARTS " == *" peers "* ]]; then
    for w in "hit 100 $HITS" "hit 10000 $HITS" "hit 100000 $HITS" "hit 100 $HITS seq" "hit 10000 $HITS seq" "hit 100000 $HITS seq" \
             "fill 100000" "evict 100000 1000 $EVICTS"; do
      for arm in $(rotate $round pb_ucx pb_grdma pb_lf pb_mrc proj_mrc); do
        ww=$w
        # grdma's hits cost O(N) (its interval tree degenerates on in-order inserts): fewer iterations at N >= 1e4
        if [ $arm = pb_grdma ] && [[ "$w" == hit\ 1000* ]]; then ww=$(sed "s/ $HITS/ 20000/" <<<"$w"); fi
        # shellcheck disable=SC2086
        rec peers $arm count "${pin[@]}" timeout 300 "$B/$arm" $ww
      done
    done
    echo "load $(load) after peers round $round" >> "$raw"
  fi
done
if [[ " $PARTS " == *" mt "* ]]; then
  for round in $(seq "$MT_ROUNDS"); do
    echo "mt round $round/$MT_ROUNDS load $(load)" >&2
    for reg in uring spin; do
      for arm in $(rotate $round pb_ucx pb_grdma pb_lf pb_mrc); do
        REG=$reg rec regcost $arm $reg "$B/$arm" regcost 20000
        REG=$reg SPIN_NS=30000 rec mt $arm $reg timeout -s KILL $((MT_SECS * 3 + 20)) "$B/$arm" mt "$MT_SECS"; [ $arm = pb_grdma ] && ! grep -q "^mt pb_grdma $reg mt-AB" "$raw" && echo "mt pb_grdma $reg mt-AB HUNG (killed after $((MT_SECS * 3 + 20)) s)" >> "$raw"
      done
    done
    # A misses without evicting (fresh regions, no limit; spin: nothing pinned)
    for arm in $(rotate $round pb_ucx pb_grdma pb_lf pb_mrc); do
      REG=spin SPIN_NS=30000 rec mtne $arm spin timeout -s KILL $((MT_SECS * 3 + 20)) "$B/$arm" mt-noevict "$MT_SECS"; [ $arm = pb_grdma ] && ! grep -q "^mtne pb_grdma spin mt-AB" "$raw" && echo "mtne pb_grdma spin mt-AB HUNG (killed after $((MT_SECS * 3 + 20)) s)" >> "$raw"
    done
    echo "load $(load) after mt round $round" >> "$raw"
  done
fi
echo "load $(load) end $(date -u +%FT%TZ)" >> "$raw"
# summary.txt for reading; peers.json for `mrcache figures --import` (docs/performance.md, the README's table).
python3 "$here/summarize.py" "$raw" --json "$OUT/peers.json" | tee "$OUT/summary.txt"
