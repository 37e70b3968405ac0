//! The C API against the reference model (spec.md#S9): random sequential
//! histories driven through the `extern "C"` functions only, each op also
//! stepped in `mrcache_model::Model`. Sequentially the cache gives the
//! model's canonical outcome, so everything is compared exactly after every
//! op: the status (E1, E2, E4 as MRCACHE_INVALID_LEASE), the registration a
//! lease names (id, page-aligned range, access), and every counter of
//! `mrcache_stats` against the model's `Stats`; at the end, after destroy,
//! the registrar saw as many deregistrations as registrations.
//!
//! Not here: E3 (a C caller does not name leases), E5/E6 and fork (the
//! impl's own differential test covers them with its test registrar).

mod common;

use common::*;
use mrcache_capi::mrcache_status_t::*;
use mrcache_capi::*;
use mrcache_model::Model;
use mrcache_types::config::{Config, EvictionPolicy, Limits, OverlapPolicy};
use mrcache_types::{Access, Op, OpError, ReleaseKind, Ret, Stats};
use proptest::prelude::*;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::Ordering;

const P: u64 = 4096;
/// Addresses fall in a window of 64 pages at 4 GiB (overlaps are common).
const BASE: u64 = 1 << 32;

#[derive(Clone, Debug)]
enum Step {
    Acquire {
        page: u64,
        offset: u64,
        len: u64,
        access: u8,
    },
    /// Releases the `k`-th held lease (modulo), or, if none is held, a stale one.
    Release {
        k: usize,
    },
    /// Releases an already released lease again.
    DoubleRelease,
    Invalidate {
        page: u64,
        len: u64,
    },
    Flush,
    Trim,
    /// E1 / E2 on acquire and on invalidate.
    BadRange {
        empty: bool,
        invalidate: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0..64u64, 0..P, 1..6 * P, 0..16u8).prop_map(|(page, offset, len, access)| Step::Acquire { page, offset, len, access }),
        5 => any::<usize>().prop_map(|k| Step::Release { k }),
        1 => Just(Step::DoubleRelease),
        2 => (0..64u64, 1..4 * P).prop_map(|(page, len)| Step::Invalidate { page, len }),
        1 => Just(Step::Flush),
        1 => Just(Step::Trim),
        1 => (any::<bool>(), any::<bool>()).prop_map(|(empty, invalidate)| Step::BadRange { empty, invalidate }),
    ]
}

fn config() -> impl Strategy<Value = Config> {
    (0..3usize, any::<bool>(), prop::option::of(1..6u64), prop::option::of(4..24u64)).prop_map(|(p, cost, regions, pages)| Config {
        policy: OverlapPolicy::ALL[p],
        eviction: if cost { EvictionPolicy::CostAware } else { EvictionPolicy::Lru },
        limits: Limits {
            max_regions: regions,
            max_pinned_bytes: pages.map(|n| n * P),
            max_unreleased: Some(Limits::DEFAULT_MAX_UNRELEASED),
        },
        ..Config::default()
    })
}

fn status_of(ret: &Ret) -> mrcache_status_t {
    match ret {
        Ret::Granted { .. } | Ret::Done => MRCACHE_OK,
        Ret::Failed { error: OpError::EmptyRange } => MRCACHE_EMPTY_RANGE,
        Ret::Failed { error: OpError::WrappingRange } => MRCACHE_WRAPPING_RANGE,
        Ret::Failed { error: OpError::UnknownLease { .. } } => MRCACHE_INVALID_LEASE,
        Ret::Failed { error: OpError::Registrar { .. } } => MRCACHE_REGISTRAR,
        Ret::Failed { error: OpError::RetriesExhausted } => MRCACHE_RETRIES_EXHAUSTED,
        Ret::Failed { error } => panic!("the C API cannot produce {error}"),
    }
}

fn same_stats(c: &mrcache_stats_t, m: &Stats) -> bool {
    let ours = Stats {
        acquires: c.acquires,
        hits: c.hits,
        misses: c.misses,
        errors: c.errors,
        releases: c.releases,
        release_events: c.release_events,
        registrations: c.registrations,
        deregistrations: c.deregistrations,
        bytes_registered: c.bytes_registered,
        pinned_bytes: c.pinned_bytes,
        peak_pinned_bytes: c.peak_pinned_bytes,
        cached_entries: c.cached_entries,
        invalidations: c.invalidations,
        leased_invalidations: c.leased_invalidations,
        deferred_deregistrations: c.deferred_deregistrations,
        merges: c.merges,
        uncached: c.uncached,
        evictions: c.evictions,
        pressure_evictions: c.pressure_evictions,
        forgotten: c.forgotten,
    };
    ours == *m
}

