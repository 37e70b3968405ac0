//! Lanes: spec.md LN1–LN6, and the dry run that revokes before a step
//! takes entries out of the index.

use super::{AlgoModel, Ctx, Dry, Who};
use crate::config::{lane_slot, Mutant, ScriptOp, Span};
use crate::state::*;
use mrcache_types::LeaseId;
use mrcache_types::{Access, Ret};

pub(super) fn revoke_label(r: Option<&Revoke>) -> String {
    match r.map(|r| r.phase) {
        Some(RevokePhase::Barrier) => "LN5 (heavy barrier: membarrier)".to_string(),
        Some(RevokePhase::Count) => "LN5 (read the slots' counts; pin those above 0; unlock the lanes mutex)".to_string(),
        Some(RevokePhase::Remote(i)) => format!("LN5 (read the remote count of its slot {i})"),
        Some(RevokePhase::Held(i, _)) => format!("LN5 (read held of its slot {i}; pin if the count is above 0)"),
        None => String::new(),
    }
}

impl AlgoModel {
    /// LN1's first check: no release event is pending (queued, or taken or
    /// read and not applied yet; mutant `lane-queue-len-only`: only the queue's length).
    pub fn ln1_sees_no_event(&self, s: &State) -> bool {
        if self.mutant(Mutant::LaneQueueLenOnly) {
            return s.queue.is_empty();
        }
        // With the process's monitor (M6) the reader's buffer is not the
        // cache's: the gate covers a read in progress.
        s.queue.is_empty()
            && (self.ring() || s.monitor.buf.is_empty())
            && s.monitor.popped.is_empty()
            && s.threads.iter().all(|t| t.popped.is_empty())
    }

    /// Other threads can add to a slot's `remote` (a lease is handed over,
    /// or a claim given back with leases out): then the two reads of a
    /// count (`remote`, then `held`) are steps of their own. Otherwise no
    /// step writes `remote`, and reading it commutes with every step.
    pub fn remote_moves(&self) -> bool {
        self.cfg.lanes && (!self.handed.is_empty() || self.cfg.give_backs > 0)
    }

    //= spec.md#LN2
    //# Each key has one slot, chosen by a hash of the key: keys that hash alike
    //# share it, and LN1 compares the slot's key with the request's before it
    //# takes the memo.
    /// LN1: the key's slot of thread `t`'s lane (direct-mapped: one slot per
    /// key, [`lane_slot`]) if it has exactly this key and a non-null `ptr`
    /// (as `t` loads it), and that entry, when no event is pending and the
    /// thread holds a lane's claim.
    pub fn ln1_slot(&self, s: &State, t: usize, span: Span, access: Access) -> Option<(u8, Handle)> {
        if !self.cfg.lanes || !self.ln1_sees_no_event(s) {
            return None;
        }
        let lane = s.threads[t].lane? as usize;
        let i = lane_slot(span, self.cfg.lane_slots) as usize;
        let key = s.lanes[lane][i].key?;
        let matches = key == (span, access) || self.mutant(Mutant::LaneHitIgnoresKey);
        matches.then(|| s.load_ptr(t as Actor, lane, i)).flatten().map(|h| (i as u8, h))
    }

    //= spec.md#LN3
    //# The owner is the thread that holds the lane's claim when it releases.
    /// Whether thread `t`'s release of a lease counted on `lane` is the
    /// owner's (it holds the lane's claim now; mutant
    /// `lane-release-by-acquirer`: it took the lease).
    pub fn releases_as_owner(&self, s: &State, t: usize, by: usize, lane: u8) -> bool {
        s.threads[t].lane == Some(lane) || (self.mutant(Mutant::LaneReleaseByAcquirer) && by == t)
    }

