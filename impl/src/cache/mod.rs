//! The registration cache: spec.md §A, step by step.
//!
//! # Shared state (spec.md#A)
//!
//! - the cache **lock**: a reader-writer lock over `State` (the index of
//!   findable entries, the in-flight records, the bytes of findable entries).
//!   Shared for the hit path (A1), exclusive for everything that changes the
//!   index (A2–A11, R2, H2, M2, flush);
//! - the **index** ([`crate::index::IntervalIndex`]) of findable entries;
//! - the **in-flight** list: one record (planned span, *stale* flag) per
//!   registration in progress, marked stale by every release event applied
//!   while the registrar runs without the lock (A4–A7, S3.7);
//! - the **invalidation queue** ([`InvalidationQueue`]): release events pushed
//!   by hooks that could not take the lock (H1, H2);
//! - per entry, the **state word** ([`EntryState`]: lease count + INVALID) and
//!   the LRU / GreedyDual-Size stamps, all atomics, so the hit path only needs
//!   the lock shared;
//! - the **over-limit flag** (R2).
//!
//! The registrar is never called with the lock held. Every deregistration is
//! collected in a per-operation dereg list and performed after the lock is
//! released, or by the thread whose release dropped the last lease of an
//! invalidated entry (R1), which needs no lock at all.
//!
//! # Entry ownership
//!
//! An entry is a `Box` turned into a raw pointer at insertion (A9). While
//! findable it is reachable from the index; each lease holds the raw pointer.
//! Whoever wins the handoff of spec.md#A-H — the invalidation that saw a lease
//! count of 0, or the release that took the count from 1 to 0 with INVALID
//! set — deregisters its handle and frees it, exactly once. Leases never
//! clone an `Arc`: an A1 hit is one shared lock, one `fetch_add` on the state
//! word and one unlock; a release is one `fetch_sub`.
//!
//! # Lanes (spec.md#LN1)
//!
//! The usual hit skips even that: each thread memoizes its A1 hits in its own
//! lane ([`lane`]), and a repeated acquire of the same key is served there
//! with plain stores and loads and a compiler fence. A lane lease is counted
//! in its slot, not in the state word. Every removal from the index first
//! revokes the entry's memos (membarrier), turning a slot still counting
//! leases into one state-word lease (a pin), so the handoff above is unchanged.
//!
//! # Fork (spec.md#F1, S2.6)
//!
//! Everything an operation touches besides the registrar and the counters
//! lives in a `Shared` *generation* behind an atomic pointer. Each
//! operation first compares the process's fork generation (bumped by a
//! `pthread_atfork` child handler that only increments an atomic: it takes no
//! lock and does no work) and, on slow paths, the pid, with the cache's. In a
//! forked child the cache installs a fresh, empty generation and **leaks the
//! old one**: the old index, entries and registrar handles are never dropped
//! and never deregistered (deregistering through a registrar fd shared with
//! the parent would destroy the parent's registrations), and the old lock,
//! which a thread that does not exist in the child may hold, is never taken
//! again. Leases from the old generation are released as no-ops.
//! [`Cache::simulate_fork`] does the same on request, for replaying `Op::Fork`.
//!
//! # Sequential equivalence with the model
//!
//! For any sequential sequence of operations the cache returns the `Ret`s of
//! `mrcache_model::Model::step` and the same [`Stats`]: the same canonical hit
//! (lowest covering id), the same overlap plan (S6.1), ids in creation order
//! of cached registrations (registrations discarded by A7/A8 get none), the
//! same LRU / GreedyDual-Size victims (one logical clock ticked by every use;
//! ties by id), the same pressure handling (S5.4: the plan is recomputed
//! after the pressure eviction, as the model plans after evicting).

mod harness;
mod lane;
mod lease;
mod queue;
mod state;
mod stats;

pub use lane::{uses_membarrier, LANE_SLOTS, MAX_LANES};
pub use lease::Lease;
pub use queue::{InvalidationQueue, Pushed, MAX_QUEUE_CAPACITY};
pub use state::{EntryState, Invalidated, Released};

use crate::error::Error;
use crate::index::{IntervalIndex, Slot};
use crate::registrar::{Keys, Registrar};
use crate::sync::{thread_local, AtomicBool, AtomicU64, Ordering, RwLock, RwLockWriteGuard};
use mrcache_types::config::{per_page_cost_ns, Config, EvictionPolicy, OverlapPolicy};
use mrcache_types::{Access, PageSpan, Range, RangeError, RegView, RegistrarFailure, ReleaseKind, Stats};
use serde::{Deserialize, Serialize};
use stats::{add, get, inc, Counters, Hot, HotCounters};
use std::cell::Cell;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr as StdAtomicPtr, AtomicU32, AtomicU64 as StdAtomicU64, Ordering as Std};
use std::sync::{OnceLock, PoisonError, TryLockError};

/// Default bound on attempts of one miss (spec.md#S3.7).
pub const DEFAULT_MAX_RETRIES: u32 = 4;
/// Default bound on the invalidation queue (spec.md#L2).
pub const DEFAULT_MAX_UNRELEASED: u64 = mrcache_types::config::Limits::DEFAULT_MAX_UNRELEASED;

// ---------------------------------------------------------------------------
// Configuration

/// Fault switches that mirror the checker's mutants: each breaks one rule of
/// the algorithm on purpose, so that tests can show their oracle catches it.
/// Runtime flags, all off by default. Only in test builds (`cfg(test)` or
/// feature `testkit`): a production build has none.
#[cfg(any(test, feature = "testkit"))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Faults {
    /// A7 skipped: a registration invalidated while the registrar ran is
    /// inserted anyway (breaks P2).
    pub skip_seq_recheck: bool,
    /// Release events are ignored (explicit `invalidate`, queued events and
    /// events read from the monitor): the monitor is off (breaks P2).
    pub monitor_off: bool,
    /// The owner of a cached registration's deregistration (A-H: the
    /// operation that took it out of the lookup unleased, or its last
    /// release) frees the entry without deregistering (breaks P4, "every
    /// successful registration is deregistered exactly once"). What the
    /// tests' final "nothing registered" checks must catch.
    pub leak_deregistration: bool,
    /// A release event deregisters leased entries at once (breaks P3). See
    /// [`Faults::enable_dereg_leased_on_invalidate`].
    dereg_leased_on_invalidate: bool,
}

#[cfg(any(test, feature = "testkit"))]
impl Faults {
    /// Makes release events deregister leased entries immediately (P3 mutant).
    /// The last release then frees the entry without deregistering it again.
    ///
    /// # Safety
    ///
    /// After such an early deregistration [`Lease::handle`] returns a reference
    /// to a handle the registrar has already consumed: the caller must not use
    /// a lease's `handle()` after a release event overlapped it, unless the
    /// registrar's handle owns no resources its `deregister` frees (true of
    /// [`crate::registrar::counting::CountingRegistrar`]).
    pub unsafe fn enable_dereg_leased_on_invalidate(&mut self) {
        self.dereg_leased_on_invalidate = true;
    }

    pub fn dereg_leased_on_invalidate(&self) -> bool {
        self.dereg_leased_on_invalidate
    }
}

/// The configuration of a [`Cache`]: the contract's declared policy
/// ([`Config`]: overlap policy, page size, chunking, eviction, limits) plus
/// implementation parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CacheConfig {
    /// What the model is configured with (spec.md#S6).
    pub contract: Config,
    /// Attempts of one miss before E6 (spec.md#S3.7, A7). At least 1.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// Per-thread lanes (spec.md#LN1): repeated hits without a lock or an
    /// atomic read-modify-write. On by default; off, every hit is an A1 hit
    /// (one shared lock and a state-word lease) and no lane memory is used.
    #[serde(default = "default_lanes")]
    pub lanes: bool,
    /// Memo slots per lane: a power of two in [2, 65536]; 56 bytes each, per
    /// thread and cache. Raise it for threads that reuse more buffers.
    #[serde(default = "default_lane_slots")]
    pub lane_slots: u32,
    /// Test-only fault switches (never serialised).
    #[serde(skip)]
    #[cfg(any(test, feature = "testkit"))]
    pub faults: Faults,
}

fn default_max_retries() -> u32 {
    DEFAULT_MAX_RETRIES
}

fn default_lanes() -> bool {
    true
}

fn default_lane_slots() -> u32 {
    LANE_SLOTS
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig::new(Config::default())
    }
}

impl From<Config> for CacheConfig {
    fn from(contract: Config) -> Self {
        CacheConfig::new(contract)
    }
}

impl CacheConfig {
    pub fn new(contract: Config) -> Self {
        CacheConfig {
            contract,
            max_retries: DEFAULT_MAX_RETRIES,
            lanes: true,
            lane_slots: LANE_SLOTS,
            #[cfg(any(test, feature = "testkit"))]
            faults: Faults::default(),
        }
    }

    pub fn with_policy(policy: OverlapPolicy) -> Self {
        CacheConfig::new(Config::with_policy(policy))
    }

