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
//! of it ([`UnsafeCell::with_mut`] is `f(self.get())`): production code is
//! unchanged.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicU64};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicU64};

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

/// `std::cell::UnsafeCell` with loom's access API: loom checks every access
/// to a cell against the happens-before order of the threads that made it.
#[cfg(not(loom))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(v: T) -> UnsafeCell<T> {
        UnsafeCell(std::cell::UnsafeCell::new(v))
    }

    /// Runs `f` on a pointer to the contents (the caller has exclusive
    /// access, as with `UnsafeCell::get`).
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}