fn run(config: Config, steps: Vec<Step>) -> Result<(), TestCaseError> {
    let counting = Counting::default();
    let mut cfg = common::config(mrcache_monitor_t::MRCACHE_MONITOR_EXPLICIT);
    cfg.overlap = config.policy as u32;
    cfg.eviction = config.eviction as u32;
    cfg.max_regions = config.limits.max_regions.unwrap_or(0);
    cfg.max_pinned_bytes = config.limits.max_pinned_bytes.unwrap_or(0);
    let r = registrar(&counting);
    let mut cache = std::ptr::null_mut();
    // SAFETY: valid pointers, as a C caller passes them.
    prop_assert_eq!(unsafe { mrcache_create(&cfg, &r, &mut cache) }, MRCACHE_OK);
    let mut model = Model::new(config);
    // Lease ids (the model's names) of held leases, with their C handles.
    let mut held: Vec<(u64, mrcache_lease_t)> = Vec::new();
    let mut released: Vec<(u64, mrcache_lease_t)> = Vec::new();
    let mut next_lease = 1u64;
    let mut views: HashMap<u64, (u64, u64, u64, u8)> = HashMap::new();
    for (i, s) in steps.iter().enumerate() {
        let (op, status, lease_out) = match *s {
            Step::Acquire { page, offset, len, access } => {
                let (addr, lease) = (BASE + page * P + offset, next_lease);
                next_lease += 1;
                let mut out = mrcache_lease_t::default();
                // SAFETY: a live cache and a writable lease.
                let st = unsafe { mrcache_acquire(cache, addr as *const c_void, len as usize, u32::from(access), &mut out) };
                let access = Access::from_bits(access).unwrap();
                (Op::Acquire { lease, addr, len, access }, st, Some((lease, out)))
            }
            Step::Release { k } if !held.is_empty() => {
                let (lease, h) = held.remove(k % held.len());
                released.push((lease, h));
                // SAFETY: a live cache.
                (Op::Release { lease }, unsafe { mrcache_release(cache, h) }, None)
            }
            Step::Release { .. } | Step::DoubleRelease => match released.last() {
                // SAFETY: a live cache; the lease is released already.
                Some(&(lease, h)) => (Op::Release { lease }, unsafe { mrcache_release(cache, h) }, None),
                None => continue,
            },
            Step::Invalidate { page, len } => {
                let addr = BASE + page * P;
                // SAFETY: a live cache.
                let st = unsafe { mrcache_invalidate(cache, addr as *const c_void, len as usize) };
                (Op::ReleaseEvent { kind: ReleaseKind::Munmap, addr, len }, st, None)
            }
            // SAFETY: a live cache.
            Step::Flush => (Op::Flush, unsafe { mrcache_flush(cache) }, None),
            // SAFETY: a live cache.
            Step::Trim => (Op::Trim, unsafe { mrcache_trim(cache) }, None),
            Step::BadRange { empty, invalidate } => {
                let (addr, len) = if empty { (BASE, 0) } else { (u64::MAX - P, 2 * P) };
                let mut out = mrcache_lease_t::default();
                // SAFETY: a live cache and a writable lease.
                let st = unsafe {
                    if invalidate {
                        mrcache_invalidate(cache, addr as *const c_void, len as usize)
                    } else {
                        mrcache_acquire(cache, addr as *const c_void, len as usize, 0, &mut out)
                    }
                };
                let op = if invalidate {
                    Op::ReleaseEvent { kind: ReleaseKind::Munmap, addr, len }
                } else {
                    let lease = next_lease;
                    next_lease += 1;
                    Op::Acquire { lease, addr, len, access: Access::LOCAL_READ }
                };
                (op, st, None)
            }
        };
        let expected = model.step(&op);
        prop_assert_eq!(status, status_of(&expected), "step {}: {:?}: model says {}", i, op, expected);
        if let (Ret::Granted { reg, .. }, Some((lease, h))) = (&expected, lease_out) {
            let mut v = std::mem::MaybeUninit::<mrcache_view_t>::uninit();
            // SAFETY: a live cache, a held lease, a writable view.
            prop_assert_eq!(unsafe { mrcache_lease_view(cache, h, v.as_mut_ptr()) }, MRCACHE_OK);
            // SAFETY: written by the call above.
            let v = unsafe { v.assume_init() };
            let got = (v.id, v.addr as u64, v.len as u64, v.access as u8);
            prop_assert_eq!(got, (reg.id, reg.addr, reg.len, reg.access.bits()), "step {}: {:?}", i, op);
            views.insert(lease, got);
            held.push((lease, h));
        }
        let st = stats(cache);
        prop_assert!(same_stats(&st, &model.stats()), "step {}: {:?}: stats\n  C:     {:?}\n  model: {:?}", i, op, st, model.stats());
        prop_assert_eq!(st.leases_held as usize, model.leases_held());
    }
    for (lease, h) in held.drain(..) {
        // SAFETY: a live cache.
        prop_assert_eq!(unsafe { mrcache_release(cache, h) }, MRCACHE_OK);
        model.step(&Op::Release { lease });
    }
    prop_assert!(same_stats(&stats(cache), &model.stats()));
    // SAFETY: no lease is held.
    prop_assert_eq!(unsafe { mrcache_destroy(cache) }, MRCACHE_OK);
    prop_assert_eq!(counting.registered.load(Ordering::SeqCst), counting.deregistered.load(Ordering::SeqCst));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]
    #[test]
    fn the_c_api_gives_the_models_outcomes(config in config(), steps in prop::collection::vec(step(), 1..60)) {
        run(config, steps)?;
    }
}
