//! The implementer's recipe of docs/conformance-protocol.md ("Running the
//! suite on your own cache"), run as written: every command of its block but
//! the build (this test's own `mrcache` is on PATH instead), from the
//! checkout, with a scratch HOME. A command whose comment says "exit status
//! 1" must exit 1, every other one 0, and the whole recipe must take well
//! under its 10 minutes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The recipe's commands, each with its trailing comment.
fn recipe() -> Vec<(String, String)> {
    let doc = std::fs::read_to_string(root().join("docs/conformance-protocol.md")).expect("the protocol document");
    let start = doc.find("<!-- recipe:").expect("the recipe's start marker");
    let end = doc.find("<!-- end recipe -->").expect("the recipe's end marker");
    let block = &doc[start..end];
    let code = block.split("```sh").nth(1).and_then(|b| b.split("```").next()).expect("a ```sh block in the recipe");
    code.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| match l.split_once("  #") {
            Some((cmd, comment)) => (cmd.trim().to_string(), comment.trim().to_string()),
            None => (l.to_string(), String::new()),
        })
        .collect()
}

#[test]
fn the_implementers_recipe_runs_as_written_with_the_toy() {
    let steps = recipe();
    assert!(steps.iter().any(|(c, _)| c.starts_with("cargo build")), "the recipe builds the runner");
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_mrcache")).parent().expect("the binary's directory").to_path_buf();
    let home = std::env::temp_dir().join(format!("mrcache-recipe-{}", std::process::id()));
    std::fs::create_dir_all(&home).expect("a scratch HOME");
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let start = Instant::now();
    let mut ran = 0;
    for (cmd, comment) in &steps {
        if cmd.starts_with("cargo build") || cmd.starts_with("export PATH=") {
            continue;
        }
        let out =
            Command::new("bash").arg("-c").arg(cmd).current_dir(root()).env("HOME", &home).env("PATH", &path).output().expect("bash runs");
        let want = if comment.contains("exit status 1") { 1 } else { 0 };
        assert_eq!(
            out.status.code(),
            Some(want),
            "recipe step `{cmd}` exited {:?}, the recipe says {want}\nstdout:\n{}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        if cmd.starts_with("mrcache conform") {
            let seen = if want == 0 { text.contains(" pass ") && text.contains("0 fail") } else { text.contains(" fail ") };
            assert!(seen, "`{cmd}`:\n{text}");
        }
        ran += 1;
    }
    let _ = std::fs::remove_dir_all(&home);
    assert!(ran >= 4, "{ran} recipe steps ran");
    assert!(start.elapsed() < Duration::from_secs(300), "the recipe took {:?}", start.elapsed());
}
