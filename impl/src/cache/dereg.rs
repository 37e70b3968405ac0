//! The dereg list: deregistrations collected under the lock, performed after
//! it (spec.md#A11).

use super::Cache;
use super::entry::EntryPtr;
use super::generation::{Shared, held_by_this_thread};
use super::stats::inc;
use crate::hit_memo::RetiredMemo;
use crate::registrar::Registrar;

pub(super) enum Dereg<R: Registrar> {
    /// A cached entry this operation owns: deregister and free it.
    Entry(EntryPtr<R>),
    /// A registration that was never cached (A7, A8): deregister, uncounted.
    Discard(R::Handle),
    /// The P3 fault: a leased entry's handle, deregistered early (counted).
    #[cfg(any(test, feature = "faults"))]
    Early(R::Handle, u64),
}

/// Deregistrations collected under the lock, performed after it (spec.md#A11).
///
/// The operation that made the list ends it with [`DeregList::finish`], after
/// unlocking. Dropping an unfinished list is a bug (a debug assertion), except
/// while unwinding; in a release build the drop then finishes it, so that no
/// deregistration is lost.
pub(crate) struct DeregList<'c, R: Registrar> {
    pub(super) cache: &'c Cache<R>,
    pub(super) shared: &'c Shared<R>,
    pub(super) items: Vec<Dereg<R>>,
    /// Hit memo tables A9 replaced under the lock (their pages given back
    /// here, after it).
    pub(super) retired_memos: Vec<RetiredMemo>,
    /// [`DeregList::finish`] ran.
    finished: bool,
}

impl<'c, R: Registrar> DeregList<'c, R> {
    pub(super) fn new(cache: &'c Cache<R>, shared: &'c Shared<R>) -> Self {
        DeregList { cache, shared, items: Vec::new(), retired_memos: Vec::new(), finished: false }
    }

    /// Ends the operation that owns the list, after its lock is released:
    /// performs the deregistrations, then drains what hooks queued while the
    /// lock was held (their try-lock failed against ours).
    pub(super) fn finish(mut self) {
        self.finish_in_place();
    }

    fn finish_in_place(&mut self) {
        self.finished = true;
        self.perform();
        //= spec.md#A11
        //# after unlocking, if the queue is non-empty, try the lock exclusive
        //# and drain (H2)
        // Bounded: a hook that keeps pushing is drained by the next operation.
        for _ in 0..POST_UNLOCK_DRAINS {
            if held_by_this_thread() || self.shared.queue.is_empty() {
                break;
            }
            let Some(mut st) = self.cache.try_write(self.shared) else { break };
            self.cache.drain(self.shared, &mut st, self);
            drop(st);
            self.perform();
        }
    }

    /// Performs every collected deregistration. Call with the lock released.
    pub(super) fn perform(&mut self) {
        if !self.retired_memos.is_empty() {
            debug_assert!(!held_by_this_thread() || std::thread::panicking(), "memo freed with the lock held");
            self.retired_memos.clear();
        }
        if self.items.is_empty() {
            return;
        }
        debug_assert!(!held_by_this_thread() || std::thread::panicking(), "dereg with the lock held");
        for item in std::mem::take(&mut self.items) {
            match item {
                Dereg::Entry(e) => self.cache.deregister_entry(self.shared, e, false),
                Dereg::Discard(h) => {
                    inc(&self.cache.counters.discarded_registrations);
                    self.cache.call_deregister(h);
                }
                #[cfg(any(test, feature = "faults"))]
                Dereg::Early(h, bytes) => {
                    inc(&self.cache.counters.early_deregistrations);
                    self.cache.call_deregister(h);
                    self.cache.count_dereg(self.shared, bytes);
                }
            }
        }
    }
}

impl<R: Registrar> Drop for DeregList<'_, R> {
    /// Only checks that [`DeregList::finish`] ran (type docs).
    fn drop(&mut self) {
        if !self.finished {
            debug_assert!(std::thread::panicking(), "a dereg list dropped without finish()");
            self.finish_in_place();
        }
    }
}

/// Rounds of the post-unlock drain (spec.md#A11, L2's "every loop has a bound").
pub(super) const POST_UNLOCK_DRAINS: usize = 4;
