#!/usr/bin/env bash
# The long runs of the stale-DMA oracle and the fuzzer (not part of .ci/run).
#
#   bash ci/stress.sh              # 1,000,000 DMA-checked acquires (uffd), then
#                                  # 1,000,000 (explicit monitor, merge), the
#                                  # S7.4 windows, 100x the concurrent histories
#                                  # of .ci/run, then 120 s of `mrcache fuzz`
#   OPS=200000 FUZZ_SECONDS=30 bash ci/stress.sh   # shorter
#   SEED=7 bash ci/stress.sh
#
# Each DMA run: 2 threads acquire (io_uring registrar, real pins) and DMA a
# fresh pattern through every lease, checking the mapping sees it and, as
# root, that the pinned PFNs are the mapped ones; 2 threads churn the same
# memory (munmap+mmap, madvise DONTNEED, mremap move/shrink, mmap MAP_FIXED)
# about once per 4 acquires. It fails unless 0 stale DMAs, 0 PFN mismatches,
# and at least 1 acquire in 10 hit memory churned since its last grant.
#
# What it measured, run by run, with dates: docs/checking.md (generated from
# docs/data/oracle.json; about 15 minutes on 2 vCPUs after the builds).
# Needs io_uring and userfaultfd (root, or vm.unprivileged_userfaultfd=1 and
# a memlock limit of a few MiB); layers that cannot run are skipped with a
# message.
#
# Contention mode (docs/checking.md): every concurrent test binary, unmodified, run
# again and again while the cores are oversubscribed (ci/contention.sh: one
# copy pinned to each CPU beside two busy loops pinned there):
#
#   bash ci/stress.sh contention
#   LIMITS_RUNS=4000 FUZZ_DMA_SECONDS=1200 BOX=1200 bash ci/stress.sh contention
#
# - `concurrent four_threads_with_limits`: LIMITS_RUNS runs (default 4000:
#   30/p for p = 3/386, the old oracle's failure rate measured in this mode);
# - `mrcache fuzz --layers dma` for FUZZ_DMA_SECONDS (default 1200: about
#   1,100 DMA runs here) beside a looping parallel build and the busy loops;
#   the old harness failed 81 of 858, so 30/p = 318, and the issue asks for
#   at least 500;
# - the S7.4(b) race: RACE_ROUNDS (default 20000) rounds of each
#   madvise variant per CPU, and the same with the fault switch (its teeth);
# - concurrent, linearizability, lanes, dma_oracle, faults, reentrant: each
#   for BOX seconds (default 1200), run counts reported.
# MRCACHE_CONTENTION=1 is set for them: rate and time assertions (the teeth
# rates, churn ratios, must-finish deadlines) are measured on a quiet
# machine; under contention the tests check the safety properties, and a
# hang is still a failure (deadlines x10). four_threads_with_limits ran at
# 0.45-1.3 runs/s on the 2-vCPU machine (less with builds beside): the
# default takes 1-2.5 h for it, 2 h for the six 20-minute boxes, 20 min for
# the fuzz. The overnight target, LIMITS_RUNS=10000 BOX=3600, takes up to
# about 12 h.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ${1:-} == contention ]]; then
  LIMITS_RUNS=${LIMITS_RUNS:-4000} FUZZ_DMA_SECONDS=${FUZZ_DMA_SECONDS:-1200} BOX=${BOX:-1200}
  SEED=${SEED:-2026}
  export MRCACHE_CONTENTION=1
  cargo build -q --release
  # The test binaries, built once (the load rebuilds elsewhere).
  bins=$(cargo test -q --release -p mrcache --features faults --no-run --message-format=json \
    --test concurrent --test linearizability --test lanes --test dma_oracle --test faults --test reentrant 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable"): print(m["target"]["name"], m["executable"])')
  bin() { awk -v n="$1" '$1==n {print $2}' <<<"$bins"; }
  status=0
  cont=(bash ci/contention.sh --jobs "$(nproc)" --load spin)
  "${cont[@]}" --runs "$LIMITS_RUNS" --seconds 36000 --name four_threads_with_limits -- \
    "$(bin concurrent)" --exact four_threads_with_limits || status=1
  # The fuzz unpinned (its own threads spread over the CPUs) beside a parallel
  # build and the busy loops. Its JSON summary goes to a file of its own (the
  # job log mixes in stderr).
  bash ci/contention.sh --runs 1 --jobs 1 --cpu all --load both --name fuzz-dma -- \
    sh -c "./target/release/mrcache fuzz --layers dma --seconds $FUZZ_DMA_SECONDS --seed $SEED --json --quiet > target/contention/fuzz-dma.json" || status=1
  python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); d=s["dma"]
