#!/usr/bin/env bash
# Prints the path of the test executable NAME of the mrcache crate, as the
# workspace's `cargo test` built it (builds it if it is not up to date).
#   bash ci/test-binary.sh concurrent
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test -q --workspace --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
name=sys.argv[1]
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") \
       and m["target"]["src_path"].endswith("/impl/tests/%s.rs" % name): print(m["executable"])' "$1" \
  | grep . || { echo "ci/test-binary.sh: no test executable $1" >&2; exit 1; }
