#!/usr/bin/env bash
# The swarm on a real Slurm (ci/full.sh step `slurm`; docs/checking.md, "A
# swarm on a cluster"): a one-node Slurm on this machine, as root: the
# Debian packages slurm-wlm and munge, a slurm.conf this script writes, and
# munged, slurmctld and slurmd started here and stopped at the end by the
# PIDs they write. Then `mrcache swarm submit --slurm --wait` runs a job
# array, two configurations x two seed ranges: the correct algorithm at
# 2 threads x 3 ops, and the mutant lease-count-saturates at 3 x 4, which no
# exhaustively checked configuration catches. `mrcache swarm collect` must
# report every task, and the mutant caught by the seed recorded for it.
#
#   bash ci/slurm-swarm.sh [MRCACHE_BINARY]
#
# Needs root and a machine where no other Slurm runs (it writes
# /etc/slurm/slurm.conf and, if absent, /etc/munge/munge.key).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "ci/slurm-swarm.sh: needs root (it starts a one-node Slurm)" >&2; exit 2; }
bin=${1:-}
if [ -z "$bin" ]; then
  cargo build --release -q --bin mrcache
  bin=$PWD/target/release/mrcache
fi
bin=$(realpath "$bin")
export DEBIAN_FRONTEND=noninteractive
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  log=$(mktemp)
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends slurm-wlm munge; } >"$log" 2>&1 \
    || { tail -20 "$log"; echo "ci/slurm-swarm.sh: cannot install slurm-wlm and munge" >&2; exit 1; }
  rm -f "$log"
fi
work=$(mktemp -d /tmp/mrcache-slurm.XXXXXX)
chmod 755 "$work"
host=$(hostname -s)
cpus=$(nproc)
mem=$(( $(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 - 1024 ))
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=mrcache-ci
SlurmctldHost=$host
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SlurmUser=root
SlurmdUser=root
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
ReturnToService=2
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
if [ ! -f /etc/munge/munge.key ]; then
  mkdir -p /etc/munge
  dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
  chown munge:munge /etc/munge/munge.key
  chmod 400 /etc/munge/munge.key
fi
mkdir -p /run/munge && chown munge:munge /run/munge
pids=()
stop() {
  # Only what this script started, by the PIDs the daemons wrote; wait
  # (10 s at most) until they have gone.
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for _ in $(seq 100); do
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && { sleep 0.1; continue 2; }; done
    break
  done
  rm -rf "$work"
}
# The PID a daemon wrote into FILE (5 s at most).
pid_of() {
  for _ in $(seq 50); do [ -s "$1" ] && { cat "$1"; return; }; sleep 0.1; done
  echo "ci/slurm-swarm.sh: no PID in $1" >&2
  return 1
}
trap stop EXIT
# A munged already running (the machine's) is used, and left running.
if ! { [ -s /run/munge/munged.pid ] && kill -0 "$(cat /run/munge/munged.pid)" 2>/dev/null; }; then
  rm -f /run/munge/munged.pid
  runuser -u munge -- /usr/sbin/munged 2>/dev/null || /usr/sbin/munged --force
  pids+=("$(pid_of /run/munge/munged.pid)")
fi
slurmctld
pids+=("$(pid_of "$work/slurmctld.pid")")
slurmd
pids+=("$(pid_of "$work/slurmd.pid")")
for i in $(seq 60); do
  sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)' && break
  [ "$i" = 60 ] && { echo "ci/slurm-swarm.sh: the node did not come up" >&2; sinfo || true; tail -20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log; exit 1; }
  sleep 1
done
sinfo
job=$work/job
set +e
timeout 900 "$bin" swarm submit --slurm --wait --dir "$job" --tasks 2 --searches-per-task 20 \
  --config "--threads 2 --ops 3" --config "--threads 3 --ops 4 --mutant lease-count-saturates" \
  -- --max-states 50000 --timeout 600
rc=$?
"$bin" swarm collect "$job" --trace-out "$work/counterexample.jsonl" | tee "$work/collect.txt"
collected=${PIPESTATUS[0]}
set -e
echo "submit exited $rc, collect exited $collected"
fail() { echo "ci/slurm-swarm.sh: $*" >&2; tail -5 "$job"/task-*.out >&2 || true; exit 1; }
[ "$collected" = 1 ] || fail "collect should report the mutant (exit 1), got $collected"
grep -q '4 of 4 tasks reported' "$work/collect.txt" || fail "not every task reported"
grep -q 'VIOLATED always: P3 .*task 3, seed 25 ' "$work/collect.txt" || fail "the mutant was not caught by seed 25 in task 3"
[ "$(grep -c VIOLATED "$work/collect.txt")" = 1 ] || fail "a violation in the correct configuration"
"$bin" check --threads 3 --ops 4 --mutant lease-count-saturates --swarm --seed 25 --searches 1 --max-states 50000 >/dev/null \
  && fail "seed 25 does not replay the counterexample"
test -s "$work/counterexample.jsonl" || fail "no counterexample trace"
echo "ci/slurm-swarm.sh: the job array ran on Slurm; seed 25 caught lease-count-saturates"
