//! Every mutant is caught, by the property it must violate, with a readable
//! timeline and a valid trace.

use mrcache_checker::{check, props, swarm, CheckConfig, Mutant, RunOptions, SwarmOptions};

//= spec.md#S1.8
fn caught(m: Mutant) {
    let cfg = CheckConfig::default().with_mutant(m);
    // A swarm-only mutant: the one search of its recorded seed.
    let (c, violated) = match m.swarm_seed() {
        Some(seed) => {
            let opts = SwarmOptions { first_seed: seed, searches: 1, ..SwarmOptions::default() };
            let out = swarm(&cfg, &opts).unwrap();
            let violated: Vec<String> = out.summary.violations.iter().map(|v| v.property.clone()).collect();
            let (_, c) = out.counterexample.unwrap_or_else(|| panic!("mutant {} is not caught by seed {seed}", m.name()));
            (c, violated)
        }
        None => {
            let out = check(&cfg, &RunOptions { workers: 1, ..RunOptions::default() }).unwrap();
            let violated = out.violated().iter().map(|v| v.to_string()).collect();
            let c = out.counterexample.unwrap_or_else(|| panic!("mutant {} is not caught: {} states", m.name(), out.unique_states));
            (c, violated)
        }
    };
    let expected = m.caught_by()[0];
    assert_eq!(c.property, expected, "mutant {} violates {:?}; expected {expected} first\n{}", m.name(), violated, c.timeline);
    for v in violated.iter().map(|v| v.as_str()) {
        assert!(m.caught_by().contains(&v) || matches!(v, props::P4 | props::LINEARIZABLE), "mutant {} also violates {v}", m.name());
    }
    let id = props::spec_id(expected);
    assert!(c.timeline.contains(&format!("VIOLATED: {expected} (spec.md#{id})")), "{}", c.timeline);
    assert!(!c.detail.is_empty());
    // The trace: concurrent, from the checker, every completed op with its outcome.
    let t = &c.trace;
    assert!(t.header.concurrent);
    assert_eq!(t.header.source, "checker");
    assert!(!t.records.is_empty());
    let done = t.records.iter().take_while(|r| r.expect.is_some()).count();
    assert!(t.records[done..].iter().all(|r| r.expect.is_none()), "in-flight ops come last");
    let reparsed = mrcache_types::trace::Trace::parse("again", &t.to_jsonl()).unwrap();
    assert_eq!(reparsed.records, t.records);
}