    /// The model's [`Config::validate`] (spec.md#S6.2: page size a power of two
    /// in [512, 2^20], `chunk_pages ≥ 1`, `chunk_pages · page_size ≤ 2^62`) and
    /// `max_retries ≥ 1`.
    pub fn validate(&self) -> Result<(), Error> {
        self.contract.validate().map_err(|reason| Error::InvalidConfig { reason })?;
        if self.max_retries == 0 {
            return Err(Error::InvalidConfig { reason: "max_retries must be at least 1".into() });
        }
        if !self.lane_slots.is_power_of_two() || !(2..=1 << 16).contains(&self.lane_slots) {
            return Err(Error::InvalidConfig {
                reason: format!("lane_slots {} is not a power of two in [2, 65536]", self.lane_slots),
            });
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Release events and the monitor hook point

/// A release event (spec.md#S2.3), as a monitor reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReleaseEvent {
    pub kind: ReleaseKind,
    pub range: Range,
}

/// An asynchronous monitor the cache reads under its exclusive lock
/// (spec.md#S3.8, M2: "A2 and A6 also read pending events").
pub trait EventSource: Send + Sync + 'static {
    /// Appends every pending event without blocking. Called with the cache's
    /// exclusive lock held: it must not block and must not free monitored
    /// memory.
    fn read_pending(&self, out: &mut Vec<ReleaseEvent>);

    /// Starts watching `range` before it is registered (spec.md#S7.3). Called
    /// without the cache lock, before the registrar. An error fails the
    /// acquire with [`Error::Watch`].
    fn watch(&self, _range: Range) -> Result<(), String> {
        Ok(())
    }
}

/// Internal counters that are not part of the shared [`Stats`] schema.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnostics {
    /// Registrations made and deregistered without being cached: stale (A7)
    /// or superseded by another thread's insertion (A8).
    pub discarded_registrations: u64,
    /// Attempts that found their in-flight record stale (A7).
    pub stale_retries: u64,
    /// `deregister` calls that returned an error (the handle is gone anyway).
    pub dereg_failures: u64,
    /// Leased registrations deregistered early by the P3 fault switch.
    pub early_deregistrations: u64,
    /// Release events queued now (spec.md#L2).
    pub queued_events: u64,
    /// The queue's bound: `max_unreleased`, at most [`MAX_QUEUE_CAPACITY`].
    pub queue_capacity: u64,
    /// Hits served by a lane (spec.md#LN1), included in `Stats::hits`.
    pub lane_hits: u64,
    /// Lanes this generation has made (at most [`MAX_LANES`]).
    pub lanes: u64,
    /// Lane slots holding a pin now (L5: revoked while leased).
    pub pinned_slots: u64,
    /// Whether the heavy barrier is membarrier (else both sides fence).
    pub membarrier: bool,
}

// ---------------------------------------------------------------------------
// Entries

/// One cached registration. Immutable after creation except for its atomics.
pub(crate) struct Entry<R: Registrar> {
    pub(crate) state: EntryState,
    /// Logical time of the last use (LRU).
    last_use: StdAtomicU64,
    /// GreedyDual-Size priority `H`.
    priority: StdAtomicU64,
    /// Per-page registration cost, ns (S6.3).
    cost: u64,
    /// Some lane slot may point to it (L2 sets it; L5 skips the scan if clear).
    memoized: std::sync::atomic::AtomicBool,
    pub(crate) view: RegView,
    pub(crate) keys: Keys,
    /// Taken exactly once by the deregistration owner (or by the P3 fault).
    pub(crate) handle: ManuallyDrop<R::Handle>,
}

/// A raw pointer to an [`Entry`]; ownership follows spec.md#A-H (module docs).
pub(crate) struct EntryPtr<R: Registrar>(NonNull<Entry<R>>);

impl<R: Registrar> Clone for EntryPtr<R> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<R: Registrar> Copy for EntryPtr<R> {}

// SAFETY: an entry is shared between the index (under the lock) and lease
// holders. Its mutable parts are atomics; `R::Handle: Send + Sync`; it is
// freed exactly once, by the owner the state word designates.
unsafe impl<R: Registrar> Send for EntryPtr<R> {}
// SAFETY: as for `Send` above.
unsafe impl<R: Registrar> Sync for EntryPtr<R> {}

impl<R: Registrar> EntryPtr<R> {
    /// # Safety
    /// The entry must be alive: in the index (with the lock held) or leased
    /// by the caller.
    #[inline]
    pub(crate) unsafe fn get<'a>(self) -> &'a Entry<R> {
        // SAFETY: per the contract above.
        unsafe { self.0.as_ref() }
    }
}

// ---------------------------------------------------------------------------
// Generation state

/// A registration in progress (spec.md#A4).
#[derive(Clone, Copy, Debug)]
struct InFlight {
    token: u64,
    span: PageSpan,
    stale: bool,
}

/// What the cache lock protects.
pub(crate) struct State<R: Registrar> {
    index: IntervalIndex<EntryPtr<R>>,
    inflight: Vec<InFlight>,
    next_token: u64,
    /// Bytes of findable entries (max_pinned_bytes, S6.4).
    cached_bytes: u64,
}

impl<R: Registrar> State<R> {
    fn add_inflight(&mut self, span: PageSpan) -> u64 {
        let token = self.next_token;
        self.next_token += 1;
        self.inflight.push(InFlight { token, span, stale: false });
        token
    }

    fn take_inflight(&mut self, token: u64) -> Option<InFlight> {
        let i = self.inflight.iter().position(|r| r.token == token)?;
        Some(self.inflight.swap_remove(i))
    }
}

/// One generation of the cache (see "Fork" in the module docs).
pub(crate) struct Shared<R: Registrar> {
    lock: RwLock<State<R>>,
    queue: InvalidationQueue,
    /// Set by A10 when every remaining entry is leased and a limit is still
    /// exceeded; read by R2.
    over_limit: AtomicBool,
    /// Findable entries (mirror of the index length, for stats).
    cached: StdAtomicU64,
    /// Cached registrations of this generation not yet deregistered, and
    /// their bytes (pinned_bytes, forgotten).
    live_regs: StdAtomicU64,
    live_bytes: StdAtomicU64,
    /// Per-thread memo lanes (LN1–LN6).
    lanes: lane::Lanes<R>,
    /// Drains in progress (L1): raised before events are taken off the queue
    /// or read from the monitor, lowered once they are applied, so a lane hit
    /// never runs between an event's removal and its revokes.
    draining: AtomicU64,
}

impl<R: Registrar> Shared<R> {
    fn new(queue_capacity: usize, lane_slots: u32) -> Self {
        Shared {
            lock: RwLock::new(State {
                index: IntervalIndex::new(),
                inflight: Vec::new(),
                next_token: 0,
                cached_bytes: 0,
            }),
            queue: InvalidationQueue::with_capacity(queue_capacity),
            over_limit: AtomicBool::new(false),
            cached: StdAtomicU64::new(0),
            live_regs: StdAtomicU64::new(0),
            live_bytes: StdAtomicU64::new(0),
            lanes: lane::Lanes::new(lane_slots),
            draining: AtomicU64::new(0),
        }
    }
}

thread_local! {
    /// Exclusive cache locks this thread holds (any cache). A hook raised by
    /// such a thread never waits for a lock (spec.md#S7.2, L2).
    // Not `const { .. }`: loom's `thread_local!` does not accept it.
    #[allow(clippy::missing_const_for_thread_local)]
    static HELD: Cell<u32> = Cell::new(0);
}

fn held_by_this_thread() -> bool {
    HELD.with(|h| h.get() > 0)
}

/// The exclusive lock, marked in [`HELD`]; refreshes the index's search tree
/// before unlocking.
pub(crate) struct WriteGuard<'a, R: Registrar> {
    guard: ManuallyDrop<RwLockWriteGuard<'a, State<R>>>,
}

impl<'a, R: Registrar> WriteGuard<'a, R> {
    fn new(guard: RwLockWriteGuard<'a, State<R>>) -> Self {
        HELD.with(|h| h.set(h.get() + 1));
        WriteGuard { guard: ManuallyDrop::new(guard) }
    }
}

impl<R: Registrar> Deref for WriteGuard<'_, R> {
    type Target = State<R>;
    fn deref(&self) -> &State<R> {
        &self.guard
    }
}

impl<R: Registrar> DerefMut for WriteGuard<'_, R> {
    fn deref_mut(&mut self) -> &mut State<R> {
        &mut self.guard
    }
}

impl<R: Registrar> Drop for WriteGuard<'_, R> {
    fn drop(&mut self) {
        self.guard.index.refresh();
        // SAFETY: dropped exactly once, here.
        unsafe { ManuallyDrop::drop(&mut self.guard) };
        HELD.with(|h| h.set(h.get() - 1));
    }
}

// ---------------------------------------------------------------------------
// The dereg list

enum Dereg<R: Registrar> {
    /// A cached entry this operation owns: deregister and free it.
    Entry(EntryPtr<R>),
    /// A registration that was never cached (A7, A8): deregister, uncounted.
    Discard(R::Handle),
    /// The P3 fault: a leased entry's handle, deregistered early (counted).
    #[cfg(any(test, feature = "testkit"))]
    Early(R::Handle, u64),
}

