//! The real peers (UCX, Open MPI grdma, libfabric's MR cache) and mrcache
//! against the verdict table of CONFORMANCE.md: every peer that could be
//! built here is run, and each case's verdict must be one the table lists,
//! under glibc's allocator and under jemalloc and mimalloc (`--preload`),
//! so a change in a peer shows as a failure naming the case. A peer whose
//! library or source is missing is skipped with the build script's reason.
//! Full tier: ignored by `cargo test`, run by ci/full.sh (`-- --ignored`).

use mrcache_cli::conform::{self, ConformArgs};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// case -> one cell per column, each a list of allowed verdicts.
fn table() -> (Vec<String>, BTreeMap<String, Vec<Vec<String>>>) {
    let text = std::fs::read_to_string(root().join("CONFORMANCE.md")).expect("CONFORMANCE.md");
    let start = text.find("<!-- verdicts").expect("the verdict table's start marker");
    let end = text.find("<!-- end verdicts -->").expect("the verdict table's end marker");
    let cells = |l: &str| l.trim().trim_matches('|').split('|').map(|c| c.trim().to_string()).collect::<Vec<_>>();
    let mut lines = text[start..end].lines().filter(|l| l.starts_with('|'));
    let header = cells(lines.next().expect("a header row"));
    let mut rows = BTreeMap::new();
    for l in lines.filter(|l| !l.starts_with("|---")) {
        let c = cells(l);
        assert_eq!(c.len(), header.len(), "CONFORMANCE.md row `{l}`");
        rows.insert(c[0].clone(), c[1..].iter().map(|x| x.split(" / ").map(String::from).collect()).collect());
    }
    (header[1..].to_vec(), rows)
}

#[test]
#[ignore = "full tier: ci/full.sh"]
fn every_available_peer_matches_the_verdict_table() {
    let out = root().join("target/conform-adapters");
    let st = Command::new("bash").arg(root().join("conformance/adapters/build.sh")).arg(&out).status().expect("bash runs");
    assert!(st.success(), "conformance/adapters/build.sh failed");
    let skipped = std::fs::read_to_string(out.join("skipped.txt")).unwrap_or_default();
    let (columns, rows) = table();
    let bin = env!("CARGO_BIN_EXE_mrcache");
    let adapters: Vec<(&str, String, Option<PathBuf>)> = vec![
        ("mrcache", format!("{bin} adapter --policy merge"), None),
        ("ucx", out.join("ucx").display().to_string(), Some(out.join("ucx"))),
        ("ompi", out.join("ompi").display().to_string(), Some(out.join("ompi"))),
        ("libfabric", out.join("libfabric").display().to_string(), Some(out.join("libfabric"))),
        ("libfabric", format!("{} --uffd", out.join("libfabric").display()), Some(out.join("libfabric"))),
    ];
    assert_eq!(columns.len(), adapters.len(), "CONFORMANCE.md's verdict table has one column per adapter");
    let mut diffs = Vec::new();
    for (col, (label, cmd, path)) in adapters.iter().enumerate() {
        if let Some(p) = path {
            if !p.exists() {
                let why = skipped.lines().find(|l| l.starts_with(label)).unwrap_or("not built");
                eprintln!("conformance_peers: skipping {label}: {why}");
                continue;
            }
        }
        // Under glibc's allocator, then under each of the others
        // (CONFORMANCE.md: the same verdicts, but for the cases that script
        // glibc's malloc, free or brk, which are unsupported there).
        for preload in [None, Some("jemalloc"), Some("mimalloc")] {
            let mut args = ConformArgs::new(cmd.clone(), root().join("conformance/cases"));
            args.preload = preload.map(String::from);
            let r = conform::run(&args).expect("the suite runs");
            eprintln!("{}", conform::table(&r));
            assert_eq!(r.results.len(), rows.len(), "{label}: the table and conformance/cases/ list different cases");
            for x in &r.results {
                // A P2 cell says whether stale data was observed (CaseResult::cell).
                let got = x.cell();
                let allowed = rows.get(&x.case).map(|c| c[col].clone()).unwrap_or_default();
                let glibc_only = preload.is_some() && got == "unsupported" && x.detail.contains("as glibc serves them");
                if !allowed.contains(&got) && !glibc_only {
                    diffs.push(format!(
                        "{} ({cmd}{}): {} is `{got}`, CONFORMANCE.md says `{}`: {} (case line {})",
                        columns[col],
                        preload.map(|p| format!(", --preload {p}")).unwrap_or_default(),
                        x.case,
                        allowed.join(" / "),
                        x.detail,
                        x.line
                    ));
                }
            }
        }
    }
    assert!(diffs.is_empty(), "verdicts differ from CONFORMANCE.md:\n{}", diffs.join("\n"));
}
