//! Eviction: the notes and evictions of spec.md A6, A10, R2 and the trim
//! (A5, S2.8); limits (S6.4), victims (S6.3) and the LRU stamps.

use super::{AlgoModel, Ctx};
use crate::config::Mutant;
use crate::state::*;

impl AlgoModel {
    /// A6: whether inserting one more entry of `bytes` could exceed a limit.
    pub fn could_exceed_limits(&self, s: &State, bytes: u64) -> bool {
        let n = s.findable_count() as u64 + 1;
        let cached: u64 = s.regs.iter().filter(|r| r.findable).map(|r| r.span.bytes()).sum::<u64>() + bytes;
        self.cfg.max_regions.is_some_and(|m| n > m) || self.cfg.max_pinned_bytes.is_some_and(|m| cached > m)
    }

    pub fn over_limits(&self, s: &State) -> bool {
        let excess = self.excess(s, 0);
        excess.entries > 0 || excess.bytes > 0
    }

    /// What the findable entries, plus `adding` (one entry of that many
    /// bytes; 0: none), exceed the limits by.
    pub(super) fn excess(&self, s: &State, adding: u64) -> Excess {
        let n = s.findable_count() as u64 + u64::from(adding > 0);
        let bytes: u64 = s.regs.iter().filter(|r| r.findable).map(|r| r.span.bytes()).sum::<u64>() + adding;
        Excess {
            entries: self.cfg.max_regions.map_or(0, |m| n.saturating_sub(m)),
            bytes: self.cfg.max_pinned_bytes.map_or(0, |m| bytes.saturating_sub(m)),
        }
    }

    //= spec.md#S6.3
    /// The LRU victim among the noted findable entries (ties by id). Noted
    /// entries are unleased until A10 (their slots were revoked before the
    /// note, and no lane or A1 hit reaches them under the lock exclusive);
    /// the lease count is not read again, as in the cache.
    pub(super) fn victim(&self, s: &State, noted: &[Handle]) -> Option<Handle> {
        s.regs
            .iter()
            .enumerate()
            .filter(|(h, r)| r.findable && noted.contains(&(*h as Handle)))
            .min_by_key(|(_, r)| self.policy_key(r))
            .map(|(h, _)| h as Handle)
    }

    //= spec.md#S6.3
    //# The victim has the least `H` (ties: LRU, then id)
    /// An entry's place in the victim order: LRU (stamp, id), or with
    /// cost-aware eviction (priority, stamp, id). Mutant
    /// `gds-ignores-priority`: LRU under cost-aware eviction too.
    pub(super) fn policy_key(&self, r: &Reg) -> (u32, u8, u8) {
        if self.cfg.cost_aware && !self.mutant(Mutant::GdsIgnoresPriority) {
            (r.priority, r.last_use, r.id)
        } else {
            (0, r.last_use, r.id)
        }
    }
}

/// Entries over `max_regions` and bytes over `max_pinned_bytes`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Excess {
    pub(super) entries: u64,
    pub(super) bytes: u64,
}

