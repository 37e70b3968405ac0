//! Registrar failures (spec.md#S5.4, A5): ENOMEM/EAGAIN → evict every
//! unleased entry and retry once (`pressure`); otherwise E5 with the
//! registrar's errno. Each outcome is judged by the model (`Model::judge`,
//! which allows registrar failures and pressure on misses) and the stats of
//! the cache and the judged model must agree.

mod common;

use common::{Call, Recorder};
use mrcache::types::{Access, Op, OpError, RegistrarFailure, ReleaseKind, Ret};
use mrcache::{Cache, CacheConfig, Config, EvictionPolicy, Limits, OverlapPolicy};
use mrcache_model::Model;
use std::collections::HashMap;

const P: u64 = 4096;
const RR: Access = Access::REMOTE_READ;

fn acq(lease: u64, addr: u64, len: u64) -> Op {
    Op::Acquire { lease, addr, len, access: RR }
}
fn rel(lease: u64) -> Op {
    Op::Release { lease }
}

/// Applies `(op, errnos to fail the next registrar calls with)` to the cache;
/// the model judges each outcome. Returns the outcomes.
fn judged(config: Config, steps: &[(Op, &[Option<i32>])], same_stats: bool) -> Vec<Ret> {
    let cache = Cache::new(Recorder::default(), CacheConfig::new(config));
    let mut model = Model::new(config);
    let mut leases = HashMap::new();
    let mut out = Vec::new();
    for (i, (op, script)) in steps.iter().enumerate() {
        cache.registrar().fail_next(script);
        let ret = cache.apply(op, &mut leases);
        if let Err(v) = model.judge(op, &ret) {
            panic!("op #{i} {op}: `{ret}` rejected: {v}");
        }
        for v in model.pending_deregistrations() {
            model.observe_deregister(v.id).unwrap();
        }
        if same_stats {
            assert_eq!(cache.stats(), model.stats(), "stats after op #{i} {op} -> {ret}");
        }
        assert!(cache.registrar().script.lock().unwrap().is_empty(), "script not consumed at op #{i}");
        out.push(ret);
    }
    drop(leases);
    cache.flush();
    assert_eq!(cache.registrar().live(), 0);
    out
}

fn granted(r: &Ret) -> (u64, bool, bool) {
    match r {
        Ret::Granted { reg, hit, pressure } => (reg.id, *hit, *pressure),
        other => panic!("expected a grant, got {other}"),
    }
}

#[test]
fn enomem_then_success_is_pressure() {
    for policy in OverlapPolicy::ALL {
        for errno in [libc::ENOMEM, libc::EAGAIN] {
            let rets = judged(
                Config::with_policy(policy),
                &[
                    (acq(1, 0, P), &[]),
                    (rel(1), &[]),
                    (acq(2, 4 * P, P), &[]),
                    (rel(2), &[]),
                    (acq(3, 8 * P, P), &[]), // stays leased
                    (acq(4, 12 * P, P), &[Some(errno)]),
                    (acq(5, 0, P), &[]), // entry 1 was evicted: a miss
                ],
                true,
            );
            assert_eq!(granted(&rets[5]), (4, false, true));
            assert_eq!(granted(&rets[6]), (5, false, false));
        }
    }
}

#[test]
fn merge_replans_after_the_pressure_eviction() {
    // Entry 1 (unleased) and entry 2 (leased) both overlap the request; the
    // pressure eviction removes 1, so the merged registration spans only the
    // request and entry 2, as the model (which plans after evicting) says.
    let rets = judged(
        Config::with_policy(OverlapPolicy::Merge),
        &[
            (acq(1, 0, 2 * P), &[]),
            (rel(1), &[]),
            (acq(2, 4 * P, 2 * P), &[]),
            (acq(3, P, 4 * P), &[Some(libc::ENOMEM)]),
        ],
        true,
    );
    match rets[3] {
        Ret::Granted { reg, hit: false, pressure: true } => {
            assert_eq!((reg.addr, reg.len), (P, 5 * P), "{reg}");
        }
        ref r => panic!("{r}"),
    }
}

