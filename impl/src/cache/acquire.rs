//! Acquire: spec.md A1–A11 (the lane hit LN1 before A1 is in [`super::lanes`]).

use super::counters::{inc, Hot};
use super::dereg::{Dereg, DeregList};
use super::entry::{indexed, peek};
use super::entry::{Entry, EntryPtr};
use super::entry_state::EntryState;
use super::evict::Noted;
use super::generation::{answered, Generation, Locked};
use super::lanes;
use super::lease::Lease;
use super::source::Watched;
use super::Cache;
use crate::error::Error;
use crate::index::IntervalIndex;
use crate::registrar::CallbackSpan;
use crate::registrar::Registrar;
use crate::sync::{plain, Ordering};
use mrcache_types::config::{per_page_cost_ns, EvictionPolicy, OverlapPolicy};
use mrcache_types::{Access, PageSpan, Range, RangeError, RegistrarFailure};
use std::mem::ManuallyDrop;
use std::sync::PoisonError;

/// A miss's registration (spec.md#S6.1, S6.2).
#[derive(Clone, Copy, Debug)]
pub(super) struct Plan {
    pub(super) span: PageSpan,
    pub(super) access: Access,
    pub(super) range: Range,
}

/// A1's lookup under the lock shared: the hit memo's entry
/// if the request is that entry's own key, else the index's answer (then
/// memoized if the request is its key). The same answer either way: the
/// canonical covering entry (debug builds check it against the index).
#[inline(always)]
fn covering_answer<R: Registrar>(st: &Locked<R>, span: PageSpan, access: Access, page_size: u64) -> Option<(EntryPtr<R>, &Entry<R>)> {
    let version = st.index.answers_version();
    if let Some(bits) = st.memo.get(version, span.first) {
        // SAFETY: the memo holds only `memo_bits` of index answers.
        let e = unsafe { EntryPtr::from_memo_bits(bits) };
        // SAFETY: the memo's answer at the current version (its module
        // docs), so findable.
        let entry = unsafe { answered(st, e) };
        if entry.has_key(span, access, page_size) {
            debug_assert!(
                st.index.covering(span, access).is_some_and(|s| s.value.as_ptr() == e.as_ptr()),
                "the hit memo answered other than the index"
            );
            return Some((e, entry));
        }
    }
    let slot = st.index.covering(span, access)?;
    let entry = indexed(slot);
    if entry.has_key(span, access, page_size) {
        st.memo.put(version, span.first, slot.value.memo_bits());
    }
    Some((slot.value, entry))
}

