//! The dereg list and the unlock that ends an operation's last exclusive
//! section (spec.md#A11: "The last exclusive section of an operation ends
//! so"), as in the impl's `cache/dereg.rs`.

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
    /// With [`Ctx::drain_rounds`], a thread's unlock drains nothing: the
    /// operation's post-unlock drain ([`Ctx::end_section`]) does, in steps
    /// of its own.
    pub(super) fn unlock_exclusive(&mut self, a: Actor) {
        assert_eq!(self.s.lock, Lock::Exclusive(a), "{} unlocks a lock it does not hold", actor_name(a));
        let skip = self.mutant(Mutant::QueueNeverDrained) || self.mutant(Mutant::HolderSkipsDrain) || (a != MONITOR && self.drain_rounds());
        if !skip && (!self.s.queue.is_empty() || !self.popped_mut(a).is_empty()) {
            note!(self, "{} drains the queue before it unlocks (events queued while it held the lock)", actor_name(a));
            self.drain_queue(a);
        }
        self.s.lock = Lock::Free;
        self.perform_dereg(a);
    }
}

impl Ctx<'_> {
    /// A11's post-unlock drain in rounds (`CheckConfig::drain_rounds`; the
    /// lanes keep their one-round `Pc::A1Drain`).
    pub(super) fn drain_rounds(&self) -> bool {
        self.m.cfg.drain_rounds && !self.m.cfg.lanes
    }

    /// The end of thread `t`'s last exclusive section in an operation (A3's
    /// and A8's hits, A11, A5's failure, A7's last retry, R2, H2): unlock,
    /// perform the dereg list, then the post-unlock drain.
    pub(super) fn end_section(&mut self, t: usize) {
        self.unlock_exclusive(t as Actor);
        self.start_post_drain(t, false);
    }

    //= spec.md#A11
    //# after unlocking, if the queue is non-empty, try the lock exclusive and drain (H2), at most 4 rounds.
    /// With [`Ctx::drain_rounds`], thread `t` (which holds no lock) runs
    /// the post-unlock drain next, before anything else; `reader`: after an
    /// A1 hit (its lock was shared).
    pub(super) fn start_post_drain(&mut self, t: usize, reader: bool) {
        if !self.drain_rounds() {
            return;
        }
        let skip =
            self.mutant(Mutant::QueueNeverDrained) || self.mutant(if reader { Mutant::ReaderSkipsDrain } else { Mutant::HolderSkipsDrain });
        if !skip {
            self.thread_mut(t).post = Some(PostDrain { round: 0, locked: false });
        }
    }

    //= spec.md#H2
    //# if not, return: the holder drains after its unlock (A1, A11).
    /// One step of the post-unlock drain. Unlocked: if the queue is empty,
    /// the drain ends; else try the lock exclusive: if anyone holds it, the
    /// drain ends too (the holder checks the queue after its own unlock,
    /// which comes after this failed try, so it sees every event queued
    /// before it); if it is free, take it and drain. Locked: unlock, perform
    /// the dereg list; a hook whose try failed against this round's lock
    /// left its event for the next round, up to [`POST_DRAIN_ROUNDS`]
    /// (mutant `drain-one-round`: one, so that event stays queued).
    pub(super) fn post_drain_step(&mut self, t: usize) {
        let p = self.s.threads[t].post.expect("a post-unlock drain in progress");
        let a = t as Actor;
        if p.locked {
            self.unlock_exclusive(a);
            let rounds = if self.mutant(Mutant::DrainOneRound) { 1 } else { POST_DRAIN_ROUNDS };
            let round = p.round + 1;
            if round < rounds {
                note!(self, "A11: T{t} unlocks after its post-unlock drain's round {round}");
                self.thread_mut(t).post = Some(PostDrain { round, locked: false });
            } else {
                note!(self, "A11: T{t} unlocks after its post-unlock drain's round {round}, its last");
                self.thread_mut(t).post = None;
            }
            return;
        }
        if self.s.queue.is_empty() {
            note!(self, "A11: T{t} finds the queue empty after its unlock");
            self.thread_mut(t).post = None;
        } else if self.s.lock != Lock::Free {
            note!(
                self,
                "A11: the queue is not empty but T{t}'s try of the lock fails ({:?}): the holder drains after its unlock",
                self.s.lock
            );
            self.thread_mut(t).post = None;
        } else {
            note!(self, "A11: the queue is not empty: T{t} takes the lock exclusive (round {}) and drains", p.round + 1);
            self.lock_exclusive(a);
            self.drain_queue(a);
            self.thread_mut(t).post = Some(PostDrain { round: p.round, locked: true });
        }
    }
}
