//! CONFORMANCE.md's prose, checked: every paragraph,
//! list item and table row that states a peer's behaviour (it names UCX,
//! Open MPI/grdma, libfabric or mrcache, or is a row of a table whose header
//! names one) cites the case file or the standalone reproducer that shows
//! it, and every cited case or reproducer exists (a reproducer also has a
//! row in conformance/reproducers/expected.tsv).
//!
//! Checked: from the end of the verdict table (`<!-- end verdicts -->`) to
//! `## Not covered`. The verdict table itself is checked against the runs by
//! tests/conformance_peers.rs. A citation is a path:
//! `conformance/cases/NAME.jsonl`, `conformance/reproducers/PEER/NAME.c`,
//! or `conformance/cases/` for a claim about every case.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Words that make a block a claim about a peer.
const PEERS: [&str; 7] = ["UCX", "UCM", "Open MPI", "grdma", "libfabric", "memhooks", "mrcache"];

/// One paragraph, list item (with its continuation lines) or table row.
#[derive(Debug)]
struct Block {
    line: usize,
    text: String,
    /// A table row under a header that names a peer.
    peer_table_row: bool,
}

/// The blocks of `text` between `start` and `end` (line markers); fenced
/// code and headings are not blocks.
fn blocks(text: &str, start: &str, end: &str) -> Result<Vec<Block>, String> {
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.iter().position(|l| l.contains(start)).ok_or_else(|| format!("no line contains `{start}`"))?;
    let to = lines.iter().position(|l| l.starts_with(end)).ok_or_else(|| format!("no line starts with `{end}`"))?;
    let mut out: Vec<Block> = Vec::new();
    let mut cur: Option<Block> = None;
    let mut fenced = false;
    let mut table_header: Option<String> = None;
    let flush = |cur: &mut Option<Block>, out: &mut Vec<Block>| {
        if let Some(b) = cur.take() {
            out.push(b);
        }
    };
    for (i, l) in lines.iter().enumerate().take(to).skip(from + 1) {
        let n = i + 1;
        let t = l.trim_start();
        if t.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        if t.starts_with('|') {
            flush(&mut cur, &mut out);
            match &table_header {
                None => table_header = Some(t.to_string()),
                Some(_) if t.starts_with("|---") => {}
                Some(h) => {
                    let peer_table_row = PEERS.iter().any(|p| h.contains(p));
                    out.push(Block { line: n, text: t.to_string(), peer_table_row });
                }
            }
            continue;
        }
        table_header = None;
        if t.is_empty() || t.starts_with('#') || t.starts_with("<!--") {
            flush(&mut cur, &mut out);
            continue;
        }
        if t.starts_with("- ") {
            flush(&mut cur, &mut out);
        }
        match cur.as_mut() {
            Some(b) => {
                b.text.push(' ');
                b.text.push_str(t);
            }
            None => cur = Some(Block { line: n, text: t.to_string(), peer_table_row: false }),
        }
    }
    flush(&mut cur, &mut out);
    Ok(out)
}

/// Every `conformance/cases/...` or `conformance/reproducers/...` path in `s`.
fn cited_paths(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    for prefix in ["conformance/cases/", "conformance/reproducers/"] {
        let mut rest = s;
        while let Some(i) = rest.find(prefix) {
            let tail = &rest[i..];
            let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || "/._-*".contains(c))).unwrap_or(tail.len());
            out.push(tail[..end].trim_end_matches('.').to_string());
            rest = &tail[end..];
        }
    }
    out
}

/// A path that counts as a citation of a claim.
fn is_citation(p: &str) -> bool {
    p == "conformance/cases/"
        || (p.starts_with("conformance/cases/") && p.ends_with(".jsonl"))
        || (p.starts_with("conformance/reproducers/") && p.ends_with(".c") && p.matches('/').count() == 3)
}

/// (peer, program) of each row of expected.tsv.
fn reproducers(root: &Path) -> Result<BTreeSet<(String, String)>, String> {
    let p = root.join("conformance/reproducers/expected.tsv");
    let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    Ok(text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let mut f = l.split('\t');
            Some((f.next()?.to_string(), f.next()?.to_string()))
        })
        .collect())
}

