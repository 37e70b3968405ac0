#!/bin/bash
# build.sh: builds the four pb arms, libfabric's cache (from the peers tarball),
# libmrcache (ci/install.sh of the checkout) and the project's Rust arm. Run from the project root.
# Outputs go under $OUTDIR (default target/peers). Sequential (2 cores).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
proj=${PROJ:-$(git rev-parse --show-toplevel)}
peers=${PEERS:-$proj/../shared/peers}
W=${OUTDIR:-$proj/target/peers}; B=$W/bin; mkdir -p "$B"
# libmrcache (C API): production build via the project's installer
(cd "$proj" && CARGO_TARGET_DIR=$proj/target bash ci/install.sh "$W/prefix" >/dev/null)
# project's Rust arm (impl/examples/ucx_side.rs) and UCX arm (bench/ucx/ucx_arm.c)
(cd "$proj" && cargo build --release --quiet -p mrcache --example ucx_side)
cp "$proj/target/release/examples/ucx_side" "$B/proj_mrc"
gcc -O2 -Wall -o "$B/proj_ucx" "$proj/bench/ucx/ucx_arm.c" -lucs -lucm -lpthread
# libfabric 1.17.0 util MR cache, -O2, from the peers tarball
lf=$W/lf; [ -d "$lf/prov" ] || { mkdir -p "$lf"; tar xzf "$peers/libfabric-1.17.0-mr-cache-src.tar.gz" -C "$lf"; }
P=$peers/probes/libfabric
LCF="-O2 -DNDEBUG -D_GNU_SOURCE -DHAVE_CONFIG_H -I$P -I$lf/include -I$lf/prov/util/include"
mkdir -p "$W/lfobj"
for f in prov/util/src/util_mr_cache.c prov/util/src/util_mem_monitor.c prov/util/src/util_mem_hooks.c src/tree.c prov/util/src/util_buf.c src/enosys.c; do
  gcc $LCF -c "$lf/$f" -o "$W/lfobj/$(basename $f .c).o"
done
gcc $LCF -c "$P/lf_stubs.c" -o "$W/lfobj/lf_stubs.o"
ar rcs "$W/lfobj/liblfcache.a" "$W"/lfobj/*.o
# the four pb arms
CF="-O2 -Wall -Wno-unused-function"
gcc $CF -DBE_UCX -o "$B/pb_ucx" "$here/pb.c" -lucs -lucm -lpthread
OMPI=/usr/lib/x86_64-linux-gnu/openmpi
gcc $CF -DBE_GRDMA -I$OMPI/include/openmpi -I$OMPI/include -o "$B/pb_grdma" "$here/pb.c" -L$OMPI/lib -Wl,-rpath,$OMPI/lib -lopen-pal -lpthread
gcc $CF -DBE_LF $LCF -o "$B/pb_lf" "$here/pb.c" "$W/lfobj/liblfcache.a" -lpthread -ldl
gcc $CF -DBE_MRC -I"$W/prefix/include" -o "$B/pb_mrc" "$here/pb.c" -L"$W/prefix/lib" -Wl,-rpath,"$W/prefix/lib" -lmrcache -lpthread
echo "build.sh: built $(ls "$B" | tr '\n' ' ')"
gcc -O2 -o "$B/thrash" "$here/thrash.c"
