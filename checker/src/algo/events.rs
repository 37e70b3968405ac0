//! Release events: spec.md H1, H2, M1, M2, A-D, the A-H handoff, the
//! release windows of a hook that runs before the release (W1, W2; W3 is in
//! A4/A9, acquire.rs), those of a uffd REMOVE (M3, M4), and the process's
//! monitor shared by several caches (M5, M6: the reader, the ring, the
//! event clock, the service thread's round and each cache's drain of the
//! ring; the gate a hit checks is in acquire.rs).

use super::{AlgoModel, Ctx, Who};
use crate::config::{CacheFrees, MonitorKind, Mutant, Span};
use crate::state::*;
use mrcache_types::{Op, ReleaseKind, Ret};

impl AlgoModel {
    /// The page the cache frees under its lock.
    pub(super) fn cache_free_span(&self) -> Span {
        let p = match self.cfg.cache_frees {
            Some(CacheFrees::AppPage(p)) => p,
            _ => self.private_page,
        };
        Span::new(p, p + 1)
    }

    /// userfaultfd reports events only on the ranges the monitor subscribed:
    /// every application page; never the cache's private page.
    pub(super) fn uffd_watches(&self, span: &Span) -> bool {
        span.first < self.app_pages
    }

    pub(super) fn first_ev_pc(&self, span: &Span) -> EvPc {
        if !self.mutant(Mutant::NotifyBeforeRelease) {
            return EvPc::Bump;
        }
        match self.cfg.monitor {
            MonitorKind::Sync => EvPc::H1,
            MonitorKind::Async if self.uffd_watches(span) => EvPc::Enqueue,
            MonitorKind::Async => EvPc::BumpLast,
            MonitorKind::Kdreg2 | MonitorKind::Kdreg2Wait => EvPc::Bump,
        }
    }

    /// M4: the first REMOVE window whose madvise has returned (its thread
    /// is past that script op), while the monitor thread is between rounds
    /// (it proves without the lock). With several caches (M5), the first of
    /// any cache's: the one proof closes it in every cache that opened it.
    pub fn m4_window(&self, s: &State) -> Option<(Span, Madvise)> {
        // With the process's monitor, M4 runs on the service thread between
        // its rounds (the reader never proves).
        let busy = if self.ring() { s.monitor.svc.is_some() } else { s.monitor.pc != MonPc::Idle };
        if busy || !s.monitor.toctou.is_empty() || s.monitor.revoke.is_some() {
            return None;
        }
        if self.proof_steps() {
            // The proof's own steps close the windows (`m4_prove`).
            return None;
        }
        s.remove_windows
            .iter()
            .chain(s.others.iter().flat_map(|o| o.remove_windows.iter()))
            .find(|(_, m)| s.threads[m.thread as usize].next_op > m.op)
            .copied()
    }

    pub fn monitor_enabled(&self, s: &State) -> bool {
        if self.cfg.monitor.is_kdreg2() {
            return self.evictor_enabled(s);
        }
        if !self.is_async() {
            return false;
        }
        if !s.monitor.toctou.is_empty() || s.monitor.revoke.is_some() {
            return true;
        }
        if self.ring() {
            // The reader (M6): poll, then read; then publish. It waits on
            // nothing else.
            return match s.monitor.pc {
                MonPc::Idle => !s.uffd.is_empty(),
                _ => true,
            };
        }
        match s.monitor.pc {
            MonPc::Idle => !s.uffd.is_empty(),
            MonPc::Lock => s.lock == Lock::Free && s.others.iter().all(|o| o.lock == Lock::Free),
            MonPc::Read | MonPc::Apply => true,
        }
    }
}

impl AlgoModel {
    /// M6's gate, as A0 and A1 check it before they look up (`s` seen from
    /// the acquiring thread's cache): the event clock is even and the cache
    /// applied every event published. Always open with one cache (M2 reads
    /// under the cache lock instead).
    /// Mutant `hit-without-gate`: always.
    pub fn gate_passes(&self, s: &State) -> bool {
        !self.ring() || self.mutant(Mutant::HitWithoutGate) || (!s.reading && s.applied as usize == s.ring.len())
    }

