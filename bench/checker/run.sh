#!/usr/bin/env bash
# Checker throughput against a baseline build, like for like: the same
# configurations, one worker each, both binaries in the same run, their
# runs interleaved (so load from other work falls on both alike).
#
#   bash bench/checker/run.sh            # baseline: 3f03647, the CLI before the fingerprint engine
#   BASE=<commit> RUNS=9 bash bench/checker/run.sh
#   BASE_BIN=<a built mrcache> bash bench/checker/run.sh
#
# For each configuration (2 threads x 3 and x 4 ops, every policy and
# monitor, and 2 x 5 independent sync): the unique states (which must be
# equal: the same model, the same states), then per binary the median of
# RUNS of the check's own time (the line `explored: N unique states ...,
# T, complete` both print) as states per second, and the ratio. Last, the
# geometric mean of the ratios. `cargo bench -p mrcache-checker` compares
# the two engines of one build instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
base=${BASE:-3f03647}
runs=${RUNS:-7}
if [ -z "${BASE_BIN:-}" ]; then
  dir=target/bench-base/$base
  if [ ! -x "$dir/target/release/mrcache" ]; then
    echo "== building the baseline $base in $dir (once)"
    rm -rf "$dir/src" && mkdir -p "$dir/src"
    git archive "$base" | tar -x -C "$dir/src"
    (cd "$dir/src" && CARGO_TARGET_DIR=../target cargo build --release -q -p mrcache-cli)
  fi
  BASE_BIN=$dir/target/release/mrcache
fi
cargo build --release -q -p mrcache-cli
new=${CARGO_TARGET_DIR:-target}/release/mrcache
echo "== baseline $BASE_BIN, new $new ($(git rev-parse --short HEAD)), $runs runs each, load $(cut -d' ' -f1-3 /proc/loadavg)"
# One run: prints "<unique states> <seconds>" from the check's own report.
one() {
  "$@" 2>/dev/null | sed -n 's/^explored: \([0-9]*\) unique states.*, \([0-9.]*\)\(m\?s\), complete$/\1 \2 \3/p' |
    awk '{ s = ($3 == "ms") ? $2 / 1000 : $2; printf "%s %.6f\n", $1, s }'
}
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
printf '%-44s %9s %12s %12s %6s\n' configuration states baseline/s new/s ratio
logsum=0
n=0
while read -r threads ops policy monitor; do
  b_times=() n_times=()
  b_states='' n_states=''
  for _ in $(seq "$runs"); do
    read -r b_states t < <(one "$BASE_BIN" check --threads "$threads" --ops "$ops" --policy "$policy" --monitor "$monitor" --workers 1)
    b_times+=("$t")
    read -r n_states t < <(one "$new" check --threads "$threads" --ops "$ops" --policy "$policy" --monitor "$monitor" --workers 1)
    n_times+=("$t")
  done
  if [ -z "$b_states" ] || [ "$b_states" != "$n_states" ]; then
    echo "error: $threads x $ops $policy $monitor: the baseline explored '$b_states' states, the new build '$n_states' (a run failed or the model changed)" >&2
    exit 1
  fi
  bt=$(printf '%s\n' "${b_times[@]}" | median)
  nt=$(printf '%s\n' "${n_times[@]}" | median)
  read -r brate nrate ratio < <(awk -v s="$n_states" -v b="$bt" -v n="$nt" 'BEGIN { printf "%.0f %.0f %.2f\n", s / b, s / n, b / n }')
  printf '%-44s %9s %12s %12s %5sx\n' "$threads x $ops $policy $monitor" "$n_states" "$brate" "$nrate" "$ratio"
  logsum=$(awk -v a="$logsum" -v r="$ratio" 'BEGIN { printf "%.6f", a + log(r) }')
  n=$((n + 1))
done <<'CONFIGS'
2 3 independent sync
2 3 independent async
2 3 merge sync
2 3 merge async
2 3 no-merge-uncache-contained sync
2 3 no-merge-uncache-contained async
2 4 independent sync
2 4 independent async
2 4 merge sync
2 4 merge async
2 4 no-merge-uncache-contained sync
2 4 no-merge-uncache-contained async
2 5 independent sync
CONFIGS
awk -v a="$logsum" -v n="$n" 'BEGIN { printf "== geometric mean of the ratios: %.2fx over %d configurations\n", exp(a / n), n }'
echo "== load $(cut -d' ' -f1-3 /proc/loadavg)"
