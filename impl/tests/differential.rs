//! Sequential differential test: the cache against the reference model.
//!
//! Every op goes to `Cache::apply` and to `Model::step` under the same
//! `Config`. After every op: identical `Ret`, identical `Stats`, the same
//! registrar effects (registrations with their range and access, the ids
//! deregistered — deregistration timing included: sequentially the cache
//! deregisters within the op, as L1 requires), and a live registrar count equal
//! to the model's registrations plus those forgotten by forks. At the end every
//! lease is released and both are flushed: then nothing is pinned but what a
//! fork forgot.

mod common;

use common::{Call, Recorder};
use mrcache::types::{Access, Op, RegView, ReleaseKind, ADDRESS_LIMIT};
use mrcache::{Cache, CacheConfig, Config, EvictionPolicy, Limits, OverlapPolicy};
use mrcache_model::{Effect, Model};
use proptest::prelude::*;
use std::collections::HashMap;

const P: u64 = 4096;
const RR: Access = Access::REMOTE_READ;

fn acq(lease: u64, addr: u64, len: u64) -> Op {
    Op::Acquire { lease, addr, len, access: RR }
}
fn acq_a(lease: u64, addr: u64, len: u64, access: Access) -> Op {
    Op::Acquire { lease, addr, len, access }
}
fn rel(lease: u64) -> Op {
    Op::Release { lease }
}
fn unmap(addr: u64, len: u64) -> Op {
    Op::ReleaseEvent { kind: ReleaseKind::Munmap, addr, len }
}

/// Every configuration the tests sweep: 3 policies × 2 evictions × 4 limit
/// sets × 2 chunk sizes.
fn configs() -> Vec<Config> {
    let limits = [
        Limits::default(),
        Limits { max_regions: Some(3), ..Limits::default() },
        Limits { max_pinned_bytes: Some(6 * P), ..Limits::default() },
        Limits { max_regions: Some(4), max_pinned_bytes: Some(9 * P), max_unreleased: Some(8) },
    ];
    let mut out = Vec::new();
    for policy in OverlapPolicy::ALL {
        for eviction in [EvictionPolicy::Lru, EvictionPolicy::CostAware] {
            for limits in limits {
                for chunk_pages in [1, 4] {
                    out.push(Config { policy, page_size: P, chunk_pages, eviction, limits });
                }
            }
        }
    }
    out
}

/// Registrar calls the model's effects imply, in a canonical order.
fn model_calls(effects: Vec<Effect>) -> (Vec<RegView>, Vec<u64>) {
    let mut regs = Vec::new();
    let mut deregs = Vec::new();
    for e in effects {
        match e {
            Effect::Register { view } => regs.push(view),
            Effect::Deregister { view, .. } => deregs.push(view.id),
            Effect::Forget { .. } => {}
        }
    }
    deregs.sort();
    (regs, deregs)
}

/// Registrar calls the cache made. Sequentially the registrar's own serial
/// (from 0) is the cache id minus 1, since no registration is discarded.
fn cache_calls(calls: Vec<Call>, next_id: &mut u64) -> (Vec<(u64, u64, Access)>, Vec<u64>) {
    let mut regs = Vec::new();
    let mut deregs = Vec::new();
    for c in calls {
        match c {
            Call::Register(r, a) => {
                regs.push((r.addr, r.len, a));
                *next_id += 1;
            }
            Call::Deregister(serial) => deregs.push(serial + 1),
            Call::Failed(..) => {}
        }
    }
    deregs.sort();
    (regs, deregs)
}

