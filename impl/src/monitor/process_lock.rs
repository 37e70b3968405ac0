//! A lock that a fork child never waits on (spec.md#S7.6, *Fork*): the
//! process's monitor state is guarded by it, and a child made by any kind
//! of fork (glibc's `fork`, `_Fork`, a raw `clone` or `SYS_fork`) while a
//! thread of the parent held it can still create its own caches.
//!
//! The lock word is the pid of the process whose thread holds it (0: free).
//! A thread that finds it held by another pid is in a fork child: the
//! holder does not exist there and never unlocks, so the thread takes the
//! lock over, and the guard says so ([`ProcessGuard::taken_over`]): the
//! data may be half-changed and belongs to the parent; the caller resets
//! it without dropping it.
//!
//! Invariants:
//! - Among the threads of one process, mutual exclusion as a spin lock with
//!   `sched_yield` (held only across attach and detach bookkeeping, never
//!   across a wait for another thread).
//! - A takeover happens only when the word names another process, which
//!   in a process's own memory means a fork copied it held.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, Ordering};

pub(super) struct ProcessLock<T> {
    holder: AtomicU32,
    data: UnsafeCell<T>,
}

// SAFETY: the data is reached only through a guard, and one guard exists at
// a time in a process (module invariants); T: Send is what moving it between
// threads needs.
unsafe impl<T: Send> Sync for ProcessLock<T> {}

pub(super) struct ProcessGuard<'a, T> {
    lock: &'a ProcessLock<T>,
    taken_over: bool,
}

impl<T> ProcessLock<T> {
    pub(super) const fn new(data: T) -> Self {
        ProcessLock { holder: AtomicU32::new(0), data: UnsafeCell::new(data) }
    }

    pub(super) fn lock(&self) -> ProcessGuard<'_, T> {
        let me = std::process::id();
        loop {
            // Acquire: the data the last holder wrote is visible.
            match self.holder.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return ProcessGuard { lock: self, taken_over: false },
                Err(holder) if holder != me => {
                    // A fork copied the lock held by a thread of the parent.
                    if self.holder.compare_exchange(holder, me, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                        return ProcessGuard { lock: self, taken_over: true };
                    }
                }
                // Another thread of this process holds it: it holds it only
                // for bookkeeping, so yield (not a cancellation point).
                Err(_) => std::thread::yield_now(),
            }
        }
    }
}

impl<T> ProcessGuard<'_, T> {
    /// Whether the lock was held by a thread of the parent at a fork: the
    /// data is the parent's, perhaps half-changed.
    pub(super) fn taken_over(&self) -> bool {
        self.taken_over
    }
}

impl<T> Deref for ProcessGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard is the one holder (module invariants).
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> DerefMut for ProcessGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as above, and `&mut self` is unique.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T> Drop for ProcessGuard<'_, T> {
    fn drop(&mut self) {
        // Release: the data written under the guard is visible to the next.
        self.lock.holder.store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_held_by_another_pid_is_taken_over() {
        let lock = ProcessLock::new(5u32);
        {
            let g = lock.lock();
            assert!(!g.taken_over());
        }
        // As a fork child finds it: held by its parent.
        lock.holder.store(std::process::id().wrapping_add(1).max(1), Ordering::Relaxed);
        let mut g = lock.lock();
        assert!(g.taken_over());
        *g = 6;
        drop(g);
        assert_eq!(*lock.lock(), 6);
    }
}
