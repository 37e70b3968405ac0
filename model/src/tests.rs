//! Every rule of spec.md gets an accepted history and at least one rejected
//! history, so each check is shown to be able to fail. (P6, no deadlock, is a
//! property of interleavings: the checker crate shows it failing.)

use super::*;
use mrcache_types::{Access, Op, OpError, RegView, RegistrarFailure, ReleaseKind, Ret};

const RR: Access = Access::REMOTE_READ;
const P: u64 = 4096;

fn acq(lease: u64, addr: u64, len: u64) -> Op {
    Op::Acquire { lease, addr, len, access: RR }
}
fn acq_with(lease: u64, addr: u64, len: u64, access: Access) -> Op {
    Op::Acquire { lease, addr, len, access }
}
fn rel(lease: u64) -> Op {
    Op::Release { lease }
}
fn unmap(addr: u64, len: u64) -> Op {
    Op::ReleaseEvent { kind: ReleaseKind::Munmap, addr, len }
}
fn view(id: u64, addr: u64, len: u64) -> RegView {
    RegView { id, addr, len, access: RR }
}
fn hit(id: u64, addr: u64, len: u64) -> Ret {
    Ret::Granted { reg: view(id, addr, len), hit: true, pressure: false }
}
fn miss(id: u64, addr: u64, len: u64) -> Ret {
    Ret::Granted { reg: view(id, addr, len), hit: false, pressure: false }
}
const DONE: Ret = Ret::Done;

/// Judges a history; returns the index and violation of the first rejected step.
fn judge(config: Config, history: &[(Op, Ret)]) -> Result<Model, (usize, Violation)> {
    let mut m = Model::new(config);
    for (i, (op, ret)) in history.iter().enumerate() {
        m.judge(op, ret).map_err(|v| (i, v))?;
        for v in m.pending_deregistrations() {
            m.observe_deregister(v.id).unwrap();
        }
    }
    Ok(m)
}

fn rejects(config: Config, history: &[(Op, Ret)], prop: Property) {
    match judge(config, history) {
        Ok(_) => panic!("history accepted, expected a {prop} violation"),
        Err((i, v)) => {
            assert_eq!(i, history.len() - 1, "rejected too early: {v}");
            assert_eq!(v.property, prop, "{v}");
        }
    }
}

fn indep() -> Config {
    Config::default()
}

/// The seed thread's scenario: one registration spans the buffers of several
/// sends; then 0x3000-0x3fff is freed back to the kernel.
fn seed_history() -> Vec<(Op, Ret)> {
    vec![
        (acq(1, 0x1000, 0x3000), miss(1, 0x1000, 0x3000)),
        (acq(2, 0x1000, 0x800), hit(1, 0x1000, 0x3000)),
        (acq(3, 0x2000, 0x1000), hit(1, 0x1000, 0x3000)),
        (rel(1), DONE),
        (rel(2), DONE),
        (rel(3), DONE),
        (unmap(0x3000, 0x1000), DONE),
        (acq(4, 0x1000, 0x1000), miss(2, 0x1000, 0x1000)),
    ]
}

#[test]
//= spec.md#S2.1
//= spec.md#S2.2
//= spec.md#S2.3
//= spec.md#S1.3
//= spec.md#S5.1
//= spec.md#S5.2
fn model_step_matches_the_seed_history() {
    let mut m = Model::new(indep());
    for (op, ret) in seed_history() {
        assert_eq!(m.step(&op), ret, "{op}");
    }
    let s = m.stats();
    assert_eq!((s.hits, s.misses, s.invalidations, s.deregistrations), (2, 2, 1, 1));
    assert!(judge(indep(), &seed_history()).is_ok());
}

