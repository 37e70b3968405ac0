#!/usr/bin/env bash
# bench/ucx/run.sh: mrcache beside UCX's ucs_rcache (Debian libucx-dev), the
# same workloads on the same address sequences, in one run: every workload
# runs on both sides in turn (which side goes first alternates by round), for
# ROUNDS rounds (default 5); summarize.py prints medians and mrcache/UCX ratios
# (of process CPU time per operation; wall-clock ratios beside them)
# and exits non-zero when a target (bench/ucx/README.md) is missed.
#
#   bash bench/ucx/run.sh                 # full run (a few minutes)
#   QUICK=1 ROUNDS=1 bash bench/ucx/run.sh  # smaller iteration counts, a smoke test
#   ONLY="hit fill" bash bench/ucx/run.sh   # only the workloads whose name starts so
#
# Without libucx-dev the UCX arm is skipped (with a message), mrcache's
# figures are printed alone and no target is checked. Results (raw lines) go
# to $OUT (default target/ucx-bench).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
ROUNDS=${ROUNDS:-5}
OUT=${OUT:-$root/target/ucx-bench}
mkdir -p "$OUT"
rm -f "$OUT"/ucx.txt "$OUT"/mrc.txt

# Iteration counts: the issue's (QUICK=1 divides them for a smoke test).
# Each may be set in the environment (e.g. EVICTS=200000 for a shorter run).
if [ "${QUICK:-0}" = 1 ]; then d=(500000 50000 20000 200); else d=(5000000 1000000 100000 1000); fi
HITS=${HITS:-${d[0]}} EVICTS=${EVICTS:-${d[1]}} FILL=${FILL:-${d[2]}} UNMAPS=${UNMAPS:-${d[3]}}

(cd "$root" && cargo build --release --quiet -p mrcache --example ucx_side)
mrc="$root/target/release/examples/ucx_side"

ucx=""
if [ -e /usr/include/ucs/memory/rcache.h ] && gcc -O2 -Wall -Wextra -o "$OUT/ucx_arm" "$here/ucx_arm.c" -lucs -lucm -lpthread 2>"$OUT/ucx_arm.build.log"; then
  ucx="$OUT/ucx_arm"
else
  echo "bench/ucx: UCX arm SKIPPED: libucx-dev is not installed (or ucx_arm.c did not build, see $OUT/ucx_arm.build.log)." >&2
  echo "bench/ucx: install it with 'apt-get install libucx-dev' (ci/setup.sh does). Printing mrcache's figures alone; no ratios, no targets." >&2
fi

# One workload line: its arguments, run on both sides. The uffd monitor row
# runs on mrcache only (it is compared with UCX's own munmap hook).
workloads=(
  "hit64k $HITS"
  "hit 1 $HITS"
  "hit 100 $HITS"
  "hit 10000 $HITS"
  "hit 100000 $HITS"
  "hit 100000 $HITS seq"
  "fill 1000"
  "fill $FILL"
  "evict 100000 1000 $EVICTS"
  "hit2t 10000 $((HITS / 2))"
  "overlap 10000 $HITS"
  "unmap 10000 $UNMAPS"
  "unmap-uffd 10000 $UNMAPS"
)

selected() {
  [ -z "${ONLY:-}" ] && return 0
  local p
  for p in $ONLY; do [[ "$1" == "$p"* ]] && return 0; done
  return 1
}

run_side() { # side args...
  local side=$1; shift
  if [ "$side" = ucx ]; then
    [ -n "$ucx" ] || return 0
    [ "$1" = unmap-uffd ] && return 0
    # Its own process: libucs patches mmap/munmap for everything it shares a process with.
    "$ucx" "$@" >>"$OUT/ucx.txt"
  else
    "$mrc" "$@" >>"$OUT/mrc.txt"
  fi
}

echo "bench/ucx: $ROUNDS rounds on $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at start" >&2
for round in $(seq "$ROUNDS"); do
  echo "bench/ucx: round $round/$ROUNDS" >&2
  for w in "${workloads[@]}"; do
    # shellcheck disable=SC2086
    selected $w || continue
    if ((round % 2)); then run_side ucx $w; run_side mrc $w; else run_side mrc $w; run_side ucx $w; fi
  done
done
echo "bench/ucx: load average $(cut -d' ' -f1-3 /proc/loadavg) at end" >&2
python3 "$here/summarize.py" "$OUT" ${ucx:+--check}
