//! The hit path (acquire + release of a cached registration), the figure the
//! cache is designed for (spec.md#LN1, A1, R1). In the same run:
//! - lanes on (the default): a repeated key is a lane hit;
//! - lanes off: every hit is an A1 hit (shared lock + state-word lease);
//! - two floors: a shared lock/unlock plus an atomic lease inc/dec, and the
//!   lease inc/dec alone (the least any design that counts leases with
//!   atomic read-modify-writes can cost);
//! - two threads hitting one registration, lanes on and off (a lane hit
//!   writes no shared cache line).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use mrcache::registrar::counting::CountingRegistrar;
use mrcache::{Cache, CacheConfig, SharedCache};
use mrcache_types::Access;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::RwLock;

const REGION: u64 = 8 << 10;

fn hit(c: &mut Criterion) {
    let mut g = c.benchmark_group("hit get+put");
    // (lanes, lane slots, entries); 4,096 distinct buffers cycle over the
    // entries, so 10k entries overflow the default 1,024 slots.
    let cases = [
        (true, 1024, 1u64),
        (true, 1024, 100),
        (true, 1024, 10_000),
        (true, 16_384, 10_000),
        (false, 1024, 1),
        (false, 1024, 100),
        (false, 1024, 10_000),
    ];
    for (lanes, lane_slots, n) in cases {
        let cache = Cache::new(CountingRegistrar::default(), CacheConfig { lanes, lane_slots, ..CacheConfig::explicit() });
        let base = 1u64 << 32;
        for i in 0..n {
            drop(cache.acquire(base + i * 2 * REGION, REGION, Access::LOCAL_WRITE).unwrap());
        }
        // Addresses precomputed (no division in the timed loop), in a
        // scattered order over the n entries.
        let addrs: Vec<u64> = (0..4096u64).map(|k| base + ((k * 7919) % n) * 2 * REGION + 64).collect();
        let mut k = 0usize;
        let name = match (lanes, lane_slots) {
            (false, _) => "mrcache, lanes off".to_string(),
            (true, 1024) => "mrcache".to_string(),
            (true, s) => format!("mrcache, {s} lane slots"),
        };
        g.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
            b.iter(|| {
                k = (k + 1) & 4095;
                let l = cache.acquire(black_box(addrs[k]), 4096, Access::LOCAL_WRITE).unwrap();
                debug_assert!(l.hit());
                l.release();
            })
        });
    }
    // The same lane hit released by dropping the lease: the drop glue may
    // not be inlined, and then the lease makes a round trip through memory.
    {
        let cache = Cache::new(CountingRegistrar::default(), CacheConfig::explicit());
        let base = 1u64 << 32;
        drop(cache.acquire(base, REGION, Access::LOCAL_WRITE).unwrap());
        g.bench_function("mrcache, released by drop/1", |b| {
            b.iter(|| drop(cache.acquire(black_box(base + 64), 4096, Access::LOCAL_WRITE).unwrap()))
        });
    }
    // Owned leases (`SharedCache::acquire_owned`) on one 64 KiB registration,
    // beside the borrowed lease on the same one: the difference is the
    // owner-only count on the thread's lane.
    {
        let cache = SharedCache::new(CountingRegistrar::default(), CacheConfig::explicit());
        let base = 1u64 << 32;
        drop(cache.acquire(base, 64 << 10, Access::LOCAL_WRITE).unwrap());
        g.bench_function("64 KiB, borrowed lease", |b| {
            b.iter(|| cache.acquire(black_box(base), 64 << 10, Access::LOCAL_WRITE).unwrap().release())
        });
        g.bench_function("64 KiB, owned lease", |b| {
            b.iter(|| cache.acquire_owned(black_box(base), 64 << 10, Access::LOCAL_WRITE).unwrap().release())
        });
    }
    let lock = RwLock::new(0u64);
    let count = AtomicU64::new(0);
    g.bench_function("floor: shared lock + lease inc/dec", |b| {
        b.iter(|| {
            let g = lock.read().unwrap();
            count.fetch_add(1, Ordering::AcqRel);
            black_box(&*g);
            drop(g);
            count.fetch_sub(1, Ordering::AcqRel);
        })
    });
    g.bench_function("floor: lease inc/dec only (no lock)", |b| {
        b.iter(|| {
            count.fetch_add(1, Ordering::AcqRel);
            black_box(&count);
            count.fetch_sub(1, Ordering::AcqRel);
        })
    });
    g.finish();
}

/// The measured thread and a partner both acquire and release one region.
fn two_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("hit get+put, 2 threads on one region");
    for lanes in [true, false] {
        let cache = SharedCache::new(CountingRegistrar::default(), CacheConfig { lanes, ..CacheConfig::explicit() });
        let base = 1u64 << 32;
        drop(cache.acquire(base, REGION, Access::LOCAL_WRITE).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let partner = {
            let (cache, stop) = (cache.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..1024 {
                        cache.acquire(black_box(base), REGION, Access::LOCAL_WRITE).unwrap().release();
                    }
                }
            })
        };
        let name = if lanes { "mrcache" } else { "mrcache, lanes off" };
        g.bench_function(name, |b| b.iter(|| cache.acquire(black_box(base), REGION, Access::LOCAL_WRITE).unwrap().release()));
        // An owned lease on the measured thread (the partner borrows).
        if lanes {
            g.bench_function("mrcache, owned lease (partner borrowed)", |b| {
                b.iter(|| cache.acquire_owned(black_box(base), REGION, Access::LOCAL_WRITE).unwrap().release())
            });
        }
        stop.store(true, Ordering::Relaxed);
        partner.join().unwrap();
    }
    // Owned leases on both threads (a request object on each).
    {
        let cache = SharedCache::new(CountingRegistrar::default(), CacheConfig::explicit());
        let base = 1u64 << 32;
        drop(cache.acquire(base, REGION, Access::LOCAL_WRITE).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let partner = {
            let (cache, stop) = (cache.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..1024 {
                        cache.acquire_owned(black_box(base), REGION, Access::LOCAL_WRITE).unwrap().release();
                    }
                }
            })
        };
        g.bench_function("mrcache, owned lease (partner owned)", |b| {
            b.iter(|| cache.acquire_owned(black_box(base), REGION, Access::LOCAL_WRITE).unwrap().release())
        });
        stop.store(true, Ordering::Relaxed);
        partner.join().unwrap();
    }
    g.finish();
}

criterion_group!(benches, hit, two_threads);
criterion_main!(benches);
