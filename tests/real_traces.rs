//! The traces of real MPI programs in traces/real/ (recorded by
//! ci/record-traces.sh, described in traces/README.md): each header names its
//! program, every rank's trace is valid, and a trimmed slice of each replays
//! through the model with the stats asserted here. (The whole of every rank's
//! trace replays through the cache, judged op by op against the model, in
//! impl/tests/traces.rs.)

use mrcache_cli::record;
use mrcache_cli::replay;
use mrcache_model::Config;
use mrcache_types::trace::Trace;
use mrcache_types::{Op, Stats};
use std::path::PathBuf;

/// Records replayed per rank: the first SLICE records of the run.
const SLICE: usize = 20_000;

fn real_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("traces/real")
}

/// (directory, header `program`, Debian package in `program_version`)
const RUNS: [(&str, &str, &str); 5] = [
    ("lammps-peptide", "lammps", "lammps"),
    ("hpcc-n4000", "hpcc", "hpcc"),
    ("mpi4py-fft", "mpi4py-fft", "python3-mpi4py-fft"),
    ("mpi4py-fft-mmap128k", "mpi4py-fft", "python3-mpi4py-fft"),
    ("netpipe", "NetPIPE", "netpipe-openmpi"),
];

/// (acquires, hits, misses, registrations, deregistrations, invalidations,
/// leased invalidations, bytes registered, peak pinned bytes, release events)
fn key(s: &Stats) -> [u64; 10] {
    [
        s.acquires,
        s.hits,
        s.misses,
        s.registrations,
        s.deregistrations,
        s.invalidations,
        s.leased_invalidations,
        s.bytes_registered,
        s.peak_pinned_bytes,
        s.release_events,
    ]
}

fn slice(trace: &Trace, n: usize) -> Trace {
    let mut t = trace.clone();
    t.records.truncate(n);
    // Re-validated: a prefix of a valid trace must parse on its own.
    Trace::parse("slice", &t.to_jsonl()).expect("a prefix of a valid trace is valid")
}

/// The model with its default configuration (independent overlap policy, LRU, no byte or region limit).
fn model_stats(name: &str, trace: &Trace) -> Stats {
    let config = Config { page_size: trace.header.page_size, ..Config::default() };
    replay::replay_model(name, trace, config, false).unwrap().stats
}

#[test]
fn every_real_trace_names_its_program_and_is_valid() {
    let mut seen = 0;
    for (dir, program, package) in RUNS {
        let files = record::rank_files(&real_dir().join(dir)).unwrap();
        assert_eq!(files.len(), 2, "{dir}: one trace per rank");
        for (rank, path) in files.iter().enumerate() {
            assert!(path.to_str().unwrap().ends_with(".jsonl.gz"), "{}: shipped compressed", path.display());
            let t = replay::load(path).unwrap();
            let h = &t.header;
            assert_eq!(h.source, "recorder", "{dir}");
            assert_eq!(h.program.as_deref(), Some(program), "{dir}");
            assert!(h.program_version.as_deref().unwrap().starts_with(&format!("{package} ")), "{dir}: {h:?}");
            assert_eq!((h.ranks, h.rank), (2, Some(rank as u32)), "{dir}");
            assert!(h.command.as_deref().unwrap().starts_with("mpirun "), "{dir}: {h:?}");
            assert!(h.recorder.as_deref().unwrap().starts_with("mrcache-pmpi "), "{dir}: {h:?}");
            assert!(h.date.is_some(), "{dir}");
            assert!(t.records.iter().all(|r| r.rank == rank as u32 && r.t.is_some()), "{dir}");
            assert!(t.records.windows(2).all(|w| w[0].t <= w[1].t), "{dir}: time goes forward");
            assert!(t.records.iter().any(|r| matches!(r.op, Op::Acquire { .. })), "{dir}");
            assert!(t.records.len() > SLICE, "{dir}: longer than the replayed slice");
            seen += 1;
        }
    }
    // Every shipped run is in RUNS.
    let shipped = std::fs::read_dir(real_dir()).unwrap().filter(|e| e.as_ref().unwrap().path().is_dir()).count();
    assert_eq!(shipped, RUNS.len());
    assert_eq!(seen, 2 * RUNS.len());
}

#[test]
fn a_slice_of_each_real_trace_replays_with_its_stats() {
    #[rustfmt::skip]
    let want: [(&str, [[u64; 10]; 2]); 5] = [
        ("lammps-peptide", [[9826, 9760, 66, 66, 1, 1, 0, 1658880, 1585152, 16], [9826, 9758, 68, 68, 1, 1, 0, 1667072, 1593344, 16]]),
        ("hpcc-n4000", [[9992, 9985, 7, 7, 0, 0, 0, 45056, 45056, 0], [9999, 9992, 7, 7, 0, 0, 0, 45056, 45056, 0]]),
        ("mpi4py-fft", [[6695, 6565, 130, 130, 0, 0, 0, 34086912, 34086912, 4], [7215, 7085, 130, 130, 0, 0, 0, 34086912, 34086912, 4]]),
        ("mpi4py-fft-mmap128k", [[8125, 7995, 130, 130, 0, 0, 0, 34086912, 34086912, 199], [8078, 7948, 130, 130, 0, 0, 0, 34086912, 34086912, 199]]),
        ("netpipe", [[9919, 9890, 29, 29, 0, 0, 0, 724992, 724992, 1], [9919, 9890, 29, 29, 0, 0, 0, 724992, 724992, 1]]),
    ];
    let mut got = Vec::new();
    for (dir, _) in want {
        let mut per_rank = [[0; 10]; 2];
        for (rank, path) in record::rank_files(&real_dir().join(dir)).unwrap().iter().enumerate() {
            let trace = replay::load(path).unwrap();
            per_rank[rank] = key(&model_stats(dir, &slice(&trace, SLICE)));
        }
        got.push((dir, per_rank));
    }
    assert_eq!(got, want, "\ngot:  {got:?}\nwant: {want:?}");
}

/// `mrcache record --window` cuts a real trace into a valid trace.
#[test]
fn a_window_of_a_real_trace_is_valid() {
    let path = &record::rank_files(&real_dir().join("lammps-peptide")).unwrap()[0];
    let trace = replay::load(path).unwrap();
    let last = trace.records.last().unwrap().t.unwrap();
    let w = record::window(&trace, last / 3, 2 * last / 3);
    assert!(!w.records.is_empty() && w.records.len() < trace.records.len());
    let again = Trace::parse("window", &w.to_jsonl()).unwrap();
    assert!(again.header.description.unwrap().contains("window"));
}
