//! Release: spec.md R1, R2 (the lane release LN3 is in [`super::lanes`]).

use super::Ctx;
use crate::config::Mutant;
use crate::state::*;
use mrcache_types::{OpError, Ret};

impl Ctx<'_> {
    //= spec.md#R1
    pub(super) fn r1(&mut self, t: usize, lease: u64) {
        // The lease is `t`'s, or handed over by the thread that took it.
        let Some((by, i)) =
            self.s.threads.iter().enumerate().find_map(|(u, th)| th.held.iter().position(|(l, _)| *l == lease).map(|i| (u, i)))
        else {
            // The acquire failed (E6), so the lease is not held.
            return self.finish(t, Ret::Failed { error: OpError::UnknownLease { lease } });
        };
        let (_, h) = self.thread_mut(by).held.remove(i);
        if self.s.regs[h as usize].forgotten {
            //= spec.md#S2.6
            //# Leases held at the
            //# fork stay held (their names give E3) until released, which is a no-op in the
            //# child.
            note!(self, "S2.6: T{t} releases L{lease} on #{h}, forgotten at the fork: a no-op");
            return self.finish(t, Ret::Done);
        }
        if self.release_steps() {
            return self.r1_touch(t, h);
        }
        let r = &mut self.s.regs[h as usize];
        // Mutant `lease-count-saturates` may have lost a lease: the count is
        // then 0 under a held one.
        r.leases = r.leases.saturating_sub(1);
        let (left, invalid, findable) = (r.leases, r.invalid, r.findable);
        // R1 touches the LRU stamp *before* its decrement (mutant `release-touch-after-decrement` touches
        // after it, mutant `release-no-lru-touch` never).
        let late = self.mutant(Mutant::ReleaseTouchAfterDecrement) && self.m.cfg.has_limits();
        if findable && !self.mutant(Mutant::ReleaseNoLruTouch) && !late {
            self.touch(h);
        }
        note!(self, "R1: T{t} decrements #{h} to {left}{}", if invalid { " (INVALID)" } else { "" });
        if left == 0 && invalid {
            //= spec.md#A-H
            //# a release owns it iff its decrement took the count from 1 to 0 with
            //# INVALID set.
            self.deregister(h);
            self.finish(t, Ret::Done);
            return;
        }
        let r2 = left == 0 && self.s.over_limit && !self.mutant(Mutant::NoReleaseEviction);
        if late && findable {
            self.thread_mut(t).pc = Pc::R1Touch(h, r2);
        } else if r2 {
            self.thread_mut(t).pc = Pc::R2;
        } else {
            self.finish(t, Ret::Done);
        }
    }

    /// R1's atomics as steps of their own (`CheckConfig::release_steps`,
    /// with limits: without them the cache neither touches nor loads the
    /// flag, and R1 is its decrement alone).
    pub(super) fn release_steps(&self) -> bool {
        self.m.cfg.release_steps && self.m.cfg.has_limits()
    }

    /// R1's first step (`release_steps`): the LRU touch, while the lease
    /// still keeps the entry leased, so that no note (A6, R2) reads the
    /// entry as unleased with its old stamp. The touch's own atomics (the
    /// clock's add, the stamp's max) are one step here: the entry is leased
    /// across them, and a note reads the stamps of unleased entries only.
    /// The decrement is the next step.
    //= spec.md#R1
    //# The touch, the decrement and the flag's load are three atomic steps, in
    //# this order, and other threads act between them
    fn r1_touch(&mut self, t: usize, h: Handle) {
        let findable = self.s.regs[h as usize].findable;
        let late = self.mutant(Mutant::ReleaseTouchAfterDecrement);
        if findable && !self.mutant(Mutant::ReleaseNoLruTouch) && !late {
            note!(self, "R1: T{t} touches #{h}'s LRU stamp (before its decrement)");
            self.touch(h);
        }
        // Mutant `release-flag-before-decrement`: the flag's load moves
        // before the decrement, so an A6 between them goes unseen.
        let flag = self.mutant(Mutant::ReleaseFlagBeforeDecrement).then_some(self.s.over_limit);
        if let Some(f) = flag {
            note!(
                self,
                "R1 (mutant `release-flag-before-decrement`): T{t} loads the over-limit flag before its decrement: {}",
                if f { "set" } else { "clear" }
            );
        }
        self.thread_mut(t).pc = Pc::R1Dec { h, flag };
    }

    /// R1's decrement of `h`'s state word (`release_steps`): the handoff
    /// if it took the count to 0 with INVALID set; the flag's load next if
    /// it took it to 0 without.
    pub(super) fn r1_dec(&mut self, t: usize, h: Handle, flag: Option<bool>) {
        let r = &mut self.s.regs[h as usize];
        r.leases = r.leases.saturating_sub(1);
        let (left, invalid, findable) = (r.leases, r.invalid, r.findable);
        note!(self, "R1: T{t} decrements #{h} to {left}{}", if invalid { " (INVALID)" } else { "" });
        if left == 0 && invalid {
            self.deregister(h);
            return self.finish(t, Ret::Done);
        }
        if self.mutant(Mutant::ReleaseTouchAfterDecrement) && findable {
            self.thread_mut(t).pc = Pc::R1Touch(h, left == 0);
            return;
        }
        self.r1_unleased(t, left == 0, flag);
    }

    /// After R1's decrement (and, in mutant `release-touch-after-decrement`,
    /// its late touch): done unless the count reached 0; then the flag's
    /// load, a step of its own (or the value loaded before the decrement,
    /// in mutant `release-flag-before-decrement`).
    pub(super) fn r1_unleased(&mut self, t: usize, unleased: bool, flag: Option<bool>) {
        match (unleased, flag) {
            (false, _) => self.finish(t, Ret::Done),
            (true, None) => self.thread_mut(t).pc = Pc::R1Flag,
            (true, Some(f)) => self.r1_flag_read(t, f),
        }
    }

    /// R1's load of the over-limit flag (`release_steps`), after a decrement
    /// that took the count to 0 without INVALID: R2 if it is set.
    pub(super) fn r1_flag(&mut self, t: usize) {
        let f = self.s.over_limit;
        note!(self, "R1: T{t} loads the over-limit flag: {}", if f { "set" } else { "clear" });
        self.r1_flag_read(t, f);
    }

    fn r1_flag_read(&mut self, t: usize, set: bool) {
        if set && !self.mutant(Mutant::NoReleaseEviction) {
            self.thread_mut(t).pc = Pc::R2;
        } else {
            self.finish(t, Ret::Done);
        }
    }

    //= spec.md#R2
    pub(super) fn r2(&mut self, t: usize) {
        note!(self, "R2: T{t} takes the lock exclusive, notes the unleased entries, drains and evicts (A10's passes)");
        self.lock_exclusive(t as Actor);
        let excess = self.m.excess(self.s, 0);
        self.note_covering(t, excess);
        self.drain_queue(t as Actor);
        self.evict_passes(t);
        self.settle_over_limit();
        self.end_section(t);
    }
}
