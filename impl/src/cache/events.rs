//! Release events: spec.md H1, H2, M1, M2, A-D, the A-H handoff, and the
//! release windows of hooks that run before the release (W1, W2; W3 is in A9).

use super::counters::{add, inc};
use super::dereg::{Dereg, DeregList};
use super::entry::indexed;
use super::entry::EntryPtr;
#[cfg(any(test, feature = "faults"))]
use super::entry_state::EntryState;
use super::entry_state::Invalidated;
use super::generation::{held_by_this_thread, Generation, Locked, WriteGuard};
use super::source::{EventSource, ReleaseEvent};
use super::Cache;
use crate::error::Error;
use crate::index::Slot;
use crate::registrar::Registrar;
use crate::sync::{AtomicU64, Ordering};
use mrcache_types::{Range, ReleaseKind};
use std::mem::ManuallyDrop;

/// Rounds of the post-unlock drain (spec.md#A11, L2's "every loop has a bound").
pub(super) const POST_UNLOCK_DRAINS: usize = 4;

/// The end of a dereg list (spec.md#A11): here, not in `dereg` (layer 4),
/// because it drains (A-D, this layer).
impl<'c, R: Registrar> DeregList<'c, R> {
    /// Ends the operation that owns the list, after its lock is released:
    /// performs the deregistrations, then drains what hooks queued while the
    /// lock was held (their try-lock failed against ours).
    pub(super) fn finish(mut self) {
        self.finish_in_place();
        // The usual end: everything performed, and neither vector ever
        // grew, so the drop would free nothing. Forgetting the list skips
        // its drop glue, three calls (49 instructions per miss, callgrind).
        if self.items.owns_nothing() && self.retired_memos.capacity() == 0 {
            std::mem::forget(self);
        }
    }

    #[inline(always)]
    fn finish_in_place(&mut self) {
        self.finished = true;
        self.perform();
        //= spec.md#A11
        //# after unlocking, if the queue is non-empty, try the lock exclusive
        //# and drain (H2)
        // Bounded: a hook that keeps pushing is drained by the next operation.
        for _ in 0..POST_UNLOCK_DRAINS {
            // The queue first: the usual answer, and a thread-local read
            // is a call (`__tls_get_addr`) in the C library.
            if self.shared.queue.is_empty() || held_by_this_thread() {
                break;
            }
            let Some(mut st) = self.cache.try_write(self.shared) else { break };
            self.cache.drain(self.shared, &mut st, self);
            st.unlock();
            self.perform();
        }
    }
}

impl<R: Registrar> Drop for DeregList<'_, R> {
    /// Only checks that [`DeregList::finish`] ran (type docs); finishes the
    /// list if not (while unwinding), so no deregistration is lost.
    fn drop(&mut self) {
        if !self.finished {
            debug_assert!(std::thread::panicking(), "a dereg list dropped without finish()");
            self.finish_in_place();
        }
    }
}

/// Raises `draining` for the life of a drain (spec.md#LN1).
pub(super) struct Draining<'a>(pub(super) &'a AtomicU64);

impl<'a> Draining<'a> {
    pub(super) fn new<R: Registrar>(shared: &'a Generation<R>) -> Self {
        // SeqCst: raised before any event leaves the queue or the monitor. The
        // uffd read after it publishes nothing to LN1 by itself (the released
        // thread is woken by the kernel), so the raise is a full barrier.
        shared.draining.fetch_add(1, Ordering::SeqCst);
        Draining(&shared.draining)
    }
}

impl Drop for Draining<'_> {
    fn drop(&mut self) {
        // Release: the applied events (removals, revokes) happen before an
        // LN1 whose Acquire load then reads 0.
        self.0.fetch_sub(1, Ordering::Release);
    }
}

