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
//! - the **release windows** (`window::Windows`, spec.md#W1–W3): a multiset
//!   of the page spans `release_begin` opened and `release_end` has not
//!   closed yet, behind a leaf mutex; A4 marks an in-flight record planned
//!   inside one *windowed*, and such a registration is never cached;
//! - the **invalidation queue** ([`InvalidationQueue`]): release events pushed
//!   by hooks that could not take the lock (H1, H2);
//! - per entry, the **state word** ([`EntryState`]: lease count + INVALID) and
//!   the LRU / GreedyDual-Size stamps, all atomics, so the hit path only needs
//!   the lock shared;
//! - the **over-limit flag** (R2);
//! - with limits, the **eviction order** (`evict_order`): a lazy min-heap
//!   of victim candidates in policy order, under the lock exclusive, so that
//!   A6 / R2 note only the least unleased entries that cover the excess and
//!   A10 evicts them without scanning the index (spec.md#A6 allows the
//!   shorter note; debug builds check each victim against the full note).
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
//! lane (module `lanes`), and a repeated acquire of the same key is served there
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
//! again. Leases from the old generation are released as no-ops. The event
//! source (the monitor) belongs to a generation too: the old one's watches
//! the parent's memory and stays with it, and a child whose parent read a
//! monitor caches nothing until it installs its own (`Shared::caching`).
//! [`Cache::simulate_fork`] does the same on request, for replaying `Op::Fork`.
//!
//! # Sequential equivalence with the model
//!
//! For any sequential sequence of operations the cache returns the `Ret`s of
//! `mrcache_model::Model::step` and the same [`Stats`](mrcache_types::Stats): the same canonical hit
//! (lowest covering id), the same overlap plan (S6.1), ids in creation order
//! of cached registrations (registrations discarded by A7/A8 get none), the
//! same LRU / GreedyDual-Size victims (one logical clock ticked by every use;
//! ties by id), the same pressure handling (S5.4: the plan is recomputed
//! after the pressure eviction, as the model plans after evicting).

mod acquire;
mod config;
mod dereg;
mod entry;
mod events;
mod evict;
mod evict_order;
mod fork;
mod generation;
mod lanes;
mod lease;
mod queue;
mod release;
mod state;
mod stats;
mod window;

pub use config::{CacheConfig, Monitoring, DEFAULT_MAX_RETRIES, DEFAULT_MAX_UNRELEASED};
#[cfg(any(test, feature = "faults"))]
pub use config::Faults;
pub use events::{EventSource, ReleaseEvent, RoundDeregs, RoundLock, Watched};
pub use fork::generation as fork_generation;
pub use lanes::{uses_membarrier, LANE_SLOTS, MAX_LANES};
pub use lease::{Lease, OwnedLease, SharedCache};
pub use queue::{InvalidationQueue, Pushed, MAX_QUEUE_CAPACITY};
pub use state::{EntryState, Invalidated, Released};
pub use stats::Diagnostics;
pub(crate) use entry::{Entry, EntryPtr};
pub(crate) use generation::Shared;

use self::stats::{Counters, HotCounters};
use crate::error::Error;
use crate::registrar::Registrar;
use crate::sync::{Ordering, plain};

