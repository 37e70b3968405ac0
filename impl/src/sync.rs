//! Synchronisation facade: `loom` under `--cfg loom`, `std` otherwise.
//!
//! Only the primitives that carry the protocol of spec.md §A go through this
//! facade, so that loom explores exactly the interleavings that matter:
//! - the cache lock ([`RwLock`]),
//! - the per-entry state word (lease count + INVALID, spec.md#A-H),
//! - the invalidation queue's head (spec.md#H1, S3.9),
//! - the over-limit flag (spec.md#R2);
//! - the lanes' slot words (`ptr`, `held`, `remote`, `pin`), the lanes mutex
//!   and the draining count (spec.md#LN1–LN6).
//!
//! Counters, LRU stamps and the fork generation are plain `std` atomics even
//! under loom: their values never decide who deregisters what, and keeping
//! them out of loom keeps its state space small.
//!
//! [`model`] runs a closure under `loom::model` with `--cfg loom`, and once,
//! directly, without it, so the same loom tests also run as plain tests.
//!
//! ```text
//! RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p mrcache --test loom --release
//! ```

#[cfg(loom)]
pub use loom::sync::{
    atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering},
    Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
};
#[cfg(not(loom))]
pub use std::sync::{
    atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering},
    Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
};

/// The atomics loom does not model (counters, LRU stamps, the fork
/// generation, lane bookkeeping that decides nothing): always `std`, also
/// under loom. Spelled `plain::AtomicU64` etc. at every use, so that a reader
/// sees which atomics loom explores. `Ordering` is the same type in both.
pub mod plain {
    pub use std::sync::atomic::{compiler_fence, fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize};
}

/// A 64-bit atomic word: std's, or loom's under `--cfg loom`. The
/// mechanisms whose word is a plain `std` atomic in the library (the hit
/// counters' slots, kept out of the cache's models; the C API's cache ids,
/// a `static`) are written once, generic over it: the library runs them on
/// [`plain::AtomicU64`], and their own loom models on loom's, so the models
/// explore the very code the library runs. Every method is the inherent
/// one of the same name, inlined: no cost in the library.
pub trait AtomicWord: Send + Sync {
    /// A word holding `v`.
    fn new(v: u64) -> Self;
    /// `load`.
    fn load(&self, o: Ordering) -> u64;
    /// `store`.
    fn store(&self, v: u64, o: Ordering);
    /// `fetch_add`.
    fn fetch_add(&self, v: u64, o: Ordering) -> u64;
    /// `compare_exchange`.
    fn compare_exchange(&self, current: u64, new: u64, success: Ordering, failure: Ordering) -> Result<u64, u64>;
}

macro_rules! atomic_word {
    ($t:ty) => {
        impl AtomicWord for $t {
            #[inline(always)]
            fn new(v: u64) -> Self {
                <$t>::new(v)
            }
            #[inline(always)]
            fn load(&self, o: Ordering) -> u64 {
                <$t>::load(self, o)
            }
            #[inline(always)]
            fn store(&self, v: u64, o: Ordering) {
                <$t>::store(self, v, o)
            }
            #[inline(always)]
            fn fetch_add(&self, v: u64, o: Ordering) -> u64 {
                <$t>::fetch_add(self, v, o)
            }
            #[inline(always)]
            fn compare_exchange(&self, current: u64, new: u64, success: Ordering, failure: Ordering) -> Result<u64, u64> {
                <$t>::compare_exchange(self, current, new, success, failure)
            }
        }
    };
}

atomic_word!(plain::AtomicU64);
#[cfg(loom)]
atomic_word!(loom::sync::atomic::AtomicU64);

#[cfg(loom)]
pub(crate) use loom::thread_local;
#[cfg(not(loom))]
pub(crate) use std::thread_local;

/// Threads: `loom::thread` under `--cfg loom`, `std::thread` otherwise.
pub mod thread {
    #[cfg(loom)]
    pub use loom::thread::{spawn, yield_now, JoinHandle};
    #[cfg(not(loom))]
    pub use std::thread::{spawn, yield_now, JoinHandle};
}

/// Runs `f` under every interleaving loom explores (`--cfg loom`), or once.
#[cfg(loom)]
pub fn model<F: Fn() + Sync + Send + 'static>(f: F) {
    loom::model(f)
}

/// Runs `f` under every interleaving loom explores (`--cfg loom`), or once.
#[cfg(not(loom))]
pub fn model<F: Fn() + Sync + Send + 'static>(f: F) {
    f()
}

/// [`model`] with at least `bound` preemptions per interleaving, for a
/// race whose window needs more thread switches than `LOOM_MAX_PREEMPTIONS`
/// allows the other models.
#[cfg(loom)]
pub fn model_with_preemptions<F: Fn() + Sync + Send + 'static>(bound: usize, f: F) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(b.preemption_bound.map_or(bound, |n| n.max(bound)));
    b.check(f)
}

/// [`model`] with at least `bound` preemptions (loom only).
#[cfg(not(loom))]
pub fn model_with_preemptions<F: Fn() + Sync + Send + 'static>(_bound: usize, f: F) {
    f()
}

/// A sequentially consistent fence under loom, nothing otherwise. Loom
/// treats SeqCst loads and stores as AcqRel, so a store-buffering (Dekker)
/// pair that relies on the single total order of SeqCst accesses (the
/// over-limit flag against a release's decrement: spec.md#A10, R1) would
/// show loom outcomes no real build has. This fence, on both sides, gives
/// loom that order; real builds get it from the SeqCst accesses themselves.
#[inline(always)]
pub fn loom_sc_fence() {
    #[cfg(loom)]
    loom::sync::atomic::fence(Ordering::SeqCst);
}

/// `true` when compiled for loom (tests use it to skip assertions that need
/// loom's exhaustive scheduling to be meaningful).
pub const LOOM: bool = cfg!(loom);
