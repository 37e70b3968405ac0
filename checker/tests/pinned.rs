//! The correct algorithm passes every property and reaches every goal in each
//! pinned configuration, with the recorded number of unique states. The
//! items of spec.md each property checks are cited on it
//! (`checker/src/algo/properties.rs`).

use mrcache_checker::{check, pinned_configs, props, RunOptions};

fn check_family(family: &str) {
    let configs: Vec<_> = pinned_configs().into_iter().filter(|p| p.name.split(' ').next() == Some(family)).collect();
    assert!(!configs.is_empty(), "no pinned configuration in family {family}");
    let opts = RunOptions { workers: 1, stop_at_first_failure: false, ..RunOptions::default() };
    let mut failures = Vec::new();
    for p in configs {
        let out = check(&p.cfg, &opts).unwrap();
        eprintln!("{}: {} unique states in {:.2?}", p.name, out.unique_states, out.elapsed);
        if !out.complete {
            failures.push(format!("{}: exploration incomplete", p.name));
        }
        if let Some(c) = &out.counterexample {
            failures.push(format!("{}: {:?} violated\n{}", p.name, out.violated(), c.timeline));
        }
        if p.goals_required && !out.unreached().is_empty() {
            failures.push(format!("{}: goals not reached: {:?}", p.name, out.unreached()));
        }
        if family == "lanes" {
            let lane_goals: Vec<_> = out.unreached().into_iter().filter(|g| g.contains("lane")).collect();
            if !lane_goals.is_empty() {
                failures.push(format!("{}: lane goals not reached: {lane_goals:?}", p.name));
            }
        }
        // The note's revoke (LN5) must pin a lane lease there: the case it exists for.
        if family == "lanes+note" && out.unreached().into_iter().any(|g| g.contains("a revoke pins a lane lease")) {
            failures.push(format!("{}: no note pinned a lane lease", p.name));
        }
        // A registration planned inside a REMOVE's window (M3) must be
        // served uncached there (W3): the case the window exists for.
        if (family == "remove" || family == "remove+proof" || family == "shared+remove") && out.unreached().contains(&props::S_WINDOWED) {
            failures.push(format!("{}: no registration was served inside a REMOVE window", p.name));
        }
        if out.unique_states != p.unique_states {
            failures.push(format!("{}: {} unique states, pinned {}", p.name, out.unique_states, p.unique_states));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

macro_rules! family {
    ($($test:ident => $name:literal),* $(,)?) => {
        $(#[test] fn $test() { check_family($name); })*
    };
}

family! {
    pinned_2x3 => "2x3",
    pinned_2x4 => "2x4",
    pinned_3x2 => "3x2",
    pinned_2x3_nested => "2x3+nested",
    pinned_2x3_limit => "2x3+limit",
    pinned_2x3_pinned_bytes => "2x3+pinned-bytes",
    pinned_2x3_nested_limit => "2x3+nested+limit",
    pinned_2x3_cache_app_page => "2x3+cache-app-page",
    pinned_2x3_e6 => "2x3+e6",
    pinned_lru => "lru",
    pinned_2x3_pressure => "2x3+pressure",
    pinned_limit_event => "limit-event",
    pinned_lanes => "lanes",
    pinned_lanes_limit => "lanes+limit",
    pinned_lanes_note => "lanes+note",
    pinned_lanes_drain => "lanes-drain",
    pinned_lanes_reuse => "lanes-reuse",
    pinned_2x3_pair => "2x3+pair",
    pinned_pair_windows => "pair-windows",
    pinned_pair_closed => "pair-closed",
    pinned_2x3_remove => "2x3+remove",
    pinned_remove => "remove",
    pinned_shared => "shared",
    pinned_2x4_shared => "2x4+shared",
    pinned_2x3_shared_remove => "2x3+shared+remove",
    pinned_shared_remove => "shared+remove",
    pinned_2x3_attached => "2x3+attached",
    pinned_lockless => "lockless",
    pinned_lockless_drain => "lockless-drain",
    pinned_lockless_pressure => "lockless+pressure",
    pinned_lockless_trim => "lockless+trim",
    pinned_2x3_limit_skip => "2x3+limit+skip",
    pinned_lanes_limit_skip => "lanes+limit+skip",
    pinned_lanes_collide => "lanes-collide",
    pinned_lanes_remote => "lanes-remote",
    pinned_2x3_limit_steps => "2x3+limit+steps",
    pinned_lru_steps => "lru+steps",
    pinned_2x3_drain_rounds => "2x3+drain-rounds",
    pinned_lockless_drain_rounds => "lockless+drain-rounds",
    pinned_remove_proof => "remove+proof",
    pinned_2x3_remove_proof => "2x3+remove+proof",
    pinned_2x3_lookup_skips => "2x3+lookup-skips",
    pinned_lookup_skips => "lookup-skips",
    pinned_lockless_memo => "lockless+memo",
    pinned_memo_pending => "memo-pending",
    pinned_memo_reuse => "memo-reuse",
    pinned_lru_restamp => "lru+restamp",
    pinned_flush => "flush",
    pinned_flush_limit => "flush+limit",
    pinned_lanes_flush => "lanes+flush",
    pinned_chunk => "chunk",
    pinned_2x3_chunk => "2x3+chunk",
    pinned_cost => "cost",
    pinned_2x3_limit_cost => "2x3+limit+cost",
    pinned_hull => "hull",
    pinned_fork => "fork",
    pinned_fork_limit => "fork+limit",
}

#[test]
fn every_pinned_configuration_has_a_recorded_count() {
    let all = pinned_configs();
    assert_eq!(all.len(), 259);
    for p in all {
        assert!(p.unique_states > 0, "{} has no recorded state count", p.name);
    }
}

/// The byte limit has teeth: the limit mutants, with `max_pinned_bytes` as
/// the only limit, are each caught in the family's configurations.
#[test]
fn the_byte_limit_family_catches_the_limit_mutants() {
    use mrcache_checker::Mutant;
    let opts = RunOptions { workers: 1, ..RunOptions::default() };
    let family: Vec<_> = pinned_configs().into_iter().filter(|p| p.name.starts_with("2x3+pinned-bytes ")).collect();
    for mutant in [Mutant::NoReleaseEviction, Mutant::OverLimitFlagLate, Mutant::NoteOneShort] {
        let caught = family.iter().any(|p| {
            let cfg = mrcache_checker::CheckConfig { mutant: Some(mutant), ..p.cfg.clone() };
            check(&cfg, &opts).unwrap().counterexample.is_some()
        });
        assert!(caught, "{mutant:?} is not caught with max_pinned_bytes alone");
    }
}

/// R1's atomics as steps: each mutant of R1's order (and those of the
/// releases that evict) is caught in the steps families, where other threads
/// act between the touch, the decrement and the flag's load.
#[test]
fn the_release_steps_families_catch_the_release_mutants() {
    use mrcache_checker::Mutant;
    let opts = RunOptions { workers: 1, ..RunOptions::default() };
    for (family, mutants) in [
        ("2x3+limit+steps ", &[Mutant::ReleaseFlagBeforeDecrement, Mutant::NoReleaseEviction, Mutant::OverLimitFlagLate][..]),
        ("lru+steps ", &[Mutant::ReleaseTouchAfterDecrement, Mutant::ReleaseNoLruTouch][..]),
    ] {
        let configs: Vec<_> = pinned_configs().into_iter().filter(|p| p.name.starts_with(family)).collect();
        assert!(configs.iter().all(|p| p.cfg.release_steps));
        for &mutant in mutants {
            let caught = configs.iter().any(|p| {
                let cfg = mrcache_checker::CheckConfig { mutant: Some(mutant), ..p.cfg.clone() };
                check(&cfg, &opts).unwrap().counterexample.is_some_and(|c| c.property == mutant.caught_by()[0])
            });
            assert!(caught, "{mutant:?} is not caught in {family}");
        }
    }
}

/// A11's post-unlock drain in rounds: its mutant, and the older mutants of
/// the holder's and the reader's drains, are caught in both families (by
/// L1: an event left queued after every script finished).
#[test]
fn the_drain_rounds_families_catch_the_drain_mutants() {
    use mrcache_checker::Mutant;
    let opts = RunOptions { workers: 1, ..RunOptions::default() };
    for family in ["2x3+drain-rounds ", "lockless+drain-rounds "] {
        let configs: Vec<_> = pinned_configs().into_iter().filter(|p| p.name.starts_with(family)).collect();
        assert!(!configs.is_empty() && configs.iter().all(|p| p.cfg.drain_rounds));
        for mutant in [Mutant::DrainOneRound, Mutant::HolderSkipsDrain, Mutant::ReaderSkipsDrain, Mutant::QueueNeverDrained] {
            let caught = configs.iter().any(|p| {
                let cfg = mrcache_checker::CheckConfig { mutant: Some(mutant), ..p.cfg.clone() };
                check(&cfg, &opts).unwrap().counterexample.is_some_and(|c| c.property == props::L1)
            });
            assert!(caught, "{mutant:?} is not caught in {family}");
        }
    }
}

/// M4 as the prover's steps: its mutants are caught by P2 in both
/// families (and `remove-without-window`, with no window to prove).
#[test]
fn the_proof_families_catch_the_proof_mutants() {
    use mrcache_checker::Mutant;
    let opts = RunOptions { workers: 1, ..RunOptions::default() };
    for family in ["remove+proof ", "2x3+remove+proof "] {
        let configs: Vec<_> = pinned_configs().into_iter().filter(|p| p.name.starts_with(family)).collect();
        assert!(!configs.is_empty() && configs.iter().all(|p| p.cfg.proof_steps));
        for mutant in [Mutant::ProofWithoutAck, Mutant::ProofKernelOutside, Mutant::RemoveWithoutWindow] {
            let caught = configs.iter().any(|p| {
                let cfg = mrcache_checker::CheckConfig { mutant: Some(mutant), ..p.cfg.clone() };
                check(&cfg, &opts).unwrap().counterexample.is_some_and(|c| c.property == props::P2)
            });
            assert!(caught, "{mutant:?} is not caught in {family}");
        }
    }
}

/// Lane claims given back and taken by the other thread (854,665 states,
/// about 35 s on one worker): the full tier, with its mutant
/// `lane-release-by-acquirer` (`checker/tests/mutants.rs`).
#[test]
#[ignore = "full tier: ci/full.sh"]
fn pinned_lanes_claims() {
    check_family("lanes-claims");
}

/// The generated scripts with nested events and the queue's hull (about
/// 200,000 states a configuration, 3 to 5 s each on one worker): the full
/// tier.
#[test]
#[ignore = "full tier: ci/full.sh"]
fn pinned_2x3_nested_hull() {
    check_family("2x3+nested+hull");
}

/// Every state of a pinned family's configuration (a plain breadth-first
/// search over the model), for the reachability checks below.
fn reachable(family: &str) -> Vec<mrcache_checker::State> {
    use stateright::Model;
    let p = pinned_configs().into_iter().find(|p| p.name.split(' ').next() == Some(family)).expect("a pinned family");
    let m = mrcache_checker::AlgoModel::new(p.cfg).unwrap();
    let mut seen: std::collections::HashSet<mrcache_checker::State> = m.init_states().into_iter().collect();
    let mut todo: Vec<_> = seen.iter().cloned().collect();
    while let Some(s) = todo.pop() {
        let mut actions = Vec::new();
        m.actions(&s, &mut actions);
        for a in actions {
            if let Some(n) = m.next_state(&s, a) {
                if seen.insert(n.clone()) {
                    todo.push(n);
                }
            }
        }
    }
    assert_eq!(seen.len(), p.unique_states, "{family}: the search and the pinned count disagree");
    seen.into_iter().collect()
}

/// `lanes-collide` reaches what it is for: C's request finds A's memo in
/// the slot they share (LN1 must compare the key), and C's memo replaces
/// A's there (LN2 on a slot of another key).
#[test]
fn lanes_collide_reaches_a_collision() {
    use mrcache_checker::Span;
    let (a, c) = (Span::new(0, 1), Span::new(2, 3));
    let states = reachable("lanes-collide");
    let a_memo_when_c_asked = states.iter().any(|s| {
        let th = &s.threads[0];
        s.lanes[0][0].key.is_some_and(|(k, _)| k == a)
            && s.lanes[0][0].ptr.is_some()
            && th.next_op == 2
            && th.pc == mrcache_checker::state::Pc::Idle
    });
    assert!(a_memo_when_c_asked, "T0 never asks for C with A's memo in their slot");
    assert!(states.iter().any(|s| s.lanes[0][0].key.is_some_and(|(k, _)| k == c)), "C's memo never replaces A's");
}

/// `lanes-remote` reaches what it is for: a lane lease released by a
/// thread that does not hold the lane (`remote` above 0), and an LN5 that
/// reads that `remote` and then `held` in a later step.
#[test]
fn lanes_remote_reaches_a_remote_release_and_a_split_count() {
    use mrcache_checker::state::RevokePhase;
    let states = reachable("lanes-remote");
    assert!(states.iter().any(|s| s.lanes.iter().flatten().any(|sl| sl.remote > 0)), "no remote release");
    let split = states
        .iter()
        .any(|s| s.threads.iter().filter_map(|t| t.revoke.as_ref()).any(|r| matches!(r.phase, RevokePhase::Held(_, n) if n > 0)));
    assert!(split, "no LN5 read a remote count above 0 before its read of held");
}

/// `remove+proof` reaches what it is for, and the proof is sound in every
/// reachable state: a madvising thread woken by the read (still inside the
/// call: asleep no more, zapping, or not yet returned) always has its
/// window open (or its event read and not yet applied, in M2's critical
/// section); the prover signals it while it is inside (its handler can
/// run only after its return); and windows do close.
#[test]
fn remove_proof_waits_for_the_madvise_to_return() {
    use mrcache_checker::state::{EvPc, Madvise, Origin, Sig};
    let states = reachable("remove+proof");
    let mut signalled_inside = false;
    for s in &states {
        for (t, th) in s.threads.iter().enumerate() {
            let Some(ev) = th.ev.as_ref().filter(|e| e.origin == Origin::Script) else { continue };
            let read = match ev.pc {
                EvPc::Wait => !th.waiting,
                EvPc::BumpLast | EvPc::Return => true,
                _ => false,
            };
            if read {
                let m = Madvise { thread: t as u8, op: th.next_op };
                // M2 reads (waking the thread) and applies in two steps of
                // one critical section: the window opens at the apply.
                let open = s.remove_windows.contains(&(ev.span, m)) || s.monitor.buf.iter().any(|(sp, w)| *sp == ev.span && *w == Some(m));
                assert!(open, "T{t}'s window closed while its madvise is inside:\n{}", s.summary());
                signalled_inside |= th.sig == Sig::Pending;
            }
        }
    }
    assert!(signalled_inside, "the prover never signals a thread inside its madvise");
    let closed = states
        .iter()
        .any(|s| s.threads[0].next_op > 0 && s.remove_windows.is_empty() && s.threads[1].pc != mrcache_checker::state::Pc::Done);
    assert!(closed, "no window closes while a script still runs");
}

/// A7 runs A8's test first, as spec.md's A7 says and the cache does: in
/// `lookup-skips`, T1's record goes stale (T0's munmap drained after T1's
/// A4) while T0's entry of A, planned after that drain, covers T1's
/// request; T1's A7 must then hit it (with `max_retries` 1, a stale test
/// first would return E6 where the cache hits).
#[test]
fn a7_tests_a8_before_the_stale_record() {
    use mrcache_checker::algo::A7;
    use mrcache_checker::state::Pc;
    let p = pinned_configs().into_iter().find(|p| p.name.starts_with("lookup-skips ")).expect("the family");
    let m = mrcache_checker::AlgoModel::new(p.cfg).unwrap();
    let states = reachable("lookup-skips");
    let mut cases = 0;
    for s in &states {
        let th = &s.threads[1];
        let Some(acq) = th.acq.as_ref() else { continue };
        if th.pc != Pc::A7 || !th.inflight.is_some_and(|i| i.stale) {
            continue;
        }
        if let Some(h) = m.lookup(s, acq.req, acq.access) {
            cases += 1;
            assert_eq!(m.a7_outcome(s, 1), A7::Hit(h), "a stale record with a covering entry #{h}");
        }
    }
    assert!(cases > 0, "no state has T1's stale record beside a covering entry");
}

/// The flush families have teeth: each flush mutant is caught, by one of
/// its properties (with a limit, a leased entry the flush kept findable
/// shows as P5 first), in every configuration of each family (every policy, both
/// monitors, with a limit and with the lanes).
#[test]
fn the_flush_families_catch_the_flush_mutants() {
    use mrcache_checker::Mutant;
    let opts = RunOptions { workers: 1, ..RunOptions::default() };
    let configs: Vec<_> = pinned_configs()
        .into_iter()
        .filter(|p| matches!(p.name.split(' ').next(), Some("flush" | "flush+limit" | "lanes+flush")))
        .collect();
    assert_eq!(configs.len(), 18);
    let mut missed = Vec::new();
    for mutant in [Mutant::FlushKeepsLeased, Mutant::FlushDeregsLeased] {
        for p in &configs {
            let cfg = mrcache_checker::CheckConfig { mutant: Some(mutant), ..p.cfg.clone() };
            let out = check(&cfg, &opts).unwrap();
            if !out.counterexample.is_some_and(|c| mutant.caught_by().contains(&c.property)) {
                missed.push(format!("{mutant:?} in {}", p.name));
            }
        }
    }
    assert!(missed.is_empty(), "not caught: {missed:?}");
}

/// The chunk families have teeth: `inflight-unaligned` (A4's record covers
/// the request, not the chunk) is caught by P2 in every configuration of
/// `chunk`: T1's munmap of the page only the rounding added, between T0's
/// plan and its insert, leaves the record fresh, and T0's later acquire of
/// that page hits the stale chunk.
#[test]
fn the_chunk_family_catches_an_unaligned_inflight_record() {
    use mrcache_checker::Mutant;
    let opts = RunOptions { workers: 1, ..RunOptions::default() };
    let configs: Vec<_> = pinned_configs().into_iter().filter(|p| p.name.starts_with("chunk ")).collect();
    assert_eq!(configs.len(), 6);
    for p in configs {
        let cfg = mrcache_checker::CheckConfig { mutant: Some(Mutant::InflightUnaligned), ..p.cfg.clone() };
        let out = check(&cfg, &opts).unwrap();
        assert!(out.counterexample.is_some_and(|c| c.property == props::P2), "not caught in {}", p.name);
    }
}

/// The cost family has teeth: the victim order by priority
/// (`gds-ignores-priority`) and the floor's rise (`gds-floor-not-raised`)
/// each decide an eviction there, caught in every configuration.
#[test]
fn the_cost_family_catches_the_gds_mutants() {
    use mrcache_checker::Mutant;
    let opts = RunOptions { workers: 1, ..RunOptions::default() };
    let configs: Vec<_> = pinned_configs().into_iter().filter(|p| p.name.starts_with("cost ")).collect();
    assert_eq!(configs.len(), 6);
    for mutant in [Mutant::GdsIgnoresPriority, Mutant::GdsFloorNotRaised] {
        for p in &configs {
            let cfg = mrcache_checker::CheckConfig { mutant: Some(mutant), ..p.cfg.clone() };
            let out = check(&cfg, &opts).unwrap();
            assert!(out.counterexample.is_some_and(|c| c.property == props::LINEARIZABLE), "{mutant:?} not caught in {}", p.name);
        }
    }
}

/// `hull` reaches what it is for: T1's second munmap finds the queue full
/// and collapses it into the hull p[0,3) (over B, which no event released).
#[test]
fn hull_reaches_a_collapse_over_an_unreleased_page() {
    use mrcache_checker::Span;
    let states = reachable("hull");
    assert!(states.iter().any(|s| s.queue == [Span::new(0, 3)]), "the queue never collapses into p[0,3)");
}

/// The hull family has teeth: `hull-drops-queued` (the full queue keeps
/// only the new event) is caught by P2 in every configuration of `hull`
/// (every policy; sync only: userfaultfd's events are not queued).
#[test]
fn the_hull_family_catches_a_collapse_that_drops_events() {
    use mrcache_checker::Mutant;
    let opts = RunOptions { workers: 1, ..RunOptions::default() };
    let configs: Vec<_> = pinned_configs().into_iter().filter(|p| p.name.starts_with("hull ")).collect();
    assert_eq!(configs.len(), 3);
    for p in configs {
        let cfg = mrcache_checker::CheckConfig { mutant: Some(Mutant::HullDropsQueued), ..p.cfg.clone() };
        let out = check(&cfg, &opts).unwrap();
        assert!(out.counterexample.is_some_and(|c| c.property == props::P2), "not caught in {}", p.name);
    }
}

/// The fork families have teeth: `fork-keeps-generation` (the child keeps
/// the parent's lock, entries and queue) is caught in every configuration
/// of `fork` and `fork+limit`, and in one of them as a deadlock (P6): the
/// child waits for a lock that a thread gone with the parent holds.
#[test]
fn the_fork_families_catch_a_child_that_keeps_the_generation() {
    use mrcache_checker::Mutant;
    let m = Mutant::ForkKeepsGeneration;
    let opts = RunOptions { workers: 1, stop_at_first_failure: false, ..RunOptions::default() };
    let configs: Vec<_> = pinned_configs().into_iter().filter(|p| p.name.starts_with("fork")).collect();
    assert_eq!(configs.len(), 6);
    let mut deadlock = false;
    for p in configs {
        let cfg = mrcache_checker::CheckConfig { mutant: Some(m), ..p.cfg.clone() };
        let out = check(&cfg, &opts).unwrap();
        let violated: Vec<String> = out.violated().iter().map(|v| v.to_string()).collect();
        assert!(violated.iter().any(|v| m.caught_by().contains(&v.as_str())), "not caught in {}: {violated:?}", p.name);
        deadlock |= violated.iter().any(|v| v == props::P6);
    }
    assert!(deadlock, "no fork child waited for a lock held by a thread gone with the parent");
}
