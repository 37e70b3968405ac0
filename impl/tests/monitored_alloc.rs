//! `MonitoredAlloc` as this test binary's global allocator: Rust
//! deallocations invalidate cached registrations, and deallocations made
//! inside cache operations (with the cache lock held) never deadlock (P6).

use mrcache::monitor::MonitoredAlloc;
use mrcache::registrar::counting::CountingRegistrar;
use mrcache::{Cache, CacheConfig};
use mrcache_types::Access;
use std::alloc::System;

#[global_allocator]
static ALLOC: MonitoredAlloc<System> = MonitoredAlloc::new(System);

fn cache() -> &'static Cache<CountingRegistrar> {
    let c: &'static Cache<CountingRegistrar> = Box::leak(Box::new(Cache::new(CountingRegistrar::default(), CacheConfig::explicit())));
    ALLOC.subscribe(c).unwrap();
    c
}

#[test]
//= spec.md#S7.2
fn a_dropped_buffer_leaves_the_cache() {
    let c = cache();
    let buf = vec![7u8; 1 << 20];
    let (addr, len) = (buf.as_ptr() as u64, buf.len() as u64);
    assert!(!c.acquire(addr, len, Access::LOCAL_WRITE).unwrap().hit());
    assert!(c.acquire(addr, 4096, Access::LOCAL_WRITE).unwrap().hit());
    let before = c.stats();
    drop(buf);
    let after = c.stats();
    assert_eq!(after.invalidations, before.invalidations + 1, "{after:?}");
    assert_eq!(after.cached_entries, 0);
    // The address may come back from the allocator: never a stale hit.
    let again = vec![1u8; 1 << 20];
    let l = c.acquire(again.as_ptr() as u64, 4096, Access::LOCAL_WRITE).unwrap();
    assert!(!l.hit());
}

#[test]
fn allocator_traffic_inside_cache_operations_does_not_deadlock() {
    let c = cache();
    // Many misses, evictions and invalidations: the cache's own Vecs are
    // freed inside its critical sections and reported to it re-entrantly.
    let bufs: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 8192 + i * 4096]).collect();
    for round in 0..20 {
        for (i, b) in bufs.iter().enumerate() {
            // E6 is allowed: the cache's own frees, reported re-entrantly, may
            // hit the page it is registering on every attempt (spec.md#S3.7).
            let l = match c.acquire(b.as_ptr() as u64 + (round % 3) as u64, 4096 * (1 + i as u64 % 2), Access::LOCAL_WRITE) {
                Ok(l) => Some(l),
                Err(mrcache::Error::RetriesExhausted { .. }) => None,
                Err(e) => panic!("{e}"),
            };
            let scratch: Vec<u64> = (0..(i + round)).map(|x| x as u64).collect();
            drop(scratch);
            drop(l);
        }
        c.flush();
    }
    drop(bufs);
    assert_eq!(c.registrar().live(), 0, "{:?}", c.stats());
}
