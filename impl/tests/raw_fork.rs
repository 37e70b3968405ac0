//! A fork that runs no atfork handler (a raw `SYS_fork`, as a `clone`
//! without `CLONE_VM` would be): the slow paths still see it (spec.md#F1),
//! through the wipe-on-fork word, where they used to ask for the pid with a
//! system call on every miss. Its own file: the child of a raw fork must be
//! the only thread's copy (glibc's locks are not reset for it).

use mrcache::registrar::counting::CountingRegistrar;
use mrcache::types::Access;
use mrcache::{Cache, CacheConfig};
use std::sync::atomic::Ordering;

const P: u64 = 4096;
const RR: Access = Access::REMOTE_READ;

/// Runs in the child; returns the exit code (0 = all checks passed).
fn child(cache: &Cache<CountingRegistrar>) -> i32 {
    let r = cache.registrar();
    let deregs_at_fork = r.deregistered.load(Ordering::SeqCst);
    // A miss takes the slow path, whose check sees the fork: the parent's
    // entry is forgotten without a registrar call.
    let Ok(l) = cache.acquire(8 * P, P, RR) else { return 2 };
    if l.hit() {
        return 3;
    }
    drop(l);
    let s = cache.stats();
    if s.forgotten != 1 || s.cached_entries != 1 {
        return 4;
    }
    // The parent's entry is not found here any more: a miss.
    let Ok(l) = cache.acquire(0, P, RR) else { return 5 };
    if l.hit() {
        return 6;
    }
    drop(l);
    cache.flush();
    // Only the child's own two registrations are deregistered.
    if r.deregistered.load(Ordering::SeqCst) != deregs_at_fork + 2 {
        return 7;
    }
    0
}

#[test]
//= spec.md#F1
fn a_raw_fork_is_seen_by_the_slow_paths() {
    let cache = Cache::new(CountingRegistrar::default(), CacheConfig::explicit());
    drop(cache.acquire(0, P, RR).unwrap()); // cached in the parent
                                            // SAFETY: a fork without atfork handlers, from a process whose other
                                            // threads (the test harness's) hold no lock the child needs: the child
                                            // runs `child` on this thread's data and then `_exit`s.
    let pid = unsafe { libc::syscall(libc::SYS_fork) } as libc::pid_t;
    assert!(pid >= 0, "SYS_fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| child(&cache))).unwrap_or(99);
        // SAFETY: leaves the child at once, without the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child did not exit normally: {status}");
    assert_eq!(libc::WEXITSTATUS(status), 0, "child check failed (see the codes in `child`)");
    // The parent is unaffected.
    let l = cache.acquire(0, P, RR).unwrap();
    assert!(l.hit());
    drop(l);
    assert_eq!(cache.stats().forgotten, 0);
    cache.flush();
    assert_eq!(cache.registrar().live(), 0);
}