#[test]
//= spec.md#P1
//= spec.md#S1.4
fn p1_coverage() {
    // Accepted: a hit on a registration that covers the request.
    judge(indep(), &seed_history()).unwrap();
    // Rejected: a hit on a registration that does not cover the request.
    rejects(indep(), &[(acq(1, 0x1000, 0x1000), miss(1, 0x1000, 0x1000)), (acq(2, 0x1000, 0x2000), hit(1, 0x1000, 0x1000))], Property::P1);
    // Rejected: a miss whose registration does not cover the request.
    rejects(indep(), &[(acq(1, 0x1000, 0x2000), miss(1, 0x1000, 0x1000))], Property::P1);
    // Rejected: a hit with too little access.
    let rw = Access::REMOTE_WRITE;
    rejects(
        indep(),
        &[(acq(1, 0x1000, 0x1000), miss(1, 0x1000, 0x1000)), (acq_with(2, 0x1000, 0x1000, rw), hit(1, 0x1000, 0x1000))],
        Property::P1,
    );
}

#[test]
//= spec.md#P2
//= spec.md#S5.3
//= spec.md#S1.5
fn p2_freshness_partial_free_while_leased() {
    let h = vec![
        (acq(1, 0x1000, 0x3000), miss(1, 0x1000, 0x3000)),
        (unmap(0x3000, 0x1000), DONE),
        // R1 left the lookup but is still leased: the next acquire must miss.
        (acq(2, 0x1000, 0x1000), miss(2, 0x1000, 0x1000)),
        (rel(1), DONE),
        (rel(2), DONE),
    ];
    let m = judge(indep(), &h).unwrap();
    let s = m.stats();
    assert_eq!((s.leased_invalidations, s.deferred_deregistrations, s.deregistrations), (1, 1, 1));
    // Rejected: a hit on the invalidated, still-leased R1 (MVAPICH2's dreg).
    rejects(indep(), &[h[0], h[1], (acq(2, 0x1000, 0x1000), hit(1, 0x1000, 0x3000))], Property::P2);
    // Rejected: the same after R1 was deregistered.
    rejects(indep(), &[h[0], (rel(1), DONE), h[1], (acq(2, 0x1000, 0x1000), hit(1, 0x1000, 0x3000))], Property::P2);
}

#[test]
//= spec.md#P3
fn p3_no_premature_deregistration() {
    let mut m = Model::new(indep());
    m.judge(&acq(1, 0x1000, 0x3000), &miss(1, 0x1000, 0x3000)).unwrap();
    m.judge(&unmap(0x3000, 0x1000), &DONE).unwrap();
    // Accepted: nothing is due yet.
    assert!(m.pending_deregistrations().is_empty());
    // Rejected: deregistering the invalidated R1 while L1 holds it.
    assert_eq!(m.observe_deregister(1).unwrap_err().property, Property::P3);
    m.judge(&rel(1), &DONE).unwrap();
    assert_eq!(m.pending_deregistrations(), vec![view(1, 0x1000, 0x3000)]);
    m.observe_deregister(1).unwrap();
}

#[test]
//= spec.md#P4
//= spec.md#S3.2
fn p4_exactly_once_deregistration() {
    let mut m = Model::new(indep());
    m.judge(&acq(1, 0x1000, 0x1000), &miss(1, 0x1000, 0x1000)).unwrap();
    m.judge(&rel(1), &DONE).unwrap();
    m.judge(&unmap(0x1000, 0x1000), &DONE).unwrap();
    m.observe_deregister(1).unwrap();
    assert_eq!(m.observe_deregister(1).unwrap_err().property, Property::P4);
    assert_eq!(m.observe_deregister(9).unwrap_err().property, Property::P4);
}

fn limited(max_regions: u64) -> Config {
    Config { limits: Limits { max_regions: Some(max_regions), ..Limits::default() }, ..Config::default() }
}

