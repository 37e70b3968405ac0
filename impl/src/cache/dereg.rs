//! The dereg list: deregistrations collected under the lock, performed after
//! it (spec.md#A11).
//!
//! This layer (4) performs deregistrations and frees entries; it calls no §A
//! step. The list's end, [`DeregList::finish`], and its `Drop` are in
//! `events` (layer 5), because A11's post-unlock drain is a drain (A-D):
//! the steps that need layer 5 live in layer 5 (module docs of `cache`).

use super::counters::{inc, Hot};
use super::entry::EntryPtr;
use super::generation::{held_by_this_thread, Generation};
use super::Cache;
use crate::hit_memo::RetiredMemo;
use crate::registrar::Registrar;
use crate::sync::Ordering;
use std::mem::ManuallyDrop;

pub(super) enum Dereg<R: Registrar> {
    /// A cached entry this operation owned: its handle and bytes, to
    /// deregister and count (its memory went back to the pool under the
    /// lock, `EntryPool::put_back`).
    Cached(ManuallyDrop<R::Handle>, u64),
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
/// deregistration is lost. Both are in `events` (see the module docs).
pub(crate) struct DeregList<'c, R: Registrar> {
    pub(super) cache: &'c Cache<R>,
    pub(super) shared: &'c Generation<R>,
    pub(super) items: Items<R>,
    /// Hit memo tables A9 replaced under the lock (their pages given back
    /// here, after it).
    pub(super) retired_memos: Vec<RetiredMemo>,
    /// [`DeregList::finish`] ran (set there, read by `Drop`).
    pub(super) finished: bool,
}

impl<'c, R: Registrar> DeregList<'c, R> {
    pub(super) fn new(cache: &'c Cache<R>, shared: &'c Generation<R>) -> Self {
        DeregList { cache, shared, items: Items { first: None, rest: Vec::new() }, retired_memos: Vec::new(), finished: false }
    }

    /// Performs every collected deregistration. Call with the lock released.
    /// Inlined, with the work a call: most operations collect nothing, and
    /// the call's entry and exit cost more than finding that out.
    #[inline(always)]
    pub(super) fn perform(&mut self) {
        if self.retired_memos.is_empty() && self.items.is_empty() {
            return;
        }
        self.perform_collected();
    }

    /// [`Self::perform`] when something was collected.
    #[inline(never)]
    fn perform_collected(&mut self) {
        if !self.retired_memos.is_empty() {
            debug_assert!(!held_by_this_thread() || std::thread::panicking(), "memo freed with the lock held");
            self.retired_memos.clear();
        }
        if self.items.is_empty() {
            return;
        }
        debug_assert!(!held_by_this_thread() || std::thread::panicking(), "dereg with the lock held");
        let cache = self.cache;
        let shared = self.shared;
        let perform = |item: Dereg<R>| match item {
            Dereg::Cached(h, bytes) => cache.deregister_handle(shared, h, bytes),
            Dereg::Discard(h) => {
                inc(&cache.counters.discarded_registrations);
                cache.call_deregister(h);
            }
            #[cfg(any(test, feature = "faults"))]
            Dereg::Early(h, bytes) => {
                inc(&cache.counters.early_deregistrations);
                cache.call_deregister(h);
                cache.count_dereg(shared, bytes);
            }
        };
        if let Some(first) = self.items.first.take() {
            perform(first);
        }
        if !self.items.rest.is_empty() {
            for item in std::mem::take(&mut self.items.rest) {
                perform(item);
            }
        }
    }
}

/// A dereg list's items in the order pushed: the first one inline, so an
/// operation with one deregistration (an evicting miss) allocates nothing
/// for it (a `Vec` was allocated and freed on every such miss).
pub(super) struct Items<R: Registrar> {
    first: Option<Dereg<R>>,
    /// The items after `first` (empty while `first` is `None`).
    rest: Vec<Dereg<R>>,
}

impl<R: Registrar> Items<R> {
    pub(super) fn push(&mut self, item: Dereg<R>) {
        if self.first.is_none() {
            debug_assert!(self.rest.is_empty());
            self.first = Some(item);
        } else {
            self.rest.push(item);
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    /// Empty, and owning no memory: dropping it would free nothing.
    pub(super) fn owns_nothing(&self) -> bool {
        self.first.is_none() && self.rest.capacity() == 0
    }
}

impl<R: Registrar> Cache<R> {
    /// Deregisters and frees an entry this thread owns (A-H), without the
    /// lock (R1): its memory goes back through the given-back list.
    pub(super) fn deregister_entry(&self, shared: &Generation<R>, e: EntryPtr<R>, handle_gone: bool) {
        // SAFETY: the handoff made us the only owner: nobody reads the entry
        // after this; its handle is moved out once, here, and its other
        // fields need no drop (`EntryPool::LAYOUT_OK`).
        let (handle, view_len) = unsafe { e.take_handle() };
        // SAFETY: from this generation's pool (A9), given back once (A-H).
        unsafe { shared.returned_entries.give_back(e.non_null()) };
        if handle_gone {
            // Already deregistered (and counted) by the P3 fault.
            return;
        }
        self.deregister_handle(shared, handle, view_len);
    }

    /// Deregisters a cached entry's handle and counts it (A-H's owner,
    /// after the entry's memory went back to the pool).
    pub(super) fn deregister_handle(&self, shared: &Generation<R>, handle: ManuallyDrop<R::Handle>, bytes: u64) {
        if fault!(self.config, leak_deregistration) {
            // P4 fault: the registration is never deregistered.
            std::mem::forget(ManuallyDrop::into_inner(handle));
            return;
        }
        self.call_deregister(ManuallyDrop::into_inner(handle));
        self.count_dereg(shared, bytes);
    }

    pub(super) fn call_deregister(&self, h: R::Handle) {
        if self.registrar.deregister(h).is_err() {
            inc(&self.counters.dereg_failures);
        }
    }

    pub(super) fn count_dereg(&self, shared: &Generation<R>, bytes: u64) {
        self.hot.bump(Hot::Deregistrations);
        shared.live_regs.fetch_sub(1, Ordering::Relaxed);
        shared.live_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
}
