//! The library C programs link, as ci/install.sh installs it (libmrcache.so /
//! .a, built as libmrcache_capi.so / .a): `cargo build --release -p
//! mrcache-capi` (alone: a workspace build would merge in the test kit's
//! features), built and installed by ci/test.sh before the tests run. It
//! holds the C API and the cache, and nothing of the test kit, the reference
//! model or stateright.

use std::path::PathBuf;
use std::process::Command;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The installed library that ci/test.sh built and installed (ci/install.sh:
/// `cargo build --release -p mrcache-capi` alone, in a target directory of
/// its own), `PREFIX/lib` named by `MRCACHE_CAPI_LIB_DIR`. Without it (a plain
/// `cargo test`) the test says why and checks nothing, unless
/// `MRCACHE_REQUIRE_ARTEFACTS` is set (ci/test.sh sets it): then it fails.
fn production_build() -> Option<PathBuf> {
    let Some(dir) = std::env::var_os("MRCACHE_CAPI_LIB_DIR") else {
        assert!(
            std::env::var_os("MRCACHE_REQUIRE_ARTEFACTS").is_none(),
            "MRCACHE_REQUIRE_ARTEFACTS is set but MRCACHE_CAPI_LIB_DIR is not (ci/test.sh sets both)"
        );
        eprintln!(
            "production: MRCACHE_CAPI_LIB_DIR is not set, nothing checked. To check it: \
             bash ci/install.sh PREFIX, then MRCACHE_CAPI_LIB_DIR=PREFIX/lib cargo test -p mrcache-capi \
             --test production (ci/test.sh does)"
        );
        return None;
    };
    let dir = PathBuf::from(dir);
    for lib in ["libmrcache.so", "libmrcache.a"] {
        assert!(dir.join(lib).is_file(), "MRCACHE_CAPI_LIB_DIR={}: no {lib}", dir.display());
    }
    Some(dir)
}

#[test]
fn the_c_library_has_the_api_and_no_test_code() {
    let Some(dir) = production_build() else { return };
    for lib in ["libmrcache.so", "libmrcache.a"] {
        let path = dir.join(lib);
        let symbols = run(Command::new("nm").args(["-C", "--defined-only"]).arg(&path));
        for api in ["mrcache_create", "mrcache_acquire", "mrcache_release", "mrcache_destroy", "mrcache_last_error"] {
            assert!(symbols.lines().any(|l| l.ends_with(&format!(" {api}"))), "{lib} does not export {api}");
        }
        assert!(symbols.contains("mrcache::cache::"), "{lib}: nm lists no symbol of the cache");
        for needle in ["testkit", "mrcache_model", "stateright", "Faults", "maybe_panic"] {
            assert!(!symbols.contains(needle), "{lib} has {needle} symbols");
        }
    }
    // The shared library exports the C API and nothing of Rust's.
    let dynamic = run(Command::new("nm").args(["-D", "--defined-only"]).arg(dir.join("libmrcache.so")));
    let exported: Vec<&str> = dynamic.lines().filter_map(|l| l.split_whitespace().nth(2)).collect();
    assert!(exported.iter().all(|s| s.starts_with("mrcache_")), "exports other than mrcache_*: {exported:?}");
    let dynamic = run(Command::new("readelf").args(["-d"]).arg(dir.join("libmrcache.so")));
    assert!(dynamic.contains("Library soname: [libmrcache.so]"), "SONAME is not libmrcache.so:\n{dynamic}");
}