macro_rules! mutants {
    ($($test:ident => $m:ident),* $(,)?; full tier: $($full:ident => $fm:ident),* $(,)?) => {
        // The full-tier tests are written out below (ci/full.sh finds them
        // by their attribute).
        $(#[test] fn $test() { caught(Mutant::$m); })*
        #[test]
        fn every_mutant_has_a_test() {
            let tested = [$(Mutant::$m,)* $(Mutant::$fm),*];
            for m in Mutant::ALL {
                assert!(tested.contains(&m), "mutant {} has no test", m.name());
            }
        }
    };
}

mutants! {
    m01_no_seq_recheck => NoSeqRecheck,
    m02_blocking_hook => BlockingHook,
    m03_dereg_leased_on_invalidate => DeregLeasedOnInvalidate,
    m04_async_apply_outside_lock => AsyncApplyOutsideLock,
    m05_leased_stays_findable => LeasedStaysFindable,
    m06_partial_unmap_start_only => PartialUnmapStartOnly,
    m07_merge_drops_leased => MergeDropsLeased,
    m08_queue_never_drained => QueueNeverDrained,
    m09_async_blocking_read_outside_lock => AsyncBlockingReadOutsideLock,
    m10_handoff_toctou => HandoffToctou,
    m11_hit_ignores_access => HitIgnoresAccess,
    m12_no_release_eviction => NoReleaseEviction,
    m13_over_limit_flag_late => OverLimitFlagLate,
    m13b_note_one_short => NoteOneShort,
    m14_notify_before_release => NotifyBeforeRelease,
    m15_stale_merge_plan => StaleMergePlan,
    m16_release_no_lru_touch => ReleaseNoLruTouch,
    m17_holder_skips_drain => HolderSkipsDrain,
    m18_reader_skips_drain => ReaderSkipsDrain,
    m19_release_touch_after_decrement => ReleaseTouchAfterDecrement,
    m20_trim_evicts_leased => TrimEvictsLeased,
    m20b_trim_reads_then_ors => TrimReadsThenOrs,
    m21_lane_no_heavy_barrier => LaneNoHeavyBarrier,
    m22_lane_no_recheck => LaneNoRecheck,
    m23_lane_revoke_no_pin => LaneRevokeNoPin,
    m24_lane_reuse_busy_slot => LaneReuseBusySlot,
    m25_lane_detached_no_mutex => LaneDetachedNoMutex,
    m26_lane_queue_len_only => LaneQueueLenOnly,
    m27_begin_keeps_entries => BeginKeepsEntries,
    m28_begin_keeps_inflight => BeginKeepsInflight,
    m29_windowed_cached => WindowedCached,
    m30_end_closes_oldest => EndClosesOldest,
    m31_windowed_served_after_end => WindowedServedAfterEnd,
    m32_window_after_queue => WindowAfterQueue,
    m33_note_skips_revoke => NoteSkipsRevoke,
    m34_remove_without_window => RemoveWithoutWindow,
    m35_event_to_one_cache => EventToOneCache,
    m36_flag_at_second_pass => FlagAtSecondPass,
    m37_remove_window_one_cache => RemoveWindowOneCache,
    m38_lockless_takes_removed => LocklessTakesRemoved,
    m39_lockless_skips_draining => LocklessSkipsDraining,
    m40_a1_skip_without_lookup => A1SkipWithoutLookup,
    m41_hit_without_gate => HitWithoutGate,
    m42_drain_ignores_reading => DrainIgnoresReading,
    m43_gate_before_apply => GateBeforeApply,
    m44_lease_count_saturates => LeaseCountSaturates,
    m45_lane_hit_ignores_key => LaneHitIgnoresKey,
    m46_lane_remote_writes_held => LaneRemoteWritesHeld,
    m48_release_flag_before_decrement => ReleaseFlagBeforeDecrement,
    m60_kdreg2_hit_skips_generation => Kdreg2HitSkipsGeneration,
    m49_drain_one_round => DrainOneRound,
    m50_proof_without_ack => ProofWithoutAck,
    m51_proof_kernel_outside => ProofKernelOutside,
    m52_a1_count_after_unlock => A1CountAfterUnlock,
    m53_a4_count_after_unlock => A4CountAfterUnlock,
    m54_lockless_takes_pending => LocklessTakesPending,
    m55_lockless_ignores_key => LocklessIgnoresKey,
    m57_window_count_after_queue => WindowCountAfterQueue,
    m58_lru_skips_restamp => LruSkipsRestamp,
    m59_restamp_skip_when_recent => RestampSkipWhenRecent,
    m61_flush_keeps_leased => FlushKeepsLeased,
    m62_flush_deregs_leased => FlushDeregsLeased,
    m63_inflight_unaligned => InflightUnaligned,
    m64_gds_ignores_priority => GdsIgnoresPriority,
    m65_gds_floor_not_raised => GdsFloorNotRaised,
    m66_hull_drops_queued => HullDropsQueued,
    m67_fork_keeps_generation => ForkKeepsGeneration,
    ; full tier:
    m47_lane_release_by_acquirer => LaneReleaseByAcquirer,
    m56_lockless_no_key_recheck => LocklessNoKeyRecheck,
    m68_lane_undo_despite_pin => LaneUndoDespitePin,
}

/// A lane claim given back and taken by the other thread: the violation
/// lies about 30 steps deep in `lanes-claims` (a full-tier family), and the
/// BFS that reaches it takes about 25 s.
#[test]
#[ignore = "full tier: ci/full.sh"]
fn m47_lane_release_by_acquirer() {
    caught(Mutant::LaneReleaseByAcquirer);
}

/// Entry memory reused twice between A0's read and its compare-exchange:
/// the violation lies deep in `memo-reuse` (267,916 states), and the BFS
/// that reaches it, with its counterexample, takes about 13 s.
#[test]
#[ignore = "full tier: ci/full.sh"]
fn m56_lockless_no_key_recheck() {
    caught(Mutant::LocklessNoKeyRecheck);
}

/// An undo despite the pin needs a third thread (its release invalidates the
/// spared entry): the violation lies 48 steps deep, past 2.6 M states of the
/// 3-thread `lanes+note` scripts.
#[test]
#[ignore = "full tier: ci/full.sh"]
fn m68_lane_undo_despite_pin() {
    caught(Mutant::LaneUndoDespitePin);
}

/// The lane mutants break only the lanes: under the async monitor too they
/// are caught by the same property (but `lane-release-by-acquirer` and
/// `lane-undo-despite-pin`, whose sync checks are already in the full tier).
#[test]
fn lane_mutants_are_caught_under_the_async_monitor_too() {
    for m in Mutant::ALL.into_iter().filter(|m| m.needs_lanes() && !matches!(m, Mutant::LaneReleaseByAcquirer | Mutant::LaneUndoDespitePin))
    {
        let cfg = CheckConfig { monitor: mrcache_checker::MonitorKind::Async, ..CheckConfig::default() }.with_mutant(m);
        let out = check(&cfg, &RunOptions { workers: 1, ..RunOptions::default() }).unwrap();
        let c = out.counterexample.unwrap_or_else(|| panic!("{} is not caught under async", m.name()));
        assert_eq!(c.property, m.caught_by()[0], "{} under async\n{}", m.name(), c.timeline);
    }
}

/// `event-to-one-cache` is no artifact of its scripts: on the generated 2x4
/// scripts (`2x4+shared`, T0 on cache 0, T1 on cache 1) P2 catches it too,
/// under every policy; and its counterexample shows both caches and names
/// the cache that served the stale registration.
#[test]
fn event_to_one_cache_is_caught_on_the_generated_scripts() {
    use mrcache_checker::MonitorKind;
    use mrcache_model::OverlapPolicy;
    for policy in [OverlapPolicy::Independent, OverlapPolicy::Merge, OverlapPolicy::NoMergeUncacheContained] {
        let cfg = CheckConfig { caches: 2, mutant: Some(Mutant::EventToOneCache), ..CheckConfig::new(2, 4, policy, MonitorKind::Async) };
        let out = check(&cfg, &RunOptions { workers: 1, ..RunOptions::default() }).unwrap();
        let c = out.counterexample.unwrap_or_else(|| panic!("not caught on 2x4+shared under {policy:?}"));
        assert_eq!(c.property, props::P2, "{policy:?}\n{}", c.timeline);
        assert!(c.timeline.contains("| cache 1: lock "), "{}", c.timeline);
        assert!(c.detail.contains("on cache 1's #"), "{}", c.detail);
    }
}

/// Two of the gate's mutants (M6) are no artifact of two caches: with one cache
/// attached to the process's monitor and two threads on it (`2x3+attached`),
/// P2 catches each under every policy (`drain-ignores-reading` under merge
/// may be caught first by linearizability: a stale entry merged into a new
/// registration).
#[test]
fn gate_mutants_are_caught_with_one_attached_cache() {
    use mrcache_checker::pinned_configs;
    // `gate-before-apply` needs a second cache: the round's first cache is
    // locked, drained and gated in one step.
    for m in [Mutant::HitWithoutGate, Mutant::DrainIgnoresReading] {
        for p in pinned_configs().into_iter().filter(|p| p.name.starts_with("2x3+attached ")) {
            let cfg = CheckConfig { mutant: Some(m), ..p.cfg };
            let out = check(&cfg, &RunOptions { workers: 1, ..RunOptions::default() }).unwrap();
            let c = out.counterexample.unwrap_or_else(|| panic!("{} not caught in {}", m.name(), p.name));
            assert!(m.caught_by().contains(&c.property), "{} in {}: {}\n{}", m.name(), p.name, c.property, c.timeline);
            if p.cfg.policy == mrcache_model::OverlapPolicy::Independent {
                assert_eq!(c.property, props::P2, "{} in {}\n{}", m.name(), p.name, c.timeline);
            }
        }
    }
}

/// Every property the checker states has a mutant that violates it.
#[test]
fn every_property_has_a_mutant() {
    for p in [props::P1, props::P2, props::P3, props::P4, props::P5, props::LINEARIZABLE, props::P6, props::L1] {
        assert!(Mutant::ALL.iter().any(|m| m.caught_by().contains(&p)), "no mutant violates {p}");
    }
}

#[test]
fn mutant_names_parse_and_numbers_do_not() {
    for m in Mutant::ALL {
        assert_eq!(m.name().parse::<Mutant>().unwrap(), m);
    }
    assert_eq!(Mutant::ALL.map(|m| m.name()), mrcache_types::mutants::MUTANTS);
    assert!("1".parse::<Mutant>().is_err(), "mutants are referred to by name");
    assert!("bogus".parse::<Mutant>().unwrap_err().contains("no-seq-recheck"));
}
