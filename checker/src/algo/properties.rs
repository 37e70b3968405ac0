//! The properties of [`crate::props`] as stateright properties of the model,
//! and the model-side judgements they need (L1, P5, P6).

use super::AlgoModel;
use crate::config::MonitorKind;
use crate::props::*;
use crate::state::{EvPc, Lock, MonPc, Pc, State, MONITOR};
use mrcache_model::OverlapPolicy;
use stateright::{Model, Property};

/// The properties for a configuration: P5 only with limits; the merge goal only
/// under `merge`, the uncache goal only under `no-merge-uncache-contained`;
/// the read-not-applied goal only with the async monitor, the deferred-hook
/// goal only with the sync one.
///
/// Each property cites (`type=test`) the steps of spec.md §A whose breakage
/// it catches, as the mutants show (`Mutant::caught_by`): every pinned
/// configuration (tests/pinned.rs) checks them.
pub fn properties(m: &AlgoModel) -> Vec<Property<AlgoModel>> {
    let mut v = vec![
        // The lookups' access rule (hit-ignores-access).
        //= spec.md#A1 type=test
        //= spec.md#A3 type=test
        //= spec.md#A8 type=test
        Property::always(P1, |_: &AlgoModel, s: &State| !s.bad.iter().any(|b| b.property == P1)),
        // A-D and what orders it before the release returns: A2's drain,
        // A5's watch, A7's recheck (no-seq-recheck), the monitor's reads
        // (M1, M2, S3.8: async-apply-outside-lock,
        // async-blocking-read-outside-lock), the windows (W1-W3, M3, M4:
        // begin-keeps-entries, end-closes-oldest, windowed-cached,
        // remove-without-window).
        //= spec.md#A2 type=test
        //= spec.md#A5 type=test
        //= spec.md#A7 type=test
        //= spec.md#A-D type=test
        //= spec.md#M1 type=test
        //= spec.md#M2 type=test
        //= spec.md#M3 type=test
        //= spec.md#M4 type=test
        //= spec.md#S3.8 type=test
        //= spec.md#W1 type=test
        //= spec.md#W2 type=test
        //= spec.md#W3 type=test
        Property::always(P2, |_: &AlgoModel, s: &State| !s.bad.iter().any(|b| b.property == P2)),
        // P3. A lease a thread holds counts, whatever the state word says:
        // a lane lease is on no state word until a revoke pins it, and a
        // count that lost a lease (lease-count-saturates) reads 0 under it. A9's displacement (merge-drops-leased) and the lane
        // protocol (lane-no-recheck, lane-reuse-busy-slot, lane-revoke-no-pin,
        // lane-no-heavy-barrier).
        //= spec.md#A9 type=test
        //= spec.md#A0 type=test
        //= spec.md#LN1 type=test
        //= spec.md#LN2 type=test
        //= spec.md#LN5 type=test
        //= spec.md#LN6 type=test
        Property::always(P3, |_: &AlgoModel, s: &State| {
            !s.regs
                .iter()
                .enumerate()
                .any(|(h, r)| r.deregs > 0 && (r.leases > 0 || (s.others.is_empty() && s.lease_held_on(h as u8))))
                // The other caches on the monitor (M5; no lanes there).
                && !s.others.iter().any(|o| o.regs.iter().any(|r| r.deregs > 0 && r.leases > 0))
        }),
        // The handoff's one atomic step (handoff-toctou).
        //= spec.md#A-H type=test
        Property::always(P4, |_: &AlgoModel, s: &State| {
            s.regs.iter().chain(s.others.iter().flat_map(|o| o.regs.iter())).all(|r| r.deregs <= 1)
        }),
    ];
    if m.cfg.has_limits() {
        // The note, the eviction and the releases that evict (note-one-short,
        // over-limit-flag-late, no-release-eviction; a lane release runs R2).
        //= spec.md#A6 type=test
        //= spec.md#A10 type=test
        //= spec.md#R2 type=test
        //= spec.md#LN3 type=test
        v.push(Property::always(P5, |m: &AlgoModel, s: &State| !s.quiescent() || !m.over_limits_with_victim(s)));
    }
    // Each cache's history against its own sequential model (M5: a release
    // is in every cache's history). R1's LRU touch (release-no-lru-touch,
    // release-touch-after-decrement).
    //= spec.md#R1 type=test
    v.push(Property::always(LINEARIZABLE, |_: &AlgoModel, s: &State| !s.quiescent() || crate::lincache::all_linearizable(s)));
    //= spec.md#P6
    v.push(Property::always(P6, |m: &AlgoModel, s: &State| m.deadlock(s).is_none()));
    // Deferred events are drained (queue-never-drained, holder-skips-drain,
    // reader-skips-drain) and lane pins returned (lane-detached-no-mutex).
    //= spec.md#A11 type=test
    //= spec.md#H1 type=test
    //= spec.md#S3.9 type=test
    //= spec.md#LN4 type=test
    v.push(Property::always(L1, |m: &AlgoModel, s: &State| !m.is_terminal(s) || m.l1_failure(s).is_none()));
    // The goals on registrations: in any cache (M5).
    v.push(Property::sometimes(S_LEASED_INVALIDATED, |_: &AlgoModel, s: &State| {
        s.all_regs().any(|r| r.id > 0 && r.invalid && r.leases > 0)
    }));
    match m.cfg.policy {
        OverlapPolicy::Merge => v.push(Property::sometimes(S_MERGE, |_: &AlgoModel, s: &State| s.all_regs().any(|r| r.displaced))),
        OverlapPolicy::NoMergeUncacheContained => {
            v.push(Property::sometimes(S_UNCACHE, |_: &AlgoModel, s: &State| s.all_regs().any(|r| r.displaced)))
        }
        OverlapPolicy::Independent => {}
    }
    if m.cfg.pair || m.cfg.remove {
        v.push(Property::sometimes(S_WINDOWED, |_: &AlgoModel, s: &State| s.windowed_served || s.others.iter().any(|o| o.windowed_served)));
    }
    if m.cfg.registrar_failures > 0 {
        v.push(Property::sometimes(S_TRIM_EVICTS, |_: &AlgoModel, s: &State| s.trim_evicted));
    }
    if m.cfg.lanes {
        v.push(Property::sometimes(S_LANE_HIT, |_: &AlgoModel, s: &State| s.threads.iter().any(|t| !t.lane_leases.is_empty())));
        v.push(Property::sometimes(S_LANE_PIN, |_: &AlgoModel, s: &State| s.lanes.iter().flatten().any(|sl| sl.pin.is_some())));
        v.push(Property::sometimes(S_LANE_HIT_PINNED, |_: &AlgoModel, s: &State| {
            s.threads.iter().any(|th| match (th.pc, th.lane) {
                (Pc::LN1Pin { slot, h }, Some(lane)) => s.lanes[lane as usize][slot as usize].pin == Some(h),
                _ => false,
            })
        }));
        v.push(Property::sometimes(S_LANE_UNDO, |_: &AlgoModel, s: &State| {
            s.threads.iter().any(|th| match (th.pc, th.lane) {
                // With the lanes mutex free no revoke is under way, and
                // none can pin this slot again (its `ptr` stays null): the
                // undo is certain.
                (Pc::LN1Pin { slot, h }, Some(lane)) => s.lanes[lane as usize][slot as usize].pin != Some(h) && !s.lanes_mutex_held(),
                _ => false,
            })
        }));
    }
    // A4's in-flight record made stale by an event.
    //= spec.md#A4 type=test
    v.push(Property::sometimes(S_EVENT_DURING_REGISTRATION, |_: &AlgoModel, s: &State| {
        s.threads.iter().any(|t| t.inflight.is_some_and(|i| i.stale))
    }));
    match m.cfg.monitor {
        MonitorKind::Async => v.push(Property::sometimes(S_READ_NOT_APPLIED, |_: &AlgoModel, s: &State| {
            !s.monitor.buf.is_empty() && s.threads.iter().any(|t| t.acq.is_some())
        })),
        MonitorKind::Sync => v.push(Property::sometimes(S_HOOK_DEFERRED, |_: &AlgoModel, s: &State| {
            !s.queue.is_empty() && !s.threads.iter().any(|t| t.ev.as_ref().is_some_and(|e| e.pc == EvPc::H2))
        })),
        // The kdreg2 models' deferral is shown reached by their verdicts
        // (checker/tests/findings.rs): kdreg2 fails where kdreg2-wait holds.
        MonitorKind::Kdreg2 | MonitorKind::Kdreg2Wait => {}
    }
    v
}

