#!/usr/bin/env bash
# The C API as a C user gets it: install libmrcache to a temporary prefix
# (ci/install.sh), build the examples and the C tests *outside the tree*
# with pkg-config against the installed header and libraries, run them, and
# run them again under valgrind (memory errors and leaks fail).
#
#   bash ci/c-tests.sh [--native]
# --native: not under valgrind (ci/test.sh; ci/full.sh runs both), and then
# the monitor hang tests against the same prefix: ci/hang-tests.sh --runs 3
# --seconds 5 (each scenario of capi/tests/c/hang/ under ci/watchdog.sh;
# ci/full.sh's step `hangs` runs them at length).
# MRCACHE_PREFIX=DIR: test the library installed there by ci/install.sh
# (ci/test.sh's) instead of installing one to a temporary prefix.
#
# valgrind 3.19 does not know userfaultfd (syscall 323): under valgrind
# pingpong_cache reports MRCACHE_UNSUPPORTED for the uffd monitor and falls
# back to mrcache_invalidate (it says so). The uffd path is therefore run
# natively, where it is required (MRCACHE_REQUIRE_UFFD=1). shared_monitor
# (two caches on the process's one monitor, spec.md S7.6) checks its leaks
# natively: 200 create/destroy cycles must leave the registrations, fds,
# threads and heap where they were; under valgrind it checks the refusal.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
native_only=0
case ${1:-} in
  --native) native_only=1 ;;
  "") ;;
  *) echo "usage: ci/c-tests.sh [--native]" >&2; exit 2 ;;
esac
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
cp "$root/examples/c/pingpong_cache.c" "$root/examples/c/verbs.c" "$root/capi/tests/c/api_errors.c" \
  "$root/capi/tests/c/shared_monitor.c" "$work/src/"
cd "$work/src"
cflags=(-std=c11 -D_DEFAULT_SOURCE -Wall -Wextra -Werror -g)
rpath=-Wl,-rpath,$prefix/lib
cc "${cflags[@]}" pingpong_cache.c $(pkg-config --cflags --libs mrcache) "$rpath" -o pingpong_cache
cc "${cflags[@]}" api_errors.c $(pkg-config --cflags --libs mrcache) -lpthread "$rpath" -o api_errors
cc "${cflags[@]}" shared_monitor.c $(pkg-config --cflags --libs mrcache) "$rpath" -o shared_monitor
# The static library: libmrcache.a plus what pkg-config --static lists.
cc "${cflags[@]}" api_errors.c $(pkg-config --cflags mrcache) "$prefix/lib/libmrcache.a" \
  $(pkg-config --static --libs-only-l mrcache | sed 's/-lmrcache//') -lpthread -o api_errors_static
# The header needs C99, as it says: it compiles alone, pedantically.
printf '#include <mrcache.h>\nint main(void) { return MRCACHE_OK; }\n' >c99.c
cc -std=c99 -pedantic-errors -Wall -Wextra -Werror $(pkg-config --cflags mrcache) c99.c -o c99
if pkg-config --exists libibverbs; then
  cc "${cflags[@]}" verbs.c $(pkg-config --cflags --libs mrcache libibverbs) "$rpath" -o verbs
fi
if ldd ./api_errors_static | grep -q libmrcache; then
  echo "api_errors_static links libmrcache.so" >&2
  exit 1
fi

# The README's "From C" recipes, verbatim, on a fresh prefix.
recipe=$(awk '/ci\/c-tests.sh runs the next block verbatim/{f=1; next} f&&/^```sh/{g=1; next} g&&/^```/{exit} g' "$root/README.md")
[ -n "$recipe" ] || { echo "c-tests: no recipe block in README.md" >&2; exit 1; }
mkdir "$work/recipe"
cp "$root/examples/c/pingpong_cache.c" "$work/recipe/prog.c"
(cd "$root" && PREFIX="$work/recipe/prefix" PKG_CONFIG_PATH= bash -euo pipefail -c "cd '$work/recipe'; ln -s '$root/ci' ci; $recipe")
if ldd "$work/recipe/prog-static" | grep -q libmrcache; then
  echo "the README's static recipe links libmrcache.so" >&2
  exit 1
fi

echo "== native"
MRCACHE_REQUIRE_UFFD=1 ./pingpong_cache
MRCACHE_REQUIRE_UFFD=1 ./shared_monitor
./api_errors
./api_errors_static
if [ -x verbs ]; then ./verbs; fi

if ((native_only)); then
  echo "== hang tests"
  MRCACHE_PREFIX=$prefix MRCACHE_REQUIRE_UFFD=1 bash "$root/ci/hang-tests.sh" --runs 3 --seconds 5
  echo "C tests passed (natively; under valgrind: bash ci/c-tests.sh, run by ci/full.sh)"
  exit 0
fi
echo "== valgrind"
# --child-silent-after-fork: api_errors' fork child leaves by _exit with the
# parent's heap still allocated, which valgrind would list as leaks in the
# log (its verdict comes back through a pipe, not through valgrind).
vg=(valgrind -q --error-exitcode=1 --leak-check=full --child-silent-after-fork=yes)
"${vg[@]}" ./pingpong_cache
"${vg[@]}" ./api_errors
"${vg[@]}" ./shared_monitor
"${vg[@]}" ./api_errors_static
if [ -x verbs ]; then "${vg[@]}" ./verbs; fi
echo "C tests passed"
