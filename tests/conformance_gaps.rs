//! The protocol gaps closed in the runner, each shown by
//! an adapter that the old runner would have judged differently. The cases
//! live in tests/conformance-gaps/ (they exercise the runner, not a peer,
//! so they are not part of the suite in conformance/cases/).

use mrcache_cli::conform::{self, ConformArgs, RunReport, Verdict};
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_mrcache")
}

fn run_case(adapter: &str, case: &str) -> RunReport {
    let args = ConformArgs::new(adapter, root().join("tests/conformance-gaps").join(format!("{case}.jsonl")));
    conform::run(&args).expect("the case runs")
}

/// 4c: a C-rule failure no longer ends the case: the stale hit six lines
/// later is judged and reported too, the first failure stays the verdict.
#[test]
fn a_policy_failure_then_a_stale_hit_are_both_reported() {
    let r = run_case(&format!("{} adapter --toy --break wrong-policy --break no-invalidation --no-l1-bound", bin()), "policy-then-stale");
    let x = &r.results[0];
    assert_eq!((x.verdict, x.rule.as_str(), x.line), (Verdict::Fail, "C2", 4), "{}", conform::table(&r));
    let got: Vec<(&str, usize)> = x.failures.iter().map(|f| (f.rule.as_str(), f.line)).collect();
    assert_eq!(got, vec![("C2", 4), ("P2", 10)], "{}", conform::table(&r));
    let t = conform::table(&r);
    assert!(t.contains("also P2 at case line 10"), "{t}");
    // Each break alone: one failure.
    let r = run_case(&format!("{} adapter --toy --break wrong-policy --no-l1-bound", bin()), "policy-then-stale");
    assert_eq!(r.results[0].failures.len(), 1, "{}", conform::table(&r));
    let r = run_case(&format!("{} adapter --toy --break no-invalidation --no-l1-bound", bin()), "policy-then-stale");
    let got: Vec<(&str, usize)> = r.results[0].failures.iter().map(|f| (f.rule.as_str(), f.line)).collect();
    assert_eq!(got, vec![("P2", 10)], "{}", conform::table(&r));
    // And the correct toy passes it.
    let r = run_case(&format!("{} adapter --toy", bin()), "policy-then-stale");
    assert_eq!(r.results[0].verdict, Verdict::Pass, "{}", conform::table(&r));
}

/// 4a: a case asks for its arena; an adapter maps it, or answers the hello
/// `unsupported`; one that offers less fails `protocol` at the hello,
/// naming both sizes. Without `arena` in its header the case does not parse.
#[test]
fn a_case_asks_for_its_arena() {
    let path = root().join("tests/conformance-gaps/arena-8m.jsonl");
    let case = conform::Case::load(&path).expect("the case parses");
    assert_eq!(case.arena, 8 << 20);
    let text = std::fs::read_to_string(&path).expect("read");
    let without = text.replacen(", \"arena\": 8388608", "", 1);
    let e = conform::Case::parse(&without, &path).unwrap_err().to_string();
    assert!(e.contains("arena-8m.jsonl:2") && e.contains("outside the arena's first 0x100000 bytes") && e.contains("sets `arena`"), "{e}");
    let e = conform::Case::parse(&text.replacen("8388608", "1000", 1), &path).unwrap_err().to_string();
    assert!(e.contains("arena-8m.jsonl:1") && e.contains("field `arena`"), "{e}");
    // mrcache and the toy map 8 MiB and pass.
    for a in [format!("{} adapter --policy merge", bin()), format!("{} adapter --toy", bin())] {
        let r = run_case(&a, "arena-8m");
        assert_eq!(r.results[0].verdict, Verdict::Pass, "{}", conform::table(&r));
    }
    // An adapter that offers 4 MiB whatever it is asked: `protocol`, at the hello.
    let hello = r#"{"seq":0,"ok":true,"protocol":1,"name":"t","policy":null,"arena":{"addr":"0x100000","len":4194304}}"#;
    let r = run_case(&format!("sh -c 'read x; echo '\\''{hello}'\\''; sleep 5'"), "arena-8m");
    let x = &r.results[0];
    assert_eq!((x.verdict, x.rule.as_str(), x.line), (Verdict::Fail, "protocol", 1), "{x:?}");
    assert!(x.detail.contains("arena of 0x800000 bytes") && x.detail.contains("offers 0x400000"), "{}", x.detail);
    // One that answers `unsupported`: the case is unsupported, not failed.
    let no = r#"{"seq":0,"ok":false,"unsupported":true,"error":"8 MiB is too much here"}"#;
    let r = run_case(&format!("sh -c 'read x; echo '\\''{no}'\\''; sleep 5'"), "arena-8m");
    let x = &r.results[0];
    assert_eq!(x.verdict, Verdict::Unsupported, "{x:?}");
    assert!(x.detail.contains("8 MiB is too much here"), "{}", x.detail);
}

