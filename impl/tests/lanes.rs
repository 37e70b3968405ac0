//! Lanes (spec.md LN1–LN6): the lock-free hit path, its revokes and pins.
//!
//! Each test drives a lane into one of the states LN1–LN6 name and checks what
//! the registrar saw: a lane lease keeps its registration registered (P3)
//! through invalidation, eviction and flush, and the registration is
//! deregistered exactly once (P4) by whoever drops the last lease.

use mrcache::registrar::counting::CountingRegistrar;
use mrcache::{Cache, CacheConfig, Config, Limits};
use mrcache_types::{Access, ReleaseKind};
use std::sync::atomic::Ordering;

const A: u64 = 1 << 32;
const LEN: u64 = 8192;

fn cache() -> Cache<CountingRegistrar> {
    Cache::new(CountingRegistrar::default(), CacheConfig::explicit())
}

fn deregs(c: &Cache<CountingRegistrar>) -> u64 {
    c.registrar().deregistered.load(Ordering::SeqCst)
}

/// Miss, then an A1 hit that memoizes (LN2): the next acquire is a lane hit.
fn warm(c: &Cache<CountingRegistrar>, addr: u64) {
    drop(c.acquire(addr, LEN, Access::LOCAL_WRITE).unwrap());
    drop(c.acquire(addr, LEN, Access::LOCAL_WRITE).unwrap());
}

#[test]
fn third_acquire_is_a_lane_hit_with_the_same_answer() {
    let c = cache();
    let first = c.acquire(A, LEN, Access::LOCAL_WRITE).unwrap();
    let view = first.view();
    drop(first);
    drop(c.acquire(A, LEN, Access::LOCAL_WRITE).unwrap());
    assert_eq!(c.diagnostics().lane_hits, 0, "the A1 hit memoizes, it is not a lane hit");
    let l = c.acquire(A, LEN, Access::LOCAL_WRITE).unwrap();
    assert!(l.hit());
    assert_eq!(l.view(), view);
    drop(l);
    let d = c.diagnostics();
    assert_eq!(d.lane_hits, 1);
    assert_eq!(d.lanes, 1);
    let s = c.stats();
    assert_eq!((s.acquires, s.hits, s.releases), (3, 2, 3), "lane hits count as acquires and hits");
    // A different key (access) is not served by the memo.
    drop(c.acquire(A, LEN, Access::LOCAL_READ).unwrap());
    assert_eq!(c.diagnostics().lane_hits, 1);
}

#[test]
fn invalidate_pins_a_lane_lease_and_its_release_deregisters_once() {
    let c = cache();
    warm(&c, A);
    let l = c.acquire(A, LEN, Access::LOCAL_WRITE).unwrap();
    assert_eq!(c.diagnostics().lane_hits, 1);
    c.invalidate(A, 4096, ReleaseKind::Munmap).unwrap();
    assert_eq!(deregs(&c), 0, "P3: leased on a lane, so revoked and pinned, not deregistered");
    assert_eq!(c.diagnostics().pinned_slots, 1);
    // The revoked memo serves nothing: a new acquire misses.
    let again = c.acquire(A, LEN, Access::LOCAL_WRITE).unwrap();
    assert!(!again.hit());
    drop(again);
    drop(l);
    assert_eq!(deregs(&c), 1, "the last release (LN4: the pin) deregisters");
    assert_eq!(c.diagnostics().pinned_slots, 0);
    drop(c.acquire(A, LEN, Access::LOCAL_WRITE).unwrap());
    c.flush();
    assert_eq!(c.registrar().live(), 0);
}

#[test]
fn an_unleased_memo_is_deregistered_at_once_by_invalidate() {
    let c = cache();
    warm(&c, A);
    drop(c.acquire(A, LEN, Access::LOCAL_WRITE).unwrap());
    c.invalidate(A, LEN, ReleaseKind::MadviseDontneed).unwrap();
    assert_eq!(deregs(&c), 1);
    assert_eq!(c.diagnostics().pinned_slots, 0, "count 0 at the revoke: no pin");
}

