//! Acquire: spec.md A1–A11 (the lane hit LN1 is in [`super::lanes`]).

use super::{AlgoModel, Ctx, Who, A7};
use crate::config::{Mutant, Span};
use crate::props;
use crate::state::*;
use mrcache_model::OverlapPolicy;
use mrcache_types::{Access, Op, OpError, ReleaseKind, Ret};

impl AlgoModel {
    /// A covering findable entry with sufficient access; the oldest (S2.1).
    pub fn lookup(&self, s: &State, req: Span, access: Access) -> Option<Handle> {
        let any_access = self.mutant(Mutant::HitIgnoresAccess);
        s.regs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.findable && r.span.contains(&req) && (any_access || r.access.suffices_for(access)))
            .filter(|(_, r)| self.generation_valid(r))
            .min_by_key(|(_, r)| r.id)
            .map(|(h, _)| h as Handle)
    }

    //= spec.md#S6.1
    /// The registration the overlap policy makes for a miss on `req`, and the
    /// entries it displaces, given the findable entries of `s`.
    pub fn plan(&self, s: &State, req: Span, access: Access) -> Plan {
        //= spec.md#S6.2
        //# a miss's span is widened outwards to multiples of `chunk_pages`.
        let chunk = self.cfg.chunk_pages;
        let req = req.align(chunk);
        let findable = || s.regs.iter().enumerate().filter(|(_, r)| r.findable).map(|(h, r)| (h as Handle, r));
        match self.cfg.policy {
            OverlapPolicy::Independent => Plan { span: req, access, displaced: Vec::new() },
            OverlapPolicy::Merge => {
                let (mut span, mut acc, mut displaced) = (req, access, Vec::new());
                loop {
                    let more: Vec<Handle> =
                        findable().filter(|(h, r)| !displaced.contains(h) && r.span.overlaps(&span)).map(|(h, _)| h).collect();
                    if more.is_empty() {
                        break;
                    }
                    for h in more {
                        let r = &s.regs[h as usize];
                        span = span.union(&r.span).align(chunk);
                        acc = acc | r.access;
                        displaced.push(h);
                    }
                }
                displaced.sort_unstable();
                Plan { span, access: acc, displaced }
            }
            OverlapPolicy::NoMergeUncacheContained => {
                let displaced: Vec<Handle> =
                    findable().filter(|(_, r)| req.contains(&r.span) || r.span.contains(&req)).map(|(h, _)| h).collect();
                let access = displaced.iter().fold(access, |a, &h| a | s.regs[h as usize].access);
                Plan { span: req, access, displaced }
            }
        }
    }

    //= spec.md#W3
    //# A4 and A7 may skip the windows' mutex when the count of open windows,
    //# stored under it after each change, reads 0
    /// Whether an open window overlaps `span`, as A4 and A7 read it (W3):
    /// first the open count, without the mutex, then, if it is not 0, the
    /// windows under the mutex. The windows stay as read across the step
    /// (A4 and A7 hold the cache lock; only W1 and W2 change them, and they
    /// touch nothing else A4 and A7 read), so the two reads are one step.
    pub fn windows_overlap(&self, s: &State, span: Span) -> bool {
        if s.windows.len() <= s.uncounted_windows as usize {
            return false;
        }
        s.windows.iter().any(|w| w.overlaps(&span))
    }

    pub fn a7_outcome(&self, s: &State, t: usize) -> A7 {
        let th = &s.threads[t];
        let acq = th.acq.as_ref().expect("A7 runs inside an acquire");
        // A8's test first, as spec.md's A7 says ("first A8's test") and the
        // code does: a findable entry is fresh, whether or not this thread's
        // own registration went stale meanwhile.
        // Mutant `a1-skip-without-lookup`: an acquire that skipped A1 takes
        // itself for a miss with nothing inserted since, as the cache's A3
        // and A8 may skip their lookups then.
        let skipped = acq.skipped_a1 && self.mutant(Mutant::A1SkipWithoutLookup);
        //= spec.md#A8
        //# A8 may skip its lookup while the index's insert counter is still the
        //# one A4 read before it unlocked
        let unchanged = acq.inserts == InsertCount::Unchanged;
        if let Some(h) = self.lookup(s, acq.req, acq.access).filter(|_| !skipped && !unchanged) {
            return A7::Hit(h);
        }
        if th.inflight.is_some_and(|i| i.stale) && !self.mutant(Mutant::NoSeqRecheck) {
            return A7::Stale { replan: false };
        }
        //= spec.md#W3
        //# A7 treats a windowed record as stale if no open window overlaps it
        //# any more
        if th.inflight.is_some_and(|i| i.windowed && !self.windows_overlap(s, i.span))
            && !self.mutant(Mutant::WindowedCached)
            && !self.mutant(Mutant::WindowedServedAfterEnd)
        {
            return A7::Stale { replan: false };
        }
        // Merge's span and access, and no-merge-uncache-contained's access,
        // depend on the entries present (S6.1).
        if self.cfg.policy != OverlapPolicy::Independent && !self.mutant(Mutant::StaleMergePlan) {
            let now = self.plan(s, acq.req, acq.access);
            let planned = acq.plan.as_ref().expect("A4 planned");
            if now.span != planned.span || now.access != planned.access {
                return A7::Stale { replan: true };
            }
        }
        A7::Insert
    }

    /// Whether thread `t`'s registrar call (A5) may fail now: budget left, and
    /// the lock free (both outcomes take it at once).
    pub fn registrar_may_fail(&self, s: &State, t: usize) -> bool {
        let th = &s.threads[t];
        if th.failing {
            return th.revoke.is_none();
        }
        s.reg_failures_left > 0 && th.pc == Pc::A5 && th.toctou.is_empty() && th.ev.is_none() && s.lock == Lock::Free
    }
}

