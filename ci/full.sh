#!/usr/bin/env bash
# The full tier (docs/checking.md, "Two tiers"): ci/test.sh first, then
# everything that is not in it. Run it before changing the concurrent core,
# the C API, the peers or the conformance suite, and before a release.
#
#   bash ci/full.sh                 # ci/test.sh, then every step below
#   bash ci/full.sh --no-fast       # every step below (ci/test.sh just passed)
#   bash ci/full.sh STEP...         # the steps named, e.g. `loom valgrind`
#
# Steps (in this order; the last takes about a quarter of an hour):
#   fast         bash ci/test.sh
#   verbs        the verbs registrar builds (feature `verbs`) and its
#                device-free tests run
#   loom         loom: the lease handoff, the invalidation queue, the
#                sequence retry, the hit counters' slots (impl/tests/loom.rs);
#                the C API's lease slab, cache ids and thread buckets, and
#                their mutants (capi/src/slab/models.rs)
#   valgrind     ci/c-tests.sh: the C examples and tests natively and under
#                valgrind (memory errors and leaks fail)
#   upstream     conformance/upstream/build.sh: the peers' current releases
#                (libfabric 2.6.0, UCX 1.22.0, Open MPI 5.0.10's opal) from
#                ../shared/peers/upstream into target/upstream/ (cached by a
#                stamp; the first build took about 30 minutes on 2 cores at
#                load 12-18: Open MPI 18 min, libfabric 4, UCX 5),
#                for the two steps below
#   ignored      the tests marked #[ignore = "full tier: ci/full.sh"]:
#                tests/record.rs (mpirun under `mrcache record`),
#                tests/explorer_browser.rs (headless Chromium),
#                tests/conformance_peers.rs (UCX, Open MPI, libfabric, Debian's
#                and the current releases, against CONFORMANCE.md's verdict
#                table)
#   reproducers  conformance/reproducers/run.sh: each peer safety failure as a
#                standalone program fails on its peer, its libmrcache twin
#                passes, against Debian's peers and the current releases (a
#                missing peer is skipped with a message)
#   stale_dma    a real stale DMA without a monitor, made correct by uffd
#   contention   the contention runs of ci/test.sh for CONTENTION_SECONDS
#                each (default 120; ci/test.sh: 20 and 10) beside busy loops:
#                impl/tests/concurrent.rs and the lease slab's
#                capi/tests/slab_contention.rs (the hours long runs:
#                `bash ci/stress.sh contention`)
#   hangs        the monitor hang tests (capi/tests/c/hang/, each run under
#                ci/watchdog.sh, which prints every thread's wait on a hang):
#                ci/hang-tests.sh --runs 100 (every scenario 100 times),
#                then heap_traffic 1,000 times, then hang_stress under
#                ci/contention.sh for HANG_STRESS_SECONDS (default 600: at
#                least 10 minutes, 3 x nproc copies at once beside busy loops,
#                each copy 20 s of stress under a watchdog)
#   slurm        ci/slurm-swarm.sh: a one-node Slurm on this machine (it
#                installs slurm-wlm and munge), a swarm job array through it
#                (`mrcache swarm submit --slurm`, `mrcache swarm collect`)
#                that must catch mutant lease-count-saturates by its seed
#   threes       every pinned family at 3 threads (checker/src/pinned.rs,
#                pinned3_configs): `mrcache check --pinned --threads3`, each
#                configuration in a child process on a worker per core, its
#                unique states (pinned), time and peak RSS; every property
#                holds, every goal of the 2-thread family is reached (the
#                figures: docs/checking.md). The same checks as the ignored
#                test every_family_at_three_threads (checker/tests/threads3.rs),
#                which the ignored step leaves to this one
#   large        ci/check-large.sh: the 3 threads x 3 ops model checks (about
#                4 minutes on the 2 cores when quiet)
# Every step runs; a summary lists each with its time, and the exit status is
# non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
all=(fast verbs loom valgrind upstream ignored reproducers stale_dma contention hangs slurm threes large)
case ${1:-} in
  "") steps=("${all[@]}") ;;
  --no-fast) steps=("${all[@]:1}") ;;
  *) steps=("$@") ;;
esac

