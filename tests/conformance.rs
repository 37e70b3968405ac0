//! The conformance suite (`mrcache conform`, docs/conformance-protocol.md):
//! mrcache passes every case under every policy; each deliberately broken
//! adapter (the toy cache's breaks, mrcache's fault switches) fails exactly
//! the cases checked in under conformance/expected/; every case fails under
//! at least one of them; hung, crashing and babbling adapters are reported
//! per case and the run goes on.

use mrcache_cli::conform::{self, Case, ConformArgs, RunReport, Verdict};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_mrcache")
}

fn args(adapter: String) -> ConformArgs {
    ConformArgs::new(adapter, root().join("conformance/cases"))
}

fn run(adapter: String) -> RunReport {
    conform::run(&args(adapter)).expect("the suite runs")
}

fn failing(r: &RunReport) -> BTreeSet<String> {
    r.results.iter().filter(|x| x.verdict == Verdict::Fail).map(|x| x.case.clone()).collect()
}

fn expected(label: &str) -> BTreeSet<String> {
    let p = root().join("conformance/expected").join(format!("{label}.txt"));
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect()
}

/// Every broken adapter, by the label of its expected-failures file. Each
/// declares no `l1_bound`, so it is judged on the rule it breaks: a break
/// that leaves registrations behind (most of them) would also fail `L1`
/// against the bound the adapters declare by default (see
/// tests/conformance_gaps.rs for L1 judged).
fn broken() -> Vec<(String, String)> {
    let mut v = Vec::new();
    for b in [
        "no-invalidation",
        "access-ignored",
        "dereg-while-leased",
        "dereg-twice",
        "hit-partially-freed",
        "no-rounding",
        "wrong-policy",
        "no-limits",
        "fork-keeps",
        "no-recheck",
        "hook-before-release",
        "inclusive-end",
        "lock-across-register",
        "unbounded-queue",
        "destroy-leased",
    ] {
        v.push((format!("toy-{b}"), format!("{} adapter --toy --break {b} --no-l1-bound", bin())));
    }
    for f in ["monitor-off", "skip-seq-recheck", "dereg-leased-on-invalidate", "fork-keeps-monitor"] {
        v.push((format!("mrcache-{f}"), format!("{} adapter --fault {f} --no-l1-bound", bin())));
    }
    v
}

/// mrcache passes every case under every policy: conformance/expected/mrcache.txt
/// is empty (it listed fork-child-unmap until F1 detached a fork child from
/// the parent's monitor; see CONFORMANCE.md).
#[test]
fn mrcache_passes_every_case_under_every_policy() {
    let known = expected("mrcache");
    for p in ["independent", "merge", "no-merge-uncache-contained"] {
        let r = run(format!("{} adapter --policy {p}", bin()));
        assert!(r.results.len() >= 20, "{} cases", r.results.len());
        assert_eq!(failing(&r), known, "policy {p}: mrcache's failures differ from conformance/expected/mrcache.txt");
        let bad: Vec<String> = r
            .results
            .iter()
            .filter(|x| x.verdict != Verdict::Pass && !known.contains(&x.case))
            .map(|x| format!("{} {} {} line {}: {}", x.case, x.verdict, x.rule, x.line, x.detail))
            .collect();
        assert!(bad.is_empty(), "policy {p}:\n{}\n{}", bad.join("\n"), conform::table(&r));
        assert_eq!(r.judged_under, p);
    }
}

/// Under jemalloc and mimalloc (`--preload`, Debian libjemalloc2 and
/// libmimalloc2.0, installed by ci/setup.sh), mrcache passes every case
/// that does not script glibc's malloc (those are `unsupported`).
#[test]
fn mrcache_passes_every_case_under_each_allocator() {
    for alloc in ["jemalloc", "mimalloc"] {
        let mut a = args(format!("{} adapter --policy merge", bin()));
        a.preload = Some(alloc.into());
        let r = conform::run(&a).expect("the suite runs");
        let bad: Vec<String> = r
            .results
            .iter()
            .filter(|x| x.verdict != Verdict::Pass && !(x.verdict == Verdict::Unsupported && x.detail.contains("as glibc serves them")))
            .map(|x| format!("{} {} {} line {}: {}", x.case, x.verdict, x.rule, x.line, x.detail))
            .collect();
        assert!(bad.is_empty(), "under {alloc}:\n{}\n{}", bad.join("\n"), conform::table(&r));
        let passed = r.results.iter().filter(|x| x.verdict == Verdict::Pass).count();
        assert!(passed >= 30, "under {alloc}: {passed} cases pass\n{}", conform::table(&r));
    }
}

