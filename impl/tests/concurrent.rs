//! Concurrent smoke test: 4 worker threads × many random operations plus a
//! monitor thread (M2 rounds through `drain_with`), under every overlap
//! policy, with and without limits. Checked on the fly: P1 (coverage) and P2
//! (freshness against every release event that completed before the acquire
//! began). At the end: no panic, no leak (after dropping every lease and
//! flushing, nothing is registered), and consistent counters.

use mrcache::types::{Access, Range, ReleaseKind};
use mrcache::{Cache, CacheConfig, Config, EvictionPolicy, Faults, Lease, Limits, OverlapPolicy, ReleaseEvent};
use mrcache_testkit::generations::{GenRegistrar, Pages};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const P: u64 = 4096;
const PAGES: u64 = 32;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const ACCESSES: [Access; 3] = [Access::LOCAL_READ, Access::REMOTE_READ, Access::REMOTE_WRITE];

fn worker<'c>(cache: &'c Cache<GenRegistrar>, pages: &Pages, seed: u64, ops: usize) -> (Vec<Lease<'c, GenRegistrar>>, u64) {
    let mut rng = Rng(seed);
    let mut leases: Vec<Lease<'c, GenRegistrar>> = Vec::new();
    let mut granted = 0;
    for _ in 0..ops {
        match rng.below(100) {
            0..=44 => {
                if leases.len() >= 6 {
                    let i = rng.below(leases.len() as u64) as usize;
                    drop(leases.swap_remove(i));
                }
                let addr = rng.below(PAGES - 4) * P + if rng.below(4) == 0 { rng.below(P) } else { 0 };
                let len = 1 + rng.below(4 * P - 1);
                let access = ACCESSES[rng.below(3) as usize];
                let snap = pages.completed_snapshot(addr, len);
                match cache.acquire(addr, len, access) {
                    Ok(l) => {
                        let v = l.view();
                        // P1
                        assert!(v.addr <= addr && addr + len <= v.addr + v.len, "{v} does not cover");
                        assert!(v.access.suffices_for(access));
                        // P2
                        assert!(l.handle().is_fresh_for(&snap), "stale lease {v}: {:?} vs {snap:?}", l.handle().pinned);
                        granted += 1;
                        leases.push(l);
                    }
                    Err(e) => assert_eq!(e.code(), "E6", "{e}"),
                }
            }
            45..=74 => {
                if !leases.is_empty() {
                    let i = rng.below(leases.len() as u64) as usize;
                    drop(leases.swap_remove(i));
                }
            }
            75..=89 => {
                let addr = rng.below(PAGES) * P;
                let len = (1 + rng.below(2)) * P;
                let bumped = pages.bump(addr, len);
                cache.invalidate(addr, len, ReleaseKind::Munmap).unwrap();
                pages.complete(&bumped);
            }
            90..=91 => cache.flush(),
            _ => {
                let _ = cache.stats();
            }
        }
    }
    // Hand half of the leases to the caller's thread (leases are Send).
    let keep = leases.split_off(leases.len() / 2);
    drop(leases);
    (keep, granted)
}

fn smoke(config: Config, ops: usize) {
    smoke_with(CacheConfig::explicit_with(config), ops)
}

fn smoke_with(cache_config: CacheConfig, ops: usize) {
    let config = cache_config.contract;
    let pages = Arc::new(Pages::new(PAGES as usize + 8, P));
    let cache = Cache::new(GenRegistrar::new(pages.clone()), cache_config);
    let stop = AtomicBool::new(false);
    let mut granted = 0;
    std::thread::scope(|s| {
        let monitor = s.spawn(|| {
            let mut rng = Rng(99);
            while !stop.load(Ordering::Relaxed) {
                let addr = rng.below(PAGES) * P;
                let bumped = pages.bump(addr, P);
                cache.drain_with(|evs| evs.push(ReleaseEvent::of(ReleaseKind::MadviseDontneed, Range::new(addr, P).unwrap())));
                pages.complete(&bumped);
                std::thread::yield_now();
            }
        });
        let workers: Vec<_> = (0..4u64)
            .map(|t| {
                s.spawn({
                    let cache = &cache;
                    let pages = &pages;
                    move || worker(cache, pages, 0x9e3779b97f4a7c15 ^ ((t + 1) * 7919), ops)
                })
            })
            .collect();
        let mut kept = Vec::new();
        let mut panicked = None;
        for w in workers {
            match w.join() {
                Ok((leases, g)) => {
                    granted += g;
                    kept.extend(leases);
                }
                Err(p) => panicked = Some(p),
            }
        }
        stop.store(true, Ordering::Relaxed);
        if let Some(p) = panicked {
            std::panic::resume_unwind(p);
        }
        monitor.join().unwrap();
        drop(kept);
    });
    cache.flush();
    let s = cache.stats();
    assert_eq!(cache.registrar().live(), 0, "leak under {config:?}: {s:?}");
    assert_eq!((s.cached_entries, s.pinned_bytes), (0, 0), "{s:?}");
    assert_eq!(s.registrations, s.deregistrations, "{s:?}");
    assert_eq!(s.acquires, s.hits + s.misses + s.errors, "{s:?}");
    assert_eq!(s.releases, granted, "{s:?}");
    assert_eq!(s.hits + s.misses, granted);
    let d = cache.diagnostics();
    assert_eq!(cache.registrar().registered.load(Ordering::SeqCst), s.registrations + d.discarded_registrations, "{s:?} {d:?}");
    assert_eq!(d.dereg_failures, 0);
}

