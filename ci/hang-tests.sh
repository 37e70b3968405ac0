#!/usr/bin/env bash
# The monitor hang tests (capi/tests/c/hang/): each scenario a C program a
# user could write, built *outside the tree* with pkg-config against an
# installed libmrcache (as ci/c-tests.sh does), each run under
# ci/watchdog.sh, which turns a hang into a failure that says where every
# thread waits (and an abort into one that names the signal).
#
#   bash ci/hang-tests.sh [--runs N] [--seconds S] [--timeout T] [--only LIST] [--all-runs]
#
#   --runs N      runs of every scenario (default 3)
#   --seconds S   hang_stress runs once for S seconds (default 5; 0: not run)
#   --timeout T   the watchdog's deadline for one run (default 30 s;
#                 hang_stress: S + 60)
#   --only LIST   only these scenarios (comma-separated names, hang_stress
#                 included); e.g. --only heap_traffic --runs 1000
#   --all-runs    go on with a scenario after its first failed run (default:
#                 its remaining runs are skipped: a hang costs the timeout)
# MRCACHE_PREFIX=DIR: the library installed there by ci/install.sh; else
# one is installed to a temporary prefix. MRCACHE_REQUIRE_UFFD=1 (the
# default here): a scenario that cannot start the userfaultfd monitor fails
# instead of skipping (exit 77). HANG_LOG_DIR (default target/hang-tests):
# the output of every failed run is kept there.
#
# Prints a summary line per scenario: runs, passes, hangs (the watchdog's, or
# a fork child killed by its alarm), aborts (a signal), other failures (a
# check, e.g. a release that took longer than its limit), skips; exits
# non-zero if any run failed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=3 seconds=5 timeout=30 only="" all_runs=0
while (($#)); do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --all-runs) all_runs=1; shift ;;
    *) echo "ci/hang-tests.sh: unknown option $1 (usage: see the header)" >&2; exit 2 ;;
  esac
done
scenarios=(heap_traffic callback_unmaps callback_other_cache fork_during_create raw_children many_fds_fork
  cancel_in_reg sysv_shm callback_escapes callback_throws)
export MRCACHE_REQUIRE_UFFD=${MRCACHE_REQUIRE_UFFD:-1}
logs=${HANG_LOG_DIR:-$root/target/hang-tests}
mkdir -p "$logs"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -n "${MRCACHE_PREFIX:-}" ]; then
  prefix=$(cd "$MRCACHE_PREFIX" && pwd)
else
  prefix=$work/prefix
  bash "$root/ci/install.sh" "$prefix"
fi
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
mkdir "$work/src"
cp "$root"/capi/tests/c/hang/*.c "$root"/capi/tests/c/hang/*.cc "$root"/capi/tests/c/hang/*.h "$work/src/"
cd "$work/src"
bin=${HANG_BIN_DIR:-$work/src}
mkdir -p "$bin"
bin=$(cd "$bin" && pwd)
cflags=(-std=c11 -D_DEFAULT_SOURCE -Wall -Wextra -Werror -g)
for t in "${scenarios[@]}" hang_stress; do
  if [ -f "$t.cc" ]; then # a C++ program using the C API (callbacks that throw)
    c++ -std=c++17 -Wall -Wextra -Werror -g "$t.cc" $(pkg-config --cflags --libs mrcache) -lpthread \
      "-Wl,-rpath,$prefix/lib" -o "$bin/$t"
  else
    cc "${cflags[@]}" "$t.c" $(pkg-config --cflags --libs mrcache) -lpthread "-Wl,-rpath,$prefix/lib" -o "$bin/$t"
  fi
done

selected() { [ -z "$only" ] || [[ ",$only," == *",$1,"* ]]; }
summary=()
failed=0
# run_scenario NAME RUNS TIMEOUT ARGS...
run_scenario() {
  local name=$1 n=$2 limit=$3 i rc log pass=0 hang=0 abort=0 fail=0 skip=0 done_runs=0
  shift 3
  for ((i = 1; i <= n; i++)); do
    log=$work/$name.log
    done_runs=$i
    set +e
    bash "$root/ci/watchdog.sh" --timeout "$limit" --name "$name" -- "$bin/$name" "$@" >"$log" 2>&1
    rc=$?
    set -e
    case $rc in
      0) pass=$((pass + 1)); continue ;;
      77) skip=$((skip + 1)); continue ;;
      124) hang=$((hang + 1)) ;;
      *)
        if ((rc > 128)); then
          abort=$((abort + 1))
        elif grep -q "HUNG: killed by its alarm" "$log"; then
          hang=$((hang + 1)) # a fork child hung (its alarm killed it)
        else
          fail=$((fail + 1))
        fi ;;
    esac
    cp "$log" "$logs/$name-run$i.log"
    echo "hang-tests: $name run $i FAILED (exit $rc; log: $logs/$name-run$i.log)" >&2
    grep -E "^(HANG|ABORT):|FAILED|expected|took|HUNG|FATAL" "$log" | head -5 | sed 's/^/    /' >&2 || true
    if ((!all_runs)); then break; fi
  done
  summary+=("$(printf '%-22s %5d runs %5d passed %3d hangs %3d aborts %3d failed %3d skipped%s' "$name" "$done_runs" \
    "$pass" "$hang" "$abort" "$fail" "$skip" "$( ((done_runs < n)) && echo " (stopped at the first failure of $n)")")")
  if ((hang + abort + fail)); then failed=1; fi
}

start=$SECONDS
for t in "${scenarios[@]}"; do
  selected "$t" || continue
  echo "== hang-tests: $t x $runs"
  run_scenario "$t" "$runs" "$timeout"
done
if ((seconds > 0)) && selected hang_stress; then
  echo "== hang-tests: hang_stress for $seconds s"
  run_scenario hang_stress 1 $((seconds + 60)) "$seconds"
fi
echo "== hang-tests: summary ($((SECONDS - start)) s; library: $prefix)"
printf '   %s\n' "${summary[@]}"
exit $failed
