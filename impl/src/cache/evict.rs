//! Eviction: the notes of spec.md A6, A10, R2 and the trim (S2.8, A5), the
//! limits (S6.4), victims (S6.3) and the LRU stamps; flush (S2.5).
//!
//! # Cost
//!
//! A6 and R2 note only the least unleased entries, in policy order, that
//! cover the excess (spec.md#A6 allows it: the victims are those of the full
//! note), popped from the [`super::evict_order`] heap; A10 evicts from that
//! prefix. A miss under a limit so costs `O((v + k + 1) · log n)` for `v`
//! victims and `k` candidates passed over (leased entries older than the
//! victims, and keys made out of date by uses since their last push, at most
//! one per use), where it was `O(n log n)`. The trim still notes every entry
//! (it evicts them all). The checker encodes the same prefix note (its
//! mutant `note-one-short` breaks P5); debug builds (every test) check each
//! victim against a full note taken in the same window, and a unit test
//! shows that check catching a note one entry short.

use super::counters::inc;
use super::dereg::DeregList;
use super::entry::EntryPtr;
use super::entry::{self, indexed, Entry};
use super::entry_state::EntryState;
use super::evict_order::{policy_key, Candidate};
use super::generation::{Generation, Locked};
use super::Cache;
use crate::index::{IntervalIndex, Removal, Slot};
use crate::registrar::Registrar;
use crate::sync::Ordering;
use mrcache_types::config::EvictionPolicy;

/// The entries an eviction pass may take (see [`Cache::note_victims`]): those
/// whose `noted` number is this note's. `Noted(0)` notes nothing.
#[derive(Default)]
pub(super) struct Noted(u64);

impl Noted {
    pub(super) fn contains<R: Registrar>(&self, e: &Entry<R>) -> bool {
        self.0 != 0 && e.noted.load(Ordering::Relaxed) == self.0
    }
}

impl<R: Registrar> Cache<R> {
    pub(super) fn over_limits(&self, st: &Locked<R>) -> bool {
        let l = &self.config.contract.limits;
        l.max_regions.is_some_and(|m| st.index.len() as u64 > m) || l.max_pinned_bytes.is_some_and(|m| st.cached_bytes > m)
    }

    fn cost_aware(&self) -> bool {
        self.config.contract.eviction == EvictionPolicy::CostAware
    }

    /// The entry's current policy key ([`policy_key`]).
    fn key_now(&self, e: &Entry<R>, id: u64) -> (u64, u64, u64) {
        policy_key(self.cost_aware(), e.last_use.load(Ordering::Relaxed), e.priority.load(Ordering::Relaxed), id)
    }

    /// A candidate for `e`, an entry in the index (lock held exclusive).
    fn candidate_of(e: &Entry<R>, key: (u64, u64, u64), first: u64) -> Candidate {
        let incarnation = EntryState::incarnation_bits(e.state.seen());
        Candidate { key, first, entry: e as *const Entry<R> as usize, incarnation }
    }

