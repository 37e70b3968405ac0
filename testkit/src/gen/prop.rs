//! Swarm-style op generation with shrinking (proptest), and the driver that
//! runs a case through the [`Environment`] (feature `proptest`; used by
//! `impl/tests/differential.rs`; was `impl/tests/common/gen.rs`).
//!
//! The distribution is [`super::swarm`]'s (its cases, steps, weights and
//! ranges, re-exported here); this module only turns its constants into
//! proptest strategies, so a failing case shrinks to the few steps that
//! matter. [`super::OpGen`] draws the same distribution from a seed, for
//! `mrcache fuzz`.

pub use super::swarm::{off, Addr, Case, Fail, Len, Step, P};
use super::swarm::{
    ACCESSES, ADDR_WEIGHTS, BAD_KINDS, COLD_PAGES, EVENT_IN_REGISTER, EVENT_KINDS, EVENT_LEN_WEIGHTS, EVENT_OFFSETS, FAILS, FAIL_WEIGHTS,
    HOT_RANGE, LEASES, LEN_BYTES, LEN_PAGES, LEN_WEIGHTS, RELEASE_LEASES, STEP_WEIGHTS, SUB_RANGE, SUB_WEIGHTS,
};
use crate::{Divergence, Environment, TestRegistrar};
use mrcache::registrar::counting::CountingRegistrar;
use mrcache::{Cache, CacheConfig, Faults};
use mrcache_types::trace::Trace;
use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, TestError, TestRunner};
use std::path::PathBuf;
use std::sync::Arc;

fn sub() -> impl Strategy<Value = u16> {
    let [whole, any] = SUB_WEIGHTS;
    prop_oneof![whole => Just(0u16), any => 0u16..SUB_RANGE]
}

fn addr() -> impl Strategy<Value = Addr> {
    let [hot, cold] = ADDR_WEIGHTS;
    prop_oneof![
        hot => (0u8..4, 0u8..2, sub()).prop_map(|(which, delta, sub)| Addr::Hot { which, delta, sub }),
        cold => (0u16..COLD_PAGES, sub()).prop_map(|(page, sub)| Addr::Cold { page, sub }),
    ]
}

fn len() -> impl Strategy<Value = Len> {
    let [w0, w1, w2, bytes] = LEN_WEIGHTS;
    let [p0, p1, p2] = LEN_PAGES;
    prop_oneof![
        w0 => (p0.0..p0.1).prop_map(Len::Pages),
        w1 => (p1.0..p1.1).prop_map(Len::Pages),
        w2 => (p2.0..p2.1).prop_map(Len::Pages),
        bytes => (0u32..LEN_BYTES).prop_map(Len::Bytes),
    ]
}

fn fail() -> impl Strategy<Value = Option<Fail>> {
    let [none, some] = FAIL_WEIGHTS;
    let [f0, f1, f2, f3, f4, f5] = FAILS;
    prop_oneof![none => Just(None), some => prop_oneof![Just(f0), Just(f1), Just(f2), Just(f3), Just(f4), Just(f5)].prop_map(Some)]
}

pub fn step() -> impl Strategy<Value = Step> {
    let [acquire, release, event, alloc, free, flush, trim, fork, bad] = STEP_WEIGHTS;
    let (num, den) = EVENT_IN_REGISTER;
    let [event_pages, event_len] = EVENT_LEN_WEIGHTS;
    prop_oneof![
        acquire => (0u8..LEASES, addr(), len(), 0u8..ACCESSES.len() as u8, prop::option::weighted(num as f64 / den as f64, (0u8..EVENT_OFFSETS, 0u8..2)), fail())
            .prop_map(|(lease, at, len, access, event, fail)| Step::Acquire { lease, at, len, access, event, fail }),
        release => (0u8..RELEASE_LEASES).prop_map(|lease| Step::Release { lease }),
        event => (0u8..EVENT_KINDS, addr(), prop_oneof![event_pages => (1u8..3).prop_map(Len::Pages), event_len => len()])
            .prop_map(|(kind, at, len)| Step::Event { kind, at, len }),
        alloc => (addr(), len()).prop_map(|(at, len)| Step::Alloc { at, len }),
        free => (addr(), len()).prop_map(|(at, len)| Step::Free { at, len }),
        flush => Just(Step::Flush),
        trim => Just(Step::Trim),
        fork => Just(Step::Fork),
        bad => (0u8..BAD_KINDS).prop_map(Step::Bad),
    ]
}

