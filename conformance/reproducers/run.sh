#!/usr/bin/env bash
# Builds every reproducer in this directory, runs each row of expected.tsv
# and compares the verdict with the table:
#   fail  the program exited 1 and printed a STALE:, ABORT: or DEADLOCK: line
#   pass  the program exited 0
#   anything else (exit 2: a setup error, a signal, a timeout) is an error.
# Exits 1 on any mismatch or error. A peer whose library or source is missing
# is skipped with a message (SKIP ... on stderr and in the summary), never
# silently; REQUIRE_PEERS=1 makes a skip an error too.
#
#   bash conformance/reproducers/run.sh [OUT]      (default OUT: target/reproducers)
# Needs: gcc, io_uring with fixed buffers (Linux 5.13+), cargo (libmrcache is
# built by ci/install.sh into OUT/prefix; MRCACHE_PREFIX=DIR uses an installed
# one instead). Peers: UCX 1.13.1 (libucx-dev), Open MPI 4.1.4
# (libopenmpi-dev), libfabric 1.17.0's MR cache sources (LIBFABRIC_SRC: a
# directory or the .tar.gz; default ../shared/peers/libfabric-1.17.0-mr-cache-src.tar.gz),
# and the current releases that conformance/upstream/build.sh built into
# target/upstream/ (rows `ucx@1.22.0`, `grdma@5.0.10`, `libfabric@2.6.0`:
# the same programs, built against that release).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$root/target/reproducers}"
mkdir -p "$out/bin" "$out/logs"
CF=(-O1 -g -Wall -Wno-unused-function -I"$here")
start=$SECONDS
declare -A skipped=()
nskipped=0
skip() { [ -n "${skipped[$1]:-}" ] || nskipped=$((nskipped + 1)); skipped[$1]="$2"; echo "run.sh: SKIP $1: $2" >&2; }
build() { # peer program gcc-args...
  local peer=$1 prog=$2; shift 2
  if ! gcc "${CF[@]}" -o "$out/bin/$peer-$prog" "$@" >"$out/logs/$peer-$prog.build.txt" 2>&1; then
    cat "$out/logs/$peer-$prog.build.txt" >&2
    skip "$peer" "$prog did not build (log above)"
    return 1
  fi
}
programs() { awk -F'\t' -v p="$1" '!/^#/ && $1 == p { print $2 }' "$here/expected.tsv" | sort -u; }

# libmrcache, through its installed header and pkg-config (as ci/c-tests.sh does).
if [ -n "${MRCACHE_PREFIX:-}" ]; then
  prefix=$MRCACHE_PREFIX
elif (cd "$root" && bash ci/install.sh "$out/prefix" >"$out/logs/install.txt" 2>&1); then
  prefix=$out/prefix
else
  cat "$out/logs/install.txt" >&2
  prefix=
  skip mrcache "ci/install.sh failed (log above)"
fi
if [ -n "$prefix" ]; then
  export PKG_CONFIG_PATH="$prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  for p in $(programs mrcache); do
    build mrcache "$p" -I"$here/mrcache" "$here/mrcache/$p.c" $(pkg-config --cflags --libs mrcache) -lpthread \
      -Wl,-rpath,"$prefix/lib" || break
  done
fi

if [ -f /usr/include/ucs/memory/rcache.h ]; then
  for p in $(programs ucx); do build ucx "$p" "$here/ucx/$p.c" -lucs -lucm -lpthread || break; done
else
  skip ucx "UCX headers not installed (apt-get install libucx-dev)"
fi

OMPI=/usr/lib/x86_64-linux-gnu/openmpi
if [ -f "$OMPI/include/openmpi/opal/mca/rcache/rcache.h" ]; then
  for p in $(programs grdma); do
    build grdma "$p" -I"$OMPI/include/openmpi" -I"$OMPI/include" "$here/grdma/$p.c" \
      -L"$OMPI/lib" -Wl,-rpath,"$OMPI/lib" -lopen-pal -lpthread || break
  done
else
  skip grdma "Open MPI's internal headers not installed (apt-get install libopenmpi-dev)"
fi

# libfabric's MR cache is not exported by libfabric.so: build it from its
# sources with the conformance adapter's config.h and stubs (adapters/build.sh).
src="${LIBFABRIC_SRC:-$root/../shared/peers/libfabric-1.17.0-mr-cache-src.tar.gz}"
if [ -f "$src" ]; then
  mkdir -p "$out/libfabric-src" && tar xzf "$src" -C "$out/libfabric-src" && src="$out/libfabric-src"
