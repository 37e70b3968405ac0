//! The user's flush of the cache (spec.md#S2.5; impl: `Cache::flush` in
//! `impl/src/cache/evict.rs`): a script op, invoked in one step and run in
//! the next as one exclusive section (the lock, the drain, LN5 for every
//! slot, every findable entry out, the over-limit flag cleared, the unlock
//! and its dereg list). Invariant: after the section no entry is findable;
//! an unleased one is on the flusher's dereg list, a leased one is INVALID
//! and deregistered by its last release (A-H). Entries taken out one by one
//! under the lock are one step: each is one OR on its own state word, which
//! no other entry's step reads, and nothing but A0 and releases touch the
//! words while the lock is held exclusive.

use super::Ctx;
use crate::config::Mutant;
use crate::state::*;
use mrcache_types::Ret;

impl Ctx<'_> {
    //= spec.md#S2.5
    //# **S2.5 `flush`.** Every findable entry leaves the lookup; S3.2 applies.
    pub(super) fn flush(&mut self, t: usize) {
        let a = t as Actor;
        note!(self, "S2.5: T{t} takes the lock exclusive, drains and takes every findable entry out");
        self.lock_exclusive(a);
        self.drain_queue(a);
        self.read_and_apply_uffd(a);
        // LN5 for every slot at once, as the cache's flush does.
        self.revoke_all(a);
        for h in 0..self.s.regs.len() {
            let r = &self.s.regs[h];
            if !r.findable {
                continue;
            }
            let seen = r.leases;
            if seen > 0 && self.mutant(Mutant::FlushKeepsLeased) {
                note!(self, "S2.5 (mutant `flush-keeps-leased`): #{h} is leased: it stays findable");
                continue;
            }
            self.s.regs[h].findable = false;
            //= spec.md#A-H
            //# invalidation sets INVALID with one atomic OR on the state word and
            //# owns the deregistration iff the count it saw was 0
            self.s.regs[h].invalid = true;
            if seen == 0 || self.mutant(Mutant::FlushDeregsLeased) {
                self.dereg_list(a).push(h as Handle);
            }
            note!(self, "S2.5: #{h} leaves the index ({})", if seen == 0 { "unleased: dereg list" } else { "leased: INVALID" });
        }
        self.s.over_limit = false;
        self.unlock_exclusive(a);
        self.finish(t, Ret::Done);
    }
}