    /// The slots (lane, slot, entry) whose `ptr`, as actor `a` loads it,
    /// points to one of `removed`, or to anything with `all`.
    pub fn lane_targets(&self, s: &State, a: Actor, removed: &[Handle], all: bool) -> Vec<(u8, u8, Handle)> {
        let mut out = Vec::new();
        for l in 0..s.lanes.len() {
            for i in 0..s.lanes[l].len() {
                if let Some(h) = s.load_ptr(a, l, i) {
                    if all || removed.contains(&h) {
                        out.push((l as u8, i as u8, h));
                    }
                }
            }
        }
        out
    }

    /// Whether thread `t`'s next step executes a locked instruction or a
    /// barrier (a lock, an atomic read-modify-write, a system call): x86
    /// then drains its store buffer. The lane steps do not (LN1, LN3: plain
    /// stores and loads, a compiler fence); LN4 does (the lanes mutex).
    pub fn step_flushes(&self, s: &State, t: usize) -> bool {
        let th = &s.threads[t];
        if th.ev.is_some() || !th.toctou.is_empty() {
            return true;
        }
        match th.pc {
            Pc::LN1Store { .. } | Pc::LN1Load { .. } | Pc::LN3Load { .. } => false,
            Pc::LN4 { .. } => !self.mutant(Mutant::LaneDetachedNoMutex),
            // LN4's second read: the lanes mutex is held already.
            Pc::LN4Held { .. } => false,
            Pc::Idle => match self.scripts[t][th.next_op as usize].1 {
                ScriptOp::Acquire { span, access, .. } => self.ln1_slot(s, t, span, access).is_none(),
                // The owner's release is a plain store; another thread's
                // is an atomic add (mutant `lane-remote-writes-held`: a
                // plain store too).
                ScriptOp::Release { lease } => match s.lane_lease(lease) {
                    Some((by, lane, _)) => !(self.releases_as_owner(s, t, by, lane) || self.mutant(Mutant::LaneRemoteWritesHeld)),
                    None => true,
                },
                ScriptOp::Event { .. } => true,
                // The invocation only: the flush locks at its next step.
                ScriptOp::Flush | ScriptOp::Fork => false,
            },
            _ => true,
        }
    }
}

