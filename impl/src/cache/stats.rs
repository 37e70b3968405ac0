//! Counters behind [`crate::Cache::stats`] (spec.md#S8).
//!
//! The three counters the hit path bumps (`acquires`, `hits`, `releases`) are
//! striped per thread: a thread bumps the slot its [`thread_token`] hashes
//! to if it owns that slot (the first token to claim a slot owns it for
//! good), with a plain load + store (no locked read-modify-write, no shared
//! cache line): running threads have distinct tokens, and a token passes to
//! another thread only after its holder exited, so a slot has one writer at
//! a time. Threads whose slot is another's share an overflow slot bumped
//! with `fetch_add`. Where there is no token (other targets, loom), each
//! thread gets a process-wide slot number once instead (a thread-local),
//! and a thread whose number is below [`SLOTS`] is the only writer of that
//! slot; later threads use the overflow slot. Everything else is bumped on slow paths with
//! `fetch_add`. A [`crate::Cache::stats`] snapshot sums the slots; it is exact
//! when no operation is in flight (always, in sequential use).
//!
//! These are plain `std` atomics even under loom (see [`crate::sync`]).

use super::entry::indexed;
use super::generation::Shared;
use super::lanes;
use super::Cache;
use crate::error::Error;
use crate::registrar::Registrar;
use crate::sync::Ordering;
use mrcache_types::{RegView, Stats};
use serde::{Deserialize, Serialize};
use std::cell::Cell;
use std::sync::PoisonError;
use crate::sync::plain;
use crate::sync::Ordering::Relaxed;
use crate::thread_token::{bucket, thread_token};

/// Per-thread slots per cache.
pub const SLOTS: usize = 64;
/// The slots a thread token may hash to: all, but two in unit tests, so
/// that threads running at once share slots (and the owner check matters).
#[cfg(not(test))]
const TOKEN_SLOTS: usize = SLOTS;
#[cfg(test)]
const TOKEN_SLOTS: usize = 2;

static NEXT_SLOT: plain::AtomicUsize = plain::AtomicUsize::new(0);

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
    /// The thread token that owns the slot (0: none yet).
    owner: plain::AtomicUsize,
    pub acquires: plain::AtomicU64,
    pub hits: plain::AtomicU64,
    pub releases: plain::AtomicU64,
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
    fn get(&self, which: Hot) -> &plain::AtomicU64 {
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
        let token = thread_token();
        if token != 0 {
            let slot = &self.slots[bucket(token, TOKEN_SLOTS)];
            let owner = slot.owner.load(Relaxed);
            // Relaxed: a thread reads its own token here only if its own
            // compare-exchange put it there (module docs).
            if owner == token || (owner == 0 && slot.owner.compare_exchange(0, token, Relaxed, Relaxed).is_ok()) {
                // Only the owning thread writes this slot: no RMW needed.
                let c = slot.get(which);
                c.store(c.load(Relaxed).wrapping_add(1), Relaxed);
            } else {
                self.overflow.get(which).fetch_add(1, Relaxed);
            }
            return;
        }
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
    pub misses: plain::AtomicU64,
    pub errors: plain::AtomicU64,
    pub release_events: plain::AtomicU64,
    pub registrations: plain::AtomicU64,
    pub deregistrations: plain::AtomicU64,
    pub bytes_registered: plain::AtomicU64,
    pub peak_pinned_bytes: plain::AtomicU64,
    pub invalidations: plain::AtomicU64,
    pub leased_invalidations: plain::AtomicU64,
    pub deferred_deregistrations: plain::AtomicU64,
    pub merges: plain::AtomicU64,
    pub uncached: plain::AtomicU64,
    pub evictions: plain::AtomicU64,
    pub pressure_evictions: plain::AtomicU64,
    pub forgotten: plain::AtomicU64,
    // Diagnostics, not in `Stats`.
    pub discarded_registrations: plain::AtomicU64,
    pub stale_retries: plain::AtomicU64,
    pub dereg_failures: plain::AtomicU64,
    pub early_deregistrations: plain::AtomicU64,
    /// Lane counts of forgotten generations (spec.md#S2.6).
    pub lane_hits_forgotten: plain::AtomicU64,
    pub lane_releases_forgotten: plain::AtomicU64,
    /// Times the last [`super::SharedCache`] handle leaked the cache because
    /// owned leases were still out (0 or 1).
    pub leaked_for_owned_leases: plain::AtomicU64,
    /// REMOVE windows opened (spec.md#M3) and closed (M4).
    pub remove_windows: plain::AtomicU64,
    pub remove_windows_closed: plain::AtomicU64,
    /// Misses served uncached because the monitor did not watch their range
    /// (spec.md#S7.6: another userfaultfd watches it, or the cache detached).
    pub unwatched_uncached: plain::AtomicU64,
}

