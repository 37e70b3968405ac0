//! Concurrent histories checked for linearizability against the model.
//!
//! [`run_history`] runs 2–4 threads of random ops against a cache with a
//! counting registrar (wrapped in a [`TestRegistrar`]). Each op's invocation
//! and return are appended, under one mutex, to a log whose order is a
//! real-time order: if an op returned before another was invoked, its return
//! comes first. The log is replayed into stateright's
//! [`LinearizabilityTester`] with `Model::new(config).concurrent()` as the
//! sequential specification (its `is_valid_step` is the judge), and
//! [`History::is_linearizable`] asks for a serialization.
//!
//! Lease names are unique per history (thread `t` uses `t·1000 + k`), so a
//! lease's `release` can only be linearized after its `acquire`.
//!
//! Optionally the registrar raises an explicit release event from inside
//! `register` (on a page of the range being registered). That event is
//! logged as an op of its own on a virtual thread (`100 + t`), invoked and
//! returned inside the acquire's interval: the history then contains the
//! register-vs-invalidate race of spec.md#S3.7, which is what the
//! `skip_seq_recheck` fault breaks.
//!
//! The registrar can also yield inside `register` (`dawdle`: the cache runs
//! without its lock there, A5, so other threads get in) and fail at random
//! (`registrar_faults`, seeded). An acquire's first ENOMEM/EAGAIN makes it
//! trim (spec.md#S5.4), a step that linearizes on its own: the history logs
//! that acquire as two ops of its thread, a `trim` from the acquire's
//! invocation to its next `register` call (or its return), then the acquire
//! itself, judged with [`Model::trims_logged`].
//!
//! After the history (all threads done, then every lease dropped), the cache
//! is flushed, and the registrar must hold nothing, every registration
//! deregistered exactly once.

use super::registrar::{RegisterCall, TestRegistrar};
use super::rng::Rng;
use crate::Apply;
use mrcache::registrar::counting::CountingRegistrar;
use mrcache::{Cache, CacheConfig, Faults};
use mrcache_model::{Config, Model};
use mrcache_types::{Access, LeaseId, Op, ReleaseKind, Ret};
use stateright::semantics::{ConsistencyTester, LinearizabilityTester};
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex, OnceLock, Weak};

/// One entry of a history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Invoke { thread: u32, op: Op },
    Return { thread: u32, ret: Ret },
}

/// The shape of the histories to run.
#[derive(Clone, Copy, Debug)]
pub struct HistoryConfig {
    pub config: Config,
    pub faults: Faults,
    /// Worker threads (2–4).
    pub threads: u32,
    pub ops_per_thread: u32,
    /// Pages of the hot window ops address (small: overlaps are the point).
    pub pages: u64,
    /// Per mille of `register` calls that raise a release event inside.
    pub raise_in_register: u64,
    /// Per mille of `register` calls that fail, with an errno drawn from
    /// `fault_errnos`.
    pub registrar_faults: u64,
    pub fault_errnos: &'static [i32],
    /// `yield_now` calls inside each `register`: widens the window in which
    /// the cache runs without its lock (A5), so other threads interleave.
    pub dawdle: u32,
    /// Per mille of release events raised as a hook before the release
    /// would: `release_begin`, and `release_end` a few ops later on the same
    /// thread (spec.md#S2.9; every window is closed before the thread ends).
    pub windows: u64,
}

/// Every registrar failure the cache distinguishes (S5.4).
pub const ALL_ERRNOS: [i32; 4] = [libc::ENOMEM, libc::EAGAIN, libc::EFAULT, libc::EINVAL];
/// Failures without the pressure path (no eviction, no retry).
pub const NO_PRESSURE_ERRNOS: [i32; 2] = [libc::EFAULT, libc::EINVAL];

impl HistoryConfig {
    pub fn new(config: Config) -> HistoryConfig {
        HistoryConfig {
            config,
            faults: Faults::default(),
            threads: 3,
            ops_per_thread: 4,
            pages: 8,
            raise_in_register: 0,
            registrar_faults: 0,
            fault_errnos: &ALL_ERRNOS,
            dawdle: 2,
            windows: 0,
        }
    }
}

