#!/usr/bin/env bash
# Re-records the real MPI traces shipped in traces/real/ (see traces/README.md).
#
#   bash ci/record-traces.sh                 # all of them
#   bash ci/record-traces.sh lammps hpcc     # some: lammps hpcc mpi4py-fft mpi4py-fft-mmap128k netpipe
#   AB=3 bash ci/record-traces.sh lammps     # measure only: 3 plain/recorded pairs, traces not kept
#
# Each program runs at 2 ranks with Debian's Open MPI 4.1.4 (ob1/vader). Runtimes
# of the recorded runs on the 2-vCPU machine of traces/README.md, which other
# jobs shared: LAMMPS peptide 2000 steps 12-40 s, hpcc N=4000 15-60 s,
# mpi4py-fft 128^3 x200 20-50 s (each of two runs), NetPIPE 10-20 s. Total
# with the installs and the build: about 5 minutes on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

bash ci/setup.sh
# The programs: big packages, only needed here (not by the tests).
progs=(lammps lammps-examples hpcc python3-mpi4py-fft netpipe-openmpi)
missing=()
for p in "${progs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "ci/record-traces.sh: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cargo build --release -q
mrcache=$root/target/release/mrcache
work=$(mktemp -d /tmp/mrcache-record.XXXXXX)
trap 'rm -rf "$work"' EXIT
ver() { echo "$1 $(dpkg-query -W -f='${Version}' "$1")"; }
mpirun=(mpirun --allow-run-as-root --oversubscribe -np 2)
AB=${AB:-0}

# record NAME PROGRAM PACKAGE DESCRIPTION [MPIRUN_OPTIONS...] -- COMMAND...
record() {
  local name=$1 program=$2 package=$3 desc=$4; shift 4
  local opts=()
  while [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  echo "== $name: ${mpirun[*]} ${opts[*]} $*" >&2
  if ((AB == 0)); then
    local t0=$SECONDS
    "$mrcache" record -o "$root/traces/real/$name" --gzip --timeout 600 --program "$program" \
      --program-version "$(ver "$package")" --description "$desc" -- "${mpirun[@]}" "${opts[@]}" "$@"
    echo "== $name: recorded in $((SECONDS - t0)) s" >&2
  else
    for i in $(seq "$AB"); do
      local a b
      a=$(date +%s.%N); "${mpirun[@]}" "${opts[@]}" "$@" >/dev/null 2>&1; b=$(date +%s.%N)
      local plain; plain=$(awk "BEGIN { printf \"%.1f\", $b - $a }")
      # The job's own time, as mrcache record reports it (not its validation of the traces afterwards).
      local rec; rec=$("$mrcache" record -o "$work/ab" --timeout 600 -- "${mpirun[@]}" "${opts[@]}" "$@" 2>/dev/null |
        sed -n 's/^mrcache record: .* after \([0-9.]*\) s; traces in .*/\1/p')
      local self; self=$(cat "$work"/ab/rank-*.stats.json | sed 's/.*"recorder_ns":\([0-9]*\),"recorded_ns":\([0-9]*\).*/\1 \2/' |
        awk '{ printf "%.2f%% ", 100 * $1 / $2 }')
      echo "== $name: pair $i: plain $plain s, recorded $rec s, recorder self time per rank $self, load $(cut -d' ' -f1 /proc/loadavg)" >&2
    done
  fi
}

selected=("$@")
pick() {
  ((${#selected[@]} == 0)) && return 0
  for w in "${selected[@]}"; do [ "$w" = "$1" ] && return 0; done
  return 1
}

if pick lammps; then
  mkdir -p "$work/lammps" && cd "$work/lammps"
  cp /usr/share/lammps/examples/peptide/data.peptide .
  sed 's/^run.*/run 2000/' /usr/share/lammps/examples/peptide/in.peptide > in.peptide
  record lammps-peptide lammps lammps \
    "LAMMPS examples/peptide with run 2000: 2000 MD steps of a solvated 5-mer peptide, PPPM electrostatics" \
    -- lmp -in in.peptide -log none -screen none
  cd "$root"
fi

if pick hpcc; then
  mkdir -p "$work/hpcc" && cd "$work/hpcc"
  # The Debian example input, with N=4000 and a 1x2 process grid.
  sed -e 's/^1000 .*Ns/4000         Ns/' -e 's/^2 *Ps/1            Ps/' -e 's/^2 *Qs/2            Qs/' \
    /usr/share/doc/hpcc/examples/_hpccinf.txt > hpccinf.txt
  record hpcc-n4000 hpcc hpcc \
    "HPC Challenge, Debian's example hpccinf.txt with N=4000, NB=80, grid 1x2: HPL, PTRANS, DGEMM, STREAM, RandomAccess, FFT, latency/bandwidth" \
    -- hpcc
  grep -E "^(Success|HPL_Tflops)=" hpccoutf.txt >&2
  cd "$root"
fi

if pick mpi4py-fft; then
  cd "$work"
  record mpi4py-fft mpi4py-fft python3-mpi4py-fft \
    "ci/mpi4py_fft_3d.py: 200 forward+backward complex FFTs of a 128^3 grid (slab decomposition, Alltoallw of subarray types), new output arrays each step" \
    -- /usr/bin/python3 "$root/ci/mpi4py_fft_3d.py" 128 200
  cd "$root"
fi

if pick mpi4py-fft-mmap128k; then
  cd "$work"
  # glibc serves every allocation of 128 KiB or more with mmap (no dynamic threshold):
  # every free of such an array is an munmap. (The 128^3 grid keeps the arrays, 16 MiB
  # per rank, under glibc's 32 MiB cap of the dynamic threshold: with the default,
  # the first free raises the threshold and later arrays come from the heap.)
  record mpi4py-fft-mmap128k mpi4py-fft python3-mpi4py-fft \
    "ci/mpi4py_fft_3d.py as in mpi4py-fft, with glibc MALLOC_MMAP_THRESHOLD_=131072 (every free of 128 KiB or more is an munmap)" \
    -x MALLOC_MMAP_THRESHOLD_=131072 -- \
    /usr/bin/python3 "$root/ci/mpi4py_fft_3d.py" 128 200
  cd "$root"
fi

if pick netpipe; then
  cd "$work"
  # A size sweep up to 4 MiB, 20 repeats per size (the default repeats are
  # tens of thousands for small sizes: 1.2 GB of trace per rank).
  record netpipe NetPIPE netpipe-openmpi "NetPIPE ping-pong size sweep, 1 byte to 4 MiB, 20 repeats per size" \
    -- NPopenmpi -u 4194304 -n 20 -o "$work/np.out"
  cd "$root"
fi

((AB > 0)) || ls -l traces/real/*/ >&2
