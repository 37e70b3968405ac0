//! The library C programs link (installed as libmrcache.so / .a by
//! ci/install.sh): `cargo build --release -p mrcache-capi`
//! (alone: a workspace build would merge in the test kit's features). It
//! holds the C API and the cache, and nothing of the test kit, the reference
//! model or stateright.

use std::path::{Path, PathBuf};
use std::process::Command;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// Builds it in a target directory of its own (the outer `cargo test` holds
/// the workspace's).
fn production_build() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let target = root.join("target/capi-production");
    run(Command::new(env!("CARGO"))
        .args(["build", "--release", "--quiet", "-p", "mrcache-capi"])
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(root));
    target.join("release")
}

#[test]
fn the_c_library_has_the_api_and_no_test_code() {
    let dir = production_build();
    for lib in ["libmrcache_capi.so", "libmrcache_capi.a"] {
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
    let dynamic = run(Command::new("nm").args(["-D", "--defined-only"]).arg(dir.join("libmrcache_capi.so")));
    let exported: Vec<&str> = dynamic.lines().filter_map(|l| l.split_whitespace().nth(2)).collect();
    assert!(exported.iter().all(|s| s.starts_with("mrcache_")), "exports other than mrcache_*: {exported:?}");
    let dynamic = run(Command::new("readelf").args(["-d"]).arg(dir.join("libmrcache_capi.so")));
    assert!(dynamic.contains("Library soname: [libmrcache.so]"), "SONAME is not libmrcache.so:\n{dynamic}");
}