    /// The entry of candidate `c` if it is still in the index (module docs
    /// of `evict_order`): by its address and incarnation, which debug builds
    /// check against a descent of the index.
    fn candidate_entry<'i>(index: &'i IntervalIndex<EntryPtr<R>>, c: &Candidate) -> Option<&'i Entry<R>> {
        // SAFETY: `index` is borrowed from the state behind the lock, held
        // exclusive by every caller (the notes); `c.entry` is an entry of
        // this generation's pool (every candidate is made by `candidate_of`
        // from an entry in this generation's index).
        let found = unsafe { entry::candidate(index, c.entry as *const Entry<R>, c.incarnation, c.id()) };
        debug_assert_eq!(
            found.map(|e| e as *const Entry<R>),
            index.find(c.first, c.id()).map(|slot| indexed(slot) as *const Entry<R>),
            "a candidate's entry found by its address and incarnation differs from the index's answer"
        );
        found
    }

    /// A9: the new entry becomes a victim candidate (with limits only:
    /// nothing else evicts in policy order).
    pub(super) fn add_candidate(&self, st: &mut Locked<R>, e: EntryPtr<R>, first: u64, id: u64) {
        if !self.limits_active {
            return;
        }
        // SAFETY: just inserted by A9 under the lock exclusive, which we hold.
        let entry = unsafe { e.get() };
        let key = self.key_now(entry, id);
        st.order.push(Self::candidate_of(entry, key, first));
        if st.order.needs_rebuild(st.index.len()) {
            // One candidate per entry, except those a pending note holds
            // out (A9 runs between A6's note and A10): they come back from
            // `st.noted`.
            let held_out: std::collections::HashSet<u64> = st.noted.iter().map(|c| c.id()).collect();
            let fresh: Vec<Candidate> = st
                .index
                .iter()
                .filter(|(_, slot)| !held_out.contains(&slot.id))
                .map(|(s, slot)| {
                    let e = indexed(slot);
                    Self::candidate_of(e, self.key_now(e, slot.id), s.first)
                })
                .collect();
            st.order.rebuild(fresh.into_iter());
        }
    }

    //= spec.md#A6
    //# note which findable entries are unleased: before it reads an entry's
    //# lease count (one sequentially consistent read each), it revokes that
    //# entry's lane slots (LN5)
    /// A6 / R2: notes the unleased findable entries A10 may need: in policy
    /// order (S6.3), the least ones until they cover the excess of `regions`
    /// entries and `bytes` bytes (the insert's excess in A6, the current one
    /// in R2). Taken *before* the drain: an event queued before a release
    /// this note sees was pushed before the note (the release came after the
    /// event returned), so the drain applies it before any victim is chosen.
    /// Releases after the note are treated as leased (they take effect after
    /// this operation); if the note falls short of the excess, A10 may end
    /// over a limit, and [`Self::note_covering`] raises the over-limit flag
    /// and notes again.
    ///
    /// Only the candidates it is about to note are revoked (spec.md#LN5): a
    /// lane lease is a lease the state word does not count until a revoke
    /// pins it, so an entry's slots are revoked before its count is read,
    /// and no lane hit on it follows (memos are made under the lock shared).
    /// Entries that no slot points to (`memoized` clear: no lane ever held
    /// them) cost nothing, so an evicting miss leaves other threads' lanes
    /// as they are.
    ///
    /// Noting this prefix instead of every unleased entry chooses the same
    /// victims: noted entries are not used until A10 (lock exclusive, their
    /// slots revoked), so their keys and order stay; the drain and the
    /// displacement only remove entries, each removal lowering the excess by
    /// at least as much as it removes from the prefix; so the noted entries
    /// still findable cover what A10 must evict, and they are the least ones
    /// of the full note. Debug builds check this against the full note.
    ///
    /// Returns the note and whether it fell short of the excess (every
    /// unleased entry noted, and still less than the excess).
    pub(super) fn note_victims(&self, shared: &Generation<R>, st: &mut Locked<R>, regions: u64, bytes: u64) -> (Noted, bool) {
        #[cfg(test)]
        let regions = if tests::SHORT_NOTE.with(std::cell::Cell::get) { regions.saturating_sub(1) } else { regions };
        let noted = self.next_note(st);
        // Candidates left by an operation that noted and then exited before
        // A10 (A7, A8): they go back into the order first.
        let mut prefix = std::mem::take(&mut st.noted);
        for c in prefix.drain(..) {
            st.order.push(c);
        }
        let (mut n, mut b) = (0u64, 0u64);
        let mut passed = std::mem::take(&mut st.passed);
        // Bounded: each turn pops a candidate; a re-push needs a use of that
        // entry since its last push, and an entry whose slots are revoked is
        // not used until A10.
        // A candidate re-keyed by the walk and still the least: taken next
        // without going through the heap (push_pop).
        // It keeps the slot it was found at when it is the same entry (the
        // index does not change during the walk): one descent less.
        let mut carried = None;
        while n < regions || b < bytes {
            let (c, e) = match carried.take() {
                Some(carried) => carried,
                None => {
                    let Some(c) = st.order.pop() else { break };
                    let Some(e) = Self::candidate_entry(&st.index, &c) else {
                        continue; // its entry left the index: garbage
                    };
                    (c, e)
                }
            };
            if e.state.leases() != 0 {
                passed.push(c);
                continue;
            }
            // Used since it was pushed (its key grew): back in the order,
            // without a revoke. A lane hit may still raise it later; the
            // key is read again after the revoke.
            let key = self.key_now(e, c.id());
            if key != c.key {
                debug_assert!(key > c.key, "policy keys only grow");
                let next = st.order.push_pop(Candidate { key, ..c });
                carried = if (next.first, next.id()) == (c.first, c.id()) {
                    Some((next, e))
                } else {
                    Self::candidate_entry(&st.index, &next).map(|e| (next, e))
                };
                continue;
            }
            //= spec.md#LN5
            //# A6 and R2 revoke the slots of each entry before they read its
            //# lease count for the note
            if e.memoized.load(Ordering::Relaxed) && !fault!(self.config, note_skips_revoke) {
                let p = e as *const Entry<R> as *mut Entry<R>;
                self.revoke(shared, |q| q == p);
                // A lane lease the revoke pinned is a lease now; a lane hit
                // between the first read and the revoke raised the key.
                if e.state.leases() != 0 {
                    passed.push(c);
                    continue;
                }
                let key = self.key_now(e, c.id());
                if key != c.key {
                    let next = st.order.push_pop(Candidate { key, ..c });
                    carried = if (next.first, next.id()) == (c.first, c.id()) {
                        Some((next, e))
                    } else {
                        Self::candidate_entry(&st.index, &next).map(|e| (next, e))
                    };
                    continue;
                }
            }
            e.noted.store(noted.0, Ordering::Relaxed);
            n += 1;
            b += e.view_len;
            prefix.push(c);
        }
        // The full note A10 is checked against (debug builds): the prefix,
        // and every findable entry the walk did not read that a revoke of its
        // slots would find unleased (its count 0, and no slot pointing to it
        // counts a lane lease): the note of every entry that the spec allows.
        #[cfg(debug_assertions)]
        {
            let read: std::collections::HashSet<u64> = passed.iter().chain(prefix.iter()).map(|c| c.id()).collect();
            let lane_leased = self.lane_leased(shared);
            st.full_note = prefix.iter().map(|c| c.id()).collect();
            for (_, slot) in st.index.iter() {
                let e = indexed(slot);
                if !read.contains(&slot.id) && e.state.leases() == 0 && !lane_leased.contains(&slot.value.as_ptr()) {
                    st.full_note.push(slot.id);
                }
            }
            st.full_note.sort_unstable();
            st.full_note.dedup();
        }
        // Set only just before a `continue`, which leaves n and b as they were.
        debug_assert!(carried.is_none(), "a carried candidate is taken by the next turn");
        for c in passed.drain(..) {
            st.order.push(c);
        }
        st.passed = passed;
        st.noted = prefix;
        (noted, n < regions || b < bytes)
    }

    //= spec.md#A6
    //# If the note falls short of the excess (it noted every unleased
    //# entry), raise the over-limit flag, then note again
    /// A6 / R2: the note of [`Self::note_victims`], and, if it falls short
    /// of the excess, the over-limit flag (sequentially consistent), then a
    /// second note, before the drain. A release after the first read of its
    /// entry's count is then either seen by the second note or reads the
    /// flag raised and runs R2 after this section: none that the notes miss
    /// returns while the section runs. A note that covers the excess needs
    /// no flag: A10 then ends within the limits whatever is released after
    /// it (the drain and the displacement only lower the excess).
    ///
    /// The flag comes before the drain, not after A9's insert (as A10's
    /// second pass once raised it, with a note and a drain of its own): a
    /// release that the first note saw leased could read it clear and
    /// return, its thread raise an event (a munmap of the new entry's
    /// pages, queued while we hold the lock), and that late drain apply the
    /// event before evicting: back within the limits, the released entry
    /// stayed cached, where every order puts the release before the event
    /// and so evicts it (P5; `tests/over_limit_race.rs`). Drained here, an
    /// event queued after such a release may be ordered before this
    /// operation, whose insert comes after the drain.
    pub(super) fn note_covering(&self, shared: &Generation<R>, st: &mut Locked<R>, regions: u64, bytes: u64) -> Noted {
        let (noted, short) = self.note_victims(shared, st, regions, bytes);
        // The fault switch (the checker's `over-limit-flag-late`) raises the
        // flag only in A10, after the notes.
        if !short || fault!(self.config, over_limit_flag_late) {
            return noted;
        }
        shared.over_limit.store(true, Ordering::SeqCst);
        crate::sync::loom_sc_fence();
        self.note_victims(shared, st, regions, bytes).0
    }

    /// A new note number.
    fn next_note(&self, st: &mut Locked<R>) -> Noted {
        st.note_epoch += 1;
        Noted(st.note_epoch)
    }

    /// S2.8 (trim): every findable entry unleased now, read (SeqCst) after
    /// revoking the lanes; before the drain, as in [`Self::note_victims`].
    pub(super) fn note_all_unleased(&self, shared: &Generation<R>, st: &mut Locked<R>) -> Noted {
        //= spec.md#LN5
        //# Trim revokes every slot before it notes.
        self.revoke_all(shared);
        let noted = self.next_note(st);
        for (_, slot) in st.index.iter() {
            let e = indexed(slot);
            if e.state.leases() == 0 {
                e.noted.store(noted.0, Ordering::Relaxed);
            }
        }
        noted
    }

    /// The excess A6 notes for: one more entry of `bytes`, per limit.
    pub(super) fn insert_excess(&self, st: &Locked<R>, bytes: u64) -> (u64, u64) {
        let l = &self.config.contract.limits;
        (
            l.max_regions.map_or(0, |m| (st.index.len() as u64 + 1).saturating_sub(m)),
            l.max_pinned_bytes.map_or(0, |m| st.cached_bytes.saturating_add(bytes).saturating_sub(m)),
        )
    }

    /// The excess R2 notes for: the current one.
    pub(super) fn current_excess(&self, st: &Locked<R>) -> (u64, u64) {
        let l = &self.config.contract.limits;
        (
            l.max_regions.map_or(0, |m| (st.index.len() as u64).saturating_sub(m)),
            l.max_pinned_bytes.map_or(0, |m| st.cached_bytes.saturating_sub(m)),
        )
    }

    /// Debug builds: the victim the full note would give (the least noted
    /// entry still findable and unleased), to check [`Self::enforce_limits`].
    #[cfg(debug_assertions)]
    fn full_note_victim(&self, st: &Locked<R>) -> Option<u64> {
        st.index
            .iter()
            .filter(|(_, slot)| st.full_note.binary_search(&slot.id).is_ok() && indexed(slot).state.leases() == 0)
            .map(|(_, slot)| self.key_now(indexed(slot), slot.id))
            .min()
            .map(|k| k.2)
    }

    /// Whether inserting one more entry of `bytes` could put the cache over a
    /// limit (A6): the entry count or the cached bytes after the insert.
    pub(super) fn could_exceed_limits(&self, st: &Locked<R>, bytes: u64) -> bool {
        let l = &self.config.contract.limits;
        self.limits_active
            && (l.max_regions.is_some_and(|m| st.index.len() as u64 + 1 > m)
                || l.max_pinned_bytes.is_some_and(|m| st.cached_bytes.saturating_add(bytes) > m))
    }

    /// Clears the over-limit flag when within limits (an exit that evicts
    /// nothing after [`Cache::note_victims`] raised it).
    pub(super) fn settle_over_limit(&self, shared: &Generation<R>, st: &Locked<R>) {
        if self.limits_active && !self.over_limits(st) {
            shared.over_limit.store(false, Ordering::SeqCst);
        }
    }

    //= spec.md#S6.4
    //= spec.md#A10
    /// Evicts while over a limit, victims among the `noted` entries. If
    /// still over (every noted entry is gone or leased), the note fell
    /// short and [`Self::note_covering`] raised the flag before its second
    /// note: it stays raised, and a release after that note runs R2.
    pub(super) fn enforce_limits<'c>(
        &'c self,
        shared: &'c Generation<R>,
        st: &mut Locked<R>,
        deregs: &mut DeregList<'c, R>,
        noted: &Noted,
    ) {
        if !self.limits_active {
            return;
        }
        if noted.0 == 0 {
            // Nothing noted (A6 found no excess possible): no victims.
            self.settle_over_limit(shared, st);
            return;
        }
        let prefix = std::mem::take(&mut st.noted);
        let mut rest = prefix.iter();
        // Bounded by the noted candidates.
        while self.over_limits(st) {
            let Some(c) = rest.next() else { break };
            #[cfg(debug_assertions)]
            let full_note_victim = self.full_note_victim(st);
            // The victim check and the removal in one descent of the index.
            let victim = |slot: &Slot<EntryPtr<R>>| {
                let e = indexed(slot);
                noted.contains(e) && e.state.leases() == 0
            };
            let slot = match st.index.remove_if(c.first, c.id(), victim) {
                Removal::Absent => continue,
                Removal::Kept => {
                    debug_assert!(false, "a noted entry was leased before A10");
                    st.order.push(*c);
                    continue;
                }
                Removal::Removed(slot) => slot,
            };
            #[cfg(debug_assertions)]
            assert_eq!(full_note_victim, Some(c.id()), "the noted prefix chose another victim than the full note");
            let prio = indexed(&slot).priority.load(Ordering::Relaxed);
            st.max_exclusive(&self.gds_floor, prio);
            st.add_exclusive(&self.counters.evictions, 1);
            self.retire(shared, st, slot, deregs, false, false);
        }
        #[cfg(debug_assertions)]
        if self.over_limits(st) {
            assert_eq!(self.full_note_victim(st), None, "the noted prefix ran out before the full note");
        }
        for c in rest {
            st.order.push(*c);
        }
        // The list's allocation goes back for the next note (it was freed
        // and allocated again on every evicting miss).
        if st.noted.is_empty() {
            let mut prefix = prefix;
            prefix.clear();
            st.noted = prefix;
        }
        //= spec.md#A10
        //# Clear the flag when the pass ends within limits, else leave it
        //# raised.
        if self.over_limits(st) {
            // Raised already by the note that fell short (no one clears it
            // while we hold the lock); the fault switch raises it only here.
            debug_assert!(
                fault!(self.config, over_limit_flag_late) || shared.over_limit.load(Ordering::SeqCst),
                "over a limit after A10 without the flag"
            );
            shared.over_limit.store(true, Ordering::SeqCst);
        } else {
            self.settle_over_limit(shared, st);
        }
    }

    /// S2.8 / S5.4: every noted entry still findable and unleased leaves
    /// (pressure eviction).
    pub(super) fn evict_all_unleased<'c>(
        &'c self,
        shared: &'c Generation<R>,
        st: &mut Locked<R>,
        deregs: &mut DeregList<'c, R>,
        noted: &Noted,
    ) {
        let unleased: Vec<(u64, u64)> = st
            .index
            .iter()
            .filter(|(_, slot)| noted.contains(indexed(slot)) && indexed(slot).state.leases() == 0)
            .map(|(s, slot)| (s.first, slot.id))
            .collect();
        for (first, id) in unleased {
            //= spec.md#A5
            //# with one compare-exchange of its state word from unleased to INVALID
            // Not a count read and then an OR: without limits A0 leases
            // entries under the trim's lock exclusive, and an entry it
            // leased between the two would leave the index leased, where
            // S2.8 keeps it.
            let claim = |slot: &Slot<EntryPtr<R>>| indexed(slot).state.invalidate_unleased();
            if let Removal::Removed(slot) = st.index.remove_if(first, id, claim) {
                inc(&self.counters.pressure_evictions);
                self.retire(shared, st, slot, deregs, false, true);
            }
        }
        if self.limits_active {
            self.settle_over_limit(shared, st);
        }
    }

    /// A use: acquire or release (S6.3). Stamps matter only for eviction,
    /// which only limits trigger, so without limits this costs nothing.
    #[inline]
    pub(super) fn touch(&self, entry: &Entry<R>) {
        if !self.limits_active {
            return;
        }
        if fault!(self.config, lru_skips_restamp) {
            return;
        }
        let cost_aware = self.cost_aware();
        //= spec.md#S6.3
        //# A use whose entry's stamp is the clock's (the most recent use) may
        //# leave the stamp as it is
        // Already the latest use: every stamp is a distinct clock value, so
        // an entry whose stamp is the clock's is the most recently used, and
        // a new stamp would change no order between entries (nor, with its
        // priority already at the floor plus its cost, GreedyDual-Size's).
        // Skipped, that saves two locked instructions, as on the release
        // right after the acquire of the same entry. A stamp this load does
        // not see was taken by a use concurrent with this one, which may
        // take effect after it.
        if entry.last_use.load(Ordering::Relaxed) == self.clock.load(Ordering::Relaxed)
            && (!cost_aware || entry.priority.load(Ordering::Relaxed) >= self.gds_priority(entry))
        {
            return;
        }
        // fetch_max, not a store: two concurrent uses may store out of
        // order, and the eviction order needs keys that only grow.
        let now = self.clock.fetch_add(1, Ordering::Relaxed) + 1;
        entry.last_use.fetch_max(now, Ordering::Relaxed);
        if cost_aware {
            entry.priority.fetch_max(self.gds_priority(entry), Ordering::Relaxed);
        }
    }

    /// GreedyDual-Size's `H` for a use of `entry` now: the inflation floor
    /// plus its per-page cost.
    #[inline]
    fn gds_priority(&self, entry: &Entry<R>) -> u64 {
        self.gds_floor.load(Ordering::Relaxed).saturating_add(u64::from(entry.cost))
    }

    /// [`Self::touch`] for an entry nobody else can see yet (A9, before it is
    /// findable): the same stamps as `touch` gives a fresh entry (both start
    /// at 0), stored plainly through `&mut` instead of by `fetch_max`.
    #[inline]
    pub(super) fn touch_new(&self, entry: &mut Entry<R>) {
        if !self.limits_active {
            return;
        }
        debug_assert!(*entry.last_use.get_mut() == 0 && *entry.priority.get_mut() == 0, "touch_new on a used entry");
        let now = self.clock.fetch_add(1, Ordering::Relaxed) + 1;
        *entry.last_use.get_mut() = now;
        if self.cost_aware() {
            *entry.priority.get_mut() = self.gds_priority(entry);
        }
    }

    //= spec.md#S2.5
    /// Every findable entry leaves the lookup (unleased ones are deregistered
    /// now, leased ones at their last release).
    pub fn flush(&self) {
        let shared = self.shared_slow();
        let mut deregs = DeregList::new(self, shared);
        let mut st = self.write(shared);
        self.drain(shared, &mut st, &mut deregs);
        // LN5 for every entry in one pass over the lanes (and at most one
        // heavy barrier), instead of a pass per memoized entry in `retire`:
        // a cache of 10⁵ entries once took ~900 instructions an entry to
        // destroy. Memos are made under the lock shared, so none points to
        // an entry from here on, and `retire` may skip its own revoke.
        self.revoke_all(shared);
        for (_, slot) in st.index.take_all() {
            indexed(&slot).memoized.store(false, Ordering::Relaxed);
            self.retire(shared, &mut st, slot, &mut deregs, false, false);
        }
        st.order.clear();
        st.noted.clear();
        shared.over_limit.store(false, Ordering::SeqCst);
        st.unlock();
        deregs.finish();
    }

    //= spec.md#S2.8
    /// Every unleased findable entry leaves the lookup and is deregistered;
    /// leased ones stay. For applications short of pinnable memory; the cache
    /// trims by itself when the registrar fails with ENOMEM/EAGAIN (S5.4).
    pub fn trim(&self) {
        let shared = self.shared_slow();
        let mut deregs = DeregList::new(self, shared);
        let mut st = self.write(shared);
        let noted = self.note_all_unleased(shared, &mut st);
        self.drain(shared, &mut st, &mut deregs);
        self.evict_all_unleased(shared, &mut st, &mut deregs, &noted);
        st.unlock();
        deregs.finish();
    }
}