    /// Whether a drain of the ring (A2, A6, the service thread's round) can
    /// end now: it waits out an odd clock (M6; mutant
    /// `drain-ignores-reading` does not).
    pub fn drain_may_finish(&self, s: &State) -> bool {
        !self.ring() || !s.reading || self.mutant(Mutant::DrainIgnoresReading)
    }

    /// The service thread's next step (M5): its round's next cache, or a
    /// new round once some cache is behind the ring; the cache's lock free
    /// (taken, the drain, and released in one step) and no read in
    /// progress (the drain waits it out).
    pub fn service_enabled(&self, s: &State) -> bool {
        if !self.ring() || !s.monitor.toctou.is_empty() {
            return false;
        }
        let c = match s.monitor.svc {
            Some(c) => c as usize,
            None => {
                let behind = s.applied as usize != s.ring.len() || s.others.iter().any(|o| o.applied as usize != s.ring.len());
                if !behind {
                    return false;
                }
                0
            }
        };
        let lock = if c == 0 { s.lock } else { s.others[c - 1].lock };
        (lock == Lock::Free || self.mutant(Mutant::AsyncApplyOutsideLock)) && self.drain_may_finish(s)
    }
}

impl Ctx<'_> {
    /// Whether an open release window overlaps `span` (A4, W3).
    pub(super) fn windowed(&self, span: Span) -> bool {
        self.m.windows_overlap(self.s, span)
    }

    /// A release through the W1/W2 pair (`CheckConfig::pair`): script
    /// events only; the nested ones (registrar, cache) keep H1/H2 after the
    /// release.
    fn paired(&self, t: usize) -> bool {
        self.m.cfg.pair && self.s.threads[t].ev.as_ref().is_some_and(|e| e.origin == Origin::Script)
    }

    //= spec.md#A-D
    /// Applies one release event under the lock: findable entries overlapping
    /// it leave the index (unleased: dereg list; leased: INVALID, deregistered
    /// by the last release); in-flight records overlapping it become stale.
    pub(super) fn apply_event(&mut self, span: Span, a: Actor) {
        note!(self, "A-D: {} applies the release of {span}", actor_name(a));
        for h in 0..self.s.regs.len() {
            let r = &self.s.regs[h];
            if !r.findable || !r.span.overlaps(&span) {
                continue;
            }
            if self.mutant(Mutant::PartialUnmapStartOnly) && r.span.first != span.first {
                continue;
            }
            if self.mutant(Mutant::LeasedStaysFindable) && r.leases > 0 {
                continue;
            }
            // Only W1's events are applied in a `pair` configuration.
            if self.mutant(Mutant::BeginKeepsEntries) {
                continue;
            }
            let h = h as Handle;
            self.revoke(a, h);
            self.s.regs[h as usize].findable = false;
            //= spec.md#A-H
            //# invalidation sets INVALID with one atomic OR on the state word and
            //# owns the deregistration iff the count it saw was 0
            if self.mutant(Mutant::HandoffToctou) {
                self.s.regs[h as usize].invalid = true;
                self.toctou_list(a).push(h);
                continue;
            }
            let seen = self.s.regs[h as usize].leases;
            self.s.regs[h as usize].invalid = true;
            if seen == 0 || self.mutant(Mutant::DeregLeasedOnInvalidate) {
                self.dereg_list(a).push(h);
            }
            note!(self, "A-D: #{h} leaves the index ({})", if seen == 0 { "unleased: dereg list" } else { "leased: INVALID" });
        }
        for t in 0..self.s.threads.len() {
            if self.mutant(Mutant::BeginKeepsInflight) {
                break;
            }
            if let Some(i) = self.s.threads[t].inflight.as_mut() {
                if i.span.overlaps(&span) && !i.stale {
                    i.stale = true;
                    note!(self, "A-D: T{t}'s in-flight registration of {} is now stale", i.span);
                }
            }
        }
    }

    /// Mutant `handoff-toctou`'s second half: read the count after INVALID was set.
    pub(super) fn read_counts_late(&mut self, a: Actor) {
        //= spec.md#A-H
        for h in std::mem::take(self.toctou_list(a)) {
            let leases = self.s.regs[h as usize].leases;
            note!(self, "A-H (split): {} reads #{h}'s count: {leases}", actor_name(a));
            if leases == 0 {
                self.deregister(h);
            }
        }
    }

    pub(super) fn drain_queue(&mut self, a: Actor) {
        // Lanes: events an LN5 took before it revoked come first.
        for span in std::mem::take(self.popped_mut(a)) {
            self.apply_event(span, a);
        }
        self.set_applying(Some(false));
        for span in std::mem::take(&mut self.s.queue) {
            self.apply_event(span, a);
        }
        self.set_applying(None);
    }

    //= spec.md#M2
    //# A2 and A6 also read pending events, from a monitor that serves their cache alone
    pub(super) fn read_and_apply_uffd(&mut self, a: Actor) {
        if !self.m.is_async() || self.mutant(Mutant::AsyncApplyOutsideLock) {
            return;
        }
        if self.m.ring() {
            // The process's monitor: A2 and A6 drain the ring instead.
            let c = if a == MONITOR { self.s.monitor.svc.unwrap_or(0) } else { self.m.cache_of(a as usize) as u8 };
            return self.drain_ring(a, c as usize);
        }
        self.set_applying(Some(true));
        for (span, w) in std::mem::take(&mut self.s.uffd) {
            let madvise = self.madvise_of(w);
            note!(self, "{} reads the uffd event {span}: T{w} wakes up", actor_name(a));
            self.s.threads[w as usize].waiting = false;
            self.apply_event(span, a);
            if let Some(m) = madvise {
                self.open_remove_window(span, m, a);
            }
        }
        self.set_applying(None);
    }

    //= spec.md#M6
    //# An attached cache's drain (A2, A6, a service round) applies the
    //# ring's events from its cursor, waiting out a read in progress, then
    //# sets its gate (under the lock exclusive, after applying).
    /// The drain of cache `c` (its state in the fields), under its lock
    /// exclusive: the ring's events from its `applied` count on (A-D; a
    /// REMOVE also opens its window, M3), then its gate. The wait for an
    /// even clock is the step's enabling condition (`drain_may_finish`).
    pub(super) fn drain_ring(&mut self, a: Actor, c: usize) {
        if self.s.reading && self.mutant(Mutant::DrainIgnoresReading) {
            let who = if a == MONITOR { "the service thread".to_string() } else { actor_name(a) };
            note!(
                self,
                "M6 (mutant `drain-ignores-reading`): the clock is odd; {who}'s drain of cache {c} does not wait for the read in progress"
            );
        }
        let from = match self.s.monitor.svc_from.get(c) {
            // `gate-before-apply`: the round set the gate ahead.
            Some(&f) if a == MONITOR && self.mutant(Mutant::GateBeforeApply) => f,
            _ => self.s.applied,
        };
        let published = self.s.ring.len() as u8;
        let who = if a == MONITOR { "the service thread".to_string() } else { actor_name(a) };
        for i in from..published {
            let (span, madvise) = self.s.ring[i as usize];
            if c > 0 && self.mutant(Mutant::EventToOneCache) {
                note!(self, "M6 (mutant `event-to-one-cache`): cache {c}'s drain skips the ring's event {span}");
                continue;
            }
            note!(self, "M6: {who} applies the ring's event {span} to cache {c}");
            self.apply_event(span, a);
            if let Some(m) = madvise {
                //= spec.md#S7.6
                //# A REMOVE opens a window (M3) in every attached cache that
                //# applies it; the one prover (M4) closes each.
                if c > 0 && self.mutant(Mutant::RemoveWindowOneCache) {
                    note!(self, "M3 (mutant `remove-window-one-cache`): cache {c} opens no window for T{}'s REMOVE {span}", m.thread);
                } else {
                    self.open_remove_window(span, m, a);
                }
            }
        }
        if self.s.applied != published {
            note!(self, "M6: cache {c}'s gate: {published} event(s) of the ring applied");
        }
        self.s.applied = published;
    }

    /// The madvise REMOVE thread `w` sleeps in, if its uffd event is one
    /// (`CheckConfig::remove`: a script release event).
    pub(super) fn madvise_of(&self, w: Actor) -> Option<Madvise> {
        let th = &self.s.threads[w as usize];
        let script = th.ev.as_ref().is_some_and(|e| e.origin == Origin::Script);
        (self.m.cfg.remove && script).then_some(Madvise { thread: w, op: th.next_op })
    }

    //= spec.md#M3
    //# after applying it (A-D), in the same critical section, open a window on
    //# its pages (as W1's: a multiset).
    /// Called by the step that read and applied the REMOVE, under the lock;
    /// the window is handed to the monitor (M4) as it opens.
    pub(super) fn open_remove_window(&mut self, span: Span, m: Madvise, a: Actor) {
        if self.mutant(Mutant::RemoveWithoutWindow) {
            note!(
                self,
                "M3 (mutant `remove-without-window`): {} applied T{}'s REMOVE {span} as a plain event: no window",
                actor_name(a),
                m.thread
            );
            return;
        }
        note!(self, "M3: {} opens a window on {span} for T{}'s REMOVE (closed by M4 once its madvise returned)", actor_name(a), m.thread);
        self.s.windows.push(span);
        self.s.remove_windows.push((span, m));
        if self.m.proof_steps() {
            self.s.proofs.push(Proof { span, m, scanned: false, waiting: Vec::new() });
        }
        // The history: the window is the contract's W1/W2 pair (S2.9), run
        // by the monitor as a hook would: `release_begin` now (the event's
        // effect again, and the window), `release_end` at M4. Without it a
        // miss served uncached after the madvise returned, before M4, would
        // break C1.
        let op = Op::ReleaseBegin { addr: span.addr(), len: span.bytes() };
        self.invoke(MONITOR, false, op);
        self.ret(MONITOR, false, op, Ret::Done);
    }

    //= spec.md#M4
    //# close a REMOVE window (as W2) only once the madvise that raised it is
    //# proven to have returned
    //= spec.md#S7.5
    /// The monitor thread, without the cache lock, closes the first REMOVE
    /// window whose madvise has returned (its thread is past that op): the
    /// model grants S7.5's proof exactly when the madvise has returned, the
    /// earliest a real proof can come.
    pub(super) fn m4_close(&mut self) {
        let (span, m) = self.m.m4_window(self.s).expect("M4 enabled");
        note!(self, "M4: T{}'s madvise of {span} has returned: the monitor closes its window", m.thread);
        self.close_remove_window(span, m);
    }

    /// Closes the REMOVE window (`span`, `m`) in every cache that opened
    /// it; logged as the monitor's `release_end`.
    pub(super) fn close_remove_window(&mut self, span: Span, m: Madvise) {
        for c in 0..self.m.cfg.caches as usize {
            self.s.swap_cache(c);
            if let Some(i) = self.s.remove_windows.iter().position(|x| *x == (span, m)) {
                self.s.remove_windows.remove(i);
                let w = self.s.windows.iter().position(|x| *x == span).expect("a REMOVE window is an open window");
                self.s.windows.remove(w);
                if self.m.cfg.caches > 1 {
                    note!(self, "M4: closed in cache {c}");
                }
                let op = Op::ReleaseEnd { addr: span.addr(), len: span.bytes() };
                self.invoke(MONITOR, false, op);
                self.ret(MONITOR, false, op, Ret::Done);
            }
            self.s.swap_cache(c);
        }
    }

    pub(super) fn start_event(&mut self, t: usize, kind: ReleaseKind, span: Span, origin: Origin) {
        if origin != Origin::Script {
            let op = Op::ReleaseEvent { kind, addr: span.addr(), len: span.bytes() };
            self.invoke(t as u8, true, op);
        }
        let pc = if self.m.cfg.pair && origin == Origin::Script {
            EvPc::Begin
        } else if self.m.cfg.remove && origin == Origin::Script && self.m.uffd_watches(&span) {
            // S7.4 (b): a REMOVE is queued before the frames change.
            EvPc::Enqueue
        } else {
            self.m.first_ev_pc(&span)
        };
        self.thread_mut(t).ev = Some(Ev { pc, span, kind, origin, assigned: Vec::new() });
        self.ev_step(t);
    }

    pub(super) fn bump(&mut self, t: usize) {
        let span = self.s.threads[t].ev.as_ref().expect("event").span;
        let mut assigned = Vec::new();
        for p in span.pages() {
            self.s.gens[p as usize] += 1;
            assigned.push(self.s.gens[p as usize]);
        }
        note!(self, "kernel: {span} is released (new generations {assigned:?})");
        self.thread_mut(t).ev.as_mut().expect("event").assigned = assigned;
    }

    pub(super) fn set_ev_pc(&mut self, t: usize, pc: EvPc) {
        self.thread_mut(t).ev.as_mut().expect("event").pc = pc;
    }

    pub(super) fn ev_step(&mut self, t: usize) {
        let ev = self.s.threads[t].ev.clone().expect("event in progress");
        let nbr = self.mutant(Mutant::NotifyBeforeRelease);
        let paired = self.paired(t);
        let begin_op = Op::ReleaseBegin { addr: ev.span.addr(), len: ev.span.bytes() };
        match ev.pc {
            EvPc::Begin => {
                //= spec.md#W1
                //# add the range's pages to the open windows (a multiset)
                self.invoke(t as u8, false, begin_op);
                note!(self, "W1: T{t} opens a window on {} (before the release), then queues the event", ev.span);
                if !self.mutant(Mutant::WindowAfterQueue) {
                    self.s.windows.push(ev.span);
                }
                //= spec.md#W1
                //# W1 stores the count with the window, before it queues its event
                if self.mutant(Mutant::WindowCountAfterQueue) {
                    // Its store comes after the event (the release, below).
                    self.s.uncounted_windows += 1;
                }
                self.set_ev_pc(t, EvPc::H1);
            }
            EvPc::End => {
                //= spec.md#W2
                //# remove one open window with exactly the range's pages
                let end_op = Op::ReleaseEnd { addr: ev.span.addr(), len: ev.span.bytes() };
                self.invoke(t as u8, false, end_op);
                let i = if self.mutant(Mutant::EndClosesOldest) { Some(0) } else { self.s.windows.iter().position(|w| *w == ev.span) };
                let i = i.expect("W2 after its W1: a window is open");
                note!(self, "W2: T{t} closes the window on {} (after the release)", self.s.windows[i]);
                self.s.windows.remove(i);
                self.ret(t as u8, false, end_op, Ret::Done);
                self.finish_event(t);
            }
            EvPc::Bump => {
                if paired && self.mutant(Mutant::WindowCountAfterQueue) && self.s.uncounted_windows > 0 {
                    note!(self, "W1 (mutant): T{t} stores the open count only now");
                    self.s.uncounted_windows -= 1;
                }
                if paired && self.mutant(Mutant::WindowAfterQueue) {
                    note!(self, "W1 (mutant): T{t} opens the window on {} only now", ev.span);
                    self.s.windows.push(ev.span);
                }
                self.bump(t);
                match self.m.cfg.monitor {
                    MonitorKind::Sync if paired => self.set_ev_pc(t, EvPc::End),
                    MonitorKind::Sync => self.set_ev_pc(t, EvPc::H1),
                    MonitorKind::Async if self.m.uffd_watches(&ev.span) => {
                        note!(self, "kernel: uffd event {} queued; T{t} sleeps until it is read", ev.span);
                        self.s.uffd.push((ev.span, t as Actor));
                        self.thread_mut(t).waiting = true;
                        self.set_ev_pc(t, EvPc::Wait);
                    }
                    MonitorKind::Async => self.finish_event(t),
                    MonitorKind::Kdreg2 | MonitorKind::Kdreg2Wait => self.set_ev_pc(t, EvPc::Notify),
                }
            }
            EvPc::H1 => {
                //= spec.md#H1
                let cap = self.m.cfg.max_unreleased as usize;
                if cap > 0 && self.s.queue.len() >= cap {
                    self.collapse_queue(t, ev.span);
                } else {
                    note!(self, "H1: T{t} pushes {} on the invalidation queue", ev.span);
                    self.s.queue.push(ev.span);
                }
                self.set_ev_pc(t, EvPc::H2);
            }
            EvPc::H2 => {
                //= spec.md#H2
                //= spec.md#S7.2
                if self.s.lock == Lock::Free || self.prelocked(t) {
                    note!(self, "H2: T{t} gets the lock: drains and unlocks");
                    self.lock_exclusive(t as Actor);
                    self.drain_queue(t as Actor);
                    self.end_section(t);
                } else {
                    note!(self, "H2: the lock is busy: T{t} returns, leaving the event queued");
                }
                if paired {
                    // W1 returns; the release comes next.
                    self.ret(t as u8, false, begin_op, Ret::Done);
                    self.set_ev_pc(t, EvPc::Bump);
                } else if nbr {
                    self.set_ev_pc(t, EvPc::BumpLast);
                } else {
                    self.finish_event(t);
                }
            }
            EvPc::Enqueue => {
                note!(self, "kernel: uffd event {} queued before the frames change; T{t} sleeps", ev.span);
                self.s.uffd.push((ev.span, t as Actor));
                self.thread_mut(t).waiting = true;
                self.set_ev_pc(t, EvPc::Wait);
            }
            EvPc::Wait => {
                note!(self, "T{t} wakes up: its uffd event was read");
                if nbr || (self.m.cfg.remove && ev.origin == Origin::Script) {
                    self.set_ev_pc(t, EvPc::BumpLast);
                } else {
                    self.finish_event(t);
                }
            }
            EvPc::BumpLast => {
                self.bump(t);
                if self.m.proof_steps() && self.madvise_of(t as Actor).is_some() {
                    note!(self, "kernel: T{t}'s madvise has zapped {}; it is still inside the call", ev.span);
                    self.set_ev_pc(t, EvPc::Return);
                } else {
                    self.finish_event(t);
                }
            }
            EvPc::Return => {
                note!(self, "T{t}'s madvise of {} returns to user mode", ev.span);
                self.finish_event(t);
            }
            EvPc::Notify => self.kdreg2_notify(t, ev.span),
        }
    }

    //= spec.md#L2
    //# A hook that finds it full replaces
    //# the queue's contents by one event covering their hull and its own range:
    /// H1 on a full queue (`CheckConfig::max_unreleased`): one step, as the
    /// queue's mutex makes it (the length never reads 0 meanwhile). The
    /// hull may cover pages no event released (between the events): the
    /// drain that applies it takes their entries out too, which the
    /// contract allows as a release of the hull (L2: "it may invalidate
    /// more than needed, never less"), so the history gets a release event
    /// of the hull, invoked and returned here by a pseudo-thread of its own
    /// (`HULL + t`). Mutant `hull-drops-queued`: the queue keeps only the
    /// new event.
    pub(super) fn collapse_queue(&mut self, t: usize, span: Span) {
        if self.mutant(Mutant::HullDropsQueued) {
            note!(self, "L2 (mutant `hull-drops-queued`): the queue is full: T{t} replaces {:?} by its own {span}", self.s.queue);
            self.s.queue = vec![span];
            return;
        }
        let hull = self.s.queue.iter().fold(span, |h, q| h.union(q));
        note!(self, "L2: the queue {:?} is full: T{t} replaces it by the hull {hull} of its events and {span}", self.s.queue);
        self.s.queue = vec![hull];
        let op = Op::ReleaseEvent { kind: ReleaseKind::Munmap, addr: hull.addr(), len: hull.bytes() };
        let id = HULL + t as u8;
        self.s.lin.invoke(id, op);
        self.s.lin.ret(id, Ret::Done);
    }

    pub(super) fn finish_event(&mut self, t: usize) {
        let ev = self.thread_mut(t).ev.take().expect("event in progress");
        for (i, p) in ev.span.pages().enumerate() {
            let d = &mut self.s.done_gens[p as usize];
            *d = (*d).max(ev.assigned[i]);
        }
        match ev.origin {
            // W2 logged its return.
            Origin::Script if self.m.cfg.pair => self.next_script_op(t),
            Origin::Script => self.finish(t, Ret::Done),
            _ => {
                let op = Op::ReleaseEvent { kind: ev.kind, addr: ev.span.addr(), len: ev.span.bytes() };
                note!(self, "the {:?} release of {} returns", ev.origin, ev.span);
                self.ret(t as u8, true, op, Ret::Done);
            }
        }
    }

    pub(super) fn monitor_read(&mut self) {
        for (span, w) in std::mem::take(&mut self.s.uffd) {
            let madvise = self.madvise_of(w);
            note!(self, "monitor reads the uffd event {span}: T{w} wakes up");
            self.s.threads[w as usize].waiting = false;
            self.s.monitor.buf.push((span, madvise));
        }
    }

    pub(super) fn monitor_apply(&mut self) {
        let read = std::mem::take(&mut self.s.monitor.buf);
        for &(span, madvise) in &read {
            self.apply_event(span, MONITOR);
            if let Some(m) = madvise {
                self.open_remove_window(span, m, MONITOR);
            }
        }
    }

    pub(super) fn monitor_step(&mut self) {
        if self.m.cfg.lanes {
            if self.s.monitor.revoke.is_some() {
                return self.revoke_step(MONITOR);
            }
            if self.lane_prephase(Who::Monitor) {
                return;
            }
            self.fence(MONITOR);
        }
        self.monitor_body()
    }

    pub(super) fn monitor_body(&mut self) {
        if !self.s.monitor.toctou.is_empty() {
            return self.read_counts_late(MONITOR);
        }
        if self.m.ring() {
            return self.reader_step();
        }
        if self.m.cfg.monitor.is_kdreg2() {
            return self.evictor_step();
        }
        let outside = self.mutant(Mutant::AsyncApplyOutsideLock);
        let blocking_read = self.mutant(Mutant::AsyncBlockingReadOutsideLock);
        match self.s.monitor.pc {
            MonPc::Idle if outside || blocking_read => {
                note!(self, "monitor reads without the lock");
                self.monitor_read();
                self.s.monitor.pc = if outside { MonPc::Apply } else { MonPc::Lock };
            }
            MonPc::Idle => {
                //= spec.md#M1
                note!(self, "M1: the uffd fd is readable (nothing read yet)");
                self.s.monitor.pc = MonPc::Lock;
            }
            MonPc::Lock => {
                //= spec.md#M2
                note!(self, "M2: monitor takes the lock exclusive");
                self.lock_exclusive(MONITOR);
                self.s.monitor.pc = if blocking_read { MonPc::Apply } else { MonPc::Read };
            }
            MonPc::Read => {
                //= spec.md#S3.8
                //# reads are non-blocking and happen only while holding the write lock
                self.monitor_read();
                if self.s.monitor.buf.is_empty() {
                    note!(self, "M2: nothing left to read (A2/A6 read it): unlock");
                    self.unlock_exclusive(MONITOR);
                    self.s.monitor.pc = MonPc::Idle;
                } else {
                    self.s.monitor.pc = MonPc::Apply;
                }
            }
            MonPc::Apply => {
                self.monitor_apply();
                if outside {
                    self.perform_dereg(MONITOR);
                } else {
                    self.unlock_exclusive(MONITOR);
                }
                self.s.monitor.pc = MonPc::Idle;
            }
        }
    }

    //= spec.md#M6
    //# reader thread: poll the fd; store the event clock odd; read every
    //# pending message non-blockingly into memory of its own; publish each
    //# release event in the ring; store the clock even; wake the service
    //# thread.
    /// The process monitor's reader, two steps, no lock: (poll, the odd
    /// store, the read, which wakes each releasing thread) and (publish in
    /// the ring, the even store). The odd store is merged into the read: a
    /// gate or a drain between the two sees the clock as just before the
    /// store, which a slower reader would give them too.
    fn reader_step(&mut self) {
        match self.s.monitor.pc {
            MonPc::Idle => {
                note!(self, "M6: the reader stores the event clock odd and reads");
                self.s.reading = true;
                self.monitor_read();
                self.s.monitor.pc = MonPc::Apply;
            }
            _ => {
                let read = std::mem::take(&mut self.s.monitor.buf);
                note!(
                    self,
                    "M6: the reader publishes {} event(s) in the ring and stores the clock even; it wakes the service thread",
                    read.len()
                );
                self.s.ring.extend(read);
                self.s.reading = false;
                self.s.monitor.pc = MonPc::Idle;
            }
        }
    }

    //= spec.md#M5
    //# shared monitor (S7.6), service thread, one round: for each attached
    //# cache in the order they attached, take its lock exclusive, drain it
    //# (M6), unlock it, perform its dereg list
    /// One cache of the service thread's round: lock, drain the ring into
    /// it (M6), unlock, perform its dereg list, in one step (the lock is
    /// free and the clock even when it runs: taking the lock earlier and
    /// waiting there only holds off that cache's threads). A round starts
    /// once some cache is behind the ring and visits every cache in order.
    pub(super) fn service_step(&mut self) {
        let caches = self.m.cfg.caches as usize;
        let c = self.s.monitor.svc.unwrap_or(0) as usize;
        if c == 0 && self.mutant(Mutant::GateBeforeApply) {
            let published = self.s.ring.len() as u8;
            note!(self, "M5 (mutant `gate-before-apply`): the round sets every cache's gate to {published} before it applies anything");
            let mut from = Vec::new();
            for k in 0..caches {
                self.s.swap_cache(k);
                from.push(self.s.applied);
                self.s.applied = published;
                self.s.swap_cache(k);
            }
            self.s.monitor.svc_from = from;
        }
        self.s.monitor.svc = Some(c as u8);
        self.s.swap_cache(c);
        let outside = self.mutant(Mutant::AsyncApplyOutsideLock);
        if outside {
            note!(self, "M5 (mutant `async-apply-outside-lock`): the service thread drains cache {c} without its lock");
            self.drain_ring(MONITOR, c);
            self.perform_dereg(MONITOR);
        } else {
            note!(self, "M5: the service thread locks cache {c} and drains it");
            self.lock_exclusive(MONITOR);
            self.drain_ring(MONITOR, c);
            note!(self, "M5: the service thread unlocks cache {c} and performs its dereg list");
            self.unlock_exclusive(MONITOR);
        }
        // The A-H split mutant's late count reads are not modelled on the
        // service thread: read them now, under this cache's state.
        self.read_counts_late(MONITOR);
        self.s.swap_cache(c);
        self.s.monitor.svc = (c + 1 < caches).then_some(c as u8 + 1);
        if self.s.monitor.svc.is_none() {
            self.s.monitor.svc_from.clear();
        }
    }
}
