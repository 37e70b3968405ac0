#!/usr/bin/env bash
# bench/capi/run.sh: the hit path through each API, same workload: one cached
# 64 KiB registration (counting registrar), acquire + release in a loop;
# alone (1t) and with a partner thread hitting the same registration (2t).
#   Rust borrowed `Lease` (the reference), Rust `OwnedLease`, and C
#   (`mrcache_acquire` + `mrcache_release` through the installed libmrcache.so,
#   built by ci/install.sh, compiled with gcc -O2).
# Prints ns/op (best of ROUNDS runs of ITERS) and each one's ratio to the
# borrowed Rust lease with the same number of threads (target: <= 1.5).
#   ROUNDS=5 ITERS=10000000 bash bench/capi/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${CARGO_TARGET_DIR:-$root/target}/capi-bench
mkdir -p "$out"
bash "$root/ci/install.sh" "$out/prefix" >/dev/null
(cd "$root" && cargo build --release --quiet -p mrcache-capi --example hit_rust)
export PKG_CONFIG_PATH=$out/prefix/lib/pkgconfig
gcc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -o "$out/c_hit" "$here/c_hit.c" $(pkg-config --cflags --libs mrcache) -lpthread \
  -Wl,-rpath,"$out/prefix/lib"
{ "${CARGO_TARGET_DIR:-$root/target}/release/examples/hit_rust"; "$out/c_hit"; } | tee "$out/results.txt"
awk '{ v[$1] = $2 }
  END {
    printf "\nratio to the borrowed Rust lease (same threads):\n"
    printf "  owned lease, 1 thread:  %.2f\n", v["rust_owned_1t"] / v["rust_borrowed_1t"]
    printf "  owned lease, 2 threads: %.2f\n", v["rust_owned_2t"] / v["rust_borrowed_2t"]
    printf "  C API,       1 thread:  %.2f\n", v["c_1t"] / v["rust_borrowed_1t"]
    printf "  C API,       2 threads: %.2f\n", v["c_2t"] / v["rust_borrowed_2t"]
  }' "$out/results.txt"