/// Deregistrations collected under the lock, performed after it (spec.md#A11).
pub(crate) struct DeregList<'c, R: Registrar> {
    cache: &'c Cache<R>,
    shared: &'c Shared<R>,
    items: Vec<Dereg<R>>,
}

impl<'c, R: Registrar> DeregList<'c, R> {
    fn new(cache: &'c Cache<R>, shared: &'c Shared<R>) -> Self {
        DeregList { cache, shared, items: Vec::new() }
    }

    /// Performs every collected deregistration. Call with the lock released.
    fn perform(&mut self) {
        if self.items.is_empty() {
            return;
        }
        debug_assert!(!held_by_this_thread() || std::thread::panicking(), "dereg with the lock held");
        for item in std::mem::take(&mut self.items) {
            match item {
                Dereg::Entry(e) => self.cache.deregister_entry(self.shared, e, false),
                Dereg::Discard(h) => {
                    inc(&self.cache.counters.discarded_registrations);
                    self.cache.call_deregister(h);
                }
                #[cfg(any(test, feature = "testkit"))]
                Dereg::Early(h, bytes) => {
                    inc(&self.cache.counters.early_deregistrations);
                    self.cache.call_deregister(h);
                    self.cache.count_dereg(self.shared, bytes);
                }
            }
        }
    }
}

impl<R: Registrar> Drop for DeregList<'_, R> {
    /// Runs when the operation that owns the list ends, after its lock is
    /// released: performs the deregistrations, then drains what hooks queued
    /// while the lock was held (their try-lock failed against ours).
    fn drop(&mut self) {
        self.perform();
        //= spec.md#A11
        //# after unlocking, if the queue is non-empty, try the lock exclusive
        //# and drain (H2)
        // Bounded: a hook that keeps pushing is drained by the next operation.
        for _ in 0..POST_UNLOCK_DRAINS {
            if held_by_this_thread() || self.shared.queue.is_empty() {
                break;
            }
            let Some(mut st) = self.cache.try_write(self.shared) else { break };
            self.cache.drain(self.shared, &mut st, self);
            drop(st);
            self.perform();
        }
    }
}

/// Raises `draining` for the life of a drain (spec.md#LN1).
struct Draining<'a>(&'a AtomicU64);

impl<'a> Draining<'a> {
    fn new<R: Registrar>(shared: &'a Shared<R>) -> Self {
        shared.draining.fetch_add(1, Ordering::SeqCst);
        Draining(&shared.draining)
    }
}

impl Drop for Draining<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

/// Rounds of the post-unlock drain (spec.md#A11, L2's "every loop has a bound").
const POST_UNLOCK_DRAINS: usize = 4;

/// Ids of the entries an eviction pass may take (see [`Cache::note_unleased`]).
#[derive(Default)]
struct Noted(Vec<u64>);

impl Noted {
    fn contains(&self, id: u64) -> bool {
        self.0.binary_search(&id).is_ok()
    }
}

// ---------------------------------------------------------------------------
// Fork detection

mod fork {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Once;

    static FORKS: AtomicU64 = AtomicU64::new(0);
    static INSTALL: Once = Once::new();

    /// Runs in the child after fork(): one atomic increment, no lock, no
    /// allocation (async-signal-safe). The forgetting happens at the start of
    /// the child's next cache operation (spec.md#S2.6, F1).
    extern "C" fn child() {
        FORKS.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn install() {
        INSTALL.call_once(|| {
            // SAFETY: registers a handler that only touches a static atomic.
            // A failure (ENOMEM) leaves the pid comparison of slow paths.
            unsafe {
                libc::pthread_atfork(None, None, Some(child));
            }
        });
    }

    #[inline]
    pub(super) fn generation() -> u64 {
        FORKS.load(Ordering::Relaxed)
    }
}

// ---------------------------------------------------------------------------
// The cache

/// A miss's registration (spec.md#S6.1, S6.2).
#[derive(Clone, Copy, Debug)]
struct Plan {
    span: PageSpan,
    access: Access,
    range: Range,
}

/// A memory-registration cache implementing spec.md §A. `Send + Sync`; share
/// it by reference or in an `Arc`.
pub struct Cache<R: Registrar> {
    registrar: R,
    config: CacheConfig,
    page_size: u64,
    chunk_pages: u64,
    limits_active: bool,
    /// [`CacheConfig::lanes`].
    lanes_on: bool,
    /// spec.md#L2 bound on the invalidation queue.
    queue_capacity: usize,
    /// The current generation; never null; freed in `Drop` (old ones leak).
    shared: StdAtomicPtr<Shared<R>>,
    forks_seen: StdAtomicU64,
    pid: AtomicU32,
    forgetting: std::sync::atomic::AtomicBool,
    /// Logical clock of uses (LRU) and GreedyDual-Size inflation value.
    clock: StdAtomicU64,
    gds_floor: StdAtomicU64,
    next_id: StdAtomicU64,
    counters: Counters,
    hot: HotCounters,
    source: OnceLock<Box<dyn EventSource>>,
    /// Page hull `[lo, hi)` of every registration ever planned (A4): a
    /// release event outside it cannot concern the cache. Only grows.
    hull_lo: StdAtomicU64,
    hull_hi: StdAtomicU64,
}

impl<R: Registrar> std::fmt::Debug for Cache<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("registrar", &self.registrar.name())
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish()
    }
}

