//! A0, the lock-free hit (spec.md#A0): which acquires take it, that it
//! answers as A1 does, and that under contention it never hands out an
//! entry that left the index, nor one whose memory was reused for another
//! registration. And A1's skip (spec.md#A1): with limits, a streak of A1
//! misses sends a thread straight to A2 until a hit.

use mrcache::registrar::counting::{CountingHandle, CountingRegistrar};
use mrcache::registrar::{Keys, Registrar, RegistrarError};
use mrcache::types::{Access, Range, ReleaseKind};
use mrcache::{Cache, CacheConfig};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

const P: u64 = 4096;
const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

fn cache(lanes: bool, max_regions: Option<u64>) -> Cache<CountingRegistrar> {
    let mut config = CacheConfig { lanes, ..CacheConfig::explicit() };
    config.contract.limits.max_regions = max_regions;
    Cache::new(CountingRegistrar::default(), config)
}

//= spec.md#A0 type=test
/// Without limits, a repeated request whose entry the hit memo holds is a
/// lock-free hit, with A1's answer; a request that is not an entry's key
/// (a sub-range) is A1's.
#[test]
fn repeated_hits_go_without_the_lock_and_answer_as_a1() {
    let c = cache(false, None);
    let n = 1000u64;
    let ids: Vec<u64> = (0..n).map(|i| c.acquire(i * 4 * P, 2 * P, RW).unwrap().view().id).collect();
    // The first hit of each is A1's (the memo is written then), the next A0's.
    for round in 0..3 {
        for i in 0..n {
            let l = c.acquire(i * 4 * P, 2 * P, RW).unwrap();
            assert!(l.hit());
            assert_eq!(l.view().id, ids[i as usize], "round {round}, buffer {i}");
        }
    }
    assert_eq!(c.diagnostics().lockless_hits, 2 * n, "the second and third rounds");
    // A sub-range is not the entry's key: A1 answers it, with the same entry.
    let before = c.diagnostics().lockless_hits;
    for _ in 0..2 {
        assert_eq!(c.acquire(P, P, RW).unwrap().view().id, ids[0]);
    }
    assert_eq!(c.diagnostics().lockless_hits, before);
    assert_eq!(c.stats().hits, 3 * n + 2);
    c.flush();
    assert_eq!(c.registrar().live(), 0);
}

/// With limits, A1 takes every hit under the lock (its LRU touch and the
/// notes need it).
#[test]
fn with_limits_every_hit_takes_the_lock() {
    let c = cache(false, Some(10_000));
    for _ in 0..3 {
        for i in 0..100u64 {
            drop(c.acquire(i * 4 * P, P, RW).unwrap());
        }
    }
    assert_eq!(c.stats().hits, 200);
    assert_eq!(c.diagnostics().lockless_hits, 0);
}

/// With lanes, A0 serves the hits a dry lane does not memoize (many
/// buffers, each reused rarely), and a lane that hits keeps its memos.
#[test]
fn a_dry_lane_leaves_its_hits_to_a0() {
    let c = cache(true, None);
    for _ in 0..4 {
        for i in 0..4096u64 {
            drop(c.acquire(i * 4 * P, P, RW).unwrap());
        }
    }
    let d = c.diagnostics();
    // Of the 3 x 4096 repeated hits, the first round is A1's (it writes the
    // memo) and a dry lane samples one acquire in 16 (A1 then memoizes).
    assert!(d.lockless_hits > 4096, "{d:?}");
    let (lane_before, a0_before) = (d.lane_hits, d.lockless_hits);
    // Four buffers, reused: the lane leaves its dry spell and hits.
    for _ in 0..2000 {
        for i in 0..4u64 {
            drop(c.acquire(i * 4 * P, P, RW).unwrap());
        }
    }
    let d = c.diagnostics();
    assert!(d.lane_hits - lane_before > 6000, "{d:?}");
    assert!(d.lockless_hits - a0_before < 2000, "{d:?}");
}

/// The counting registrar, plus the set of registrations live now (by key).
#[derive(Default)]
struct LiveSet {
    inner: CountingRegistrar,
    live: Mutex<HashSet<u32>>,
}

impl Registrar for LiveSet {
    type Handle = CountingHandle;
    fn register(&self, range: Range, access: Access) -> Result<CountingHandle, RegistrarError> {
        let h = self.inner.register(range, access)?;
        assert!(self.live.lock().unwrap().insert(self.inner.keys(&h).lkey));
        Ok(h)
    }
    fn deregister(&self, handle: CountingHandle) -> Result<(), RegistrarError> {
        assert!(self.live.lock().unwrap().remove(&self.inner.keys(&handle).lkey), "deregistered twice");
        self.inner.deregister(handle)
    }
    fn keys(&self, handle: &CountingHandle) -> Keys {
        self.inner.keys(handle)
    }
    fn name(&self) -> &'static str {
        "live-set"
    }
}

