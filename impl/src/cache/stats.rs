//! Counters behind [`crate::Cache::stats`] (spec.md#S8).
//!
//! The three counters the hit path bumps (`acquires`, `hits`, `releases`) are
//! striped per thread: each thread gets a process-wide slot number once; a
//! thread whose slot is below [`SLOTS`] is the only writer of that slot in
//! every cache, so it bumps it with a plain load + store (no locked
//! read-modify-write, no shared cache line). Later threads share an overflow
//! slot bumped with `fetch_add`. Everything else is bumped on slow paths with
//! `fetch_add`. A [`crate::Cache::stats`] snapshot sums the slots; it is exact
//! when no operation is in flight (always, in sequential use).
//!
//! These are plain `std` atomics even under loom (see [`crate::sync`]).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// Per-thread slots per cache.
pub const SLOTS: usize = 64;

static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

std::thread_local! {
    static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// This thread's slot number (assigned on first use, never reused).
#[inline]
fn slot_index() -> usize {
    SLOT.try_with(|s| {
        let v = s.get();
        if v != usize::MAX {
            v
        } else {
            let n = NEXT_SLOT.fetch_add(1, Relaxed);
            s.set(n);
            n
        }
    })
    // During thread-local destruction: use the shared slot.
    .unwrap_or(usize::MAX)
}

#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct HotSlot {
    pub acquires: AtomicU64,
    pub hits: AtomicU64,
    pub releases: AtomicU64,
}

/// Which hot counter to bump.
#[derive(Clone, Copy)]
pub(crate) enum Hot {
    Acquires,
    Hits,
    Releases,
}

impl HotSlot {
    #[inline]
    fn get(&self, which: Hot) -> &AtomicU64 {
        match which {
            Hot::Acquires => &self.acquires,
            Hot::Hits => &self.hits,
            Hot::Releases => &self.releases,
        }
    }
}

#[derive(Debug)]
pub(crate) struct HotCounters {
    slots: Box<[HotSlot]>,
    overflow: HotSlot,
}

impl HotCounters {
    pub fn new() -> Self {
        HotCounters { slots: (0..SLOTS).map(|_| HotSlot::default()).collect(), overflow: HotSlot::default() }
    }

    #[inline]
    pub fn bump(&self, which: Hot) {
        let i = slot_index();
        match self.slots.get(i) {
            Some(slot) => {
                // Only this thread ever writes this slot: no RMW needed.
                let c = slot.get(which);
                c.store(c.load(Relaxed).wrapping_add(1), Relaxed);
            }
            None => {
                self.overflow.get(which).fetch_add(1, Relaxed);
            }
        }
    }

    pub fn sum(&self, which: Hot) -> u64 {
        self.slots.iter().chain(std::iter::once(&self.overflow)).map(|s| s.get(which).load(Relaxed)).sum()
    }
}

/// Slow-path counters (spec.md#S8), one `fetch_add` each.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub misses: AtomicU64,
    pub errors: AtomicU64,
    pub release_events: AtomicU64,
    pub registrations: AtomicU64,
    pub deregistrations: AtomicU64,
    pub bytes_registered: AtomicU64,
    pub peak_pinned_bytes: AtomicU64,
    pub invalidations: AtomicU64,
    pub leased_invalidations: AtomicU64,
    pub deferred_deregistrations: AtomicU64,
    pub merges: AtomicU64,
    pub uncached: AtomicU64,
    pub evictions: AtomicU64,
    pub pressure_evictions: AtomicU64,
    pub forgotten: AtomicU64,
    // Diagnostics, not in `Stats`.
    pub discarded_registrations: AtomicU64,
    pub stale_retries: AtomicU64,
    pub dereg_failures: AtomicU64,
    pub early_deregistrations: AtomicU64,
    /// Lane counts of forgotten generations (spec.md#S2.6).
    pub lane_hits_forgotten: AtomicU64,
    pub lane_releases_forgotten: AtomicU64,
}

#[inline]
pub(crate) fn inc(c: &AtomicU64) {
    c.fetch_add(1, Relaxed);
}

#[inline]
pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Relaxed);
}

#[inline]
pub(crate) fn get(c: &AtomicU64) -> u64 {
    c.load(Relaxed)
}