#[test]
fn the_correct_toy_passes_every_case() {
    let r = run(format!("{} adapter --toy", bin()));
    assert!(failing(&r).is_empty(), "{}", conform::table(&r));
    assert!(r.results.iter().all(|x| x.verdict == Verdict::Pass), "{}", conform::table(&r));
}

#[test]
fn each_broken_adapter_fails_exactly_its_checked_in_cases() {
    let mut diffs = Vec::new();
    for (label, cmd) in broken() {
        // The toy that holds its lock across the registrar deadlocks on
        // itself: its hangs are found after a shorter timeout (its other
        // commands answer in milliseconds).
        let deadlocks = label == "toy-lock-across-register";
        let r = if deadlocks { conform::run(&ConformArgs { timeout: 2.0, ..args(cmd) }).expect("the suite runs") } else { run(cmd) };
        let got = failing(&r);
        let want = expected(&label);
        if got != want {
            diffs.push(format!(
                "{label}: fails {:?} but conformance/expected/{label}.txt says {:?}\n{}",
                got.difference(&want).collect::<Vec<_>>(),
                want.difference(&got).collect::<Vec<_>>(),
                conform::table(&r)
            ));
        }
        // A broken adapter fails on a property or C-rule (L2: pending
        // invalidations unbounded; a hang: a deadlock, P6), not on the
        // protocol.
        for x in r.results.iter().filter(|x| x.verdict == Verdict::Fail) {
            assert!(
                x.rule.starts_with('P') || x.rule.starts_with('C') || x.rule == "L2" || (deadlocks && x.rule == "hang"),
                "{label}: {} fails on `{}`: {}",
                x.case,
                x.rule,
                x.detail
            );
        }
    }
    assert!(diffs.is_empty(), "{}", diffs.join("\n"));
}

#[test]
fn every_case_can_fail() {
    let cases = Case::load_dir(&root().join("conformance/cases")).expect("cases parse");
    let mut covered = BTreeSet::new();
    for (label, _) in broken() {
        covered.extend(expected(&label));
    }
    let names: BTreeSet<String> = cases.iter().map(|c| c.name.clone()).collect();
    let never: Vec<&String> = names.difference(&covered).collect();
    assert!(never.is_empty(), "no broken adapter fails these cases: {never:?}");
    let unknown: Vec<&String> = covered.difference(&names).collect();
    assert!(unknown.is_empty(), "expected-failure files name unknown cases: {unknown:?}");
    // Each case file names its file and carries a purpose and spec IDs.
    for c in &cases {
        assert_eq!(c.path.file_stem().and_then(|s| s.to_str()), Some(c.name.as_str()), "{}", c.path.display());
        assert!(!c.purpose.is_empty() && !c.spec.is_empty());
    }
}

fn only(adapter: &str, cases: &[&str], timeout: f64) -> RunReport {
    let mut a = args(adapter.to_string());
    a.only = cases.iter().map(|s| s.to_string()).collect();
    a.timeout = timeout;
    conform::run(&a).expect("the suite runs")
}

