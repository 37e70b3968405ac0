//! A real fork of a cache that reads a userfaultfd monitor (spec.md#S2.6,
//! F1; conformance case fork-child-unmap).
//!
//! The parent's monitor does not follow the child: its thread does not exist
//! there, and its userfaultfd context watches the *parent's* memory, so the
//! child's munmap is never reported to it (and a child that read it would
//! take events that belong to the parent). The child's cache therefore
//! detaches from it at its first operation and caches nothing until the
//! child installs a monitor of its own: every acquire is a miss whose
//! registration is deregistered at its release. The fault switch
//! `fork_keeps_monitor` puts the old behaviour back, and the child then hits
//! a registration of memory it replaced with new frames (P2).

use mrcache::monitor::MonitorThread;
use mrcache::registrar::counting::CountingRegistrar;
use mrcache::types::Access;
use mrcache::{Cache, CacheConfig, Faults};
use std::sync::atomic::Ordering;
use std::sync::Arc;

const P: u64 = 4096;
const LEN: u64 = 2 * P;
const RW: Access = Access::LOCAL_WRITE;

fn map() -> u64 {
    mrcache::mem::map_anon(LEN, 0).expect("mmap")
}

/// Replaces `[a, a+LEN)` by fresh anonymous memory at the same address
/// (free-then-reuse: new frames behind the same addresses). One
/// `mmap(MAP_FIXED)` over the old mapping, which the kernel reports as an
/// UNMAP of the replaced range. Not `munmap` then `mmap(MAP_FIXED)`: between
/// the two another thread can map something into the hole (a monitor thread
/// starting up maps its signal stack there), and the MAP_FIXED would then
/// clobber it. Returns false if the mmap fails.
fn map_again(a: u64) -> bool {
    // SAFETY: MAP_FIXED over this test's own mapping `[a, a+LEN)`, which
    // nothing else uses; no lease of it is used after.
    let p = unsafe {
        libc::mmap(
            a as *mut _,
            LEN as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    p as u64 == a
}

/// Forks; the child runs `child` and exits with its code. Returns the code.
fn in_child(child: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child runs `child` (this thread's data, malloc and thread
    // creation, fork-safe in glibc) and then `_exit`s without unwinding into
    // the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(99);
        // SAFETY: leaves the child at once.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child did not exit normally: {status}");
    libc::WEXITSTATUS(status)
}

fn monitored(faults: Faults) -> (Arc<Cache<CountingRegistrar>>, MonitorThread) {
    let cache = Arc::new(Cache::new(CountingRegistrar::default(), CacheConfig { faults, ..CacheConfig::explicit() }));
    let monitor = MonitorThread::start(&cache).expect("userfaultfd available (root or user-mode-only)");
    (cache, monitor)
}

#[test]
//= spec.md#F1
fn a_fork_child_caches_nothing_until_its_own_monitor_runs() {
    let (cache, monitor) = monitored(Faults::default());
    // Borrowed by the child closure (which the parent drops unrun): the
    // parent's monitor must keep running in the parent.
    let monitor = std::cell::RefCell::new(Some(monitor));
    let a = map();
    drop(cache.acquire(a, LEN, RW).unwrap());
    assert!(cache.acquire(a, LEN, RW).unwrap().hit(), "cached in the parent");
    let code = in_child(|| {
        let r = cache.registrar();
        let deregs = r.deregistered.load(Ordering::SeqCst);
        // 1. Forgotten, and not cached again: a miss, deregistered at its
        //    release (and never the parent's registration).
        let Ok(l) = cache.acquire(a, LEN, RW) else { return 1 };
        if l.hit() {
            return 2;
        }
        drop(l);
        if r.deregistered.load(Ordering::SeqCst) != deregs + 1 || cache.stats().cached_entries != 0 {
            return 3;
        }
        // 2. Memory the child replaces is a miss (trivially: nothing is cached).
        if !map_again(a) {
            return 4;
        }
        match cache.acquire(a, LEN, RW) {
            Ok(l) if !l.hit() => drop(l),
            _ => return 5,
        }
        // 3. With a monitor of the child's own, caching resumes...
        let Ok(child_monitor) = MonitorThread::start(&cache) else { return 6 };
        drop(cache.acquire(a, LEN, RW).unwrap());
        match cache.acquire(a, LEN, RW) {
            Ok(l) if l.hit() => drop(l),
            _ => return 7,
        }
        // 4. ...and the child's own releases are seen.
        if !map_again(a) {
            return 8;
        }
        match cache.acquire(a, LEN, RW) {
            Ok(l) if !l.hit() => drop(l),
            _ => return 9,
        }
        drop(child_monitor);
        // The parent's monitor handle has no thread here: dropping it must not hang.
        drop(monitor.borrow_mut().take());
        0
    });
    assert_eq!(code, 0, "child check failed (see the codes in the child closure)");
    // The parent is unaffected: still cached, and its own monitor still sees its releases.
    assert!(cache.acquire(a, LEN, RW).unwrap().hit());
    assert!(map_again(a));
    assert!(!cache.acquire(a, LEN, RW).unwrap().hit(), "the parent's monitor missed the parent's replacement");
    drop(monitor);
}

#[test]
fn teeth_fork_keeps_monitor_hits_a_stale_registration_in_the_child() {
    let mut faults = Faults::default();
    faults.fork_keeps_monitor = true;
    let (cache, _monitor) = monitored(faults);
    let a = map();
    drop(cache.acquire(a, LEN, RW).unwrap());
    let code = in_child(|| {
        drop(cache.acquire(a, LEN, RW).unwrap()); // the child's own registration, cached
        if !map_again(a) {
            return 4;
        }
        // The parent's monitor saw nothing: the stale registration is a hit.
        match cache.acquire(a, LEN, RW) {
            Ok(l) if l.hit() => 0,
            Ok(_) => 10,
            Err(_) => 11,
        }
    });
    assert_eq!(code, 0, "with the fault switch the child should hit its stale registration (code {code})");
}