#[test]
//= spec.md#P5
//= spec.md#S6.4
fn p5_limits_evict_lru_unleased() {
    let h = vec![
        (acq(1, 0x1000, 0x1000), miss(1, 0x1000, 0x1000)),
        (acq(2, 0x3000, 0x1000), miss(2, 0x3000, 0x1000)),
        (rel(1), DONE),
        (rel(2), DONE),
        // A third entry: R1 is least recently used and goes.
        (acq(3, 0x5000, 0x1000), miss(3, 0x5000, 0x1000)),
        (acq(4, 0x3000, 0x1000), hit(2, 0x3000, 0x1000)),
    ];
    let m = judge(limited(2), &h).unwrap();
    assert_eq!(m.stats().evictions, 1);
    // Rejected: a cache that did not evict and hits R1.
    let mut bad = h[..5].to_vec();
    bad.push((acq(4, 0x1000, 0x1000), hit(1, 0x1000, 0x1000)));
    rejects(limited(2), &bad, Property::P5);
    // Leased entries are not evicted: over the limit is allowed while all are leased.
    let m = judge(limited(1), &[h[0], h[1]]).unwrap();
    assert_eq!(m.stats().cached_entries, 2);
    assert_eq!(m.check_invariants(), Ok(()));
}

#[test]
//= spec.md#S6.3
fn cost_aware_eviction_keeps_small_expensive_entries() {
    let cfg = Config { eviction: EvictionPolicy::CostAware, ..limited(2) };
    let mut m = Model::new(cfg);
    m.step(&acq(1, 0x1000, 0x1000)); // 1 page: costly per page
    m.step(&acq(2, 0x100000, 0x100000)); // 256 pages: cheap per page
    m.step(&rel(1));
    m.step(&rel(2));
    m.step(&acq(3, 0x400000, 0x1000));
    // LRU would evict R1; GreedyDual-Size evicts the big cheap R2.
    assert!(m.registrations().any(|r| r.id == 1));
    assert!(!m.registrations().any(|r| r.id == 2));
}

#[test]
//= spec.md#L1
fn l1_deregistration_is_due_when_the_op_returns() {
    let mut m = Model::new(indep());
    m.judge(&acq(1, 0x1000, 0x1000), &miss(1, 0x1000, 0x1000)).unwrap();
    m.judge(&rel(1), &DONE).unwrap();
    m.judge(&unmap(0x1000, 0x1000), &DONE).unwrap();
    // An implementation that has not deregistered R1 by now breaks L1; the
    // harness asks the model what is due and finds R1 (accepted when confirmed).
    assert_eq!(m.pending_deregistrations(), vec![view(1, 0x1000, 0x1000)]);
    m.observe_deregister(1).unwrap();
    assert!(m.pending_deregistrations().is_empty());
}

#[test]
//= spec.md#C1
fn c1_hit_when_possible() {
    rejects(indep(), &[(acq(1, 0x1000, 0x3000), miss(1, 0x1000, 0x3000)), (acq(2, 0x2000, 0x1000), miss(2, 0x2000, 0x1000))], Property::C1);
    // A registrar failure on a would-be hit is equally wrong.
    let fail = Ret::Failed { error: OpError::Registrar { failure: RegistrarFailure::Fault, pressure: false } };
    rejects(indep(), &[(acq(1, 0x1000, 0x3000), miss(1, 0x1000, 0x3000)), (acq(2, 0x2000, 0x1000), fail)], Property::C1);
}

#[test]
//= spec.md#C2
//= spec.md#S6.1
fn c2_overlap_policies() {
    let first = (acq(1, 0x0, 0x10000), miss(1, 0x0, 0x10000));
    let second = acq(2, 0x8000, 0x10000);
    // independent: the request's own range.
    judge(Config::with_policy(OverlapPolicy::Independent), &[first, (second, miss(2, 0x8000, 0x10000))]).unwrap();
    // merge: the union; R1 leaves the lookup but stays registered while leased.
    let merge = Config::with_policy(OverlapPolicy::Merge);
    let m = judge(merge, &[first, (second, miss(2, 0x0, 0x18000))]).unwrap();
    assert_eq!((m.stats().merges, m.stats().deferred_deregistrations), (1, 1));
    rejects(merge, &[first, (second, miss(2, 0x8000, 0x10000))], Property::C2);
    // no-merge-uncache-contained: a larger request uncaches the contained R1.
    let nm = Config::with_policy(OverlapPolicy::NoMergeUncacheContained);
    let m = judge(nm, &[first, (rel(1), DONE), (acq(2, 0x0, 0x20000), miss(2, 0x0, 0x20000))]).unwrap();
    assert_eq!((m.stats().uncached, m.stats().deregistrations), (1, 1));
    // ... while an overlapping, non-contained R1 stays.
    let m = judge(nm, &[first, (second, miss(2, 0x8000, 0x10000))]).unwrap();
    assert_eq!(m.stats().cached_entries, 2);
}

