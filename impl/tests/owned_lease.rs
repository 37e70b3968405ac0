//! Owned leases (`SharedCache::acquire_owned`): a lease that refers to its
//! cache by itself, stored in a request object and released on any thread.
//! It is counted like a borrowed lease, so a release on the thread that took
//! it stays on the lane fast path (spec.md#LN3), and one from another thread
//! takes the remote path. The cache lives while any owned lease from it
//! lives: the last handle dropped with leases out leaks it (and says so).

use mrcache::registrar::counting::{CountingHandle, CountingRegistrar};
use mrcache::registrar::{Keys, Registrar, RegistrarError};
use mrcache::{CacheConfig, OwnedLease, SharedCache};
use mrcache_types::{Access, Range, ReleaseKind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

const A: u64 = 1 << 32;
const LEN: u64 = 8192;

fn cache() -> SharedCache<CountingRegistrar> {
    SharedCache::new(CountingRegistrar::default(), CacheConfig::explicit())
}

/// The counting registrar, plus a flag its drop (the cache's) raises.
struct Tracked {
    inner: CountingRegistrar,
    dropped: Arc<AtomicBool>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::SeqCst);
    }
}

impl Registrar for Tracked {
    type Handle = CountingHandle;
    fn register(&self, range: Range, access: Access) -> Result<CountingHandle, RegistrarError> {
        self.inner.register(range, access)
    }
    fn deregister(&self, handle: CountingHandle) -> Result<(), RegistrarError> {
        self.inner.deregister(handle)
    }
    fn keys(&self, handle: &CountingHandle) -> Keys {
        self.inner.keys(handle)
    }
    fn name(&self) -> &'static str {
        "tracked"
    }
}

fn tracked(lanes: bool) -> (SharedCache<Tracked>, Arc<AtomicBool>) {
    let dropped = Arc::new(AtomicBool::new(false));
    let r = Tracked { inner: CountingRegistrar::default(), dropped: dropped.clone() };
    (SharedCache::new(r, CacheConfig { lanes, ..CacheConfig::explicit() }), dropped)
}

/// A request object as a communication library keeps one: the lease is
/// released when the operation completes.
struct SendRequest {
    lease: Option<OwnedLease<CountingRegistrar>>,
    bytes: u64,
}

fn assert_send<T: Send>(_: &T) {}

#[test]
fn owned_lease_outlives_every_handle_to_its_cache() {
    // Deterministic; repeated so that a use after free has many chances to
    // show (the freed cache's memory reused by the next round's).
    for _ in 0..200 {
        let (c, dropped) = tracked(true);
        let lease = c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap();
        assert!(lease.on_lane());
        assert_eq!(lease.cache().diagnostics().owned_leases, 1);
        drop(c);
        assert!(!dropped.load(Ordering::SeqCst), "the lease keeps the cache alive");
        let d = lease.cache().diagnostics();
        assert_eq!(d.leaked_for_owned_leases, 1, "the last handle leaked the cache, and says so");
        assert_eq!(d.owned_leases, 1);
        // Still usable: its registration, and the cache behind it.
        assert_eq!(lease.cache().registrar().inner.live(), 1);
        assert!(lease.view().len >= LEN);
        let _ = lease.keys();
        lease.cache().acquire(A, LEN, Access::LOCAL_WRITE).unwrap().release();
        lease.cache().invalidate(A, 4096, ReleaseKind::Munmap).unwrap();
        let cache = lease.cache() as *const mrcache::Cache<Tracked>;
        lease.release();
        // SAFETY: leaked (checked above or below), so alive for good.
        let cache = unsafe { &*cache };
        assert_eq!(cache.registrar().inner.deregistered.load(Ordering::SeqCst), 1, "P4: the release deregistered it");
        assert_eq!(cache.diagnostics().owned_leases, 0);
        assert!(!dropped.load(Ordering::SeqCst), "leaked: never freed");
    }
}

