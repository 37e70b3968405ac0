//! Spec citations are checked (src/lib.rs), in the spirit of s2n-quic's
//! duvet: every `//#` quote is spec.md's text, every numbered item is cited
//! by the code that implements it and by a test that checks it (or listed in
//! spec-citations.txt with its own reason), and no citation names an item
//! spec.md does not have. And every step of spec.md's §A table is tagged
//! `//= spec.md#<ID>` by both encodings of §A: the checker's model and the
//! real cache.

use mrcache_citations::{self as citations, citations_in, missing_step_ids, spec_items, step_ids_in_spec, Problem};
use std::path::Path;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

#[test]
fn citations_are_verbatim_known_and_complete() {
    let report = citations::check(root()).unwrap();
    println!(
        "spec citations: {} citations ({} quotes) of {} numbered items; {} exceptions, each with its reason in {}",
        report.citations,
        report.quotes,
        report.items,
        report.exceptions,
        citations::EXCEPTIONS_FILE
    );
    let problems: Vec<String> = report.problems.iter().map(|p| p.to_string()).collect();
    assert!(problems.is_empty(), "{} citation problems:\n{}", problems.len(), problems.join("\n"));
    assert!(report.items >= 80 && report.quotes >= 60, "{report:?}");
}

/// A quote of the real spec passes; the same quote with one word changed fails.
#[test]
fn a_paraphrased_quote_fails() {
    let spec = std::fs::read_to_string(root().join("spec.md")).unwrap();
    let items = spec_items(&spec);
    let tag = format!("//= {}#LN1\n", "spec.md");
    let verbatim = tag.clone() + "//# if the queue is empty, the draining count is 0, and a slot of this\n//# thread's lane has exactly the request's key\n";
    let paraphrase = tag + "//# if the queue is empty and a slot of this thread's lane has exactly\n//# the request's key\n";
    let judge = |src: &str| {
        let c = citations_in("impl/src/x.rs", src);
        citations::check_citations(&items, &c, &[]).problems.into_iter().filter(|p| matches!(p, Problem::NotVerbatim { .. })).count()
    };
    assert_eq!(judge(&verbatim), 0);
    assert_eq!(judge(&paraphrase), 1);
}

#[test]
fn every_algorithm_step_is_tagged_in_checker_and_impl() {
    let spec = std::fs::read_to_string(root().join("spec.md")).unwrap();
    let ids = step_ids_in_spec(&spec);
    assert!(ids.len() >= 17, "the §A table lists its steps: {ids:?}");
    for id in ["A1", "A11", "R1", "R2", "H1", "H2", "M1", "M2", "A-D", "A-H"] {
        assert!(ids.iter().any(|i| i == id), "spec.md's §A table has no {id}: {ids:?}");
    }
    let steps = citations::check_steps(root()).unwrap();
    assert_eq!(steps.count, ids.len());
    for (dir, missing) in steps.untagged {
        assert!(missing.is_empty(), "steps of spec.md §A not tagged in {dir}: {missing:?}");
    }
}

#[test]
fn the_scan_can_fail() {
    let spec = std::fs::read_to_string(root().join("spec.md")).unwrap();
    let missing = missing_step_ids(&spec, &format!("//= {}#A1\n// A2 mentioned in prose only\n", "spec.md"));
    assert!(missing.contains(&"A2".to_string()) && !missing.contains(&"A1".to_string()), "{missing:?}");
}
