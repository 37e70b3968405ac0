//! `mrcache-citations [ROOT]`: the spec-citation check of the repository at
//! ROOT (default: the workspace this crate is in). Prints the counts of
//! citations and exceptions and every problem; exits 1 on any problem (a
//! quote that is not verbatim, an unknown or uncited item, a bad exception,
//! an untagged §A step, a coverage row naming what does not exist, a file
//! with atomics and no coverage row), 2 if the files cannot be read.

use mrcache_citations::{check, check_coverage, check_steps, EXCEPTIONS_FILE};
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let root =
        std::env::args_os().nth(1).map(PathBuf::from).unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")));
    let (report, steps, coverage) = match check(&root).and_then(|r| Ok((r, check_steps(&root)?, check_coverage(&root)?))) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mrcache-citations: {e}");
            return ExitCode::from(2);
        }
    };
    println!(
        "spec citations: {} citations ({} quotes) of {} numbered items; {} exceptions, each with its reason in {}",
        report.citations, report.quotes, report.items, report.exceptions, EXCEPTIONS_FILE
    );
    let mut problems: Vec<String> = report.problems.iter().map(|p| p.to_string()).collect();
    for (dir, missing) in &steps.untagged {
        if !missing.is_empty() {
            problems.push(format!("{dir}: steps of spec.md §A not tagged: {missing:?}"));
        }
    }
    let dirs: Vec<&str> = steps.untagged.iter().map(|(d, _)| *d).collect();
    println!("spec.md §A: {} steps, each tagged in {}", steps.count, dirs.join(" and "));
    println!("spec.md coverage table: {} rows; {} source files with atomics, each named by a row", coverage.rows, coverage.atomic_files);
    problems.extend(coverage.problems);
    if problems.is_empty() {
        return ExitCode::SUCCESS;
    }
    eprintln!("{} citation problems:\n{}", problems.len(), problems.join("\n"));
    ExitCode::FAILURE
}