step_fast() { bash ci/test.sh; }
step_verbs() { cargo test -p mrcache --features verbs --lib registrar::verbs; }
step_loom() {
  RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom \
    cargo test -q --profile test -p mrcache --test loom || return 1
  # Only the slab's models: the C API's other unit tests use loom atomics
  # outside a model under `--cfg loom`.
  RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom \
    cargo test -q --profile test -p mrcache-capi --lib slab::models
}
step_valgrind() { bash ci/c-tests.sh; }
# Every test marked #[ignore = "full tier: ci/full.sh"], found in the
# sources. `--workspace --tests`: the features of ci/test.sh's build, which is
# reused (selecting a few test targets would resolve other features and
# rebuild everything).
step_ignored() {
  local names
  # every_family_at_three_threads: the threes step runs the same checks
  # (with each configuration's time and RSS); not twice.
  names=$(grep -rh -A1 --include='*.rs' '#\[ignore = "full tier: ci/full.sh"\]' tests impl capi checker model types src \
    | sed -n 's/^ *fn \([a-z0-9_]*\).*/\1/p' | grep -vx every_family_at_three_threads)
  [ -n "$names" ] || { echo "ci/full.sh: no full-tier test found" >&2; return 1; }
  echo "full-tier tests:" $names
  # shellcheck disable=SC2086
  cargo test --workspace --tests --no-fail-fast -- --ignored --exact $names
}
step_upstream() { bash conformance/upstream/build.sh; }
step_reproducers() { bash conformance/reproducers/run.sh; }
step_stale_dma() {
  local exe
  exe=$(bash ci/test-binary.sh impl/examples/stale_dma.rs) || return 1
  "$exe"
}
step_contention() {
  local concurrent slab
  concurrent=$(bash ci/test-binary.sh impl/tests/concurrent.rs) || return 1
  MRCACHE_CONTENTION=1 bash ci/contention.sh --jobs "$(nproc)" --load spin --seconds "${CONTENTION_SECONDS:-120}" \
    --name full -- "$concurrent" --exact four_threads_with_limits || return 1
  slab=$(bash ci/test-binary.sh capi/tests/slab_contention.rs) || return 1
  bash ci/contention.sh --jobs "$(nproc)" --load spin --seconds "${CONTENTION_SECONDS:-120}" --name slab -- "$slab"
}
# The hang tests: one installed library for the three parts; hang_stress's
# binary is built by ci/hang-tests.sh's first part into HANG_BIN_DIR.
step_hangs() {
  local prefix bin rc=0
  prefix=$(mktemp -d)
  bin=$(mktemp -d)
  bash ci/install.sh "$prefix" || { rm -rf "$prefix" "$bin"; return 1; }
  MRCACHE_PREFIX=$prefix HANG_BIN_DIR=$bin bash ci/hang-tests.sh --runs 100 --seconds 0 || rc=1
  MRCACHE_PREFIX=$prefix HANG_BIN_DIR=$bin bash ci/hang-tests.sh --only heap_traffic --runs 1000 --all-runs || rc=1
  MRCACHE_REQUIRE_UFFD=1 bash ci/contention.sh --jobs $((3 * $(nproc))) --load spin \
    --seconds "${HANG_STRESS_SECONDS:-600}" --name hang_stress \
    -- bash ci/watchdog.sh --timeout 120 --name hang_stress -- "$bin/hang_stress" 20 || rc=1
  rm -rf "$prefix" "$bin"
  return $rc
}
step_slurm() { bash ci/slurm-swarm.sh; }
step_threes() {
  cargo build --release -q -p mrcache-cli || return 1
  "${CARGO_TARGET_DIR:-target}/release/mrcache" check --pinned --threads3 --workers "${WORKERS:-$(nproc)}"
}
step_large() { bash ci/check-large.sh; }

for s in "${steps[@]}"; do
  declare -F "step_$s" >/dev/null || { echo "ci/full.sh: unknown step $s (steps: ${all[*]})" >&2; exit 2; }
done
bash ci/setup.sh
summary=()
failed=0
start=$SECONDS
for s in "${steps[@]}"; do
  echo "== ci/full.sh: $s"
  t0=$SECONDS
  if "step_$s"; then
    summary+=("$(printf '%-12s passed in %d s' "$s" $((SECONDS - t0)))")
  else
    failed=1
    summary+=("$(printf '%-12s FAILED after %d s' "$s" $((SECONDS - t0)))")
  fi
done
echo "== ci/full.sh: summary ($((SECONDS - start)) s)"
printf '   %s\n' "${summary[@]}"
exit $failed