#[inline]
pub(crate) fn inc(c: &plain::AtomicU64) {
    c.fetch_add(1, Relaxed);
}

#[inline]
pub(crate) fn add(c: &plain::AtomicU64, n: u64) {
    c.fetch_add(n, Relaxed);
}

#[inline]
pub(crate) fn get(c: &plain::AtomicU64) -> u64 {
    c.load(Relaxed)
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
    /// The queue's bound: `max_unreleased`, at most [`MAX_QUEUE_CAPACITY`](super::MAX_QUEUE_CAPACITY).
    pub queue_capacity: u64,
    /// Hits served by a lane (spec.md#LN1), included in `Stats::hits`.
    pub lane_hits: u64,
    /// Windows a REMOVE opened (spec.md#M3), and those proven and closed
    /// (M4). Their difference is open now: those pages are served uncached
    /// (`Stats::uncached`) until the madvise is proven to have returned.
    #[serde(default)]
    pub remove_windows: u64,
    #[serde(default)]
    pub remove_windows_closed: u64,
    /// Misses served uncached, included in `Stats::uncached`, because the
    /// monitor did not watch their range: another userfaultfd of the process
    /// watches it, or the cache detached from its monitor (spec.md#S7.6).
    #[serde(default)]
    pub unwatched_uncached: u64,
    /// Releases its owner thread made on its own lane (spec.md#LN3, the
    /// fast release), included in `Stats::releases`.
    pub lane_releases: u64,
    /// Lanes this generation has made (at most [`MAX_LANES`](super::MAX_LANES)).
    pub lanes: u64,
    /// Lane slots holding a pin now (LN5: revoked while leased).
    pub pinned_slots: u64,
    /// Whether the heavy barrier is membarrier (else both sides fence).
    pub membarrier: bool,
    /// Owned leases ([`crate::OwnedLease`]) out now that are counted on
    /// lanes (every generation); those taken without a lane hold a strong
    /// count on the cache instead and are not included.
    #[serde(default)]
    pub owned_leases: u64,
    /// 1 if the last [`crate::SharedCache`] handle was dropped while owned
    /// leases were out, and so leaked the cache (it stays alive for them).
    pub leaked_for_owned_leases: u64,
}

impl<R: Registrar> Cache<R> {
    /// Counts a failed operation and passes its error through.
    pub(super) fn fail(&self, e: Error) -> Error {
        inc(&self.counters.errors);
        e
    }

    /// Counters in the shared schema (spec.md#S8). Exact when no operation is
    /// in flight.
    ///
    /// With an event source installed (a [`crate::MonitorThread`]), it first
    /// waits out a monitor round in progress: the kernel wakes a thread that
    /// unmapped watched memory inside the round's read, before the round has
    /// applied the event (M2). So the invalidation of a `munmap` that has
    /// returned is counted. Its deregistration follows the round's unlock
    /// (L1) and may not be counted yet.
    pub fn stats(&self) -> Stats {
        let shared = self.shared();
        if shared.source.get().is_some() && !super::generation::held_by_this_thread() {
            // A shared section cannot start while the round's exclusive one
            // runs; taken and dropped at once, it only orders the reads below
            // after that round.
            drop(shared.lock.read().unwrap_or_else(std::sync::PoisonError::into_inner));
        }
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
            pinned_bytes: shared.live_bytes.load(Ordering::Relaxed),
            peak_pinned_bytes: get(&c.peak_pinned_bytes),
            cached_entries: shared.cached.load(Ordering::Relaxed),
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
    pub(super) fn lane_counts(&self, shared: &Shared<R>) -> (u64, u64) {
        let (h, r) = shared.lanes.installed().map(|l| l.counts()).fold((0, 0), |(a, b), (h, r)| (a + h, b + r));
        (h + get(&self.counters.lane_hits_forgotten), r + get(&self.counters.lane_releases_forgotten))
    }

    /// Owned leases counted on lanes and not yet returned, over every lane
    /// of every generation (see "Owned leases" in [`super::lease`]).
    pub(super) fn owned_outstanding(&self) -> u64 {
        let mut g = self.shared.load(Ordering::Acquire);
        let mut n = 0u64;
        while !g.is_null() {
            // SAFETY: the current generation, or one it (transitively)
            // replaced: generations are freed only in the cache's `Drop`.
            let s = unsafe { &*g };
            n = s.lanes.installed().fold(n, |n, l| n.wrapping_add(l.owned_outstanding()));
            g = s.older.load(Ordering::Acquire);
        }
        n
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
            remove_windows: get(&c.remove_windows),
            remove_windows_closed: get(&c.remove_windows_closed),
            unwatched_uncached: get(&c.unwatched_uncached),
            lane_releases: self.lane_counts(shared).1,
            lanes: shared.lanes.installed().count() as u64,
            pinned_slots: shared
                .lanes
                .installed()
                .flat_map(|l| l.slots())
                .filter(|s| !s.pin().load(Ordering::SeqCst).is_null())
                .count() as u64,
            membarrier: lanes::uses_membarrier(),
            owned_leases: self.owned_outstanding(),
            leaked_for_owned_leases: get(&c.leaked_for_owned_leases),
        }
    }

