//! Every pinned family at 3 threads (`mrcache_checker::pinned3_configs`;
//! how each family's 3-thread form is derived is documented in
//! `checker/src/pinned.rs`): every property holds, every goal the 2-thread
//! family requires is reached, and each configuration has its pinned number
//! of unique states.
//!
//! The counts change with the model, the scripts and FAMILIES (a family
//! added gets a 3-thread form by the default rules, with no count yet):
//! recount with `cargo run --release -p mrcache-cli -- check --pinned
//! --threads3 --recount` (about half an hour on 2 workers) and paste the
//! lines it prints at the end into `COUNTS3` in `checker/src/pinned.rs`.

use mrcache_checker::{check, pinned3_configs, RunOptions};

/// Every 3-thread configuration has three threads with something to do.
#[test]
fn every_three_thread_form_runs_three_threads() {
    let all = pinned3_configs();
    assert!(!all.is_empty());
    for p in all {
        let active = match &p.cfg.scripts {
            Some(s) => s.iter().filter(|t| !t.is_empty()).count(),
            None => p.cfg.threads,
        };
        assert_eq!(active, 3, "{}: {active} threads with operations", p.name);
    }
}

/// Every 3-thread configuration has a pinned count: a family added without
/// its recount (or left out without its reason in `NO_THREE_THREADS`) fails
/// here, in the fast tier, not an hour into the full one.
#[test]
fn every_three_thread_configuration_has_a_pinned_count() {
    let missing: Vec<String> = pinned3_configs().into_iter().filter(|p| p.unique_states == 0).map(|p| p.name).collect();
    assert!(missing.is_empty(), "no pinned 3-thread count (recount, or list the family in NO_THREE_THREADS with its reason): {missing:?}");
}

/// The full tier: every family at 3 threads (about half an hour on 2
/// workers; `mrcache check --pinned --threads3` runs the same with each
/// configuration's time and peak RSS).
#[test]
#[ignore = "full tier: ci/full.sh"]
fn every_family_at_three_threads() {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let opts = RunOptions { workers, stop_at_first_failure: false, ..RunOptions::default() };
    let mut failures = Vec::new();
    for p in pinned3_configs() {
        let out = check(&p.cfg, &opts).unwrap();
        eprintln!("{}: {} unique states in {:.2?}", p.name, out.unique_states, out.elapsed);
        let problems = mrcache_checker::pinned::problems(&p, &out);
        if !problems.is_empty() {
            failures.push(format!("{}: {}", p.name, problems.join("; ")));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A family run under one policy at 3 threads (its scripts cannot tell the
/// policies apart: `policy_blind` in `checker/src/pinned.rs`) has the same
/// 2-thread count under every policy, monitor by monitor.
#[test]
fn families_run_under_one_policy_are_policy_blind_at_two_threads() {
    use std::collections::BTreeMap;
    let three: Vec<String> = pinned3_configs().into_iter().map(|p| p.name).collect();
    let mut counts: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
    for p in mrcache_checker::pinned_configs() {
        let words: Vec<&str> = p.name.split(' ').collect();
        let (fam, monitor) = (words[0], words[2]);
        let one_policy = three.iter().any(|n| n.starts_with(&format!("{fam} ")))
            && !three.iter().any(|n| n.starts_with(&format!("{fam} ")) && !n.contains(" independent "));
        if one_policy {
            counts.entry((fam.to_string(), monitor.to_string())).or_default().push(p.unique_states);
        }
    }
    assert!(!counts.is_empty());
    for ((fam, monitor), c) in counts {
        assert!(c.windows(2).all(|w| w[0] == w[1]), "{fam} {monitor}: 2-thread counts differ by policy: {c:?}");
    }
}