#[test]
fn four_threads_no_limits() {
    for policy in OverlapPolicy::ALL {
        smoke(Config::with_policy(policy), 20_000);
    }
}

#[test]
fn four_threads_with_limits() {
    for policy in OverlapPolicy::ALL {
        for eviction in [EvictionPolicy::Lru, EvictionPolicy::CostAware] {
            smoke(with_limits(policy, eviction), 20_000);
        }
    }
}

fn with_limits(policy: OverlapPolicy, eviction: EvictionPolicy) -> Config {
    let limits = Limits { max_regions: Some(6), max_pinned_bytes: Some(12 * P), max_unreleased: Some(4) };
    Config { policy, eviction, limits, chunk_pages: 2, ..Config::default() }
}

/// The panic message of `smoke_with` under a fault switch (it must panic).
fn smoke_fails(faults: Faults) -> String {
    let mut cc = CacheConfig::explicit_with(with_limits(OverlapPolicy::Independent, EvictionPolicy::Lru));
    cc.faults = faults;
    let err = std::panic::catch_unwind(|| smoke_with(cc, 20_000)).expect_err("the oracle must catch the fault");
    err.downcast_ref::<String>().cloned().or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
}

/// The corrected P2 oracle (each event completes with the generations it
/// installed) still catches a cache that ignores release events.
#[test]
fn oracle_catches_p2_monitor_off() {
    let mut faults = Faults::default();
    faults.monitor_off = true;
    let msg = smoke_fails(faults);
    assert!(msg.contains("stale lease"), "{msg}");
}

/// The final "nothing registered" check catches a cache that loses
/// deregistrations (P4).
#[test]
fn oracle_catches_p4_leak_deregistration() {
    let mut faults = Faults::default();
    faults.leak_deregistration = true;
    let msg = smoke_fails(faults);
    assert!(msg.contains("leak under"), "{msg}");
}

#[test]
fn hit_heavy_parallel_reads() {
    // Many threads hitting the same entry through the fast path while another
    // invalidates it now and then: exactly one deregistration each time.
    // A miss whose registration is invalidated on each of its `max_retries`
    // attempts ends in E6 (spec.md#S3.7): allowed, counted, never a panic.
    let pages = Arc::new(Pages::new(16, P));
    let cache = Cache::new(GenRegistrar::new(pages.clone()), CacheConfig::explicit());
    let e6 = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..50_000 {
                    match cache.acquire(0, P, Access::REMOTE_READ) {
                        Ok(l) => {
                            std::hint::black_box(l.keys());
                        }
                        Err(mrcache::Error::RetriesExhausted { .. }) => {
                            e6.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
            });
        }
        s.spawn(|| {
            for _ in 0..500 {
                let bumped = pages.bump(0, P);
                cache.invalidate(0, P, ReleaseKind::Munmap).unwrap();
                pages.complete(&bumped);
                std::thread::yield_now();
            }
        });
    });
    cache.flush();
    assert_eq!(cache.registrar().live(), 0);
    let s = cache.stats();
    let e6 = e6.into_inner();
    assert_eq!(s.hits + s.misses + e6, 200_000, "{s:?}");
    assert_eq!((s.errors, s.releases), (e6, 200_000 - e6), "{s:?}");
}
