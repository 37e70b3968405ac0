//! A model of a peer's monitor: HPE's kdreg2 kernel module (at 9a31fe2) as
//! libfabric's `kdreg2` memory monitor drives it (`MonitorKind::Kdreg2`),
//! in place of spec.md's hook or userfaultfd. It is not part of spec.md:
//! it lets the checker judge that design by the properties the contract's
//! monitors are held to. What it models (docs/peers.md §4 says where in the
//! sources each piece is):
//!
//! - A9's insert subscribes the entry (the MONITOR ioctl, under the cache
//!   lock, waiting for the module's mutex): the module records the range
//!   with a generation word; the entry keeps the value it read
//!   ([`Reg::kmon`]). A deregistration unsubscribes it.
//! - A release changes the frames, then its thread runs the mmu notifier
//!   (a step of its own, [`EvPc::Notify`]): it *tries* the module's mutex.
//!   Holding it, it destroys every monitored region the release overlaps:
//!   the region's generation word changes ([`Reg::kgen`]) and one event
//!   with the region's range is queued ([`State::kqueue`]). Finding the
//!   mutex busy, it appends the range to the worker's list
//!   ([`State::kdeferred`]) and returns: the release returns with the
//!   generation words unchanged. `kdreg2-wait` waits for the mutex instead.
//! - The kernel worker ([`super::Action::Worker`]) later takes the mutex
//!   and destroys the regions the oldest deferred range overlaps, as the
//!   notifier would have.
//! - Every hit (A1, A3, A8) checks the entry's generation word, one load
//!   without any lock: an entry whose word changed is not a hit, and A3
//!   takes it out of the index (libfabric's search uncaches it).
//! - The evictor thread (the monitor actor), while events are pending:
//!   `read()` locks the module's mutex, copies one event out and unlocks
//!   (two steps: the mutex is busy between them); then it takes the cache
//!   lock, applies the event (A-D on the region's range) and unlocks.
//!
//! Invariant: `State::klock` is held only by the evictor between its two
//! read steps; every other holder of the module's mutex (the notifier, the
//! worker, the MONITOR and UNMONITOR ioctls) takes it within one step.
//! Left out: the event queue's bound (an overflowing event is dropped but
//! the generation word still changes), the generation word's wrap (31 bits),
//! the mempool fallback that invalidates every region, fork detection, and
//! the UNMONITOR ioctl's wait for the mutex.

use super::{AlgoModel, Ctx};
use crate::config::{MonitorKind, Mutant, Span};
use crate::state::*;

impl AlgoModel {
    /// libfabric's `valid` callback at a hit: the entry's generation word
    /// is still the one its subscribe returned. Always true for spec.md's
    /// monitors. Mutant `kdreg2-hit-skips-generation`: not checked.
    pub fn generation_valid(&self, r: &Reg) -> bool {
        !self.cfg.monitor.is_kdreg2() || !r.kgen || self.mutant(Mutant::Kdreg2HitSkipsGeneration)
    }

    /// The kernel worker may run: a deferred range, and the module's mutex
    /// free (it blocks on it otherwise).
    pub fn worker_enabled(&self, s: &State) -> bool {
        self.cfg.monitor == MonitorKind::Kdreg2 && !s.kdeferred.is_empty() && !s.klock
    }

    /// The evictor's next step is enabled: a read waits for pending events
    /// and the module's mutex; the apply waits for the cache lock.
    pub(super) fn evictor_enabled(&self, s: &State) -> bool {
        match s.monitor.pc {
            MonPc::Idle => !s.kqueue.is_empty() && !s.klock,
            MonPc::Read => true,
            MonPc::Lock | MonPc::Apply => s.lock == Lock::Free,
        }
    }
}

