#!/usr/bin/env bash
# Builds the C library (the production build: `-p mrcache-capi` alone, no
# test kit) and installs it under PREFIX:
#   PREFIX/include/mrcache.h
#   PREFIX/lib/libmrcache.so, PREFIX/lib/libmrcache.a
#   PREFIX/lib/pkgconfig/mrcache.pc
# With libibverbs present (pkg-config), the built-in verbs registrar is
# compiled in (feature `verbs`); without it mrcache_registrar_verbs returns
# MRCACHE_NO_DEVICE.
#   PREFIX/lib/pkgconfig/mrcache-static.pc (the static link)
# Then: the README's "From C" recipes (run verbatim by ci/c-tests.sh).
set -euo pipefail
prefix=${1:?usage: ci/install.sh PREFIX}
cd -P "$(dirname "$0")/.."
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
target=${CARGO_TARGET_DIR:-$PWD/target}/capi-install
features=()
requires=""
if pkg-config --exists libibverbs 2>/dev/null; then
  features=(--features verbs)
  requires="libibverbs"
fi
CARGO_TARGET_DIR=$target cargo build --release --quiet -p mrcache-capi "${features[@]}"
# What a static link needs besides libmrcache.a (rustc's list for this target).
native=$(CARGO_TARGET_DIR=$target cargo rustc --release --quiet -p mrcache-capi "${features[@]}" \
  --crate-type staticlib -- --print native-static-libs 2>&1 | sed -n 's/.*native-static-libs: //p' | tail -1)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
install -d "$prefix/include" "$prefix/lib/pkgconfig"
install -m 644 capi/include/mrcache.h "$prefix/include/"
# Built as libmrcache_capi.* (the crate name `mrcache` is the cache's); the
# shared library's SONAME is already libmrcache.so (capi/build.rs).
install -m 755 "$target/release/libmrcache_capi.so" "$prefix/lib/libmrcache.so"
install -m 644 "$target/release/libmrcache_capi.a" "$prefix/lib/libmrcache.a"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" -e "s|@REQUIRES_PRIVATE@|$requires|" \
  -e "s|@LIBS_PRIVATE@|$native|" capi/mrcache.pc.in >"$prefix/lib/pkgconfig/mrcache.pc"
# The static link: the archive by path (with -lmrcache the linker would take
# the .so beside it), plus what Rust's standard library needs.
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" -e "s|@REQUIRES_PRIVATE@|$requires|" \
  -e "s|@LIBS_PRIVATE@|$native|" capi/mrcache-static.pc.in >"$prefix/lib/pkgconfig/mrcache-static.pc"
echo "installed mrcache $version under $prefix${features:+ (with verbs)}"