impl Ctx<'_> {
    /// LN1 at the start of an acquire: a slot of this thread's lane has the
    /// key; returns whether the lane hit starts (else A1).
    pub(super) fn ln1_start(&mut self, t: usize, span: Span, access: Access) -> bool {
        if let Some((slot, h)) = self.m.ln1_slot(self.s, t, span, access) {
            //= spec.md#LN1
            //# if the queue is empty, the draining count is 0, and a slot of this
            //# thread's lane has exactly the request's key (page span, access) and
            //# a non-null `ptr`
            note!(self, "LN1: no event pending; slot {slot} of T{t}'s lane has the key and ptr #{h}");
            self.thread_mut(t).pc = Pc::LN1Store { slot, h };
            return true;
        }
        false
    }

    pub(super) fn revoke_mut(&mut self, a: Actor) -> &mut Option<Revoke> {
        if a == MONITOR {
            &mut self.s.monitor.revoke
        } else {
            &mut self.s.threads[a as usize].revoke
        }
    }

    pub(super) fn set_applying(&mut self, what: Option<bool>) {
        if let Some(d) = self.dry.as_mut() {
            d.applying = what;
        }
    }

    pub(super) fn popped_mut(&mut self, a: Actor) -> &mut Vec<Span> {
        if a == MONITOR {
            &mut self.s.monitor.popped
        } else {
            &mut self.s.threads[a as usize].popped
        }
    }

    //= spec.md#LN5
    /// The step about to take entries out of the index: each such entry's
    /// slots must be revoked first. Called with the entry as it leaves the
    /// index. A dry run records it; a real step finds its slots revoked
    /// already, by the LN5 that [`Ctx::lane_prephase`] ran before the step.
    pub(super) fn revoke(&mut self, a: Actor, h: Handle) {
        if !self.m.cfg.lanes {
            return;
        }
        if let Some(d) = self.dry.as_mut() {
            d.removed.push(h);
            match d.applying {
                Some(false) => d.by_queue.push(h),
                Some(true) => d.by_uffd.push(h),
                None => {}
            }
            return;
        }
        let left = self.m.lane_targets(self.s, a, &[h], false);
        assert!(left.is_empty(), "{} takes #{h} out of the index with live slots {left:?}", actor_name(a));
    }

    //= spec.md#LN5
    //# Trim revokes every slot before it notes.
    pub(super) fn revoke_all(&mut self, a: Actor) {
        if !self.m.cfg.lanes {
            return;
        }
        if let Some(d) = self.dry.as_mut() {
            d.all = true;
            return;
        }
        let left = self.m.lane_targets(self.s, a, &[], true);
        assert!(left.is_empty(), "{} notes with live slots {left:?}", actor_name(a));
    }

    /// Before actor `a`'s step: a dry run of the step on a copy of the state
    /// says which entries it takes out of the index (or that it revokes
    /// every slot). If live slots point to them, the step waits and `a` runs
    /// LN5 first, in three steps: this one (take the lock exclusive if the
    /// step takes it, the lanes mutex; take the queued or uffd events whose
    /// entries are revoked, as the drain does before it can know the
    /// entries; store null into the slots, through the store buffer), then
    /// the heavy barrier, then the count reads and pins. Returns whether it
    /// took this first step.
    pub(super) fn lane_prephase(&mut self, who: Who) -> bool {
        let a = match who {
            Who::Thread(t, _) | Who::Fails(t) => t as Actor,
            Who::Monitor => MONITOR,
        };
        if !(self.s.lock == Lock::Free || self.s.lock == Lock::Exclusive(a)) {
            return false;
        }
        if self.m.lane_targets(self.s, a, &[], true).is_empty() {
            return false;
        }
        let mut copy = self.s.clone();
        let dry = {
            let mut cx = Ctx { m: self.m, s: &mut copy, rec: None, dry: Some(Dry::default()) };
            match who {
                Who::Thread(t, alt) => cx.thread_body(t, alt),
                Who::Monitor => cx.monitor_body(),
                Who::Fails(t) => cx.registrar_fails(t),
            }
            cx.dry.take().expect("dry run")
        };
        let targets = self.m.lane_targets(self.s, a, &dry.removed, dry.all);
        if targets.is_empty() {
            return false;
        }
        //= spec.md#LN5
        //# revoke (under the lock exclusive and the lanes mutex): set `ptr` to null
        //# in every slot that points to the entries being revoked
        self.fence(a);
        if self.s.lock == Lock::Free {
            assert_ne!(a, MONITOR, "the monitor revokes only inside M2");
            self.lock_exclusive(a);
            self.s.threads[a as usize].prelocked = true;
            note!(self, "{} takes the lock exclusive", actor_name(a));
        }
        if targets.iter().any(|(_, _, h)| dry.by_queue.contains(h)) {
            let q = std::mem::take(&mut self.s.queue);
            note!(self, "A-D: {} takes the queued events {q:?} (applied after the revoke)", actor_name(a));
            self.popped_mut(a).extend(q);
        }
        if targets.iter().any(|(_, _, h)| dry.by_uffd.contains(h)) {
            for (span, w) in std::mem::take(&mut self.s.uffd) {
                note!(self, "{} reads the uffd event {span}: T{w} wakes up (applied after the revoke)", actor_name(a));
                self.s.threads[w as usize].waiting = false;
                self.popped_mut(a).push(span);
            }
        }
        for &(lane, slot, _) in &targets {
            self.sb_mut(a).push(Store::Ptr { lane, slot, val: None });
        }
        note!(
            self,
            "LN5: {} takes the lanes mutex and stores null into {} (store buffer)",
            actor_name(a),
            targets.iter().map(|(l, i, h)| format!("T{l}.slot{i} (#{h})")).collect::<Vec<_>>().join(", ")
        );
        *self.revoke_mut(a) = Some(Revoke { phase: RevokePhase::Barrier, slots: targets });
        true
    }

    //= spec.md#LN5
    //= spec.md#LN6
    //# LN5 stores null, runs the heavy barrier, then loads the count.
    pub(super) fn revoke_step(&mut self, a: Actor) {
        let r = self.revoke_mut(a).clone().expect("an LN5 in progress");
        match r.phase {
            RevokePhase::Barrier => {
                if self.mutant(Mutant::LaneNoHeavyBarrier) {
                    note!(self, "LN5 (mutant `lane-no-heavy-barrier`): a full fence on {} only", actor_name(a));
                    self.fence(a);
                } else {
                    note!(self, "LN5: heavy barrier: every thread executes a full barrier (all store buffers drain)");
                    self.fence(a);
                    for t in 0..self.s.threads.len() {
                        self.fence(t as Actor);
                    }
                    self.fence(MONITOR);
                }
                self.revoke_mut(a).as_mut().expect("LN5").phase =
                    if self.m.remote_moves() { RevokePhase::Remote(0) } else { RevokePhase::Count };
            }
            //= spec.md#LN5
            //# then for each such slot whose count (read `remote`, then `held`) is
            //# above 0, pin it
            RevokePhase::Remote(k) => {
                let (lane, slot, _) = r.slots[k as usize];
                let remote = self.s.lanes[lane as usize][slot as usize].remote;
                note!(self, "LN5: {} reads T{lane}.slot{slot}'s remote: {remote}", actor_name(a));
                self.revoke_mut(a).as_mut().expect("LN5").phase = RevokePhase::Held(k, remote);
            }
            RevokePhase::Held(k, remote) => {
                let (lane, slot, h) = r.slots[k as usize];
                self.count_and_pin(a, lane, slot, h, remote);
                if (k as usize) + 1 < r.slots.len() {
                    self.revoke_mut(a).as_mut().expect("LN5").phase = RevokePhase::Remote(k + 1);
                } else {
                    note!(self, "LN5: {} unlocks the lanes mutex", actor_name(a));
                    *self.revoke_mut(a) = None;
                }
            }
            RevokePhase::Count => {
                for (lane, slot, h) in r.slots {
                    let remote = self.s.lanes[lane as usize][slot as usize].remote;
                    self.count_and_pin(a, lane, slot, h, remote);
                }
                note!(self, "LN5: {} unlocks the lanes mutex", actor_name(a));
                *self.revoke_mut(a) = None;
            }
        }
    }

    /// LN5's read of `held` after `remote` (read as `remote`), and the pin
    /// of a slot whose count is above 0.
    fn count_and_pin(&mut self, a: Actor, lane: u8, slot: u8, h: Handle, remote: u8) {
        let (l, i) = (lane as usize, slot as usize);
        let held = self.s.load_held(a, l, i);
        let count = held.wrapping_sub(remote);
        if count > 0 && !self.mutant(Mutant::LaneRevokeNoPin) {
            assert_eq!(self.s.lanes[l][i].pin, None, "a live slot has no pin");
            self.s.lanes[l][i].pin = Some(h);
            self.s.regs[h as usize].leases += 1;
            note!(self, "LN5: T{l}.slot{i} counts {count} (remote {remote}, held {held}): pin #{h}, its state word gains a lease");
        } else {
            note!(self, "LN5: T{l}.slot{i} counts {count} (remote {remote}, held {held}): no pin");
        }
    }

    //= spec.md#LN2
    //# after an A1 hit, if no slot has the key, take a slot with count 0 and no
    //# pin and set its key and `ptr`.
    /// (A slot that has the key with a null `ptr`, revoked, counts as not
    /// having it.) The stores reach memory at the unlock that follows.
    pub(super) fn memoize(&mut self, t: usize, h: Handle) {
        if !self.m.cfg.lanes {
            return;
        }
        let key = (self.acq(t).req, self.acq(t).access);
        let a = t as Actor;
        let Some(lane) = self.s.threads[t].lane.map(usize::from) else {
            note!(self, "LN2: T{t} holds no lane claim: no memo");
            return;
        };
        // The key's one slot (direct-mapped): another key's memo there is
        // replaced once its count is 0 and it has no pin. (The cache keeps
        // a live memo of another key for a few A1 hits first: a memo
        // skipped, which LN2 allows; the model replaces at once.)
        let slot = lane_slot(key.0, self.m.cfg.lane_slots) as usize;
        if self.s.lanes[lane][slot].key == Some(key) && self.s.load_ptr(a, lane, slot).is_some() {
            return;
        }
        let free = self.s.slot_count(lane, slot) == 0 && self.s.lanes[lane][slot].pin.is_none();
        if !free && !self.mutant(Mutant::LaneReuseBusySlot) {
            note!(self, "LN2: slot {slot} of T{t}'s lane counts a lease or has a pin: no memo");
            return;
        }
        self.fence(a);
        let sl = &mut self.s.lanes[lane][slot];
        sl.key = Some(key);
        sl.ptr = Some(h);
        note!(self, "LN2: T{t} memoizes #{h} in slot {slot} of lane {lane} ({})", slot_line(&self.s.lanes[lane][slot]));
    }

    //= spec.md#LN3
    //# A thread claims the first free lane at its first A1 on the cache
    /// The A1 of a thread that holds no lane claim claims the first free
    /// lane (a compare-exchange on its claim flag, which sees a claim given
    /// back once that store has reached memory). The thread's store buffer
    /// drains first (a locked instruction).
    pub(super) fn claim_lane(&mut self, t: usize) {
        if !self.m.cfg.lanes || self.s.threads[t].lane.is_some() {
            return;
        }
        self.fence(t as Actor);
        match self.s.claimed.iter().position(|c| !c) {
            Some(l) => {
                self.s.claimed[l] = true;
                self.thread_mut(t).lane = Some(l as u8);
                note!(self, "A1: T{t} claims lane {l} (the first free one)");
            }
            None => note!(self, "A1: T{t} finds no free lane (a claim given back has not reached memory): no lane this time"),
        }
    }

    //= spec.md#LN3
    //# gives the claim back when it exits, or when it holds claims on too many
    //# caches (the oldest goes first), with its lane leases still out: a lease
    //# is then released by a thread that does not hold its lane, which adds to
    //# `remote`, and the next claimer of the lane takes over its memos and counts.
    /// Thread `t` gives its lane's claim back: it forgets the lane at once
    /// (its claim list), and the store that frees it goes through its
    /// store buffer, after its `held` stores.
    pub(super) fn give_claim(&mut self, t: usize) {
        let lane = self.thread_mut(t).lane.take().expect("a claim to give back");
        self.s.give_backs_left -= 1;
        self.sb_mut(t as Actor).push(Store::Claim { lane });
        note!(self, "T{t} gives lane {lane}'s claim back (taken = false, store buffer); its lane leases stay out");
    }

    //= spec.md#LN1
    //# store `held + 1`; light barrier; load `ptr` again.
    pub(super) fn ln1_store(&mut self, t: usize, slot: u8, h: Handle) {
        let lane = self.s.threads[t].lane.expect("LN1 on a claimed lane");
        let val = self.s.load_held(t as Actor, lane as usize, slot as usize).wrapping_add(1);
        self.sb_mut(t as Actor).push(Store::Held { lane, slot, val });
        note!(self, "LN1: T{t} stores held = {val} into slot {slot} (store buffer)");
        if self.mutant(Mutant::LaneNoRecheck) {
            note!(self, "LN1 (mutant `lane-no-recheck`): no reload of ptr");
            return self.lane_hit(t, slot, h);
        }
        self.thread_mut(t).pc = Pc::LN1Load { slot, h };
    }

    //= spec.md#LN1
    //# If unchanged, touch the LRU stamp and return the hit, a lease on the
    //# slot.
    pub(super) fn ln1_load(&mut self, t: usize, slot: u8, h: Handle) {
        let a = t as Actor;
        let lane = self.s.threads[t].lane.expect("LN1 on a claimed lane");
        let p = self.s.load_ptr(a, lane as usize, slot as usize);
        if p == Some(h) {
            note!(self, "LN1: light barrier (compiler fence); T{t} reloads slot {slot}'s ptr: #{h}, unchanged");
            return self.lane_hit(t, slot, h);
        }
        if self.mutant(Mutant::LaneUndoDespitePin) {
            let val = self.s.load_held(a, lane as usize, slot as usize).wrapping_sub(1);
            self.sb_mut(a).push(Store::Held { lane, slot, val });
            note!(self, "LN1 (mutant `lane-undo-despite-pin`): T{t} reloads slot {slot}'s ptr: null (revoked): it stores held = {val} back (store buffer) and runs LN4");
            self.thread_mut(t).pc = Pc::LN4 { lane, slot, h, then_a1: true };
            return;
        }
        note!(self, "LN1: T{t} reloads slot {slot}'s ptr: null (revoked); next it reads the slot's pin");
        self.thread_mut(t).pc = Pc::LN1Pin { slot, h };
    }

    //= spec.md#LN1
    //# Else take the lanes mutex and read the slot's pin. If the pin is the
    //# memoized entry, keep the count and return the hit as above
    pub(super) fn ln1_pin(&mut self, t: usize, slot: u8, h: Handle) {
        let a = t as Actor;
        let lane = self.s.threads[t].lane.expect("LN1 on a claimed lane");
        if self.s.lanes[lane as usize][slot as usize].pin == Some(h) {
            note!(self, "LN1: T{t} (lanes mutex) finds slot {slot} pinned to #{h}: it keeps its count and hits");
            return self.lane_hit(t, slot, h);
        }
        //= spec.md#LN1
        //# Else store `held` back and go to A1
        let val = self.s.load_held(a, lane as usize, slot as usize).wrapping_sub(1);
        self.sb_mut(a).push(Store::Held { lane, slot, val });
        let pin = self.s.lanes[lane as usize][slot as usize].pin;
        note!(
            self,
            "LN1: T{t} (lanes mutex) finds slot {slot}'s pin {pin:?}, not #{h}: it stores held = {val} back (store buffer) and goes to A1"
        );
        self.thread_mut(t).pc = Pc::A1;
    }

    pub(super) fn lane_hit(&mut self, t: usize, slot: u8, h: Handle) {
        let lease = self.acq(t).lease;
        self.touch(h);
        let th = self.thread_mut(t);
        let lane = th.lane.expect("LN1 on a claimed lane");
        th.held.push((lease, h));
        th.lane_leases.push((lease, lane, slot));
        note!(self, "LN1: T{t}'s lane hit on #{h} (slot {slot})");
        let ret = self.judge_lease(t, h, true);
        self.finish(t, ret);
    }

    //= spec.md#LN3
    //# lane release: touch the LRU stamp; the owner stores `held − 1`, another
    //# thread adds 1 to `remote` (release order).
    /// Thread `t` releases `lease`, which thread `by` took on slot `slot` of
    /// lane `lane` (`by` is `t` unless the lease was handed over). The owner
    /// is the thread holding the lane's claim *now*: a thread that gave its
    /// claim back releases as any other.
    pub(super) fn ln3(&mut self, t: usize, by: usize, lease: LeaseId, lane: u8, slot: u8) {
        let th = self.thread_mut(by);
        let i = th.held.iter().position(|(l, _)| *l == lease).expect("a lane lease is held");
        let (_, h) = th.held.remove(i);
        th.lane_leases.retain(|(l, _, _)| *l != lease);
        if self.s.regs[h as usize].findable && !self.mutant(Mutant::ReleaseNoLruTouch) {
            self.touch(h);
        }
        let a = t as Actor;
        let (l, i) = (lane as usize, slot as usize);
        if self.m.releases_as_owner(self.s, t, by, lane) || self.mutant(Mutant::LaneRemoteWritesHeld) {
            let val = self.s.load_held(a, l, i).wrapping_sub(1);
            self.sb_mut(a).push(Store::Held { lane, slot, val });
            let who = if self.s.threads[t].lane == Some(lane) { "the owner" } else { "not the owner (mutant)" };
            note!(self, "LN3: T{t} ({who}) releases L{lease} on lane {lane} slot {slot}: stores held = {val} (store buffer)");
        } else {
            self.fence(a);
            let r = &mut self.s.lanes[l][i].remote;
            *r = r.wrapping_add(1);
            let r = *r;
            note!(self, "LN3: T{t} (not lane {lane}'s owner) releases L{lease} on slot {slot}: adds 1 to remote, now {r} (atomic)");
        }
        self.thread_mut(t).pc = Pc::LN3Load { lane, slot, h };
    }

    //= spec.md#LN3
    //# Light barrier; load `ptr`: if it is still the lease's entry, read the
    //# over-limit flag and run R2 if it is set; else run LN4.
    pub(super) fn ln3_load(&mut self, t: usize, lane: u8, slot: u8, h: Handle) {
        let p = self.s.load_ptr(t as Actor, lane as usize, slot as usize);
        if p == Some(h) {
            let r2 = self.s.over_limit && !self.mutant(Mutant::NoReleaseEviction);
            note!(
                self,
                "LN3: T{t} reloads slot {slot}'s ptr: #{h}, still the lease's entry{}",
                if r2 { "; the over-limit flag is set: R2" } else { "" }
            );
            if r2 {
                self.thread_mut(t).pc = Pc::R2;
            } else {
                self.finish(t, Ret::Done);
            }
        } else {
            note!(self, "LN3: T{t} reloads slot {slot}'s ptr: revoked: LN4");
            self.thread_mut(t).pc = Pc::LN4 { lane, slot, h, then_a1: false };
        }
    }

    //= spec.md#LN4
    //# take the lanes mutex; if the slot's count is 0 and its pin is the
    //# lease's entry, clear the pin and release the pin as R1
    pub(super) fn ln4(&mut self, t: usize, lane: u8, slot: u8, h: Handle, then_a1: bool) {
        let remote = self.s.lanes[lane as usize][slot as usize].remote;
        if self.m.remote_moves() {
            note!(self, "LN4: T{t} takes the lanes mutex and reads lane {lane} slot {slot}'s remote: {remote}");
            self.thread_mut(t).pc = Pc::LN4Held { lane, slot, h, then_a1, remote };
            return;
        }
        self.ln4_held(t, lane, slot, h, then_a1, remote)
    }

    //= spec.md#LN4
    //# if the slot's count is 0 and its pin is the lease's entry, clear the pin
    /// LN4 after its read of `remote` (as `remote`): it reads `held`, and
    /// returns the pin if the count is 0.
    pub(super) fn ln4_held(&mut self, t: usize, lane: u8, slot: u8, h: Handle, then_a1: bool, remote: u8) {
        let (l, i) = (lane as usize, slot as usize);
        let count = self.s.load_held(t as Actor, l, i).wrapping_sub(remote);
        let mut r2 = false;
        if count == 0 && self.s.lanes[l][i].pin == Some(h) {
            self.s.lanes[l][i].pin = None;
            let r = &mut self.s.regs[h as usize];
            r.leases -= 1;
            let (left, invalid) = (r.leases, r.invalid);
            note!(
                self,
                "LN4: T{t} (lanes mutex) finds slot {slot} at count 0 with pin #{h}: clears it, decrements #{h} to {left}{}",
                if invalid { " (INVALID)" } else { "" }
            );
            if left == 0 && invalid {
                //= spec.md#A-H
                self.deregister(h);
            } else {
                r2 = left == 0 && self.s.over_limit && !self.mutant(Mutant::NoReleaseEviction);
            }
        } else {
            let pin = self.s.lanes[l][i].pin;
            note!(self, "LN4: T{t} (lanes mutex) finds slot {slot} at count {count}, pin {pin:?}: nothing to return");
        }
        self.thread_mut(t).pc = match (then_a1, r2) {
            (true, true) => Pc::R2ThenA1,
            (true, false) => Pc::A1,
            (false, true) => Pc::R2,
            (false, false) => return self.finish(t, Ret::Done),
        };
    }
}
