//! Synchronisation facade of the lease slab ([`crate::slab`]) and the
//! per-thread free lists ([`crate::threads`]): `loom` under `--cfg loom`,
//! `std` otherwise, so that the slab's loom models (`slab::models`) explore
//! the very code the library runs.
//!
//! What goes through it: the slab's free-list head, chunk pointers, fresh
//! counter and every slot word (state, link, the seqlocked copies), the
//! slot's lease cell, and a bucket's free list (`len`, `slots`). A bucket's
//! `mark` and `entered_in` stay `std`: the models hand each thread its
//! bucket, since loom threads share one OS thread and so one thread token.
//!
//! Without `--cfg loom` every item is the `std` one or a zero-cost wrapper
//! of it: production code is unchanged (the release build's
//! `mrcache_acquire`, `mrcache_release`, `mrcache_lease_keys` and
//! `mrcache_lease_view` compile to the instructions they had before the
//! facade).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicU64};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicU64};

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
