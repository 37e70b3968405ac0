#!/usr/bin/env bash
# Runs one command under a deadline and says where it hangs.
#
#   bash ci/watchdog.sh [--timeout SECONDS] [--name NAME] [--gdb-procs N] -- CMD ARGS...
#
# CMD runs in a process group of its own. The watchdog waits until CMD and
# every process of its tree (its process group and its descendants, also
# those left behind when CMD exits) are gone, at most SECONDS (default 60).
#
#  - CMD and its tree finish in time: exits with CMD's status. If CMD was
#    killed by a signal (an abort, a segfault), it prints
#    "ABORT: NAME killed by SIGxxx (signal S)" and exits 128 + S.
#  - Not in time: for every process of the tree and every thread of each
#    it prints tid, comm, /proc/P/task/T/wchan, .../syscall and the kernel
#    stack (.../stack, root only), then the user stacks
#    (`gdb -batch -p PID -ex 'thread apply all bt'`, under a timeout of its
#    own, MRCACHE_WATCHDOG_GDB_TIMEOUT seconds, default 10: a thread blocked
#    uninterruptibly in the kernel, as a release waiting for a userfaultfd
#    reader is, never stops for the debugger, and the watchdog then says so;
#    at most N processes, default 6), then kills the tree (SIGKILL) and
#    prints one line
#      HANG: NAME after S s (P processes, T threads; waiting in: wchan xK, ...)
#    and exits 124.
# The diagnostics go to stderr. MRCACHE_WATCHDOG_NO_GDB=1 skips gdb.
set -uo pipefail
timeout_s=60 name="" gdb_procs=6 gdb_timeout=${MRCACHE_WATCHDOG_GDB_TIMEOUT:-10}
while (($#)); do
  case $1 in
    --timeout) timeout_s=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --gdb-procs) gdb_procs=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "ci/watchdog.sh: unknown option $1 (usage: see the header)" >&2; exit 2 ;;
  esac
