//! `mrcache check --pinned --threads3`, end to end (the parent runs each
//! configuration in a child process and reads back one line of tab-separated
//! fields, the last (the problems) empty when all is well), and a 3-thread
//! violation found late.

use std::process::Command;

#[test]
fn a_three_thread_configuration_that_holds_passes() {
    let o = Command::new(env!("CARGO_BIN_EXE_mrcache"))
        .args(["check", "--pinned", "--threads3", "--only", "lookup-skips independent async", "--workers", "1"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("mrcache runs");
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{text}");
    let row = text.lines().find(|l| l.starts_with("lookup-skips independent async")).unwrap_or_else(|| panic!("no row: {text}"));
    assert!(row.contains("32623") && row.trim_end().ends_with("ok"), "{row}");
    assert!(text.contains("1 configurations at 3 threads, 0 failed"), "{text}");
}

/// A violation found past `SHORTEST_RERUN_MAX_STATES` is reported with the
/// engine's own path instead of a BFS re-run that keeps whole states (it
/// filled 14 GiB in three minutes here). The input is a real finding, now
/// the mutant `lane-undo-despite-pin`: the `lanes+note` scripts with a third
/// thread's madvise broke S9 while LN1 undid its count despite the pin (see
/// docs/checking.md, "A finding at 3 threads"); the fixed LN1 passes them in
/// the full tier (`lanes+note` in `mrcache check --pinned --threads3`).
#[test]
fn a_violation_found_late_keeps_the_engines_path() {
    let o = Command::new(env!("CARGO_BIN_EXE_mrcache"))
        .args([
            "check",
            "--scripts",
            "traces/checker/lanes-note-3-threads.jsonl",
            "--mutant",
            "lane-undo-despite-pin",
            "--lanes",
            "--max-regions",
            "1",
            "--policy",
            "independent",
            "--monitor",
            "sync",
            "--workers",
            "2",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("mrcache runs");
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(text.contains("spec.md#S9   VIOLATED"), "{text}");
    assert!(text.contains("hit on R1, but the limits evicted it"), "{text}");
    assert!(text.contains("the fingerprint engine's path") && text.contains("not a shortest one"), "{text}");
}