impl<R: Registrar> Cache<R> {
    /// Removes a findable entry from the index (it leaves the lookup, S3.2):
    /// deregistered now if unleased (into the dereg list), at its last release
    /// otherwise. Returns whether it was leased.
    pub(super) fn uncache<'c>(
        &'c self,
        shared: &'c Generation<R>,
        st: &mut Locked<R>,
        first: u64,
        id: u64,
        deregs: &mut DeregList<'c, R>,
        invalidation: bool,
    ) -> bool {
        let Some(slot) = st.index.remove(first, id) else {
            debug_assert!(false, "uncache of an entry not in the index");
            return false;
        };
        self.retire(shared, st, slot, deregs, invalidation, false)
    }

    /// Bookkeeping and A-H handoff for an entry just taken out of the index.
    /// `claimed`: the caller already set INVALID on an unleased entry
    /// ([`EntryState::invalidate_unleased`], the trim), so this thread owns
    /// the deregistration; every lane slot was revoked before (the trim's
    /// note revokes them all, and memos are made only under the lock
    /// shared), so the revoke below finds none.
    pub(super) fn retire<'c>(
        &'c self,
        shared: &'c Generation<R>,
        st: &mut Locked<R>,
        slot: Slot<EntryPtr<R>>,
        deregs: &mut DeregList<'c, R>,
        invalidation: bool,
        claimed: bool,
    ) -> bool {
        let e = slot.value;
        // It was in the index and we hold the lock exclusive: nobody can free
        // it before the handoff below.
        let entry = indexed(&slot);
        //= spec.md#LN5
        //# Every step that takes an entry out of the index (A-D, A9
        //# displacement, A10, flush, trim) revokes it first.
        if entry.memoized.load(Ordering::Relaxed) {
            let p = e.as_ptr();
            self.revoke(shared, |q| q == p);
        }
        st.cached_bytes -= entry.view_len;
        st.sub_exclusive(&shared.cached, 1);
        #[cfg(any(test, feature = "faults"))]
        let early = invalidation && self.config.faults.dereg_leased_on_invalidate && entry.state.leases() > 0;
        #[cfg(not(any(test, feature = "faults")))]
        let _ = invalidation;
        #[cfg(any(test, feature = "faults"))]
        if early && !claimed {
            // P3 mutant: take the handle while the entry is surely alive (in
            // the index, lock held), then hand the entry to its last release,
            // which must not deregister it again (HANDLE_GONE).
            // SAFETY: read once; HANDLE_GONE keeps every other path off it.
            let h = unsafe { std::ptr::read(&*entry.handle) };
            return match entry.state.invalidate(EntryState::HANDLE_GONE) {
                Invalidated::Owner => {
                    // The last lease went meanwhile: the entry is ours to free.
                    deregs.items.push(Dereg::Early(h, entry.view_len));
                    // SAFETY: we own it (count was 0); its handle was read
                    // above; from this generation's pool (A9).
                    unsafe { st.entries.put_back(e.non_null()) };
                    false
                }
                Invalidated::Leased => {
                    inc(&self.counters.deferred_deregistrations);
                    deregs.items.push(Dereg::Early(h, entry.view_len));
                    true
                }
            };
        }
        //= spec.md#A-H
        //# invalidation sets INVALID with one atomic OR on the state word and
        //# owns the deregistration iff the count it saw was 0
        let handoff = if claimed { Invalidated::Owner } else { entry.state.invalidate(0) };
        match handoff {
            Invalidated::Owner => {
                // SAFETY: we own its deregistration (count was 0, INVALID
                // now set) and it left the index, its lane memos revoked
                // above: nobody reads it after this; its memory goes back to
                // this generation's pool, whose lock we hold, and its handle
                // is deregistered after unlocking (A11).
                let (handle, bytes) = unsafe { e.take_handle() };
                // SAFETY: as above; from this generation's pool (A9).
                unsafe { st.entries.put_back(e.non_null()) };
                deregs.items.push(Dereg::Cached(handle, bytes));
                false
            }
            Invalidated::Leased => {
                inc(&self.counters.deferred_deregistrations);
                true
            }
        }
    }

    //= spec.md#A-D
    /// Drains the invalidation queue and the event source, applying every
    /// event (exclusive lock held). Inlined, with the drain itself a call:
    /// every miss drains, and with no queue and no monitor the call's
    /// entry and exit cost more than the two loads that find nothing.
    #[inline(always)]
    pub(super) fn drain<'c>(&'c self, shared: &'c Generation<R>, st: &mut Locked<R>, deregs: &mut DeregList<'c, R>) {
        // `&mut Locked` is the proof; this says it where the lock is marked.
        debug_assert!(super::generation::held_by_this_thread(), "a drain without the cache lock exclusive");
        if shared.queue.is_empty() && shared.source.get().is_none() {
            return;
        }
        self.drain_events(shared, st, deregs);
    }

    /// [`Self::drain`] when there may be something to drain.
    #[inline(never)]
    fn drain_events<'c>(&'c self, shared: &'c Generation<R>, st: &mut Locked<R>, deregs: &mut DeregList<'c, R>) {
        let source = shared.source.get();
        let _draining = Draining::new(shared);
        let mut queued = Vec::new();
        shared.queue.take_all(&mut queued);
        // The source's events are read once, here, and applied after the
        // queued ones, in this critical section.
        let mut read = Vec::new();
        let mut mark = None;
        if let Some(src) = source {
            //= spec.md#M2
            //# A2 and A6 also read pending events, from a monitor that serves their cache alone
            mark = src.read_pending(&mut read);
            add(&self.counters.release_events, read.len() as u64);
        }
        for ev in queued {
            self.apply_event(shared, st, ev, deregs);
        }
        if let Some(src) = source {
            self.apply_source_events(shared, st, src.as_ref(), &read, deregs);
            //= spec.md#M6
            //# An attached cache's drain (A2, A6, a service round) applies the
            //# ring's events from its cursor, waiting out a read in progress,
            //# then sets its gate
            if let Some(mark) = mark {
                shared.gate.set(mark);
            } else if shared.gate.is_gated() {
                // A source that stopped gating (its cache detached, S7.6).
                shared.gate.set(super::gate::UNGATED);
            }
        }
    }

    /// Applies events read from the monitor (A-D), and opens a window for
    /// each REMOVE of a source that proves its madvise returned (M3).
    fn apply_source_events<'c>(
        &'c self,
        shared: &'c Generation<R>,
        st: &mut Locked<R>,
        src: &dyn EventSource,
        events: &[ReleaseEvent],
        deregs: &mut DeregList<'c, R>,
    ) -> Vec<Range> {
        let mut opened = Vec::new();
        if fault!(self.config, monitor_off) {
            return opened;
        }
        let windows = src.proves_removes() && !fault!(self.config, remove_without_window);
        for &ev in events {
            self.apply_event(shared, st, ev, deregs);
            //= spec.md#M3
            //# after applying it (A-D), in the same critical section, open a
            //# window on its pages
            if windows && ev.kind == Some(ReleaseKind::MadviseDontneed) {
                shared.windows.open(ev.pages(self.page_size));
                inc(&self.counters.remove_windows);
                //= spec.md#M3
                //# The window is handed to the monitor thread for M4 only once it is open.
                src.remove_window_opened(ev.range);
                opened.push(ev.range);
            }
        }
        opened
    }

    //= spec.md#M4
    //# close a REMOVE window (as W2) only once the madvise that raised it is
    //# proven to have returned
    /// M4: closes one window that M3 opened on `range`, once the source has
    /// proven the madvise returned. Never waits for the cache lock. Returns
    /// whether such a window was open (not after a fork: the child has none).
    pub fn close_remove_window(&self, range: Range) -> bool {
        let shared = self.shared_slow();
        let closed = shared.windows.close(range.pages(self.page_size));
        if closed {
            inc(&self.counters.remove_windows_closed);
        }
        closed
    }

    //= spec.md#A-D
    //# for each queued or read event, bump nothing but apply S2.3: findable
    //# entries overlapping it leave the index (unleased → dereg list, leased →
    //# set INVALID); in-flight records overlapping it become stale
    /// Every kind is applied the same way (S2.3): the kind of `ev` changes
    /// nothing here.
    pub(super) fn apply_event<'c>(
        &'c self,
        shared: &'c Generation<R>,
        st: &mut Locked<R>,
        ev: ReleaseEvent,
        deregs: &mut DeregList<'c, R>,
    ) {
        let span = ev.pages(self.page_size);
        for r in st.inflight.iter_mut() {
            if r.span.overlaps(&span) {
                r.stale = true;
            }
        }
        let hit: Vec<(u64, u64)> = st.index.overlapping(span).into_iter().map(|(s, slot)| (s.first, slot.id)).collect();
        for (first, id) in hit {
            inc(&self.counters.invalidations);
            if self.uncache(shared, st, first, id, deregs, true) {
                inc(&self.counters.leased_invalidations);
            }
        }
    }

    /// Whether a release event on `[addr, addr+len)` could concern a
    /// registration of this cache: a lock-free filter for allocator hooks
    /// ([`crate::monitor::alloc::MonitoredAlloc`]), which see every free.
    pub fn may_hold(&self, addr: u64, len: u64) -> bool {
        let Ok(range) = Range::new(addr, len) else { return false };
        let span = range.pages(self.page_size);
        span.first < self.hull_hi.load(Ordering::SeqCst) && self.hull_lo.load(Ordering::SeqCst) < span.end
    }

    /// A release event: the process stopped mapping `[addr, addr+len)`
    /// (spec.md#S2.3). The synchronous-hook / explicit path: never waits for
    /// the cache lock (H1, H2); a full queue collapses into one hull event
    /// (L2). Callable from any thread, including one inside a cache
    /// operation (a registrar, an allocator hook under the cache lock).
    ///
    /// Call it *after* the release (spec.md#S1.8). A hook that runs before
    /// the release uses [`Cache::release_begin`] and [`Cache::release_end`].
    pub fn invalidate(&self, addr: u64, len: u64, kind: ReleaseKind) -> Result<(), Error> {
        let shared = self.shared_slow();
        inc(&self.counters.release_events);
        let ev = ReleaseEvent::new(kind, addr, len).map_err(|e| self.fail(Error::from_range(e)))?;
        if fault!(self.config, monitor_off) {
            return Ok(());
        }
        self.hook_event(shared, ev);
        Ok(())
    }

    /// H1 and H2 for `ev`: queue it, then drain if the lock is free.
    fn hook_event(&self, shared: &Generation<R>, ev: ReleaseEvent) {
        let held = held_by_this_thread();
        //= spec.md#H1
        //# sync hook / explicit invalidate: push the event on the queue (wakes nobody).
        shared.queue.push(ev);
        //= spec.md#H2
        //# try the lock exclusive: if acquired, drain, unlock, perform the dereg
        //# list; if not, return: the holder drains after its unlock (A1, A11).
        if !held {
            if let Some(mut st) = self.try_write(shared) {
                let mut deregs = DeregList::new(self, shared);
                self.drain(shared, &mut st, &mut deregs);
                st.unlock();
                deregs.finish();
            }
        }
    }

    //= spec.md#W1
    //# release begin (a hook *before* the release, `release_begin`): check the
    //# range (E1, E2); add the range's pages to the open windows (a multiset),
    //# then H1 and H2 with the range
    /// A hook that runs *before* a release of `[addr, addr+len)` (spec.md#S1.8):
    /// Open MPI's patcher, UCX's UCM and libfabric's memhooks, in the manner
    /// of the kernel's `mmu_notifier` `invalidate_range_start`. Overlapping
    /// entries leave the lookup, overlapping registrations in flight become
    /// stale (A7 retries them), and until the matching
    /// [`Cache::release_end`] an acquire overlapping the range is still
    /// served (the memory is mapped until the release; an acquire that
    /// overlaps the release itself is concurrent with it, spec.md#P2) but
    /// its registration is not cached (W3; counted in
    /// `Stats::uncached`); one whose window closes before it completes is
    /// retried (A7), since it may hold the frames the release took.
    ///
    /// Every `begin` needs exactly one `end` with the same range (the same
    /// pages), after the release, also when the release failed. Windows of
    /// several threads may overlap or nest. Counted as one release event.
    /// Like [`Cache::invalidate`], it never waits for the cache lock and may
    /// be called from inside a cache operation. E1/E2 for a bad range
    /// (nothing opens). A window does not survive a fork: the child starts
    /// with none.
    pub fn release_begin(&self, addr: u64, len: u64) -> Result<(), Error> {
        let shared = self.shared_slow();
        inc(&self.counters.release_events);
        let range = Range::new(addr, len).map_err(|e| self.fail(Error::from_range(e)))?;
        if fault!(self.config, monitor_off) {
            return Ok(());
        }
        let span = range.pages(self.page_size);
        // The window first, then the event: a registration planned (A4)
        // before the event's drain is marked stale by it (A-D); one planned
        // after it sees the window and is windowed (W3). Queued first, a
        // registration planned between the drain and the opening would be
        // neither, and could pin the frames about to go and be cached.
        shared.windows.open(span);
        // A hook before the release names no kind.
        self.hook_event(shared, ReleaseEvent { kind: None, range });
        Ok(())
    }

    //= spec.md#W2
    //# release end (after the release, `release_end`): check the range; remove
    //# one open window with exactly the range's pages (if there is none: E7,
    //# nothing changes)
    /// Closes the window [`Cache::release_begin`] opened on `[addr, addr+len)`
    /// (the kernel's `invalidate_range_end`), after the release. It applies
    /// nothing: W1's event already took the overlapping entries out and made
    /// the registrations in flight stale, and every registration planned
    /// since is windowed (W3: served uncached while a window overlaps it,
    /// retried by A7 once none does). Never waits for any lock but the
    /// windows' leaf mutex.
    ///
    /// [`Error::UnmatchedReleaseEnd`] (E7) if no window with the same pages
    /// is open: nothing changes (a mismatched pair is a caller bug, and
    /// closing some other window would let its range be cached while its
    /// release is still in progress). E1/E2 for a bad range.
    pub fn release_end(&self, addr: u64, len: u64) -> Result<(), Error> {
        let shared = self.shared_slow();
        let range = Range::new(addr, len).map_err(|e| self.fail(Error::from_range(e)))?;
        if fault!(self.config, monitor_off) {
            return Ok(());
        }
        if !shared.windows.close(range.pages(self.page_size)) {
            return Err(self.fail(Error::UnmatchedReleaseEnd { addr, len }));
        }
        Ok(())
    }

    /// Release windows open now (W1–W3): `release_begin`s not yet ended.
    pub fn open_release_windows(&self) -> usize {
        self.shared_slow().windows.len()
    }

    //= spec.md#M2
    //# take the lock exclusive; read every pending event non-blockingly (this
    //# wakes the releasing threads) and apply each (A-D), all in the same
    //# critical section; unlock; perform the dereg list.
    /// The monitor round (M2): `read` runs under the exclusive lock and appends
    /// the events it reads (non-blocking); they, every queued event and the
    /// installed [`EventSource`]'s pending events (read once, by the drain)
    /// are applied in the same critical section; deregistrations follow the
    /// unlock. `read` must not block, free monitored memory, read the
    /// installed source, or call into the cache other than
    /// [`Cache::invalidate`] (which then only queues).
    pub fn drain_with(&self, read: impl FnOnce(&mut Vec<ReleaseEvent>)) {
        let mut round = self.lock_for_round();
        let mut events = Vec::new();
        read(&mut events);
        round.apply(&events);
        round.unlock().perform();
    }

    /// This cache's part of a monitor round (M2, M5): its lock taken
    /// exclusive and its draining count raised (lane hits off) until
    /// [`RoundLock::unlock`]. A shared monitor holds one per attached cache
    /// while it reads, so an event read reaches every cache before any of
    /// them serves again.
    pub fn lock_for_round(&self) -> RoundLock<'_, R> {
        let shared = self.shared_slow();
        let deregs = DeregList::new(self, shared);
        let st = self.write(shared);
        let draining = Draining::new(shared);
        RoundLock { round: ManuallyDrop::new(Round { draining, st, deregs, cache: self, shared }) }
    }

    //= spec.md#M1
    //# uffd monitor thread: poll until the fd is readable, without reading.
    /// One monitor round with the installed [`EventSource`] (spec.md#M2).
    /// The monitor thread polls its fd for readability *without reading*
    /// (M1), then calls this; the events are read only under the exclusive
    /// lock. Returns `false` if no source is installed.
    pub fn monitor_round(&self) -> bool {
        match self.shared_slow().source.get() {
            Some(_) => {
                // The round's drain (RoundLock::apply) reads the source, once
                // and under the lock; `read` reads nothing more.
                self.drain_with(|_| {});
                true
            }
            None => false,
        }
    }
}

