//! The hit path (acquire + release of a cached registration), the figure the
//! cache is designed for (spec.md#A1, R1). Compared in the same run with two
//! floors: the design's (one shared lock/unlock plus an atomic lease inc/dec),
//! so the ratio says how much the lookup itself costs; and a lock-free read
//! side's (the lease inc/dec alone), the least any design that counts leases
//! with atomics can cost.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use mrcache::registrar::counting::CountingRegistrar;
use mrcache::{Cache, CacheConfig};
use mrcache_types::Access;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

const REGION: u64 = 8 << 10;

fn hit(c: &mut Criterion) {
    let mut g = c.benchmark_group("hit get+put");
    for n in [1u64, 100, 10_000] {
        let cache = Cache::new(CountingRegistrar::default(), CacheConfig::default());
        let base = 1u64 << 32;
        for i in 0..n {
            drop(cache.acquire(base + i * 2 * REGION, REGION, Access::LOCAL_WRITE).unwrap());
        }
        eprintln!("membarrier: {}", mrcache::cache::uses_membarrier());
        // Addresses precomputed (no division in the timed loop), in a
        // scattered order over the n entries.
        let addrs: Vec<u64> = (0..4096u64).map(|k| base + ((k * 7919) % n) * 2 * REGION + 64).collect();
        let mut k = 0usize;
        g.bench_with_input(BenchmarkId::new("mrcache", n), &n, |b, _| {
            b.iter(|| {
                k = (k + 1) & 4095;
                let l = cache.acquire(black_box(addrs[k]), 4096, Access::LOCAL_WRITE).unwrap();
                debug_assert!(l.hit());
                drop(l);
            })
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

criterion_group!(benches, hit);
criterion_main!(benches);
