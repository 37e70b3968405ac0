//! The fingerprint engine agrees with stateright's BFS: the same unique and
//! generated states and the same verdicts, on one worker and on two; and a
//! violation it finds is reported with stateright's shortest counterexample.

use mrcache_checker::{check, pinned_configs, CheckConfig, Engine, Mutant, RunOptions, Status};

fn verdicts(out: &mrcache_checker::Outcome) -> Vec<(&'static str, Status)> {
    out.verdicts.iter().map(|v| (v.name, v.status)).collect()
}

#[test]
fn the_engines_agree_on_pinned_configurations() {
    let names = ["2x3 independent sync", "2x3 merge async", "3x2 no-merge-uncache-contained sync"];
    let mut seen = 0;
    for p in pinned_configs().into_iter().filter(|p| names.contains(&p.name.as_str())) {
        seen += 1;
        let base = RunOptions { stop_at_first_failure: false, ..RunOptions::default() };
        let sr = check(&p.cfg, &RunOptions { engine: Engine::Stateright, workers: 1, ..base.clone() }).unwrap();
        for workers in [1, 2] {
            let fast = check(&p.cfg, &RunOptions { engine: Engine::Fast, workers, ..base.clone() }).unwrap();
            assert!(fast.complete, "{}", p.name);
            assert_eq!(fast.unique_states, sr.unique_states, "{}, {workers} worker(s)", p.name);
            assert_eq!(fast.total_states, sr.total_states, "{}, {workers} worker(s)", p.name);
            assert_eq!(verdicts(&fast), verdicts(&sr), "{}, {workers} worker(s)", p.name);
        }
    }
    assert_eq!(seen, names.len(), "a configuration named here is no longer pinned");
}

#[test]
fn a_violation_is_reported_with_the_shortest_counterexample() {
    let m = Mutant::ALL.into_iter().find(|m| m.swarm_seed().is_none()).expect("an exhaustively caught mutant");
    let cfg = CheckConfig::default().with_mutant(m);
    let sr = check(&cfg, &RunOptions { engine: Engine::Stateright, workers: 1, ..RunOptions::default() }).unwrap();
    let fast = check(&cfg, &RunOptions { engine: Engine::Fast, workers: 2, ..RunOptions::default() }).unwrap();
    let (a, b) = (sr.counterexample.expect("the mutant is caught"), fast.counterexample.expect("the mutant is caught"));
    assert_eq!((a.property, a.actions.len()), (b.property, b.actions.len()));
    assert_eq!(fast.unique_states, sr.unique_states);
}
