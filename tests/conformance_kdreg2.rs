//! CONFORMANCE.md's "kdreg2 (model)" table, checked: kdreg2 cannot be loaded
//! here, so each case is judged on the model checker's kdreg2 monitor
//! (`--monitor kdreg2`, checker/src/algo/kdreg2.rs) under libfabric's
//! policy, not run. A case whose records are acquires, releases and memory
//! calls that release pages (munmap, madvise, mmap over, mremap) becomes
//! checker scripts: one script per thread, each release a `release_event`
//! on the thread that makes it; mappings anew, data commands and `continue`
//! drop out (the checker explores every interleaving of the threads, the
//! evictor and the kernel worker, the case's pause among them). Every other
//! case is "not modelled", for the reason [`translate`] gives.
//!
//! `KDREG2_SCRIPTS_OUT=DIR` also writes each translation to DIR as a trace
//! that `mrcache check --monitor kdreg2 --policy
//! no-merge-uncache-contained --scripts FILE` runs.

use mrcache_checker::{check, config::compact_pages, CheckConfig, MonitorKind, RunOptions};
use mrcache_model::OverlapPolicy;
use mrcache_types::Op;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The case as a checker-script trace (JSON lines) and its limits, or why
/// it cannot be one.
fn translate(case: &str) -> Result<(String, Option<u64>), String> {
    let mut lines = case.lines().filter(|l| !l.trim().is_empty());
    let header: Value = serde_json::from_str(lines.next().ok_or("empty case")?).map_err(|e| e.to_string())?;
    let needs: Vec<&str> = header["needs"].as_array().map(|a| a.iter().filter_map(|v| v.as_str()).collect()).unwrap_or_default();
    for (need, why) in [
        ("fork", "no fork in the model (the module refuses a forked child's calls: kdreg2_detect_fork)"),
        ("destroy", "no cache destroy or create in the model"),
        ("flush", "no flush in the model"),
        ("during_register", "no registrar that releases memory inside its call in the kdreg2 model"),
    ] {
        if needs.contains(&need) {
            return Err(why.into());
        }
    }
    if header.get("preload").is_some() {
        return Err("an allocator's own traffic (addresses known only at run time)".into());
    }
    if header.get("max_pinned_bytes").is_some() {
        return Err("no byte limit in these translations".into());
    }
    let max_regions = header.get("max_regions").and_then(|v| v.as_u64());
    let mut out = vec![r#"{"mrcache_trace": 1, "source": "hand-written", "description": "a conformance case as checker scripts (tests/conformance_kdreg2.rs)", "concurrent": true}"#.to_string()];
    for l in lines {
        let r: Value = serde_json::from_str(l).map_err(|e| e.to_string())?;
        let thread = r.get("thread").and_then(|v| v.as_u64()).unwrap_or(0);
        if r.get("background").is_some() {
            return Err("a background thread's unbounded memory traffic".into());
        }
        if r.get("during_register").is_some() {
            return Err("no registrar that releases memory inside its call in the kdreg2 model".into());
        }
        if let Some(op) = r.get("op").and_then(|v| v.as_str()) {
            let mut rec = r.clone();
            let o = rec.as_object_mut().ok_or("a record is an object")?;
            o.remove("pause");
            o.insert("thread".into(), thread.into());
            match op {
                "acquire" | "release" => out.push(Value::Object(o.clone()).to_string()),
                other => return Err(format!("no `{other}` in the model")),
            }
        } else if let Some(mem) = r.get("mem").and_then(|v| v.as_str()) {
            match mem {
                "mmap" => continue,
                "unmap_map_cycles" => {
                    return Err("thousands of unmap/map cycles under a resident-set bound (L2): past exhaustive reach, and the model's event queue is unbounded".into())
                }
                "malloc" | "free" | "brk_grow" | "brk_shrink" | "scratch" => {
                    return Err("allocator or brk traffic (addresses known only at run time)".into())
                }
                _ => {}
            }
            let addr = r["addr"].as_str().ok_or("a memory record has an addr")?;
            let len = r["len"].as_u64().ok_or("a memory record has a len")?;
            let (kind, addr, len) = match mem {
                "munmap" => ("munmap", addr.to_string(), len),
                "madvise_dontneed" => ("madvise_dontneed", addr.to_string(), len),
                "madvise_free" => ("madvise_free", addr.to_string(), len),
                "mmap_fixed" => ("map_fixed_over", addr.to_string(), len),
                "mremap_move" => ("mremap_source", addr.to_string(), len),
                "mremap_shrink" => {
                    // The tail beyond the new length is unmapped.
                    let new_len = r["new_len"].as_u64().ok_or("mremap_shrink has a new_len")?;
                    let base = u64::from_str_radix(addr.trim_start_matches("0x"), 16).map_err(|e| e.to_string())?;
                    ("munmap", format!("{:#x}", base + new_len), len - new_len)
                }
                other => return Err(format!("no `{other}` in the translation")),
            };
            out.push(format!(r#"{{"thread": {thread}, "op": "release_event", "kind": "{kind}", "addr": "{addr}", "len": {len}}}"#));
        } else if let Some(ctl) = r.get("ctl").and_then(|v| v.as_str()) {
            match ctl {
                "continue" => {}
                "rss_mark" | "rss_check" => return Err("a resident-set bound (L2): the model's queue is unbounded".into()),
                other => return Err(format!("no `{other}` in the model")),
            }
        }
        // Data commands drop out: P2 judges the frames a lease pinned.
    }
    Ok((out.join("\n") + "\n", max_regions))
}

/// The model's verdict on a translated case: `pass`, or `fail PROPERTY (N
/// steps)` with the length of its first counterexample.
fn verdict(trace: &str, max_regions: Option<u64>) -> String {
    let t = mrcache_types::trace::Trace::parse("case", trace).unwrap();
    let mut by_thread: BTreeMap<u32, Vec<Op>> = BTreeMap::new();
    for r in &t.records {
        by_thread.entry(r.thread).or_default().push(r.op);
    }
    let scripts = compact_pages(&by_thread.into_values().collect::<Vec<_>>());
    let cfg = CheckConfig {
        scripts: Some(scripts),
        max_regions,
        ..CheckConfig::new(1, 1, OverlapPolicy::NoMergeUncacheContained, MonitorKind::Kdreg2)
    };
    let out = check(&cfg, &RunOptions { workers: 1, ..RunOptions::default() }).unwrap();
    match out.counterexample {
        Some(c) => format!("fail {} ({} steps", mrcache_checker::props::spec_id(c.property), c.actions.len()),
        None => {
            assert!(out.complete);
            "pass".into()
        }
    }
}

/// The table: case -> its cell.
fn table() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(root().join("CONFORMANCE.md")).unwrap();
    let start = text.find("<!-- kdreg2 model").expect("no kdreg2 model table start marker");
    let end = text.find("<!-- end kdreg2 model -->").expect("no kdreg2 model table end marker");
    let mut rows = BTreeMap::new();
    for l in text[start..end].lines().filter(|l| l.starts_with('|') && !l.starts_with("|---") && !l.starts_with("| case")) {
        let c: Vec<&str> = l.trim().trim_matches('|').split('|').map(|c| c.trim()).collect();
        assert_eq!(c.len(), 2, "row `{l}`");
        // The case cell is a link: [name](conformance/cases/name.jsonl).
        let name = c[0].trim_start_matches('[').split(']').next().unwrap().to_string();
        rows.insert(name, c[1].to_string());
    }
    rows
}

#[test]
fn every_kdreg2_model_cell_is_the_checkers_verdict() {
    let rows = table();
    let out_dir = std::env::var_os("KDREG2_SCRIPTS_OUT").map(PathBuf::from);
    let mut cases: Vec<PathBuf> = std::fs::read_dir(root().join("conformance/cases"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    cases.sort();
    let mut problems = Vec::new();
    for p in &cases {
        let name = p.file_stem().unwrap().to_string_lossy().to_string();
        let Some(cell) = rows.get(&name) else {
            problems.push(format!("{name}: no row"));
            continue;
        };
        let want = match translate(&std::fs::read_to_string(p).unwrap()) {
            Ok((trace, max_regions)) => {
                if let Some(d) = &out_dir {
                    std::fs::write(d.join(format!("{name}.jsonl")), &trace).unwrap();
                }
                verdict(&trace, max_regions)
            }
            Err(why) => format!("not modelled: {why}"),
        };
        // A failing cell goes on after its length: `steps): what fails`.
        let agrees = if want.starts_with("fail ") { cell.starts_with(&format!("{want})")) } else { cell == &want };
        if !agrees {
            problems.push(format!("{name}: the table says `{cell}`, the model `{want}`"));
        }
    }
    assert_eq!(rows.len(), cases.len(), "one row per case of conformance/cases/");
    assert!(problems.is_empty(), "CONFORMANCE.md's kdreg2 (model) table:\n{}", problems.join("\n"));
}

/// The translation keeps what the model needs: the pause's thread, the
/// releases, a shrink's tail; and refuses what it cannot express.
#[test]
fn translation_of_a_race_and_a_refusal() {
    let case = r#"{"mrcache_conformance": 1, "name": "x", "purpose": "p", "spec": ["P2"], "needs": ["pause"]}
{"op": "acquire", "lease": 1, "addr": "0x80000", "len": 8192, "access": "rw", "thread": 1, "pause": true}
{"mem": "mremap_shrink", "addr": "0x80000", "len": 16384, "new_len": 8192}
{"mem": "mmap", "addr": "0x82000", "len": 8192}
{"ctl": "continue", "thread": 1}
{"op": "release", "lease": 1}
"#;
    let (t, limits) = translate(case).unwrap();
    assert_eq!(limits, None);
    let recs: Vec<&str> = t.lines().skip(1).collect();
    assert_eq!(recs.len(), 3, "{t}");
    assert!(recs[0].contains(r#""thread":1"#) && !recs[0].contains("pause"), "{t}");
    assert!(recs[1].contains(r#""addr": "0x82000", "len": 8192"#), "{t}");
    let fork = r#"{"mrcache_conformance": 1, "name": "x", "purpose": "p", "spec": ["P2"], "needs": ["fork"]}"#;
    assert!(translate(fork).unwrap_err().contains("fork"));
}