//= spec.md#A0 type=test
/// Two threads hit 4 buffers (lanes off: every repeated hit is A0's)
/// while a third invalidates them one by one and fills the cache with
/// other keys, so the invalidated entries' memory is reused at once for
/// entries of other keys. Every lease must be a live registration with the
/// request's exact key; the invalidating thread's acquire right after its
/// invalidation must never get the removed entry (P2); every registration
/// is deregistered exactly once.
#[test]
fn a0_never_hands_out_a_removed_or_reused_entry() {
    let c = Cache::new(LiveSet::default(), CacheConfig { lanes: false, ..CacheConfig::explicit() });
    let buffers = 4u64;
    let addr = |i: u64| (i % buffers) * 16 * P;
    for i in 0..buffers {
        drop(c.acquire(addr(i), 2 * P, RW).unwrap());
    }
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let (c, stop) = (&c, &stop);
            s.spawn(move || {
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    let l = c.acquire(addr(i), 2 * P, RW).unwrap();
                    let v = l.view();
                    assert_eq!((v.addr, v.len, v.access), (addr(i), 2 * P, RW), "an entry of another key");
                    assert!(c.registrar().live.lock().unwrap().contains(&l.keys().lkey), "a lease on a dead registration");
                    drop(l);
                    i = i.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407) >> 7;
                }
            });
        }
        let (c, stop) = (&c, &stop);
        s.spawn(move || {
            for round in 0..100_000u64 {
                let i = round % buffers;
                let old = c.acquire(addr(i), 2 * P, RW).unwrap().view().id;
                c.invalidate(addr(i), 2 * P, ReleaseKind::Munmap).unwrap();
                // Another key takes the freed memory (the pool reuses the
                // last freed entry first), then goes too.
                let other = (1 << 40) | (round % 7 * P);
                drop(c.acquire(other, P, RW).unwrap());
                let again = c.acquire(addr(i), 2 * P, RW).unwrap().view().id;
                assert_ne!(again, old, "round {round}: the removed entry answered after its removal returned");
                c.invalidate(other, P, ReleaseKind::Munmap).unwrap();
            }
            stop.store(true, Ordering::Relaxed);
        });
    });
    assert!(c.diagnostics().lockless_hits > 0);
    c.flush();
    assert!(c.registrar().live.lock().unwrap().is_empty());
    assert_eq!(c.registrar().inner.live(), 0);
}

//= spec.md#A1 type=test
/// With limits, a thread whose A1 lookups keep missing skips A1 (straight
/// to A2, where A3 looks up under the lock exclusive) until its next hit,
/// which A3 then finds: answers stay A1's, and A1 runs again after the hit.
#[test]
fn a_streak_of_a1_misses_skips_a1_until_a_hit() {
    let c = cache(true, Some(10_000));
    for i in 0..100u64 {
        assert!(!c.acquire(i * 4 * P, P, RW).unwrap().hit());
    }
    // A1 ran for the first four (each missed), then the streak skipped it.
    let skips = c.diagnostics().a1_skips;
    assert_eq!(skips, 96);
    // A hit while skipping: A3 finds it, the entry A1 would have given (the
    // lowest id covering the request: a duplicate would have a higher one).
    let first = c.acquire(0, P, RW).unwrap();
    assert!(first.hit());
    assert_eq!(c.diagnostics().a1_skips, skips + 1, "the hit came through a skipped A1");
    let id = first.view().id;
    drop(first);
    let l = c.acquire(0, P, RW).unwrap();
    assert!(l.hit() && l.view().id == id);
    drop(l);
    assert_eq!(c.diagnostics().a1_skips, skips + 1, "A1 ran again after the hit");
    // The streak is over: the next acquires take A1 (and the lane) again.
    for _ in 0..10 {
        assert!(c.acquire(0, P, RW).unwrap().hit());
    }
    assert_eq!(c.diagnostics().a1_skips, skips + 1);
    // Without limits nothing is skipped.
    let c = cache(true, None);
    for i in 0..100u64 {
        drop(c.acquire(i * 4 * P, P, RW).unwrap());
    }
    assert_eq!(c.diagnostics().a1_skips, 0);
}
