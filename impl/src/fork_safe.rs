//! Process-wide state that a fork child never waits on (spec.md#S7.6,
//! *Fork*): [`ProcessLock`] and [`ForkSafeOnce`]. A child made by any kind
//! of fork (glibc's `fork`, `_Fork`, a raw `clone` or `SYS_fork`) while a
//! thread of the parent held the lock, or ran the once, can still create
//! its own caches: a std `Mutex` or `Once` copied held would block it
//! forever.
//!
//! ProcessLock:
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
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

pub(crate) struct ProcessLock<T> {
    holder: AtomicU32,
    data: UnsafeCell<T>,
}

// SAFETY: the data is reached only through a guard, and one guard exists at
// a time in a process (module invariants); T: Send is what moving it between
// threads needs.
unsafe impl<T: Send> Sync for ProcessLock<T> {}

pub(crate) struct ProcessGuard<'a, T> {
    lock: &'a ProcessLock<T>,
    taken_over: bool,
}

impl<T> ProcessLock<T> {
    pub(crate) const fn new(data: T) -> Self {
        ProcessLock { holder: AtomicU32::new(0), data: UnsafeCell::new(data) }
    }

    pub(crate) fn lock(&self) -> ProcessGuard<'_, T> {
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
    pub(crate) fn taken_over(&self) -> bool {
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

/// A `Once` that a fork child re-runs if the parent's thread was inside it
/// at the fork (that thread does not exist in the child). So its closure
/// must be safe to run again after a partial run in the parent.
///
/// The state word: [`ONCE_NEW`], [`ONCE_DONE`], or the pid of the process
/// whose thread runs it, shifted left by 2 and tagged [`ONCE_RUNNING`].
pub(crate) struct ForkSafeOnce {
    state: AtomicU64,
}

const ONCE_NEW: u64 = 0;
const ONCE_DONE: u64 = 1;
const ONCE_RUNNING: u64 = 2;

impl ForkSafeOnce {
    pub(crate) const fn new() -> Self {
        ForkSafeOnce { state: AtomicU64::new(ONCE_NEW) }
    }

    /// Runs `f` once per process (again in a fork child whose parent was
    /// running it). Waits, yielding, while another thread of this process
    /// runs it.
    pub(crate) fn call_once(&self, f: impl FnOnce()) {
        let running = (u64::from(std::process::id()) << 2) | ONCE_RUNNING;
        loop {
            // Acquire: what the run wrote is visible once DONE is seen.
            let seen = self.state.load(Ordering::Acquire);
            let ours = match seen {
                ONCE_DONE => return,
                ONCE_NEW => self.state.compare_exchange(ONCE_NEW, running, Ordering::Acquire, Ordering::Relaxed).is_ok(),
                // A fork copied it running in the parent: run it here.
                other if other != running => self.state.compare_exchange(other, running, Ordering::Acquire, Ordering::Relaxed).is_ok(),
                _ => {
                    std::thread::yield_now();
                    false
                }
            };
            if ours {
                f();
                // Release: the run's writes before DONE.
                self.state.store(ONCE_DONE, Ordering::Release);
                return;
            }
        }
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

    #[test]
    fn a_once_left_running_by_another_pid_runs_again() {
        let once = ForkSafeOnce::new();
        let mut runs = 0;
        once.call_once(|| runs += 1);
        once.call_once(|| runs += 1);
        assert_eq!(runs, 1);
        let copied = ForkSafeOnce::new();
        copied.state.store((u64::from(std::process::id().wrapping_add(1).max(1)) << 2) | ONCE_RUNNING, Ordering::Relaxed);
        copied.call_once(|| runs += 1);
        assert_eq!(runs, 2, "run again: its runner is in another process");
    }
}