#[test]
fn lane_lease_released_on_another_thread() {
    let c = cache();
    warm(&c, A);
    let l = c.acquire(A, LEN, Access::LOCAL_WRITE).unwrap();
    let l2 = c.acquire(A, LEN, Access::LOCAL_WRITE).unwrap();
    assert_eq!(c.diagnostics().lane_hits, 2);
    std::thread::scope(|s| {
        s.spawn(move || drop(l));
    });
    // One lease left (l2): invalidate pins, the owner's release unpins.
    c.invalidate(A, LEN, ReleaseKind::Munmap).unwrap();
    assert_eq!(deregs(&c), 0);
    let l3 = {
        warm(&c, A + (1 << 20));
        c.acquire(A + (1 << 20), LEN, Access::LOCAL_WRITE).unwrap()
    };
    std::thread::scope(|s| {
        s.spawn(move || drop(l2));
    });
    assert_eq!(deregs(&c), 1, "the remote release of the last lease returns the pin");
    // The remote thread's release of a lease on a live memo: no dereg, the
    // memo stays usable by its owner.
    std::thread::scope(|s| {
        s.spawn(move || drop(l3));
    });
    assert_eq!(deregs(&c), 1);
    let before = c.diagnostics().lane_hits;
    drop(c.acquire(A + (1 << 20), LEN, Access::LOCAL_WRITE).unwrap());
    assert_eq!(c.diagnostics().lane_hits, before + 1);
    c.flush();
    assert_eq!(c.registrar().live(), 0);
}

#[test]
fn exited_threads_give_their_lanes_back() {
    let c = cache();
    drop(c.acquire(A, LEN, Access::LOCAL_WRITE).unwrap());
    // More threads than lanes, one after another: each claims a lane, uses
    // it, and exits; a later thread reuses it.
    for _ in 0..(mrcache::cache::MAX_LANES + 20) {
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..3 {
                    drop(c.acquire(A, LEN, Access::LOCAL_WRITE).unwrap());
                }
            });
        });
    }
    let d = c.diagnostics();
    // A scoped join can return before the thread's thread-local destructors
    // ran, so a few lanes may overlap; without reuse all would be taken and
    // the last threads would get no lane (and fewer lane hits).
    assert!(d.lanes < mrcache::cache::MAX_LANES as u64, "lanes are reused after their threads exit: {} made", d.lanes);
    // Each thread: an A1 hit that memoizes, then two lane hits.
    assert_eq!(d.lane_hits as usize, 2 * (mrcache::cache::MAX_LANES + 20));
}

#[test]
fn a_lane_leased_entry_is_not_an_eviction_victim() {
    let config = Config { limits: Limits { max_regions: Some(1), ..Limits::default() }, ..Config::default() };
    let c = Cache::new(CountingRegistrar::default(), mrcache::CacheConfig::explicit_with(config));
    warm(&c, A);
    let held = c.acquire(A, LEN, Access::LOCAL_WRITE).unwrap();
    assert_eq!(c.diagnostics().lane_hits, 1);
    // A miss over the limit: A6 revokes every slot and notes; the lane lease
    // is a pin, so A is leased and stays.
    let b = c.acquire(A + (1 << 20), LEN, Access::LOCAL_WRITE).unwrap();
    assert_eq!(deregs(&c), 0);
    assert_eq!(c.stats().evictions, 0);
    drop(b);
    drop(held);
    // Releasing the pin with the over-limit flag raised evicts (R2).
    assert_eq!(c.stats().evictions, 1);
    assert_eq!(c.stats().cached_entries, 1);
    assert_eq!(deregs(&c), 1);
}

#[test]
fn flush_and_drop_with_lane_leases_leak_nothing() {
    let c = cache();
    warm(&c, A);
    let l = c.acquire(A, LEN, Access::LOCAL_WRITE).unwrap();
    c.flush();
    assert_eq!(deregs(&c), 0);
    drop(l);
    assert_eq!(deregs(&c), 1);
    warm(&c, A);
    drop(c.acquire(A, LEN, Access::LOCAL_WRITE).unwrap());
    let r = c.registrar().registered.load(Ordering::SeqCst);
    drop(c);
    assert_eq!(r, 2);
}

