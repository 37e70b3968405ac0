//! Every hand-written trace replays through the model with its expectations
//! checked and its stats asserted (spec.md#T, S2).

use mrcache_cli::replay::{self, Report};
use mrcache_model::OverlapPolicy;
use mrcache_types::{Access, Op, RegView, Ret, Stats};
use std::path::PathBuf;

fn traces_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("traces")
}

fn run(name: &str, policy: Option<OverlapPolicy>) -> Report {
    let path = traces_dir().join(name);
    let trace = replay::load(&path).unwrap();
    let args = replay::ReplayArgs { policy, ..Args::for_trace(&path) };
    let config = args.config_for(&trace).unwrap();
    let expect = policy.is_none();
    replay::replay_model(name, &trace, config, expect).unwrap()
}

/// (acquires, hits, misses, errors, registrations, invalidations,
/// leased_invalidations, deferred_deregistrations, merges, uncached, deregistrations)
fn key(s: &Stats) -> [u64; 11] {
    [
        s.acquires,
        s.hits,
        s.misses,
        s.errors,
        s.registrations,
        s.invalidations,
        s.leased_invalidations,
        s.deferred_deregistrations,
        s.merges,
        s.uncached,
        s.deregistrations,
    ]
}

#[test]
fn shipped_traces_replay_with_expected_stats() {
    let cases: &[(&str, [u64; 11])] = &[
        ("seed-redux.jsonl", [6, 3, 3, 0, 3, 1, 0, 0, 0, 0, 1]),
        ("partial-free-leased.jsonl", [3, 1, 2, 0, 2, 1, 1, 1, 0, 0, 1]),
        ("overlap-independent.jsonl", [5, 2, 3, 0, 3, 0, 0, 0, 0, 0, 0]),
        ("overlap-merge.jsonl", [5, 2, 3, 0, 3, 0, 0, 1, 2, 0, 2]),
        ("overlap-no-merge-uncache-contained.jsonl", [5, 2, 3, 0, 3, 0, 0, 0, 0, 2, 2]),
        ("register-vs-invalidate.jsonl", [2, 0, 2, 0, 2, 1, 1, 1, 0, 0, 1]),
        ("fork-and-flush.jsonl", [5, 0, 5, 0, 5, 0, 0, 1, 0, 0, 2]),
        ("bad-input.jsonl", [4, 1, 1, 4, 1, 0, 0, 0, 0, 0, 0]),
        ("trim.jsonl", [4, 1, 3, 0, 3, 0, 0, 0, 0, 0, 3]),
    ];
    for (name, want) in cases {
        let r = run(name, None);
        assert_eq!(r.expectations_checked, r.records - count_unexpected(name), "{name}: every asserted record checked");
        assert_eq!(key(&r.stats), *want, "{name}: {:?}", r.stats);
    }
    // Every shipped hand-written trace is in the table above.
    let shipped = std::fs::read_dir(traces_dir()).unwrap().filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "jsonl"));
    assert_eq!(shipped.count(), cases.len());
}

fn count_unexpected(name: &str) -> usize {
    let t = replay::load(&traces_dir().join(name)).unwrap();
    t.records.iter().filter(|r| r.expect.is_none()).count()
}

#[test]
fn a_wrong_expectation_is_reported_with_its_line() {
    let dir = std::env::temp_dir().join(format!("mrcache-wrong-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut trace = replay::load(&traces_dir().join("seed-redux.jsonl")).unwrap();
    // Claim that the acquire after the partial unmap still hits R1: a stale hit.
    let i = trace.records.iter().position(|r| matches!(r.op, Op::Acquire { lease: 5, .. })).unwrap();
    let stale = RegView { id: 1, addr: 0x1000, len: 0x3000, access: Access::REMOTE_READ };
    trace.records[i].expect = Some(Ret::Granted { reg: stale, hit: true, pressure: false });
    let bad = trace.to_jsonl();
    let path = dir.join("wrong.jsonl");
    std::fs::write(&path, bad).unwrap();
    let trace = replay::load(&path).unwrap();
    let err = replay::replay_model("wrong.jsonl", &trace, Default::default(), true).unwrap_err().to_string();
    assert!(err.starts_with("wrong.jsonl:13:"), "{err}");
    assert!(err.contains("P2"), "{err}");
}

#[test]
fn cli_prints_stats_and_json() {
    let exe = env!("CARGO_BIN_EXE_mrcache");
    let out = std::process::Command::new(exe).args(["replay", "--json"]).arg(traces_dir().join("seed-redux.jsonl")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["stats"]["hits"], 3);
    let out = std::process::Command::new(exe).args(["replay", "/nonexistent.jsonl"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent.jsonl"));
}

/// spec.md#S9 in practice: every shipped trace through the real cache with
/// real pinning (io_uring) and both monitors, each outcome judged by the
/// model. (With the counting registrar every trace replays through the cache
/// in impl/tests/traces.rs, its stats compared with the model's after every
/// op.)
#[test]
fn impl_replay_matches_the_model_on_every_shipped_trace() {
    use mrcache_cli::replay::cache::{self as replay_cache, MonitorKind, RegistrarKind};
    for entry in std::fs::read_dir(traces_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|x| x != "jsonl") {
            continue;
        }
        let name = path.display().to_string();
        let trace = replay::load(&path).unwrap();
        let config = Args::for_trace(&path).config_for(&trace).unwrap();
        let model = replay::replay_model(&name, &trace, config, true).unwrap().stats;
        // Real pinning and real releases: judged op by op.
        for monitor in [MonitorKind::Explicit, MonitorKind::Uffd] {
            let s = replay_cache::replay(&trace, &name, config, RegistrarKind::Uring, monitor)
                .unwrap_or_else(|e| panic!("{name} uring/{monitor:?}: {e}"));
            assert_eq!((s.hits, s.misses, s.invalidations), (model.hits, model.misses, model.invalidations), "{name} {monitor:?}");
        }
    }
}

struct Args;
impl Args {
    fn for_trace(path: &std::path::Path) -> replay::ReplayArgs {
        replay::ReplayArgs {
            traces: vec![path.to_path_buf()],
            policy: None,
            engine: replay::Engine::Model,
            registrar: replay::RegistrarKind::Counting,
            monitor: replay::MonitorKind::Explicit,
            eviction: Default::default(),
            chunk_pages: 1,
            max_regions: None,
            max_pinned_bytes: None,
            json: false,
            threshold: None,
        }
    }
}

/// The oracles' two false alarms under contention, as minimal traces
/// (traces/regressions/oracle-*):
/// the linearizations the cache produced when the tests' oracles raised
/// their false alarms. The model accepts every outcome, and the real cache
/// reproduces them.
#[test]
fn oracle_regression_traces_are_legal_histories() {
    use mrcache_cli::replay::cache::{self as replay_cache, MonitorKind, RegistrarKind};
    for name in ["regressions/oracle-stale-lease.jsonl", "regressions/oracle-leak.jsonl"] {
        let r = run(name, None);
        assert_eq!(r.expectations_checked, r.records - count_unexpected(name), "{name}: every asserted record checked");
        assert_eq!(r.stats.registrations, r.stats.deregistrations + r.stats.cached_entries, "{name}: {:?}", r.stats);
        let path = traces_dir().join(name);
        let trace = replay::load(&path).unwrap();
        let config = Args::for_trace(&path).config_for(&trace).unwrap();
        let cache = replay_cache::replay(&trace, name, config, RegistrarKind::Counting, MonitorKind::Explicit).unwrap();
        assert_eq!(cache, r.stats, "{name}");
    }
}