impl<R: Registrar> Cache<R> {
    /// Creates a cache.
    ///
    /// # Panics
    ///
    /// If the configuration is invalid (see [`Cache::try_new`]).
    pub fn new(registrar: R, config: impl Into<CacheConfig>) -> Self {
        match Self::try_new(registrar, config) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    /// Creates a cache; fails if [`CacheConfig::validate`] does.
    pub fn try_new(registrar: R, config: impl Into<CacheConfig>) -> Result<Self, Error> {
        let config = config.into();
        config.validate()?;
        fork::install();
        lane::init_barriers();
        let l = &config.contract.limits;
        let max_unreleased = l.max_unreleased.unwrap_or(DEFAULT_MAX_UNRELEASED);
        let queue_capacity = usize::try_from(max_unreleased).unwrap_or(usize::MAX).clamp(1, MAX_QUEUE_CAPACITY);
        Ok(Cache {
            registrar,
            page_size: config.contract.page_size,
            chunk_pages: config.contract.chunk_pages.max(1),
            limits_active: l.max_regions.is_some() || l.max_pinned_bytes.is_some(),
            lanes_on: config.lanes,
            queue_capacity,
            config,
            shared: StdAtomicPtr::new(Box::into_raw(Box::new(Shared::new(queue_capacity, config.lane_slots)))),
            forks_seen: StdAtomicU64::new(fork::generation()),
            pid: AtomicU32::new(std::process::id()),
            forgetting: std::sync::atomic::AtomicBool::new(false),
            clock: StdAtomicU64::new(0),
            gds_floor: StdAtomicU64::new(0),
            next_id: StdAtomicU64::new(1),
            hull_lo: StdAtomicU64::new(u64::MAX),
            hull_hi: StdAtomicU64::new(0),
            counters: Counters::default(),
            hot: HotCounters::new(),
            source: OnceLock::new(),
        })
    }

    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    pub fn registrar(&self) -> &R {
        &self.registrar
    }

    /// Installs the asynchronous monitor that A2, A6 and [`Cache::drain_with`]
    /// read under the exclusive lock. Only one; later calls return the source.
    pub fn set_event_source(&self, source: Box<dyn EventSource>) -> Result<(), Box<dyn EventSource>> {
        self.source.set(source)
    }

    // -- F1 ----------------------------------------------------------------

    //= spec.md#F1
    /// The current generation, after the fork check every operation starts
    /// with (fork generation only: two relaxed loads).
    #[inline]
    fn shared(&self) -> &Shared<R> {
        if fork::generation() != self.forks_seen.load(Std::Acquire) {
            self.after_fork();
        }
        // SAFETY: never null; generations are freed only in `Drop`.
        unsafe { &*self.shared.load(Std::Acquire) }
    }

    //= spec.md#F1
    /// [`Self::shared`] plus the pid comparison, for paths that take the
    /// exclusive lock (a child must not touch a lock a vanished thread holds).
    fn shared_slow(&self) -> &Shared<R> {
        if std::process::id() != self.pid.load(Std::Acquire) {
            self.after_fork();
        }
        self.shared()
    }

    #[cold]
    fn after_fork(&self) {
        self.with_forget_flag(|| {
            let gen = fork::generation();
            let pid = std::process::id();
            if gen != self.forks_seen.load(Std::Acquire) || pid != self.pid.load(Std::Acquire) {
                self.forget_generation();
                self.pid.store(pid, Std::Release);
                self.forks_seen.store(gen, Std::Release);
            }
        });
    }

    fn with_forget_flag(&self, f: impl FnOnce()) {
        while self.forgetting.compare_exchange(false, true, Std::Acquire, Std::Relaxed).is_err() {
            std::hint::spin_loop();
            std::thread::yield_now();
        }
        f();
        self.forgetting.store(false, Std::Release);
    }

    //= spec.md#S2.6
    /// Installs a fresh generation and leaks the old one: its entries are
    /// forgotten without registrar calls; its leases release as no-ops.
    fn forget_generation(&self) {
        let fresh = Box::into_raw(Box::new(Shared::<R>::new(self.queue_capacity, self.config.lane_slots)));
        let old = self.shared.swap(fresh, Std::AcqRel);
        // SAFETY: never null; deliberately leaked from here on (never freed).
        let old = unsafe { &*old };
        add(&self.counters.forgotten, old.live_regs.load(Std::Acquire));
        let (h, r) = old.lanes.installed().map(|l| l.counts()).fold((0, 0), |(a, b), (h, r)| (a + h, b + r));
        add(&self.counters.lane_hits_forgotten, h);
        add(&self.counters.lane_releases_forgotten, r);
    }

    /// Replays `Op::Fork` (spec.md#S2.6): forgets every registration without
    /// calling the registrar, as a forked child does at its first operation.
    /// Leases held now release as no-ops. The forgotten handles are leaked.
    pub fn simulate_fork(&self) {
        let _ = self.shared();
        self.with_forget_flag(|| self.forget_generation());
    }

    // -- locks ---------------------------------------------------------------

    fn write<'a>(&self, shared: &'a Shared<R>) -> WriteGuard<'a, R> {
        WriteGuard::new(shared.lock.write().unwrap_or_else(PoisonError::into_inner))
    }

    fn try_write<'a>(&self, shared: &'a Shared<R>) -> Option<WriteGuard<'a, R>> {
        match shared.lock.try_write() {
            Ok(g) => Some(WriteGuard::new(g)),
            Err(TryLockError::Poisoned(p)) => Some(WriteGuard::new(p.into_inner())),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    // -- acquire -------------------------------------------------------------

    /// Obtains a lease on a registration covering `[addr, addr+len)` with at
    /// least `access` (spec.md#S2.1). The lease is released when dropped.
    // Always inlined: the caller then takes the lease from registers. Returned
    // from a call, the result passes through memory, and reading it back
    // stalls store forwarding (more than the whole lane hit costs).
    #[inline(always)]
    pub fn acquire(&self, addr: u64, len: u64, access: Access) -> Result<Lease<'_, R>, Error> {
        let shared = self.shared();
        let range = Range::new(addr, len);
        if let Ok(range) = range {
            //= spec.md#LN1
            //# lane hit (before A1): if the queue is empty and a slot of this
            //# thread's lane has exactly the request's key
            if self.lanes_on && shared.queue.is_empty() && shared.draining.load(Ordering::Acquire) == 0 {
                if let Some(lane) = shared.lanes.mine() {
                    let span = range.pages(self.page_size);
                    match lane::try_hit(lane, span, access) {
                        lane::LaneHit::Hit(p, slot) => {
                            // SAFETY: LN6: the slot's count keeps the entry alive.
                            let e = EntryPtr(unsafe { NonNull::new_unchecked(p) });
                            self.touch(e);
                            lane.count_hit();
                            return Ok(Lease::on_lane(self, shared, e, lane.lane_ref(slot)));
                        }
                        lane::LaneHit::Undone(p, slot) => self.lane_detached(shared, lane.lane_ref(slot), p),
                        lane::LaneHit::None => {}
                    }
                }
            }
        }
        self.acquire_locked(shared, range, access)
    }

    /// A1 onwards (the lane had no memo for the request).
    #[inline(never)]
    fn acquire_locked<'c>(
        &'c self,
        shared: &'c Shared<R>,
        range: Result<Range, RangeError>,
        access: Access,
    ) -> Result<Lease<'c, R>, Error> {
        self.hot.bump(Hot::Acquires);
        let range = match range {
            Ok(r) => r,
            Err(e) => {
                inc(&self.counters.errors);
                return Err(Error::from_range(e));
            }
        };
        let span = range.pages(self.page_size);
        if shared.queue.is_empty() {
            //= spec.md#A1
            //# if the queue is empty, take the lock *shared*; look up a covering
            //# findable entry with sufficient access; if found, increment its lease
            //# count atomically
            // Claimed before the lock: a first claim allocates, and nothing
            // may free memory under the lock (A11). A lane installed during a
            // revoke holds no memo yet (memos are set under the lock).
            let lane = if self.lanes_on { shared.lanes.mine_or_claim() } else { None };
            let st = shared.lock.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(slot) = st.index.covering(span, access) {
                let e = slot.value;
                // SAFETY: in the index, lock held.
                let entry = unsafe { e.get() };
                entry.state.acquire();
                //= spec.md#LN2
                //# memoize (in A1, under the lock shared)
                if let Some(lane) = lane {
                    lane::memoize(lane, span, access, entry, e.0.as_ptr());
                }
                drop(st);
                self.touch(e);
                //= spec.md#A1
                //# after unlocking, if the queue is non-empty, try the lock
                //# exclusive and drain
                if !shared.queue.is_empty() {
                    // A hook's try-lock failed against our shared lock.
                    drop(DeregList::new(self, shared));
                }
                self.hot.bump(Hot::Hits);
                return Ok(Lease::new(self, shared, e, true, false));
            }
        }
        self.acquire_slow(shared, range, span, access)
    }

    #[inline(never)]
    fn acquire_slow<'c>(
        &'c self,
        shared: &'c Shared<R>,
        range: Range,
        span: PageSpan,
        access: Access,
    ) -> Result<Lease<'c, R>, Error> {
        // F1 with the pid: we are about to take the exclusive lock. (Same
        // generation as the fast path's unless a fork just happened.)
        let _ = shared;
        let shared = self.shared_slow();
        let mut deregs = DeregList::new(self, shared);
        let mut pressure_used = false;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            //= spec.md#A2
            //# slow path: take the lock exclusive; drain (A-D).
            let mut st = self.write(shared);
            self.drain(shared, &mut st, &mut deregs);
            //= spec.md#A3
            //# look up again; on a hit, lease it, unlock, perform the dereg list, return.
            if let Some(e) = st.index.covering(span, access).map(|s| s.value) {
                // SAFETY: in the index, lock held.
                unsafe { e.get() }.state.acquire();
                self.touch(e);
                drop(st);
                deregs.perform();
                self.hot.bump(Hot::Hits);
                // After an A7 retry this acquire may already have trimmed.
                return Ok(Lease::new(self, shared, e, true, pressure_used));
            }
            //= spec.md#A4
            //# miss: plan the registration per S6.1; add an in-flight record
            //# (range, stale = false); unlock.
            let Some(mut plan) = self.plan(&st.index, span, access) else {
                drop(st);
                return Err(self.fail(Error::WrappingRange { addr: range.addr, len: range.len }));
            };
            let mut token = self.add_inflight(&mut st, plan.span);
            drop(st);
            deregs.perform();
            if let Some(src) = self.source.get() {
                if let Err(detail) = src.watch(plan.range) {
                    self.abandon_inflight(shared, token, &mut deregs);
                    return Err(self.fail(Error::Watch { range: plan.range, detail }));
                }
            }
            //= spec.md#A5
            //# call the registrar without the lock.
            let handle = match self.registrar.register(plan.range, plan.access) {
                Ok(h) => h,
                Err(err)
                    if !pressure_used
                        && matches!(err.failure, RegistrarFailure::NoMemory | RegistrarFailure::Again) =>
                {
                    //= spec.md#A5
                    //# On ENOMEM/EAGAIN (first time only): trim (S2.8) as a step
                    //# of its own: take the lock, note the unleased entries,
                    //# drain, evict the noted ones still findable and unleased
                    //# into the dereg list (...), re-plan per A4
                    pressure_used = true;
                    let mut st = self.write(shared);
                    let noted = self.note_unleased(shared, &st, false);
                    self.drain(shared, &mut st, &mut deregs);
                    st.take_inflight(token);
                    self.evict_all_unleased(shared, &mut st, &mut deregs, &noted);
                    // The model plans after the pressure eviction: under
                    // `merge`, evicted neighbours are no longer merged.
                    let Some(p) = self.plan(&st.index, span, access) else {
                        drop(st);
                        return Err(self.fail(Error::WrappingRange { addr: range.addr, len: range.len }));
                    };
                    let watched = plan.range;
                    plan = p;
                    token = self.add_inflight(&mut st, plan.span);
                    drop(st);
                    deregs.perform();
                    // The re-plan only drops evicted neighbours, so it lies
                    // within the watched range; watch it anyway if not.
                    if let Some(src) = self.source.get().filter(|_| !watched.contains(&plan.range)) {
                        if let Err(detail) = src.watch(plan.range) {
                            self.abandon_inflight(shared, token, &mut deregs);
                            return Err(self.fail(Error::Watch { range: plan.range, detail }));
                        }
                    }
                    match self.registrar.register(plan.range, plan.access) {
                        Ok(h) => h,
                        Err(source) => return self.registration_failed(shared, token, deregs, span, access, true, source),
                    }
                }
                Err(source) => return self.registration_failed(shared, token, deregs, span, access, pressure_used, source),
            };
            //= spec.md#A6
            //# take the lock exclusive; if inserting the planned entry could
            //# exceed a limit (...), raise the over-limit flag and note which
            //# findable entries are unleased (...); drain.
            let mut st = self.write(shared);
            // Only an insert that could exceed a limit may evict (the drain
            // and displacement only remove entries): skip the O(n) note else.
            let noted = if self.could_exceed_limits(&st, plan.range.len) {
                self.note_unleased(shared, &st, true)
            } else {
                Noted::default()
            };
            self.drain(shared, &mut st, &mut deregs);
            let record = st.take_inflight(token);
            debug_assert!(record.is_some(), "in-flight record vanished");
            //= spec.md#A8
            //# if a findable entry now covers the request (another thread
            //# inserted it): lease it and return it as a hit
            // Checked first (A7 "first A8's test"): a findable entry is fresh,
            // whether or not our own registration went stale meanwhile.
            if let Some(e) = st.index.covering(span, access).map(|s| s.value) {
                // SAFETY: in the index, lock held.
                unsafe { e.get() }.state.acquire();
                self.touch(e);
                deregs.items.push(Dereg::Discard(handle));
                self.settle_over_limit(shared, &st);
                drop(st);
                deregs.perform();
                self.hot.bump(Hot::Hits);
                return Ok(Lease::new(self, shared, e, true, pressure_used));
            }
            //= spec.md#A7
            //# if the in-flight record is stale, or (merge, no-merge-uncache-contained)
            //# the plan recomputed now differs from A4's: remove it, unlock,
            //# deregister the new registration, retry from A2
            let stale = record.is_some_and(|r| r.stale);
            let replanned = self.config.contract.policy != OverlapPolicy::Independent
                && self.plan(&st.index, span, access).is_none_or(|p| (p.span, p.access) != (plan.span, plan.access));
            if (stale || replanned) && !fault!(self.config, skip_seq_recheck) {
                self.settle_over_limit(shared, &st);
                drop(st);
                deregs.items.push(Dereg::Discard(handle));
                deregs.perform();
                inc(&self.counters.stale_retries);
                if attempts >= self.config.max_retries {
                    return Err(self.fail(Error::RetriesExhausted { attempts }));
                }
                continue;
            }
            //= spec.md#A9
            //# else insert: remove the in-flight record, insert the entry with
            //# lease count 1 and the next id, displace per S6.1
            let e = self.insert(shared, &mut st, plan, handle, &mut deregs);
            inc(&self.counters.misses);
            //= spec.md#A10
            //# evict per S6.4 into the dereg list, choosing victims only among
            //# the entries A6 noted unleased that are still findable
            self.enforce_limits(shared, &mut st, &mut deregs, &noted);
            //= spec.md#A11
            //# unlock; perform the dereg list.
            drop(st);
            deregs.perform();
            // Once per acquire (S5.4): a later attempt (A7 retry) still reports
            // the evictions an earlier attempt made.
            return Ok(Lease::new(self, shared, e, false, pressure_used));
        }
    }

    /// Counts a failed operation and passes its error through.
    fn fail(&self, e: Error) -> Error {
        inc(&self.counters.errors);
        e
    }

    //= spec.md#A5
    //# On failure: take the lock, drain, remove the in-flight record; if a
    //# findable entry now covers the request, lease it and return it as a hit
    //# (as A8); else unlock and return E5.
    /// E5 then linearizes here, where no entry covers the request (the
    /// model's E5 needs a miss); the plan it failed on may be older.
    #[allow(clippy::too_many_arguments)]
    fn registration_failed<'c>(
        &'c self,
        shared: &'c Shared<R>,
        token: u64,
        mut deregs: DeregList<'c, R>,
        span: PageSpan,
        access: Access,
        pressure: bool,
        source: crate::registrar::RegistrarError,
    ) -> Result<Lease<'c, R>, Error> {
        let mut st = self.write(shared);
        self.drain(shared, &mut st, &mut deregs);
        st.take_inflight(token);
        let covering = st.index.covering(span, access).map(|s| s.value);
        if let Some(e) = covering {
            // SAFETY: in the index, lock held.
            unsafe { e.get() }.state.acquire();
            self.touch(e);
        }
        drop(st);
        deregs.perform();
        match covering {
            Some(e) => {
                self.hot.bump(Hot::Hits);
                Ok(Lease::new(self, shared, e, true, pressure))
            }
            None => {
                let registrar = self.registrar.name();
                Err(self.fail(Error::Registrar { registrar, pressure, source }))
            }
        }
    }

    fn abandon_inflight<'c>(&'c self, shared: &'c Shared<R>, token: u64, deregs: &mut DeregList<'c, R>) {
        let mut st = self.write(shared);
        self.drain(shared, &mut st, deregs);
        st.take_inflight(token);
        drop(st);
        deregs.perform();
    }

    //= spec.md#S6.1
    /// The registration a miss creates. `None` if its byte range would end
    /// past the last byte of the address space.
    fn plan(&self, index: &IntervalIndex<EntryPtr<R>>, span: PageSpan, access: Access) -> Option<Plan> {
        //= spec.md#S6.2
        let mut new_span = span.align(self.chunk_pages);
        let mut new_access = access;
        if self.config.contract.policy == OverlapPolicy::Merge {
            // Widen to the union with every overlapping entry until nothing
            // more overlaps: the model's fixpoint (order does not matter).
            loop {
                let mut grown = new_span;
                for (s, slot) in index.overlapping(new_span) {
                    grown = grown.union(&s);
                    new_access = new_access | slot.access;
                }
                let grown = grown.align(self.chunk_pages);
                if grown == new_span {
                    break;
                }
                new_span = grown;
            }
        }
        if self.config.contract.policy == OverlapPolicy::NoMergeUncacheContained {
            // Keep the rights of the entries this one displaces (S6.1).
            for (s, slot) in index.overlapping(new_span) {
                if new_span.contains(&s) || s.contains(&new_span) {
                    new_access = new_access | slot.access;
                }
            }
        }
        let ps = self.page_size;
        let addr = new_span.first.checked_mul(ps)?;
        new_span.end.checked_mul(ps)?;
        let len = new_span.count().checked_mul(ps)?;
        Some(Plan { span: new_span, access: new_access, range: Range { addr, len } })
    }

    /// A9: inserts a new entry with one lease, then displaces per S6.1.
    fn insert<'c>(
        &'c self,
        shared: &'c Shared<R>,
        st: &mut State<R>,
        plan: Plan,
        handle: R::Handle,
        deregs: &mut DeregList<'c, R>,
    ) -> EntryPtr<R> {
        // Displaced entries, computed against the index as it is now (another
        // thread may have changed it since A4; sequentially it is A4's plan).
        let displaced: Vec<(PageSpan, u64)> = match self.config.contract.policy {
            OverlapPolicy::Independent => Vec::new(),
            OverlapPolicy::Merge => st.index.overlapping(plan.span).into_iter().map(|(s, slot)| (s, slot.id)).collect(),
            OverlapPolicy::NoMergeUncacheContained => st
                .index
                .overlapping(plan.span)
                .into_iter()
                .filter(|(s, _)| plan.span.contains(s) || s.contains(&plan.span))
                .map(|(s, slot)| (s, slot.id))
                .collect(),
        };
        let id = self.next_id.fetch_add(1, Std::Relaxed);
        let bytes = plan.range.len;
        let view = RegView { id, addr: plan.range.addr, len: bytes, access: plan.access };
        let keys = self.registrar.keys(&handle);
        let entry = Box::new(Entry::<R> {
            state: EntryState::new(1),
            last_use: StdAtomicU64::new(0),
            priority: StdAtomicU64::new(0),
            cost: per_page_cost_ns(plan.span.count(), self.page_size),
            memoized: std::sync::atomic::AtomicBool::new(false),
            view,
            keys,
            handle: ManuallyDrop::new(handle),
        });
        let e = EntryPtr(NonNull::from(Box::leak(entry)));
        st.index.insert(plan.span, id, plan.access, e);
        st.cached_bytes += bytes;
        shared.cached.fetch_add(1, Std::Relaxed);
        inc(&self.counters.registrations);
        add(&self.counters.bytes_registered, bytes);
        shared.live_regs.fetch_add(1, Std::Relaxed);
        let pinned = shared.live_bytes.fetch_add(bytes, Std::Relaxed) + bytes;
        self.counters.peak_pinned_bytes.fetch_max(pinned, Std::Relaxed);
        self.touch(e);
        for (s, old) in displaced {
            match self.config.contract.policy {
                OverlapPolicy::Merge => inc(&self.counters.merges),
                _ => inc(&self.counters.uncached),
            }
            self.uncache(shared, st, s.first, old, deregs, false);
        }
        e
    }

    /// Removes a findable entry from the index (it leaves the lookup, S3.2):
    /// deregistered now if unleased (into the dereg list), at its last release
    /// otherwise. Returns whether it was leased.
    fn uncache<'c>(
        &'c self,
        shared: &'c Shared<R>,
        st: &mut State<R>,
        first: u64,
        id: u64,
        deregs: &mut DeregList<'c, R>,
        invalidation: bool,
    ) -> bool {
        let Some(slot) = st.index.remove(first, id) else {
            debug_assert!(false, "uncache of an entry not in the index");
            return false;
        };
        self.retire(shared, st, slot, deregs, invalidation)
    }

    /// Bookkeeping and A-H handoff for an entry just taken out of the index.
    fn retire<'c>(
        &'c self,
        shared: &'c Shared<R>,
        st: &mut State<R>,
        slot: Slot<EntryPtr<R>>,
        deregs: &mut DeregList<'c, R>,
        invalidation: bool,
    ) -> bool {
        let e = slot.value;
        // SAFETY: it was in the index and we hold the lock exclusive: nobody
        // can free it before the handoff below.
        let entry = unsafe { e.get() };
        //= spec.md#LN5
        //# Every step that takes an entry out of the index (A-D, A9
        //# displacement, A10, flush, trim) revokes it first.
        if entry.memoized.load(Std::Relaxed) {
            let p = e.0.as_ptr();
            self.revoke(shared, |q| q == p);
        }
        st.cached_bytes -= entry.view.len;
        shared.cached.fetch_sub(1, Std::Relaxed);
        #[cfg(any(test, feature = "testkit"))]
        let early = invalidation && self.config.faults.dereg_leased_on_invalidate && entry.state.leases() > 0;
        #[cfg(not(any(test, feature = "testkit")))]
        let _ = invalidation;
        #[cfg(any(test, feature = "testkit"))]
        if early {
            // P3 mutant: take the handle while the entry is surely alive (in
            // the index, lock held), then hand the entry to its last release,
            // which must not deregister it again (HANDLE_GONE).
            // SAFETY: read once; HANDLE_GONE keeps every other path off it.
            let h = unsafe { std::ptr::read(&*entry.handle) };
            return match entry.state.invalidate(EntryState::HANDLE_GONE) {
                Invalidated::Owner => {
                    // The last lease went meanwhile: the entry is ours to free.
                    deregs.items.push(Dereg::Early(h, entry.view.len));
                    // SAFETY: we own it (count was 0); its handle was read above.
                    drop(unsafe { Box::from_raw(e.0.as_ptr()) });
                    false
                }
                Invalidated::Leased => {
                    inc(&self.counters.deferred_deregistrations);
                    deregs.items.push(Dereg::Early(h, entry.view.len));
                    true
                }
            };
        }
        //= spec.md#A-H
        //# invalidation sets INVALID with one atomic OR on the state word and
        //# owns the deregistration iff the count it saw was 0
        match entry.state.invalidate(0) {
            Invalidated::Owner => {
                deregs.items.push(Dereg::Entry(e));
                false
            }
            Invalidated::Leased => {
                inc(&self.counters.deferred_deregistrations);
                true
            }
        }
    }

    //= spec.md#A-D
    /// Drains the invalidation queue and the event source, applying every
    /// event (exclusive lock held).
    fn drain<'c>(&'c self, shared: &'c Shared<R>, st: &mut State<R>, deregs: &mut DeregList<'c, R>) {
        let source = self.source.get();
        if shared.queue.is_empty() && source.is_none() {
            return;
        }
        let _draining = Draining::new(shared);
        let mut spans = Vec::new();
        shared.queue.take_all(&mut spans);
        if let Some(src) = source {
            //= spec.md#M2
            //# A2 and A6 also read pending events.
            let mut events = Vec::new();
            src.read_pending(&mut events);
            add(&self.counters.release_events, events.len() as u64);
            if !fault!(self.config, monitor_off) {
                spans.extend(events.iter().map(|ev| ev.range.pages(self.page_size)));
            }
        }
        for span in spans {
            self.apply_event(shared, st, span, deregs);
        }
    }

    //= spec.md#A-D
    //# for each queued or read event, bump nothing but apply S2.3: findable
    //# entries overlapping it leave the index (unleased → dereg list, leased →
    //# set INVALID); in-flight records overlapping it become stale.
    fn apply_event<'c>(
        &'c self,
        shared: &'c Shared<R>,
        st: &mut State<R>,
        span: PageSpan,
        deregs: &mut DeregList<'c, R>,
    ) {
        for r in st.inflight.iter_mut() {
            if r.span.overlaps(&span) {
                r.stale = true;
            }
        }
        let hit: Vec<(u64, u64)> = st.index.overlapping(span).into_iter().map(|(s, slot)| (s.first, slot.id)).collect();
        for (first, id) in hit {
            inc(&self.counters.invalidations);
            if self.uncache(shared, st, first, id, deregs, true) {
                inc(&self.counters.leased_invalidations);
            }
        }
    }

    // -- limits ------------------------------------------------------------

    fn over_limits(&self, st: &State<R>) -> bool {
        let l = &self.config.contract.limits;
        l.max_regions.is_some_and(|m| st.index.len() as u64 > m)
            || l.max_pinned_bytes.is_some_and(|m| st.cached_bytes > m)
    }

    //= spec.md#S6.3
    /// The next victim among unleased findable entries: least (last_use, id)
    /// for LRU, least (H, last_use, id) for GreedyDual-Size.
    /// Returns `(first page, id, priority)`.
    fn victim(&self, st: &State<R>, noted: &Noted) -> Option<(u64, u64, u64)> {
        let cost_aware = self.config.contract.eviction == EvictionPolicy::CostAware;
        // (sort key, first page, id, priority) of the best candidate so far.
        type Candidate = ((u64, u64, u64), u64, u64, u64);
        let mut best: Option<Candidate> = None;
        for (s, slot) in st.index.iter() {
            // SAFETY: in the index, lock held.
            let e = unsafe { slot.value.get() };
            // Noted unleased and not leased since (an entry is never leased
            // again once unleased under our lock: leasing needs the lock).
            if !noted.contains(slot.id) || e.state.leases() != 0 {
                continue;
            }
            let last = e.last_use.load(Std::Relaxed);
            let prio = e.priority.load(Std::Relaxed);
            let key = if cost_aware { (prio, last, slot.id) } else { (last, slot.id, 0) };
            let better = match &best {
                None => true,
                Some(b) => key < b.0,
            };
            if better {
                best = Some((key, s.first, slot.id, prio));
            }
        }
        best.map(|(_, first, id, prio)| (first, id, prio))
    }

    /// A6 / R2 / S2.8: the findable entries unleased now, read (SeqCst)
    /// after raising the over-limit flag if `raise_flag`. Taken *before* the
    /// drain: an event queued before a release this note sees was pushed
    /// before the note (the release came after the event returned), so the
    /// drain applies it before any victim is chosen. Releases after the note
    /// are treated as leased (they take effect after this operation) and, with
    /// the flag raised, run R2 themselves.
    fn note_unleased(&self, shared: &Shared<R>, st: &State<R>, raise_flag: bool) -> Noted {
        if raise_flag {
            shared.over_limit.store(true, Ordering::SeqCst);
        }
        //= spec.md#LN5
        //# A6 (when it notes), R2 and trim revoke every slot before they note
        self.revoke(shared, |_| true);
        let mut ids: Vec<u64> = st
            .index
            .iter()
            // SAFETY: in the index, lock held.
            .filter(|(_, slot)| unsafe { slot.value.get() }.state.leases() == 0)
            .map(|(_, slot)| slot.id)
            .collect();
        ids.sort_unstable();
        Noted(ids)
    }

    /// Whether inserting one more entry of `bytes` could put the cache over a
    /// limit (A6): the entry count or the cached bytes after the insert.
    fn could_exceed_limits(&self, st: &State<R>, bytes: u64) -> bool {
        let l = &self.config.contract.limits;
        self.limits_active
            && (l.max_regions.is_some_and(|m| st.index.len() as u64 + 1 > m)
                || l.max_pinned_bytes.is_some_and(|m| st.cached_bytes.saturating_add(bytes) > m))
    }

    /// Clears the over-limit flag when within limits (an exit that evicts
    /// nothing after [`Cache::note_unleased`] raised it).
    fn settle_over_limit(&self, shared: &Shared<R>, st: &State<R>) {
        if self.limits_active && !self.over_limits(st) {
            shared.over_limit.store(false, Ordering::SeqCst);
        }
    }

    //= spec.md#S6.4
    //= spec.md#A10
    /// Evicts while over a limit, victims among the `noted` entries. The flag
    /// stays raised if still over (every noted entry is gone or leased): a
    /// release after the note saw it and runs R2.
    fn enforce_limits<'c>(
        &'c self,
        shared: &'c Shared<R>,
        st: &mut State<R>,
        deregs: &mut DeregList<'c, R>,
        noted: &Noted,
    ) {
        if !self.limits_active {
            return;
        }
        while self.over_limits(st) {
            let Some((first, id, prio)) = self.victim(st, noted) else { break };
            self.gds_floor.fetch_max(prio, Std::Relaxed);
            inc(&self.counters.evictions);
            self.uncache(shared, st, first, id, deregs, false);
        }
        self.settle_over_limit(shared, st);
    }

    /// S2.8 / S5.4: every noted entry still findable and unleased leaves
    /// (pressure eviction).
    fn evict_all_unleased<'c>(
        &'c self,
        shared: &'c Shared<R>,
        st: &mut State<R>,
        deregs: &mut DeregList<'c, R>,
        noted: &Noted,
    ) {
        let unleased: Vec<(u64, u64)> = st
            .index
            .iter()
            // SAFETY: in the index, lock held.
            .filter(|(_, slot)| noted.contains(slot.id) && unsafe { slot.value.get() }.state.leases() == 0)
            .map(|(s, slot)| (s.first, slot.id))
            .collect();
        for (first, id) in unleased {
            inc(&self.counters.pressure_evictions);
            self.uncache(shared, st, first, id, deregs, false);
        }
        if self.limits_active {
            self.settle_over_limit(shared, st);
        }
    }

    /// A use: acquire or release (S6.3). Stamps matter only for eviction,
    /// which only limits trigger, so without limits this costs nothing.
    #[inline]
    fn touch(&self, e: EntryPtr<R>) {
        if !self.limits_active {
            return;
        }
        // SAFETY: callers hold a lease on `e` or the lock with `e` indexed.
        let entry = unsafe { e.get() };
        let now = self.clock.fetch_add(1, Std::Relaxed) + 1;
        entry.last_use.store(now, Std::Relaxed);
        if self.config.contract.eviction == EvictionPolicy::CostAware {
            entry.priority.store(self.gds_floor.load(Std::Relaxed).saturating_add(entry.cost), Std::Relaxed);
        }
    }

    // -- release -------------------------------------------------------------

    /// Gives a lease back (spec.md#S2.2). Called by `Lease::drop`.
    /// Kept tiny (it is inlined into every lease's drop): the owner's lane
    /// release without limits; everything else is [`Self::release_slow`].
    #[inline(always)]
    pub(crate) fn release(&self, shared: &Shared<R>, e: EntryPtr<R>, lane: Option<lane::LaneRef<R>>) {
        if let Some(r) = lane {
            if !self.limits_active
                && fork::generation() == self.forks_seen.load(Std::Relaxed)
                && std::ptr::eq(self.shared.load(Std::Relaxed), shared)
            {
                if let Some(mine) = shared.lanes.mine().filter(|l| l.holds(r)) {
                    //= spec.md#LN3
                    //# the owner stores `held − 1`, another thread adds 1 to
                    //# `remote` (release order). Light barrier; load `ptr`
                    mine.count_release();
                    if let lane::LaneReleased::Detached = lane::release(r, e.0.as_ptr(), true) {
                        self.lane_detached(shared, r, e.0.as_ptr());
                    }
                    return;
                }
            }
        }
        self.release_slow(shared, e, lane)
    }

    #[inline(never)]
    fn release_slow(&self, shared: &Shared<R>, e: EntryPtr<R>, lane: Option<lane::LaneRef<R>>) {
        //= spec.md#F1
        let now = self.shared();
        self.hot.bump(Hot::Releases);
        if !std::ptr::eq(now, shared) {
            // Leased before a fork: a no-op in the child (S2.6).
            return;
        }
        // Touch while our lease still keeps the entry alive.
        self.touch(e);
        if let Some(r) = lane {
            //= spec.md#LN3
            //# if it is still the lease's entry, read the over-limit flag and
            //# run R2 if it is set; else run LN4.
            let owner = lane::owns(&shared.lanes, r);
            if let lane::LaneReleased::Detached = lane::release(r, e.0.as_ptr(), owner) {
                self.lane_detached(shared, r, e.0.as_ptr());
            }
            if self.limits_active && shared.over_limit.load(Ordering::SeqCst) {
                self.release_over_limit(shared);
            }
            return;
        }
        // SAFETY: we hold a lease.
        let outcome = unsafe { e.get() }.state.release();
        match outcome {
            Released::Held => {}
            //= spec.md#R1
            //# If this took the count to 0 with INVALID set, this thread owns
            //# the deregistration: perform it (no lock needed).
            Released::Owner { handle_gone } => self.deregister_entry(shared, e, handle_gone),
            //= spec.md#R2
            //# else if the count reached 0 and the over-limit flag is set: take
            //# the lock exclusive, drain, evict (A10), unlock, perform the dereg
            //# list.
            Released::Unleased => {
                if self.limits_active && shared.over_limit.load(Ordering::SeqCst) {
                    self.release_over_limit(shared);
                }
            }
        }
    }

    //= spec.md#LN4
    //# detached release: take the lanes mutex; if the slot's count is 0 and its
    //# pin is the lease's entry, clear the pin and release the pin as R1
    #[cold]
    fn lane_detached(&self, shared: &Shared<R>, r: lane::LaneRef<R>, p: *mut Entry<R>) {
        // SAFETY: `shared` is alive, so its lanes are.
        let slot = unsafe { r.slot() };
        let unpinned = {
            let _g = shared.lanes.mutex.lock().unwrap_or_else(PoisonError::into_inner);
            let pinned = slot.pin().load(Ordering::SeqCst) == p && slot.count() == 0;
            if pinned {
                slot.pin().store(std::ptr::null_mut(), Ordering::SeqCst);
            }
            pinned
        };
        if !unpinned {
            return;
        }
        // SAFETY: the pin was a lease on `p`; we own it now.
        let e = EntryPtr(unsafe { NonNull::new_unchecked(p) });
        // SAFETY: the pin's lease keeps the entry alive until this release.
        match unsafe { e.get() }.state.release() {
            Released::Held => {}
            Released::Owner { handle_gone } => self.deregister_entry(shared, e, handle_gone),
            Released::Unleased => {
                if self.limits_active && shared.over_limit.load(Ordering::SeqCst) {
                    self.release_over_limit(shared);
                }
            }
        }
    }

    //= spec.md#LN5
    //# set `ptr` to null in every slot that points to the entries being
    //# revoked; if any, heavy barrier; then for each such slot whose count (read
    //# `remote`, then `held`) is above 0, pin it
    /// Revokes the lane memos of the entries `which` selects (lock exclusive).
    fn revoke(&self, shared: &Shared<R>, which: impl Fn(*mut Entry<R>) -> bool) {
        let mut installed = shared.lanes.installed().peekable();
        if installed.peek().is_none() {
            return;
        }
        let _g = shared.lanes.mutex.lock().unwrap_or_else(PoisonError::into_inner);
        let mut nulled = Vec::new();
        for l in installed {
            for s in l.slots() {
                let p = s.ptr.load(Ordering::Relaxed);
                if !p.is_null() && which(p) {
                    lane::null_ptr(s);
                    nulled.push((s, p));
                }
            }
        }
        if nulled.is_empty() {
            return;
        }
        lane::heavy_barrier();
        for (s, p) in nulled {
            if s.count() != 0 {
                debug_assert!(s.pin().load(Ordering::SeqCst).is_null(), "a memoized slot is never pinned");
                s.pin().store(p, Ordering::SeqCst);
                // SAFETY: findable (revokes precede removal), lock held.
                unsafe { &*p }.state.acquire();
            }
        }
    }

    #[cold]
    fn release_over_limit(&self, shared: &Shared<R>) {
        if !std::ptr::eq(self.shared_slow(), shared) {
            return;
        }
        let mut deregs = DeregList::new(self, shared);
        let mut st = self.write(shared);
        let noted = self.note_unleased(shared, &st, true);
        self.drain(shared, &mut st, &mut deregs);
        self.enforce_limits(shared, &mut st, &mut deregs, &noted);
        drop(st);
        deregs.perform();
    }

    /// Deregisters and frees an entry this thread owns (A-H).
    fn deregister_entry(&self, shared: &Shared<R>, e: EntryPtr<R>, handle_gone: bool) {
        // SAFETY: the handoff made us the only owner; created by Box::leak.
        let boxed = unsafe { Box::from_raw(e.0.as_ptr()) };
        let Entry { handle, view, .. } = *boxed;
        if fault!(self.config, leak_deregistration) {
            // P4 fault: the registration is never deregistered.
            std::mem::forget(ManuallyDrop::into_inner(handle));
            return;
        }
        if handle_gone {
            // Already deregistered (and counted) by the P3 fault.
            return;
        }
        self.call_deregister(ManuallyDrop::into_inner(handle));
        self.count_dereg(shared, view.len);
    }

    fn call_deregister(&self, h: R::Handle) {
        if self.registrar.deregister(h).is_err() {
            inc(&self.counters.dereg_failures);
        }
    }

    fn count_dereg(&self, shared: &Shared<R>, bytes: u64) {
        inc(&self.counters.deregistrations);
        shared.live_regs.fetch_sub(1, Std::Relaxed);
        shared.live_bytes.fetch_sub(bytes, Std::Relaxed);
    }

    // -- release events ------------------------------------------------------

    /// A4's in-flight record, after widening the hull that
    /// [`Cache::may_hold`] reads. The hull grows before the registrar runs, so
    /// an event that misses it happened before the registration began.
    fn add_inflight(&self, st: &mut State<R>, span: PageSpan) -> u64 {
        self.hull_lo.fetch_min(span.first, Std::SeqCst);
        self.hull_hi.fetch_max(span.end, Std::SeqCst);
        st.add_inflight(span)
    }

    /// Whether a release event on `[addr, addr+len)` could concern a
    /// registration of this cache: a lock-free filter for allocator hooks
    /// ([`crate::monitor::alloc::MonitoredAlloc`]), which see every free.
    pub fn may_hold(&self, addr: u64, len: u64) -> bool {
        let Ok(range) = Range::new(addr, len) else { return false };
        let span = range.pages(self.page_size);
        span.first < self.hull_hi.load(Std::SeqCst) && self.hull_lo.load(Std::SeqCst) < span.end
    }

    /// A release event: the process stopped mapping `[addr, addr+len)`
    /// (spec.md#S2.3). The synchronous-hook / explicit path: never waits for
    /// the cache lock (H1, H2); a full queue collapses into one hull event
    /// (L2). Callable from any thread, including one inside a cache
    /// operation (a registrar, an allocator hook under the cache lock).
    pub fn invalidate(&self, addr: u64, len: u64, kind: ReleaseKind) -> Result<(), Error> {
        let _ = kind; // recorded for reports only (S2.3)
        let shared = self.shared_slow();
        inc(&self.counters.release_events);
        let range = Range::new(addr, len).map_err(|e| self.fail(Error::from_range(e)))?;
        if fault!(self.config, monitor_off) {
            return Ok(());
        }
        let span = range.pages(self.page_size);
        let held = held_by_this_thread();
        //= spec.md#H1
        //# sync hook / explicit invalidate: push the event on the queue (wakes nobody).
        shared.queue.push(span);
        //= spec.md#H2
        //# try the lock exclusive: if acquired, drain, unlock, perform the dereg
        //# list; if not, return (the holder or the next slow path drains).
        if !held {
            if let Some(mut st) = self.try_write(shared) {
                let mut deregs = DeregList::new(self, shared);
                self.drain(shared, &mut st, &mut deregs);
                drop(st);
                deregs.perform();
            }
        }
        Ok(())
    }

    //= spec.md#M2
    //# take the lock exclusive; read every pending event non-blockingly (this
    //# wakes the releasing threads) and apply each (A-D), all in the same
    //# critical section; unlock; perform the dereg list.
    /// The monitor round (M2): `read` runs under the exclusive lock and appends
    /// the events it reads (non-blocking); they and every queued event are
    /// applied in the same critical section; deregistrations follow the unlock.
    /// `read` must not block, free monitored memory, or call into the cache
    /// other than [`Cache::invalidate`] (which then only queues).
    pub fn drain_with(&self, read: impl FnOnce(&mut Vec<ReleaseEvent>)) {
        let shared = self.shared_slow();
        let mut deregs = DeregList::new(self, shared);
        let mut events = Vec::new();
        let mut st = self.write(shared);
        let _draining = Draining::new(shared);
        read(&mut events);
        add(&self.counters.release_events, events.len() as u64);
        if !fault!(self.config, monitor_off) {
            for ev in &events {
                self.apply_event(shared, &mut st, ev.range.pages(self.page_size), &mut deregs);
            }
        }
        self.drain(shared, &mut st, &mut deregs);
        drop(st);
        deregs.perform();
    }

    //= spec.md#M1
    //# uffd monitor thread: poll until the fd is readable, without reading.
    /// One monitor round with the installed [`EventSource`] (spec.md#M2).
    /// The monitor thread polls its fd for readability *without reading*
    /// (M1), then calls this; the events are read only under the exclusive
    /// lock. Returns `false` if no source is installed.
    pub fn monitor_round(&self) -> bool {
        match self.source.get() {
            Some(src) => {
                self.drain_with(|events| src.read_pending(events));
                true
            }
            None => false,
        }
    }

    //= spec.md#S2.5
    /// Every findable entry leaves the lookup (unleased ones are deregistered
    /// now, leased ones at their last release).
    pub fn flush(&self) {
        let shared = self.shared_slow();
        let mut deregs = DeregList::new(self, shared);
        let mut st = self.write(shared);
        self.drain(shared, &mut st, &mut deregs);
        for (_, slot) in st.index.take_all() {
            self.retire(shared, &mut st, slot, &mut deregs, false);
        }
        shared.over_limit.store(false, Ordering::SeqCst);
        drop(st);
        deregs.perform();
    }

    //= spec.md#S2.8
    /// Every unleased findable entry leaves the lookup and is deregistered;
    /// leased ones stay. For applications short of pinnable memory; the cache
    /// trims by itself when the registrar fails with ENOMEM/EAGAIN (S5.4).
    pub fn trim(&self) {
        let shared = self.shared_slow();
        let mut deregs = DeregList::new(self, shared);
        let mut st = self.write(shared);
        let noted = self.note_unleased(shared, &st, false);
        self.drain(shared, &mut st, &mut deregs);
        self.evict_all_unleased(shared, &mut st, &mut deregs, &noted);
        drop(st);
        deregs.perform();
    }

    // -- observation ---------------------------------------------------------

    /// Counters in the shared schema (spec.md#S8). Exact when no operation is
    /// in flight.
    pub fn stats(&self) -> Stats {
        let shared = self.shared();
        let c = &self.counters;
        let (lane_hits, lane_releases) = self.lane_counts(shared);
        Stats {
            acquires: self.hot.sum(Hot::Acquires) + lane_hits,
            hits: self.hot.sum(Hot::Hits) + lane_hits,
            misses: get(&c.misses),
            errors: get(&c.errors),
            releases: self.hot.sum(Hot::Releases) + lane_releases,
            release_events: get(&c.release_events),
            registrations: get(&c.registrations),
            deregistrations: get(&c.deregistrations),
            bytes_registered: get(&c.bytes_registered),
            pinned_bytes: shared.live_bytes.load(Std::Relaxed),
            peak_pinned_bytes: get(&c.peak_pinned_bytes),
            cached_entries: shared.cached.load(Std::Relaxed),
            invalidations: get(&c.invalidations),
            leased_invalidations: get(&c.leased_invalidations),
            deferred_deregistrations: get(&c.deferred_deregistrations),
            merges: get(&c.merges),
            uncached: get(&c.uncached),
            evictions: get(&c.evictions),
            pressure_evictions: get(&c.pressure_evictions),
            forgotten: get(&c.forgotten),
        }
    }

    /// Lane hits and owner lane releases: the current generation's lanes plus
    /// those of forgotten generations (folded in at the fork).
    fn lane_counts(&self, shared: &Shared<R>) -> (u64, u64) {
        let (h, r) = shared.lanes.installed().map(|l| l.counts()).fold((0, 0), |(a, b), (h, r)| (a + h, b + r));
        (h + get(&self.counters.lane_hits_forgotten), r + get(&self.counters.lane_releases_forgotten))
    }

    /// Internal counters outside the shared schema.
    pub fn diagnostics(&self) -> Diagnostics {
        let shared = self.shared();
        let c = &self.counters;
        Diagnostics {
            discarded_registrations: get(&c.discarded_registrations),
            stale_retries: get(&c.stale_retries),
            dereg_failures: get(&c.dereg_failures),
            early_deregistrations: get(&c.early_deregistrations),
            queued_events: shared.queue.len() as u64,
            queue_capacity: shared.queue.capacity() as u64,
            lane_hits: self.lane_counts(shared).0,
            lanes: shared.lanes.installed().count() as u64,
            pinned_slots: shared
                .lanes
                .installed()
                .flat_map(|l| l.slots())
                .filter(|s| !s.pin().load(Ordering::SeqCst).is_null())
                .count() as u64,
            membarrier: lane::uses_membarrier(),
        }
    }

    /// The findable entries, oldest first (takes the lock shared).
    pub fn cached_views(&self) -> Vec<RegView> {
        let shared = self.shared();
        let st = shared.lock.read().unwrap_or_else(PoisonError::into_inner);
        let mut v: Vec<RegView> = st
            .index
            .iter()
            // SAFETY: in the index, lock held.
            .map(|(_, slot)| unsafe { slot.value.get() }.view)
            .collect();
        v.sort_by_key(|r| r.id);
        v
    }

    /// Counts a failed op the harness rejects itself (E3, E4).
    pub(crate) fn count_error(&self) {
        let _ = self.shared();
        inc(&self.counters.errors);
    }

    pub(crate) fn count_release(&self) {
        let _ = self.shared();
        self.hot.bump(Hot::Releases);
    }

    pub(crate) fn count_acquire(&self) {
        let _ = self.shared();
        self.hot.bump(Hot::Acquires);
    }
}

impl<R: Registrar> Drop for Cache<R> {
    fn drop(&mut self) {
        // F1 first: a forked child must not deregister the parent's registrations.
        // Leased entries (only possible if a lease was leaked with
        // mem::forget) are leaked with it.
        self.flush();
        let p = self.shared.swap(std::ptr::null_mut(), Std::AcqRel);
        // SAFETY: the current generation, created by Box::into_raw; no lease
        // can outlive the cache, so nothing refers to it any more.
        drop(unsafe { Box::from_raw(p) });
    }
}
