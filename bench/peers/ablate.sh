#!/bin/bash
# ablate.sh: what each part of the C API's hit path costs, measured beside UCX
# in one interleaved run (the floor behind the C hit rows).
#
# Applies bench/peers/ablation.patch to HEAD in a scratch worktree (the
# library itself never carries it), builds libmrcache there and pb.c once per
# arm, then runs ROUNDS rounds of each workload, the arms interleaved and
# pinned to CPU 1, and prints medians (ns per get+put):
#   ucx       UCX 1.13.1 ucs_rcache (pb.c -DBE_UCX)
#   lf        libfabric 1.17's MR cache (pb.c -DBE_LF; needs bench/peers/build.sh's
#             target/peers/lfobj, else this arm is left out)
#   api       mrcache's C API (patched library: one more flag test in release)
#   plain     the C API with a plain load and store clearing the handle's slot
#             instead of the compare-exchange that lets exactly one of two
#             racing releases of a handle release
#   nohandle  the C entry points' conventions and checks, with the lease in
#             one static cell instead of a generation-checked handle slot
#   onecall   acquire and release in one call into the library: the Rust path
#             with neither handle nor C conventions
# (The sixth arm of 2026-12-06, A1 without its shared lock, is gone: A0, the
# lock-free hit of spec.md, now takes these hits without the lock, soundly.)
# Run from the project root, alone on the machine (about 2 minutes, plus the
# first build of the patched library, kept in $W/target for the next run):
#   bash bench/peers/ablate.sh                  # ROUNDS=5 (odd: the median is the middle round) ITERS=3000000
set -euo pipefail
proj=$(git rev-parse --show-toplevel)
here=$proj/bench/peers
PW=$(realpath -m "${OUTDIR:-$proj/target/peers}")
W=$PW/ablate
ROUNDS=${ROUNDS:-5}
ITERS=${ITERS:-3000000}
rm -rf "$W/src" "$W/bin" "$W/prefix"
mkdir -p "$W/bin"
git -C "$proj" worktree prune
git -C "$proj" worktree add -q --detach "$W/src" HEAD
trap 'git -C "$proj" worktree remove --force "$W/src" 2>/dev/null || true' EXIT
if ! git -C "$W/src" apply "$here/ablation.patch"; then
  echo "ablate.sh: bench/peers/ablation.patch does not apply to HEAD; regenerate it (see its capi/src/ablation.rs)" >&2
  exit 1
fi
(cd "$W/src" && CARGO_TARGET_DIR=$W/target bash ci/install.sh "$W/prefix" >/dev/null)
P=$W/prefix
CF="-O2 -Wall -Wno-unused-function"
gcc $CF -DBE_UCX -o "$W/bin/ucx" "$W/src/bench/peers/pb.c" -lucs -lucm -lpthread
gcc $CF -DBE_MRC -I"$P/include" -o "$W/bin/api" "$W/src/bench/peers/pb.c" -L"$P/lib" -Wl,-rpath,"$P/lib" -lmrcache -lpthread
for arm in onecall:1 nohandle:2 plain:3; do
  gcc $CF -DBE_MRC -DABLATE=${arm#*:} -I"$P/include" -o "$W/bin/${arm%%:*}" "$W/src/bench/peers/pb.c" \
    -L"$P/lib" -Wl,-rpath,"$P/lib" -lmrcache -lpthread
done
rotate() { local r=$1; shift; local a=("$@") n=$#; for ((i = 0; i < n; i++)); do echo "${a[$(((i + r) % n))]}"; done; }
arms="ucx api plain nohandle onecall"
lfobj=$PW/lfobj/liblfcache.a
peers=${PEERS:-$proj/../shared/peers}
if [ -f "$lfobj" ] && [ ! -d "$peers/probes/libfabric" ]; then
  echo "ablate.sh: $peers/probes/libfabric not found (set PEERS as for build.sh); leaving libfabric out" >&2
elif [ -f "$lfobj" ]; then
  LCF="-O2 -DNDEBUG -D_GNU_SOURCE -DHAVE_CONFIG_H -I$peers/probes/libfabric -I$PW/lf/include -I$PW/lf/prov/util/include"
  gcc $CF -DBE_LF $LCF -o "$W/bin/lf" "$W/src/bench/peers/pb.c" "$lfobj" -lpthread -ldl
  arms="ucx lf api plain nohandle onecall"
fi
echo "# ablate.sh $(git -C "$proj" rev-parse --short HEAD) $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg) ROUNDS=$ROUNDS ITERS=$ITERS"
for w in "hit 100 $ITERS" "hit 10000 $ITERS" "hit 10000 $ITERS seq" "hit 100000 $ITERS" "hit 100000 $ITERS seq" \
  "evict 100000 1000 $((ITERS / 3))"; do
  declare -A got=()
  for r in $(seq "$ROUNDS"); do
    # The order of the arms rotates every round (as run.sh's).
    for a in $(rotate "$r" $arms); do
      out=$(timeout 300 taskset -c 1 "$W/bin/$a" $w) || { echo "ablate.sh: $a $w failed (exit $?)" >&2; exit 1; }
      ns=$(sed -n 's/.* ns=\([0-9.]*\).*/\1/p' <<<"$out")
      [ -n "$ns" ] || { echo "ablate.sh: $a $w printed no result" >&2; exit 1; }
      got[$a]="${got[$a]:-} $ns"
    done
  done
  line="$(printf '%-22s' "$w")"
  for a in $arms; do
    med=$(tr ' ' '\n' <<<"${got[$a]}" | sed '/^$/d' | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')
    line+="  $a $med"
  done
  echo "$line"
done
