//! The kdreg2 models (a peer's monitor, not spec.md's): their verdicts are
//! pinned, with the length of each first counterexample, so that a change
//! of the models shows up here. CONFORMANCE.md's "kdreg2 (model)" column and
//! docs/conformance-protocol.md ("kdreg2") explain them.

use mrcache_checker::{check, kdreg2_scripts, props, CheckConfig, MonitorKind, RunOptions};
use mrcache_model::OverlapPolicy;

/// The first violated property and its counterexample's length in steps,
/// or `None` if every property holds (the exploration then is complete).
fn verdict(cfg: CheckConfig) -> Option<(&'static str, usize)> {
    let out = check(&cfg, &RunOptions { workers: 1, ..RunOptions::default() }).unwrap();
    match out.counterexample {
        Some(c) => Some((c.property, c.actions.len())),
        None => {
            assert!(out.complete, "{}", out.description);
            None
        }
    }
}

fn scripted(monitor: MonitorKind) -> CheckConfig {
    CheckConfig { scripts: Some(kdreg2_scripts()), monitor, ..CheckConfig::default() }
}

/// 9a31fe2's deferral: A's munmap finds the module's mutex held by the
/// evictor's read of B's event, leaves A to the worker and returns with A's
/// generation word unchanged; the thread's next acquire of A hits the
/// registration of the frames it released (P2). The counterexample's stale
/// hit is the acquire's A1, before the worker runs.
#[test]
fn deferred_invalidation_breaks_freshness() {
    assert_eq!(verdict(scripted(MonitorKind::Kdreg2)), Some((props::P2, 29)));
}

/// The same scripts with a notifier that waits for the mutex: every
/// property holds, so the deferral alone makes the difference above.
#[test]
fn waiting_notifier_holds_on_the_same_scripts() {
    assert_eq!(verdict(scripted(MonitorKind::Kdreg2Wait)), None);
}

/// The generated 2 x 3 scripts, under each policy, fail P2 with either
/// model: T1 munmaps a page while T0 registers a range holding it; the
/// module monitors the range only from A9's subscribe, after the frames
/// changed, so no generation word ever changes for it and T0's next
/// acquire hits it. (The 2 x 3 scripts have one release event: the
/// evictor never holds the mutex during a notifier there.)
#[test]
fn generated_scripts_fail_freshness_by_an_unmonitored_registration() {
    let expected = [(OverlapPolicy::Independent, 20), (OverlapPolicy::Merge, 20), (OverlapPolicy::NoMergeUncacheContained, 20)];
    for (policy, steps) in expected {
        for monitor in [MonitorKind::Kdreg2, MonitorKind::Kdreg2Wait] {
            let cfg = CheckConfig::new(2, 3, policy, monitor);
            assert_eq!(verdict(cfg), Some((props::P2, steps)), "{monitor} {}", policy.name());
        }
    }
}