#[test]
//= spec.md#S6.2
fn c2_alignment_widens_to_chunks() {
    let cfg = Config { chunk_pages: 4, ..Config::default() };
    judge(cfg, &[(acq(1, 0x5100, 100), miss(1, 0x4000, 0x4000))]).unwrap();
    rejects(cfg, &[(acq(1, 0x5100, 100), miss(1, 0x5000, 0x1000))], Property::C2);
}

#[test]
//= spec.md#C3
fn c3_no_spontaneous_eviction() {
    let mut m = Model::new(indep());
    m.judge(&acq(1, 0x1000, 0x1000), &miss(1, 0x1000, 0x1000)).unwrap();
    m.judge(&rel(1), &DONE).unwrap();
    assert_eq!(m.observe_deregister(1).unwrap_err().property, Property::C3);
}

#[test]
//= spec.md#S5.4
//= spec.md#E5
fn c3_pressure_evicts_unleased_then_retries() {
    let mut m = Model::new(indep());
    m.step(&acq(1, 0x1000, 0x1000));
    m.step(&rel(1));
    m.step(&acq(2, 0x3000, 0x1000));
    let pressured = Ret::Granted { reg: view(3, 0x5000, 0x1000), hit: false, pressure: true };
    m.judge(&acq(3, 0x5000, 0x1000), &pressured).unwrap();
    let s = m.stats();
    assert_eq!((s.pressure_evictions, s.cached_entries), (1, 2));
    // A registrar that fails for good: the error reaches the caller, state is kept.
    let fail = Ret::Failed { error: OpError::Registrar { failure: RegistrarFailure::Fault, pressure: false } };
    m.judge(&acq(4, 0x9000, 0x1000), &fail).unwrap();
    assert_eq!(m.stats().errors, 1);
    assert_eq!(m.stats().cached_entries, 2);
    // ENOMEM, evict, retry, EFAULT: the evictions happened and are followed.
    m.step(&rel(2));
    let after_pressure = Ret::Failed { error: OpError::Registrar { failure: RegistrarFailure::Fault, pressure: true } };
    m.judge(&acq(5, 0xb000, 0x1000), &after_pressure).unwrap();
    assert_eq!(m.stats().pressure_evictions, 2);
    // ENOMEM reported without the eviction and retry: rejected.
    let lazy = Ret::Failed { error: OpError::Registrar { failure: RegistrarFailure::NoMemory, pressure: false } };
    assert_eq!(m.judge(&acq(6, 0xd000, 0x1000), &lazy).unwrap_err().property, Property::C4);
}

#[test]
//= spec.md#C4
//= spec.md#E1
//= spec.md#E2
//= spec.md#E3
//= spec.md#E4
//= spec.md#S1.6
fn c4_errors_for_bad_input() {
    let mut m = Model::new(indep());
    assert_eq!(m.step(&acq(1, 0x1000, 0)), Ret::Failed { error: OpError::EmptyRange });
    assert_eq!(m.step(&acq(1, u64::MAX - 0xfff, 0x2000)), Ret::Failed { error: OpError::WrappingRange });
    assert_eq!(m.step(&rel(7)), Ret::Failed { error: OpError::UnknownLease { lease: 7 } });
    m.step(&acq(1, 0x1000, 0x1000));
    assert_eq!(m.step(&acq(1, 0x1000, 0x1000)), Ret::Failed { error: OpError::LeaseInUse { lease: 1 } });
    assert_eq!(m.step(&unmap(0x1000, 0)), Ret::Failed { error: OpError::EmptyRange });
    assert_eq!(m.stats().errors, 5);
    assert_eq!(m.check_invariants(), Ok(()));
    rejects(indep(), &[(rel(7), DONE)], Property::C4);
    rejects(indep(), &[(acq(1, 0x1000, 0), Ret::Failed { error: OpError::WrappingRange })], Property::C4);
}