/// Every problem with the citations of `text` (`file` names it in messages).
fn problems(text: &str, file: &str, root: &Path) -> Result<Vec<String>, String> {
    let known = reproducers(root)?;
    let mut out = Vec::new();
    for (n, l) in text.lines().enumerate() {
        for p in cited_paths(l) {
            if !root.join(&p).exists() {
                out.push(format!("{file}:{}: cites `{p}`, which does not exist", n + 1));
                continue;
            }
            if let Some(rel) = p.strip_prefix("conformance/reproducers/").and_then(|r| r.strip_suffix(".c")) {
                if let Some((peer, prog)) = rel.split_once('/') {
                    if !known.contains(&(peer.to_string(), prog.to_string())) {
                        out.push(format!("{file}:{}: cites `{p}`, which conformance/reproducers/expected.tsv does not list", n + 1));
                    }
                }
            }
        }
    }
    for b in blocks(text, "<!-- end verdicts -->", "## Not covered")? {
        let claim = b.peer_table_row || PEERS.iter().any(|p| b.text.contains(p));
        if claim && !cited_paths(&b.text).iter().any(|p| is_citation(p)) {
            let head: String = b.text.chars().take(90).collect();
            out.push(format!("{file}:{}: a claim about a peer cites no case or reproducer: `{head}...`", b.line));
        }
    }
    Ok(out)
}

#[test]
fn every_claim_in_conformance_md_cites_an_existing_case_or_reproducer() {
    let text = std::fs::read_to_string(root().join("CONFORMANCE.md")).expect("CONFORMANCE.md");
    let p = problems(&text, "CONFORMANCE.md", &root()).unwrap_or_else(|e| panic!("CONFORMANCE.md: {e}"));
    assert!(p.is_empty(), "{} problem(s):\n{}", p.len(), p.join("\n"));
}

/// libfabric's memhooks monitor is STALE in race-hook-before-release: the
/// finding is in CONFORMANCE.md, citing its reproducer.
#[test]
fn the_libfabric_memhooks_hook_before_release_finding_is_stated() {
    let text = std::fs::read_to_string(root().join("CONFORMANCE.md")).expect("CONFORMANCE.md");
    let b = blocks(&text, "<!-- end verdicts -->", "## Not covered").expect("the checked part");
    assert!(
        b.iter().any(|b| b.text.contains("conformance/reproducers/libfabric/race-hook-before-release.c") && b.text.contains("STALE")),
        "no paragraph states libfabric's STALE race-hook-before-release with its reproducer"
    );
}

/// The checker finds what it is for: an uncited claim, a cited case that
/// does not exist, a reproducer expected.tsv does not list; it accepts a
/// cited claim and a paragraph that is no claim.
#[test]
fn the_checker_finds_uncited_claims_and_missing_paths() {
    let md = "intro\n<!-- end verdicts -->\n\
              - UCX does X (conformance/cases/seed-redux.jsonl).\n\
              - Open MPI does Y\n  over two lines.\n\n\
              Classification: no peer named here.\n\n\
              ```\nUCX in a code block\n```\n\
              | property | UCX | libfabric |\n|---|---|---|\n| P1 | holds | holds |\n| P2 | see conformance/cases/ | x |\n\n\
              - libfabric: conformance/cases/no-such-case.jsonl\n\
              - grdma: conformance/reproducers/grdma/no-such.c\n\
              ## Not covered\n- UCX not covered\n";
    let p = problems(md, "t.md", &root()).expect("parses");
    let has = |at: &str, what: &str| p.iter().any(|x| x.starts_with(at) && x.contains(what));
    assert!(has("t.md:4:", "cites no case"), "{p:#?}");
    assert!(has("t.md:14:", "cites no case"), "{p:#?}");
    assert!(has("t.md:17:", "no-such-case.jsonl`, which does not exist"), "{p:#?}");
    assert!(has("t.md:18:", "no-such.c`, which does not exist"), "{p:#?}");
    assert_eq!(p.len(), 4, "{p:#?}");
}
