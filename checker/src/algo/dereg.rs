//! The dereg list and the unlock that ends every exclusive section
//! (spec.md#A11: "Every exclusive section ends so"), as in the impl's
//! `cache/dereg.rs`.

use super::Ctx;
use crate::config::Mutant;
use crate::state::*;

impl Ctx<'_> {
    pub(super) fn perform_dereg(&mut self, a: Actor) {
        for h in std::mem::take(self.dereg_list(a)) {
            self.deregister(h);
        }
    }

    //= spec.md#H2
    //= spec.md#A11
    /// Unlock (exclusive), then perform the dereg list. The holder first drains
    /// what hooks queued while it held the lock: H2's "the holder ... drains".
    /// Without it (mutant `queue-never-drained`), an event queued while the lock was busy waits for
    /// a later slow path, which may never come (L1).
    pub(super) fn unlock_exclusive(&mut self, a: Actor) {
        assert_eq!(self.s.lock, Lock::Exclusive(a), "{} unlocks a lock it does not hold", actor_name(a));
        let skip = self.mutant(Mutant::QueueNeverDrained) || self.mutant(Mutant::HolderSkipsDrain);
        if !skip && (!self.s.queue.is_empty() || !self.popped_mut(a).is_empty()) {
            note!(self, "{} drains the queue before it unlocks (events queued while it held the lock)", actor_name(a));
            self.drain_queue(a);
        }
        self.s.lock = Lock::Free;
        self.perform_dereg(a);
    }
}
