//! The real peers (UCX, Open MPI grdma, libfabric's MR cache) and mrcache
//! against the verdict table of CONFORMANCE.md: every peer that could be
//! built here is run, and each case's verdict must be one the table lists,
//! under glibc's allocator and under jemalloc and mimalloc (`--preload`),
//! so a change in a peer shows as a failure naming the case. A peer whose
//! library or source is missing is skipped with the build script's reason.
//! Full tier: ignored by `cargo test`, run by ci/full.sh (`-- --ignored`).
//!
//! The table has a column for Debian 12's version of each peer and one for
//! its current release (conformance/upstream/build.sh builds those into
//! target/upstream/). A current release's cell is its verdict, then, when it
//! or the Debian cell fails, ` — *MARK*`: `still failing` (both fail),
//! `fixed in VERSION` (only Debian's fails), `new in VERSION` (only the
//! current release fails). The marks are checked against the two cells by
//! the fast tier (`every_mark_agrees_with_its_two_cells`).

use mrcache_cli::conform::{self, ConformArgs};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One cell of the verdict table: the verdicts allowed (`a / b`: either was
/// observed) and the mark of a current release's cell.
#[derive(Clone, Debug, Default)]
struct Cell {
    verdicts: Vec<String>,
    mark: Option<String>,
}

/// The separator of a cell's verdicts and its mark.
const MARK: &str = " — ";

fn cell(text: &str) -> Cell {
    let (v, mark) = match text.split_once(MARK) {
        Some((v, m)) => (v, Some(m.trim().trim_matches('*').to_string())),
        None => (text, None),
    };
    Cell { verdicts: v.split(" / ").map(String::from).collect(), mark }
}

/// The columns (without `case`) and case -> one cell per column.
type Table = (Vec<String>, BTreeMap<String, Vec<Cell>>);

/// The verdict table of `text` (CONFORMANCE.md).
fn parse_table(text: &str) -> Result<Table, String> {
    let start = text.find("<!-- verdicts").ok_or("no verdict table start marker")?;
    let end = text.find("<!-- end verdicts -->").ok_or("no verdict table end marker")?;
    let cells = |l: &str| l.trim().trim_matches('|').split('|').map(|c| c.trim().to_string()).collect::<Vec<_>>();
    let mut lines = text[start..end].lines().filter(|l| l.starts_with('|'));
    let header = cells(lines.next().ok_or("no header row")?);
    let mut rows = BTreeMap::new();
    for l in lines.filter(|l| !l.starts_with("|---")) {
        let c = cells(l);
        if c.len() != header.len() {
            return Err(format!("row `{l}` has {} cells, the header {}", c.len(), header.len()));
        }
        rows.insert(c[0].clone(), c[1..].iter().map(|x| cell(x)).collect());
    }
    Ok((header[1..].to_vec(), rows))
}

fn table() -> Table {
    let text = std::fs::read_to_string(root().join("CONFORMANCE.md")).expect("CONFORMANCE.md");
    parse_table(&text).unwrap_or_else(|e| panic!("CONFORMANCE.md: {e}"))
}

/// Each current release's column: (its header, the header of Debian's
/// version of the same peer and monitor, the current version).
const CURRENT: [(&str, &str, &str); 4] = [
    ("UCX 1.22.0", "UCX 1.13.1", "1.22.0"),
    ("Open MPI 5.0.10 grdma", "Open MPI 4.1.4 grdma", "5.0.10"),
    ("libfabric 2.6.0 (memhooks)", "libfabric 1.17.0 (memhooks)", "2.6.0"),
    ("libfabric 2.6.0 (userfaultfd)", "libfabric 1.17.0 (userfaultfd)", "2.6.0"),
];

/// A cell fails when any verdict it allows is neither `pass` nor
/// `unsupported`.
fn fails(c: &Cell) -> bool {
    c.verdicts.iter().any(|v| v != "pass" && v != "unsupported")
}

/// Every disagreement between a current release's mark and what its cell
/// and Debian's say; a Debian cell carries no mark.
fn mark_problems(columns: &[String], rows: &BTreeMap<String, Vec<Cell>>) -> Vec<String> {
    let mut out = Vec::new();
    let col = |h: &str| columns.iter().position(|c| c == h);
    for (case, cells) in rows {
        for (i, c) in cells.iter().enumerate() {
            if c.mark.is_some() && !CURRENT.iter().any(|(h, _, _)| columns[i] == *h) {
                out.push(format!("{case}, {}: a mark in a column that is no current release's", columns[i]));
            }
        }
        for (cur, deb, version) in CURRENT {
            let (Some(ci), Some(di)) = (col(cur), col(deb)) else {
                out.push(format!("no column `{cur}` or `{deb}`"));
                continue;
            };
            let (c, d) = (&cells[ci], &cells[di]);
            let want = match (fails(d), fails(c)) {
                (true, true) => Some("still failing".to_string()),
                (true, false) if c.verdicts.iter().all(|v| v == "pass") => Some(format!("fixed in {version}")),
                (true, false) => Some("not comparable".to_string()),
                (false, true) => Some(format!("new in {version}")),
                (false, false) => None,
            };
            if c.mark != want {
                out.push(format!("{case}, {cur}: marked {:?}, the cells say {:?}", c.mark, want));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[test]
fn every_mark_agrees_with_its_two_cells() {
    let (columns, rows) = table();
    let p = mark_problems(&columns, &rows);
    assert!(p.is_empty(), "CONFORMANCE.md's verdict table:\n{}", p.join("\n"));
}

/// The mark checker catches a missing, a wrong and a misplaced mark, and
/// accepts right ones.
#[test]
fn the_mark_checker_finds_wrong_marks() {
    let head = "<!-- verdicts -->\n| case | UCX 1.13.1 | Open MPI 4.1.4 grdma | libfabric 1.17.0 (memhooks) | \
                libfabric 1.17.0 (userfaultfd) | UCX 1.22.0 | Open MPI 5.0.10 grdma | libfabric 2.6.0 (memhooks) | \
                libfabric 2.6.0 (userfaultfd) |\n|---|---|---|---|---|---|---|---|---|\n";
    let md = |row: &str| format!("{head}{row}\n<!-- end verdicts -->\n");
    let problems = |row: &str| {
        let (c, r) = parse_table(&md(row)).unwrap();
        mark_problems(&c, &r)
    };
    let good = "| a | fail L2 | fail C1 / pass | pass | pass | pass — *fixed in 1.22.0* | fail C1 — *still failing* | \
                fail crash — *new in 2.6.0* | pass |";
    assert_eq!(problems(good), Vec::<String>::new());
    let missing = good.replace(" — *new in 2.6.0*", "");
    assert_eq!(problems(&missing).len(), 1, "{:?}", problems(&missing));
    let wrong = good.replace("fixed in 1.22.0", "still failing");
    assert_eq!(problems(&wrong).len(), 1, "{:?}", problems(&wrong));
    let misplaced = good.replace("| fail L2 |", "| fail L2 — *still failing* |");
    assert!(problems(&misplaced).iter().any(|p| p.contains("no current release")), "{:?}", problems(&misplaced));
    assert!(parse_table(&md("| a | pass |")).is_err());
}

#[test]
#[ignore = "full tier: ci/full.sh"]
fn every_available_peer_matches_the_verdict_table() {
    let out = root().join("target/conform-adapters");
    // The current releases first (cached; a release that does not build is
    // skipped below with its reason, as a missing Debian peer is).
    // CONFORMANCE_PEERS=label,label runs only those adapters (labels as
    // below; `libfabric` is both of its monitors) and builds only the
    // current releases among them.
    let only = std::env::var("CONFORMANCE_PEERS").ok();
    let releases: Vec<&str> = ["ucx-1.22.0", "ompi-5.0.10", "libfabric-2.6.0"]
        .into_iter()
        .filter(|r| only.as_deref().is_none_or(|o| o.split(',').any(|x| x == *r)))
        .collect();
    let st = if releases.is_empty() {
        Command::new("true").status().expect("true runs")
    } else {
        Command::new("bash").arg(root().join("conformance/upstream/build.sh")).args(&releases).status().expect("bash runs")
    };
    if !st.success() {
        eprintln!("conformance_peers: conformance/upstream/build.sh failed: target/upstream/failed.txt");
    }
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
        ("ucx-1.22.0", out.join("ucx-1.22.0").display().to_string(), Some(out.join("ucx-1.22.0"))),
        ("ompi-5.0.10", out.join("ompi-5.0.10").display().to_string(), Some(out.join("ompi-5.0.10"))),
        ("libfabric-2.6.0", out.join("libfabric-2.6.0").display().to_string(), Some(out.join("libfabric-2.6.0"))),
        ("libfabric-2.6.0", format!("{} --uffd", out.join("libfabric-2.6.0").display()), Some(out.join("libfabric-2.6.0"))),
    ];
    assert_eq!(columns.len(), adapters.len(), "CONFORMANCE.md's verdict table has one column per adapter");
    let mut diffs = Vec::new();
    for (col, (label, cmd, path)) in adapters.iter().enumerate() {
        if only.as_deref().is_some_and(|o| !o.split(',').any(|x| x == *label)) {
            continue;
        }
        if let Some(p) = path {
            if !p.exists() {
                let why = skipped.lines().find(|l| l.starts_with(&format!("{label}:"))).unwrap_or("not built");
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
            // The raw output of every run, kept: target/conformance-runs/.
            let runs = root().join("target/conformance-runs");
            let name = format!(
                "{col}-{label}{}{}.txt",
                if cmd.ends_with("--uffd") { "-uffd" } else { "" },
                preload.map(|p| format!("-{p}")).unwrap_or_default()
            );
            let _ = std::fs::create_dir_all(&runs);
            let _ = std::fs::write(runs.join(name), format!("{cmd}\n{}", conform::table(&r)));
            assert_eq!(r.results.len(), rows.len(), "{label}: the table and conformance/cases/ list different cases");
            for x in &r.results {
                // A P2 cell says whether stale data was observed (CaseResult::cell).
                let got = x.cell();
                let allowed = rows.get(&x.case).map(|c| c[col].verdicts.clone()).unwrap_or_default();
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
