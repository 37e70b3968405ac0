#!/usr/bin/env bash
# The main job: set up, replay the shipped traces through the model and
# through the real cache (io_uring pinning, userfaultfd monitor, judged op by
# op), run the replay report (quick), then model-check the concurrent algorithm on a representative
# configuration and show a mutant being caught.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
cargo build --release -q
mrcache=./target/release/mrcache
echo "== replay through the model: hand-written scenarios, then recorded MPI programs (rank 0)"
$mrcache replay traces/*.jsonl
$mrcache replay traces/real/*/rank-0.jsonl.gz
echo "== replay through the cache: io_uring registrar, userfaultfd monitor, every outcome judged by the model"
$mrcache replay --engine impl --registrar uring --monitor uffd traces/*.jsonl >/dev/null && echo "all traces agree with the model"
echo "== replay report, quick (first 20,000 records per run): overlap policies x thresholds x byte limits x eviction, the cache checked against the model, io_uring cost, charts"
echo "   (the full report of docs/replay-report.md: $mrcache report --plot DIR traces/real/*/rank-0.jsonl.gz, ~15 s)"
$mrcache report --quick --plot target/report-quick traces/real/*/rank-0.jsonl.gz
echo "== model check: 2 threads x 4 ops, merge policy, userfaultfd-like monitor"
$mrcache check --threads 2 --ops 4 --policy merge --monitor async
echo "== the same check finds the register-vs-invalidate race of a broken variant"
if $mrcache check --mutant no-seq-recheck --trace-out target/no-seq-recheck.jsonl >target/no-seq-recheck.txt; then
  echo "mutant not caught" >&2; exit 1
fi
tail -n 4 target/no-seq-recheck.txt
