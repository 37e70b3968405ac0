//! `mrcache check --pinned --threads3`, end to end: the parent runs each
//! configuration in a child process and reads back one line of tab-separated
//! fields, the last (the problems) empty when all is well.

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
