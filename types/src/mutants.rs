//! The names of the deliberate breakages (test builds only, feature `testkit`).
//!
//! One list, shared by the model checker's mutants (`mrcache_checker::Mutant`,
//! one per entry of [`MUTANTS`], in this order), the cache's fault switches
//! (`mrcache::Faults`, one per entry of [`FAULT_SWITCHES`]) and the runners
//! that select them by name (`mrcache check --mutant NAME`, `mrcache fuzz
//! --mutant NAME`); the C API lease slab's mutants ([`SLAB_MUTANTS`]),
//! which its loom models select; and the other loom models' mutants
//! ([`LOOM_MUTANTS`]). A mutant is always referred to by its name (spec.md's
//! coverage table names them; `mrcache-citations` checks that each name is
//! here).

/// The checker's mutants, by name: each breaks one rule of spec.md §A and is
/// caught by a named property (`mrcache_checker::Mutant::caught_by`).
pub const MUTANTS: [&str; 70] = [
    "no-seq-recheck",
    "blocking-hook",
    "dereg-leased-on-invalidate",
    "async-apply-outside-lock",
    "leased-stays-findable",
    "partial-unmap-start-only",
    "merge-drops-leased",
    "queue-never-drained",
    "async-blocking-read-outside-lock",
    "handoff-toctou",
    "hit-ignores-access",
    "no-release-eviction",
    "over-limit-flag-late",
    "note-one-short",
    "notify-before-release",
    "stale-merge-plan",
    "release-no-lru-touch",
    "holder-skips-drain",
    "reader-skips-drain",
    "release-touch-after-decrement",
    "trim-evicts-leased",
    "trim-reads-then-ors",
    "lane-no-heavy-barrier",
    "lane-no-recheck",
    "lane-revoke-no-pin",
    "lane-reuse-busy-slot",
    "lane-detached-no-mutex",
    "lane-queue-len-only",
    "begin-keeps-entries",
    "begin-keeps-inflight",
    "windowed-cached",
    "end-closes-oldest",
    "windowed-served-after-end",
    "window-after-queue",
    "note-skips-revoke",
    "remove-without-window",
    "event-to-one-cache",
    "flag-at-second-pass",
    "remove-window-one-cache",
    "lockless-takes-removed",
    "lockless-skips-draining",
    "a1-skip-without-lookup",
    "hit-without-gate",
    "drain-ignores-reading",
    "gate-before-apply",
    "lease-count-saturates",
    "lane-hit-ignores-key",
    "lane-remote-writes-held",
    "lane-release-by-acquirer",
    "release-flag-before-decrement",
    "kdreg2-hit-skips-generation",
    "drain-one-round",
    "proof-without-ack",
    "proof-kernel-outside",
    "a1-count-after-unlock",
    "a4-count-after-unlock",
    "lockless-takes-pending",
    "lockless-ignores-key",
    "lockless-no-key-recheck",
    "window-count-after-queue",
    "lru-skips-restamp",
    "restamp-skip-when-recent",
    "flush-keeps-leased",
    "flush-deregs-leased",
    "inflight-unaligned",
    "gds-ignores-priority",
    "gds-floor-not-raised",
    "hull-drops-queued",
    "fork-keeps-generation",
    "lane-undo-despite-pin",
];

/// The C API lease slab's mutants (`capi/src/slab.rs`, `SlabMutant`: test
/// and loom builds of `mrcache-capi` only), by name: each breaks one
/// mechanism of the slab and is caught by a model of `capi/src/slab/models.rs`
/// (`catches_<name>`, run by ci/full.sh's `loom` step, and the ones caught
/// without a race also by `cargo test`).
pub const SLAB_MUTANTS: [&str; 4] =
    ["slab-tag-not-incremented", "slab-no-generation-check", "slab-no-seqlock-recheck", "slab-local-list-keeps-generation"];

/// The mutants of the other loom models (loom builds only, each a variant
/// its code runs with when a model selects it), by name: each breaks one
/// mechanism and is caught by the loom model named for it in spec.md's
/// coverage table (`catches_<name>`, run by ci/full.sh's `loom` step):
/// the cache's hit counters (`impl/src/cache/counters.rs`, caught in
/// `impl/tests/loom.rs`), the C API's cache ids and thread buckets
/// (`capi/src/lib.rs`, `capi/src/threads.rs`, caught in
/// `capi/src/slab/models.rs`).
pub const LOOM_MUTANTS: [&str; 3] = ["counter-claim-without-cas", "cache-id-not-atomic", "bucket-claim-without-cas"];

/// The C API's mutants caught by plain tests (test builds of
/// `mrcache-capi` only), by name: `escape-exit-not-counted` (a callback's
/// thread exit is flagged but not counted, so its entry point never resumes
/// it), caught by `capi/src/escape.rs`'s tests.
pub const CAPI_TEST_MUTANTS: [&str; 1] = ["escape-exit-not-counted"];

/// One fault switch of the real cache (`mrcache::Faults`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultSwitch {
    /// The name a runner selects it by (`mrcache fuzz --mutant NAME`).
    pub name: &'static str,
    /// The `mrcache::Faults` field that holds it.
    pub field: &'static str,
    /// The checker mutant it mirrors in the real cache, if any.
    pub mirrors: Option<&'static str>,
}

/// The cache's fault switches.
pub const FAULT_SWITCHES: [FaultSwitch; 9] = [
    FaultSwitch { name: "skip-seq-recheck", field: "skip_seq_recheck", mirrors: Some("no-seq-recheck") },
    FaultSwitch { name: "monitor-off", field: "monitor_off", mirrors: None },
    FaultSwitch { name: "leak-deregistration", field: "leak_deregistration", mirrors: None },
    FaultSwitch { name: "fork-keeps-monitor", field: "fork_keeps_monitor", mirrors: None },
    FaultSwitch { name: "note-skips-revoke", field: "note_skips_revoke", mirrors: Some("note-skips-revoke") },
    FaultSwitch { name: "over-limit-flag-late", field: "over_limit_flag_late", mirrors: Some("over-limit-flag-late") },
    FaultSwitch { name: "remove-without-window", field: "remove_without_window", mirrors: Some("remove-without-window") },
    FaultSwitch { name: "lru-skips-restamp", field: "lru_skips_restamp", mirrors: Some("lru-skips-restamp") },
    FaultSwitch { name: "dereg-leased-on-invalidate", field: "dereg_leased_on_invalidate", mirrors: Some("dereg-leased-on-invalidate") },
];

/// The fault switch called `name`.
pub fn fault_switch(name: &str) -> Option<&'static FaultSwitch> {
    FAULT_SWITCHES.iter().find(|f| f.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_mirrors_exist() {
        let mut all: Vec<&str> = MUTANTS.iter().chain(&SLAB_MUTANTS).chain(&LOOM_MUTANTS).chain(&CAPI_TEST_MUTANTS).copied().collect();
        all.sort_unstable();
        all.dedup();
        let n = MUTANTS.len() + SLAB_MUTANTS.len() + LOOM_MUTANTS.len() + CAPI_TEST_MUTANTS.len();
        assert_eq!(all.len(), n, "a mutant name twice");
        for f in FAULT_SWITCHES {
            assert_eq!(f.field, f.name.replace('-', "_"));
            if let Some(m) = f.mirrors {
                assert!(MUTANTS.contains(&m), "{} mirrors unknown mutant {m}", f.name);
            }
            assert_eq!(fault_switch(f.name), Some(&f));
        }
    }
}
