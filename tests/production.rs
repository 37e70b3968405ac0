#![cfg(feature = "testkit")]
//! The production artifact: `cargo build --release -p mrcache`, no features,
//! built alone by ci/test.sh before the tests run. (Cargo merges features
//! across a workspace build, so a workspace build is not it.) It contains no fault switch and no test kit, and a crate outside the workspace
//! that depends on `mrcache` gets neither the reference model nor stateright.

use mrcache_types::mutants::FAULT_SWITCHES;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The production rlib that ci/test.sh built (`cargo build --release -p
/// mrcache`, alone, in a target directory of its own), named by
/// `MRCACHE_PRODUCTION_RLIB`. Without it (a plain `cargo test`) the test says
/// why and checks nothing, unless `MRCACHE_REQUIRE_ARTEFACTS` is set (ci/test.sh
/// sets it): then it fails.
fn production_rlib() -> Option<PathBuf> {
    let Some(rlib) = std::env::var_os("MRCACHE_PRODUCTION_RLIB") else {
        assert!(
            std::env::var_os("MRCACHE_REQUIRE_ARTEFACTS").is_none(),
            "MRCACHE_REQUIRE_ARTEFACTS is set but MRCACHE_PRODUCTION_RLIB is not (ci/test.sh sets both)"
        );
        eprintln!(
            "production: MRCACHE_PRODUCTION_RLIB is not set, nothing checked. To check it: \
             CARGO_TARGET_DIR=target/capi-install cargo build --release -p mrcache, then \
             MRCACHE_PRODUCTION_RLIB=target/capi-install/release/libmrcache.rlib cargo test --test production \
             (ci/test.sh does)"
        );
        return None;
    };
    let rlib = PathBuf::from(rlib);
    assert!(rlib.is_file(), "MRCACHE_PRODUCTION_RLIB={}: no such file", rlib.display());
    Some(rlib)
}

#[test]
fn the_production_build_has_no_fault_switch() {
    let Some(rlib) = production_rlib() else { return };
    let symbols = run(Command::new("nm").args(["-C", "--defined-only"]).arg(&rlib));
    assert!(symbols.contains("mrcache::"), "nm lists no symbol of mrcache: {symbols}");
    let bytes = std::fs::read(&rlib).unwrap();
    let has = |needle: &str| bytes.windows(needle.len()).any(|w| w == needle.as_bytes());
    // The rlib's metadata names the fields of every public struct it has.
    assert!(has("lane_slots"), "the metadata search finds nothing (CacheConfig::lane_slots)");
    for f in FAULT_SWITCHES {
        assert!(!symbols.contains(f.field), "fault switch symbol {} in the production build", f.field);
        assert!(!has(f.field), "fault switch {} in the production build", f.field);
    }
    for needle in ["Faults", "HANDLE_GONE"] {
        assert!(!symbols.contains(needle), "{needle} symbol in the production build");
    }
    assert!(!has("HANDLE_GONE"), "HANDLE_GONE in the production build");
    // The test kit is a crate of its own (testkit/): none of its items, and
    // nothing of what it links, is in the production crate.
    for needle in ["TestRegistrar", "LinearizabilityTester", "replay_trace", "OpGen", "GenRegistrar"] {
        assert!(!symbols.contains(needle), "{needle} symbol in the production build");
        assert!(!has(needle), "{needle} (the test kit) in the production build");
    }
    for needle in ["mrcache_testkit", "mrcache_model", "stateright"] {
        assert!(!symbols.contains(needle), "{needle} symbol in the production build");
    }
}

#[test]
fn a_library_user_gets_neither_the_model_nor_stateright() {
    let dir = root().join("target/production/user");
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"mrcache-user\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n\
             [dependencies]\nmrcache = {{ path = {:?} }}\n\n[workspace]\n",
            root().join("impl")
        ),
    )
    .unwrap();
    std::fs::write(dir.join("src/lib.rs"), "pub use mrcache::Cache;\n").unwrap();
    // The workspace's versions, so that the tree resolves offline.
    std::fs::copy(root().join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    let tree = run(Command::new(env!("CARGO")).args(["tree", "-e", "normal", "--offline", "--prefix", "none"]).current_dir(&dir));
    assert!(tree.contains("mrcache-types"), "{tree}");
    for unwanted in ["mrcache-model", "stateright"] {
        assert!(!tree.contains(unwanted), "a library user gets {unwanted}:\n{tree}");
    }
}