done
(($#)) || { echo "ci/watchdog.sh: no command given (usage: see the header)" >&2; exit 2; }
[ -n "$name" ] || name=$(basename "$1")

# Job control: the background job gets a process group of its own (pgid = pid).
set -m
"$@" &
root=$!
set +m
pgid=$root
# Interrupted: take the tree along.
trap 'kill -KILL -- "-$pgid" 2>/dev/null; exit 130' INT TERM HUP

# pid ppid pgrp of every process.
proc_table() { ps -e -o pid=,ppid=,pgid=; }

# The tree: the process group, the root, and every descendant of any of them.
tree_pids() {
  local table
  table=$(proc_table)
  awk -v root="$root" -v pgid="$pgid" '
    { pid[NR] = $1; ppid[$1] = $2; grp[$1] = $3 }
    END {
      for (i = 1; i <= NR; i++) { p = pid[i]; if (p == root || grp[p] == pgid) in_tree[p] = 1 }
      changed = 1
      while (changed) {
        changed = 0
        for (i = 1; i <= NR; i++) { p = pid[i]; if (!(p in in_tree) && (ppid[p] in in_tree)) { in_tree[p] = 1; changed = 1 } }
      }
      for (p in in_tree) print p
    }' <<<"$table" | sort -n
}

root_status=""
reap_root() {
  if [ -z "$root_status" ] && ! kill -0 "$root" 2>/dev/null; then
    wait "$root"
    root_status=$?
  fi
  # A zombie answers kill -0: wait for it if it has exited.
  if [ -z "$root_status" ] && [ "$(sed 's/.*) //' "/proc/$root/stat" 2>/dev/null | awk '{print $1}')" = Z ]; then
    wait "$root"
    root_status=$?
  fi
}

start=$SECONDS
deadline=$((start + timeout_s))
while :; do
  reap_root
  # While the command lives, its tree is not done; after, poll the tree.
  if [ -n "$root_status" ] && [ -z "$(tree_pids)" ]; then break; fi
  if ((SECONDS >= deadline)); then break; fi
  sleep 0.1
done

if [ -n "$root_status" ] && [ -z "$(tree_pids)" ]; then
  if ((root_status > 128)); then
    sig=$((root_status - 128))
    echo "ABORT: $name killed by SIG$(kill -l "$sig" 2>/dev/null || echo "?") (signal $sig) after $((SECONDS - start)) s" >&2
  fi
  exit "$root_status"
fi

# Hung. Diagnose every process and thread, then kill the tree.
gdb_out=$(mktemp)
trap 'rm -f "$gdb_out"; kill -KILL -- "-$pgid" 2>/dev/null; exit 130' INT TERM HUP
pids=$(tree_pids)
elapsed=$((SECONDS - start))
{
  echo "==== watchdog: $name has not finished after $elapsed s${root_status:+ (the command exited $root_status, its tree lives on)}"
  nthreads=0 nprocs=0
  waits=""
  for p in $pids; do
    [ -d "/proc/$p" ] || continue
    nprocs=$((nprocs + 1))
    echo "---- process $p ($(cat "/proc/$p/comm" 2>/dev/null)): $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)"
    echo "     ppid/pgrp/state: $(awk '{print}' "/proc/$p/stat" 2>/dev/null | sed 's/.*) //' | awk '{print $2"/"$3"/"$1}')"
    for t in /proc/$p/task/*; do
      [ -d "$t" ] || continue
      tid=${t##*/}
      nthreads=$((nthreads + 1))
      wchan=$(cat "$t/wchan" 2>/dev/null)
      [ -n "$wchan" ] || wchan=-
      [ "$wchan" = 0 ] && wchan=running
      state=$(sed 's/.*) //' "$t/stat" 2>/dev/null | awk '{print $1}')
      sys=$(cat "$t/syscall" 2>/dev/null)
      echo "  thread $tid ($(cat "$t/comm" 2>/dev/null)) state $state wchan $wchan syscall ${sys:-?}"
      if [ -r "$t/stack" ]; then sed 's/^/      /' "$t/stack" 2>/dev/null; fi
      waits+="$wchan"$'\n'
    done
  done
  if [ "${MRCACHE_WATCHDOG_NO_GDB:-0}" != 1 ] && command -v gdb >/dev/null; then
    n=0
    for p in $pids; do
      [ -d "/proc/$p" ] || continue
      n=$((n + 1))
      if ((n > gdb_procs)); then
        echo "---- (user stacks of the other processes skipped: --gdb-procs $gdb_procs)"
        break
      fi
      echo "---- user stacks of process $p (gdb, at most $gdb_timeout s)"
      # In a subshell that waits (timeout kills itself with -k: no job message).
      gdb_rc=$( (timeout -k 2 "$gdb_timeout" gdb -batch -nx -p "$p" -ex 'set pagination off' \
        -ex 'thread apply all bt' >"$gdb_out" 2>&1; echo $?) 2>/dev/null)
      grep -v -E '^\[New LWP|^\[Thread debugging|^Using host libthread_db' "$gdb_out" | sed 's/^/  /'
      if ((gdb_rc == 124 || gdb_rc == 137)); then
        dstate=$(for t in /proc/$p/task/*; do
          [ "$(sed 's/.*) //' "$t/stat" 2>/dev/null | awk '{print $1}')" = D ] && echo -n "${t##*/} "; done)
        echo "  (gdb could not stop the process within $gdb_timeout s: threads ${dstate:-?}wait in the kernel"
        echo "   uninterruptibly (state D) and cannot stop for a debugger; their kernel stacks and"
        echo "   syscall lines (the last two numbers: user sp and pc) are above)"
      fi
    done
  fi
} >&2

# Kill the tree (again until it is gone: a fork in progress adds members).
for _ in 1 2 3 4 5 6 7 8 9 10; do
  left=$(tree_pids)
  [ -n "$left" ] || break
  kill -KILL -- "-$pgid" 2>/dev/null
  for p in $left; do kill -KILL "$p" 2>/dev/null; done
  sleep 0.2
  reap_root
done
reap_root
rm -f "$gdb_out"
summary=$(grep -v '^$' <<<"$waits" | sort | uniq -c | sort -rn | awk '{printf "%s%s x%d", (NR > 1 ? ", " : ""), $2, $1}')
echo "HANG: $name after $elapsed s ($nprocs processes, $nthreads threads; waiting in: $summary)" >&2
exit 124
