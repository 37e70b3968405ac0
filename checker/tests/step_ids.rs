//! Every step of spec.md's §A table is tagged `//= spec.md#<ID>` in checker/src.

use mrcache_checker::{missing_step_ids, read_rust_sources, step_ids_in_spec};
use std::path::Path;

#[test]
fn every_step_of_section_a_is_tagged_in_the_checker() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let spec = std::fs::read_to_string(root.join("../spec.md")).unwrap();
    let ids = step_ids_in_spec(&spec);
    for id in ["A1", "A11", "R1", "R2", "H1", "H2", "M1", "M2", "A-D", "A-H"] {
        assert!(ids.iter().any(|i| i == id), "spec.md's §A table has no {id}: {ids:?}");
    }
    let source = read_rust_sources(&root.join("src")).unwrap();
    let missing = missing_step_ids(&spec, &source);
    assert!(missing.is_empty(), "steps of spec.md §A not tagged in checker/src: {missing:?}");
}
