//! Configurations that show why a rule of spec.md is needed, and the paths
//! the pinned configurations must be able to take.

use mrcache_checker::{check, props, AlgoModel, CacheFrees, CheckConfig, MonitorKind, Mutant, Rec, RunOptions, State};
use mrcache_model::OverlapPolicy;
use mrcache_types::{OpError, Ret};
use stateright::Model;
use std::collections::{HashSet, VecDeque};

fn violated_first(cfg: CheckConfig) -> &'static str {
    let out = check(&cfg, &RunOptions { workers: 1, ..RunOptions::default() }).unwrap();
    out.counterexample.expect("a counterexample").property
}

/// spec.md#S7.3: "nothing frees watched memory while holding the cache lock".
/// With userfaultfd, a thread that frees watched memory under the lock sleeps
/// until the event is read, and reading needs the lock: P6.
#[test]
fn freeing_watched_memory_under_the_lock_deadlocks_with_uffd() {
    let cfg =
        CheckConfig { cache_frees: Some(CacheFrees::AppPage(1)), ..CheckConfig::new(2, 3, OverlapPolicy::Independent, MonitorKind::Async) };
    assert_eq!(violated_first(cfg), props::P6);
}

/// spec.md#S7.4 says REMOVE "has no such window: it is queued before the pages
/// are dropped". Being told before the frames change is a window of its own:
/// a registration that starts after the event was applied and pins before the
/// zap is cached stale (`notify-before-release` under the async monitor).
#[test]
//= spec.md#S7.4
fn an_event_delivered_before_the_release_breaks_freshness_with_uffd_too() {
    let cfg = CheckConfig::new(2, 3, OverlapPolicy::Independent, MonitorKind::Async).with_mutant(Mutant::NotifyBeforeRelease);
    assert_eq!(violated_first(cfg), props::P2);
}

/// Breadth-first search for a step whose recorded events satisfy `pred`.
fn reachable(model: &AlgoModel, pred: impl Fn(&Rec) -> bool) -> bool {
    let mut seen: HashSet<State> = HashSet::new();
    let mut queue = VecDeque::from([model.init_state()]);
    while let Some(s) = queue.pop_front() {
        let mut actions = Vec::new();
        model.actions(&s, &mut actions);
        for a in actions {
            let mut next = s.clone();
            let mut rec = Rec::default();
            model.step(&mut next, a, Some(&mut rec));
            if pred(&rec) {
                return true;
            }
            if seen.insert(next.clone()) {
                queue.push_back(next);
            }
        }
    }
    false
}

/// With one attempt, an acquire whose registration the registrar's own free
/// made stale fails with E6, and the history stays linearizable (the pinned
/// `2x3+e6` configurations pass every property).
#[test]
fn e6_is_reachable() {
    for monitor in MonitorKind::ALL {
        let cfg = CheckConfig { registrar_frees: Some(1), max_retries: 1, ..CheckConfig::new(2, 3, OverlapPolicy::Independent, monitor) };
        let model = AlgoModel::new(cfg).unwrap();
        let e6 = Ret::Failed { error: OpError::RetriesExhausted };
        assert!(reachable(&model, |r| r.events.iter().any(|e| e.ret == Some(e6))), "{monitor}");
    }
}

/// A8 (another thread inserted a covering entry while this one registered)
/// is reachable in the generated scripts.
#[test]
fn a8_is_reachable() {
    let model = AlgoModel::new(CheckConfig::new(3, 2, OverlapPolicy::Independent, MonitorKind::Sync)).unwrap();
    assert!(reachable(&model, |r| r.notes.iter().any(|n| n.starts_with("A8:"))));
}

/// The registrar's free during A5 makes the registration stale and A7 retries.
#[test]
fn a7_retry_is_reachable() {
    let cfg = CheckConfig { registrar_frees: Some(1), ..CheckConfig::default() };
    let model = AlgoModel::new(cfg).unwrap();
    assert!(reachable(&model, |r| r.notes.iter().any(|n| n.starts_with("A7: the in-flight record is stale"))));
}
