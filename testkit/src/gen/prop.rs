//! Swarm-style op generation with shrinking (proptest), and the driver that
//! runs a case through the [`Environment`] (feature `proptest`; used by
//! `impl/tests/differential.rs`; was `impl/tests/common/gen.rs`). The same
//! shape as [`super::OpGen`], which draws from a seed instead, for `mrcache
//! fuzz`.
//!
//! A [`Case`] is a configuration index (into [`crate::configs()`]: every
//! policy × eviction × limits × chunk setting), a *swarm mask* switching op
//! kinds off (Groce et al., ISSTA 2012), a set of hot pages, and steps.
//! Addresses are hot (four pages chosen per case, ±1 page) 4 times in 5,
//! cold (anywhere in 256 pages) otherwise, so overlaps, partial frees and
//! reuse of freed addresses are frequent. Steps are independent of the mask
//! (disabled ones are skipped when the case runs), so proptest shrinks the
//! step list freely: a failing case shrinks to the few steps that matter.

use crate::env::HookEvent;
use crate::{Divergence, Environment, TestRegistrar};
use mrcache::registrar::counting::CountingRegistrar;
use mrcache::{Cache, CacheConfig, Faults};
use mrcache_types::trace::Trace;
use mrcache_types::{Access, Op, ReleaseKind, ADDRESS_LIMIT};
use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, TestError, TestRunner};
use std::path::PathBuf;
use std::sync::Arc;

pub const P: u64 = 4096;

/// Swarm bits: a set bit switches the kind off.
pub mod off {
    pub const RELEASE: u16 = 1 << 0;
    pub const EVENT: u16 = 1 << 1;
    pub const ALLOC_FREE: u16 = 1 << 2;
    /// Flush and trim.
    pub const FLUSH: u16 = 1 << 3;
    pub const FORK: u16 = 1 << 4;
    pub const BAD_INPUT: u16 = 1 << 5;
    /// Acquires all ask for `remote_read`.
    pub const ACCESS_VARIETY: u16 = 1 << 6;
    /// Whole pages only.
    pub const SUB_PAGE: u16 = 1 << 7;
    /// No release event raised from inside `register`.
    pub const EVENT_IN_REGISTER: u16 = 1 << 8;
    /// No registrar failure injected.
    pub const REGISTRAR_FAULTS: u16 = 1 << 9;
    pub const ALL: u16 = (1 << 10) - 1;
}

#[derive(Clone, Copy, Debug)]
pub enum Addr {
    /// One of the case's hot pages, plus `delta` pages (0 or 1), plus `sub` bytes.
    Hot {
        which: u8,
        delta: u8,
        sub: u16,
    },
    Cold {
        page: u16,
        sub: u16,
    },
}

#[derive(Clone, Copy, Debug)]
pub enum Len {
    Pages(u8),
    Bytes(u32),
}

/// Registrar failures scripted for one acquire (spec.md#S5.4).
#[derive(Clone, Copy, Debug)]
pub enum Fail {
    /// ENOMEM, then the retry succeeds (`pressure`).
    NoMemOnce,
    /// EAGAIN, then the retry succeeds.
    AgainOnce,
    /// ENOMEM twice: E5 no_memory with pressure.
    NoMemTwice,
    /// ENOMEM then EFAULT: E5 fault with pressure.
    NoMemThenFault,
    /// EFAULT: E5 fault, no retry.
    Fault,
    /// EINVAL: E5 other.
    Other,
}

