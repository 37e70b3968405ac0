//! Eviction: the notes of spec.md A6, A10, R2 and the trim (S2.8, A5), the
//! limits (S6.4), victims (S6.3) and the LRU stamps; flush (S2.5).

use super::entry::indexed;
use super::entry::Entry;
use super::Cache;
use super::dereg::DeregList;
use super::generation::{Shared, State};
use super::stats::inc;
use crate::registrar::Registrar;
use crate::sync::Ordering;
use mrcache_types::config::EvictionPolicy;

/// Ids of the entries an eviction pass may take (see [`Cache::note_unleased`]).
#[derive(Default)]
pub(super) struct Noted(pub(super) Vec<u64>);

impl Noted {
    pub(super) fn contains(&self, id: u64) -> bool {
        self.0.binary_search(&id).is_ok()
    }
}

impl<R: Registrar> Cache<R> {
    pub(super) fn over_limits(&self, st: &State<R>) -> bool {
        let l = &self.config.contract.limits;
        l.max_regions.is_some_and(|m| st.index.len() as u64 > m)
            || l.max_pinned_bytes.is_some_and(|m| st.cached_bytes > m)
    }

    //= spec.md#S6.3
    /// The next victim among unleased findable entries: least (last_use, id)
    /// for LRU, least (H, last_use, id) for GreedyDual-Size.
    /// Returns `(first page, id, priority)`.
    pub(super) fn victim(&self, st: &State<R>, noted: &Noted) -> Option<(u64, u64, u64)> {
        let cost_aware = self.config.contract.eviction == EvictionPolicy::CostAware;
        // (sort key, first page, id, priority) of the best candidate so far.
        type Candidate = ((u64, u64, u64), u64, u64, u64);
        let mut best: Option<Candidate> = None;
        for (s, slot) in st.index.iter() {
            let e = indexed(slot);
            // Noted unleased and not leased since (an entry is never leased
            // again once unleased under our lock: leasing needs the lock).
            if !noted.contains(slot.id) || e.state.leases() != 0 {
                continue;
            }
            let last = e.last_use.load(Ordering::Relaxed);
            let prio = e.priority.load(Ordering::Relaxed);
            let key = if cost_aware { (prio, last, slot.id) } else { (last, slot.id, 0) };
            let better = match &best {
                None => true,
                Some(b) => key < b.0,
            };
            if better {
                best = Some((key, s.first, slot.id, prio));
            }
        }
        best.map(|(_, first, id, prio)| (first, id, prio))
    }

    /// A6 / R2 / S2.8: the findable entries unleased now, read (SeqCst)
    /// after raising the over-limit flag if `raise_flag`. Taken *before* the
    /// drain: an event queued before a release this note sees was pushed
    /// before the note (the release came after the event returned), so the
    /// drain applies it before any victim is chosen. Releases after the note
    /// are treated as leased (they take effect after this operation) and, with
    /// the flag raised, run R2 themselves.
    pub(super) fn note_unleased(&self, shared: &Shared<R>, st: &State<R>, raise_flag: bool) -> Noted {
        if raise_flag {
            shared.over_limit.store(true, Ordering::SeqCst);
        }
        //= spec.md#LN5
        //# A6 (when it notes), R2 and trim revoke every slot before they note
        self.revoke(shared, |_| true);
        let mut ids: Vec<u64> = st
            .index
            .iter()
            .filter(|(_, slot)| indexed(slot).state.leases() == 0)
            .map(|(_, slot)| slot.id)
            .collect();
        ids.sort_unstable();
        Noted(ids)
    }

    /// Whether inserting one more entry of `bytes` could put the cache over a
    /// limit (A6): the entry count or the cached bytes after the insert.
    pub(super) fn could_exceed_limits(&self, st: &State<R>, bytes: u64) -> bool {
        let l = &self.config.contract.limits;
        self.limits_active
            && (l.max_regions.is_some_and(|m| st.index.len() as u64 + 1 > m)
                || l.max_pinned_bytes.is_some_and(|m| st.cached_bytes.saturating_add(bytes) > m))
    }

    /// Clears the over-limit flag when within limits (an exit that evicts
    /// nothing after [`Cache::note_unleased`] raised it).
    pub(super) fn settle_over_limit(&self, shared: &Shared<R>, st: &State<R>) {
        if self.limits_active && !self.over_limits(st) {
            shared.over_limit.store(false, Ordering::SeqCst);
        }
    }

    //= spec.md#S6.4
    //= spec.md#A10
    /// Evicts while over a limit, victims among the `noted` entries. The flag
    /// stays raised if still over (every noted entry is gone or leased): a
    /// release after the note saw it and runs R2.
    pub(super) fn enforce_limits<'c>(
        &'c self,
        shared: &'c Shared<R>,
        st: &mut State<R>,
        deregs: &mut DeregList<'c, R>,
        noted: &Noted,
    ) {
        if !self.limits_active {
            return;
        }
        while self.over_limits(st) {
            let Some((first, id, prio)) = self.victim(st, noted) else { break };
            self.gds_floor.fetch_max(prio, Ordering::Relaxed);
            inc(&self.counters.evictions);
            self.uncache(shared, st, first, id, deregs, false);
        }
        self.settle_over_limit(shared, st);
    }

    /// S2.8 / S5.4: every noted entry still findable and unleased leaves
    /// (pressure eviction).
    pub(super) fn evict_all_unleased<'c>(
        &'c self,
        shared: &'c Shared<R>,
        st: &mut State<R>,
        deregs: &mut DeregList<'c, R>,
        noted: &Noted,
    ) {
        let unleased: Vec<(u64, u64)> = st
            .index
            .iter()
            .filter(|(_, slot)| noted.contains(slot.id) && indexed(slot).state.leases() == 0)
            .map(|(s, slot)| (s.first, slot.id))
            .collect();
        for (first, id) in unleased {
            inc(&self.counters.pressure_evictions);
            self.uncache(shared, st, first, id, deregs, false);
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
        let now = self.clock.fetch_add(1, Ordering::Relaxed) + 1;
        entry.last_use.store(now, Ordering::Relaxed);
        if self.config.contract.eviction == EvictionPolicy::CostAware {
            entry.priority.store(self.gds_floor.load(Ordering::Relaxed).saturating_add(entry.cost), Ordering::Relaxed);
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
        for (_, slot) in st.index.take_all() {
            self.retire(shared, &mut st, slot, &mut deregs, false);
        }
        shared.over_limit.store(false, Ordering::SeqCst);
        drop(st);
        deregs.perform();
    }

    //= spec.md#S2.8
    /// Every unleased findable entry leaves the lookup and is deregistered;
    /// leased ones stay. For applications short of pinnable memory; the cache
    /// trims by itself when the registrar fails with ENOMEM/EAGAIN (S5.4).
    pub fn trim(&self) {
        let shared = self.shared_slow();
        let mut deregs = DeregList::new(self, shared);
        let mut st = self.write(shared);
        let noted = self.note_unleased(shared, &st, false);
        self.drain(shared, &mut st, &mut deregs);
        self.evict_all_unleased(shared, &mut st, &mut deregs, &noted);
        drop(st);
        deregs.perform();
    }
}