/// 4b: a cache that widens its registrations to 16 KiB chunks passes every
/// case once it declares `chunk_size`; undeclared, the same cache fails C2.
#[test]
fn a_declared_chunk_size_is_judged_with() {
    // On the counting registrar: a registration widened to a chunk that
    // takes in an unmapped page cannot be pinned (io_uring says EFAULT, as
    // ibv_reg_mr would), which is a real limit of chunking, not C2's.
    let r = suite(format!("{} adapter --toy --chunk 16384 --registrar counting", bin()));
    assert!(r.results.iter().all(|x| x.verdict == Verdict::Pass), "{}", conform::table(&r));
    let r = suite(format!("{} adapter --policy merge --chunk 16384 --registrar counting", bin()));
    assert!(r.results.iter().all(|x| x.verdict == Verdict::Pass), "{}", conform::table(&r));
    let r = suite(format!("{} adapter --toy --chunk 16384 --chunk-undeclared --registrar counting", bin()));
    let c2: Vec<&str> = r.results.iter().filter(|x| x.verdict == Verdict::Fail && x.rule == "C2").map(|x| x.case.as_str()).collect();
    assert!(c2.contains(&"page-rounding"), "{}", conform::table(&r));
}

fn suite(adapter: String) -> RunReport {
    conform::run(&ConformArgs::new(adapter, root().join("conformance/cases"))).expect("the suite runs")
}

/// 4d: deregistration put off to the next acquire passes when the adapter
/// declares no bound (L1 is then reported), and fails `L1` against the
/// bound it declares by default (none owed): from the `query` after the
/// release event and from the late `dereg` itself.
#[test]
fn deferred_deregistration_is_judged_against_the_declared_bound() {
    let r = suite(format!("{} adapter --toy --break deferred-dereg --no-l1-bound", bin()));
    assert!(r.results.iter().all(|x| x.verdict == Verdict::Pass), "{}", conform::table(&r));
    assert!(r.results.iter().any(|x| x.l1 != "on time"), "late deregistrations are reported\n{}", conform::table(&r));
    let r = suite(format!("{} adapter --toy --break deferred-dereg", bin()));
    let x = r.results.iter().find(|x| x.case == "reuse-munmap").expect("reuse-munmap ran");
    assert_eq!((x.verdict, x.rule.as_str()), (Verdict::Fail, "L1"), "{}", conform::table(&r));
    assert!(x.failures.iter().any(|f| f.detail.contains("owed, beyond the hello's l1_bound")), "{:?}", x.failures);
    assert!(x.failures.iter().any(|f| f.detail.contains("operation(s) later; the hello's l1_bound.ops is 0")), "{:?}", x.failures);
    for x in r.results.iter().filter(|x| x.verdict == Verdict::Fail) {
        assert!(x.failures.iter().all(|f| f.rule == "L1"), "{}: {:?}", x.case, x.failures);
    }
    // The correct toy and mrcache owe nothing, under every policy.
    let r = suite(format!("{} adapter --toy", bin()));
    assert!(r.results.iter().all(|x| x.verdict == Verdict::Pass), "{}", conform::table(&r));
    for p in ["independent", "merge", "no-merge-uncache-contained"] {
        let r = suite(format!("{} adapter --policy {p}", bin()));
        assert!(r.results.iter().all(|x| x.verdict == Verdict::Pass), "{p}\n{}", conform::table(&r));
    }
}

