//! The hit memo through the whole cache (lanes off, so repeated hits take
//! A1 and the memo): its answers stay the index's across an epoch of
//! versions, where `HitMemo::follow` empties the table as an exclusive
//! section ends (debug builds also check every memo answer against the
//! index).

use mrcache::hit_memo::TAGS;
use mrcache::registrar::counting::CountingRegistrar;
use mrcache::types::{Access, ReleaseKind};
use mrcache::{Cache, CacheConfig};

const P: u64 = 4096;
const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

/// Lanes off: repeated hits take A1 and the memo.
fn cache_without_lanes() -> Cache<CountingRegistrar> {
    Cache::new(CountingRegistrar::default(), CacheConfig { lanes: false, ..CacheConfig::explicit() })
}

#[test]
fn hits_stay_right_across_an_epoch_of_versions() {
    let cache = cache_without_lanes();
    // A long-lived entry, hit every round, and a short-lived one, made,
    // hit and invalidated every round: each invalidation moves the answers
    // version by one, so the rounds cross into the next epoch.
    let (kept, churned) = (1 << 30, 1 << 31);
    let kept_id = cache.acquire(kept, 2 * P, RW).unwrap().view().id;
    for round in 0..TAGS + 64 {
        let l = cache.acquire(kept, 2 * P, RW).unwrap();
        assert!(l.hit(), "round {round}");
        assert_eq!(l.view().id, kept_id, "round {round}: the kept entry");
        drop(l);
        let id = cache.acquire(churned, P, RW).unwrap().view().id;
        let l = cache.acquire(churned, P, RW).unwrap();
        assert!(l.hit() && l.view().id == id, "round {round}: the entry just made");
        drop(l);
        cache.invalidate(churned, P, ReleaseKind::Munmap).unwrap();
        let l = cache.acquire(churned, P, RW).unwrap();
        assert_ne!(l.view().id, id, "round {round}: an invalidated entry answered");
        drop(l);
        cache.invalidate(churned, P, ReleaseKind::Munmap).unwrap();
    }
    cache.flush();
    assert_eq!(cache.registrar().live(), 0);
}

/// What `follow`'s emptying is for: a memo word written in one epoch must
/// not answer in the next, where the same tag names another version. The
/// memoized entry is invalidated but kept alive by a lease, and its key is
/// requested once per version (each request misses and its entry is
/// invalidated, moving the version by one) until a whole epoch has passed.
/// A memo that kept its words across epochs answers with the leased, removed
/// entry when the tag comes round again.
#[test]
fn a_memo_word_never_answers_in_the_next_epoch() {
    let cache = cache_without_lanes();
    let key = 1 << 30;
    let held = cache.acquire(key, P, RW).unwrap();
    let removed = held.view().id;
    // An A1 hit: the memo holds the entry for its key.
    assert!(cache.acquire(key, P, RW).unwrap().hit());
    cache.invalidate(key, P, ReleaseKind::Munmap).unwrap();
    for step in 0..TAGS + 256 {
        let l = cache.acquire(key, P, RW).unwrap();
        assert!(!l.hit() && l.view().id != removed, "step {step}: the removed entry answered");
        drop(l);
        cache.invalidate(key, P, ReleaseKind::Munmap).unwrap();
    }
    drop(held);
    cache.flush();
    assert_eq!(cache.registrar().live(), 0);
}

/// `prefetch_acquire` is a hint: for any address (cached, invalidated and
/// freed, never seen, or garbage) it changes no count and no answer, and the
/// split acquire (`acquire_on_lane`, then `acquire_past_lane`, which leaves
/// A1's own prefetch to the hint) answers the same with or without it.
#[test]
fn the_prefetch_hint_changes_nothing() {
    let cache = cache_without_lanes();
    let (kept, freed) = (1 << 30, 1 << 31);
    let kept_id = cache.acquire(kept, 2 * P, RW).unwrap().view().id;
    drop(cache.acquire(freed, P, RW).unwrap());
    cache.invalidate(freed, P, ReleaseKind::Munmap).unwrap();
    assert_eq!(cache.registrar().live(), 1, "the invalidated entry is deregistered");
    let before = cache.stats();
    for addr in [kept, kept + P, freed, 0, 1, u64::MAX, u64::MAX - P, 1 << 47] {
        cache.prefetch_acquire(addr);
    }
    assert_eq!(cache.stats(), before, "a hint counted something");
    for prefetch in [false, true] {
        if prefetch {
            cache.prefetch_acquire(kept);
        }
        // Lanes are off: the lane half never answers.
        assert!(cache.acquire_on_lane(kept, 2 * P, RW).is_none());
        let l = cache.acquire_past_lane(kept, 2 * P, RW).unwrap();
        assert!(l.hit() && l.view().id == kept_id, "prefetch {prefetch}: the kept entry");
    }
    let fresh = cache.acquire_past_lane(freed, P, RW).unwrap();
    assert!(!fresh.hit(), "the invalidated entry answered");
    drop(fresh);
    cache.flush();
}

/// The hint's racy reads where they are most exposed: memo tables grown past
/// the heap into mappings (the old ones retired), a generation replaced by a
/// fork, and a second thread hinting while the first misses and grows the
/// table. Nothing faults, nothing is counted, and the cache answers on.
#[test]
fn the_prefetch_hint_survives_grown_tables_and_a_fork() {
    let cache = cache_without_lanes();
    let base = 1u64 << 32;
    let n = 20_000u64;
    std::thread::scope(|s| {
        let hinter = s.spawn(|| {
            for round in 0..20 {
                for i in (0..n).step_by(7) {
                    cache.prefetch_acquire(base + (i + round) * P);
                }
            }
        });
        for i in 0..n {
            drop(cache.acquire(base + i * P, P, RW).unwrap());
        }
        hinter.join().unwrap();
    });
    assert_eq!(cache.registrar().registered.load(std::sync::atomic::Ordering::Relaxed), n);
    cache.simulate_fork();
    let before = cache.stats();
    for i in 0..n {
        cache.prefetch_acquire(base + i * P);
    }
    assert_eq!(cache.stats(), before, "a hint counted something");
    cache.prefetch_acquire(base);
    let l = cache.acquire_past_lane(base, P, RW).unwrap();
    assert!(!l.hit(), "a registration from before the fork answered");
}
