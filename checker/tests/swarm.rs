//! The swarm (`mrcache check --swarm`): seeded searches that reproduce, a
//! correct algorithm that passes, and the mutant only the swarm reaches.

use mrcache_checker::{check, pinned_configs, props, swarm, CheckConfig, Mutant, RunOptions, SwarmMode, SwarmOptions};

fn small(mode: SwarmMode, workers: usize) -> SwarmOptions {
    SwarmOptions { mode, searches: 8, states_per_search: 3_000, max_depth: 40, workers, ..SwarmOptions::default() }
}

/// The correct algorithm passes a small swarm in either mode, and a swarm's
/// searches do not depend on the number of workers.
#[test]
fn a_small_swarm_passes_and_reproduces() {
    let cfg = CheckConfig::default();
    for mode in [SwarmMode::Dfs, SwarmMode::Walk] {
        let one = swarm(&cfg, &small(mode, 1)).unwrap().summary;
        assert!(one.violations.is_empty(), "{mode}: {:?}", one.violations);
        assert_eq!(one.searches_finished, 8);
        assert!(one.states > 0 && one.distinct_states > 0 && one.max_depth > 0, "{one:?}");
        let two = swarm(&cfg, &small(mode, 2)).unwrap().summary;
        assert_eq!((one.states, one.distinct_states, one.max_depth), (two.states, two.distinct_states, two.max_depth));
    }
}

/// A mutant the exhaustive check catches at 2 x 3 is caught by a small
/// swarm too, and the seed it names finds it again alone, with the same
/// counterexample.
#[test]
fn a_seed_replays_its_counterexample() {
    let cfg = CheckConfig::default().with_mutant(Mutant::NoSeqRecheck);
    let opts = SwarmOptions { searches: 16, states_per_search: 5_000, workers: 2, ..SwarmOptions::default() };
    let out = swarm(&cfg, &opts).unwrap();
    let (seed, c) = out.counterexample.expect("caught");
    assert!(Mutant::NoSeqRecheck.caught_by().contains(&c.property), "{}", c.property);
    let again = swarm(&cfg, &SwarmOptions { first_seed: seed, searches: 1, workers: 1, ..opts }).unwrap();
    let (seed2, c2) = again.counterexample.expect("the seed replays");
    assert_eq!((seed2, c2.property, &c2.actions), (seed, c.property, &c.actions));
    assert_eq!(c2.trace.to_jsonl(), c.trace.to_jsonl());
}

/// `lease-count-saturates` needs three leases on one entry, then an event:
/// three threads, one with four ops. The swarm's recorded seed catches it
/// (the test of every mutant runs that seed); here, the whole pinned set
/// explored exhaustively does not. Full tier: every pinned configuration
/// once more (about a minute).
#[test]
#[ignore = "full tier: ci/full.sh"]
fn lease_count_saturates_escapes_the_pinned_set() {
    let m = Mutant::LeaseCountSaturates;
    for p in pinned_configs() {
        let cfg = CheckConfig { mutant: Some(m), ..p.cfg };
        let out = check(&cfg, &RunOptions { workers: 1, ..RunOptions::default() }).unwrap();
        assert!(out.complete && out.passed(), "{} catches {}: {:?}", p.name, m.name(), out.violated());
    }
    let cfg = CheckConfig::default().with_mutant(m);
    assert_eq!((cfg.threads, cfg.ops), (3, 4));
    let opts = SwarmOptions { first_seed: m.swarm_seed().unwrap(), searches: 1, ..SwarmOptions::default() };
    let (_, c) = swarm(&cfg, &opts).unwrap().counterexample.expect("caught by its seed");
    assert_eq!(c.property, props::P3);
}
