//! The CLI's small edges: a flag the chosen engine
//! cannot honour is an error, not ignored; `--seconds 0` is refused, not
//! rounded up; `report --plot` checks its directory before the work; and a
//! closed pipe ends the process quietly, never with a panic (status 101).

use std::path::PathBuf;
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn mrcache(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mrcache")).args(args).current_dir(root()).output().expect("mrcache runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn replay_refuses_impl_flags_with_the_model_engine() {
    let o = mrcache(&["replay", "--monitor", "uffd", "traces/fork-and-flush.jsonl"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--monitor applies to --engine impl only"), "{}", stderr(&o));
    let o = mrcache(&["replay", "--registrar", "uring", "traces/fork-and-flush.jsonl"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--registrar applies to --engine impl only"), "{}", stderr(&o));
    // The model engine with the defaults still runs.
    let o = mrcache(&["replay", "traces/fork-and-flush.jsonl"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn fuzz_refuses_zero_seconds() {
    let o = mrcache(&["fuzz", "--seconds", "0"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("'--seconds <SECONDS>'"), "{}", stderr(&o));
}

#[test]
fn report_checks_its_plot_directory_before_the_work() {
    let o = mrcache(&["report", "--plot", "/proc/nope", "--cost-model", "none", "traces/fork-and-flush.jsonl"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--plot /proc/nope: cannot create the directory"), "{}", stderr(&o));
    assert!(o.stdout.is_empty(), "no tables before the error");
}

#[test]
fn a_closed_pipe_ends_the_process_quietly() {
    use std::os::unix::process::ExitStatusExt;
    // stdout and stderr both a pipe whose reader is gone before it starts
    // (`... 2>&1 | head -1` once head has left): every write is EPIPE.
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let status = Command::new(env!("CARGO_BIN_EXE_mrcache"))
        .args(["check", "--mutant", "no-seq-recheck"])
        .current_dir(root())
        .stdout(writer.try_clone().expect("dup"))
        .stderr(writer)
        .status()
        .expect("mrcache runs");
    // The default end of a writer whose reader left (the shell's 141), not
    // a panic in print! (101).
    assert_eq!(status.signal(), Some(libc::SIGPIPE), "{status:?}");
}
