#!/usr/bin/env bash
# Installs the system packages mrcache needs (Debian). Idempotent and quiet.
#   libibverbs-dev librdmacm-dev libclang-dev clang pkg-config: the verbs registrar (rdma-sys, bindgen)
#   chromium: the explorer's headless browser test
#   openmpi-bin libopenmpi-dev: `mrcache record` (the PMPI recorder is built against mpi.h; tests/record.rs runs mpirun),
#     and the Open MPI grdma conformance adapter (conformance/adapters/ompi.c)
#   libucx-dev: the UCX ucs_rcache conformance adapter (conformance/adapters/ucx.c) and bench/ucx/run.sh's UCX arm
#   valgrind: ci/c-tests.sh runs the C examples and C tests of libmrcache under it
#   libjemalloc2 libmimalloc2.0: the conformance cases that run their adapter under
#     another allocator (header `preload`: alloc-jemalloc, alloc-mimalloc)
#   autoconf automake libtool flex libhwloc-dev libevent-dev libpmix-dev: conformance/upstream/build.sh
#     (the peers' current releases from source; Open MPI 5's opal against Debian's hwloc, libevent and PMIx)
set -euo pipefail
pkgs=(libibverbs-dev librdmacm-dev libclang-dev clang pkg-config chromium openmpi-bin libopenmpi-dev libucx-dev valgrind
  libjemalloc2 libmimalloc2.0 autoconf automake libtool flex libhwloc-dev libevent-dev libpmix-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "ci/setup.sh: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
