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
    let verbatim = tag.clone()
        + "//# if the queue is empty, the draining count is 0, and a slot of this\n//# thread's lane has exactly the request's key\n";
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

/// spec.md's coverage table names only steps, loom models, mutants and files
/// that exist, and every source file with an atomic in the concurrent code;
/// without the rows of one such file, it fails.
#[test]
fn the_coverage_table_is_complete_and_names_what_exists() {
    let coverage = citations::check_coverage(root()).unwrap();
    assert!(coverage.problems.is_empty(), "coverage table:\n{}", coverage.problems.join("\n"));
    assert!(coverage.rows >= 30 && coverage.atomic_files >= 25, "{coverage:?}");
    let spec = std::fs::read_to_string(root().join("spec.md")).unwrap();
    let rows = citations::coverage_rows(&spec).unwrap();
    assert!(rows.iter().any(|r| r.code.iter().any(|f| f == "capi/src/threads.rs")));
    let without: String = spec.lines().filter(|l| !l.contains("`capi/src/threads.rs`")).map(|l| format!("{l}\n")).collect();
    let files = vec!["capi/src/threads.rs".to_string()];
    let c = citations::check_coverage_of(&without, &|_| true, "", "", "", &files);
    assert!(c.problems.iter().any(|p| p.starts_with("capi/src/threads.rs: has atomics")), "{:?}", c.problems);
}
