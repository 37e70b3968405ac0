//! What the cache reports (layer 6): [`crate::Cache::stats`] (spec.md#S8),
//! [`Diagnostics`], the cached views, and the counting `Cache` helpers, over
//! the counters of `counters.rs`.

use super::counters::{get, Hot};
use super::entry::indexed;
use super::lanes;
use super::Cache;
use crate::registrar::Registrar;
use crate::sync::Ordering;
use mrcache_types::{RegView, Stats};
use serde::{Deserialize, Serialize};
use std::sync::PoisonError;

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
    /// Hits served without the lock (spec.md#A0), included in `Stats::hits`.
    #[serde(default)]
    pub lockless_hits: u64,
    /// Acquires that skipped A1 after a streak of A1 misses on their
    /// thread's lane, with limits (spec.md#A1): each went straight to A2,
    /// without taking the cache lock shared for A1's lookup.
    #[serde(default)]
    pub a1_skips: u64,
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
    /// Registrations in flight now: in-flight records (A4) not yet removed
    /// (A7, A9, a failure, or an abandon: spec.md#S7.8); 0 when no
    /// operation is running. `None` if the cache lock was held when asked:
    /// diagnostics may be read under it (from a hook), so they never wait
    /// for it.
    #[serde(default)]
    pub registrations_in_flight: Option<u64>,
}

impl<R: Registrar> Cache<R> {
    /// Counters in the shared schema (spec.md#S8). Exact when no operation is
    /// in flight.
    ///
    /// With an event source installed (a [`crate::MonitorThread`]), it first
    /// applies the events its monitor has read and this cache has not
    /// (spec.md#M6: the gate), as A2 would, performing the deregistrations
    /// that frees; or, with a single-cache source, waits out a round in
    /// progress (M2). So the invalidation of a `munmap` that has returned is
    /// counted. A deregistration of a leased entry follows its last release
    /// (L1) and may not be counted yet.
    pub fn stats(&self) -> Stats {
        let shared = self.shared();
        if shared.source.get().is_some() && !super::generation::held_by_this_thread() {
            if shared.gate.current() {
                // A shared section cannot start while a round's exclusive
                // one runs; taken and dropped at once, it only orders the
                // reads below after that round.
                drop(shared.lock.read().unwrap_or_else(std::sync::PoisonError::into_inner));
            } else {
                // Events read and not yet applied here (spec.md#M6): applied
                // now, as A2 would, so the invalidation of a release that
                // returned is counted.
                let mut deregs = super::dereg::DeregList::new(self, shared);
                let mut st = self.write(shared);
                self.drain(shared, &mut st, &mut deregs);
                st.unlock();
                deregs.finish();
            }
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
            deregistrations: self.hot.sum(Hot::Deregistrations),
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
            lockless_hits: self.hot.sum(Hot::LocklessHits),
            a1_skips: self.hot.sum(Hot::A1Skips),
            remove_windows: get(&c.remove_windows),
            remove_windows_closed: get(&c.remove_windows_closed),
            unwatched_uncached: get(&c.unwatched_uncached),
            lane_releases: self.lane_counts(shared).1,
            lanes: shared.lanes.installed().count() as u64,
            pinned_slots: shared.lanes.installed().flat_map(|l| l.slots()).filter(|s| !s.pin().load(Ordering::SeqCst).is_null()).count()
                as u64,
            membarrier: lanes::uses_membarrier(),
            owned_leases: self.owned_outstanding(),
            leaked_for_owned_leases: get(&c.leaked_for_owned_leases),
            registrations_in_flight: match shared.lock.try_read() {
                Ok(st) => Some(st.inflight.len() as u64),
                Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner().inflight.len() as u64),
                Err(std::sync::TryLockError::WouldBlock) => None,
            },
        }
    }

    /// The findable entries, oldest first (takes the lock shared).
    pub fn cached_views(&self) -> Vec<RegView> {
        let shared = self.shared();
        let st = shared.lock.read().unwrap_or_else(PoisonError::into_inner);
        let mut v: Vec<RegView> = st.index.iter().map(|(_, slot)| indexed(slot).view()).collect();
        v.sort_by_key(|r| r.id);
        v
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