/// One cache locked for a monitor round (spec.md#M2, M5): see
/// [`Cache::lock_for_round`]. [`RoundLock::unlock`] unlocks and hands the
/// deregistrations back, so a shared monitor performs them only once every
/// cache is unlocked (nothing deregisters with a cache lock held, A11).
/// Dropped without `unlock` (an early return, a panic), it unlocks and then
/// performs them itself.
///
/// Invariant: the round is whole until it ends, exactly once, either by
/// [`RoundLock::unlock`] (which consumes the lock and forgets it, so `Drop`
/// does not run) or by `Drop`; so every method sees the lock, the draining
/// count and the dereg list, with no fallback for a missing one.
pub struct RoundLock<'c, R: Registrar> {
    /// Taken once, by [`RoundLock::take`] (see the invariant).
    round: ManuallyDrop<Round<'c, R>>,
}

/// What a [`RoundLock`] holds.
struct Round<'c, R: Registrar> {
    draining: Draining<'c>,
    st: WriteGuard<'c, R>,
    deregs: DeregList<'c, R>,
    cache: &'c Cache<R>,
    shared: &'c Generation<R>,
}

impl<'c, R: Registrar> Round<'c, R> {
    /// Ends the round's exclusive section: the draining count falls before
    /// the unlock (as in a drain); the deregistrations, returned, come after
    /// it.
    fn end(self) -> DeregList<'c, R> {
        let Round { draining, st, deregs, .. } = self;
        drop(draining);
        st.unlock();
        deregs
    }
}