impl Fail {
    fn script(self) -> &'static [Option<i32>] {
        match self {
            Fail::NoMemOnce => &[Some(libc::ENOMEM)],
            Fail::AgainOnce => &[Some(libc::EAGAIN)],
            Fail::NoMemTwice => &[Some(libc::ENOMEM), Some(libc::ENOMEM)],
            Fail::NoMemThenFault => &[Some(libc::ENOMEM), Some(libc::EFAULT)],
            Fail::Fault => &[Some(libc::EFAULT)],
            Fail::Other => &[Some(libc::EINVAL)],
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Step {
    Acquire { lease: u8, at: Addr, len: Len, access: u8, event: Option<(u8, u8)>, fail: Option<Fail> },
    Release { lease: u8 },
    Event { kind: u8, at: Addr, len: Len },
    Alloc { at: Addr, len: Len },
    Free { at: Addr, len: Len },
    Flush,
    Trim,
    Fork,
    Bad(u8),
}

#[derive(Clone, Debug)]
pub struct Case {
    pub config: usize,
    pub off: u16,
    pub hot: [u8; 4],
    pub steps: Vec<Step>,
}

const ACCESSES: [Access; 5] = [
    Access::REMOTE_READ,
    Access::LOCAL_READ,
    Access::LOCAL_WRITE.union(Access::REMOTE_READ),
    Access::LOCAL_WRITE.union(Access::REMOTE_READ).union(Access::REMOTE_WRITE),
    Access::REMOTE_ATOMIC,
];

impl Case {
    fn on(&self, bit: u16) -> bool {
        self.off & bit == 0
    }

    fn addr(&self, a: Addr) -> u64 {
        let sub = |s: u16| if self.on(off::SUB_PAGE) { u64::from(s) % P } else { 0 };
        match a {
            Addr::Hot { which, delta, sub: s } => {
                (u64::from(self.hot[usize::from(which % 4)]) + u64::from(delta % 2)) * P + sub(s)
            }
            Addr::Cold { page, sub: s } => u64::from(page % 256) * P + sub(s),
        }
    }

    fn len(&self, l: Len) -> u64 {
        match l {
            Len::Bytes(b) if self.on(off::SUB_PAGE) => 1 + u64::from(b) % (5 * P),
            Len::Bytes(b) => (1 + u64::from(b) % 5) * P,
            Len::Pages(n) => u64::from(n.max(1)) * P,
        }
    }

    /// The ops the case runs (disabled kinds skipped), each with the event
    /// to raise inside its registration and the registrar failures to script.
    pub fn ops(&self) -> Vec<(Op, Option<HookEvent>, Option<Fail>)> {
        let mut out = Vec::new();
        for s in &self.steps {
            let item = match *s {
                Step::Acquire { lease, at, len, access, event, fail } => {
                    let access = if self.on(off::ACCESS_VARIETY) {
                        ACCESSES[usize::from(access) % ACCESSES.len()]
                    } else {
                        Access::REMOTE_READ
                    };
                    let op =
                        Op::Acquire { lease: u64::from(lease % 6), addr: self.addr(at), len: self.len(len), access };
                    let fail = fail.filter(|_| self.on(off::REGISTRAR_FAULTS));
                    // Both on one acquire: an event raised after its pressure
                    // eviction (faults.rs `pressure_then_stale_retry_*`).
                    let hook = event.filter(|_| self.on(off::EVENT_IN_REGISTER)).map(|(o, n)| HookEvent {
                        page_offset: u64::from(o),
                        pages: 1 + u64::from(n % 2),
                        kind: ReleaseKind::Munmap,
                    });
                    (op, hook, fail)
                }
                Step::Release { lease } if self.on(off::RELEASE) => {
                    (Op::Release { lease: u64::from(lease % 7) }, None, None)
                }
                Step::Event { kind, at, len } if self.on(off::EVENT) => {
                    let kind = ReleaseKind::ALL[usize::from(kind) % ReleaseKind::ALL.len()];
                    (Op::ReleaseEvent { kind, addr: self.addr(at), len: self.len(len) }, None, None)
                }
                Step::Alloc { at, len } if self.on(off::ALLOC_FREE) => {
                    (Op::Alloc { addr: self.addr(at), len: self.len(len) }, None, None)
                }
                Step::Free { at, len } if self.on(off::ALLOC_FREE) => {
                    (Op::Free { addr: self.addr(at), len: self.len(len) }, None, None)
                }
                Step::Flush if self.on(off::FLUSH) => (Op::Flush, None, None),
                Step::Trim if self.on(off::FLUSH) => (Op::Trim, None, None),
                Step::Fork if self.on(off::FORK) => (Op::Fork, None, None),
                Step::Bad(k) if self.on(off::BAD_INPUT) => {
                    let op = match k % 5 {
                        0 => Op::Acquire { lease: 1, addr: 0x1000, len: 0, access: Access::REMOTE_READ },
                        1 => Op::Acquire { lease: 2, addr: u64::MAX - 0x800, len: 0x1000, access: Access::REMOTE_READ },
                        2 => Op::Acquire { lease: 3, addr: ADDRESS_LIMIT - 8, len: 9, access: Access::REMOTE_READ },
                        3 => Op::ReleaseEvent { kind: ReleaseKind::Munmap, addr: 0x2000, len: 0 },
                        _ => Op::Free { addr: u64::MAX, len: 2 },
                    };
                    (op, None, None)
                }
                _ => continue,
            };
            out.push(item);
        }
        out
    }
}

fn addr() -> impl Strategy<Value = Addr> {
    prop_oneof![
        4 => (0u8..4, 0u8..2, prop_oneof![3 => Just(0u16), 1 => 0u16..4096]).prop_map(|(which, delta, sub)| Addr::Hot { which, delta, sub }),
        1 => (0u16..256, prop_oneof![3 => Just(0u16), 1 => 0u16..4096]).prop_map(|(page, sub)| Addr::Cold { page, sub }),
    ]
}

fn len() -> impl Strategy<Value = Len> {
    prop_oneof![
        6 => (1u8..3).prop_map(Len::Pages),
        2 => (3u8..6).prop_map(Len::Pages),
        1 => (6u8..17).prop_map(Len::Pages),
        2 => (0u32..5 * 4096).prop_map(Len::Bytes),
    ]
}

fn fail() -> impl Strategy<Value = Option<Fail>> {
    prop_oneof![
        12 => Just(None),
        1 => prop_oneof![
            Just(Fail::NoMemOnce),
            Just(Fail::AgainOnce),
            Just(Fail::NoMemTwice),
            Just(Fail::NoMemThenFault),
            Just(Fail::Fault),
            Just(Fail::Other),
        ].prop_map(Some),
    ]
}

pub fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        36 => (0u8..6, addr(), len(), 0u8..5, prop::option::weighted(0.25, (0u8..8, 0u8..2)), fail())
            .prop_map(|(lease, at, len, access, event, fail)| Step::Acquire { lease, at, len, access, event, fail }),
        26 => (0u8..7).prop_map(|lease| Step::Release { lease }),
        14 => (0u8..8, addr(), prop_oneof![3 => (1u8..3).prop_map(Len::Pages), 1 => len()])
            .prop_map(|(kind, at, len)| Step::Event { kind, at, len }),
        3 => (addr(), len()).prop_map(|(at, len)| Step::Alloc { at, len }),
        3 => (addr(), len()).prop_map(|(at, len)| Step::Free { at, len }),
        2 => Just(Step::Flush),
        2 => Just(Step::Trim),
        1 => Just(Step::Fork),
        2 => (0u8..5).prop_map(Step::Bad),
    ]
}

/// A case over `configs` configurations with up to `max_steps` steps.
pub fn case(configs: usize, max_steps: usize) -> impl Strategy<Value = Case> {
    (0..configs, 0u16..=off::ALL, prop::array::uniform4(0u8..12), prop::collection::vec(step(), 1..max_steps))
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
    let seed =
        crate::rng::mix(name.bytes().fold(0u64, |h, b| h.wrapping_mul(131).wrapping_add(u64::from(b))));
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
