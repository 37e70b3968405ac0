#!/usr/bin/env bash
# Builds the peers' current releases from the source tarballs of
# ../shared/peers/upstream (UPSTREAM_SRC) into target/upstream/<peer>-<version>/
# (a prefix with include/ and lib/), only as much of each as its
# registration cache needs:
#   libfabric-2.6.0  the whole library with one provider (udp), static
#                    too: the MR cache (ofi_mr_cache_*) is not exported by
#                    libfabric.so, so the adapter links libfabric.a
#   ucx-1.22.0       src/ucm and src/ucs only (ucs_rcache and its hooks)
#   ompi-5.0.10      opal only (--disable-mpi, no PRRTE), against Debian's
#                    hwloc and libevent, with its bundled OpenPMIx (Debian's
#                    PMIx 4.2.2 passes configure's version check but opal's
#                    pmix_base_fns.c needs pmix_framework_names, which 4.2.2's
#                    pmix_frameworks.h lacks); rcache/grdma and the patcher
#                    memory hooks are built into libopen-pal
#                    (--disable-mca-dso) so no component is looked up at run
#                    time (not --disable-dlopen: without dlopen support the
#                    patcher cannot compile, grdma gets no memory hooks, and
#                    with no hooks it caches nothing)
#
#   conformance/upstream/build.sh [PEER...]   default: all three
#
# Runs of this script take turns (a lock on target/upstream/.lock).
# A peer is rebuilt only when its stamp (target/upstream/<peer>/.stamp: the
# tarball's sha256 and the recipe below) differs, so a second run is a no-op.
# Each build's output is in target/upstream/logs/<peer>.log. A peer that
# fails (or whose tarball is missing) is reported on stderr and in
# target/upstream/failed.txt; the others still build; the exit status is 1 if
# any failed. Builds run under `nice -n UPSTREAM_NICE` (15) with
# `make -j UPSTREAM_JOBS` (2): the machine is shared.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
src="${UPSTREAM_SRC:-$root/../shared/peers/upstream}"
out="$root/target/upstream"
jobs="${UPSTREAM_JOBS:-2}"
nice_n="${UPSTREAM_NICE:-15}"
mkdir -p "$out/logs" "$out/build"
all=(libfabric-2.6.0 ucx-1.22.0 ompi-5.0.10)
[ $# -gt 0 ] && all=("$@")

n() { nice -n "$nice_n" "$@"; }
mk() { n make -j"$jobs" "$@"; }

# Each recipe runs in the unpacked tree with $prefix set; its text is part of
# the stamp, so editing it rebuilds that peer.
recipe_libfabric() {
  n ./autogen.sh
  # --enable-only leaves out every provider but udp, the smallest: configure
  # stops when none is configured. -UNDEBUG keeps assert() on (configure's
  # release flags put -DNDEBUG first), as in the 1.17.0 build of
  # conformance/adapters/build.sh, so the two columns judge the same code.
  n ./configure --prefix="$prefix" CFLAGS="-O2 -g -UNDEBUG" --enable-only --enable-udp --enable-static --disable-shared \
    --disable-debug --without-cuda --without-rocr --without-ze --without-neuron \
    --without-synapseai --without-gdrcopy --disable-kdreg2
  mk
  mk install
  # The MR cache's declarations live in the private headers.
  mkdir -p "$prefix/src-include"
  cp -r include "$prefix/src-include/"
  cp config.h "$prefix/src-include/"
}
recipe_ucx() {
  n ./autogen.sh
  n ./configure --prefix="$prefix" --without-java --without-go --disable-doxygen-doc \
    --without-cuda --without-rocm --without-ze --without-gaudi --without-verbs \
    --without-rdmacm --without-knem --without-xpmem --without-fuse3 --without-mad \
    --without-gdrcopy --without-mpi --disable-examples
  mk -C src/ucm
  mk -C src/ucm install
  mk -C src/ucs
  mk -C src/ucs install
}
recipe_ompi() {
  # The tarball holds OpenPMIx without its own config/oac submodule (a nested
  # one); its autogen.pl stops without it. Open MPI's config/oac comes from the
  # same repository (open-mpi/oac); use it.
  if [ -z "$(ls -A 3rd-party/openpmix/config/oac)" ]; then cp -r config/oac/. 3rd-party/openpmix/config/oac/; fi
  n ./autogen.pl --no-3rdparty prrte,libevent,hwloc
  # --without-ucx: with Debian's libucx-dev installed, configure builds
  # opal's common/ucx into libopen-pal (--disable-mca-dso), so libucm is
  # loaded with opal and its relocation hooks take the process's `sbrk`:
  # UCM's sbrk makes the brk system call itself, past the `brk` that opal's
  # patcher overwrote, and grdma never hears of a brk shrink (reuse-brk went
  # stale for that reason alone). Debian's 4.1.4 loads UCX only with its UCX
  # components, never through opal_init; the two columns must load the same.
  n ./configure --prefix="$prefix" --disable-mpi --disable-oshmem --disable-mpi-fortran \
    --with-hwloc=external --with-libevent=external --with-pmix=internal --without-ucx \
    --with-prrte=no --disable-io-romio --disable-mca-dso --disable-man-pages --disable-sphinx
  mk -C config
  mk -C 3rd-party/openpmix
  mk -C 3rd-party/openpmix install
  mk -C opal
  mk -C opal install
  # The rcache/grdma and mpool headers an adapter needs are not installed by
  # opal's install (they are internal to Open MPI); copy the tree's headers.
  mkdir -p "$prefix/src-include"
  (find opal -name '*.h' -print0 | tar --null -T - -cf - | tar -xf - -C "$prefix/src-include")
}

# All in a function, read whole before it runs: editing this file while a
# build runs must not change what the running shell reads next.
main() {
# One build at a time: a second run waits, then finds the stamps.
exec 9>"$out/.lock"
flock 9
: > "$out/failed.txt"
failed=0
for peer in "${all[@]}"; do
  name="${peer%%-*}"
  tarball="$src/$peer-src.tar.gz"
  prefix="$out/$peer"
  log="$out/logs/$peer.log"
  if ! declare -F "recipe_$name" >/dev/null; then
    echo "conformance/upstream/build.sh: unknown peer $peer" >&2; echo "$peer: unknown peer" >> "$out/failed.txt"; failed=1; continue
  fi
  if [ ! -f "$tarball" ]; then
    echo "conformance/upstream/build.sh: skipping $peer: no $tarball" >&2
    echo "$peer: no source tarball $tarball" >> "$out/failed.txt"; failed=1; continue
  fi
  key="$(sha256sum < "$tarball" | cut -d' ' -f1) $(declare -f "recipe_$name" | sha256sum | cut -d' ' -f1)"
  if [ -f "$prefix/.stamp" ] && [ "$(cat "$prefix/.stamp")" = "$key" ]; then
    echo "conformance/upstream/build.sh: $peer is up to date ($prefix)" >&2
    continue
  fi
  echo "conformance/upstream/build.sh: building $peer (log: $log)" >&2
  rm -rf "$prefix" "$out/build/$peer"
  mkdir -p "$out/build"
  t0=$SECONDS
  # Not in an `if`: set -e must stop the recipe at its first failing step.
  (set -e -x; tar xzf "$tarball" -C "$out/build"; cd "$out/build/$peer"; "recipe_$name") > "$log" 2>&1
  if [ $? = 0 ]; then
    echo "$key" > "$prefix/.stamp"
    echo "conformance/upstream/build.sh: built $peer in $((SECONDS - t0)) s (load: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  else
    echo "conformance/upstream/build.sh: $peer failed; the end of $log:" >&2
    tail -n 15 "$log" >&2
    echo "$peer: build failed, see $log" >> "$out/failed.txt"
    failed=1
  fi
done
exit $failed
}
main
