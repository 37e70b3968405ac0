//! Measures the interval-index candidates side by side (the
//! figures quoted in `impl/src/index.rs`'s design note):
//!
//! - `sorted array`: the index before the B+-tree (`sorted_array.rs`, verbatim);
//! - `B+-tree/F`: `mrcache::index::IntervalIndex` at fanout F = 16, 32 (the
//!   default), 64.
//!
//! Per candidate and size n: a fill in address order (each insert followed by
//! `refresh`, as the cache's exclusive lock does), hits at random and in
//! order (8 KiB = 2-page entries), a remove + insert at random positions, and
//! hits over overlapping entries (4 pages at a 2-page stride).
//! `cargo run --release -p mrcache --example index_candidates [max_n]`
mod sorted_array;

use mrcache::index::IntervalIndex;
use mrcache::types::{Access, PageSpan};
use std::hint::black_box;
use std::time::Instant;

trait Index {
    fn insert(&mut self, span: PageSpan, id: u64);
    fn remove(&mut self, first: u64, id: u64);
    fn refresh(&mut self);
    fn covering(&self, span: PageSpan) -> Option<u64>;
}

impl Index for sorted_array::IntervalIndex<u64> {
    fn insert(&mut self, span: PageSpan, id: u64) {
        sorted_array::IntervalIndex::insert(self, span, id, Access::LOCAL_WRITE, id);
    }
    fn remove(&mut self, first: u64, id: u64) {
        sorted_array::IntervalIndex::remove(self, first, id).unwrap();
    }
    fn refresh(&mut self) {
        sorted_array::IntervalIndex::refresh(self);
    }
    fn covering(&self, span: PageSpan) -> Option<u64> {
        sorted_array::IntervalIndex::covering(self, span, Access::LOCAL_WRITE).map(|s| s.value)
    }
}

impl<const R: usize> Index for IntervalIndex<u64, R> {
    fn insert(&mut self, span: PageSpan, id: u64) {
        IntervalIndex::insert(self, span, id, Access::LOCAL_WRITE, id);
    }
    fn remove(&mut self, first: u64, id: u64) {
        IntervalIndex::remove(self, first, id).unwrap();
    }
    fn refresh(&mut self) {
        IntervalIndex::refresh(self);
    }
    fn covering(&self, span: PageSpan) -> Option<u64> {
        IntervalIndex::covering(self, span, Access::LOCAL_WRITE).map(|s| s.value)
    }
}

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        ((x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) * n) >> 32
    }
}

const BASE: u64 = 1 << 24;

fn sp(first: u64, len: u64) -> PageSpan {
    PageSpan { first, end: first + len }
}

fn measure<I: Index>(name: &str, mut idx: I, n: u64, slow_updates: bool) {
    // Fill (timed only where it finishes in reasonable time).
    let t = Instant::now();
    for i in 0..n {
        idx.insert(sp(BASE + 2 * i, 2), i + 1);
        if slow_updates && n > 10_000 {
            continue;
        }
        idx.refresh();
    }
    idx.refresh();
    let fill = if slow_updates && n > 10_000 { f64::NAN } else { t.elapsed().as_nanos() as f64 / n as f64 };
    let iters = 2_000_000u64;
    let mut g = Rng(0x9E37_79B9_7F4A_7C15);
    let t = Instant::now();
    for _ in 0..iters {
        black_box(idx.covering(sp(BASE + 2 * g.below(n), 2)));
    }
    let random = t.elapsed().as_nanos() as f64 / iters as f64;
    let t = Instant::now();
    for k in 0..iters {
        black_box(idx.covering(sp(BASE + 2 * (k % n), 2)));
    }
    let in_order = t.elapsed().as_nanos() as f64 / iters as f64;
    let updates = if slow_updates && n > 10_000 { 100 } else { 20_000u64.min(n) };
    let t = Instant::now();
    for k in 0..updates {
        let i = g.below(n);
        idx.remove(BASE + 2 * i, i + 1);
        idx.insert(sp(BASE + 2 * i, 2), i + 1);
        idx.refresh();
        black_box(k);
    }
    let update = t.elapsed().as_nanos() as f64 / updates as f64 / 2.0;
    println!(
        "{name:<16} n={n:<7} fill={fill:>9.1} ns/insert  hit random={random:>6.1} ns  in order={in_order:>6.1} ns  remove|insert={update:>9.1} ns"
    );
}

fn overlapping<I: Index>(name: &str, mut idx: I, n: u64) {
    for i in 0..n {
        idx.insert(sp(BASE + 2 * i, 4), i + 1);
    }
    idx.refresh();
    let iters = 2_000_000u64;
    let mut g = Rng(0x9E37_79B9_7F4A_7C15);
    let t = Instant::now();
    for _ in 0..iters {
        let i = g.below(n);
        assert_eq!(idx.covering(sp(BASE + 2 * i, 4)), Some(i + 1));
    }
    println!(
        "{name:<16} n={n:<7} overlapping 4-page entries at a 2-page stride: hit={:>6.1} ns",
        t.elapsed().as_nanos() as f64 / iters as f64
    );
}

fn main() {
    let max: u64 = std::env::args().nth(1).map(|s| s.parse().unwrap()).unwrap_or(100_000);
    let mut n = 1_000;
    while n <= max {
        measure("sorted array", sorted_array::IntervalIndex::<u64>::new(), n, true);
        measure("B+-tree/16", IntervalIndex::<u64, 17>::new(), n, false);
        measure("B+-tree/32", IntervalIndex::<u64, 33>::new(), n, false);
        measure("B+-tree/64", IntervalIndex::<u64, 65>::new(), n, false);
        n *= 10;
    }
    overlapping("sorted array", sorted_array::IntervalIndex::<u64>::new(), 10_000);
    overlapping("B+-tree/32", IntervalIndex::<u64, 33>::new(), 10_000);
}