/// A recorded history and what the cache left behind.
#[derive(Clone, Debug)]
pub struct History {
    pub seed: u64,
    pub config: Config,
    /// Invocations and returns in real-time order.
    pub events: Vec<Event>,
    /// `Err` if something leaked or was deregistered twice.
    pub cleanup: Result<(), String>,
}

impl History {
    /// Ops in the history.
    pub fn ops(&self) -> usize {
        self.events.iter().filter(|e| matches!(e, Event::Invoke { .. })).count()
    }

    /// Whether the history is linearizable with respect to
    /// `Model::new(config).concurrent()`.
    pub fn is_linearizable(&self) -> bool {
        self.serialization().is_some()
    }

    /// A witness order, if linearizable.
    pub fn serialization(&self) -> Option<Vec<(Op, Ret)>> {
        let mut t = LinearizabilityTester::new(Model::new(self.config).concurrent().trims_logged());
        for e in &self.events {
            let r = match *e {
                Event::Invoke { thread, op } => t.on_invoke(thread, op).map(|_| ()),
                Event::Return { thread, ret } => t.on_return(thread, ret).map(|_| ()),
            };
            if let Err(msg) = r {
                panic!("malformed history (a harness bug): {msg}");
            }
        }
        t.serialized_history()
    }

    /// One line per event, for failure messages.
    pub fn render(&self) -> String {
        let mut s = format!("seed {:#x}, {}\n", self.seed, super::env::describe(&self.config));
        for e in &self.events {
            match e {
                Event::Invoke { thread, op } => s += &format!("  T{thread} invoke {op}\n"),
                Event::Return { thread, ret } => s += &format!("  T{thread} return {ret}\n"),
            }
        }
        s
    }
}

type LinCache = Cache<TestRegistrar<CountingRegistrar>>;

thread_local! {
    /// The history thread id of the current worker (for the hook's events).
    static THREAD: Cell<u32> = const { Cell::new(u32::MAX) };
    /// Where the current worker's acquire stands with its pressure trim.
    static TRIM: Cell<Trim> = const { Cell::new(Trim::NotInAcquire) };
}

/// An acquire's pressure trim as the history logs it (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Trim {
    NotInAcquire,
    /// In an acquire that has not trimmed.
    Untrimmed(Op),
    /// Trimming: the logged `trim` has not returned yet.
    Open(Op),
    /// Trimmed; the acquire part is logged.
    Closed,
}