#[test]
//= spec.md#S2.6
fn fork_forgets_without_deregistering() {
    let mut m = Model::new(indep());
    m.step(&acq(1, 0x1000, 0x1000));
    m.step(&acq(2, 0x3000, 0x1000));
    m.step(&rel(2));
    m.take_effects();
    assert_eq!(m.step(&Op::Fork), DONE);
    assert!(m.take_effects().iter().all(|e| matches!(e, Effect::Forget { .. })));
    assert_eq!(m.step(&rel(1)), DONE, "a pre-fork lease releases as a no-op");
    assert_eq!(m.step(&acq(3, 0x3000, 0x1000)), miss(3, 0x3000, 0x1000));
    assert_eq!(m.stats().forgotten, 2);
    assert_eq!(m.stats().deregistrations, 0);
}

#[test]
//= spec.md#S2.5
fn flush_defers_leased_entries() {
    let mut m = Model::new(indep());
    m.step(&acq(1, 0x1000, 0x1000));
    m.step(&acq(2, 0x3000, 0x1000));
    m.step(&rel(2));
    m.step(&Op::Flush);
    assert_eq!((m.stats().deregistrations, m.stats().deferred_deregistrations), (1, 1));
    assert_eq!(m.step(&acq(3, 0x1000, 0x1000)), miss(3, 0x1000, 0x1000));
}

#[test]
//= spec.md#S3.7
fn register_vs_invalidate_written_sequentially() {
    // The sequential reading of the race: the release event is ordered before
    // the acquire's insertion, so the acquire must not return the pre-event
    // registration; the canonical outcome is a fresh miss.
    let mut m = Model::new(indep());
    m.step(&acq(1, 0x1000, 0x1000));
    m.step(&rel(1));
    m.step(&unmap(0x1000, 0x1000));
    assert_eq!(m.step(&acq(2, 0x1000, 0x1000)), miss(2, 0x1000, 0x1000));
    assert!(m.lease(2).is_some_and(|r| r.registered_at == 1), "pins the frames mapped after event 1");
}

#[test]
//= spec.md#S9
fn sequential_spec_shape() {
    use stateright::semantics::SequentialSpec;
    let mut m = Model::new(indep());
    assert!(m.is_valid_history(seed_history()));
    let mut m = Model::new(indep());
    let mut bad = seed_history();
    bad[7].1 = hit(1, 0x1000, 0x3000);
    assert!(!m.is_valid_history(bad));
    let _ = P;
}

#[test]
fn l1_rejects_an_implementation_that_has_not_deregistered() {
    let mut m = Model::new(indep());
    m.judge(&acq(1, 0x1000, 0x1000), &miss(1, 0x1000, 0x1000)).unwrap();
    m.judge(&rel(1), &DONE).unwrap();
    assert_eq!(m.check_quiescent(), Ok(()));
    m.judge(&unmap(0x1000, 0x1000), &DONE).unwrap();
    // The impl returned from the release event without deregistering R1.
    assert_eq!(m.check_quiescent().unwrap_err().property, Property::L1);
    m.observe_deregister(1).unwrap();
    assert_eq!(m.check_quiescent(), Ok(()));
}

#[test]
fn c3_rejects_the_wrong_victim() {
    let mut m = Model::new(limited(2));
    for (op, ret) in [
        (acq(1, 0x1000, 0x1000), miss(1, 0x1000, 0x1000)),
        (acq(2, 0x3000, 0x1000), miss(2, 0x3000, 0x1000)),
        (rel(1), DONE),
        (rel(2), DONE),
        (acq(3, 0x5000, 0x1000), miss(3, 0x5000, 0x1000)),
    ] {
        m.judge(&op, &ret).unwrap();
    }
    // LRU's victim is R1; an implementation that evicted R2 is caught.
    assert_eq!(m.observe_deregister(2).unwrap_err().property, Property::C3);
    m.observe_deregister(1).unwrap();
}