impl Ctx<'_> {
    /// Takes a lease on `h` for thread `t`'s acquire and judges P1 and P2.
    pub(super) fn grant(&mut self, t: usize, h: Handle, hit: bool) -> Ret {
        let lease = self.acq(t).lease;
        // Mutant `lease-count-saturates`: the count sticks at 2.
        let cap = if self.mutant(Mutant::LeaseCountSaturates) { 2 } else { u8::MAX };
        let r = &mut self.s.regs[h as usize];
        r.leases = (r.leases + 1).min(cap);
        self.touch(h);
        self.thread_mut(t).held.push((lease, h));
        self.judge_lease(t, h, hit)
    }

    /// Judges P1 and P2 for the lease thread `t`'s acquire got on `h`; the
    /// acquire's outcome.
    pub(super) fn judge_lease(&mut self, t: usize, h: Handle, hit: bool) -> Ret {
        let acq = self.acq(t).clone();
        let r = &self.s.regs[h as usize];
        //= spec.md#P1
        let covers = r.span.contains(&acq.req) && r.access.suffices_for(acq.access);
        //= spec.md#P2
        //# A granted lease's registration pinned, for every page of the request,
        //# the frame the process maps there when the acquire returns, considering
        //# every release event that *happened before* the acquire began: the
        //# releasing call (munmap, madvise, free...) returned before the acquire
        //# was invoked. (Events concurrent with the acquire may be ordered either way.)
        // Checked as: for every page of the request, the frame pinned is at least
        // as new as the one installed by every release event that completed before
        // the acquire was invoked.
        let stale = acq.req.pages().enumerate().find_map(|(i, p)| {
            let pinned = (r.span.first..r.span.end).contains(&p).then(|| r.pinned[(p - r.span.first) as usize])?;
            (pinned < acq.snap[i]).then_some((p, pinned, acq.snap[i]))
        });
        note!(self, "T{t} leases #{h} for L{} ({})", acq.lease, reg_line(h, r));
        let base = Bad { property: props::P1, thread: t as u8, lease: acq.lease, handle: h, page: 0, pinned: 0, needed: 0 };
        if !covers {
            self.s.bad.push(base);
        }
        if let Some((page, pinned, needed)) = stale {
            self.s.bad.push(Bad { property: props::P2, page, pinned, needed, ..base });
        }
        Ret::Granted { reg: self.m.view(self.s, h), hit, pressure: acq.trimmed }
    }

    //= spec.md#S5.4
    //= spec.md#A5
    //# On ENOMEM/EAGAIN (first time only): trim (S2.8) as a step of its own
    /// Thread `t`'s registrar call fails. The first failure of an acquire is
    /// ENOMEM: trim (take the lock, note the unleased entries, drain, evict
    /// the noted ones, logged as a `trim` of its own), re-plan, unlock, and
    /// register again. A later one is EINVAL: take the lock, drain, drop the
    /// in-flight record; a covering entry serves it as a hit, else E5.
    pub(super) fn registrar_fails(&mut self, t: usize) {
        self.s.reg_failures_left -= 1;
        let a = t as Actor;
        let (req, access, trimmed) = (self.acq(t).req, self.acq(t).access, self.acq(t).trimmed);
        self.lock_exclusive(a);
        if !trimmed {
            self.revoke_all(a);
        }
        let noted: Vec<Handle> = (0..self.s.regs.len())
            .filter(|&h| self.s.regs[h].findable && (self.s.regs[h].leases == 0 || self.mutant(Mutant::TrimEvictsLeased)))
            .map(|h| h as Handle)
            .collect();
        self.drain_queue(a);
        self.read_and_apply_uffd(a);
        self.thread_mut(t).inflight = None;
        if !trimmed {
            note!(self, "A5: T{t}'s registrar fails with ENOMEM: T{t} trims (noted unleased {noted:?})");
            self.invoke(t as u8, true, Op::Trim);
            self.thread_mut(t).noted = noted;
            self.thread_mut(t).pc = Pc::Trim;
            return;
        }
        note!(self, "A5: T{t}'s registrar fails again (EINVAL)");
        if let Some(h) = self.m.lookup(self.s, req, access) {
            note!(self, "A5: #{h} now covers the request: a hit");
            let ret = self.grant(t, h, true);
            self.end_section(t);
            return self.finish(t, ret);
        }
        self.end_section(t);
        let error = OpError::Registrar { failure: mrcache_types::RegistrarFailure::Other, pressure: true };
        self.finish(t, Ret::Failed { error });
    }

    //= spec.md#A5
    //# The trim evicts each noted entry with one compare-exchange of its
    //# state word from unleased to INVALID, not a read of its count and then
    //# the OR of A-H
    /// One step of the trim (lock held exclusive): the next noted entry's
    /// compare-exchange (A0 may have leased it since the note: then it
    /// stays), or, with none left, the re-plan and the unlock.
    pub(super) fn trim_step(&mut self, t: usize) {
        let a = t as Actor;
        if self.s.threads[t].noted.is_empty() {
            self.ret(t as u8, true, Op::Trim, Ret::Done);
            let (req, access) = (self.acq(t).req, self.acq(t).access);
            let plan = self.m.plan(self.s, req, access);
            note!(self, "A5: T{t} re-plans {} {} and registers again", plan.span, plan.access);
            let windowed = self.windowed(plan.span);
            let span = self.record_span(t, plan.span);
            self.thread_mut(t).inflight = Some(InFlight { span, stale: false, windowed });
            let acq = self.acq_mut(t);
            acq.plan = Some(plan);
            acq.trimmed = true;
            self.thread_mut(t).pc = Pc::A5;
            self.unlock_exclusive(a);
            return;
        }
        let h = self.thread_mut(t).noted.remove(0);
        let r = &self.s.regs[h as usize];
        if !r.findable {
            return;
        }
        if self.mutant(Mutant::TrimReadsThenOrs) {
            if r.leases == 0 {
                note!(self, "S2.8 (mutant `trim-reads-then-ors`): T{t} reads #{h}'s lease count: 0");
                self.thread_mut(t).pc = Pc::TrimOr(h);
            }
            return;
        }
        if r.leases > 0 && !self.mutant(Mutant::TrimEvictsLeased) {
            note!(self, "S2.8: the trim's compare-exchange on #{h} fails: leased since the note");
            return;
        }
        self.trim_evict(t, h);
    }

    /// What A4's in-flight record covers: the planned registration, widened
    /// to chunks (S6.2), which A-D marks stale when an event overlaps any of
    /// its pages. Mutant `inflight-unaligned`: the request only (an event on
    /// a page the rounding added leaves the record fresh).
    fn record_span(&self, t: usize, planned: Span) -> Span {
        if self.mutant(Mutant::InflightUnaligned) {
            return self.acq(t).req;
        }
        planned
    }

    /// Mutant `trim-reads-then-ors`: the OR, a step after the read.
    pub(super) fn trim_or(&mut self, t: usize, h: Handle) {
        note!(self, "S2.8 (mutant `trim-reads-then-ors`): T{t} ORs INVALID into #{h}'s state word");
        self.thread_mut(t).pc = Pc::Trim;
        if self.s.regs[h as usize].findable {
            self.trim_evict(t, h);
        }
    }

    fn trim_evict(&mut self, t: usize, h: Handle) {
        let a = t as Actor;
        note!(self, "S2.8: trim evicts #{h}");
        self.s.trim_evicted = true;
        self.revoke(a, h);
        self.s.regs[h as usize].findable = false;
        if self.s.regs[h as usize].leases > 0 {
            // Mutants: a leased entry deregistered by the trim (P3).
            self.s.regs[h as usize].invalid = true;
        }
        self.dereg_list(a).push(h);
    }

    /// The registrar fails (action `RegistrarFails`): with lanes, the trim
    /// (or the drain) revokes first.
    pub(super) fn registrar_fails_step(&mut self, t: usize) {
        if self.m.cfg.lanes {
            if self.lane_prephase(Who::Fails(t)) {
                self.thread_mut(t).failing = true;
                return;
            }
            self.fence(t as Actor);
        }
        self.thread_mut(t).failing = false;
        self.registrar_fails(t)
    }

    /// Lanes: the A1 reader's drain after its unlock, as a step of its own.
    pub(super) fn a1_drain(&mut self, t: usize, h: Handle) {
        let skip = self.mutant(Mutant::QueueNeverDrained) || self.mutant(Mutant::ReaderSkipsDrain);
        let pending = !self.s.queue.is_empty() || !self.s.threads[t].popped.is_empty();
        if !skip && (self.prelocked(t) || (pending && self.s.lock == Lock::Free)) {
            note!(self, "A1: T{t} unlocked with events queued: it tries the lock exclusive and drains");
            self.lock_exclusive(t as Actor);
            self.drain_queue(t as Actor);
            self.unlock_exclusive(t as Actor);
        }
        let reg = self.m.view(self.s, h);
        let pressure = self.acq(t).trimmed;
        self.finish(t, Ret::Granted { reg, hit: true, pressure });
    }

    //= spec.md#A0
    //# if the queue is empty, the cache has no limits, the draining count is
    //# 0, and this thread's lane (if any) takes no memo now (LN2 may skip it):
    //# read the hit memo's slot for the request without the lock; read the
    //# entry's state word; if it is findable (neither INVALID nor PENDING)
    //# and the entry's key is the request's
    /// A0's read, as the first step of an acquire (the `alt` branch; the
    /// configuration has no limits): the memo's answer is the canonical
    /// covering entry when it names the request's own key (the model's
    /// memo holds every such answer; a real one may have none, and A1 then
    /// answers, as the model's A1 does here when the key differs). The
    /// compare-exchange is the next step, so anything may run between.
    pub(super) fn a0_read(&mut self, t: usize) {
        let (req, access) = (self.acq(t).req, self.acq(t).access);
        if !self.s.queue.is_empty() {
            note!(self, "A0: the queue is not empty: T{t} takes the slow path");
            self.thread_mut(t).pc = Pc::A2;
            return;
        }
        // Mutant `lockless-skips-draining`: only the queue's length.
        if !self.mutant(Mutant::LocklessSkipsDraining) && !self.m.ln1_sees_no_event(self.s) {
            note!(self, "A0: a drain has events it has not applied: T{t} goes to A1");
            self.thread_mut(t).pc = Pc::A1;
            return;
        }
        if self.m.cfg.memo {
            return self.a0_read_memo(t);
        }
        match self.m.lookup(self.s, req, access) {
            Some(h) if self.s.regs[h as usize].span == req && self.s.regs[h as usize].access == access => {
                note!(self, "A0: the memo names #{h}, findable with T{t}'s key (no lock)");
                self.thread_mut(t).pc = Pc::A0Cas(h);
            }
            _ => {
                note!(self, "A0: no memo with T{t}'s key: A1");
                self.thread_mut(t).pc = Pc::A1;
            }
        }
    }

    //= spec.md#A0
    //# compare-exchange its state word from the word read to the same word
    //# with one more lease
    /// A0's compare-exchange: it succeeds only if the word is the one read,
    /// so only if `h` is still findable (mutant `lockless-takes-removed`:
    /// whatever the word now is); then the hit. Else A1.
    pub(super) fn a0_cas(&mut self, t: usize, h: Handle) {
        if self.m.cfg.memo {
            return self.a0_cas_memo(t, h);
        }
        if self.s.regs[h as usize].findable || self.mutant(Mutant::LocklessTakesRemoved) {
            note!(self, "A0: T{t}'s compare-exchange on #{h}'s state word succeeds: a hit without the lock");
            let ret = self.grant(t, h, true);
            return self.finish(t, ret);
        }
        note!(self, "A0: #{h} left the index: T{t}'s compare-exchange fails; A1");
        self.thread_mut(t).pc = Pc::A1;
    }

    /// A1's hit memoized (`CheckConfig::memo`): the slot of the request's
    /// first page names the hit's entry memory (under the lock shared).
    fn put_memo(&mut self, t: usize, h: Handle) {
        let Some((cell, _)) = self.s.regs[h as usize].cell.filter(|_| self.m.cfg.memo) else { return };
        let page = self.acq(t).req.first;
        self.s.memo.retain(|&(p, _)| p != page);
        self.s.memo.push((page, cell));
        self.s.memo.sort_unstable();
    }

    //= spec.md#A0
    //# read the hit memo's slot for the request without the lock; read the
    //# entry's state word; if it is findable (neither INVALID nor PENDING)
    //# and the entry's key is the request's
    /// A0's read with the memo (`CheckConfig::memo`): the slot names entry
    /// memory, which may hold another entry than the one memoized (freed
    /// and reused since), an entry A9 has not published (PENDING) or one
    /// taken out (INVALID). The word and the key are read in this step; the
    /// compare-exchange is the next.
    fn a0_read_memo(&mut self, t: usize) {
        let (req, access) = (self.acq(t).req, self.acq(t).access);
        let Some(&(_, cell)) = self.s.memo.iter().find(|(p, _)| *p == req.first) else {
            note!(self, "A0: the memo's slot for page {} is empty: A1", req.first);
            self.thread_mut(t).pc = Pc::A1;
            return;
        };
        let (h, _) = self.s.cells[cell as usize];
        let r = &self.s.regs[h as usize];
        // Mutant `lockless-takes-pending`: PENDING ignored.
        let pending = r.pending && !self.mutant(Mutant::LocklessTakesPending);
        if !r.findable || pending {
            let why = if r.findable { "PENDING" } else { "INVALID" };
            note!(self, "A0: the memo names cell {cell}, #{h}'s state word is {why}: T{t} goes to A1");
            self.thread_mut(t).pc = Pc::A1;
            return;
        }
        // Mutant `lockless-ignores-key`: no key compared, before or after.
        if (r.span != req || r.access != access) && !self.mutant(Mutant::LocklessIgnoresKey) {
            note!(self, "A0: the memo names cell {cell}, #{h} of another key: T{t} goes to A1");
            self.thread_mut(t).pc = Pc::A1;
            return;
        }
        note!(
            self,
            "A0: the memo names cell {cell}: #{h}, leasable{}, with T{t}'s key (no lock)",
            if r.pending { " (PENDING: mutant)" } else { "" }
        );
        self.thread_mut(t).pc = Pc::A0Cas(h);
    }

    //= spec.md#A0
    //# compare-exchange its state word from the word read to the same word
    //# with one more lease; on success, check the key again (the lease now
    //# keeps the entry alive) and return the hit
    /// A0's compare-exchange with the memo: it succeeds if the word of `h`'s
    /// memory is still the one read (the same incarnation, findable, not
    /// PENDING; the lease count is not compared: a changed count fails the
    /// cache's compare-exchange, which then goes to A1, as the model's does
    /// on every other failure). The incarnation is one bit here, so a cell
    /// reused twice since the read has the word of another entry: the key
    /// check under the lease gives that lease back (R1: the word was
    /// leasable, so no handoff) and goes to A1.
    fn a0_cas_memo(&mut self, t: usize, h: Handle) {
        let (req, access) = (self.acq(t).req, self.acq(t).access);
        let (cell, inc) = self.s.regs[h as usize].cell.expect("A0 read an entry A9 made");
        let (now, now_inc) = self.s.cells[cell as usize];
        let r = &self.s.regs[now as usize];
        let pending = r.pending && !self.mutant(Mutant::LocklessTakesPending);
        let same_word = r.findable && !pending && now_inc == inc;
        if !same_word && !self.mutant(Mutant::LocklessTakesRemoved) {
            note!(self, "A0: cell {cell}'s state word changed since T{t} read it: the compare-exchange fails; A1");
            self.thread_mut(t).pc = Pc::A1;
            return;
        }
        if now != h {
            note!(self, "A0: cell {cell} was reused twice: its incarnation bit is the one read, and T{t}'s compare-exchange leases #{now}");
        }
        let recheck = !self.mutant(Mutant::LocklessNoKeyRecheck) && !self.mutant(Mutant::LocklessIgnoresKey);
        if recheck && (r.span != req || r.access != access) {
            note!(self, "A0: #{now} is not T{t}'s key: T{t} gives the lease back (R1) and goes to A1");
            self.thread_mut(t).pc = Pc::A1;
            return;
        }
        note!(self, "A0: T{t}'s compare-exchange on #{now}'s state word succeeds: a hit without the lock");
        let ret = self.grant(t, now, true);
        self.finish(t, ret)
    }

    /// A9's entry memory (`CheckConfig::memo`): the first cell whose entry
    /// is freed (out of the index, unleased), with a new incarnation; else
    /// a new cell.
    fn alloc_cell(&mut self, h: Handle) -> (u8, u8) {
        let regs = &self.s.regs;
        let free = self.s.cells.iter().position(|&(o, _)| !regs[o as usize].findable && regs[o as usize].leases == 0);
        let (cell, inc) = match free {
            Some(c) => (c, self.s.cells[c].1 ^ 1),
            None => {
                self.s.cells.push((h, 0));
                (self.s.cells.len() - 1, 0)
            }
        };
        self.s.cells[cell] = (h, inc);
        (cell as u8, inc)
    }

    //= spec.md#A1
    //# a thread may skip A1 and go straight to A2, whose A3 then looks up
    //# under the lock exclusive
    /// A1 skipped (the `alt` branch with limits and `skip_a1`): straight to
    /// A2. A3 looks up (mutant `a1-skip-without-lookup`: it does not, as if
    /// A1 had missed with nothing inserted since).
    pub(super) fn a1_skip(&mut self, t: usize) {
        note!(self, "A1 skipped: T{t} goes straight to A2");
        // Only the mutant reads it: kept out of the state otherwise.
        if self.mutant(Mutant::A1SkipWithoutLookup) {
            self.acq_mut(t).skipped_a1 = true;
        }
        self.thread_mut(t).pc = Pc::A2;
    }

    //= spec.md#A1
    //= spec.md#S3.9
    //# The fast (read-locked) hit path is taken only when the queue is empty,
    //# so a queued event is never missed.
    pub(super) fn a1_enter(&mut self, t: usize) {
        if !self.s.queue.is_empty() {
            note!(self, "A1: the queue is not empty: T{t} takes the slow path");
            self.thread_mut(t).pc = Pc::A2;
        } else {
            //= spec.md#A1
            //# if the queue is empty, take the lock *shared*
            self.claim_lane(t);
            note!(self, "A1: the queue is empty: T{t} takes the lock shared");
            self.lock_shared();
            self.thread_mut(t).pc = Pc::A1Look;
        }
    }

    //= spec.md#A1
    pub(super) fn a1_lookup(&mut self, t: usize) {
        let (req, access) = (self.acq(t).req, self.acq(t).access);
        match self.m.lookup(self.s, req, access) {
            Some(h) => {
                note!(self, "A1: hit #{h} under the shared lock");
                let ret = self.grant(t, h, true);
                self.memoize(t, h);
                self.put_memo(t, h);
                self.unlock_shared();
                if self.m.cfg.lanes {
                    // The reader's drain is a step of its own (it may revoke).
                    if !self.s.queue.is_empty() {
                        self.thread_mut(t).pc = Pc::A1Drain(h);
                    } else {
                        self.finish(t, ret);
                    }
                    return;
                }
                // The reader's part of "the holder drains": a hook that found the
                // lock held shared left its event queued; the last reader out
                // tries the lock and drains, as H2 would.
                if self.drain_rounds() {
                    self.start_post_drain(t, true);
                    return self.finish(t, ret);
                }
                let skip = self.mutant(Mutant::QueueNeverDrained) || self.mutant(Mutant::ReaderSkipsDrain);
                if !skip && !self.s.queue.is_empty() && self.s.lock == Lock::Free {
                    note!(self, "A1: T{t} unlocked with events queued: it tries the lock exclusive and drains");
                    self.lock_exclusive(t as Actor);
                    self.drain_queue(t as Actor);
                    self.unlock_exclusive(t as Actor);
                }
                self.finish(t, ret);
            }
            None => {
                //= spec.md#A3
                //# A1 reads the counter under the shared lock its lookup missed under
                if self.m.cfg.lookup_skips {
                    // Mutant `a1-count-after-unlock`: in A2's step, after the unlock.
                    let late = self.mutant(Mutant::A1CountAfterUnlock);
                    self.acq_mut(t).inserts = if late { InsertCount::Unread } else { InsertCount::Unchanged };
                }
                note!(self, "A1: no covering entry: T{t} unlocks and takes the slow path");
                self.unlock_shared();
                self.thread_mut(t).pc = Pc::A2;
            }
        }
    }

    //= spec.md#A2
    pub(super) fn a2(&mut self, t: usize) {
        self.read_late_count(t);
        note!(self, "A2: T{t} takes the lock exclusive and drains");
        self.lock_exclusive(t as Actor);
        self.drain_queue(t as Actor);
        self.read_and_apply_uffd(t as Actor);
        self.thread_mut(t).pc = Pc::A3;
    }

    pub(super) fn a3(&mut self, t: usize) {
        let (req, access) = (self.acq(t).req, self.acq(t).access);
        self.kdreg2_purge(t, req);
        let skipped = self.acq(t).skipped_a1 && self.mutant(Mutant::A1SkipWithoutLookup);
        //= spec.md#A3
        //# A3 may skip its lookup (as a miss) on the acquire's first attempt when
        //# A1 ran and missed and the index's insert counter is still the one A1
        //# read when it missed
        let unchanged = self.acq(t).attempts == 0 && self.acq(t).inserts == InsertCount::Unchanged;
        if unchanged {
            note!(self, "A3: nothing inserted since A1 missed: T{t} skips the lookup");
        }
        if let Some(h) = self.m.lookup(self.s, req, access).filter(|_| !skipped && !unchanged) {
            note!(self, "A3: hit #{h}");
            let ret = self.grant(t, h, true);
            self.end_section(t);
            return self.finish(t, ret);
        }
        //= spec.md#A4
        let plan = self.m.plan(self.s, req, access);
        note!(
            self,
            "A4: miss: T{t} plans {} {} (displacing {:?}), adds an in-flight record and unlocks",
            plan.span,
            plan.access,
            plan.displaced
        );
        //= spec.md#W3
        //# A4 marks its in-flight record *windowed* if an open window overlaps
        //# it
        let windowed = self.windowed(plan.span);
        if windowed {
            note!(self, "W3: an open window overlaps {}: the record is windowed", plan.span);
        }
        let span = self.record_span(t, plan.span);
        self.thread_mut(t).inflight = Some(InFlight { span, stale: false, windowed });
        self.acq_mut(t).plan = Some(plan);
        if self.m.cfg.lookup_skips {
            // A8's counter, read before the unlock (mutant
            // `a4-count-after-unlock`: in A5's step, after it).
            let late = self.mutant(Mutant::A4CountAfterUnlock);
            self.acq_mut(t).inserts = if late { InsertCount::Unread } else { InsertCount::Unchanged };
        }
        self.unlock_exclusive(t as Actor);
        self.thread_mut(t).pc = Pc::A5;
    }

    /// Mutants `a1-count-after-unlock`, `a4-count-after-unlock`: the insert
    /// counter read in the step after the unlock.
    fn read_late_count(&mut self, t: usize) {
        if self.acq(t).inserts == InsertCount::Unread {
            note!(self, "A3/A8 (mutant): T{t} reads the insert counter after its unlock");
            self.acq_mut(t).inserts = InsertCount::Unchanged;
        }
    }

    /// A9's insert: every acquire's counter read before it has changed.
    fn count_insert(&mut self) {
        for th in self.s.threads.iter_mut() {
            // Read first: a write copies a thread the states share.
            if th.acq.as_ref().is_some_and(|a| a.inserts == InsertCount::Unchanged) {
                if let Some(acq) = th.acq.as_mut() {
                    acq.inserts = InsertCount::Changed;
                }
            }
        }
    }

    //= spec.md#A5
    //# Call the registrar without the lock.
    pub(super) fn a5(&mut self, t: usize, alt: bool) {
        self.read_late_count(t);
        let plan = self.acq(t).plan.clone().expect("A4 planned");
        let pinned: Vec<u8> = plan.span.pages().map(|p| self.s.gens[p as usize]).collect();
        let h = self.s.regs.len() as Handle;
        note!(self, "A5: T{t} registers {} {} without the lock: #{h} pins generations {pinned:?}", plan.span, plan.access);
        self.s.regs.push(Reg {
            span: plan.span,
            access: plan.access,
            pinned: pinned.into(),
            deregs: 0,
            id: 0,
            findable: false,
            leases: 0,
            invalid: false,
            displaced: false,
            last_use: 0,
            kmon: false,
            kgen: false,
            cell: None,
            pending: false,
            priority: 0,
            forgotten: false,
        });
        self.acq_mut(t).handle = Some(h);
        self.thread_mut(t).pc = Pc::A6;
        if alt {
            let p = self.m.cfg.registrar_frees.expect("alternative only when configured");
            note!(self, "A5: the registrar frees page {p} while it registers");
            self.s.registrar_free_left = false;
            self.start_event(t, ReleaseKind::Munmap, Span::new(p, p + 1), Origin::Registrar);
        }
    }

    //= spec.md#A6
    pub(super) fn a6(&mut self, t: usize) {
        note!(self, "A6: T{t} takes the lock exclusive, notes the unleased entries if the insert could exceed a limit, and drains");
        self.lock_exclusive(t as Actor);
        let bytes = self.acq(t).plan.as_ref().expect("A4 planned").span.bytes();
        if self.m.could_exceed_limits(self.s, bytes) {
            let excess = self.m.excess(self.s, bytes);
            self.note_covering(t, excess);
        }
        self.drain_queue(t as Actor);
        self.read_and_apply_uffd(t as Actor);
        self.thread_mut(t).pc = Pc::A7;
    }

    pub(super) fn a7(&mut self, t: usize, alt: bool) {
        let handle = self.acq(t).handle.expect("A5 registered");
        match self.m.a7_outcome(self.s, t) {
            A7::Stale { replan } => {
                //= spec.md#A7
                //= spec.md#S3.7
                if replan {
                    note!(self, "A7: the overlap policy's plan changed while the lock was dropped: #{handle} is thrown away");
                } else {
                    note!(self, "A7: the in-flight record is stale: #{handle} is thrown away");
                }
                self.thread_mut(t).inflight = None;
                self.dereg_list(t as Actor).push(handle);
                let acq = self.acq_mut(t);
                acq.handle = None;
                acq.plan = None;
                acq.attempts += 1;
                // The retry's A3 looks up (the cache skips on the first attempt only).
                acq.inserts = InsertCount::Changed;
                let exhausted = acq.attempts >= self.m.cfg.max_retries;
                self.thread_mut(t).noted.clear();
                self.settle_over_limit();
                self.unlock_exclusive(t as Actor);
                if exhausted {
                    self.start_post_drain(t, false);
                    self.finish(t, Ret::Failed { error: OpError::RetriesExhausted });
                } else {
                    self.thread_mut(t).pc = Pc::A2;
                }
            }
            A7::Hit(h) => {
                //= spec.md#A8
                note!(self, "A8: #{h} now covers the request: lease it, throw #{handle} away");
                self.thread_mut(t).inflight = None;
                self.dereg_list(t as Actor).push(handle);
                self.acq_mut(t).handle = None;
                let ret = self.grant(t, h, true);
                self.thread_mut(t).noted.clear();
                self.settle_over_limit();
                self.end_section(t);
                self.finish(t, ret);
            }
            A7::Insert => {
                //= spec.md#A9
                let acq = self.acq(t).clone();
                let displaced = if self.mutant(Mutant::StaleMergePlan) {
                    acq.plan.clone().expect("A4 planned").displaced
                } else {
                    self.m.plan(self.s, acq.req, acq.access).displaced
                };
                let windowed = self.s.threads[t].inflight.is_some_and(|i| i.windowed);
                self.thread_mut(t).inflight = None;
                let id = self.s.next_id;
                self.s.next_id += 1;
                let memo = self.m.cfg.memo;
                let cell = memo.then(|| self.alloc_cell(handle));
                let r = &mut self.s.regs[handle as usize];
                r.id = id;
                r.findable = true;
                //= spec.md#A9
                //# The new entry's state word is PENDING from its creation
                r.cell = cell;
                r.pending = memo;
                self.count_insert();
                note!(self, "A9: insert #{handle} as R{id}; displace {displaced:?}");
                self.kdreg2_subscribe(handle);
                if let Some((c, inc)) = cell {
                    note!(self, "A9: #{handle} takes entry memory cell {c} (incarnation {inc}), PENDING");
                }
                let _ = self.grant(t, handle, false);
                //= spec.md#W3
                //# A9 inserts a windowed registration and at once takes it out of
                //# the index, as a leased entry leaves it on invalidation
                if windowed && !self.mutant(Mutant::WindowedCached) && !memo {
                    note!(self, "W3: R{id} is windowed: served, never cached (INVALID, deregistered at its last release)");
                    let r = &mut self.s.regs[handle as usize];
                    r.findable = false;
                    r.invalid = true;
                    self.s.windowed_served = true;
                }
                for d in displaced {
                    self.revoke(t as Actor, d);
                    let r = &mut self.s.regs[d as usize];
                    r.findable = false;
                    r.invalid = true;
                    r.displaced = true;
                    let drop_leased = self.mutant(Mutant::MergeDropsLeased) && self.m.cfg.policy == OverlapPolicy::Merge;
                    if self.s.regs[d as usize].leases == 0 || drop_leased {
                        self.dereg_list(t as Actor).push(d);
                    }
                }
                if memo {
                    // The take-out or the publication is the next step, so
                    // that A0 may read the PENDING word between.
                    self.thread_mut(t).pc = Pc::A9Pub { alt, windowed };
                    return;
                }
                self.a9_end(t, alt);
            }
        }
    }

    //= spec.md#A9
    //# it becomes findable to A0 (its PENDING mark cleared) only after the
    //# displacement, and only if A9 does not take it out at once
    /// A9's second step (`CheckConfig::memo`), still under the lock: a
    /// windowed entry is taken out at once (INVALID, still PENDING), any
    /// other published (PENDING cleared).
    pub(super) fn a9_pub(&mut self, t: usize, alt: bool, windowed: bool) {
        let handle = self.acq(t).handle.expect("A9 inserted");
        if windowed && !self.mutant(Mutant::WindowedCached) {
            note!(self, "W3: #{handle} is windowed: served, never cached (INVALID, deregistered at its last release)");
            let r = &mut self.s.regs[handle as usize];
            r.findable = false;
            r.invalid = true;
            self.s.windowed_served = true;
        } else {
            note!(self, "A9: T{t} publishes #{handle} (clears PENDING)");
            self.s.regs[handle as usize].pending = false;
        }
        self.a9_end(t, alt);
    }

    /// The end of A9: A10 with limits, else A11 (`alt`: the cache frees its
    /// own memory first, under the lock).
    fn a9_end(&mut self, t: usize, alt: bool) {
        let next = if self.m.cfg.has_limits() { Pc::A10 } else { Pc::A11 };
        if alt {
            let span = self.m.cache_free_span();
            note!(self, "A9: the cache frees its own memory ({span}) while it holds the lock");
            self.s.cache_free_left = false;
            self.thread_mut(t).pc = next;
            self.start_event(t, ReleaseKind::Munmap, span, Origin::Cache);
        } else if next == Pc::A10 {
            self.thread_mut(t).pc = Pc::A10;
        } else {
            self.a11(t);
        }
    }

    //= spec.md#A11
    pub(super) fn a11(&mut self, t: usize) {
        let h = self.acq(t).handle.expect("A9 inserted");
        self.end_section(t);
        let reg = self.m.view(self.s, h);
        let pressure = self.acq(t).trimmed;
        self.finish(t, Ret::Granted { reg, hit: false, pressure });
    }
}
