//! The Rust half of bench/capi/run.sh: the hit path (acquire + release of one
//! cached 64 KiB registration, counting registrar) with the borrowed lease
//! and the owned lease, on one thread, and with a partner thread hitting the
//! same registration. Prints `name ns_per_op` lines: the best of ROUNDS runs
//! of ITERS iterations each (environment; defaults 5 and 10,000,000).

use mrcache_impl::registrar::counting::CountingRegistrar;
use mrcache_impl::{Cache, CacheConfig, SharedCache};
use mrcache_types::Access;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

const LEN: u64 = 64 << 10;
const BASE: u64 = 1 << 32;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn best(rounds: u64, iters: u64, mut run: impl FnMut(u64)) -> f64 {
    (0..rounds)
        .map(|_| {
            let t = Instant::now();
            run(iters);
            t.elapsed().as_nanos() as f64 / iters as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn borrowed(cache: &Cache<CountingRegistrar>, n: u64) {
    for _ in 0..n {
        cache.acquire(black_box(BASE), LEN, Access::LOCAL_WRITE).unwrap().release();
    }
}

fn owned(cache: &SharedCache<CountingRegistrar>, n: u64) {
    for _ in 0..n {
        cache.acquire_owned(black_box(BASE), LEN, Access::LOCAL_WRITE).unwrap().release();
    }
}

/// Runs `measure` while a partner thread runs the same kind of hit on the
/// same registration.
fn with_partner(cache: &SharedCache<CountingRegistrar>, owned_partner: bool, measure: impl FnOnce() -> f64) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let partner = {
        let (cache, stop) = (cache.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if owned_partner {
                    owned(&cache, 1024)
                } else {
                    borrowed(&cache, 1024)
                }
            }
        })
    };
    let r = measure();
    stop.store(true, Ordering::Relaxed);
    partner.join().unwrap();
    r
}

fn main() {
    let (rounds, iters) = (env("ROUNDS", 5), env("ITERS", 10_000_000));
    let cache = SharedCache::new(CountingRegistrar::default(), CacheConfig::explicit());
    drop(cache.acquire(BASE, LEN, Access::LOCAL_WRITE).unwrap());
    println!("rust_borrowed_1t {:.2}", best(rounds, iters, |n| borrowed(&cache, n)));
    println!("rust_owned_1t {:.2}", best(rounds, iters, |n| owned(&cache, n)));
    let b2 = with_partner(&cache, false, || best(rounds, iters, |n| borrowed(&cache, n)));
    println!("rust_borrowed_2t {b2:.2}");
    let o2 = with_partner(&cache, true, || best(rounds, iters, |n| owned(&cache, n)));
    println!("rust_owned_2t {o2:.2}");
    assert_eq!(cache.registrar().live(), 1, "one registration served every hit");
}