#[test]
fn c3_pressure_only_on_a_miss() {
    let first = (acq(1, 0x1000, 0x1000), miss(1, 0x1000, 0x1000));
    let pressured_hit = Ret::Granted { reg: view(1, 0x1000, 0x1000), hit: true, pressure: true };
    rejects(indep(), &[first, (acq(2, 0x1000, 0x1000), pressured_hit)], Property::C3);
}

#[test]
fn no_merge_uncache_contained_keeps_the_displaced_rights() {
    // A buffer sent from, then received into: the second registration takes
    // both rights, so the third request hits instead of displacing again.
    let c = Config::with_policy(OverlapPolicy::NoMergeUncacheContained);
    let rw = Access::LOCAL_WRITE | Access::REMOTE_READ;
    let h = [
        (acq_with(1, 0x1000, 0x2000, Access::REMOTE_READ), miss(1, 0x1000, 0x2000)),
        (rel(1), DONE),
        (
            acq_with(2, 0x1000, 0x2000, Access::LOCAL_WRITE),
            Ret::Granted { reg: RegView { id: 2, addr: 0x1000, len: 0x2000, access: rw }, hit: false, pressure: false },
        ),
        (rel(2), DONE),
        (
            acq_with(3, 0x1000, 0x1000, Access::REMOTE_READ),
            Ret::Granted { reg: RegView { id: 2, addr: 0x1000, len: 0x2000, access: rw }, hit: true, pressure: false },
        ),
    ];
    let m = judge(c, &h).unwrap();
    assert_eq!((m.stats().uncached, m.stats().registrations), (1, 2));
    // Registering the requested access alone breaks C2.
    let mut narrow = h[..3].to_vec();
    narrow[2].1 =
        Ret::Granted { reg: RegView { id: 2, addr: 0x1000, len: 0x2000, access: Access::LOCAL_WRITE }, hit: false, pressure: false };
    rejects(c, &narrow, Property::C2);
}

#[test]
//= spec.md#S2.8
fn trim_evicts_only_unleased_entries() {
    let mut m = Model::new(indep());
    m.step(&acq(1, 0x1000, 0x1000));
    m.step(&acq(2, 0x3000, 0x1000));
    m.step(&rel(2));
    m.take_effects();
    assert_eq!(m.step(&Op::Trim), DONE);
    assert_eq!(m.take_effects(), vec![Effect::Deregister { view: view(2, 0x3000, 0x1000), reason: DeregReason::Pressure }]);
    assert_eq!((m.stats().pressure_evictions, m.stats().cached_entries), (1, 1));
    assert_eq!(m.step(&acq(3, 0x1000, 0x1000)), hit(1, 0x1000, 0x1000), "the leased entry stays findable");
    // A trim that claims to have kept an unleased entry is caught by the next hit.
    let h = [
        (acq(1, 0x1000, 0x1000), miss(1, 0x1000, 0x1000)),
        (rel(1), DONE),
        (Op::Trim, DONE),
        (acq(2, 0x1000, 0x1000), hit(1, 0x1000, 0x1000)),
    ];
    rejects(indep(), &h, Property::C3);
}

#[test]
fn logged_trims_split_the_pressure_path() {
    // S5.4 in a concurrent history: the trim is its own op; the acquire's
    // `pressure` flag then evicts nothing more, and may come with a hit (A8).
    let mut m = Model::new(indep()).concurrent().trims_logged();
    m.step(&acq(1, 0x1000, 0x1000));
    m.step(&rel(1));
    m.step(&Op::Trim);
    m.step(&acq(2, 0x3000, 0x1000));
    m.step(&rel(2));
    let pressured = Ret::Granted { reg: view(3, 0x5000, 0x1000), hit: false, pressure: true };
    m.judge(&acq(3, 0x5000, 0x1000), &pressured).unwrap();
    assert_eq!(m.stats().pressure_evictions, 1, "R2, released after the trim, stays");
    let pressured_hit = Ret::Granted { reg: view(3, 0x5000, 0x1000), hit: true, pressure: true };
    m.judge(&acq(4, 0x5000, 0x1000), &pressured_hit).unwrap();
    // Without logged trims the same flag on a hit is rejected (c3_pressure_only_on_a_miss),
    // and a hit on an entry a logged trim removed is rejected.
    let h = [
        (acq(1, 0x1000, 0x1000), miss(1, 0x1000, 0x1000)),
        (rel(1), DONE),
        (Op::Trim, DONE),
        (acq(2, 0x1000, 0x1000), Ret::Granted { reg: view(1, 0x1000, 0x1000), hit: true, pressure: true }),
    ];
    let mut m = Model::new(indep()).trims_logged();
    let err = h.iter().find_map(|(op, ret)| m.judge(op, ret).err()).expect("rejected");
    assert_eq!(err.property, Property::C3);
}

