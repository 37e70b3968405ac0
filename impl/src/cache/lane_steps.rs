//! The cache's side of the lanes (spec.md#LN1, LN3, LN4, LN5): the lane hit
//! before A1, the lane release, the detached release and the revoke, as
//! `Cache` steps over [`super::lanes`] (whose module docs give the protocol).

use super::entry::{Entry, EntryPtr};
use super::generation::{held_by_this_thread, Generation};
use super::lanes::{heavy_barrier, keep_if_pinned, null_ptr, owns, release, try_hit, worth_probing, Lane, LaneHit, LaneRef, LaneReleased};
use super::lease::{leased, Lease};
use super::os::fork_generation;
use super::Cache;
use crate::registrar::Registrar;
use crate::sync::Ordering;
use mrcache_types::{Access, Range};
use std::sync::PoisonError;

impl<R: Registrar> Cache<R> {
    /// LN1, before A1: a hit on a memo of this thread's lane, if any.
    #[inline(always)]
    pub(super) fn lane_hit<'c>(&'c self, shared: &'c Generation<R>, range: Range, access: Access) -> Option<Lease<'c, R>> {
        self.lane_hit_mine(shared, range, access).map(|(lease, _)| lease)
    }

    /// [`Self::lane_hit`], with this thread's lane that served it (for an
    /// owned lease, counted there without a second lookup).
    #[inline(always)]
    pub(super) fn lane_hit_mine<'c>(
        &'c self,
        shared: &'c Generation<R>,
        range: Range,
        access: Access,
    ) -> Option<(Lease<'c, R>, &'c Lane<R>)> {
        //= spec.md#LN1
        //# lane hit (before A1): if the queue is empty, the draining count is 0,
        //# and a slot of this thread's lane has exactly the request's key
        //= spec.md#M6
        //# a hit on a cache the process's monitor delivers to needs the gate current
        if self.lanes_on && shared.queue.is_empty() && shared.draining.load(Ordering::Acquire) == 0 && shared.gate.current() {
            // A match, not `Option::filter`: in the shared library the
            // filter stayed a call (callgrind).
            let probe = match shared.lanes.mine() {
                Some(lane) if worth_probing(lane) => Some(lane),
                _ => None,
            };
            if let Some(lane) = probe {
                let span = range.pages(self.page_size);
                let hit = match try_hit(lane, span, access) {
                    LaneHit::Hit(p, slot) => Some((p, slot)),
                    LaneHit::Revoked(p, slot) => Self::lane_revoked(shared, lane, slot, p).then_some((p, slot)),
                    LaneHit::None => None,
                };
                if let Some((p, slot)) = hit {
                    // SAFETY: from a slot's `ptr`; LN6: the slot's count
                    // keeps the entry alive (directly, or through the pin a
                    // revoke took for it), a lease the returned one owns.
                    let lease = Lease::on_lane(self, shared, unsafe { EntryPtr::from_raw(p) }, lane.lane_ref(slot));
                    self.touch(leased(&lease));
                    lane.count_hit();
                    return Some((lease, lane));
                }
            }
        }
        None
    }

    /// LN1 after a reload of null: whether the revoke left the slot pinned
    /// to `p` (the hit stands), under the lanes mutex; else the count is
    /// undone. Cold: off the hit path it would otherwise be inlined into.
    #[cold]
    fn lane_revoked(shared: &Generation<R>, lane: &Lane<R>, slot: u32, p: *mut Entry<R>) -> bool {
        let mutex = shared.lanes.mutex.lock().unwrap_or_else(PoisonError::into_inner);
        keep_if_pinned(lane, slot, p, &mutex)
    }

    /// LN3 on this thread's own lane without limits: the whole release.
    /// Returns `false` if the release needs [`Self::release_slow`].
    #[inline(always)]
    pub(super) fn release_on_own_lane(&self, shared: &Generation<R>, e: EntryPtr<R>, r: LaneRef<R>) -> bool {
        if !self.limits_active
            && fork_generation() == self.forks_seen.load(Ordering::Relaxed)
            && std::ptr::eq(self.shared.load(Ordering::Relaxed), shared)
        {
            let mine = match shared.lanes.mine() {
                Some(mine) if mine.holds(r) => Some(mine),
                _ => None,
            };
            if let Some(mine) = mine {
                //= spec.md#LN3
                //# the owner stores `held − 1`, another thread adds 1 to
                //# `remote` (release order). Light barrier; load `ptr`
                mine.count_release();
                if let LaneReleased::Detached = release(r, e.as_ptr(), true) {
                    self.lane_detached(shared, r, e.as_ptr());
                }
                return true;
            }
        }
        false
    }

    /// [`Self::release_on_own_lane`] where the caller knows that `mine` is
    /// this thread's lane (an owned lease's release, which looked it up).
    #[inline(always)]
    pub(super) fn release_on_lane(&self, shared: &Generation<R>, e: EntryPtr<R>, r: LaneRef<R>, mine: &Lane<R>) -> bool {
        if !self.limits_active
            && fork_generation() == self.forks_seen.load(Ordering::Relaxed)
            && std::ptr::eq(self.shared.load(Ordering::Relaxed), shared)
            && mine.holds(r)
        {
            //= spec.md#LN3
            //# the owner stores `held − 1`, another thread adds 1 to
            //# `remote` (release order). Light barrier; load `ptr`
            mine.count_release();
            if let LaneReleased::Detached = release(r, e.as_ptr(), true) {
                self.lane_detached(shared, r, e.as_ptr());
            }
            return true;
        }
        false
    }

    /// LN3 (any thread, or with limits): the lane release, then R2 or LN4.
    pub(super) fn lane_release(&self, shared: &Generation<R>, e: EntryPtr<R>, r: LaneRef<R>) {
        //= spec.md#LN3
        //# if it is still the lease's entry, read the over-limit flag and
        //# run R2 if it is set; else run LN4.
        let owner = owns(&shared.lanes, r);
        if let LaneReleased::Detached = release(r, e.as_ptr(), owner) {
            self.lane_detached(shared, r, e.as_ptr());
        }
        crate::sync::loom_sc_fence();
        if self.limits_active && shared.over_limit.load(Ordering::SeqCst) {
            self.release_over_limit(shared);
        }
    }

    //= spec.md#LN4
    //# detached release: take the lanes mutex; if the slot's count is 0 and its
    //# pin is the lease's entry, clear the pin and release the pin as R1
    #[cold]
    pub(super) fn lane_detached(&self, shared: &Generation<R>, r: LaneRef<R>, p: *mut Entry<R>) {
        // SAFETY: `shared` is alive, so its lanes are.
        let slot = unsafe { r.slot() };
        let unpinned = {
            let _g = shared.lanes.mutex.lock().unwrap_or_else(PoisonError::into_inner);
            let pinned = slot.pin().load(Ordering::SeqCst) == p && slot.count() == 0;
            if pinned {
                slot.pin().store(std::ptr::null_mut(), Ordering::SeqCst);
            }
            pinned
        };
        if !unpinned {
            return;
        }
        // SAFETY: from a slot's `pin`, which was a lease on `p`; we own it
        // now, and it keeps the entry alive until the release below.
        let e = unsafe { EntryPtr::from_raw(p) };
        // SAFETY: as above.
        let outcome = unsafe { e.get() }.state.release();
        //= spec.md#LN4
        //# and release the pin as R1
        self.after_release(shared, e, outcome);
    }

    //= spec.md#LN5
    //# set `ptr` to null in every slot that points to the entries being
    //# revoked; if any, heavy barrier; then for each such slot whose count (read
    //# `remote`, then `held`) is above 0, pin it
    /// Revokes the lane memos of the entries `which` selects (lock exclusive).
    pub(super) fn revoke(&self, shared: &Generation<R>, which: impl Fn(*mut Entry<R>) -> bool) {
        self.revoke_where(shared, false, which)
    }

    /// The entries a slot of some lane points to while counting a lane
    /// lease on them (debug builds' full note; lock exclusive held, so no
    /// slot gains an entry meanwhile). One pass over the lanes.
    #[cfg(debug_assertions)]
    pub(super) fn lane_leased(&self, shared: &Generation<R>) -> std::collections::HashSet<*mut Entry<R>> {
        shared
            .lanes
            .installed()
            .flat_map(|l| l.slots().iter())
            .filter(|s| s.count() != 0)
            .map(|s| s.ptr.load(Ordering::Relaxed))
            .filter(|p| !p.is_null())
            .collect()
    }

    /// Revokes every slot's memo (trim, before it notes).
    pub(super) fn revoke_all(&self, shared: &Generation<R>) {
        self.revoke_where(shared, true, |_| true)
    }

    /// `every`: `which` selects every entry (so a lane whose memos are all
    /// revoked already can be skipped).
    fn revoke_where(&self, shared: &Generation<R>, every: bool, which: impl Fn(*mut Entry<R>) -> bool) {
        let mut installed = shared.lanes.installed().peekable();
        if installed.peek().is_none() {
            return;
        }
        let _g = shared.lanes.mutex.lock().unwrap_or_else(PoisonError::into_inner);
        debug_assert!(held_by_this_thread(), "LN5: a revoke without the cache lock exclusive");
        let mut nulled = Vec::new();
        for l in installed {
            let memos = l.memos.load(Ordering::Relaxed);
            if every && memos == l.clean_at.load(Ordering::Relaxed) {
                continue; // no memo since the last revoke of every slot
            }
            if every {
                l.clean_at.store(memos, Ordering::Relaxed);
            }
            for s in l.slots() {
                let p = s.ptr.load(Ordering::Relaxed);
                if !p.is_null() && which(p) {
                    null_ptr(s);
                    nulled.push((s, p));
                }
            }
        }
        if nulled.is_empty() {
            return;
        }
        heavy_barrier();
        for (s, p) in nulled {
            if s.count() != 0 {
                debug_assert!(s.pin().load(Ordering::SeqCst).is_null(), "a memoized slot is never pinned");
                // SAFETY: from a slot's `ptr`; findable (revokes precede
                // removal), lock held exclusive. (LN4 reads the pin under
                // the lanes mutex, held here: the two steps are one to it.)
                let state = &unsafe { EntryPtr::from_raw(p).get() }.state;
                s.pin().store(p, Ordering::SeqCst);
                state.acquire();
                // Invariant: a set pin is a lease on the entry's state word.
                debug_assert!(state.leases() >= 1, "LN5: a pin without its lease");
            }
        }
    }
}
