//! Release: spec.md R1, R2 (the lane release LN3 is in [`super::lanes`]).

use super::counters::Hot;
use super::dereg::DeregList;
use super::entry::EntryPtr;
use super::entry_state::Released;
use super::generation::Generation;
use super::lanes::Lane;
use super::lease::{leased, Lease};
use super::Cache;
use crate::registrar::Registrar;
use crate::sync::Ordering;

impl<R: Registrar> Cache<R> {
    /// Gives a lease back (spec.md#S2.2). Called by `Lease::drop`.
    /// Kept tiny (it is inlined into every lease's drop): the owner's lane
    /// release without limits; everything else is [`Self::release_slow`].
    #[inline(always)]
    pub(crate) fn release(&self, lease: &Lease<'_, R>) {
        if let Some(r) = lease.lane {
            if self.release_on_own_lane(lease.shared, lease.entry, r) {
                return;
            }
        }
        self.release_slow(lease)
    }

    /// An owned lease's release ([`super::OwnedLease`]) counted on
    /// `counted`: the release, then the return of its count, which is its
    /// last access to the cache (see "Owned leases" in [`super::lease`]).
    /// One lane lookup for both on the owner's fast path.
    #[inline(always)]
    pub(super) fn release_owned(&self, lease: &Lease<'_, R>, counted: &Lane<R>) {
        let shared = lease.shared;
        if let Some(r) = lease.lane {
            if shared.lanes.mine().is_some_and(|l| std::ptr::eq(l, counted)) && self.release_on_lane(shared, lease.entry, r, counted) {
                counted.count_owned_returned(true);
                return;
            }
        }
        self.release_slow(lease);
        // Looked up after the release: only this thread changes its claims,
        // but the release may have run a registrar's code.
        let owner = shared.lanes.mine().is_some_and(|l| std::ptr::eq(l, counted));
        counted.count_owned_returned(owner);
    }

    #[inline(never)]
    pub(super) fn release_slow(&self, lease: &Lease<'_, R>) {
        let (shared, e, lane) = (lease.shared, lease.entry, lease.lane);
        //= spec.md#F1
        let now = self.shared();
        self.hot.bump(Hot::Releases);
        if !std::ptr::eq(now, shared) {
            // Leased before a fork: a no-op in the child (S2.6).
            return;
        }
        // Touch while our lease still keeps the entry alive.
        //= spec.md#R1
        //# The touch, the decrement and the flag's load are three atomic steps, in
        //# this order, and other threads act between them
        self.touch(leased(lease));
        if let Some(r) = lane {
            self.lane_release(shared, e, r);
            return;
        }
        let outcome = leased(lease).state.release();
        self.after_release(shared, e, outcome);
    }

    /// What follows a release of one state-word lease on `e` (R1, R2), by
    /// its outcome: nothing while leases remain; the deregistration if this
    /// release won the handoff; R2 if the count reached 0 while the cache is
    /// over its limits. The one home of that match for both releases that
    /// reach the state word: a lease's ([`Self::release_slow`]) and a lane
    /// pin's (LN4, `lane_detached`). The caller's lease (or pin) is given
    /// back by `outcome`'s release, so `e` may be freed by the time this
    /// returns.
    #[inline(always)]
    pub(super) fn after_release(&self, shared: &Generation<R>, e: EntryPtr<R>, outcome: Released) {
        match outcome {
            Released::Held => {}
            //= spec.md#R1
            //# If this took the count to 0 with INVALID set, this thread owns
            //# the deregistration: perform it (no lock needed).
            Released::Owner { handle_gone } => self.deregister_entry(shared, e, handle_gone),
            //= spec.md#R2
            //# else if the count reached 0 and the over-limit flag is set: take
            //# the lock exclusive, note the unleased entries (as A6, covering the
            //# current excess: if the note falls short, raise the flag and note
            //# again), drain, evict (A10), unlock, perform the dereg list.
            Released::Unleased => {
                crate::sync::loom_sc_fence();
                if self.limits_active && shared.over_limit.load(Ordering::SeqCst) {
                    self.release_over_limit(shared);
                }
            }
        }
    }

    #[cold]
    pub(super) fn release_over_limit(&self, shared: &Generation<R>) {
        if !std::ptr::eq(self.shared_slow(), shared) {
            return;
        }
        let mut deregs = DeregList::new(self, shared);
        let mut st = self.write(shared);
        let (regions, bytes) = self.current_excess(&st);
        let noted = self.note_covering(shared, &mut st, regions, bytes);
        self.drain(shared, &mut st, &mut deregs);
        self.enforce_limits(shared, &mut st, &mut deregs, &noted);
        st.unlock();
        deregs.finish();
    }
}