/// Here, not with `Cache` in `mod.rs` (layer 3), because it starts with a
/// flush (S2.5, this layer).
impl<R: Registrar> Drop for Cache<R> {
    fn drop(&mut self) {
        // F1 first: a forked child must not deregister the parent's registrations.
        // Leased entries (only possible if a lease was leaked with
        // mem::forget) are leaked with it.
        self.flush();
        // Last: the flush's callbacks may re-enter the C API, whose
        // `mrcache_acquire` reads the generation (`prefetch_acquire`)
        // before its re-entry check refuses the call.
        self.free_generations();
    }
}

#[cfg(test)]
mod tests {
    use crate::registrar::counting::CountingRegistrar;
    use crate::{Cache, CacheConfig};
    use mrcache_types::Access;
    use std::cell::Cell;

    thread_local! {
        /// Teeth for the debug check of `note_victims`: the note stops one
        /// entry short of the excess.
        pub(super) static SHORT_NOTE: Cell<bool> = const { Cell::new(false) };
    }

    /// Three buffers through a cache of two: the third miss evicts the
    /// least recently used one.
    fn three_through_two() -> u64 {
        let mut cfg = CacheConfig::explicit();
        cfg.contract.limits.max_regions = Some(2);
        let c = Cache::new(CountingRegistrar::default(), cfg);
        for i in 0..3u64 {
            c.acquire(0x10_0000 + i * 0x10_0000, 4096, Access::LOCAL_WRITE).expect("acquire").release();
        }
        c.stats().evictions
    }