#[test]
fn released_on_another_thread_after_the_last_handle_is_gone() {
    for _ in 0..100 {
        let (c, dropped) = tracked(true);
        let lease = c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap();
        let go = Arc::new(Barrier::new(2));
        let t = {
            let go = go.clone();
            std::thread::spawn(move || {
                go.wait();
                assert_eq!(lease.cache().registrar().inner.live(), 1);
                lease.release();
            })
        };
        drop(c);
        go.wait();
        t.join().unwrap();
        assert!(!dropped.load(Ordering::SeqCst));
    }
}

#[test]
fn with_no_lease_out_the_last_handle_frees_the_cache() {
    let (c, dropped) = tracked(true);
    // Leases taken on several threads, released on others.
    let leases: Vec<_> = (0..4)
        .map(|i| {
            let c = c.clone();
            std::thread::spawn(move || c.acquire_owned(A + i * 4 * LEN, LEN, Access::LOCAL_WRITE).unwrap()).join().unwrap()
        })
        .collect();
    assert_eq!(c.diagnostics().owned_leases, 4);
    std::thread::spawn(move || drop(leases)).join().unwrap();
    assert_eq!(c.diagnostics().owned_leases, 0);
    let own = c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap();
    own.release();
    assert_eq!(c.diagnostics().owned_leases, 0);
    assert_eq!(c.diagnostics().leaked_for_owned_leases, 0);
    drop(c);
    assert!(dropped.load(Ordering::SeqCst), "no lease out: freed with the last handle");
}

#[test]
fn a_release_racing_the_last_handle_either_frees_after_it_or_leaks() {
    // The release's return of its count is its last access to the cache: a
    // last handle that sees it frees the cache, one that does not leaks it.
    let (mut freed, mut leaked) = (0, 0);
    for _ in 0..500 {
        let (c, dropped) = tracked(true);
        let lease = c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap();
        let go = Arc::new(Barrier::new(2));
        let t = {
            let go = go.clone();
            std::thread::spawn(move || {
                go.wait();
                lease.release();
            })
        };
        go.wait();
        drop(c);
        t.join().unwrap();
        if dropped.load(Ordering::SeqCst) {
            freed += 1;
        } else {
            leaked += 1;
        }
    }
    assert_eq!(freed + leaked, 500);
}

#[test]
fn two_last_handles_dropped_at_once_leave_the_cache_to_its_lease() {
    // A `strong_count == 1` test before each drop would let both handles
    // pass it (each sees 2) and free the cache under the lease.
    for _ in 0..300 {
        let (c, dropped) = tracked(true);
        let lease = c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap();
        let c2 = c.clone();
        let go = Arc::new(Barrier::new(2));
        let t = {
            let go = go.clone();
            std::thread::spawn(move || {
                go.wait();
                drop(c2);
            })
        };
        go.wait();
        drop(c);
        t.join().unwrap();
        assert!(!dropped.load(Ordering::SeqCst), "the lease keeps the cache alive");
        assert_eq!(lease.cache().diagnostics().leaked_for_owned_leases, 1);
        lease.release();
    }
}

#[test]
fn a_laneless_lease_dropped_last_leaves_the_cache_to_the_lane_leases() {
    // Every lane claimed by a thread holding a lane lease: the next thread's
    // owned lease holds a handle instead. Released after every other handle
    // is gone, its handle is the last one, and sees the lane leases.
    let (c, dropped) = tracked(true);
    let n = mrcache::cache::MAX_LANES;
    let hold = Arc::new(Barrier::new(n + 1));
    let done = Arc::new(Barrier::new(n + 1));
    let threads: Vec<_> = (0..n as u64)
        .map(|i| {
            let (c, hold, done) = (c.clone(), hold.clone(), done.clone());
            std::thread::spawn(move || {
                let l = c.acquire_owned(A + i * 4 * LEN, LEN, Access::LOCAL_WRITE).unwrap();
                assert!(l.on_lane());
                drop(c);
                hold.wait();
                done.wait();
                l.release();
            })
        })
        .collect();
    hold.wait();
    let laneless = c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap();
    assert!(!laneless.on_lane(), "every lane is claimed");
    assert_eq!(c.diagnostics().owned_leases, n as u64);
    drop(c);
    let cache = laneless.cache() as *const mrcache::Cache<Tracked>;
    laneless.release();
    assert!(!dropped.load(Ordering::SeqCst), "the lane leases keep the cache alive");
    // SAFETY: leaked (checked above or below), so alive for good.
    assert_eq!(unsafe { &*cache }.diagnostics().leaked_for_owned_leases, 1);
    done.wait();
    for t in threads {
        t.join().unwrap();
    }
    // SAFETY: leaked, as above.
    assert_eq!(unsafe { &*cache }.diagnostics().owned_leases, 0);
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
    assert_eq!(c.diagnostics().owned_leases, 0);
}

