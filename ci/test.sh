#!/usr/bin/env bash
# The test command of the README; .ci/run runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
# Tests run with the optimised [profile.test] (model checks live in them).
cargo test --workspace --no-fail-fast
# The verbs registrar builds and its device-free tests run.
cargo test -p mrcache --features verbs --lib registrar::verbs