/// Runs `ops` through both; panics with the op index on the first divergence.
fn differential(config: Config, ops: &[Op]) {
    let cache = Cache::new(Recorder::default(), CacheConfig::new(config));
    let mut model = Model::new(config);
    let mut leases = HashMap::new();
    let mut next_id = 0;
    let mut check = |i: usize, op: &Op, model: &mut Model, leases: &mut HashMap<_, _>| {
        let want = model.step(op);
        let got = cache.apply(op, leases);
        assert_eq!(got, want, "op #{i} {op} under {config:?}");
        assert_eq!(cache.stats(), model.stats(), "stats after op #{i} {op} under {config:?}");
        let (mregs, mderegs) = model_calls(model.take_effects());
        let (cregs, cderegs) = cache_calls(cache.registrar().take_calls(), &mut next_id);
        let mregs: Vec<_> = mregs.iter().map(|v| (v.addr, v.len, v.access)).collect();
        assert_eq!(cregs, mregs, "registrations of op #{i} {op}");
        assert_eq!(cderegs, mderegs, "deregistrations of op #{i} {op}");
        // L1 as the model checks it: every deregistration it expects was
        // observed by the end of the operation.
        for id in &cderegs {
            model.observe_deregister(*id).unwrap_or_else(|v| panic!("op #{i} {op}: {v}"));
        }
        model.check_quiescent().unwrap_or_else(|v| panic!("op #{i} {op}: {v}"));
        let forgotten = model.stats().forgotten;
        assert_eq!(
            cache.registrar().live(),
            model.registrations().count() as u64 + forgotten,
            "live registrations after op #{i} {op}"
        );
        let cached: Vec<u64> = cache.cached_views().iter().map(|v| v.id).collect();
        let mcached: Vec<u64> = model.registrations().filter(|r| r.findable).map(|r| r.id).collect();
        assert_eq!(cached, mcached, "cached entries after op #{i} {op}");
    };
    for (i, op) in ops.iter().enumerate() {
        check(i, op, &mut model, &mut leases);
    }
    // Release everything, then flush.
    let mut held: Vec<u64> = leases.keys().copied().collect();
    held.sort();
    let n = ops.len();
    for (k, lease) in held.into_iter().enumerate() {
        check(n + k, &rel(lease), &mut model, &mut leases);
    }
    check(usize::MAX, &Op::Flush, &mut model, &mut leases);
    let s = cache.stats();
    assert_eq!(s.cached_entries, 0);
    assert_eq!(s.pinned_bytes, 0, "nothing pinned after release-all + flush (forgotten ones are not counted)");
    assert_eq!(cache.registrar().live(), model.stats().forgotten);
    assert_eq!(model.registrations().count(), 0);
    assert_eq!(cache.stats(), model.stats());
    assert_eq!(cache.diagnostics().discarded_registrations, 0);
}

fn all_configs(ops: &[Op]) {
    for config in configs() {
        differential(config, ops);
    }
}

// ---------------------------------------------------------------------------
// Hand-written sequences (each under every configuration)

#[test]
fn seed_thread_scenario() {
    all_configs(&[
        acq(1, 0x1000, 0x3000),
        acq(2, 0x1000, 0x800),
        acq(3, 0x2000, 0x1000),
        rel(1),
        rel(2),
        rel(3),
        unmap(0x3000, 0x1000),
        acq(4, 0x1000, 0x1000),
        rel(4),
    ]);
}

#[test]
fn overlapping_sub_registrations_and_access_upgrades() {
    all_configs(&[
        acq(1, 0, 4 * P),
        acq(2, 2 * P, 4 * P),
        acq(3, P, P),
        acq_a(4, P, P, Access::REMOTE_WRITE | Access::LOCAL_WRITE),
        acq(5, 0, 8 * P),
        rel(1),
        acq(6, 3 * P, 100),
        acq_a(7, 10 * P, 2 * P, Access::LOCAL_READ),
        acq_a(8, 9 * P, 4 * P, Access::REMOTE_ATOMIC),
        rel(2),
        rel(5),
        acq(9, 0, 2 * P),
        rel(3),
    ]);
}

#[test]
fn partial_free_cached_and_leased() {
    // S5.2, S5.3: invalidation of unleased and leased entries, deferred
    // deregistration at the last release, later misses.
    all_configs(&[
        acq(1, 0, 4 * P),
        acq(2, 8 * P, 2 * P),
        rel(2),
        acq(3, 0, P),
        unmap(3 * P, P),
        unmap(9 * P + 10, 1),
        acq(4, 0, P),
        rel(1),
        rel(3),
        acq(5, 8 * P, P),
        unmap(0, 20 * P),
        rel(4),
        rel(5),
    ]);
}

#[test]
fn eviction_orders() {
    // Many small, some large; uses shuffle the LRU order; cost-aware prefers
    // evicting large idle entries.
    let mut ops = Vec::new();
    for i in 0..6u64 {
        ops.push(acq(i, i * 3 * P, P + (i % 3) * 2 * P));
        ops.push(rel(i));
    }
    ops.extend([acq(10, 0, P), rel(10), acq(11, 9 * P, P), acq(12, 30 * P, 6 * P), rel(12), rel(11)]);
    for i in 0..6u64 {
        ops.push(acq(20 + i, i * 3 * P, P));
    }
    for i in (0..6u64).rev() {
        ops.push(rel(20 + i));
    }
    ops.extend([acq(30, 40 * P, 10 * P), rel(30), acq(31, 60 * P, P), rel(31)]);
    all_configs(&ops);
}

#[test]
fn over_limit_with_everything_leased_then_released() {
    // R2: all entries leased while over a limit; evicted at the last release.
    let mut ops = Vec::new();
    for i in 0..6u64 {
        ops.push(acq(i, i * 4 * P, 2 * P));
    }
    for i in 0..6u64 {
        ops.push(rel(i));
    }
    all_configs(&ops);
}