#[test]
//= spec.md#E6
fn c4_retries_exhausted_only_in_concurrent_histories() {
    let e6 = Ret::Failed { error: OpError::RetriesExhausted };
    rejects(indep(), &[(acq(1, 0x1000, 0x1000), e6)], Property::C4);
    let mut m = Model::new(indep()).concurrent();
    m.judge(&acq(1, 0x1000, 0x1000), &e6).unwrap();
}

#[test]
fn invariants_catch_a_corrupted_model() {
    let mut m = Model::new(indep());
    m.step(&acq(1, 0x1000, 0x1000));
    let mut stale = m.clone();
    stale.events.push((PageSpan { first: 1, end: 2 }, 99));
    assert_eq!(stale.check_invariants().unwrap_err().property, Property::P2);
    let mut lost = m.clone();
    lost.leases.clear();
    assert_eq!(lost.check_invariants().unwrap_err().property, Property::P3);
    let mut orphan = m.clone();
    orphan.leases.clear();
    let r = orphan.regs.get_mut(&1).unwrap();
    r.leases = 0;
    r.findable = false;
    assert_eq!(orphan.check_invariants().unwrap_err().property, Property::L1);
}

#[test]
fn never_panics_on_extreme_input() {
    // Deterministic pseudo-random search over huge and boundary ranges, every
    // policy, small limits and odd chunk sizes (a bounded loop).
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let edges = [0, 1, 0xfff, 0x1000, 1 << 62, (1 << 63) - 0x1000, (1 << 63) - 1, 1 << 63, u64::MAX - 0xfff, u64::MAX];
    for round in 0..300u64 {
        let config = Config {
            policy: OverlapPolicy::ALL[(round % 3) as usize],
            chunk_pages: [1, 2, 3, 4, 16][(round % 5) as usize],
            eviction: if round % 2 == 0 { EvictionPolicy::Lru } else { EvictionPolicy::CostAware },
            limits: Limits { max_regions: Some(round % 4), ..Limits::default() },
            ..Config::default()
        };
        let mut m = Model::new(config);
        for _ in 0..40 {
            let r = next();
            let pick = |v: u64| if v.is_multiple_of(3) { edges[(v / 3 % 10) as usize] } else { v >> (v % 64) };
            let (addr, len) = (pick(next()), pick(next()));
            let op = match r % 5 {
                0 | 1 => Op::Acquire { lease: r % 6, addr, len, access: RR },
                2 => Op::Release { lease: r % 6 },
                3 => Op::ReleaseEvent { kind: ReleaseKind::Munmap, addr, len },
                _ => Op::Flush,
            };
            let ret = m.step(&op);
            let _ = format!("{op} {ret}");
            assert_eq!(m.check_invariants(), Ok(()), "{op}");
        }
    }
}

fn begin(addr: u64, len: u64) -> Op {
    Op::ReleaseBegin { addr, len }
}
fn end(addr: u64, len: u64) -> Op {
    Op::ReleaseEnd { addr, len }
}

