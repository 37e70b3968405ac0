#!/usr/bin/env bash
# bench/ucx/ab.sh: compares builds of one side of the UCX bench on one
# workload, interleaved round by round, and prints each binary's median, min
# and max of the per-operation CPU time. For design experiments on a noisy
# machine, where one run of each proves nothing: keep a copy of
# target/release/examples/ucx_side per variant (and target/ucx-bench/ucx_arm
# for UCX), then
#
#   bash bench/ucx/ab.sh 12 "hit 10000 3000000" /tmp/variant-a /tmp/variant-b target/ucx-bench/ucx_arm
#
# Arguments: ROUNDS, the workload's arguments (as bench/ucx/run.sh passes
# them), then the binaries. The figure taken is the last `cpu=` of a run (for
# `overlap`, the hit phase).
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 ROUNDS \"WORKLOAD ARGS\" BINARY..." >&2
  exit 2
fi
rounds=$1 args=$2
shift 2
for bin in "$@"; do
  [ -x "$bin" ] || { echo "bench/ucx/ab.sh: $bin is not an executable" >&2; exit 2; }
done
for _ in $(seq "$rounds"); do
  for bin in "$@"; do
    # shellcheck disable=SC2086 # the workload's arguments split on purpose
    v=$("$bin" $args | grep -o 'cpu=[0-9.]*' | tail -1 | cut -d= -f2)
    [ -n "$v" ] || { echo "bench/ucx/ab.sh: $bin $args printed no cpu= figure" >&2; exit 1; }
    echo "$bin $v"
  done
done | python3 -c '
import statistics, sys
runs = {}
for line in sys.stdin:
    name, value = line.split()
    runs.setdefault(name, []).append(float(value))
for name, v in runs.items():
    print(f"{name:48s} median {statistics.median(v):9.1f}  min {min(v):9.1f}  max {max(v):9.1f}  ({len(v)} runs, cpu ns/op)")
'