/// A case over `configs` configurations with up to `max_steps` steps.
pub fn case(configs: usize, max_steps: usize) -> impl Strategy<Value = Case> {
    (0..configs, 0u16..=off::ALL, prop::array::uniform4(0u8..HOT_RANGE), prop::collection::vec(step(), 1..max_steps))
        .prop_map(|(config, off, hot, steps)| Case { config, off, hot, steps })
}

/// Runs a case through a fresh cache (with `faults`) and an environment;
/// on a divergence, returns it with the trace that reproduces it.
pub fn run_case(case: &Case, faults: Faults) -> Result<(), Box<(Divergence, Trace)>> {
    let configs = crate::configs();
    let config = configs[case.config % configs.len()];
    let mut cc = CacheConfig::explicit_with(config);
    cc.faults = faults;
    let cache = Arc::new(Cache::new(TestRegistrar::new(CountingRegistrar::default()), cc));
    let mut env = Environment::new(&cache, config).strict(true).with_event_hook(&cache);
    let description = |d: &Divergence| {
        format!(
            "found by proptest ({}): {d}. Configuration: {}.",
            if faults == Faults::default() { "the real cache".to_string() } else { format!("cache with {faults:?}") },
            crate::env::describe(&config)
        )
    };
    for (op, hook, fail) in case.ops() {
        if let Some(h) = hook {
            env.arm(h);
        }
        if let Some(f) = fail {
            cache.registrar().fail_next(f.script());
        }
        let r = env.step(&op);
        cache.registrar().clear_script();
        if let Err(d) = r {
            let t = env.to_trace("proptest", description(&d));
            return Err(Box::new((d, t)));
        }
    }
    let records = env.records().to_vec();
    env.finish().map(|_| ()).map_err(|d| {
        let t = crate::env::trace_of(&records, &config, "proptest", description(&d));
        Box::new((d, t))
    })
}

pub fn regressions_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../traces/regressions")
}

/// Writes a failing trace: into `traces/regressions/` for failures of the
/// real cache (commit it: every test run replays it), or, for deliberate
/// mutants, into the temp dir unless `MRCACHE_SAVE_REGRESSIONS=1`.
pub fn save_trace(trace: &Trace, name: &str, regression: bool) -> PathBuf {
    let dir = if regression || std::env::var_os("MRCACHE_SAVE_REGRESSIONS").is_some_and(|v| v == "1") {
        regressions_dir()
    } else {
        std::env::temp_dir().join(format!("mrcache-mutant-traces-{}", std::process::id()))
    };
    std::fs::create_dir_all(&dir).expect("create the trace directory");
    let path = dir.join(format!("{name}.jsonl"));
    std::fs::write(&path, trace.to_jsonl()).expect("write the trace");
    path
}

/// The outcome of a proptest campaign over [`run_case`].
pub struct Found {
    pub case: Case,
    pub divergence: Divergence,
    pub trace: Trace,
}

/// Runs `cases` random cases (deterministic seed per `name`) and returns the
/// minimal failing case proptest shrank to, if any. No proptest regression
/// files: failures become JSON traces (see [`save_trace`]).
pub fn search(name: &str, cases: u32, max_steps: usize, faults: Faults, configs: Option<&[usize]>) -> Option<Found> {
    let n = crate::configs().len();
    let cfg = PtConfig {
        cases,
        failure_persistence: None,
        max_shrink_iters: 20_000,
        rng_algorithm: proptest::test_runner::RngAlgorithm::ChaCha,
        ..PtConfig::default()
    };
    let seed = crate::rng::mix(name.bytes().fold(0u64, |h, b| h.wrapping_mul(131).wrapping_add(u64::from(b))));
    let mut key = [0u8; 32];
    for (i, chunk) in key.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&crate::rng::mix(seed ^ i as u64).to_le_bytes());
    }
    let rng = proptest::test_runner::TestRng::from_seed(proptest::test_runner::RngAlgorithm::ChaCha, &key);
    let mut runner = TestRunner::new_with_rng(cfg, rng);
    let restricted: Option<Vec<usize>> = configs.map(<[usize]>::to_vec);
    let strategy = case(n, max_steps).prop_map(move |mut c| {
        if let Some(r) = &restricted {
            c.config = r[c.config % r.len()];
        }
        c
    });
    match runner.run(&strategy, |c| run_case(&c, faults).map_err(|e| TestCaseError::fail(e.0.to_string()))) {
        Ok(()) => None,
        Err(TestError::Fail(_, case)) => {
            let (divergence, trace) = *run_case(&case, faults).expect_err("the minimal case fails again");
            Some(Found { case, divergence, trace })
        }
        Err(TestError::Abort(why)) => panic!("proptest aborted: {why}"),
    }
}
