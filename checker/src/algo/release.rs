//! Release: spec.md R1, R2 (the lane release LN3 is in [`super::lanes`]).

use super::Ctx;
use crate::config::Mutant;
use mrcache_types::{OpError, Ret};
use crate::state::*;

impl Ctx<'_> {
    //= spec.md#R1
    pub(super) fn r1(&mut self, t: usize, lease: u64) {
        // The lease is `t`'s, or handed over by the thread that took it.
        let Some((by, i)) = self
            .s
            .threads
            .iter()
            .enumerate()
            .find_map(|(u, th)| th.held.iter().position(|(l, _)| *l == lease).map(|i| (u, i)))
        else {
            // The acquire failed (E6), so the lease is not held.
            return self.finish(t, Ret::Failed { error: OpError::UnknownLease { lease } });
        };
        let (_, h) = self.thread_mut(by).held.remove(i);
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

    //= spec.md#R2
    pub(super) fn r2(&mut self, t: usize) {
        note!(self, "R2: T{t} takes the lock exclusive, notes the unleased entries, drains and evicts (A10's passes)");
        self.lock_exclusive(t as Actor);
        let excess = self.m.excess(self.s, 0);
        self.note_covering(t, excess);
        self.drain_queue(t as Actor);
        self.evict_passes(t);
        self.settle_over_limit();
        self.unlock_exclusive(t as Actor);
    }
}