    /// A miss over a limit of two while this thread holds a lane lease on
    /// the least recently used entry A: the note revokes A's slot, sees the
    /// lease as a pin and evicts B instead. Returns whether A was still
    /// cached afterwards (its next acquire a hit).
    fn lane_leased_lru_entry(skip_revoke: bool) -> bool {
        let mut cfg = CacheConfig::explicit();
        cfg.contract.limits.max_regions = Some(2);
        cfg.faults.note_skips_revoke = skip_revoke;
        let c = Cache::new(CountingRegistrar::default(), cfg);
        let (a, b, z) = (0x10_0000u64, 0x20_0000u64, 0x30_0000u64);
        let rw = Access::LOCAL_WRITE;
        c.acquire(a, 4096, rw).expect("A misses").release();
        c.acquire(a, 4096, rw).expect("A1 hit: A memoized in this lane").release();
        c.acquire(b, 4096, rw).expect("B misses").release();
        let held = c.acquire(a, 4096, rw).expect("a lane hit on A");
        assert_eq!(c.diagnostics().lane_hits, 1, "the lease on A is a lane lease");
        c.acquire(b, 4096, rw).expect("B hits: A is the least recently used").release();
        c.acquire(z, 4096, rw).expect("Z misses and evicts").release();
        drop(held);
        let a_cached = c.acquire(a, 4096, rw).expect("A again").hit();
        a_cached
    }

    #[test]
    fn the_note_sees_a_lane_lease_and_evicts_the_next_entry() {
        assert!(lane_leased_lru_entry(false), "A, leased on the lane, was evicted");
    }

    /// Teeth: a note that does not revoke misses the lane lease and evicts
    /// the leased entry (the checker's `note-skips-revoke`).
    #[test]
    fn a_note_without_the_revoke_evicts_the_lane_leased_entry() {
        assert!(!lane_leased_lru_entry(true), "the note without its revoke kept A");
    }

    #[test]
    fn the_note_covers_the_excess() {
        assert_eq!(three_through_two(), 1);
    }

    #[test]
    fn a_short_note_is_caught_by_the_full_note_check() {
        if !cfg!(debug_assertions) {
            return; // the check exists in debug builds only
        }
        SHORT_NOTE.with(|s| s.set(true));
        let r = std::panic::catch_unwind(three_through_two);
        SHORT_NOTE.with(|s| s.set(false));
        let msg = r.expect_err("a short note went unnoticed");
        let msg = msg.downcast_ref::<String>().map(String::as_str).unwrap_or("");
        assert!(msg.contains("the noted prefix ran out before the full note"), "{msg}");
    }
}
