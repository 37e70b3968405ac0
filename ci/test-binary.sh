#!/usr/bin/env bash
# Prints the path of the executable built from SOURCE (a test, an example or
# a binary, e.g. impl/tests/concurrent.rs or src/main.rs) as the workspace's
# `cargo test` (ci/test.sh) builds it: the same features, so nothing is rebuilt if it is up to date
# (`-p mrcache` alone would resolve other features and rebuild).
#   bash ci/test-binary.sh impl/tests/concurrent.rs
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD/${1:?usage: ci/test-binary.sh SOURCE}
cargo test -q --workspace --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    # A binary (src/main.rs) also has a unit-test harness: print the binary itself.
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["src_path"]==sys.argv[1] \
        and not ("bin" in m["target"]["kind"] and m["profile"]["test"]): print(m["executable"])' "$src" \
  | grep . || { echo "ci/test-binary.sh: no executable built from $1" >&2; exit 1; }
