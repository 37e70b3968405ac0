//! M4 as the monitor's algorithm (spec.md#S7.5; `CheckConfig::proof_steps`),
//! as the cache's prover runs it (`impl/src/monitor/process.rs`, `Prover`;
//! the looks and the signal in `impl/src/monitor/madvise_proof.rs`).
//!
//! A REMOVE's window (M3) is handed to the prover as it opens. The prover's
//! first step on it lists the threads and looks at each: a thread blocked
//! in another system call (here: asleep in a munmap's userfaultfd wait, or
//! in a madvise of pages that do not overlap the window), or exited, is not
//! inside the madvise; every other one may be (running, in user mode or in
//! the kernel, or in an overlapping madvise) and waits. Each later pass
//! first collects the signals whose handlers ran and forgets those of
//! exited threads, then, for each waiting thread of each window: a signal
//! of its own that was collected proves it out; a look that finds it
//! elsewhere or exited does too; one still inside gets the signal (or
//! waits on the one it has outstanding: at most one per thread). A window
//! with no thread waiting and a scan done closes (as W2).
//!
//! Invariant (why it is sound): the madvising thread cannot leave the
//! kernel before its event is read, so at the scan it is inside, and it
//! stays so until it returns; the handler runs only on a return to user
//! mode ([`AlgoModel::ack_enabled`]), after the send; so the window closes
//! only after the madvise returned. Mutants: `proof-without-ack` (a sent
//! signal counts as proof) and `proof-kernel-outside` (a thread in the
//! kernel is judged outside it, as an io_uring worker's `syscall` file
//! once misled the cache), each caught by P2 in the `+proof` families.

use super::{Action, AlgoModel, Ctx};
use crate::config::{Mutant, Span};
use crate::state::*;

/// Where a look at a thread finds it against a window's pages (the cache's
/// `Seen`; the model has no io_uring workers and every file reads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Running, or in an overlapping madvise: it may be inside.
    Inside,
    /// Blocked in another system call: not inside.
    Elsewhere,
    Exited,
}

impl AlgoModel {
    /// M4 as steps: one cache, REMOVEs.
    pub fn proof_steps(&self) -> bool {
        self.cfg.proof_steps && self.cfg.remove && self.cfg.caches == 1
    }

    fn exited(th: &Thread) -> bool {
        th.pc == Pc::Done && th.ev.is_none() && th.post.is_none() && th.toctou.is_empty()
    }

    /// Inside a system call: a release's uffd wait, a REMOVE's zap, before
    /// its return.
    fn in_kernel(th: &Thread) -> bool {
        th.ev.as_ref().is_some_and(|e| matches!(e.pc, EvPc::Wait | EvPc::BumpLast | EvPc::Return))
    }

    //= spec.md#S7.5
    //# A thread blocked in another system call,
    //# or in madvise on a range that does not overlap the event, is not inside
    //# that madvise
    /// A look at thread `t` (its `syscall` file) against `span`.
    pub fn seen(&self, s: &State, t: usize, span: Span) -> Seen {
        let th = &s.threads[t];
        if Self::exited(th) {
            return Seen::Exited;
        }
        let Some(ev) = th.ev.as_ref().filter(|_| Self::in_kernel(th)) else {
            // In user mode: `running`.
            return Seen::Inside;
        };
        if self.mutant(Mutant::ProofKernelOutside) {
            return Seen::Elsewhere;
        }
        let madvise = self.cfg.remove && ev.origin == Origin::Script;
        if th.waiting && !(madvise && ev.span.overlaps(&span)) {
            // Asleep in a munmap, or in a madvise of other pages.
            Seen::Elsewhere
        } else {
            // Running in the kernel, or asleep in an overlapping madvise.
            Seen::Inside
        }
    }

    /// The prover can take a step that changes something (between the
    /// monitor's rounds, as M4 runs on its thread). A pass that would
    /// change nothing is not offered: it would hide a deadlock (P6).
    pub fn prove_enabled(&self, s: &State) -> bool {
        if !self.proof_steps() || s.proofs.is_empty() || s.monitor.pc != MonPc::Idle || !s.monitor.toctou.is_empty() {
            return false;
        }
        let mut next = s.clone();
        self.step(&mut next, Action::Prove, None);
        next != *s
    }

    //= spec.md#S7.5
    //# A signal handler runs only on a return to user
    //# mode
    /// Thread `t` runs the proof signal's handler: one is pending and the
    /// thread is in user mode (not inside a system call), and alive.
    pub fn ack_enabled(&self, s: &State, t: usize) -> bool {
        let th = &s.threads[t];
        self.proof_steps() && th.sig == Sig::Pending && !Self::exited(th) && !Self::in_kernel(th)
    }
}