#[test]
fn enomem_twice_is_e5_after_evicting() {
    let rets = judged(
        Config { limits: Limits { max_regions: Some(8), ..Limits::default() }, ..Config::default() },
        &[
            (acq(1, 0, P), &[]),
            (rel(1), &[]),
            (acq(2, 4 * P, P), &[Some(libc::ENOMEM), Some(libc::ENOMEM)]),
            (acq(3, 0, P), &[]),
        ],
        true,
    );
    assert_eq!(rets[2], Ret::Failed { error: OpError::Registrar { failure: RegistrarFailure::NoMemory, pressure: true } });
    assert_eq!(granted(&rets[3]), (2, false, false));
}

#[test]
fn efault_is_e5_and_the_cache_stays_consistent() {
    for policy in OverlapPolicy::ALL {
        let config = Config { policy, eviction: EvictionPolicy::CostAware, ..Config::default() };
        let rets = judged(
            config,
            &[
                (acq(1, 0, 2 * P), &[]),
                (rel(1), &[]),
                (acq(2, P, 4 * P), &[Some(libc::EFAULT)]),
                (acq(3, 0, P), &[]), // still cached: a hit
                (acq(4, 8 * P, P), &[Some(libc::EINVAL)]),
                (acq(4, 8 * P, P), &[]), // lease name 4 is free again
                (Op::ReleaseEvent { kind: ReleaseKind::Munmap, addr: 0, len: P }, &[]),
                (acq(5, 0, P), &[]),
            ],
            true,
        );
        assert_eq!(rets[2], Ret::Failed { error: OpError::Registrar { failure: RegistrarFailure::Fault, pressure: false } });
        assert_eq!(granted(&rets[3]), (1, true, false));
        assert_eq!(rets[4], Ret::Failed { error: OpError::Registrar { failure: RegistrarFailure::Other, pressure: false } });
        assert!(!granted(&rets[5]).1);
        assert!(!granted(&rets[7]).1);
    }
}

#[test]
fn registrar_error_carries_verb_and_errno() {
    let cache = Cache::new(Recorder::default(), CacheConfig::default());
    cache.registrar().fail_next(&[Some(libc::EFAULT)]);
    let e = cache.acquire(0x1000, 10, RR).unwrap_err();
    assert_eq!(e.code(), "E5");
    let r = e.registrar_error().unwrap();
    assert_eq!((r.verb, r.errno, r.failure), ("test_reg", libc::EFAULT, RegistrarFailure::Fault));
    let msg = e.to_string();
    assert!(msg.contains("test_reg") && msg.contains("errno 14") && msg.contains("recorder"), "{msg}");
    assert_eq!(cache.stats().errors, 1);
    assert_eq!(cache.stats().misses, 0);
    assert!(matches!(cache.registrar().take_calls()[..], [Call::Failed(..)]));
}

#[test]
fn enomem_then_efault_is_e5_fault() {
    // The error says the cache evicted before its retry, so the judge follows
    // the eviction and the stats agree too.
    let rets = judged(
        Config::default(),
        &[(acq(1, 0, P), &[]), (rel(1), &[]), (acq(2, 4 * P, P), &[Some(libc::ENOMEM), Some(libc::EFAULT)])],
        true,
    );
    assert_eq!(rets[2], Ret::Failed { error: OpError::Registrar { failure: RegistrarFailure::Fault, pressure: true } });
}

#[test]
fn bad_config_is_an_error_not_a_panic() {
    let mut c = CacheConfig::default();
    c.contract.page_size = 3000;
    assert!(Cache::try_new(Recorder::default(), c).is_err());
    let mut c = CacheConfig::default();
    c.contract.chunk_pages = 0;
    assert!(Cache::try_new(Recorder::default(), c).is_err());
    let mut c = CacheConfig::default();
    c.contract.chunk_pages = 1 << 60;
    let e = Cache::try_new(Recorder::default(), c).unwrap_err();
    assert!(e.to_string().contains("2^62"), "{e}");
    let c = CacheConfig { max_retries: 0, ..CacheConfig::default() };
    assert!(Cache::try_new(Recorder::default(), c).is_err());
}