impl AlgoModel {
    /// Terminal: every script finished and the monitor has nothing left to do.
    pub fn is_terminal(&self, s: &State) -> bool {
        s.all_finished()
    }

    /// Why L1 fails in a terminal state, if it does.
    pub fn l1_failure(&self, s: &State) -> Option<String> {
        for c in 1..=s.others.len() {
            let mut v = s.clone();
            v.swap_cache(c);
            v.others.clear();
            if let Some(f) = self.l1_failure(&v) {
                return Some(format!("cache {c}: {f}"));
            }
        }
        if !s.queue.is_empty() {
            return Some(format!("the invalidation queue still holds {:?} after every script finished", s.queue));
        }
        if let Some((h, r)) = s.regs.iter().enumerate().find(|(_, r)| r.deregs == 0 && !r.findable && r.leases == 0 && !r.forgotten) {
            return Some(format!("registration #{h} {} is neither findable nor leased and was never deregistered", r.span));
        }
        // Lanes: a pin is a lease held for the slot's lane leases; with none
        // left it must have been returned (LN4, LN6).
        for (t, lane) in s.lanes.iter().enumerate() {
            for (i, sl) in lane.iter().enumerate() {
                if let Some(h) = sl.pin {
                    if s.slot_count(t, i) == 0 {
                        return Some(format!("T{t}.slot{i} counts 0 but still pins #{h}: the pin is never returned"));
                    }
                }
            }
        }
        None
    }