#[test]
fn hung_crashing_and_babbling_adapters_are_reported_per_case() {
    // Never answers: `hang` on each case, and the run goes on.
    let r = only("sh -c 'read x; sleep 30'", &["seed-redux", "page-rounding"], 0.5);
    assert_eq!(r.results.len(), 2);
    for x in &r.results {
        assert_eq!((x.verdict, x.rule.as_str()), (Verdict::Fail, "hang"), "{x:?}");
    }
    // Aborts after its hello: `crash`, with the signal.
    let hello = r#"{"seq":0,"ok":true,"protocol":1,"name":"t","policy":null,"arena":{"addr":"0x100000","len":1048576}}"#;
    let r = only(&format!("sh -c 'read x; echo '\\''{hello}'\\''; read y; kill -ABRT $$'"), &["seed-redux"], 2.0);
    let x = &r.results[0];
    assert_eq!((x.verdict, x.rule.as_str(), x.line), (Verdict::Fail, "crash", 2), "{x:?}");
    assert!(x.detail.contains("SIGABRT"), "{}", x.detail);
    // Garbage instead of JSON: `protocol`, naming the case line and the text.
    let r = only(&format!("sh -c 'read x; echo '\\''{hello}'\\''; read y; echo not-json'"), &["seed-redux"], 2.0);
    let x = &r.results[0];
    assert_eq!((x.verdict, x.rule.as_str(), x.line), (Verdict::Fail, "protocol", 2), "{x:?}");
    assert!(x.detail.contains("not-json"), "{}", x.detail);
    // A reply naming a registration no reg event reported.
    let r = only(
        &format!("sh -c 'read x; echo '\\''{hello}'\\''; read y; echo {{\\\"seq\\\":1,\\\"ok\\\":true,\\\"reg\\\":9}}; sleep 5'"),
        &["seed-redux"],
        2.0,
    );
    let x = &r.results[0];
    assert_eq!((x.verdict, x.rule.as_str()), (Verdict::Fail, "protocol"), "{x:?}");
    assert!(x.detail.contains("registration 9"), "{}", x.detail);
    // A line without end: bounded, reported as `protocol`, not held.
    let r = only("sh -c 'read x; head -c 3000000 /dev/zero; sleep 5'", &["seed-redux"], 5.0);
    let x = &r.results[0];
    assert_eq!((x.verdict, x.rule.as_str()), (Verdict::Fail, "protocol"), "{x:?}");
    assert!(x.detail.contains("longer than 1048576 bytes"), "{}", x.detail);
    // A hello in another protocol version: the versions, not a Rust value.
    let hello2 = r#"{"seq":0,"ok":true,"protocol":2,"name":"t","policy":null,"arena":{"addr":"0x100000","len":1048576}}"#;
    let r = only(&format!("sh -c 'read x; echo '\\''{hello2}'\\''; sleep 5'"), &["seed-redux"], 2.0);
    let x = &r.results[0];
    assert!(x.detail.contains("the runner speaks 1, the adapter speaks 2") && !x.detail.contains("Some("), "{}", x.detail);
}

/// A line without end is bounded, and how the adapter then ended is
/// reported (one that wrote 200 MB with no newline and exited
/// held the runner at 423 MB and was reported as `no hello within 5.0 s`).
/// A run with no hello at all says so in its header, with no empty fields.
#[test]
fn a_line_without_end_reports_how_the_adapter_ended() {
    let r = only("sh -c 'read x; head -c 20000000 /dev/zero; exit 4'", &["seed-redux"], 5.0);
    let x = &r.results[0];
    assert_eq!((x.verdict, x.rule.as_str()), (Verdict::Fail, "protocol"), "{x:?}");
    assert!(x.detail.contains("longer than 1048576 bytes") && x.detail.contains("then exited with status 4"), "{}", x.detail);
    let header = conform::table(&r).lines().next().unwrap_or_default().to_string();
    assert!(header.contains("gave no hello") && !header.contains("judged under"), "{header}");
    // One that goes on writing: killed after a bounded wait, and said so.
    let r = only("sh -c 'read x; exec cat /dev/zero'", &["seed-redux"], 5.0);
    let x = &r.results[0];
    assert!(x.detail.contains("longer than 1048576 bytes") && x.detail.contains("killed"), "{}", x.detail);
    // The same after its hello, answering the first record.
    let hello = r#"{"seq":0,"ok":true,"protocol":1,"name":"t","policy":null,"arena":{"addr":"0x100000","len":1048576}}"#;
    let r = only(&format!("sh -c 'read x; echo '\\''{hello}'\\''; read y; head -c 3000000 /dev/zero; exit 5'"), &["seed-redux"], 5.0);
    let x = &r.results[0];
    assert_eq!((x.verdict, x.rule.as_str(), x.line), (Verdict::Fail, "protocol", 2), "{x:?}");
    assert!(x.detail.contains("then exited with status 5"), "{}", x.detail);
}

