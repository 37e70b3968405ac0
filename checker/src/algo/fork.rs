//! The fork (spec.md#F1, S2.6; impl: `impl/src/cache/fork.rs` over
//! `impl/src/cache/os.rs`), as a script op: thread `t` forks the process
//! and goes on in the child, whatever the other threads are doing in the
//! cache (holding its lock, a lease, a registration in flight, a release
//! half done): they do not exist in the child. Their operations never
//! return (they stay pending in the history), their locks, queued events,
//! in-flight records and dereg lists stay with the parent's generation.
//! The child's next operation starts with F1's check, which installs a
//! fresh generation before it touches any lock; nothing else runs in the
//! child before it, so the model installs it in the fork's step.
//!
//! Invariants: after the fork every registration made before it is
//! `forgotten` (not findable, never deregistered: the child shares the
//! parent's registrar descriptors), a lease on one releases as a no-op, the
//! lock is free and the queue and windows are empty. Every page's frames
//! change (the pinned pages are copied for the child), so a hit on a
//! forgotten registration violates P2.
//!
//! Sync monitor only: the allocator hook follows the child, but a
//! userfaultfd monitor does not (the child caches nothing until it has
//! one, the one divergence from the contract, S2.6), and without lanes and
//! A0, whose per-thread state would vanish too.

use super::Ctx;
use crate::config::Mutant;
use crate::state::*;
use mrcache_types::Ret;

impl Ctx<'_> {
    //= spec.md#F1
    //# in a forked child the cache forgets all entries and in-flight records without registrar calls (S2.6)
    pub(super) fn fork(&mut self, t: usize) {
        note!(self, "S2.6: T{t} forks; it goes on in the child, where no other thread exists");
        for u in 0..self.s.threads.len() {
            if u == t {
                continue;
            }
            let th = &mut self.s.threads[u];
            if th.pc != Pc::Done {
                note!(self, "F1: T{u} does not exist in the child (it was at {:?})", th.pc);
            }
            let th = &mut self.s.threads[u];
            th.pc = Pc::Done;
            th.acq = None;
            th.ev = None;
            th.inflight = None;
            th.dereg.clear();
            th.toctou.clear();
            th.noted.clear();
            th.waiting = false;
            th.prelocked = false;
            th.failing = false;
        }
        // The child's frames: every page is a copy (a pinned page is copied
        // at the fork), new for P2.
        for g in self.s.gens.iter_mut().chain(self.s.done_gens.iter_mut()) {
            *g += 1;
        }
        if self.mutant(Mutant::ForkKeepsGeneration) {
            note!(self, "F1 (mutant `fork-keeps-generation`): the child keeps the parent's generation: its lock, entries and queue");
        } else {
            //= spec.md#F1
            //# every operation first checks whether it runs in a fork child of the process that made the cache
            note!(
                self,
                "F1: the child's next operation installs a fresh generation: every entry forgotten, the lock free, the queue empty"
            );
            for r in self.s.regs.iter_mut() {
                r.forgotten = true;
                r.findable = false;
            }
            self.s.lock = Lock::Free;
            self.s.queue.clear();
            self.s.windows.clear();
            self.s.over_limit = false;
        }
        // `start_op` logged the invocation.
        self.finish(t, Ret::Done);
    }
}