/// Ends an open trim: logs its return and the acquire's own invocation.
fn close_trim(log: &Mutex<Vec<Event>>, thread: u32) {
    if let Trim::Open(op) = TRIM.with(Cell::get) {
        let mut log = lock(log);
        log.push(Event::Return { thread, ret: Ret::Done });
        log.push(Event::Invoke { thread, op });
        TRIM.with(|c| c.set(Trim::Closed));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

const ACCESSES: [Access; 3] = [Access::REMOTE_READ, Access::LOCAL_WRITE.union(Access::REMOTE_READ), Access::LOCAL_READ];

/// Runs one history with `seed` (see the module docs).
/// The configurations concurrent histories run under: every overlap policy,
/// without limits, and with small limits, cost-aware eviction and 2-page
/// chunks (shared by the tests and `mrcache fuzz`).
pub fn configs() -> Vec<Config> {
    let mut v = Vec::new();
    for policy in mrcache_model::OverlapPolicy::ALL {
        v.push(Config::with_policy(policy));
        v.push(Config {
            policy,
            eviction: mrcache_model::EvictionPolicy::CostAware,
            chunk_pages: 2,
            limits: mrcache_model::Limits { max_regions: Some(3), max_pinned_bytes: Some(6 * 4096), max_unreleased: Some(4) },
            ..Config::default()
        });
    }
    v
}

pub fn run_history(hc: &HistoryConfig, seed: u64) -> History {
    let mut cc = CacheConfig::explicit_with(hc.config);
    cc.faults = hc.faults;
    // A quarter of the histories without lanes: every hit is then A1.
    cc.lanes = !seed.is_multiple_of(4);
    let registrar = TestRegistrar::new(CountingRegistrar::default()).logging(false).with_random_faults(
        Rng::new(seed).split(0xfa17).next_u64(),
        hc.registrar_faults,
        hc.fault_errnos,
    );
    let cache: Arc<LinCache> = Arc::new(Cache::new(registrar, cc));
    let log: Arc<Mutex<Vec<Event>>> = Arc::new(Mutex::new(Vec::new()));
    let page = hc.config.page_size;
    if hc.raise_in_register > 0 || hc.dawdle > 0 {
        let weak: Arc<OnceLock<Weak<LinCache>>> = Arc::new(OnceLock::new());
        let (w, log2) = (weak.clone(), log.clone());
        let calls = AtomicU64::new(0);
        let (per_mille, dawdle) = (hc.raise_in_register, hc.dawdle);
        cache.registrar().set_hook(Box::new(move |range| {
            for _ in 0..dawdle {
                std::thread::yield_now();
            }
            let n = calls.fetch_add(1, Ordering::Relaxed);
            let mut rng = Rng::new(seed).split(0x4000_0000 + n);
            let t = THREAD.with(Cell::get);
            if t == u32::MAX || !rng.chance(per_mille, 1000) {
                return;
            }
            let Some(cache) = w.get().and_then(Weak::upgrade) else { return };
            let span = range.pages(page);
            let first = span.first + rng.below(span.count());
            let op = Op::ReleaseEvent { kind: ReleaseKind::Munmap, addr: first * page, len: page };
            let thread = 100 + t;
            lock(&log2).push(Event::Invoke { thread, op });
            let ret = match cache.invalidate(first * page, page, ReleaseKind::Munmap) {
                Ok(()) => Ret::Done,
                Err(e) => Ret::Failed { error: e.op_error() },
            };
            lock(&log2).push(Event::Return { thread, ret });
        }));
        let _ = weak.set(Arc::downgrade(&cache));
    }
    let log2 = log.clone();
    cache.registrar().set_observer(Box::new(move |call| {
        let t = THREAD.with(Cell::get);
        match (call, TRIM.with(Cell::get)) {
            (RegisterCall::Failed(errno), Trim::Untrimmed(op)) if errno == libc::ENOMEM || errno == libc::EAGAIN => {
                // The acquire's invocation is the trim's: rewrite it.
                let mut log = lock(&log2);
                if let Some(Event::Invoke { op: logged, .. }) =
                    log.iter_mut().rev().find(|e| matches!(e, Event::Invoke { thread, .. } if *thread == t))
                {
                    *logged = Op::Trim;
                }
                TRIM.with(|c| c.set(Trim::Open(op)));
            }
            (RegisterCall::Begin(_), Trim::Open(_)) => close_trim(&log2, t),
            _ => {}
        }
    }));
    let barrier = Barrier::new(hc.threads as usize);
    std::thread::scope(|s| {
        for t in 0..hc.threads {
            let (cache, log, barrier) = (&*cache, &log, &barrier);
            s.spawn(move || {
                THREAD.with(|c| c.set(t));
                let mut rng = Rng::new(seed).split(u64::from(t));
                let mut leases = HashMap::new();
                let mut next: LeaseId = LeaseId::from(t) * 1000;
                let mut window: Option<(u64, u64)> = None;
                barrier.wait();
                for i in 0..=hc.ops_per_thread {
                    let op = match window {
                        // The last op closes the thread's window, if open.
                        Some((addr, len)) if i == hc.ops_per_thread || rng.chance(1, 3) => {
                            window = None;
                            Op::ReleaseEnd { addr, len }
                        }
                        _ if i == hc.ops_per_thread => break,
                        _ => {
                            let mut op = random_op(&mut rng, &leases, &mut next, LeaseId::from(t) * 1000, hc.pages, page);
                            if let Op::ReleaseEvent { addr, len, .. } = op {
                                // No draw when off: the other histories stay as they were.
                                if window.is_none() && hc.windows > 0 && rng.chance(hc.windows, 1000) {
                                    window = Some((addr, len));
                                    op = Op::ReleaseBegin { addr, len };
                                }
                            }
                            op
                        }
                    };
                    lock(log).push(Event::Invoke { thread: t, op });
                    if matches!(op, Op::Acquire { .. }) {
                        TRIM.with(|c| c.set(Trim::Untrimmed(op)));
                    }
                    let ret = cache.apply(&op, &mut leases);
                    close_trim(log, t);
                    TRIM.with(|c| c.set(Trim::NotInAcquire));
                    lock(log).push(Event::Return { thread: t, ret });
                    // Vary the interleavings a little.
                    for _ in 0..rng.below(3) {
                        std::thread::yield_now();
                    }
                }
                THREAD.with(|c| c.set(u32::MAX));
                // Leases still held are dropped only once every thread is done
                // with the history: a release is an op, and would otherwise
                // race the other threads' last ops unrecorded.
                barrier.wait();
                drop(leases);
            });
        }
    });
    cache.flush();
    let reg = cache.registrar();
    let s = cache.stats();
    let doubles = reg.double_deregistrations.load(Ordering::Relaxed);
    let cleanup = if reg.live() != 0 || doubles != 0 || s.pinned_bytes != 0 || s.cached_entries != 0 {
        Err(format!("after the history: {} registrations live, {doubles} double deregistrations, {s:?}", reg.live()))
    } else {
        Ok(())
    };
    let events = std::mem::take(&mut *lock(&log));
    History { seed, config: hc.config, events, cleanup }
}

fn random_op<L>(rng: &mut Rng, held: &HashMap<LeaseId, L>, next: &mut LeaseId, base: LeaseId, pages: u64, page: u64) -> Op {
    let addr = |rng: &mut Rng| rng.below(pages) * page + if rng.chance(1, 6) { rng.below(page) } else { 0 };
    let len = |rng: &mut Rng| if rng.chance(1, 6) { 1 + rng.below(3 * page) } else { (1 + rng.below(3)) * page };
    match rng.below(100) {
        0..=49 => {
            *next += 1;
            Op::Acquire { lease: *next, addr: addr(rng), len: len(rng), access: *rng.pick(&ACCESSES) }
        }
        50..=74 if !held.is_empty() => {
            let mut ids: Vec<LeaseId> = held.keys().copied().collect();
            ids.sort_unstable();
            Op::Release { lease: *rng.pick(&ids) }
        }
        50..=74 => Op::Release { lease: base + 999 }, // E4
        75..=92 => Op::ReleaseEvent { kind: ReleaseKind::MadviseDontneed, addr: addr(rng), len: page * (1 + rng.below(2)) },
        93..=94 => Op::Flush,
        95 => Op::Trim,
        96..=97 => Op::Acquire { lease: base + 998, addr: addr(rng), len: 0, access: Access::REMOTE_READ }, // E1
        _ => Op::Alloc { addr: addr(rng), len: page },
    }
}

/// Results of many histories.
#[derive(Clone, Debug, Default)]
pub struct Campaign {
    pub histories: u64,
    pub ops: u64,
    /// The first non-linearizable history, if any.
    pub first_violation: Option<History>,
    pub violations: u64,
    /// The first history that leaked, if any.
    pub first_leak: Option<History>,
}

/// Runs `histories` histories with seeds derived from `seed`, stopping at
/// the first violation if `stop_at_first`.
pub fn campaign(hc: &HistoryConfig, seed: u64, histories: u64, stop_at_first: bool) -> Campaign {
    let mut c = Campaign::default();
    let root = Rng::new(seed);
    for i in 0..histories {
        let h = run_history(hc, root.split(i).next_u64());
        c.histories += 1;
        c.ops += h.ops() as u64;
        if h.cleanup.is_err() && c.first_leak.is_none() {
            c.first_leak = Some(h.clone());
        }
        if !h.is_linearizable() {
            c.violations += 1;
            if c.first_violation.is_none() {
                c.first_violation = Some(h);
            }
            if stop_at_first {
                break;
            }
        }
    }
    c
}
