//! Every step of spec.md's §A table is cited by both encodings of §A: the
//! checker's model and the real cache. (The citation check of the whole
//! repository is checker/tests/step_ids.rs.)

use mrcache_checker::{missing_step_ids, read_rust_sources, step_ids_in_spec};
use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_algorithm_step_is_tagged_in_checker_and_impl() {
    let spec = std::fs::read_to_string(root().join("spec.md")).unwrap();
    let steps = step_ids_in_spec(&spec);
    assert!(steps.len() >= 17, "the §A table lists its steps: {steps:?}");
    for dir in ["checker/src", "impl/src"] {
        let source = read_rust_sources(&root().join(dir)).unwrap();
        let missing = missing_step_ids(&spec, &source);
        assert!(missing.is_empty(), "{dir} lacks tags for {missing:?}");
    }
}

#[test]
fn the_scan_can_fail() {
    let spec = std::fs::read_to_string(root().join("spec.md")).unwrap();
    let missing = missing_step_ids(&spec, &format!("//= {}#A1\n// A2 mentioned in prose only\n", "spec.md"));
    assert!(missing.contains(&"A2".to_string()) && !missing.contains(&"A1".to_string()), "{missing:?}");
}
