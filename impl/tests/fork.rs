//! A real fork (spec.md#S2.6, F1): the child forgets every registration
//! without registrar calls (its registrar would share the parent's
//! descriptors), releases leases held at the fork as no-ops, and registers
//! afresh; the parent is unaffected.

use mrcache::registrar::counting::CountingRegistrar;
use mrcache::types::{Access, ReleaseKind};
use mrcache::{Cache, CacheConfig};
use std::sync::atomic::Ordering;

const P: u64 = 4096;
const RR: Access = Access::REMOTE_READ;

/// Runs in the child; returns the exit code (0 = all checks passed).
fn child(cache: &Cache<CountingRegistrar>, held: mrcache::Lease<'_, CountingRegistrar>) -> i32 {
    let r = cache.registrar();
    let deregs_at_fork = r.deregistered.load(Ordering::SeqCst);
    // The first operation detects the fork: the held lease's registration was
    // invalidated in the parent; releasing it here must not deregister it.
    drop(held);
    if r.deregistered.load(Ordering::SeqCst) != deregs_at_fork {
        return 1;
    }
    // The cached entry was forgotten: a miss, with the next id (ids continue).
    let Ok(l) = cache.acquire(4 * P, P, RR) else { return 2 };
    if l.hit() || l.view().id != 3 {
        return 3;
    }
    drop(l);
    let s = cache.stats();
    if s.forgotten != 2 || s.cached_entries != 1 || s.pinned_bytes != P {
        return 4;
    }
    // Only the child's own registration is ever deregistered here.
    cache.flush();
    if r.deregistered.load(Ordering::SeqCst) != deregs_at_fork + 1 {
        return 5;
    }
    0
}

#[test]
//= spec.md#F1
fn fork_child_forgets_without_deregistering() {
    let cache = Cache::new(CountingRegistrar::default(), CacheConfig::explicit());
    let held = cache.acquire(0, P, RR).unwrap(); // id 1, leased
    cache.invalidate(0, P, ReleaseKind::Munmap).unwrap(); // invalid, still leased
    drop(cache.acquire(4 * P, P, RR).unwrap()); // id 2, cached
                                                // SAFETY: the child only runs `child` (which uses this thread's data and
                                                // malloc, fork-safe in glibc) and then `_exit`s.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| child(&cache, held))).unwrap_or(99);
        // SAFETY: leaves the child at once, without running the parent's
        // destructors or test harness.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child did not exit normally: {status}");
    assert_eq!(libc::WEXITSTATUS(status), 0, "child check failed (see the codes in `child`)");
    // The parent is unaffected.
    let l = cache.acquire(4 * P, P, RR).unwrap();
    assert!(l.hit());
    assert_eq!(l.view().id, 2);
    drop(l);
    assert_eq!(cache.registrar().live(), 2);
    drop(held);
    assert_eq!(cache.registrar().live(), 1);
    cache.flush();
    assert_eq!(cache.registrar().live(), 0);
    assert_eq!(cache.stats().forgotten, 0);
}