impl Ctx<'_> {
    /// A9's subscribe: the module records the entry's range with a fresh
    /// generation word.
    pub(super) fn kdreg2_subscribe(&mut self, h: Handle) {
        if !self.m.cfg.monitor.is_kdreg2() {
            return;
        }
        self.s.regs[h as usize].kmon = true;
        note!(self, "kdreg2: #{h} is subscribed (MONITOR ioctl): the module records its range and generation word");
    }

    /// A3, under the lock exclusive: a findable entry overlapping the
    /// request whose generation word changed leaves the index (unleased:
    /// dereg list; leased: INVALID), as libfabric's search uncaches an
    /// entry that fails `valid`.
    pub(super) fn kdreg2_purge(&mut self, t: usize, req: Span) {
        if !self.m.cfg.monitor.is_kdreg2() || self.mutant(Mutant::Kdreg2HitSkipsGeneration) {
            return;
        }
        for h in 0..self.s.regs.len() {
            let r = &self.s.regs[h];
            if !(r.findable && r.kgen && r.span.overlaps(&req)) {
                continue;
            }
            note!(self, "kdreg2: #{h}'s generation word changed: T{t} takes it out of the index");
            let r = &mut self.s.regs[h];
            r.findable = false;
            r.invalid = true;
            if r.leases == 0 {
                self.dereg_list(t as Actor).push(h as Handle);
            }
        }
    }

    /// `kdreg2_destroy_range` under the module's mutex: every monitored
    /// region overlapping `span` is destroyed (its generation word
    /// changes) and one event with its range is queued.
    fn kdreg2_destroy(&mut self, span: Span, who: &str) {
        let mut hit = Vec::new();
        for h in 0..self.s.regs.len() {
            let r = &mut self.s.regs[h];
            if r.kmon && r.span.overlaps(&span) {
                r.kmon = false;
                r.kgen = true;
                self.s.kqueue.push(r.span);
                hit.push(h);
            }
        }
        if hit.is_empty() {
            note!(
                self,
                "kdreg2: {who} holds the module's mutex: no monitored region overlaps {span} (no generation word changes, no event)"
            );
        } else {
            note!(self, "kdreg2: {who} holds the module's mutex and destroys the regions overlapping {span}: {hit:?} (generation words changed, one event each queued)");
        }
    }

    /// The mmu notifier in thread `t` after its release changed the frames.
    pub(super) fn kdreg2_notify(&mut self, t: usize, span: Span) {
        if self.s.klock {
            // Only `kdreg2` gets here with the mutex held: `kdreg2-wait`'s
            // notifier is enabled once it is free.
            note!(self, "kdreg2: T{t}'s notifier finds the module's mutex busy: it defers {span} to the worker and returns");
            self.s.kdeferred.push(span);
        } else {
            self.kdreg2_destroy(span, &format!("T{t}'s notifier"));
        }
        self.finish_event(t);
    }

    /// The kernel worker: the oldest deferred range, under the mutex.
    pub(super) fn worker_step(&mut self) {
        let span = self.s.kdeferred.remove(0);
        self.kdreg2_destroy(span, "the worker");
    }

    /// The evictor thread (libfabric's `kdreg2_evictor`).
    pub(super) fn evictor_step(&mut self) {
        match self.s.monitor.pc {
            MonPc::Idle => {
                note!(self, "kdreg2: pending_events > 0: the evictor's read() locks the module's mutex");
                self.s.klock = true;
                self.s.monitor.pc = MonPc::Read;
            }
            MonPc::Read => {
                let span = self.s.kqueue.remove(0);
                note!(self, "kdreg2: the evictor copies the event {span} out and unlocks the module's mutex");
                self.s.monitor.buf.push((span, None));
                self.s.klock = false;
                self.s.monitor.pc = MonPc::Lock;
            }
            MonPc::Lock | MonPc::Apply => {
                note!(self, "kdreg2: the evictor takes the cache lock and applies the event");
                self.lock_exclusive(MONITOR);
                self.monitor_apply();
                self.unlock_exclusive(MONITOR);
                self.s.monitor.pc = MonPc::Idle;
            }
        }
    }
}
