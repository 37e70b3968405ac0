//! Every trace under `traces/` replays through the real cache and is judged.
//!
//! That is the hand-written scenarios (`traces/*.jsonl`), the regression
//! traces the differential search writes (`traces/regressions/`), the model
//! checker's counterexamples and the recorded MPI runs (any subdirectory;
//! `.jsonl.gz` too). Each goes through `mrcache_testkit::env::replay_trace`: a
//! counting registrar (addresses are never touched, so no relocation is
//! needed), the configuration the trace was written for (`command`, else
//! `policy_hint` and the defaults), every outcome judged by the model, the
//! registrar effects, stats and L1 checked after every op, and the end state
//! verified both ways.
//!
//! This is the one replay of the traces through the cache with the counting
//! registrar (tests/replay_traces.rs replays the hand-written ones again with
//! real pinning, io_uring, and the userfaultfd monitor).
//!
//! Expectations (`expect`): for sequential traces the cache's outcome must
//! equal each one, except where the trace expects an outcome the contract
//! allows but does not prefer (the judge accepts it) and the cache gives the
//! canonical one. Registrar failures a trace expects (E5, `pressure`) are
//! reproduced by scripting the registrar. Concurrent traces (checker
//! counterexamples) are judged with `Model::concurrent` and their
//! expectations, observed under another interleaving, are not required.

use mrcache::registrar::counting::CountingRegistrar;
use mrcache::types::trace::Trace;
use mrcache::types::Stats;
use mrcache_testkit::env::{config_from_trace, replay_trace, Expectations};
use std::io::Read;
use std::path::{Path, PathBuf};

fn traces_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../traces")
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            collect(&p, out);
        } else {
            let name = p.to_string_lossy();
            if name.ends_with(".jsonl") || name.ends_with(".jsonl.gz") {
                out.push(p);
            }
        }
    }
}

fn load(path: &Path) -> Trace {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let text = if path.extension().is_some_and(|e| e == "gz") {
        let mut s = String::new();
        flate2::read::GzDecoder::new(&bytes[..]).read_to_string(&mut s).unwrap_or_else(|e| panic!("{}: gzip: {e}", path.display()));
        s
    } else {
        String::from_utf8(bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    Trace::parse(&path.display().to_string(), &text).unwrap_or_else(|e| panic!("{e}"))
}

/// The failures, and the cache's stats of each trace that replayed.
type Replayed = (Vec<String>, Vec<(PathBuf, Stats)>);

/// Replays each trace.
fn replay_all(paths: &[PathBuf]) -> Replayed {
    let mut failures = Vec::new();
    let mut stats = Vec::new();
    for path in paths {
        let t0 = std::time::Instant::now();
        let trace = load(path);
        let config = match config_from_trace(&trace) {
            Ok(c) => c,
            Err(e) => {
                failures.push(format!("{}: bad configuration: {e}", path.display()));
                continue;
            }
        };
        match replay_trace(CountingRegistrar::default(), &trace, config, Expectations::Exact) {
            Ok(s) => {
                eprintln!(
                    "{}: {} ops, {} registrations, judged in {:.2} s",
                    path.display(),
                    s.ops,
                    s.stats.registrations,
                    t0.elapsed().as_secs_f64()
                );
                stats.push((path.clone(), s.stats));
            }
            Err(d) => failures.push(format!("{}: {d}", path.display())),
        }
    }
    (failures, stats)
}

fn traces_where(keep: impl Fn(&Path) -> bool) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    collect(&traces_root(), &mut paths);
    paths.retain(|p| keep(p));
    paths.sort();
    paths
}

fn is_recorded(p: &Path) -> bool {
    p.strip_prefix(traces_root()).is_ok_and(|r| r.starts_with("real"))
}

/// Hand-written scenarios, regression traces, checker counterexamples.
#[test]
fn scenario_regression_and_checker_traces_replay_through_the_cache() {
    let paths = traces_where(|p| !is_recorded(p));
    assert!(paths.len() >= 8, "the hand-written traces are found: {paths:?}");
    let (failures, _) = replay_all(&paths);
    assert!(failures.is_empty(), "{} of {} traces fail:\n{}", failures.len(), paths.len(), failures.join("\n"));
}

/// The recorded MPI runs (`traces/real/`, if present): judged op by op, and
/// each run's rank 0 has hits and invalidations (the stats equal the model's:
/// the environment compares them after every op).
#[test]
fn recorded_traces_replay_through_the_cache() {
    let paths = traces_where(is_recorded);
    if paths.is_empty() {
        eprintln!("no recorded traces under traces/real: nothing to replay");
    }
    // Large: spread over the cores (test binaries run one after another).
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).max(1);
    let mut chunks: Vec<Vec<PathBuf>> = vec![Vec::new(); threads];
    for (i, p) in paths.iter().enumerate() {
        chunks[i % threads].push(p.clone());
    }
    let replayed: Vec<Replayed> = std::thread::scope(|s| {
        let hs: Vec<_> = chunks.iter().map(|c| s.spawn(|| replay_all(c))).collect();
        hs.into_iter().map(|h| h.join().expect("replay thread")).collect()
    });
    let (failures, stats): (Vec<_>, Vec<_>) = replayed.into_iter().unzip();
    let failures = failures.concat();
    assert!(failures.is_empty(), "{} of {} traces fail:\n{}", failures.len(), paths.len(), failures.join("\n"));
    let rank0: Vec<_> = stats.concat().into_iter().filter(|(p, _)| p.ends_with("rank-0.jsonl.gz")).collect();
    for (path, s) in &rank0 {
        assert!(s.hits > 0 && s.invalidations > 0, "{}: {s:?}", path.display());
    }
    if !paths.is_empty() {
        assert_eq!(rank0.len(), 5, "LAMMPS, hpcc, mpi4py-fft x2, NetPIPE");
    }
}

#[test]
fn regression_traces_are_well_formed() {
    let mut paths = Vec::new();
    collect(&traces_root().join("regressions"), &mut paths);
    for path in paths {
        let t = load(&path);
        assert!(
            matches!(t.header.source.as_str(), "proptest" | "fuzz" | "hand-written"),
            "{}: regression traces come from the searches, or are a root-caused failure written by hand",
            path.display()
        );
        assert!(t.header.command.as_deref().is_some_and(|c| c.starts_with("mrcache replay")), "{}", path.display());
        assert!(t.records.iter().all(|r| r.expect.is_some()), "{}: every record has an expect", path.display());
    }
}
