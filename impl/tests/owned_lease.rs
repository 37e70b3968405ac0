//! Owned leases (`Cache::acquire_owned`): a lease that keeps its cache alive,
//! stored in a request object and released on any thread. It is counted like
//! a borrowed lease, so a release on the thread that took it stays on the lane
//! fast path (spec.md#LN3), and one from another thread takes the remote path.

use mrcache::registrar::counting::CountingRegistrar;
use mrcache::{Cache, CacheConfig, OwnedLease};
use mrcache_types::{Access, ReleaseKind};
use std::sync::atomic::Ordering;
use std::sync::Arc;

const A: u64 = 1 << 32;
const LEN: u64 = 8192;

fn cache() -> Arc<Cache<CountingRegistrar>> {
    Arc::new(Cache::new(CountingRegistrar::default(), CacheConfig::default()))
}

/// A request object as a communication library keeps one: the lease is
/// released when the operation completes.
struct SendRequest {
    lease: Option<OwnedLease<CountingRegistrar>>,
    bytes: u64,
}

fn assert_send<T: Send>(_: &T) {}

#[test]
fn owned_lease_outlives_every_other_handle_to_its_cache() {
    let c = cache();
    let lease = c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap();
    let weak = Arc::downgrade(&c);
    drop(c);
    assert!(weak.upgrade().is_some(), "the lease keeps the cache alive");
    assert_eq!(lease.cache().registrar().live(), 1);
    drop(lease);
    assert!(weak.upgrade().is_none(), "the last lease's release frees the cache");
}

#[test]
fn stored_in_a_request_and_released_on_another_thread() {
    let c = cache();
    let req = SendRequest { lease: Some(c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap()), bytes: LEN };
    assert_send(&req);
    let view = req.lease.as_ref().unwrap().view();
    assert!(view.len >= req.bytes);
    // P3: invalidated while leased, it stays registered until the release.
    c.invalidate(A, 4096, ReleaseKind::Munmap).unwrap();
    assert_eq!(c.registrar().deregistered.load(Ordering::SeqCst), 0);
    std::thread::spawn(move || {
        let mut req = req;
        req.lease.take().unwrap().release();
    })
    .join()
    .unwrap();
    assert_eq!(c.registrar().deregistered.load(Ordering::SeqCst), 1, "P4: the remote release deregistered it once");
    assert_eq!(c.stats().releases, 1);
}

#[test]
fn released_on_its_own_thread_it_keeps_the_lane_fast_path() {
    let c = cache();
    // Miss, then an A1 hit that memoizes (LN2): the next ones are lane hits.
    drop(c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap());
    drop(c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap());
    let before = c.diagnostics();
    for _ in 0..10 {
        let l = c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap();
        assert!(l.hit());
        l.release();
    }
    let after = c.diagnostics();
    assert_eq!(after.lane_hits - before.lane_hits, 10, "served by the lane");
    assert_eq!(after.lane_releases - before.lane_releases, 10, "released on the owner's lane (LN3 fast path)");
    assert_eq!(c.stats().releases, 12);
}

#[test]
fn a_lane_lease_released_elsewhere_takes_the_remote_path_and_the_lane_stays_usable() {
    let c = cache();
    drop(c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap());
    drop(c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap());
    let l = c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap();
    let before = c.diagnostics();
    std::thread::spawn(move || l.release()).join().unwrap();
    let after = c.diagnostics();
    assert_eq!(after.lane_releases, before.lane_releases, "not an owner release");
    assert_eq!(c.stats().releases, 3);
    // The slot's count is back to zero: an invalidation deregisters at once.
    let l = c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap();
    assert_eq!(c.diagnostics().lane_hits, after.lane_hits + 1);
    drop(l);
    c.invalidate(A, 4096, ReleaseKind::Munmap).unwrap();
    assert_eq!(c.registrar().deregistered.load(Ordering::SeqCst), 1);
}