impl<R: Registrar> Drop for RoundLock<'_, R> {
    fn drop(&mut self) {
        self.take().end().finish();
    }
}

/// Deregistrations a [`RoundLock`] collected, to perform after unlocking
/// every cache of the round (dropping it performs them too).
pub struct RoundDeregs<'c, R: Registrar>(DeregList<'c, R>);

impl<R: Registrar> RoundDeregs<'_, R> {
    /// Performs the deregistrations, then drains what hooks queued meanwhile
    /// (A11). Call with no cache lock held.
    pub fn perform(self) {
        self.0.finish();
    }
}

impl<'c, R: Registrar> RoundLock<'c, R> {
    //= spec.md#M5
    //# take its lock exclusive, drain it (M6), unlock it, perform its dereg list
    /// Applies `events`, read while this lock was held, every queued hook
    /// event and the installed source's pending events (the drain reads it,
    /// once: `events` must not come from it) (A-D; a REMOVE opens its
    /// window, M3, if the installed source proves madvise returns). Returns
    /// the ranges of the windows `events` opened: each is owed an M4.
    pub fn apply(&mut self, events: &[ReleaseEvent]) -> Vec<Range> {
        let Round { st, deregs, cache, shared, .. } = &mut *self.round;
        let (cache, shared) = (*cache, *shared);
        add(&cache.counters.release_events, events.len() as u64);
        let opened = match shared.source.get() {
            Some(src) => cache.apply_source_events(shared, st, src.as_ref(), events, deregs),
            None if !fault!(cache.config, monitor_off) => {
                for &ev in events {
                    cache.apply_event(shared, st, ev, deregs);
                }
                Vec::new()
            }
            None => Vec::new(),
        };
        cache.drain(shared, st, deregs);
        opened
    }

    /// Unlocks; the deregistrations are returned, to perform once no cache
    /// lock is held.
    pub fn unlock(mut self) -> RoundDeregs<'c, R> {
        let round = self.take();
        // `Drop` must not take the round again.
        std::mem::forget(self);
        RoundDeregs(round.end())
    }

    /// Moves the round out of the lock. Call once: from `unlock`, which
    /// then forgets the lock, or from `Drop`.
    fn take(&mut self) -> Round<'c, R> {
        // SAFETY: called once per lock (see above), so the round is still
        // there and is not read or dropped again.
        unsafe { ManuallyDrop::take(&mut self.round) }
    }
}