    /// The findable entries, oldest first (takes the lock shared).
    pub fn cached_views(&self) -> Vec<RegView> {
        let shared = self.shared();
        let st = shared.lock.read().unwrap_or_else(PoisonError::into_inner);
        let mut v: Vec<RegView> = st
            .index
            .iter()
            .map(|(_, slot)| indexed(slot).view)
            .collect();
        v.sort_by_key(|r| r.id);
        v
    }

    /// Counts a failed op the harness rejects itself (E3, E4).
    #[doc(hidden)]
    pub fn count_error(&self) {
        let _ = self.shared();
        inc(&self.counters.errors);
    }

    pub(crate) fn count_release(&self) {
        let _ = self.shared();
        self.hot.bump(Hot::Releases);
    }

    /// Counts a release of a lease that is not held: E4, which changes nothing
    /// but the counters (spec.md#S2: a release call and an error). The typed
    /// Rust API cannot express it; a handle-based one (the C API's stale or
    /// double-released handles) can.
    pub fn count_unknown_release(&self) {
        self.count_release();
        self.count_error();
    }

    #[doc(hidden)]
    pub fn count_acquire(&self) {
        let _ = self.shared();
        self.hot.bump(Hot::Acquires);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::registrar::counting::CountingRegistrar;
    use crate::{Cache, CacheConfig};
    use mrcache_types::Access;

    /// The hit path's striped counters are exact once the threads are done:
    /// threads running at once share the two token slots of a unit test
    /// build, so only the owner check keeps two of them from bumping one
    /// slot with plain stores (and losing counts: that mutant fails 4 runs
    /// in 5 here, on 2 cores); sequential threads reuse
    /// one another's tokens and inherit their slots.
    #[test]
    fn striped_counters_are_exact_across_threads() {
        // Without lanes: a lane hit counts on its lane, not here.
        let mut config = CacheConfig::explicit();
        config.lanes = false;
        let cache = Cache::new(CountingRegistrar::default(), config);
        const THREADS: u64 = 6;
        const OPS: u64 = 300_000;
        const ROUNDS: u64 = 4;
        for _round in 0..ROUNDS {
            let start = std::sync::Barrier::new(THREADS as usize);
            std::thread::scope(|s| {
                for t in 0..THREADS {
                    let (cache, start) = (&cache, &start);
                    s.spawn(move || {
                        let addr = 0x1000_0000 + t * 0x10_0000;
                        start.wait();
                        for _ in 0..OPS {
                            cache.acquire(addr, 4096, Access::LOCAL_WRITE).unwrap().release();
                        }
                    });
                }
            });
        }
        let st = cache.stats();
        assert_eq!(st.acquires, ROUNDS * THREADS * OPS, "{st:?}");
        assert_eq!(st.releases, ROUNDS * THREADS * OPS, "{st:?}");
        // Each thread's first acquire misses; later rounds find it cached.
        assert_eq!(st.hits, ROUNDS * THREADS * OPS - THREADS, "{st:?}");
    }
}
