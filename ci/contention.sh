#!/usr/bin/env bash
# Runs one command repeatedly while the cores are oversubscribed, and counts
# the runs that fail. A concurrency test that passes only on a quiet machine
# is not evidence (docs/checking.md, "Contention").
#
#   bash ci/contention.sh [--runs N] [--seconds S] [--jobs J] [--cpu C]
#                         [--load none|spin|build|both] [--name NAME] -- CMD ARGS...
#
# The pressure:
#   --jobs J  J copies of the command at a time (default 3 x nproc), copy j
#             pinned to CPU j mod nproc (or all to CPU C with --cpu C; --cpu
#             all pins nothing), so
#             each CPU runs several of the test's own thread sets at once:
#             every thread is preempted by the others at arbitrary
#             instructions, for whole scheduler slices. This is what provoked
#             the logged failures: the old P2 oracle of
#             four_threads_with_limits failed 0 times in 273 runs beside a
#             build with nothing pinned, and about 1 run in 130 pinned (see
#             docs/checking.md, "Contention").
#   --load    extra load, started before the first run and stopped on exit:
#             spin   two busy shell loops per CPU (pinned like the jobs);
#             build  a parallel `cargo build` (-j 2 x nproc) of the project in
#                    a scratch target directory, cleaned and rebuilt in a
#                    loop: bursty load with fork/exec, page faults and I/O;
#             both   the two; none (default) the jobs alone.
# It stops after N runs in all or S seconds, whichever comes first (each job
# runs at least once). Each failing run's output is kept in
# target/contention/NAME-fail-*.log. Prints one summary line:
# "contention NAME: R runs, F failures, T s, J jobs, load L"
# and exits non-zero if any run failed.
set -euo pipefail
cd "$(dirname "$0")/.."
ncpu=$(nproc)
runs=1000000 seconds=1200 jobs=$((3 * ncpu)) load=none name="" cpu=""
while (($#)); do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --cpu) cpu=$2; shift 2 ;;
    --load) load=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "ci/contention.sh: unknown option $1 (usage: see the header)" >&2; exit 2 ;;
  esac
done
(($#)) || { echo "ci/contention.sh: no command given (usage: see the header)" >&2; exit 2; }
((jobs >= 1)) || { echo "ci/contention.sh: --jobs must be at least 1" >&2; exit 2; }
[ -n "$name" ] || name=$(basename "$1")
out=target/contention
mkdir -p "$out"
rm -f "$out/$name".job-* "$out/$name"-fail-*.log
cpu_of() {
  case $cpu in
    "") echo $(($1 % ncpu)) ;;
    all) echo "0-$((ncpu - 1))" ;;
    *) echo "$cpu" ;;
  esac
}
pids=()
stop_all() {
  for p in "${pids[@]}"; do kill -- "-$p" 2>/dev/null || kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop_all EXIT
if [[ $load == spin || $load == both ]]; then
  for i in $(seq 0 $((2 * ncpu - 1))); do
    setsid taskset -c "$(cpu_of "$i")" bash -c 'while :; do :; done' &
    pids+=($!)
  done
fi
if [[ $load == build || $load == both ]]; then
  setsid bash -c "while :; do cargo build -q --release -p mrcache -j $((2 * ncpu)) --target-dir $out/build-load >/dev/null 2>&1; rm -rf $out/build-load/release/.fingerprint; done" &
  pids+=($!)
fi
start=$SECONDS
# One job: runs the command until its share of the runs or the time is used.
job() {
  local j=$1 share=$2 n=0 failed=0 c
  shift 2
  c=$(cpu_of "$j")
  while ((n < share)) && { ((n == 0)) || ((SECONDS - start < seconds)); }; do
    n=$((n + 1))
    if ! taskset -c "$c" "$@" >"$out/$name.job-$j.log" 2>&1; then
      failed=$((failed + 1))
      cp "$out/$name.job-$j.log" "$out/$name-fail-$j-$failed.log"
      echo "contention $name: job $j run $n FAILED (log: $out/$name-fail-$j-$failed.log)" >&2
      grep -m3 -E "panicked|FAILED|violation|stale|leak|^HANG:|^ABORT:" "$out/$name.job-$j.log" >&2 || true
    fi
    echo "$n $failed" >"$out/$name.job-$j.count"
  done
}
share=$(((runs + jobs - 1) / jobs))
jpids=()
for j in $(seq 0 $((jobs - 1))); do
  job_cmd=("$@")
  (job "$j" "$share" "${job_cmd[@]}") &
  jpids+=($!)
done
# Progress every minute.
last=$SECONDS
while sleep 2; do
  alive=0
  for p in "${jpids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
  ((alive)) || break
  ((SECONDS - last >= 60)) || continue
  last=$SECONDS
  cat "$out/$name".job-*.count 2>/dev/null \
    | awk -v name="$name" -v t=$((SECONDS - start)) '{n+=$1; f+=$2} END {printf "contention %s: %d runs, %d failures, %d s\n", name, n, f, t}' >&2
done
for p in "${jpids[@]}"; do wait "$p" || true; done
read -r total failed < <(cat "$out/$name".job-*.count 2>/dev/null | awk '{n+=$1; f+=$2} END {print n+0, f+0}')
echo "contention $name: $total runs, $failed failures, $((SECONDS - start)) s, $jobs jobs, load $load"
((failed == 0))