impl Ctx<'_> {
    //= spec.md#S6.3
    //# A use whose entry's stamp is the clock's (the most recent use) may
    //# leave the stamp as it is
    /// A use of `h` (S6.3): a new stamp from the clock. With
    /// `CheckConfig::restamp_skip`, not if `h`'s stamp is the clock's (a
    /// stamped entry: A9's first stamp is always taken), as the cache skips it (the load of the stamp, the clock's, the add and
    /// the max are one step here: `h` is leased across them, and a note
    /// reads the stamps of unleased entries only).
    pub(super) fn touch(&mut self, h: Handle) {
        if !self.m.cfg.has_limits() {
            return;
        }
        let stamp = self.s.regs[h as usize].last_use;
        // Mutant `lru-skips-restamp` (the cache's fault switch): only the
        // creation stamps an entry.
        if self.mutant(Mutant::LruSkipsRestamp) && stamp != 0 {
            return;
        }
        // Mutant `restamp-skip-when-recent`: also a stamp one use older.
        let recent = if self.mutant(Mutant::RestampSkipWhenRecent) { stamp + 1 >= self.s.clock } else { stamp == self.s.clock };
        // A9's first stamp (0: never used) is always taken, as the cache's
        // `touch_new` takes it.
        // Cost-aware, the skip also needs the priority at the floor plus
        // the cost already, as the cache's skip does.
        let gds = self.gds_priority(h);
        let priority_current = !self.m.cfg.cost_aware || self.s.regs[h as usize].priority >= gds;
        if self.m.cfg.restamp_skip && stamp != 0 && recent && priority_current {
            note!(self, "S6.3: #{h}'s stamp {stamp} is the clock's ({}): no restamp", self.s.clock);
            return;
        }
        self.s.clock += 1;
        self.s.regs[h as usize].last_use = self.s.clock;
        if self.m.cfg.cost_aware {
            let r = &mut self.s.regs[h as usize];
            r.priority = r.priority.max(gds);
        }
    }

    //= spec.md#S6.3
    //# ns, `H = floor + ⌊(16000 + ⌊bytes·6/100⌋) / pages⌋`, set on every use:
    /// GreedyDual-Size's `H` for a use of `h` now: the floor plus its
    /// per-page cost.
    fn gds_priority(&self, h: Handle) -> u32 {
        let pages = u64::from(self.s.regs[h as usize].span.len());
        let cost = mrcache_types::config::per_page_cost_ns(pages, mrcache_types::PAGE_SIZE);
        self.s.gds_floor.saturating_add(u32::try_from(cost).unwrap_or(u32::MAX))
    }

    //= spec.md#A6
    //# The note may stop early: reading the unleased entries in policy order
    //# (S6.3) and noting the least ones until they cover the insert's excess
    /// A6 / R2: with limits, note, *before* the drain,
    /// the least unleased findable entries in policy order until they cover
    /// `excess` (the prefix form of the note, which the cache implements;
    /// A10 then evicts exactly what it would from a note of every unleased
    /// entry). Each noted entry's lane slots are revoked before its count is
    /// read (LN5; a revoke that pins makes it leased, and the note moves on):
    /// here the dry run records the prefix's revokes and
    /// [`Ctx::lane_prephase`] runs them first, until the prefix it computes
    /// has no live slot. Mutant `note-skips-revoke` revokes nothing (lane
    /// leases go unseen); `note-one-short` notes one entry fewer.
    /// Returns whether the note fell short of `excess` (every unleased entry
    /// noted, and still less).
    pub(super) fn note_unleased(&mut self, t: usize, excess: Excess) -> bool {
        if !self.m.cfg.has_limits() {
            return false;
        }
        let mut unleased: Vec<Handle> =
            (0..self.s.regs.len()).filter(|&h| self.s.regs[h].findable && self.s.regs[h].leases == 0).map(|h| h as Handle).collect();
        unleased.sort_by_key(|&h| self.m.policy_key(&self.s.regs[h as usize]));
        let (mut entries, mut bytes) = (0u64, 0u64);
        let mut noted: Vec<Handle> = unleased
            .into_iter()
            .take_while(|&h| {
                let more = entries < excess.entries || bytes < excess.bytes;
                entries += 1;
                bytes += self.s.regs[h as usize].span.bytes();
                more
            })
            .collect();
        let covered = noted.iter().fold((0u64, 0u64), |(e, b), &h| (e + 1, b + self.s.regs[h as usize].span.bytes()));
        let short = covered.0 < excess.entries || covered.1 < excess.bytes;
        if self.mutant(Mutant::NoteOneShort) {
            noted.pop();
        }
        //= spec.md#LN5
        //# A6 and R2 revoke the slots of each entry before they read its
        //# lease count for the note
        if !self.mutant(Mutant::NoteSkipsRevoke) {
            for &h in &noted {
                self.revoke(t as Actor, h);
            }
        }
        noted.sort_unstable();
        note!(self, "T{t} notes the least unleased entries covering {excess:?}: {noted:?}");
        self.thread_mut(t).noted = noted;
        short
    }

    //= spec.md#A6
    //# If the note falls short of the excess (it noted every unleased
    //# entry), raise the over-limit flag, then note again
    /// A6 / R2: the note, and if it falls short, the over-limit flag, then a
    /// second note (both before the drain; one step here, sequentially
    /// consistent in the cache): a release the first note saw leased is
    /// seen by the second or reads the flag and runs R2. Mutants:
    /// `over-limit-flag-late` and `flag-at-second-pass` take one note only
    /// (and raise the flag in A10).
    pub(super) fn note_covering(&mut self, t: usize, excess: Excess) {
        let short = self.note_unleased(t, excess);
        if !short || self.mutant(Mutant::OverLimitFlagLate) || self.mutant(Mutant::FlagAtSecondPass) {
            return;
        }
        note!(self, "T{t}'s note falls short: raise the over-limit flag and note again");
        self.s.over_limit = true;
        self.note_unleased(t, excess);
    }

    /// Clears the over-limit flag when within limits.
    pub(super) fn settle_over_limit(&mut self) {
        if self.m.cfg.has_limits() && !self.m.over_limits(self.s) {
            self.s.over_limit = false;
        }
    }

    //= spec.md#A10
    pub(super) fn evict(&mut self, a: Actor) {
        let noted = std::mem::take(&mut self.s.threads[a as usize].noted);
        while self.m.over_limits(self.s) {
            let Some(v) = self.m.victim(self.s, &noted) else { break };
            note!(self, "A10: evict #{v}");
            if self.m.cfg.cost_aware && !self.mutant(Mutant::GdsFloorNotRaised) {
                //= spec.md#S6.3
                //# pages. The victim has the least `H` (ties: LRU, then id); `floor` becomes
                //# the victim's `H` (never decreasing, since every `H ≥ floor`).
                self.s.gds_floor = self.s.gds_floor.max(self.s.regs[v as usize].priority);
            }
            self.revoke(a, v);
            let r = &mut self.s.regs[v as usize];
            r.findable = false;
            // A leased victim (only under mutant `note-skips-revoke`) leaves
            // the index as on invalidation: deregistered at its last release.
            if r.leases == 0 {
                self.dereg_list(a).push(v);
            } else {
                r.invalid = true;
            }
        }
    }

    //= spec.md#A10
    //# If the pass ends over a limit (every noted entry gone or leased), A6's
    //# note fell short and raised the over-limit flag before its second note
    /// A10 and R2's eviction: a pass on the note taken. Mutant
    /// `flag-at-second-pass` then runs the second pass this step once had:
    /// if still over a limit, raise the flag, note again, drain and evict
    /// again (its drain may apply an event queued after a release that note
    /// sees returned). Mutant `over-limit-flag-late` raises the flag in a
    /// later step, without a second note.
    pub(super) fn evict_passes(&mut self, t: usize) {
        self.evict(t as Actor);
        if !self.m.over_limits(self.s) || !self.mutant(Mutant::FlagAtSecondPass) {
            return;
        }
        note!(self, "A10: still over a limit: raise the over-limit flag, note again, drain and evict");
        self.s.over_limit = true;
        let excess = self.m.excess(self.s, 0);
        self.note_unleased(t, excess);
        self.drain_queue(t as Actor);
        self.evict(t as Actor);
    }

    //= spec.md#A10
    //# Clear the flag when the pass ends within limits, else leave it
    //# raised.
    pub(super) fn a10(&mut self, t: usize) {
        self.evict_passes(t);
        if self.mutant(Mutant::OverLimitFlagLate) && self.m.over_limits(self.s) {
            self.thread_mut(t).pc = Pc::A10b;
        } else {
            self.settle_over_limit();
            self.a11(t);
        }
    }

    /// Mutant `over-limit-flag-late`'s late flag.
    pub(super) fn a10b(&mut self, t: usize) {
        note!(self, "A10: still over a limit, every noted entry leased: raise the over-limit flag (no second note)");
        self.s.over_limit = true;
        self.a11(t);
    }
}
