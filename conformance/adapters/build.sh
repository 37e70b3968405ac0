#!/usr/bin/env bash
# Builds the C conformance adapters into OUT (default target/conform-adapters):
#   ucx       needs Debian libucx-dev
#   ompi      needs Debian libopenmpi-dev
#   libfabric needs libfabric 1.17.0's MR cache sources: LIBFABRIC_SRC (a
#             directory or the .tar.gz), default ../shared/peers/libfabric-1.17.0-mr-cache-src.tar.gz
# and, against the current releases that conformance/upstream/build.sh built
# into target/upstream/ (this script does not build them), the same sources as
#   ucx-1.22.0  ompi-5.0.10  libfabric-2.6.0
# A peer whose library or source is missing is skipped with a message on
# stderr and a line in OUT/skipped.txt; the script still succeeds.
# Every adapter pins through the io_uring registrar of ../uring_reg.h (via
# adapter.c; Linux 5.13+) unless run with `--registrar counting`.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$root/target/conform-adapters}"
mkdir -p "$out"
: > "$out/skipped.txt"
CF="-O1 -g -Wall"
skip() { echo "conformance/adapters/build.sh: skipping $1: $2" >&2; echo "$1: $2" >> "$out/skipped.txt"; rm -f "$out/$1"; }

if [ -f /usr/include/ucs/memory/rcache.h ]; then
  gcc $CF -o "$out/ucx" "$here/ucx.c" "$here/adapter.c" -lucs -lucm -lpthread || skip ucx "build failed"
else
  skip ucx "UCX headers not installed (apt-get install libucx-dev)"
fi

OMPI=/usr/lib/x86_64-linux-gnu/openmpi
if [ -f "$OMPI/include/openmpi/opal/mca/rcache/rcache.h" ]; then
  gcc $CF -I"$OMPI/include/openmpi" -I"$OMPI/include" -o "$out/ompi" "$here/ompi.c" "$here/adapter.c" \
    -L"$OMPI/lib" -Wl,-rpath,"$OMPI/lib" -lopen-pal -lpthread || skip ompi "build failed"
else
  skip ompi "Open MPI's internal headers not installed (apt-get install libopenmpi-dev)"
fi

src="${LIBFABRIC_SRC:-$root/../shared/peers/libfabric-1.17.0-mr-cache-src.tar.gz}"
if [ -f "$src" ]; then
  mkdir -p "$out/libfabric-src" && tar xzf "$src" -C "$out/libfabric-src" && src="$out/libfabric-src"
fi
if [ -f "$src/prov/util/src/util_mr_cache.c" ]; then
  lf="$here/libfabric"; obj="$out/libfabric-obj"; mkdir -p "$obj"
  LCF="$CF -Wno-unused -Wno-sign-compare -DHAVE_CONFIG_H -I$lf -I$src/include -I$src/prov/util/include"
  ok=1
  for f in prov/util/src/util_mr_cache.c prov/util/src/util_mem_monitor.c prov/util/src/util_mem_hooks.c \
           src/tree.c prov/util/src/util_buf.c src/enosys.c; do
    gcc $LCF -w -c "$src/$f" -o "$obj/$(basename "$f" .c).o" || ok=0
  done
  gcc $LCF -c "$lf/lf_stubs.c" -o "$obj/lf_stubs.o" || ok=0
  if [ $ok = 1 ]; then
    gcc $LCF -o "$out/libfabric" "$lf/libfabric.c" "$here/adapter.c" "$obj"/*.o -lpthread -ldl || skip libfabric "build failed"
  else
    skip libfabric "the MR cache sources in $src did not build"
  fi
else
  skip libfabric "no libfabric 1.17.0 MR cache source (set LIBFABRIC_SRC to the directory or the .tar.gz)"
fi
# The current releases (conformance/upstream/build.sh), each only if its build
# finished (its .stamp exists).
up="$root/target/upstream"
P="$up/ucx-1.22.0"
if [ -f "$P/.stamp" ]; then
  gcc $CF -DUCX_VERSION_NUM=12200 -DUCX_VERSION_STR='"1.22.0"' -I"$P/include" -o "$out/ucx-1.22.0" \
    "$here/ucx.c" "$here/adapter.c" -L"$P/lib" -Wl,-rpath,"$P/lib" -lucs -lucm -lpthread || skip ucx-1.22.0 "build failed"
else
  skip ucx-1.22.0 "not built (bash conformance/upstream/build.sh)"
fi
P="$up/ompi-5.0.10"
if [ -f "$P/.stamp" ]; then
  gcc $CF -I"$P/src-include" -I"$P/src-include/opal/include" -I"$P/include" -o "$out/ompi-5.0.10" "$here/ompi.c" "$here/adapter.c" \
    -L"$P/lib" -Wl,-rpath,"$P/lib" -lopen-pal -lpthread || skip ompi-5.0.10 "build failed"
else
  skip ompi-5.0.10 "not built (bash conformance/upstream/build.sh)"
fi
P="$up/libfabric-2.6.0"
if [ -f "$P/.stamp" ]; then
  I="$P/src-include"
  gcc $CF -Wno-unused -Wno-sign-compare -DLF_FULL_LIBRARY -include "$I/config.h" -I"$I" -I"$I/include" \
    -o "$out/libfabric-2.6.0" "$here/libfabric/libfabric.c" "$here/adapter.c" "$P/lib/libfabric.a" \
    $(PKG_CONFIG_PATH="$P/lib/pkgconfig" pkg-config --static --libs-only-l libfabric | sed 's/-lfabric//') -lpthread -ldl \
    || skip libfabric-2.6.0 "build failed"
else
  skip libfabric-2.6.0 "not built (bash conformance/upstream/build.sh)"
fi
ls "$out" >&2