#[test]
fn errors_e1_to_e4() {
    all_configs(&[
        acq(1, 0x1000, 0),
        acq(1, u64::MAX - 10, 100),
        acq(1, 0x1000, 10),
        acq(1, 0x1000, 10), // E3
        acq(1, 0x1000, 0),  // E1 wins over E3, as in the model
        rel(7),             // E4
        rel(1),
        rel(1), // E4
        unmap(0, 0),
        unmap(u64::MAX, 1),
        Op::Alloc { addr: 5, len: 0 },       // malloc(0): no error (S2.4)
        Op::Free { addr: u64::MAX, len: 2 }, // no error either
        Op::Alloc { addr: 0x1000, len: 10 },
        Op::Free { addr: 0x1000, len: 10 },
        acq(2, ADDRESS_LIMIT - 8 * P, P), // near the top, representable even with chunk 4
        rel(2),
    ]);
}

#[test]
fn flush_and_fork() {
    all_configs(&[
        acq(1, 0, 2 * P),
        acq(2, 4 * P, 2 * P),
        rel(2),
        Op::Flush,
        acq(3, 0, P),
        acq(4, 8 * P, P),
        rel(4),
        Op::Fork,
        rel(1), // orphan: no-op
        rel(3),
        acq(1, 0, P), // new registration in the child
        acq(3, 0, P), // E3? no: 3 was released; a hit
        acq(5, 8 * P, P),
        unmap(0, P),
        rel(1),
        Op::Fork,
        acq(6, 0, P),
        rel(6),
        rel(3),
        rel(5),
    ]);
}

#[test]
fn merge_chains() {
    // Entries that only overlap the widened span in later rounds.
    let ops = [
        acq(1, 0, P),
        acq(2, 2 * P, P),
        acq(3, 4 * P, P),
        acq(4, 6 * P, P),
        rel(2),
        acq(5, P, 6 * P),
        acq_a(6, 3 * P, P, Access::LOCAL_WRITE),
        unmap(5 * P, P),
        acq(7, 0, 8 * P),
        rel(1),
        rel(3),
        rel(4),
        rel(5),
        rel(6),
        rel(7),
    ];
    all_configs(&ops);
}

#[test]
fn top_of_the_address_space() {
    // S1.2: ranges end at or below 2^63; chunked spans near it stay exact.
    all_configs(&[
        acq(1, ADDRESS_LIMIT - 8 * P, P),
        acq(2, ADDRESS_LIMIT - 100, 100),
        acq(3, ADDRESS_LIMIT - 100, 101), // E2: ends past 2^63
        acq(3, ADDRESS_LIMIT, 1),         // E2
        unmap(ADDRESS_LIMIT - P, P),
        unmap(ADDRESS_LIMIT - P, P + 1), // E2, still a release_event call
        acq(4, ADDRESS_LIMIT - 3 * P, 3 * P),
        rel(1),
        rel(2),
        rel(4),
    ]);
}

// ---------------------------------------------------------------------------
// Random sequences over a small hot range

fn access() -> impl Strategy<Value = Access> {
    prop_oneof![
        Just(Access::LOCAL_READ),
        Just(Access::REMOTE_READ),
        Just(Access::LOCAL_WRITE | Access::REMOTE_READ),
        Just(Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let addr = prop_oneof![4 => (0u64..16).prop_map(|p| p * P), 1 => 0u64..16 * P];
    let len = prop_oneof![4 => (1u64..6).prop_map(|p| p * P), 1 => 1u64..6 * P];
    prop_oneof![
        30 => (0u64..8, addr.clone(), len.clone(), access()).prop_map(|(lease, addr, len, access)| Op::Acquire { lease, addr, len, access }),
        22 => (0u64..9).prop_map(|lease| Op::Release { lease }),
        8 => (addr.clone(), (1u64..3).prop_map(|p| p * P)).prop_map(|(addr, len)| Op::ReleaseEvent { kind: ReleaseKind::MadviseDontneed, addr, len }),
        2 => Just(Op::Flush),
        1 => Just(Op::Fork),
        2 => (addr, len).prop_map(|(addr, len)| Op::Free { addr, len }),
        1 => prop_oneof![
            Just(Op::Acquire { lease: 1, addr: 0x1000, len: 0, access: Access::LOCAL_READ }),
            Just(Op::Acquire { lease: 2, addr: u64::MAX - 5, len: 10, access: Access::LOCAL_READ }),
            Just(Op::ReleaseEvent { kind: ReleaseKind::Munmap, addr: 0, len: 0 }),
            Just(Op::Alloc { addr: u64::MAX, len: 1 }),
        ],
    ]
}

proptest! {
    // 1000 cases unless PROPTEST_CASES says otherwise.
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000)
    ))]

    #[test]
    fn random_ops_agree_with_the_model(cfg in 0usize..48, ops in proptest::collection::vec(op(), 1..150)) {
        let configs = configs();
        differential(configs[cfg % configs.len()], &ops);
    }
}