impl<R: Registrar> Cache<R> {
    /// Obtains a lease on a registration covering `[addr, addr+len)` with at
    /// least `access` (spec.md#S2.1). The lease is released when dropped.
    // Always inlined: the caller then takes the lease from registers. Returned
    // from a call, the result passes through memory, and reading it back
    // stalls store forwarding (more than the whole lane hit costs).
    #[inline(always)]
    pub fn acquire(&self, addr: u64, len: u64, access: Access) -> Result<Lease<'_, R>, Error> {
        let shared = self.shared();
        let range = Range::new(addr, len);
        if let Ok(range) = range {
            if let Some(lease) = self.lane_hit(shared, range, access) {
                return Ok(lease);
            }
        }
        self.acquire_locked(shared, range, access)
    }

    /// [`Self::acquire`] for the bytes of `buf` (empty: `E1`). The lease
    /// borrows the cache, not the buffer: the registration stays pinned
    /// while the lease lives even if the buffer is freed meanwhile (S5.3),
    /// and the monitor (or [`Self::invalidate`]) keeps later acquires fresh.
    #[inline(always)]
    pub fn acquire_slice<T>(&self, buf: &[T], access: Access) -> Result<Lease<'_, R>, Error> {
        self.acquire(buf.as_ptr() as u64, std::mem::size_of_val(buf) as u64, access)
    }

    /// [`Self::acquire`] for `len` bytes at `ptr` (only the address is used:
    /// nothing is read through it).
    #[inline(always)]
    pub fn acquire_ptr<T>(&self, ptr: *const T, len: usize, access: Access) -> Result<Lease<'_, R>, Error> {
        self.acquire(ptr as u64, len as u64, access)
    }

    /// A hint that `addr` is about to be acquired: starts A1's two cache
    /// misses now (the hit memo's slot for the request's first page, and the
    /// entry it names), so that they overlap whatever the caller does before
    /// the acquire. For a caller with work of its own ahead of
    /// [`Self::acquire_on_lane`] (the C API's argument and re-entry checks
    /// and the lane probe): there, at 10^5 buffers in random order, the
    /// misses otherwise start after about 150 instructions of that work, and
    /// the next request's misses cannot overlap this one's (bench/peers,
    /// interleaved: 209 -> 125 ns per get+put, 2026-12-06). Costs about 10
    /// instructions; it changes no state and dereferences no entry (it
    /// loads the generation pointer and one memo slot, [`MemoHint`]'s racy
    /// read), so any `addr` is fine.
    ///
    /// [`MemoHint`]: crate::hit_memo::MemoHint
    #[inline(always)]
    pub fn prefetch_acquire(&self, addr: u64) {
        // The generation without the fork check (`Self::shared`): a stale one
        // only wastes the hint, and every generation stays allocated until
        // the cache drops (`Self::shared`'s safety).
        // SAFETY: never null; generations are freed only in `Drop`.
        let shared = unsafe { &*self.shared.load(Ordering::Acquire) };
        // The page size is a power of two (`Config::validate`, spec.md#S6.2),
        // so the shift gives `Range::pages`'s first page (were it not, the
        // hint would only be useless).
        shared.memo_hint.prefetch(addr >> self.page_size.trailing_zeros());
    }

    /// [`Self::acquire`] in two halves, for a caller that keeps the hit path
    /// apart (the C API, whose hit path then never holds a lease in memory
    /// shared with the miss path's result): the lane hit (LN1), or `None`.
    /// On `None`, call [`Self::acquire_past_lane`] with the same arguments.
    #[inline(always)]
    pub fn acquire_on_lane(&self, addr: u64, len: u64, access: Access) -> Option<Lease<'_, R>> {
        let range = Range::new(addr, len).ok()?;
        self.lane_hit(self.shared(), range, access)
    }

    /// The rest of [`Self::acquire`] after [`Self::acquire_on_lane`] gave
    /// `None`: A1 onwards (or the range's error). A1's hit is inlined here,
    /// so a caller that is itself one call (the C API's miss path) takes
    /// its lease from registers: a lease returned from a call is read back
    /// with wider loads than it was stored with, and store forwarding fails.
    /// A1's own prefetch is left out: call [`Self::prefetch_acquire`] with
    /// `addr` first (the C API does, before its checks); without it the
    /// lookup is as correct, only slower on cache misses.
    #[inline(always)]
    pub fn acquire_past_lane(&self, addr: u64, len: u64, access: Access) -> Result<Lease<'_, R>, Error> {
        self.acquire_a1::<true>(self.shared(), Range::new(addr, len), access)
    }

    /// A1 onwards, as a call: [`Self::acquire`]'s callers inline the lane
    /// hit only.
    #[inline(never)]
    pub(super) fn acquire_locked<'c>(
        &'c self,
        shared: &'c Generation<R>,
        range: Result<Range, RangeError>,
        access: Access,
    ) -> Result<Lease<'c, R>, Error> {
        self.acquire_a1::<false>(shared, range, access)
    }

    /// A1 onwards (the lane had no memo for the request); the misses go on
    /// in [`Self::acquire_slow`], a call. `PREFETCHED`: the caller ran
    /// [`Self::prefetch_acquire`] for this request, so A1 skips its own
    /// (about 10 instructions per hit; 1.3 ns at 10^4 buffers, bench/peers).
    #[inline(always)]
    fn acquire_a1<'c, const PREFETCHED: bool>(
        &'c self,
        shared: &'c Generation<R>,
        range: Result<Range, RangeError>,
        access: Access,
    ) -> Result<Lease<'c, R>, Error> {
        // The acquire is counted at each exit (with the hit, on A1's).
        let range = match range {
            Ok(r) => r,
            Err(e) => {
                self.hot.bump(Hot::Acquires);
                inc(&self.counters.errors);
                return Err(Error::from_range(e));
            }
        };
        let span = range.pages(self.page_size);
        // The index's insert count when A1 missed (see `IntervalIndex::inserts`).
        let mut a1_missed_at = None;
        //= spec.md#M6
        //# a hit on a cache the process's monitor delivers to needs the gate current
        // Checked once, before A0 and A1: an event whose release returned
        // before this acquire began is then applied (INVALID set, memos
        // revoked) before the lookups below (gate.rs). If not current, A2
        // drains it under the lock exclusive.
        if shared.queue.is_empty() && shared.gate.current() {
            //= spec.md#A1
            //# if the queue is empty, take the lock *shared*; look up a covering
            //# findable entry with sufficient access; if found, increment its lease
            //# count atomically
            // Before the lock: its atomics then overlap the memo slot's and
            // the entry's cache misses.
            if !PREFETCHED {
                shared.memo_hint.prefetch(span.first);
            }
            // Claimed before the lock: a first claim allocates, and nothing
            // may free memory under the lock (A11). A lane installed during a
            // revoke holds no memo yet (memos are set under the lock).
            let lane = if self.lanes_on { shared.lanes.mine_or_claim() } else { None };
            //= spec.md#A0
            //# the cache has no limits, the draining count is 0, and this
            //# thread's lane (if any) takes no memo now (LN2 may skip it)
            // A lane that takes memos gets them from A1 under the lock (LN2
            // needs it); with limits, the hit's LRU touch and the notes need
            // A1's lock.
            if !self.limits_active && lane.is_none_or(|lane| lanes::dry_skip(lane)) && shared.draining.load(Ordering::Acquire) == 0 {
                if let Some(e) = self.lockless_hit(shared, span, access) {
                    self.hot.bump_each(&[Hot::Acquires, Hot::Hits, Hot::LocklessHits]);
                    return Ok(Lease::new(self, shared, e, true, false));
                }
            }
            //= spec.md#A1
            //# a thread may skip A1 and go straight to A2, whose A3 then looks up
            //# under the lock exclusive
            // With limits, after A1_MISS_STREAK A1 misses in a row on this
            // thread's lane, until its next hit: a miss then does not take
            // the lock shared for a lookup that misses. `None`: A3 looks up.
            if let Some(lane) = lane.filter(|lane| self.limits_active && lane.a1_misses.load(Ordering::Relaxed) >= lanes::A1_MISS_STREAK) {
                self.hot.bump_each(&[Hot::Acquires, Hot::A1Skips]);
                let leased = self.acquire_slow(shared, range, span, access, None);
                // A hit (A3 or A8): this thread's A1 runs again.
                if leased.as_ref().is_ok_and(|lease| lease.hit()) {
                    lane.a1_misses.store(0, Ordering::Relaxed);
                }
                return leased;
            }
            let st = shared.lock.read().unwrap_or_else(PoisonError::into_inner);
            if let Some((e, entry)) = covering_answer(&st, span, access, self.page_size) {
                // The streak matters only with limits (the skip above):
                // without them an A1 hit costs no load of it.
                if let Some(lane) = lane.filter(|lane| self.limits_active && lane.a1_misses.load(Ordering::Relaxed) != 0) {
                    lane.a1_misses.store(0, Ordering::Relaxed);
                }
                entry.state.acquire();
                //= spec.md#LN2
                //# memoize (in A1, under the lock shared)
                if let Some(lane) = lane {
                    lanes::memoize(lane, span, access, entry, e.as_ptr());
                }
                self.touch(entry);
                drop(st);
                //= spec.md#A1
                //# after unlocking, if the queue is non-empty, try the lock
                //# exclusive and drain
                if !shared.queue.is_empty() {
                    // A hook's try-lock failed against our shared lock.
                    DeregList::new(self, shared).finish();
                }
                self.hot.bump_each(&[Hot::Acquires, Hot::Hits]);
                return Ok(Lease::new(self, shared, e, true, false));
            }
            //= spec.md#A3
            //# A1 reads the counter under the shared lock its lookup missed under
            a1_missed_at = Some(st.index.inserts());
            if let Some(lane) = lane.filter(|_| self.limits_active) {
                lane.a1_misses.store(lane.a1_misses.load(Ordering::Relaxed).saturating_add(1), Ordering::Relaxed);
            }
        }
        self.hot.bump(Hot::Acquires);
        self.acquire_slow(shared, range, span, access, a1_missed_at)
    }

    /// A0 (spec.md#A0): a hit with no lock, on the entry the hit memo's
    /// slot names, if that entry is findable and is the request's key; else
    /// `None` (A1 then runs under the lock). The caller checked that the
    /// queue is empty and the draining count 0.
    ///
    /// Why the answer is A1's: the compare-exchange succeeds only on the
    /// word read, so on a findable entry (PENDING clear: A9 published it
    /// after the insert; INVALID clear: no step took it out since), of the
    /// incarnation whose key was read. A findable entry whose key is the
    /// request's is the canonical covering entry: when it was inserted, no
    /// findable entry covered the request it was planned for (A3, A8), which
    /// its key contains, and entries inserted later get higher ids. Freshness: an event that returned before this
    /// acquire began is queued, or taken by a drain that raised the
    /// draining count first, or applied (INVALID set before the count
    /// fell), as for LN1.
    #[inline(always)]
    fn lockless_hit(&self, shared: &Generation<R>, span: PageSpan, access: Access) -> Option<EntryPtr<R>> {
        //= spec.md#A0
        //# read the hit memo's slot for the request without the lock
        let bits = shared.memo_hint.racy_answer(span.first);
        if bits == 0 {
            return None;
        }
        // SAFETY: a memo slot holds only `memo_bits` of entries of this
        // generation's pool (index answers, `covering_answer`).
        let e = unsafe { EntryPtr::<R>::from_memo_bits(bits) };
        //= spec.md#A0
        //# read the entry's state word; if it is findable (neither INVALID nor
        //# PENDING) and the entry's key is the request's
        // SAFETY: an entry of this generation's pool, whose memory stays
        // allocated while the generation lives (`shared` borrows it), and
        // whose state word the pool never overwrites (`entry_pool` docs).
        let seen = unsafe { peek(e.as_ptr(), span, access, self.page_size) }?;
        // SAFETY: as above: the state word of pool memory is always a valid
        // `EntryState`.
        if !unsafe { &(*e.as_ptr()).state }.try_acquire_seen(seen) {
            return None;
        }
        // SAFETY: our lease keeps the entry alive (A-H): `leased`'s reason.
        let entry = unsafe { e.get() };
        //= spec.md#A0
        //# check the key again (the lease now keeps the entry alive)
        if !entry.has_key(span, access, self.page_size) {
            // The memory went through 2^21 incarnations between the two
            // reads of its word (state word docs): this lease, on another
            // entry, goes back as any release (R1, counted as one), and A1
            // answers.
            drop(Lease::new(self, shared, e, true, false));
            return None;
        }
        self.touch(entry);
        Some(e)
    }

    #[inline(never)]
    pub(super) fn acquire_slow<'c>(
        &'c self,
        shared: &'c Generation<R>,
        range: Range,
        span: PageSpan,
        access: Access,
        a1_missed_at: Option<u64>,
    ) -> Result<Lease<'c, R>, Error> {
        // F1 with the pid: we are about to take the exclusive lock. (Same
        // generation as the fast path's unless a fork just happened.)
        let first_shared: *const Generation<R> = shared;
        let shared = self.shared_slow();
        // Around every callback of this miss (the list's deregistrations
        // too: declared first, dropped last).
        let _callbacks = CallbackSpan::begin(&self.registrar);
        let mut deregs = DeregList::new(self, shared);
        let leased = self.acquire_exclusive(first_shared, shared, range, span, access, a1_missed_at, &mut deregs);
        deregs.finish();
        leased
    }

    /// A2 onwards, every exit with its lock released; the caller finishes
    /// `deregs` (A11's post-unlock drain).
    #[allow(clippy::too_many_arguments)]
    fn acquire_exclusive<'c>(
        &'c self,
        first_shared: *const Generation<R>,
        shared: &'c Generation<R>,
        range: Range,
        span: PageSpan,
        access: Access,
        a1_missed_at: Option<u64>,
        deregs: &mut DeregList<'c, R>,
    ) -> Result<Lease<'c, R>, Error> {
        let mut pressure_used = false;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            //= spec.md#A2
            //# slow path: take the lock exclusive; drain (A-D).
            let mut st = self.write(shared);
            self.drain(shared, &mut st, deregs);
            //= spec.md#A3
            //# look up again; on a hit, lease it, unlock, perform the dereg list, return.
            //= spec.md#A3
            //# A3 may skip its lookup (as a miss) on the acquire's first attempt when
            //# A1 ran and missed and the index's insert counter is still the one A1
            //# read when it missed
            // Same generation only: a fork replaces the index.
            let unchanged = attempts == 1 && std::ptr::eq(shared, first_shared) && a1_missed_at == Some(st.index.inserts());
            if unchanged {
                // (no lookup)
            } else if let Some(slot) = st.index.covering(span, access) {
                let e = slot.value;
                let entry = indexed(slot);
                entry.state.acquire();
                self.touch(entry);
                st.unlock();
                deregs.perform();
                self.hot.bump(Hot::Hits);
                // After an A7 retry this acquire may already have trimmed.
                return Ok(Lease::new(self, shared, e, true, pressure_used));
            }
            //= spec.md#A4
            //# miss: plan the registration per S6.1; add an in-flight record
            //# (range, stale = false); unlock.
            let Some(mut plan) = self.plan(&st.index, span, access) else {
                st.unlock();
                return Err(self.fail(Error::WrappingRange { addr: range.addr, len: range.len }));
            };
            let mut token = self.add_inflight(shared, &mut st, plan.span);
            // No entry covers the request now (A3): A8 may skip its lookup
            // while nothing is inserted.
            //= spec.md#A8
            //# A8 may skip its lookup while the index's insert counter is still the
            //# one A4 read before it unlocked
            let a4_inserts = st.index.inserts();
            st.unlock();
            deregs.perform();
            // Whether the monitor declined to watch the range (S7.6): the
            // registration is then served and never cached.
            let mut unwatched = false;
            if let Some(src) = shared.source.get() {
                //= spec.md#A5
                //# if another userfaultfd of the process watches it, the
                //# registration is served and not cached, as A9 does a windowed
                //# one
                match src.watch(plan.range) {
                    Ok(Watched::Yes) => {}
                    Ok(Watched::Not) => unwatched = true,
                    Err(detail) => {
                        self.abandon_inflight(shared, token, deregs);
                        return Err(self.fail(Error::Watch { range: plan.range, detail }));
                    }
                }
            }
            //= spec.md#A5
            //# Call the registrar without the lock.
            let handle = match self.register_abandonable(shared, token, &plan) {
                Ok(h) => h,
                Err(err) if !pressure_used && matches!(err.failure, RegistrarFailure::NoMemory | RegistrarFailure::Again) => {
                    pressure_used = true;
                    unwatched |= self.pressure_trim(shared, deregs, range, span, access, &mut plan, &mut token)?;
                    match self.register_abandonable(shared, token, &plan) {
                        Ok(h) => h,
                        Err(source) => return self.registration_failed(shared, token, deregs, span, access, true, source),
                    }
                }
                Err(source) => return self.registration_failed(shared, token, deregs, span, access, pressure_used, source),
            };
            //= spec.md#A6
            //# take the lock exclusive; if inserting the planned entry could
            //# exceed a limit (one more entry, the plan's bytes more; the drain and
            //# displacement only remove entries), note which findable entries are
            //# unleased: before it reads an entry's lease count (one sequentially
            //# consistent read each), it revokes that entry's lane slots (LN5);
            //# drain.
            let mut st = self.write(shared);
            // Only an insert that could exceed a limit may evict (the drain
            // and displacement only remove entries): skip the note else.
            let noted = if self.could_exceed_limits(&st, plan.range.len) {
                let (regions, bytes) = self.insert_excess(&st, plan.range.len);
                self.note_covering(shared, &mut st, regions, bytes)
            } else {
                Noted::default()
            };
            self.drain(shared, &mut st, deregs);
            let record = st.take_inflight(token);
            debug_assert!(record.is_some(), "in-flight record vanished");
            //= spec.md#A8
            //# if a findable entry now covers the request (another thread
            //# inserted it): lease it and return it as a hit
            // Checked first (A7 "first A8's test"): a findable entry is fresh,
            // whether or not our own registration went stale meanwhile.
            // Skipped when nothing was inserted since A4, which saw no cover
            // (and the pressure trim only removes).
            let a8 = if st.index.inserts() == a4_inserts { None } else { st.index.covering(span, access) };
            if let Some(slot) = a8 {
                let e = slot.value;
                let entry = indexed(slot);
                entry.state.acquire();
                self.touch(entry);
                deregs.items.push(Dereg::Discard(handle));
                self.settle_over_limit(shared, &st);
                st.unlock();
                deregs.perform();
                self.hot.bump(Hot::Hits);
                return Ok(Lease::new(self, shared, e, true, pressure_used));
            }
            //= spec.md#A7
            //# if the in-flight record is stale, or (merge, no-merge-uncache-contained)
            //# the plan recomputed now differs from A4's: remove it, unlock,
            //# deregister the new registration, retry from A2
            //= spec.md#W3
            //# A7 treats a windowed record as stale if no open window overlaps it
            //# any more
            // Its registrar call may have pinned the frames that window's
            // release took, and the acquire cannot take effect inside the
            // window any more (it would have to be cached now): retry.
            let stale = record.is_some_and(|r| r.stale || (r.windowed && !shared.windows.overlaps(plan.span)));
            let replanned = self.config.contract.policy != OverlapPolicy::Independent
                && self.plan(&st.index, span, access).is_none_or(|p| (p.span, p.access) != (plan.span, plan.access));
            if (stale || replanned) && !fault!(self.config, skip_seq_recheck) {
                self.settle_over_limit(shared, &st);
                st.unlock();
                deregs.items.push(Dereg::Discard(handle));
                deregs.perform();
                inc(&self.counters.stale_retries);
                if attempts >= self.config.max_retries {
                    return Err(self.fail(Error::RetriesExhausted { attempts }));
                }
                continue;
            }
            //= spec.md#A9
            //# else insert: remove the in-flight record, insert the entry with
            //# lease count 1 and the next id, displace what S6.1 gives *now*,
            //# recomputed under the lock (unleased → dereg list; leased → set
            //# INVALID, deregistered at last release).
            let (e, id) = self.insert(shared, &mut st, plan, handle, deregs);
            // Its only writer, always under the lock exclusive.
            st.add_exclusive(&self.counters.misses, 1);
            //= spec.md#F1
            //# until a monitor runs in the child, a miss's registration is not
            //# cached
            //= spec.md#W3
            //# A9 inserts a windowed registration and at once takes it out of
            //# the index, as a leased entry leaves it on invalidation
            if !shared.caching() || record.is_some_and(|r| r.windowed) || unwatched {
                // Served, never findable: deregistered at its last release
                // (as an entry a release event took out while leased).
                inc(&self.counters.uncached);
                if unwatched {
                    inc(&self.counters.unwatched_uncached);
                }
                self.uncache(shared, &mut st, plan.span.first, id, deregs, false);
            } else {
                // SAFETY: findable (just inserted, not taken out), with the
                // lock held exclusive.
                unsafe { e.get() }.state.publish();
            }
            //= spec.md#A10
            //# evict per S6.4 into the dereg list, choosing victims only among
            //# the entries A6 noted unleased that are still findable
            self.enforce_limits(shared, &mut st, deregs, &noted);
            //= spec.md#A11
            //# unlock; perform the dereg list
            st.unlock();
            deregs.perform();
            // Once per acquire (S5.4): a later attempt (A7 retry) still reports
            // the evictions an earlier attempt made.
            return Ok(Lease::new(self, shared, e, false, pressure_used));
        }
    }

    //= spec.md#A5
    //# On ENOMEM/EAGAIN (first time only): trim (S2.8) as a step
    //# of its own: take the lock, note the unleased entries,
    //# drain, evict the noted ones still findable and unleased
    //# into the dereg list (as A6/A10: an event queued before a
    //# release the note saw is applied first), re-plan per A4
    //# (the evicted entries no longer merge or displace), unlock,
    //# perform the dereg list
    /// A5's trim on ENOMEM/EAGAIN, then the re-plan (new `plan` and `token`).
    /// Returns whether the monitor declined to watch a widened re-plan.
    #[allow(clippy::too_many_arguments)]
    fn pressure_trim<'c>(
        &'c self,
        shared: &'c Generation<R>,
        deregs: &mut DeregList<'c, R>,
        range: Range,
        span: PageSpan,
        access: Access,
        plan: &mut Plan,
        token: &mut u64,
    ) -> Result<bool, Error> {
        let mut st = self.write(shared);
        let noted = self.note_all_unleased(shared, &mut st);
        self.drain(shared, &mut st, deregs);
        st.take_inflight(*token);
        self.evict_all_unleased(shared, &mut st, deregs, &noted);
        // The model plans after the pressure eviction: under
        // `merge`, evicted neighbours are no longer merged.
        let Some(p) = self.plan(&st.index, span, access) else {
            st.unlock();
            return Err(self.fail(Error::WrappingRange { addr: range.addr, len: range.len }));
        };
        let watched = plan.range;
        *plan = p;
        *token = self.add_inflight(shared, &mut st, plan.span);
        st.unlock();
        deregs.perform();
        // The re-plan only drops evicted neighbours, so it lies
        // within the watched range; watch it anyway if not.
        if let Some(src) = shared.source.get().filter(|_| !watched.contains(&plan.range)) {
            match src.watch(plan.range) {
                Ok(Watched::Yes) => {}
                Ok(Watched::Not) => return Ok(true),
                Err(detail) => {
                    self.abandon_inflight(shared, *token, deregs);
                    return Err(self.fail(Error::Watch { range: plan.range, detail }));
                }
            }
        }
        Ok(false)
    }

    //= spec.md#A5
    //# On failure: take the lock, drain, remove the in-flight record; if a
    //# findable entry now covers the request, lease it and return it as a hit
    //# (as A8); else unlock and return E5 (E5 takes effect here, where nothing
    //# covers the request).
    /// E5 then linearizes here, where no entry covers the request (the
    /// model's E5 needs a miss); the plan it failed on may be older.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn registration_failed<'c>(
        &'c self,
        shared: &'c Generation<R>,
        token: u64,
        deregs: &mut DeregList<'c, R>,
        span: PageSpan,
        access: Access,
        pressure: bool,
        source: crate::registrar::RegistrarError,
    ) -> Result<Lease<'c, R>, Error> {
        let mut st = self.write(shared);
        self.drain(shared, &mut st, deregs);
        st.take_inflight(token);
        let covering = st.index.covering(span, access).map(|slot| {
            let entry = indexed(slot);
            entry.state.acquire();
            self.touch(entry);
            slot.value
        });
        st.unlock();
        deregs.perform();
        match covering {
            Some(e) => {
                self.hot.bump(Hot::Hits);
                Ok(Lease::new(self, shared, e, true, pressure))
            }
            None => {
                let registrar = self.registrar.name();
                Err(self.fail(Error::Registrar { registrar, pressure, source }))
            }
        }
    }

    /// A5's registrar call. If its callback never returns (it jumps out:
    /// spec.md#S7.8), the registrar adapter runs the abandon of the
    /// in-flight record `token` before the jump, as after a failure.
    fn register_abandonable(&self, shared: &Generation<R>, token: u64, plan: &Plan) -> Result<R::Handle, crate::registrar::RegistrarError> {
        let mut abandon = || {
            let mut deregs = DeregList::new(self, shared);
            self.abandon_inflight(shared, token, &mut deregs);
            deregs.finish();
        };
        self.registrar.register_abandonable(plan.range, plan.access, &mut abandon)
    }

    pub(super) fn abandon_inflight<'c>(&'c self, shared: &'c Generation<R>, token: u64, deregs: &mut DeregList<'c, R>) {
        let mut st = self.write(shared);
        self.drain(shared, &mut st, deregs);
        st.take_inflight(token);
        st.unlock();
        deregs.perform();
    }

    //= spec.md#S6.1
    /// The registration a miss creates. `None` if its byte range would end
    /// past the last byte of the address space.
    pub(super) fn plan(&self, index: &IntervalIndex<EntryPtr<R>>, span: PageSpan, access: Access) -> Option<Plan> {
        //= spec.md#S6.2
        let mut new_span = span.align(self.chunk_pages);
        let mut new_access = access;
        if self.config.contract.policy == OverlapPolicy::Merge {
            // Widen to the union with every overlapping entry until nothing
            // more overlaps: the model's fixpoint (order does not matter).
            loop {
                let mut grown = new_span;
                for (s, slot) in index.overlapping(new_span) {
                    grown = grown.union(&s);
                    new_access = new_access | slot.access;
                }
                let grown = grown.align(self.chunk_pages);
                if grown == new_span {
                    break;
                }
                new_span = grown;
            }
        }
        if self.config.contract.policy == OverlapPolicy::NoMergeUncacheContained {
            // Keep the rights of the entries this one displaces (S6.1).
            for (s, slot) in index.overlapping(new_span) {
                if new_span.contains(&s) || s.contains(&new_span) {
                    new_access = new_access | slot.access;
                }
            }
        }
        let ps = self.page_size;
        let addr = new_span.first.checked_mul(ps)?;
        new_span.end.checked_mul(ps)?;
        let len = new_span.count().checked_mul(ps)?;
        Some(Plan { span: new_span, access: new_access, range: Range { addr, len } })
    }

    /// A9: inserts a new entry with one lease, then displaces per S6.1.
    /// Returns the entry and its id.
    pub(super) fn insert<'c>(
        &'c self,
        shared: &'c Generation<R>,
        st: &mut Locked<R>,
        plan: Plan,
        handle: R::Handle,
        deregs: &mut DeregList<'c, R>,
    ) -> (EntryPtr<R>, u64) {
        // Displaced entries, computed against the index as it is now (another
        // thread may have changed it since A4; sequentially it is A4's plan).
        let displaced: Vec<(PageSpan, u64)> = match self.config.contract.policy {
            OverlapPolicy::Independent => Vec::new(),
            OverlapPolicy::Merge => st.index.overlapping(plan.span).into_iter().map(|(s, slot)| (s, slot.id)).collect(),
            OverlapPolicy::NoMergeUncacheContained => st
                .index
                .overlapping(plan.span)
                .into_iter()
                .filter(|(s, _)| plan.span.contains(s) || s.contains(&plan.span))
                .map(|(s, slot)| (s, slot.id))
                .collect(),
        };
        let id = st.add_exclusive(&self.next_id, 1);
        let bytes = plan.range.len;
        let keys = self.registrar.keys(&handle);
        let mut entry = Entry::<R> {
            state: EntryState::pending(1),
            last_use: plain::AtomicU64::new(0),
            priority: plain::AtomicU64::new(0),
            // Read only by GreedyDual-Size's touch: not computed (a 128-bit
            // division) for other policies.
            cost: if self.config.contract.eviction == EvictionPolicy::CostAware {
                // Below 80,000 for a valid page size (`Entry::cost`).
                u32::try_from(per_page_cost_ns(plan.span.count(), self.page_size)).unwrap_or(u32::MAX)
            } else {
                0
            },
            memoized: plain::AtomicBool::new(false),
            noted: plain::AtomicU64::new(0),
            view_id: id,
            view_addr: plan.range.addr,
            view_len: bytes,
            view_access: plan.access,
            keys,
            handle: ManuallyDrop::new(handle),
        };
        // The use that creates it (stamped before it is findable: nobody else
        // can see it before we unlock, so without a locked instruction).
        self.touch_new(&mut entry);
        let e = EntryPtr::new(st.entries.alloc(&shared.returned_entries, entry));
        st.index.insert(plan.span, id, plan.access, e);
        // Memo tables grow with the index; the old one's pages are given
        // back after unlocking.
        if let Some(old) = st.memo.grow_for(st.index.len()) {
            // SAFETY: the memo the hint was made from (`Generation::new`).
            unsafe { shared.memo_hint.set(&st.memo) };
            deregs.retired_memos.push(old);
        }
        self.add_candidate(st, e, plan.span.first, id);
        st.cached_bytes += bytes;
        // Written only under the lock exclusive: plain stores (the live
        // counts below are also lowered by deregistrations, after unlocking).
        st.add_exclusive(&shared.cached, 1);
        st.add_exclusive(&self.counters.registrations, 1);
        st.add_exclusive(&self.counters.bytes_registered, bytes);
        shared.live_regs.fetch_add(1, Ordering::Relaxed);
        let pinned = shared.live_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        st.max_exclusive(&self.counters.peak_pinned_bytes, pinned);
        for (s, old) in displaced {
            match self.config.contract.policy {
                OverlapPolicy::Merge => inc(&self.counters.merges),
                _ => inc(&self.counters.uncached),
            }
            self.uncache(shared, st, s.first, old, deregs, false);
        }
        (e, id)
    }

    /// A4's in-flight record, after widening the hull that
    /// [`Cache::may_hold`] reads. The hull grows before the registrar runs, so
    /// an event that misses it happened before the registration began.
    ///
    /// The record is *windowed* if a release window overlapping it is open
    /// (W3): its registrar call may straddle that window's release and pin
    /// the frames about to go, so it is never cached: A9 serves it uncached
    /// while a window overlaps it, A7 retries it once none does. (One
    /// planned before the window's W1 event was drained is marked stale by
    /// that drain.)
    pub(super) fn add_inflight(&self, shared: &Generation<R>, st: &mut Locked<R>, span: PageSpan) -> u64 {
        // Written only when it grows: a hull already holding the span was
        // read as such by any event that read it since (it only grows), so
        // skipping the write changes nothing `may_hold` can answer.
        if span.first < self.hull_lo.load(Ordering::SeqCst) {
            self.hull_lo.fetch_min(span.first, Ordering::SeqCst);
        }
        if span.end > self.hull_hi.load(Ordering::SeqCst) {
            self.hull_hi.fetch_max(span.end, Ordering::SeqCst);
        }
        //= spec.md#W3
        //# A4 marks its in-flight record *windowed* if an open window overlaps
        //# it
        let windowed = shared.windows.overlaps(span);
        st.push_inflight(span, windowed)
    }
}