#[test]
//= spec.md#S2.9
fn a_release_window_serves_misses_without_caching_them() {
    let mut m = Model::new(indep());
    assert_eq!(m.step(&acq(1, 0x1000, 0x2000)), miss(1, 0x1000, 0x2000));
    m.take_effects();
    // begin: the release event's effect now (the leased R1 leaves the lookup).
    assert_eq!(m.step(&begin(0x2000, 0x1000)), DONE);
    assert_eq!((m.stats().release_events, m.stats().leased_invalidations, m.open_windows()), (1, 1, 1));
    // Inside the window: misses, each served (with its id) and never cached.
    assert_eq!(m.step(&acq(2, 0x2000, 0x1000)), miss(2, 0x2000, 0x1000));
    assert_eq!(m.step(&acq(3, 0x2000, 0x1000)), miss(3, 0x2000, 0x1000), "R2 was not cached");
    assert_eq!((m.stats().uncached, m.stats().cached_entries), (2, 0));
    // A miss that only touches a page next to the window is cached.
    assert_eq!(m.step(&acq(4, 0x3000, 0x1000)), miss(4, 0x3000, 0x1000));
    assert_eq!(m.step(&acq(5, 0x3000, 0x1000)), hit(4, 0x3000, 0x1000));
    // The uncached registration goes at its last release (S3.2).
    m.take_effects();
    m.step(&rel(2));
    assert_eq!(m.take_effects(), vec![Effect::Deregister { view: view(2, 0x2000, 0x1000), reason: DeregReason::LastLease }]);
    // end closes the window; a second end finds none (E7, nothing changes).
    assert_eq!(m.step(&end(0x2000, 0x1000)), DONE);
    let errors = m.stats().errors;
    assert_eq!(m.step(&end(0x2000, 0x1000)), Ret::Failed { error: OpError::UnmatchedReleaseEnd });
    assert_eq!((m.stats().errors, m.stats().release_events), (errors + 1, 1));
    // After the window: cached again.
    assert_eq!(m.step(&acq(6, 0x2000, 0x1000)), miss(5, 0x2000, 0x1000));
    assert_eq!(m.step(&acq(7, 0x2000, 0x1000)), hit(5, 0x2000, 0x1000));
    // A history that claims a window's miss was cached is caught by the next
    // acquire (which must miss: C1 judges the hit on a non-findable entry).
    let h = [
        (begin(0x1000, 0x1000), DONE),
        (acq(1, 0x1000, 0x1000), miss(1, 0x1000, 0x1000)),
        (acq(2, 0x1000, 0x1000), hit(1, 0x1000, 0x1000)),
    ];
    assert!(judge(indep(), &h).is_err());
}

#[test]
//= spec.md#E7
fn release_windows_are_a_multiset_closed_by_exact_pages() {
    let mut m = Model::new(indep());
    m.step(&begin(0x1000, 0x2000));
    m.step(&begin(0x1000, 0x2000));
    m.step(&begin(0x2000, 0x1000));
    // Pages, not bytes: [0x1800, 0x2800) has the pages of [0x1000, 0x3000).
    assert_eq!(m.step(&end(0x1800, 0x1000)), DONE);
    assert_eq!(m.step(&end(0x1000, 0x1000)), Ret::Failed { error: OpError::UnmatchedReleaseEnd });
    assert_eq!(m.open_windows(), 2);
    assert_eq!(m.step(&end(0x1000, 0x2000)), DONE);
    // [0x2000, 0x3000) is still inside a window: its miss is not cached.
    assert_eq!(m.step(&acq(1, 0x2000, 0x1000)), miss(1, 0x2000, 0x1000));
    assert_eq!(m.stats().cached_entries, 0);
    assert_eq!(m.step(&end(0x2000, 0x1000)), DONE);
    assert_eq!(m.open_windows(), 0);
    // E1/E2 open or close nothing.
    assert_eq!(m.step(&begin(0x1000, 0)), Ret::Failed { error: OpError::EmptyRange });
    assert_eq!(m.step(&end(u64::MAX, 2)), Ret::Failed { error: OpError::WrappingRange });
    assert_eq!(m.open_windows(), 0);
    // A fork child has no windows.
    m.step(&begin(0x1000, 0x1000));
    m.step(&Op::Fork);
    assert_eq!(m.open_windows(), 0);
    assert_eq!(m.step(&end(0x1000, 0x1000)), Ret::Failed { error: OpError::UnmatchedReleaseEnd });
}
