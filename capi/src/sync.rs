//! Synchronisation facade of the lease slab ([`crate::slab`]) and the
//! per-thread free lists ([`crate::threads`]): `loom` under `--cfg loom`,
//! `std` otherwise, so that the slab's loom models (`slab::models`) explore
//! the very code the library runs.
//!
//! What goes through it: the slab's free-list head, chunk pointers, fresh
//! counter and every slot word (state, link, the seqlocked copies), the
//! slot's lease cell, a bucket's free list (`len`, `slots`) and its `mark`
//! (the claim and the callback depth). A bucket's `entered_in` (a fork
//! generation) stays `std`. Loom's threads share one OS thread and so one
//! thread token: the models hand each thread its bucket, or its token
//! (`ThreadBuckets::mine_as`). The cache ids' word is a `static`, `std`'s;
//! their model runs the same code ([`crate::take_cache_id`]) on a loom word.
//!
//! Without `--cfg loom` every item is the `std` one or a zero-cost wrapper
//! of it: production code is unchanged (the release build's
//! `mrcache_acquire`, `mrcache_release`, `mrcache_lease_keys` and
//! `mrcache_lease_view` compile to the instructions they had before the
//! facade).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize};

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

/// `std::cell::UnsafeCell`, and loom's access API for the code the two
/// builds share: loom checks every access to a cell against the
/// happens-before order of the threads that made it. The slab's hot paths
/// use [`UnsafeCell::get`] without loom (a closure there changed what the
/// compiler inlines into `mrcache_release`) and `with_mut` under loom.
#[cfg(not(loom))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(v: T) -> UnsafeCell<T> {
        UnsafeCell(std::cell::UnsafeCell::new(v))
    }

    /// A pointer to the contents (`std::cell::UnsafeCell::get`).
    #[inline(always)]
    pub(crate) const fn get(&self) -> *mut T {
        self.0.get()
    }
}

/// The deliberate breakages of the C API's loom models other than the
/// slab's, by the names of `mrcache_types::mutants::LOOM_MUTANTS`; each is
/// caught by a model of `slab::models`. Only loom builds select one: the
/// library passes `None`, and the branch is compiled out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LoomMutant {
    /// A cache id is taken with a load and a store instead of a
    /// `fetch_add`: two caches created at once can get one id, and so one
    /// handle tag.
    CacheIdNotAtomic,
    /// A free thread bucket is claimed with a load and a store instead of
    /// the compare-exchange: two running threads can both own it.
    BucketClaimWithoutCas,
}

#[cfg(any(test, loom))]
impl LoomMutant {
    pub(crate) const ALL: [LoomMutant; 2] = [LoomMutant::CacheIdNotAtomic, LoomMutant::BucketClaimWithoutCas];

    pub(crate) fn name(self) -> &'static str {
        match self {
            LoomMutant::CacheIdNotAtomic => "cache-id-not-atomic",
            LoomMutant::BucketClaimWithoutCas => "bucket-claim-without-cas",
        }
    }
}

/// Whether `mutant` is `m` (always `false` outside loom builds).
#[inline(always)]
#[allow(unused_variables)]
pub(crate) fn broken(mutant: Option<LoomMutant>, m: LoomMutant) -> bool {
    #[cfg(loom)]
    return mutant == Some(m);
    #[cfg(not(loom))]
    false
}