/// Threads hammer lane hits on one range while another invalidates and
/// re-caches it: every registration is deregistered exactly once, none while
/// a lease on it is alive (checked by the lease's handle still being the
/// registration the lease saw at its grant, and by the final counts).
#[test]
fn lane_hits_race_invalidations() {
    let c = cache();
    let rounds = 2_000;
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..rounds {
                    // E6 is allowed: every attempt may meet an invalidation.
                    let Some(l) = (0..100).find_map(|_| match c.acquire(A, LEN, Access::LOCAL_WRITE) {
                        Ok(l) => Some(l),
                        Err(mrcache::Error::RetriesExhausted { .. }) => None,
                        Err(e) => panic!("{e}"),
                    }) else {
                        continue;
                    };
                    let id = l.handle().id;
                    std::hint::spin_loop();
                    assert_eq!(l.handle().id, id);
                    drop(l);
                }
            });
        }
        s.spawn(|| {
            for _ in 0..rounds / 4 {
                c.invalidate(A, 4096, ReleaseKind::Munmap).unwrap();
                std::thread::yield_now();
            }
        });
    });
    c.flush();
    let r = c.registrar();
    assert_eq!(r.registered.load(Ordering::SeqCst), r.deregistered.load(Ordering::SeqCst));
    assert_eq!(c.diagnostics().pinned_slots, 0);
}

#[test]
fn lane_counts_survive_a_fork() {
    let c = cache();
    warm(&c, A);
    let l = c.acquire(A, LEN, Access::LOCAL_WRITE).unwrap();
    assert_eq!(c.diagnostics().lane_hits, 1);
    c.simulate_fork();
    // A lease of the forgotten generation: its release is a no-op, counted.
    l.release();
    let s = c.stats();
    assert_eq!((s.acquires, s.hits, s.releases, s.forgotten), (3, 2, 3, 1));
    assert_eq!(deregs(&c), 0, "forgotten registrations are never deregistered (S2.6)");
    assert_eq!(c.diagnostics().lane_hits, 1, "lane hits of the old generation are kept");
}

#[test]
fn lane_slots_must_be_a_power_of_two_in_range() {
    for bad in [0, 1, 3, 1000, 1 << 17] {
        let config = CacheConfig { lane_slots: bad, ..CacheConfig::explicit() };
        let err = Cache::try_new(CountingRegistrar::default(), config).unwrap_err();
        assert!(err.to_string().contains("lane_slots"), "{err}");
    }
    for good in [2, 64, 1 << 16] {
        let c = Cache::try_new(CountingRegistrar::default(), CacheConfig { lane_slots: good, ..CacheConfig::explicit() }).unwrap();
        warm(&c, A);
        drop(c.acquire(A, LEN, Access::LOCAL_WRITE).unwrap());
        assert_eq!(c.diagnostics().lane_hits, 1);
    }
}

/// A lane whose memos are not hit (more buffers in turn than slots) goes
/// dry: it probes and memoizes on one acquire in 16, so its misses stop
/// paying for it. When keys repeat again its sampled probes hit and it
/// leaves the spell: a hot loop is served by the lane again.
#[test]
fn a_dry_lane_recovers_when_keys_repeat() {
    let c = cache();
    let buffers = 4 * u64::from(CacheConfig::explicit().lane_slots);
    for round in 0..3 {
        for i in 0..buffers {
            let l = c.acquire(A + i * LEN, LEN, Access::LOCAL_WRITE).unwrap();
            assert_eq!(l.hit(), round > 0);
            l.release();
        }
    }
    let thrash_hits = c.diagnostics().lane_hits;
    // Each buffer came back after 4 × the slots: no memo survives that.
    assert!(thrash_hits < buffers / 8, "lane hits while thrashing: {thrash_hits}");
    for _ in 0..4000 {
        let l = c.acquire(A, LEN, Access::LOCAL_WRITE).unwrap();
        assert!(l.hit());
        assert_eq!(l.view().id, 1, "a lane hit returns A1's answer");
        l.release();
    }
    let hot = c.diagnostics().lane_hits - thrash_hits;
    // Back within a few windows (64 probes each, 16 acquires per probe while
    // dry): most of the hot loop is lane hits.
    assert!(hot > 3000, "lane hits in the hot loop: {hot}");
}