fi
if [ -f "$src/prov/util/src/util_mr_cache.c" ]; then
  lf="$root/conformance/adapters/libfabric"; obj="$out/libfabric-obj"; mkdir -p "$obj"
  LCF=(-O1 -g -Wno-unused -Wno-sign-compare -DHAVE_CONFIG_H -I"$lf" -I"$src/include" -I"$src/prov/util/include")
  ok=1
  for f in prov/util/src/util_mr_cache.c prov/util/src/util_mem_monitor.c prov/util/src/util_mem_hooks.c \
           src/tree.c prov/util/src/util_buf.c src/enosys.c; do
    gcc "${LCF[@]}" -w -c "$src/$f" -o "$obj/$(basename "$f" .c).o" || ok=0
  done
  gcc "${LCF[@]}" -c "$lf/lf_stubs.c" -o "$obj/lf_stubs.o" || ok=0
  if [ $ok = 1 ]; then
    for p in $(programs libfabric); do
      build libfabric "$p" "${LCF[@]}" "$here/libfabric/$p.c" "$obj"/*.o -lpthread -ldl || break
    done
  else
    skip libfabric "the MR cache sources in $src did not build"
  fi
else
  skip libfabric "no libfabric 1.17.0 MR cache source (set LIBFABRIC_SRC to the directory or the .tar.gz)"
fi
# The current releases: the same sources against target/upstream/<peer>-<version>
# (conformance/upstream/build.sh; this script does not build them).
up="$root/target/upstream"
P="$up/ucx-1.22.0"
if [ -f "$P/.stamp" ]; then
  for p in $(programs ucx@1.22.0); do
    build ucx@1.22.0 "$p" -DUCX_VERSION_NUM=12200 -I"$P/include" "$here/ucx/$p.c" \
      -L"$P/lib" -Wl,-rpath,"$P/lib" -lucs -lucm -lpthread || break
  done
else
  skip ucx@1.22.0 "not built (bash conformance/upstream/build.sh)"
fi
P="$up/ompi-5.0.10"
if [ -f "$P/.stamp" ]; then
  for p in $(programs grdma@5.0.10); do
    build grdma@5.0.10 "$p" -I"$P/src-include" -I"$P/src-include/opal/include" -I"$P/include" "$here/grdma/$p.c" \
      -L"$P/lib" -Wl,-rpath,"$P/lib" -lopen-pal -lpthread || break
  done
else
  skip grdma@5.0.10 "not built (bash conformance/upstream/build.sh)"
fi
P="$up/libfabric-2.6.0"
if [ -f "$P/.stamp" ]; then
  I="$P/src-include"
  libs=$(PKG_CONFIG_PATH="$P/lib/pkgconfig" pkg-config --static --libs-only-l libfabric | sed 's/-lfabric//')
  for p in $(programs libfabric@2.6.0); do
    # shellcheck disable=SC2086
    build libfabric@2.6.0 "$p" -Wno-unused -Wno-sign-compare -D_GNU_SOURCE -DLF_FULL_LIBRARY -I"$I" -I"$I/include" \
      "$here/libfabric/$p.c" "$P/lib/libfabric.a" $libs -lpthread -ldl || break
  done
else
  skip libfabric@2.6.0 "not built (bash conformance/upstream/build.sh)"
fi
built=$((SECONDS - start))

# Run every row.
bad=0; n=0
# The version each row ran against: Debian's, or the one after `@`.
version() {
  case $1 in
    *@*) echo "${1#*@}" ;; ucx) echo 1.13.1 ;; grdma) echo 4.1.4 ;; libfabric) echo 1.17.0 ;; *) echo - ;;
  esac
}
printf '%-10s %-7s %-26s %-33s %-8s %-8s %s\n' peer version program env expected observed line
while IFS=$'\t' read -r peer prog env expected what; do
  case "$peer" in ''|'#'*) continue ;; esac
  if [ -n "${skipped[$peer]:-}" ]; then
    printf '%-10s %-7s %-26s %-33s %-8s %-8s %s\n' "${peer%@*}" "$(version "$peer")" "$prog" "$env" "$expected" SKIP "${skipped[$peer]}"
    [ "${REQUIRE_PEERS:-0}" = 1 ] && bad=$((bad + 1))
    continue
  fi
  n=$((n + 1))
  log="$out/logs/$peer-$prog.txt"; envs=()
  if [ "$env" != - ]; then log="$out/logs/$peer-$prog-${env//[^A-Za-z0-9_]/_}.txt"; envs=("$env"); fi
  env "${envs[@]}" timeout 60 "$out/bin/$peer-$prog" >"$log" 2>&1 </dev/null
  rc=$?
  line=$(grep -m1 -E '^(STALE|ABORT|DEADLOCK):' "$log" || true)
  if [ $rc = 0 ] && [ -z "$line" ]; then observed=pass
  elif [ $rc = 1 ] && [ -n "$line" ]; then observed=fail
  else observed="error($rc)"; line=$(tail -n 3 "$log" | tr '\n' ' ')
  fi
  printf '%-10s %-7s %-26s %-33s %-8s %-8s %s\n' "${peer%@*}" "$(version "$peer")" "$prog" "$env" "$expected" "$observed" "${line:0:110}"
  if [ "$observed" != "$expected" ]; then
    bad=$((bad + 1))
    echo "run.sh: MISMATCH $peer/$prog ($env): expected $expected, observed $observed; log $log:" >&2
    sed 's/^/    /' "$log" >&2
  fi
done <"$here/expected.tsv"
echo "run.sh: $n runs, $bad mismatches or errors, $nskipped peers skipped; build ${built}s, total $((SECONDS - start))s; logs in $out/logs"
[ $bad = 0 ]