/// A memory-registration cache implementing spec.md §A. `Send + Sync`; share
/// it by reference, in an `Arc`, or in a [`SharedCache`] handle (which hands
/// out [`OwnedLease`]s, leases that do not borrow it).
///
/// A cache needs a monitor to stay fresh: a [`crate::MonitorThread`], or
/// [`Cache::invalidate`] (or [`Cache::release_begin`] / [`Cache::release_end`])
/// called on every release of memory it may hold (the crate docs show both).
///
/// ```
/// use mrcache::registrar::counting::CountingRegistrar;
/// use mrcache::types::{Access, ReleaseKind};
/// use mrcache::{Cache, CacheConfig};
///
/// # fn main() -> Result<(), mrcache::Error> {
/// let cache = Cache::new(CountingRegistrar::default(), CacheConfig::explicit());
/// let buf = vec![1u8; 4096];
/// let lease = cache.acquire_slice(&buf, Access::LOCAL_WRITE)?; // a miss: registers
/// let view = lease.view(); // what was registered: id, addr, len, access
/// assert!(view.addr <= buf.as_ptr() as u64 && view.len >= 4096);
/// drop(lease);
/// // This program's own memory hook: the buffer goes back to the system.
/// cache.invalidate(buf.as_ptr() as u64, 4096, ReleaseKind::Munmap)?;
/// assert_eq!(cache.stats().invalidations, 1);
/// # Ok(())
/// # }
/// ```
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
    shared: plain::AtomicPtr<Shared<R>>,
    forks_seen: plain::AtomicU64,
    pid: plain::AtomicU32,
    forgetting: plain::AtomicBool,
    /// Generations replaced by [`Cache::simulate_fork`] (same process): unlike
    /// a real child's, they are freed in `Drop`, with their monitor (whose fd
    /// would otherwise stay open, and a later munmap of watched memory wait
    /// forever for a reader).
    replayed: std::sync::Mutex<Vec<usize>>,
    /// Logical clock of uses (LRU) and GreedyDual-Size inflation value.
    clock: plain::AtomicU64,
    gds_floor: plain::AtomicU64,
    next_id: plain::AtomicU64,
    counters: Counters,
    hot: HotCounters,
    /// Page hull `[lo, hi)` of every registration ever planned (A4): a
    /// release event outside it cannot concern the cache. Only grows.
    hull_lo: plain::AtomicU64,
    hull_hi: plain::AtomicU64,
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
        lanes::init_barriers();
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
            shared: plain::AtomicPtr::new(Box::into_raw(Box::new(Shared::new(queue_capacity, config.lane_slots, false)))),
            forks_seen: plain::AtomicU64::new(fork::generation()),
            pid: plain::AtomicU32::new(std::process::id()),
            forgetting: plain::AtomicBool::new(false),
            replayed: std::sync::Mutex::new(Vec::new()),
            clock: plain::AtomicU64::new(0),
            gds_floor: plain::AtomicU64::new(0),
            next_id: plain::AtomicU64::new(1),
            hull_lo: plain::AtomicU64::new(u64::MAX),
            hull_hi: plain::AtomicU64::new(0),
            counters: Counters::default(),
            hot: HotCounters::new(),
        })
    }

    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    pub fn registrar(&self) -> &R {
        &self.registrar
    }

    /// Installs the asynchronous monitor that A2, A6 and [`Cache::drain_with`]
    /// read under the exclusive lock. Only one per process; later calls return
    /// the source. A forked child starts without one and caches nothing until
    /// it installs its own (spec.md#S2.6): the parent's monitor neither sees
    /// the child's releases nor may be read by it.
    pub fn set_event_source(&self, source: Box<dyn EventSource>) -> Result<(), Box<dyn EventSource>> {
        self.shared_slow().source.set(source)
    }
}

impl<R: Registrar> Drop for Cache<R> {
    fn drop(&mut self) {
        // F1 first: a forked child must not deregister the parent's registrations.
        // Leased entries (only possible if a lease was leaked with
        // mem::forget) are leaked with it.
        self.flush();
        let p = self.shared.swap(std::ptr::null_mut(), Ordering::AcqRel);
        // SAFETY: the current generation, created by Box::into_raw; no lease
        // can outlive the cache, so nothing refers to it any more.
        drop(unsafe { Box::from_raw(p) });
        // The generations a replayed fork replaced, newest first (a newer one
        // may read an older one's monitor). Same process: no fork happened,
        // and no lease outlives the cache.
        let replayed = std::mem::take(&mut *self.replayed.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        if std::process::id() == self.pid.load(Ordering::Acquire) {
            for g in replayed.into_iter().rev() {
                // SAFETY: created by Box::into_raw, swapped out by
                // `simulate_fork` and referred to by nothing any more.
                drop(unsafe { Box::from_raw(g as *mut Shared<R>) });
            }
        }
    }
}