/// An adapter that ends before its first hello did not start: one error
/// (its exit, its stderr, a hint for status 127), exit status 3, never a
/// `fail crash` line per case.
#[test]
fn an_adapter_that_does_not_start_is_one_error_with_its_own_exit_status() {
    for (adapter, says) in [
        ("/nonexistent/adapter", "/nonexistent/adapter: not found"),
        ("mrcache-not-on-path adapter", "status 127 is the shell's `command not found`"),
        ("true", "exited with status 0 before its hello"),
        ("sh -c 'echo no library >&2; exit 1'", "its stderr: no library"),
    ] {
        let err = conform::run(&args(adapter.to_string())).expect_err(adapter);
        let did_not_start = err.downcast_ref::<conform::AdapterDidNotStart>().unwrap_or_else(|| panic!("{adapter}: {err:#}"));
        assert!(did_not_start.message.starts_with("the adapter did not start"), "{}", did_not_start.message);
        assert!(did_not_start.message.contains(says), "{adapter}: {}", did_not_start.message);
        let out = Command::new(bin())
            .args(["conform", "--adapter", adapter, "--cases"])
            .arg(root().join("conformance/cases"))
            .output()
            .expect("mrcache runs");
        assert_eq!(out.status.code(), Some(conform::AdapterDidNotStart::EXIT_STATUS as i32), "{adapter}");
        assert!(out.stdout.is_empty(), "{adapter}: no table: {}", String::from_utf8_lossy(&out.stdout));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{adapter}: one line: {stderr}");
    }
}

