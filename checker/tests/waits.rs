//! The wait model (checker/src/waits.rs, spec.md S7.7): the new
//! monitor's design has no wait cycle, its reader never blocks, every
//! application thread finishes, with the recorded number of unique states;
//! each mutant (an old hang put back) is caught with a short counterexample.

use mrcache_checker::waits::{
    check_waits, pinned_wait_configs, WaitConfig, WaitMutant, ALL_APP_THREADS_FINISH, NO_WAIT_CYCLE, READER_NEVER_BLOCKS, S_CHAIN, S_GATE,
    S_SERVICE_CALLBACK_READ, S_TAKEOVER,
};

fn check_pinned(heavy: bool) {
    let mut failures = Vec::new();
    for p in pinned_wait_configs().into_iter().filter(|p| p.heavy == heavy) {
        let out = check_waits(&p.cfg, 1);
        eprintln!("{}: {} unique states in {:.2?}", p.name, out.unique_states, out.elapsed);
        if !out.passed() {
            let shown: Vec<String> = out.violated().iter().map(|v| out.discoveries[v].timeline()).collect();
            failures.push(format!("{}: {:?} violated\n{}", p.name, out.violated(), shown.join("\n")));
        }
        // Every goal the configuration can reach is reached: the waits the
        // properties are about do happen.
        let mut goals = vec![S_CHAIN, S_GATE];
        if p.cfg.extras > 0 {
            goals.push(S_SERVICE_CALLBACK_READ);
        }
        if p.cfg.fork && p.cfg.apps > 1 {
            goals.push(S_TAKEOVER);
        }
        for g in goals {
            if out.unreached().contains(&g) {
                failures.push(format!("{}: goal not reached: {g}", p.name));
            }
        }
        if out.unique_states != p.unique_states {
            failures.push(format!("{}: {} unique states, pinned {}", p.name, out.unique_states, p.unique_states));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
//= spec.md#S7.7
//# Properties: `no-wait-cycle` (always: no cycle in
//# the wait-for graph
fn the_design_has_no_wait_cycle() {
    check_pinned(false);
}

/// Two operations per application thread, and fork: 2.2 million states,
/// about 15 s (`cargo test -p mrcache-checker --test waits -- --ignored`).
#[test]
#[ignore = "about 15 s: run with --ignored"]
fn the_design_has_no_wait_cycle_heavy() {
    check_pinned(true);
}

/// The shortest counterexample of each property a mutant violates, by
/// property (BFS), pinned: (mutant, no-wait-cycle, reader-never-blocks,
/// all-app-threads-finish), 0 where the property holds.
const CAUGHT: [(WaitMutant, usize, usize, usize); 6] = [
    (WaitMutant::ReaderAllocates, 4, 4, 5),
    (WaitMutant::ReaderRunsDeregs, 7, 7, 13),
    (WaitMutant::MembersLockAcrossCallbacks, 12, 0, 14),
    (WaitMutant::ForkWithProcessLock, 4, 0, 20),
    (WaitMutant::ReaderTakesCacheLock, 5, 5, 6),
    (WaitMutant::ChildReusesHub, 6, 0, 21),
];

#[test]
fn every_mutant_is_caught() {
    let mut failures = Vec::new();
    for (m, cycle, reader, finish) in CAUGHT {
        let out = check_waits(&WaitConfig::default().with_mutant(m), 1);
        let len = |p| out.discoveries.get(p).map_or(0, |d| d.len());
        let expected = m.caught_by()[0];
        eprintln!(
            "{m}: {} states; {NO_WAIT_CYCLE} in {}, {READER_NEVER_BLOCKS} in {}, {ALL_APP_THREADS_FINISH} in {} steps",
            out.unique_states,
            len(NO_WAIT_CYCLE),
            len(READER_NEVER_BLOCKS),
            len(ALL_APP_THREADS_FINISH)
        );
        let Some(c) = out.discoveries.get(expected) else {
            failures.push(format!("{m} is not caught by {expected}: {} states", out.unique_states));
            continue;
        };
        eprintln!("{}", c.timeline());
        assert!(c.explanation.contains("wait cycle"), "{}", c.timeline());
        for v in out.violated() {
            if !m.caught_by().contains(&v) {
                failures.push(format!("{m} also violates {v}"));
            }
        }
        let got = (len(NO_WAIT_CYCLE), len(READER_NEVER_BLOCKS), len(ALL_APP_THREADS_FINISH));
        if got != (cycle, reader, finish) {
            failures.push(format!("{m}: counterexample lengths {got:?}, pinned {:?}", (cycle, reader, finish)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_mutant_is_pinned_and_every_property_has_a_mutant() {
    for m in WaitMutant::ALL {
        assert!(CAUGHT.iter().any(|c| c.0 == m), "{m} has no pinned counterexample");
        assert_eq!(m.name().parse::<WaitMutant>().unwrap(), m);
        // One namespace with the §A model's mutants (`mrcache check --mutant`).
        assert!(!mrcache_types::mutants::MUTANTS.contains(&m.name()), "{m} is also a §A mutant");
    }
    for p in [NO_WAIT_CYCLE, READER_NEVER_BLOCKS, ALL_APP_THREADS_FINISH] {
        assert!(WaitMutant::ALL.iter().any(|m| m.caught_by().contains(&p)), "no mutant violates {p}");
    }
    assert!("bogus".parse::<WaitMutant>().unwrap_err().contains("reader-allocates"));
}

/// The counterexamples name the cycle's threads.
#[test]
fn counterexamples_show_the_cycle() {
    let out = check_waits(&WaitConfig::default().with_mutant(WaitMutant::ReaderAllocates), 1);
    let c = &out.discoveries[NO_WAIT_CYCLE];
    assert!(c.explanation.contains("reader waits for heap lock, held by T0"), "{}", c.timeline());
    let out = check_waits(&WaitConfig::default().with_mutant(WaitMutant::ForkWithProcessLock), 1);
    let c = &out.discoveries[NO_WAIT_CYCLE];
    assert!(c.steps.last().unwrap().contains("fork"), "{}", c.timeline());
    assert!(c.explanation.contains("child waits for process lock"), "{}", c.timeline());
}