print("contention fuzz-dma: %d DMA runs, %d violations, %d stale DMAs, %d acquires" % (d["cases"], d["violations"], s["stale_dmas"], d["ops"]))' \
    target/contention/fuzz-dma.json || status=1
  # S7.4(b): every madvise variant, RACE_ROUNDS rounds each, one
  # copy per CPU beside the busy loops: 0 stale after madvise returned; then
  # the teeth (the fault switch remove-without-window) in the same mode.
  # S7.6: two caches on one monitor, fresh, and their teeth (one cache deaf).
  for t in s7_4_b_every_advice_and_wider_pins_are_fresh s7_4_b_without_the_remove_window_is_stale \
    s7_6_two_caches_on_one_monitor_are_fresh s7_6_an_event_applied_to_one_cache_only_is_stale; do
    MRCACHE_RACE_ROUNDS=${RACE_ROUNDS:-20000} "${cont[@]}" --runs "$(nproc)" --seconds 36000 --name "$t" -- \
      "$(bin dma_oracle)" --exact "$t" --nocapture || status=1
  done
  for t in concurrent linearizability lanes dma_oracle faults reentrant shared_monitor; do
    "${cont[@]}" --seconds "$BOX" --name "$t" -- "$(bin "$t")" || status=1
  done
  exit $status
fi
OPS=${OPS:-1000000}
SEED=${SEED:-2026}
FUZZ_SECONDS=${FUZZ_SECONDS:-120}

run_dma() {
  local monitor=$1 policy=$2 register_churn=$3
  local t0=$SECONDS
  echo "== stale-DMA oracle: $OPS acquires, monitor $monitor, policy $policy, releases inside register ${register_churn}/1000, seed $SEED" >&2
  MRCACHE_STRESS_OPS=$OPS MRCACHE_STRESS_SEED=$SEED MRCACHE_STRESS_MONITOR=$monitor \
  MRCACHE_STRESS_POLICY=$policy MRCACHE_STRESS_REGISTER_CHURN=$register_churn \
    cargo test -q -p mrcache --test dma_oracle -- --ignored --exact stress --nocapture 2>&1 \
    | grep -E "^(stress|FIGURES)|panicked|skipped|test result"
  echo "== done in $((SECONDS - t0)) s" >&2
}

cargo build -q --release
run_dma uffd independent 0
run_dma explicit merge 100
echo "== the userfaultfd windows of spec.md#S7.4, ${RACE_ROUNDS:=50000} rounds each" >&2
MRCACHE_RACE_ROUNDS=$RACE_ROUNDS cargo test -q -p mrcache --test dma_oracle -- --exact s7_4_windows_measured --nocapture 2>&1 \
  | grep -E "^S7.4|panicked|skipped|test result"
echo "== concurrent histories, ${LIN_SCALE:=100}x the .ci/run counts (linearizability against the model)" >&2
t0=$SECONDS
MRCACHE_LIN_HISTORIES=$LIN_SCALE cargo test -q -p mrcache --features faults --test linearizability 2>&1 \
  | grep -E "histories|panicked|test result"
echo "== done in $((SECONDS - t0)) s" >&2
echo "== mrcache fuzz --seconds $FUZZ_SECONDS --seed $SEED" >&2
./target/release/mrcache fuzz --seconds "$FUZZ_SECONDS" --seed "$SEED" --quiet