#[test]
fn bad_cases_get_an_error_naming_file_line_and_field() {
    let p = Path::new("bad.jsonl");
    let head = r#"{"mrcache_conformance": 1, "name": "x", "purpose": "p", "spec": ["P1"]}"#;
    let err = |body: &str| Case::parse(&format!("{head}\n{body}\n"), p).unwrap_err().to_string();
    assert!(err(r#"{"op": "release_event", "kind": "munmap", "addr": 0, "len": 4096}"#).contains("bad.jsonl:2"));
    assert!(err(r#"{"mem": "munmapp", "addr": 0, "len": 4096}"#).contains("unknown memory operation `munmapp`"));
    assert!(err(r#"{"mem": "munmap", "addr": "0xzz", "len": 4096}"#).contains("field `addr`"));
    assert!(err(r#"{"op": "acquire", "lease": 1, "addr": 0, "len": 0, "access": "rw"}"#).contains("bad.jsonl:2"));
    assert!(err(r#"{"mem": "mremap_shrink", "addr": 0, "len": 4096, "new_len": 8192}"#).contains("new_len"));
    assert!(err(r#"{"ctl": "go"}"#).contains("unknown ctl"));
    // Mistakes that used to reach the adapter and be blamed on it.
    let acq = r#"{"op": "acquire", "lease": 1, "addr": 0, "len": 4096, "access": "rw"}"#;
    let rel = r#"{"op": "release", "lease": 1}"#;
    let e = err(&format!("{acq}\n{rel}\n{rel}"));
    assert!(e.contains("bad.jsonl:4") && e.contains("release of lease 1, released already"), "{e}");
    let e = err(rel);
    assert!(e.contains("bad.jsonl:2") && e.contains("taken by no earlier acquire"), "{e}");
    let e = err(r#"{"op": "acquire", "lease": 1, "buf": "b", "addr": 0, "len": 4096, "access": "rw"}"#);
    assert!(e.contains("unknown buf `b`"), "{e}");
    let e = err(r#"{"op": "acquire", "lease": 1, "addr": "0x100000", "len": 4096, "access": "rw"}"#);
    assert!(e.contains("outside the arena's first 0x100000 bytes"), "{e}");
    let e = err(r#"{"mem": "munmap", "addr": "0xff000", "len": 8192}"#);
    assert!(e.contains("outside the arena"), "{e}");
    let e = err(r#"{"ctl": "continue", "thread": 1}"#);
    assert!(e.contains("`continue` of thread 1, which nothing paused"), "{e}");
    let e = err(r#"{"op": "acquirre", "lease": 1}"#);
    assert!(e.contains("unknown op `acquirre`") && !e.contains("release_event") && !e.contains("alloc"), "{e}");
    // A memory op written as an op: told to use `mem`, not to add a field.
    let e = err(r#"{"op": "free", "addr": 0}"#);
    assert!(e.contains("`free` is not a conformance record") && e.contains(r#"{"mem": ...}"#), "{e}");
    let e = err(r#"{"op": "mem", "addr": 0, "len": 4096}"#);
    assert!(e.contains("unknown op `mem`") && e.contains(r#"{"mem": ...}"#) && !e.contains("mem ("), "{e}");
    let e = Case::parse(r#"{"mrcache_conformance": 1, "name": "x", "purpose": "p"}"#, p).unwrap_err().to_string();
    assert!(e.contains("bad.jsonl:1") && e.contains("spec"), "{e}");
    let e =
        Case::parse(r#"{"mrcache_conformance": 1, "name": "x", "purpose": "p", "spec": ["P1"], "expect": 1}"#, p).unwrap_err().to_string();
    assert!(e.contains("unknown header field `expect`"), "{e}");
}

/// The adapter a fresh reader wrote from docs/conformance-protocol.md alone
/// (never having seen the code): every case passes; declaring no
/// capabilities, exactly the cases that need one are unsupported.
#[test]
fn the_fresh_readers_python_adapter_written_from_the_protocol_document_passes() {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("skipping: no python3");
        return;
    }
    // The cases of protocol parts written after the toy: it declares none of
    // their capabilities (`during_register`, `fork_paused`, `destroy`) and answers
    // their commands (`unmap_map_cycles`) `unsupported`, as the protocol
    // asks of a command an adapter does not implement.
    let newer = [
        "alloc-jemalloc",
        "alloc-mimalloc",
        "during-register-scratch",
        "during-register-unmap-other",
        "during-register-unmap-own",
        "fork-lock-held",
        "invalidation-queue-bound",
        "destroy-leased",
        "destroy-during-hook",
        "monitor-restart-churn",
    ];
    let script = root().join("conformance/adapters/fresh_reader_toy.py");
    let r = run(format!("python3 {}", script.display()));
    for x in r.results.iter().filter(|x| newer.contains(&x.case.as_str())) {
        assert_eq!(x.verdict, Verdict::Unsupported, "{}: {}", x.case, x.detail);
    }
    let bad: Vec<String> = r
        .results
        .iter()
        .filter(|x| x.verdict != Verdict::Pass && !newer.contains(&x.case.as_str()))
        .map(|x| format!("{} {} {}: {}", x.case, x.verdict, x.rule, x.detail))
        .collect();
    assert!(bad.is_empty(), "{}\n{}", bad.join("\n"), conform::table(&r));
    let r = run(format!("env FRESH_TOY_CAPS= python3 {}", script.display()));
    let unsupported: BTreeSet<&str> = r.results.iter().filter(|x| x.verdict == Verdict::Unsupported).map(|x| x.case.as_str()).collect();
    let passed = r.results.iter().filter(|x| x.verdict == Verdict::Pass).count();
    assert_eq!(unsupported.len() + passed, r.results.len(), "{}", conform::table(&r));
    assert_eq!(
        unsupported,
        [
            "flush-leased",
            "fork-cached",
            "fork-child-unmap",
            "limits-eviction",
            "limits-leased",
            "race-concurrent-miss",
            "race-hook-before-release",
            "race-register-vs-unmap",
        ]
        .into_iter()
        .chain(newer)
        .collect(),
        "{}",
        conform::table(&r)
    );
}

#[test]
fn a_peer_without_a_policy_is_judged_on_the_properties_and_its_overlap_reported() {
    // The toy is `independent` but declares nothing: under the model's
    // `merge` its overlap choices diverge, and nothing fails.
    let mut a = args(format!("{} adapter --toy --declare none", bin()));
    a.policy = Some("merge".parse().expect("a policy"));
    let r = conform::run(&a).expect("the suite runs");
    assert_eq!(r.declared_policy, None);
    assert!(failing(&r).is_empty(), "{}", conform::table(&r));
    let diverging: BTreeSet<String> = r.results.iter().filter(|x| x.verdict == Verdict::Diverges).map(|x| x.case.clone()).collect();
    assert!(diverging.contains("overlap-partial") && diverging.contains("overlap-contained"), "{}", conform::table(&r));
    for x in r.results.iter().filter(|x| x.verdict == Verdict::Diverges) {
        assert!(x.rule.starts_with('C'), "{x:?}");
    }
    // Declared, the same difference fails.
    let mut a = args(format!("{} adapter --toy", bin()));
    a.policy = Some("merge".parse().expect("a policy"));
    let r = conform::run(&a).expect("the suite runs");
    assert!(failing(&r).contains("overlap-partial"), "{}", conform::table(&r));
}

/// The data checks: with the io_uring registrar a stale
/// registration is seen in the bytes, not only in the order of events.
/// mrcache with its monitor switched off serves reuse-munmap's second
/// acquire from the registration that pinned the unmapped frames: the
/// device's write lands there and the application does not see it. The same
/// cache on the counting registrar fails on event order alone and says so;
/// correct mrcache sees its data right. MADV_FREE does not take a pinned
/// page away, so the same broken cache's reuse-madvise-free is a P2 failure
/// by order whose data came out right.
#[test]
fn data_checks_observe_stale_dma_and_say_when_they_cannot() {
    // (No L1 bound: a cache that misses releases also holds what the model
    // deregistered, and the bound's failure would come first.)
    let broken = format!("{} adapter --fault monitor-off --no-l1-bound", bin());
    let r = only(&broken, &["reuse-munmap", "reuse-madvise-free"], 10.0);
    assert_eq!(r.registrar, "io_uring");
    let x = r.results.iter().find(|x| x.case == "reuse-munmap").expect("reuse-munmap ran");
    assert_eq!(x.cell(), "fail P2, stale DMA observed", "{x:?}");
    assert!(x.detail.starts_with("stale DMA observed: the application does not see what the device wrote"), "{}", x.detail);
    assert!(x.detail.contains("event order: acquire served by registration 1"), "{}", x.detail);
    let x = r.results.iter().find(|x| x.case == "reuse-madvise-free").expect("reuse-madvise-free ran");
    assert_eq!(x.cell(), "fail P2 (order only; data right)", "{x:?}");

    let r = only(&format!("{broken} --registrar counting"), &["reuse-munmap"], 10.0);
    assert_eq!(r.registrar, "counting");
    let x = &r.results[0];
    assert_eq!(x.cell(), "fail P2 (order only; no data)", "{x:?}");
    assert!(x.detail.contains("order only: the adapter moves no data"), "{}", x.detail);

    let r = only(&format!("{} adapter --policy merge", bin()), &["reuse-munmap"], 10.0);
    let x = &r.results[0];
    assert_eq!((x.verdict, x.data.as_str()), (Verdict::Pass, "data right"), "{x:?}");
}

/// A case whose data records are malformed is refused with the file and line.
#[test]
fn bad_data_records_are_refused_naming_the_line() {
    let dir = std::env::temp_dir().join(format!("mrcache-data-records-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let head = r#"{"mrcache_conformance": 1, "name": "d", "purpose": "p", "spec": ["P2"]}"#;
    for (body, want) in [
        (r#"{"data": "dma_in", "lease": 1, "addr": "0x0", "len": 4096, "byte": 1}"#, "lease 1, which is not held"),
        (r#"{"data": "app_write", "addr": "0x0", "len": 4096}"#, "needs the pattern `byte`"),
        (r#"{"data": "dma_sideways", "addr": "0x0", "len": 4096}"#, "unknown data command `dma_sideways`"),
    ] {
        let p = dir.join("d.jsonl");
        std::fs::write(&p, format!("{head}\n{body}\n")).unwrap();
        let e = Case::load(&p).expect_err("a bad data record");
        let msg = format!("{e:#}");
        assert!(msg.contains("d.jsonl:2") && msg.contains(want), "{msg}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
