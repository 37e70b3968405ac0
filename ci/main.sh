#!/usr/bin/env bash
# The main job: set up, then replay every shipped trace through the model
# (and model-check the concurrent algorithm once the checker is built in).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
cargo build --release -q
./target/release/mrcache replay traces/*.jsonl