    /// Why the state is a deadlock (P6), if it is: an actor that holds the lock
    /// exclusively cannot take its next step (it waits for itself, or for
    /// something only a lock holder could do), or nobody can move although a
    /// script is unfinished. H2 only tries the lock (blocking-hook).
    //= spec.md#P6 type=test
    //= spec.md#H2 type=test
    pub fn deadlock(&self, s: &State) -> Option<String> {
        if let Lock::Exclusive(a) = s.lock {
            // kdreg2: A9's subscribe waits for the module's mutex, which the
            // evictor releases without the cache lock (its read's second step).
            let on_klock = a != MONITOR && s.klock && s.monitor.pc == MonPc::Read;
            let stuck = if a == MONITOR { !self.monitor_enabled(s) } else { !self.thread_enabled(s, a as usize) && !on_klock };
            let busy = a == MONITOR && s.monitor.pc != MonPc::Idle || a != MONITOR && s.threads[a as usize].pc != crate::state::Pc::Done;
            if stuck && busy {
                return Some(format!("{} holds the lock exclusively and waits: {}", crate::state::actor_name(a), self.blocked_on(s, a)));
            }
        }
        // A thread that can step is an action (`actions` lists it first):
        // the common case, without listing them all.
        let movable = (0..s.threads.len()).any(|t| self.thread_enabled(&s.seen_from_cache(self.cache_of(t)), t)) || {
            let mut actions = Vec::new();
            self.actions(s, &mut actions);
            !actions.is_empty()
        };
        if !movable && !s.all_finished() {
            let waiting: Vec<String> = (0..s.threads.len())
                .filter(|&t| s.threads[t].pc != crate::state::Pc::Done)
                .map(|t| format!("T{t} {}", self.blocked_on(s, t as u8)))
                .collect();
            return Some(format!("no thread can move: {}", waiting.join("; ")));
        }
        None
    }

    /// Over a limit with an evictable entry: findable, and unleased (with
    /// lanes: no lane lease either).
    pub fn over_limits_with_victim(&self, s: &State) -> bool {
        self.over_limits(s)
            && s.regs.iter().enumerate().any(|(h, r)| r.findable && r.leases == 0 && !(self.cfg.lanes && s.lease_held_on(h as u8)))
    }
}
