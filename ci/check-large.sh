#!/usr/bin/env bash
# The large model check, outside .ci/run: 3 threads x 3 ops, every policy,
# both monitors. The first (independent, sync) took about 270 s and
# 10,536,469 states on one worker of this 2-core machine (2026-12-02);
# the whole script takes well over an hour.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
for policy in independent merge no-merge-uncache-contained; do
  for monitor in sync async; do
    echo "== 3 threads x 3 ops, $policy, $monitor"
    /usr/bin/time -f "%e s, %M KiB" ./target/release/mrcache check --threads 3 --ops 3 --policy "$policy" --monitor "$monitor"
  done
done
