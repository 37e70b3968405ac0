#!/usr/bin/env bash
# The test command of the README; .ci/run runs exactly this. The fast tier,
# for every submission (docs/checking.md, "Two tiers"); what it leaves out
# runs in `bash ci/full.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
start=$SECONDS
step() { echo "== ci/test.sh: $* ($((SECONDS - start)) s)"; }
# The production artefacts, built once, each alone: cargo merges features
# across a workspace build, so the rlib a library user links must be built
# with `-p mrcache` alone (no test kit, no fault switch) and the C library
# with `-p mrcache-capi` alone (ci/install.sh). Both in target/capi-install,
# where ci/install.sh builds (they share their dependencies there).
# tests/production.rs and capi/tests/production.rs check these very files;
# MRCACHE_REQUIRE_ARTEFACTS makes them fail, not skip, without them.
step "production builds"
prod=$PWD/target/capi-install
prefix=$PWD/target/ci-prefix
rm -rf "$prefix"
CARGO_TARGET_DIR=$prod cargo build --release --quiet -p mrcache
bash ci/install.sh "$prefix"
export MRCACHE_PRODUCTION_RLIB=$prod/release/libmrcache.rlib MRCACHE_CAPI_LIB_DIR=$prefix/lib MRCACHE_REQUIRE_ARTEFACTS=1
# Tests run with the optimised [profile.test] (model checks live in them).
# The citation check on the real tree is skipped here: it runs once, below,
# as the tool (tools/citations), which prints its counts.
# Tests marked #[ignore = "full tier: ci/full.sh"] run in ci/full.sh.
# Built first, then run under the watchdog: a test that hangs fails the tier
# with every thread's wait and stack (ci/watchdog.sh) instead of stalling it
# until CI's own limit. The deadline is for the runs alone (about 5 minutes
# on a quiet 2-core machine, 15 beside other work); MRCACHE_TEST_DEADLINE
# overrides it.
step "cargo test --workspace (build)"
cargo test --workspace --no-run -q
step "cargo test --workspace"
bash ci/watchdog.sh --timeout "${MRCACHE_TEST_DEADLINE:-2400}" --name "cargo test --workspace" -- \
  cargo test --workspace --no-fail-fast -- --skip citations_are_verbatim_known_and_complete
# The README's commands (ci/readme-commands.py): the blocks marked `run` run
# as written; the others are parsed and each `mrcache` line given `--help`.
step "README commands"
python3 ci/readme-commands.py "$(bash ci/test-binary.sh src/main.rs)"
# The spec citation check: quotes verbatim, every numbered item cited, every
# §A step tagged in the checker and the cache.
step "citations"
cargo run -q -p mrcache-citations
# Formatting: the house style of rustfmt.toml, checked.
step "cargo fmt"
cargo fmt --all -- --check
# Lints: every target, warnings are errors (impl/ also denies unsafe code
# without a SAFETY comment, Cargo.toml [lints]).
step "clippy"
cargo clippy -q --workspace --all-targets -- -D warnings
# Every crate's docs: no broken, ambiguous or private links.
step "cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc -q --workspace --no-deps
# Contention smoke (docs/checking.md; ci/full.sh runs it longer, and the long runs are
# `bash ci/stress.sh contention`): the unmodified concurrent test, one copy
# per CPU beside two busy loops on each (where the old P2 oracle failed 3
# runs in 386), for CONTENTION_SECONDS (default 20).
step "contention smoke"
concurrent=$(bash ci/test-binary.sh impl/tests/concurrent.rs)
MRCACHE_CONTENTION=1 bash ci/contention.sh --jobs "$(nproc)" --load spin --seconds "${CONTENTION_SECONDS:-20}" --name smoke -- \
  "$concurrent" --exact four_threads_with_limits
# The C API's lease slab (capi/tests/slab_contention.rs) the same way, for
# SLAB_CONTENTION_SECONDS (default 10).
slab=$(bash ci/test-binary.sh capi/tests/slab_contention.rs)
bash ci/contention.sh --jobs "$(nproc)" --load spin --seconds "${SLAB_CONTENTION_SECONDS:-10}" --name slab-smoke -- "$slab"
# The C library: the installed prefix above, the C examples and tests built
# out of tree with pkg-config and run natively (under valgrind in ci/full.sh).
step "C tests"
MRCACHE_PREFIX=$prefix bash ci/c-tests.sh --native
step "green"
