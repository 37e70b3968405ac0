#!/usr/bin/env bash
# The large model check, outside .ci/run: 3 threads x 3 ops, every policy,
# both monitors, on the fingerprint engine (checker/src/engine.rs) with a
# worker per core (WORKERS to change it). Each line: the configuration, its
# unique states, the time and peak RSS, and the bytes per unique state.
# Figures per configuration are in docs/checking.md.
set -euo pipefail
cd "$(dirname "$0")/.."
# MRCACHE_BIN runs another build of the CLI instead (a baseline).
if [ -z "${MRCACHE_BIN:-}" ]; then
  cargo build --release -q -p mrcache-cli
fi
bin=${MRCACHE_BIN:-${CARGO_TARGET_DIR:-target}/release/mrcache}
workers=${WORKERS:-$(nproc)}
start=$SECONDS
for policy in independent merge no-merge-uncache-contained; do
  for monitor in sync async; do
    echo "== 3 threads x 3 ops, $policy, $monitor, $workers worker(s)"
    log=$(mktemp)
    /usr/bin/time -o "$log.time" -f "%e s, %M KiB" \
      "$bin" check --threads 3 --ops 3 --policy "$policy" --monitor "$monitor" --workers "$workers" | tee "$log"
    unique=$(sed -n 's/^explored: \([0-9]*\) unique.*/\1/p' "$log")
    kib=$(sed -n 's/.*, \([0-9]*\) KiB/\1/p' "$log.time")
    echo "$(cat "$log.time"), $((kib * 1024 / (unique > 0 ? unique : 1))) bytes per state"
    rm -f "$log" "$log.time"
  done
done
echo "== all six in $((SECONDS - start)) s"