impl Ctx<'_> {
    //= spec.md#M4
    //# close a REMOVE window (as W2) only once the madvise that raised it is
    //# proven to have returned (S7.5)
    /// The prover's step: the scan of the windows opened since its last
    /// step, else one pass.
    pub(super) fn m4_prove(&mut self) {
        if self.s.proofs.iter().any(|p| !p.scanned) {
            self.proof_scan();
        } else {
            self.proof_pass();
        }
    }

    //= spec.md#S7.5
    //# After the read,
    //# the monitor thread lists the process's threads (`/proc/self/task`) and
    //# reads each one's `syscall` file.
    fn proof_scan(&mut self) {
        for i in 0..self.s.proofs.len() {
            if self.s.proofs[i].scanned {
                continue;
            }
            let span = self.s.proofs[i].span;
            let waiting: Vec<(u8, bool)> =
                (0..self.s.threads.len()).filter(|&t| self.m.seen(self.s, t, span) == Seen::Inside).map(|t| (t as u8, false)).collect();
            let names: Vec<String> = waiting.iter().map(|(t, _)| format!("T{t}")).collect();
            note!(self, "M4: the monitor lists the threads for the window on {span}: may be inside its madvise: [{}]", names.join(", "));
            let p = &mut self.s.proofs[i];
            p.waiting = waiting;
            p.scanned = true;
        }
    }

    //= spec.md#S7.5
    //# once each has acknowledged (its handler ran after the signal was
    //# sent), or has since been seen blocked in another system call, or has
    //# exited, the madvise has returned and M4 closes the window.
    fn proof_pass(&mut self) {
        // Signals resolved since the last pass: acknowledged, or their
        // thread exited (forgotten).
        for t in 0..self.s.threads.len() {
            match self.s.threads[t].sig {
                Sig::Acked => {
                    note!(self, "M4: T{t}'s acknowledgement is collected");
                    self.thread_mut(t).sig = Sig::None;
                }
                Sig::Pending if Self::exited_thread(self.s, t) => {
                    note!(self, "M4: T{t} exited with its signal pending: forgotten");
                    self.thread_mut(t).sig = Sig::None;
                }
                _ => {}
            }
        }
        let mut i = 0;
        while i < self.s.proofs.len() {
            let Proof { span, m, waiting, .. } = self.s.proofs[i].clone();
            let mut kept = Vec::new();
            for (t, mut sent) in waiting {
                let tu = t as usize;
                if sent && self.s.threads[tu].sig == Sig::None {
                    note!(self, "M4: T{t} is out of {span}'s madvise: its handler ran after the signal (or it exited)");
                    continue;
                }
                match self.m.seen(self.s, tu, span) {
                    Seen::Exited | Seen::Elsewhere => {
                        note!(self, "M4: T{t} is seen blocked elsewhere or exited: out of {span}'s madvise");
                        continue;
                    }
                    Seen::Inside => {}
                }
                if !sent {
                    //= spec.md#S7.5
                    //# A window that finds one not yet acknowledged when its pass begins (after
                    //# its event was read) waits on it instead of sending another
                    if self.s.threads[tu].sig == Sig::Pending {
                        note!(self, "M4: T{t} may be inside {span}'s madvise: the window waits on its outstanding signal");
                    } else {
                        note!(self, "M4: T{t} may be inside {span}'s madvise: the monitor sends it the proof signal");
                        self.thread_mut(tu).sig = Sig::Pending;
                    }
                    sent = true;
                }
                if self.mutant(Mutant::ProofWithoutAck) {
                    note!(self, "M4 (mutant `proof-without-ack`): T{t} was signalled: taken as out of {span}'s madvise");
                    continue;
                }
                kept.push((t, sent));
            }
            if kept.is_empty() {
                note!(self, "M4: no thread may be inside T{}'s madvise of {span}: the monitor closes its window", m.thread);
                self.s.proofs.remove(i);
                self.close_remove_window(span, m);
            } else {
                self.s.proofs[i].waiting = kept;
                i += 1;
            }
        }
    }

    fn exited_thread(s: &State, t: usize) -> bool {
        AlgoModel::exited(&s.threads[t])
    }

    /// Thread `t`'s handler stores its token (and wakes the monitor).
    pub(super) fn proof_ack(&mut self, t: usize) {
        note!(self, "S7.5: T{t} returns to user mode and runs the proof signal's handler: it acknowledges");
        self.thread_mut(t).sig = Sig::Acked;
    }
}
