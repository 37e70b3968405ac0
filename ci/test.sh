#!/usr/bin/env bash
# The test command of the README; .ci/run runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
# Tests run with the optimised [profile.test] (model checks live in them).
cargo test --workspace --no-fail-fast
# The spec citation check again, to show its count of exceptions.
cargo test -q -p mrcache-checker --test step_ids -- --nocapture citations_are
# Lints: every target, warnings are errors (impl/ also denies unsafe code
# without a SAFETY comment, Cargo.toml [lints]).
cargo clippy -q --workspace --all-targets -- -D warnings
# The verbs registrar builds and its device-free tests run.
cargo test -p mrcache --features verbs --lib registrar::verbs
# loom: the lease handoff, the invalidation queue and the sequence retry.
RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom \
  cargo test -q --profile test -p mrcache --test loom
# A real stale DMA without a monitor, and the same sequence made correct by uffd.
cargo run -q --profile test -p mrcache --example stale_dma