#[test]
fn released_on_its_own_thread_it_keeps_the_lane_fast_path() {
    let c = cache();
    // Miss, then an A1 hit that memoizes (LN2): the next ones are lane hits.
    drop(c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap());
    drop(c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap());
    let before = c.diagnostics();
    let handles = c.handle_count();
    for _ in 0..10 {
        let l = c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap();
        assert!(l.hit());
        assert!(l.on_lane());
        assert_eq!(c.handle_count(), handles, "no Arc count per lease");
        l.release();
    }
    let after = c.diagnostics();
    assert_eq!(after.lane_hits - before.lane_hits, 10, "served by the lane");
    assert_eq!(after.lane_releases - before.lane_releases, 10, "released on the owner's lane (LN3 fast path)");
    assert_eq!(c.stats().releases, 12);
    assert_eq!(after.owned_leases, 0);
}

#[test]
fn a_lane_lease_released_elsewhere_takes_the_remote_path_and_the_lane_stays_usable() {
    let c = cache();
    drop(c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap());
    drop(c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap());
    let l = c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap();
    let before = c.diagnostics();
    assert_eq!(before.owned_leases, 1);
    std::thread::spawn(move || l.release()).join().unwrap();
    let after = c.diagnostics();
    assert_eq!(after.lane_releases, before.lane_releases, "not an owner release");
    assert_eq!(after.owned_leases, 0, "returned remotely");
    assert_eq!(c.stats().releases, 3);
    // The slot's count is back to zero: an invalidation deregisters at once.
    let l = c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap();
    assert_eq!(c.diagnostics().lane_hits, after.lane_hits + 1);
    drop(l);
    c.invalidate(A, 4096, ReleaseKind::Munmap).unwrap();
    assert_eq!(c.registrar().deregistered.load(Ordering::SeqCst), 1);
}

#[test]
fn with_lanes_off_a_lease_holds_a_strong_count() {
    let (c, dropped) = tracked(false);
    let l = c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap();
    assert!(!l.on_lane());
    assert_eq!(c.handle_count(), 2, "the lease holds the cache's Arc");
    assert_eq!(c.diagnostics().owned_leases, 0, "not counted on a lane");
    drop(c);
    assert!(!dropped.load(Ordering::SeqCst), "the lease keeps the cache alive");
    assert_eq!(l.cache().diagnostics().leaked_for_owned_leases, 0, "no leak: the lease's count frees it");
    std::thread::spawn(move || l.release()).join().unwrap();
    assert!(dropped.load(Ordering::SeqCst), "the last lease freed the cache");
}

#[test]
fn leases_of_a_replaced_generation_still_count() {
    let (c, dropped) = tracked(true);
    let l = c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap();
    c.simulate_fork();
    // A lease from before the (replayed) fork: counted in the old generation.
    assert_eq!(c.diagnostics().owned_leases, 1);
    drop(c);
    assert!(!dropped.load(Ordering::SeqCst));
    assert_eq!(l.cache().diagnostics().leaked_for_owned_leases, 1);
    let cache = l.cache() as *const mrcache::Cache<Tracked>;
    l.release(); // a no-op on the cache (S2.6), then the count
                 // SAFETY: leaked (checked above or below), so alive for good.
    assert_eq!(unsafe { &*cache }.diagnostics().owned_leases, 0);
}

#[test]
fn after_a_replayed_fork_with_nothing_out_the_cache_is_freed() {
    let (c, dropped) = tracked(true);
    c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap().release();
    c.simulate_fork();
    c.acquire_owned(A, LEN, Access::LOCAL_WRITE).unwrap().release();
    drop(c);
    assert!(dropped.load(Ordering::SeqCst));
}