/// 4d: the `query` answer must match the adapter's reg/dereg events.
#[test]
fn a_query_answer_that_disagrees_with_the_events_is_a_protocol_failure() {
    // Registers nothing, answers a hit, and claims a registration in `query`.
    let hello =
        r#"{"seq":0,"ok":true,"protocol":1,"name":"t","policy":"independent","caps":["query"],"arena":{"addr":"0x100000","len":1048576}}"#;
    let script = format!(
        "read x; echo '{hello}'; while read l; do s=$(echo \"$l\" | sed 's/.*\"seq\":\\([0-9]*\\).*/\\1/'); \
         case \"$l\" in *query*) echo \"{{\\\"seq\\\":$s,\\\"ok\\\":true,\\\"registrations\\\":1,\\\"pinned_bytes\\\":4096}}\";; \
         *) echo \"{{\\\"seq\\\":$s,\\\"ok\\\":true}}\";; esac; done"
    );
    let dir = std::env::temp_dir().join(format!("conformance-gaps-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let sh = dir.join("liar.sh");
    std::fs::write(&sh, script).expect("write the script");
    let case = dir.join("one-munmap.jsonl");
    std::fs::write(
        &case,
        "{\"mrcache_conformance\": 1, \"name\": \"one-munmap\", \"purpose\": \"p\", \"spec\": [\"L1\"]}\n{\"mem\": \"munmap\", \"addr\": \"0x10000\", \"len\": 4096}\n",
    )
    .expect("write the case");
    let args = ConformArgs { timeout: 5.0, ..ConformArgs::new(format!("sh {}", sh.display()), case) };
    let r = conform::run(&args).expect("the case runs");
    let _ = std::fs::remove_dir_all(&dir);
    let x = &r.results[0];
    assert_eq!((x.verdict, x.rule.as_str(), x.line), (Verdict::Fail, "protocol", 2), "{}", conform::table(&r));
    assert!(x.detail.contains("holds 1 registration(s) of 4096 bytes; its reg/dereg events say 0 of 0 bytes"), "{}", x.detail);
}

/// 4e: a cache that registers every miss twice passes every case; the
/// `extra` column counts the registrations it wasted (the correct toy's
/// come only from the cases where a second registration is allowed).
#[test]
fn wasted_registrations_are_counted_not_failed() {
    let r = suite(format!("{} adapter --toy --break redundant-register", bin()));
    assert!(r.results.iter().all(|x| x.verdict == Verdict::Pass), "{}", conform::table(&r));
    let seed = r.results.iter().find(|x| x.case == "seed-redux").expect("seed-redux ran");
    assert!(seed.extra > 0 && seed.registrations == seed.required + seed.extra, "{seed:?}");
    let wasted: u64 = r.results.iter().map(|x| x.extra).sum();
    let t = conform::table(&r);
    assert!(t.contains(&format!("{wasted} in all")) && t.contains("extra"), "{t}");
    let r = suite(format!("{} adapter --toy", bin()));
    let seed = r.results.iter().find(|x| x.case == "seed-redux").expect("seed-redux ran");
    assert_eq!(seed.extra, 0, "{seed:?}");
    let extra: Vec<&str> = r.results.iter().filter(|x| x.extra > 0).map(|x| x.case.as_str()).collect();
    // The races, the registrar that unmaps what it just pinned (a retry),
    // and the registration a paused thread made before a fork (the child
    // never uses it).
    let allowed = |c: &str| c.starts_with("race-") || ["during-register-unmap-own", "fork-lock-held"].contains(&c);
    assert!(extra.iter().all(|c| allowed(c)), "{extra:?}\n{}", conform::table(&r));
}
