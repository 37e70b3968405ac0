//! The C API called as C calls it (through the `extern "C"` functions):
//! every bad argument gets its status, leases are generation-checked,
//! re-entry from a callback is BUSY, a callback may unmap memory.

mod common;

use common::*;
use mrcache_capi::mrcache_monitor_t::*;
use mrcache_capi::mrcache_status_t::*;
use mrcache_capi::*;
use std::ffi::{c_void, CStr};
use std::ptr::{null, null_mut};
use std::sync::atomic::Ordering;

const LEN: usize = 64 << 10;

fn buf() -> *const c_void {
    (1usize << 32) as *const c_void
}

#[test]
fn hit_keys_view_stats_and_release() {
    let c = Counting::default();
    let cache = create(&c, MRCACHE_MONITOR_NONE);
    let mut a = mrcache_lease_t::default();
    let mut b = mrcache_lease_t::default();
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    unsafe {
        assert_eq!(mrcache_acquire(cache, buf(), LEN, MRCACHE_ACCESS_LOCAL_WRITE, &mut a), MRCACHE_OK);
        assert_eq!(mrcache_acquire(cache, buf().add(100), 4096, MRCACHE_ACCESS_LOCAL_READ, &mut b), MRCACHE_OK);
        assert_ne!(a, b, "two leases, two handles");
        let (mut lkey, mut rkey) = (0, 0);
        assert_eq!(mrcache_lease_keys(cache, a, &mut lkey, &mut rkey), MRCACHE_OK);
        assert_eq!((lkey, rkey), (1, 1001));
        let mut v = std::mem::MaybeUninit::<mrcache_view_t>::uninit();
        assert_eq!(mrcache_lease_view(cache, b, v.as_mut_ptr()), MRCACHE_OK);
        let v = v.assume_init();
        assert_eq!((v.id, v.addr as usize, v.len), (1, 1 << 32, LEN), "the hit is the first registration");
        assert_eq!(v.access, MRCACHE_ACCESS_LOCAL_WRITE);
        let s = stats(cache);
        assert_eq!((s.acquires, s.hits, s.misses, s.leases_held), (2, 1, 1, 2));
        assert_eq!(mrcache_destroy(cache), MRCACHE_BUSY, "leases are held");
        assert_eq!(mrcache_release(cache, a), MRCACHE_OK);
        assert_eq!(mrcache_release(cache, b), MRCACHE_OK);
        assert_eq!(stats(cache).leases_held, 0);
        assert_eq!(mrcache_destroy(cache), MRCACHE_OK);
    }
    assert_eq!(c.registered.load(Ordering::SeqCst), 1);
    assert_eq!(c.deregistered.load(Ordering::SeqCst), 1, "destroy deregisters what is cached");
}

#[test]
fn null_arguments_each_get_null_argument() {
    let c = Counting::default();
    let cache = create(&c, MRCACHE_MONITOR_EXPLICIT);
    let cfg = config(MRCACHE_MONITOR_NONE);
    let r = registrar(&c);
    let mut out = null_mut();
    let mut l = mrcache_lease_t::default();
    let (mut k1, mut k2) = (0u32, 0u32);
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    unsafe {
        assert_eq!(mrcache_config_init(null_mut()), MRCACHE_NULL_ARGUMENT);
        assert_eq!(mrcache_create(null(), &r, &mut out), MRCACHE_NULL_ARGUMENT);
        assert_eq!(mrcache_create(&cfg, null(), &mut out), MRCACHE_NULL_ARGUMENT);
        assert_eq!(mrcache_create(&cfg, &r, null_mut()), MRCACHE_NULL_ARGUMENT);
        assert!(out.is_null(), "nothing created");
        assert_eq!(mrcache_acquire(null_mut(), buf(), LEN, 0, &mut l), MRCACHE_NULL_ARGUMENT);
        assert_eq!(mrcache_acquire(cache, buf(), LEN, 0, null_mut()), MRCACHE_NULL_ARGUMENT);
        assert!(last_error().0.contains("lease is NULL"), "{}", last_error().0);
        assert_eq!(mrcache_release(null_mut(), l), MRCACHE_NULL_ARGUMENT);
        assert_eq!(mrcache_lease_keys(null(), l, &mut k1, &mut k2), MRCACHE_NULL_ARGUMENT);
        assert_eq!(mrcache_lease_keys(cache, l, null_mut(), &mut k2), MRCACHE_NULL_ARGUMENT);
        assert_eq!(mrcache_lease_keys(cache, l, &mut k1, null_mut()), MRCACHE_NULL_ARGUMENT);
        assert_eq!(mrcache_lease_view(null(), l, null_mut()), MRCACHE_NULL_ARGUMENT);
        assert_eq!(mrcache_lease_view(cache, l, null_mut()), MRCACHE_NULL_ARGUMENT);
        assert_eq!(mrcache_invalidate(null_mut(), buf(), LEN), MRCACHE_NULL_ARGUMENT);
        assert_eq!(mrcache_flush(null_mut()), MRCACHE_NULL_ARGUMENT);
        assert_eq!(mrcache_trim(null_mut()), MRCACHE_NULL_ARGUMENT);
        assert_eq!(mrcache_stats(null(), null_mut()), MRCACHE_NULL_ARGUMENT);
        assert_eq!(mrcache_stats(cache, null_mut()), MRCACHE_NULL_ARGUMENT);
        assert_eq!(mrcache_destroy(null_mut()), MRCACHE_NULL_ARGUMENT);
        assert_eq!(mrcache_monitor_start(null_mut()), MRCACHE_NULL_ARGUMENT);
        assert_eq!(mrcache_registrar_verbs(null_mut(), null_mut()), MRCACHE_NULL_ARGUMENT);
        let mut e = 0;
        assert!(!mrcache_last_error(null_mut()).is_null());
        mrcache_last_error(&mut e);
        assert_eq!(mrcache_destroy(cache), MRCACHE_OK);
    }
}

#[test]
fn bad_ranges_access_config_and_sizes() {
    let c = Counting::default();
    let cache = create(&c, MRCACHE_MONITOR_NONE);
    let mut l = mrcache_lease_t::default();
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    unsafe {
        assert_eq!(mrcache_acquire(cache, buf(), 0, 0, &mut l), MRCACHE_EMPTY_RANGE);
        assert_eq!(mrcache_acquire(cache, (usize::MAX - 10) as *const c_void, 100, 0, &mut l), MRCACHE_WRAPPING_RANGE);
        assert_eq!(mrcache_acquire(cache, buf(), LEN, 16, &mut l), MRCACHE_INVALID_ARGUMENT);
        assert_eq!(mrcache_invalidate(cache, buf(), 0), MRCACHE_EMPTY_RANGE);
        assert_eq!(mrcache_invalidate(cache, (usize::MAX - 10) as *const c_void, 100), MRCACHE_WRAPPING_RANGE);
        assert_eq!(l, mrcache_lease_t::default(), "no lease written on failure");
        let mut s = mrcache_stats_t::default();
        assert_eq!(mrcache_stats(cache, &mut s), MRCACHE_INVALID_ARGUMENT, "size 0");
        // An older caller's smaller struct gets only what fits.
        s.size = 24;
        assert_eq!(mrcache_stats(cache, &mut s), MRCACHE_OK);
        // Two acquires reached the cache (E1, E2); the bad access flags did not.
        assert_eq!((s.size, s.version, s.acquires, s.misses), (24, MRCACHE_ABI_VERSION, 2, 0));
        let r = registrar(&c);
        let mut out = null_mut();
        for bad in [
            mrcache_config_t { overlap: 3, ..config(MRCACHE_MONITOR_NONE) },
            mrcache_config_t { eviction: 2, ..config(MRCACHE_MONITOR_NONE) },
            mrcache_config_t { monitor: 3, ..config(MRCACHE_MONITOR_NONE) },
            mrcache_config_t { size: 8, ..config(MRCACHE_MONITOR_NONE) },
        ] {
            assert_eq!(mrcache_create(&bad, &r, &mut out), MRCACHE_INVALID_CONFIG);
            assert!(out.is_null());
        }
        let no_dereg = mrcache_registrar_t { dereg: None, ..r };
        assert_eq!(mrcache_create(&config(MRCACHE_MONITOR_NONE), &no_dereg, &mut out), MRCACHE_INVALID_CONFIG);
        assert!(last_error().0.contains("required"));
        assert_eq!(mrcache_destroy(cache), MRCACHE_OK);
    }
}

#[test]
fn double_stale_and_foreign_leases_are_invalid_lease() {
    let c = Counting::default();
    let (x, y) = (create(&c, MRCACHE_MONITOR_NONE), create(&c, MRCACHE_MONITOR_NONE));
    let mut l = mrcache_lease_t::default();
    let (mut k1, mut k2) = (0, 0);
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    unsafe {
        assert_eq!(mrcache_acquire(x, buf(), LEN, 0, &mut l), MRCACHE_OK);
        assert_eq!(mrcache_release(y, l), MRCACHE_INVALID_LEASE, "another cache's lease");
        assert_eq!(mrcache_lease_keys(y, l, &mut k1, &mut k2), MRCACHE_INVALID_LEASE);
        assert_eq!(mrcache_release(x, l), MRCACHE_OK);
        assert_eq!(mrcache_release(x, l), MRCACHE_INVALID_LEASE, "double release");
        assert_eq!(mrcache_lease_keys(x, l, &mut k1, &mut k2), MRCACHE_INVALID_LEASE, "released");
        // The slot is reused by the next acquire: the old handle stays dead.
        let mut m = mrcache_lease_t::default();
        assert_eq!(mrcache_acquire(x, buf(), LEN, 0, &mut m), MRCACHE_OK);
        assert_ne!(m, l);
        assert_eq!(mrcache_release(x, l), MRCACHE_INVALID_LEASE, "stale handle of a reused slot");
        for junk in [0u64, 1, u64::MAX, l.opaque ^ (1 << 40), l.opaque | 0xfffff] {
            assert_eq!(mrcache_release(x, mrcache_lease_t { opaque: junk }), MRCACHE_INVALID_LEASE, "{junk:#x}");
        }
        assert_eq!(stats(x).leases_held, 1, "the live lease is untouched");
        assert_eq!(mrcache_release(x, m), MRCACHE_OK);
        assert_eq!(mrcache_destroy(x), MRCACHE_OK);
        assert_eq!(mrcache_destroy(y), MRCACHE_OK);
    }
}

#[test]
fn registrar_errno_and_message_are_reported() {
    let c = Counting::default();
    let cache = create(&c, MRCACHE_MONITOR_NONE);
    c.fail_with.store(libc::EFAULT, Ordering::SeqCst);
    let mut l = mrcache_lease_t::default();
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    unsafe {
        assert_eq!(mrcache_acquire(cache, buf(), LEN, 0, &mut l), MRCACHE_REGISTRAR);
        let (msg, errno) = last_error();
        assert_eq!(errno, libc::EFAULT);
        assert!(msg.contains("E5"), "{msg}");
        c.fail_with.store(-libc::ENOMEM, Ordering::SeqCst);
        assert_eq!(mrcache_acquire(cache, buf(), LEN, 0, &mut l), MRCACHE_REGISTRAR);
        assert_eq!(last_error().1, libc::ENOMEM, "a negative errno counts as its absolute value");
        assert_eq!(mrcache_destroy(cache), MRCACHE_OK);
    }
}

fn reenter(c: &Counting) {
    let cache = c.cache.load(Ordering::SeqCst) as *mut mrcache_t;
    let mut l = mrcache_lease_t::default();
    // Allowed: invalidate only queues (H1); stats reads counters.
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    let inv = unsafe { mrcache_invalidate(cache, (3usize << 32) as *const c_void, 4096) };
    assert_eq!(inv, MRCACHE_OK);
    assert_eq!(stats(cache).leases_held, 0);
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    let st = unsafe { mrcache_acquire(cache, (2usize << 32) as *const c_void, 4096, 0, &mut l) };
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    let others = unsafe {
        [mrcache_flush(cache), mrcache_trim(cache), mrcache_destroy(cache), mrcache_release(cache, l), mrcache_monitor_start(cache)]
    };
    assert!(others.iter().all(|s| *s == MRCACHE_BUSY), "{others:?}");
    c.reentry.store(st as i32, Ordering::SeqCst);
}

#[test]
fn a_callback_calling_into_its_own_cache_gets_busy() {
    let c = Counting::default();
    let cache = create(&c, MRCACHE_MONITOR_EXPLICIT);
    c.hook.store(reenter as fn(&Counting) as usize as u64, Ordering::SeqCst);
    let mut l = mrcache_lease_t::default();
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    unsafe {
        assert_eq!(mrcache_acquire(cache, buf(), LEN, 0, &mut l), MRCACHE_OK, "{}", last_error().0);
        assert_eq!(c.reentry.load(Ordering::SeqCst), MRCACHE_BUSY as i32);
        assert!(c.registered.load(Ordering::SeqCst) == 1, "the re-entrant acquire registered nothing");
        c.hook.store(0, Ordering::SeqCst);
        // Outside the callback, everything works again.
        assert_eq!(mrcache_release(cache, l), MRCACHE_OK);
        assert_eq!(mrcache_flush(cache), MRCACHE_OK);
        assert_eq!(mrcache_destroy(cache), MRCACHE_OK);
    }
}

/// The two caches of the nested re-entry tests: X's `reg` acquires on Y,
/// and Y's `reg` calls back into X.
static NESTED_X: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static NESTED_Y: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// What the calls into X from inside Y's callback returned: BUSY ones, others.
static NESTED_BUSY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static NESTED_OTHER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Serializes the nested re-entry tests (they share the statics above).
static NESTED_ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

thread_local! {
    /// This thread's number in a nested re-entry test.
    static NESTED_THREAD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Set while Y's hook runs: a call into X that wrongly gets through
    /// registers there, and its hook must not start the nesting again.
    static NESTED_IN_Y: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// This thread's own region for one of the `which` calls: distinct per
/// thread, so each thread's acquires miss and run the callbacks.
fn nested_addr(which: u64) -> *const c_void {
    ((which << 40) | (NESTED_THREAD.with(|t| t.get()) << 20)) as *const c_void
}

/// X's `reg` hook: an acquire on another cache is allowed; it misses there,
/// so Y's `reg` runs inside this callback.
fn x_acquires_on_y(_: &Counting) {
    if NESTED_IN_Y.with(|f| f.get()) {
        return;
    }
    let y = NESTED_Y.load(Ordering::SeqCst) as *mut mrcache_t;
    let mut l = mrcache_lease_t::default();
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    unsafe {
        assert_eq!(mrcache_acquire(y, nested_addr(2), 4096, 0, &mut l), MRCACHE_OK, "{}", last_error().0);
        assert_eq!(mrcache_release(y, l), MRCACHE_OK);
    }
}

/// Y's `reg` hook, nested in X's: this thread is still inside X's callback,
/// so every call into X that the header forbids there is BUSY (`destroy`
/// too, but a wrong answer there would free X under the test: the flat
/// re-entry test checks it).
fn y_calls_into_x(_: &Counting) {
    NESTED_IN_Y.with(|f| f.set(true));
    let x = NESTED_X.load(Ordering::SeqCst) as *mut mrcache_t;
    let mut l = mrcache_lease_t::default();
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    let got = unsafe { [mrcache_acquire(x, nested_addr(3), 4096, 0, &mut l), mrcache_release(x, l), mrcache_flush(x), mrcache_trim(x)] };
    NESTED_IN_Y.with(|f| f.set(false));
    for st in got {
        let counter = if st == MRCACHE_BUSY { &NESTED_BUSY } else { &NESTED_OTHER };
        counter.fetch_add(1, Ordering::SeqCst);
    }
}

/// X's callback acquires on Y, whose callback calls X: BUSY, on `threads`
/// threads at once. With more threads than a cache has per-thread buckets
/// (32), some threads have none and take the thread-local marks: both ways
/// of marking a thread inside a callback are checked.
fn nested_reentry_is_busy(threads: usize) {
    let _one = NESTED_ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let (cx, cy) = (Counting::default(), Counting::default());
    let (x, y) = (create(&cx, MRCACHE_MONITOR_NONE), create(&cy, MRCACHE_MONITOR_NONE));
    NESTED_X.store(x as u64, Ordering::SeqCst);
    NESTED_Y.store(y as u64, Ordering::SeqCst);
    NESTED_BUSY.store(0, Ordering::SeqCst);
    NESTED_OTHER.store(0, Ordering::SeqCst);
    cx.hook.store(x_acquires_on_y as fn(&Counting) as usize as u64, Ordering::SeqCst);
    cy.hook.store(y_calls_into_x as fn(&Counting) as usize as u64, Ordering::SeqCst);
    let all_alive = std::sync::Barrier::new(threads);
    std::thread::scope(|s| {
        for i in 0..threads {
            let all_alive = &all_alive;
            s.spawn(move || {
                NESTED_THREAD.with(|t| t.set(i as u64 + 1));
                let x = NESTED_X.load(Ordering::SeqCst) as *mut mrcache_t;
                // Every thread alive at once, so no two share a token (and
                // no more than 32 of them get a bucket of either cache).
                all_alive.wait();
                let mut l = mrcache_lease_t::default();
                // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
                unsafe {
                    assert_eq!(mrcache_acquire(x, nested_addr(1), 4096, 0, &mut l), MRCACHE_OK, "{}", last_error().0);
                    assert_eq!(mrcache_release(x, l), MRCACHE_OK, "outside every callback again");
                }
                all_alive.wait();
            });
        }
    });
    let calls = NESTED_BUSY.load(Ordering::SeqCst) + NESTED_OTHER.load(Ordering::SeqCst);
    assert_eq!(calls, 4 * threads as u64, "Y's callback ran once in each thread's X callback");
    assert_eq!(NESTED_OTHER.load(Ordering::SeqCst), 0, "a call into X from inside Y's callback inside X's was not BUSY");
    cx.hook.store(0, Ordering::SeqCst);
    cy.hook.store(0, Ordering::SeqCst);
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    unsafe {
        assert_eq!(mrcache_destroy(x), MRCACHE_OK);
        assert_eq!(mrcache_destroy(y), MRCACHE_OK);
    }
}

#[test]
fn a_call_into_a_cache_from_a_nested_callback_of_another_is_busy() {
    nested_reentry_is_busy(1);
}

#[test]
fn nested_reentry_is_busy_on_threads_with_and_without_a_bucket() {
    nested_reentry_is_busy(80);
}

/// The fork-inheritance test's state: the parent's thread inside a
/// callback (its pthread_self), and whether it may leave it.
static INSIDE_THREAD: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static INSIDE_MAY_LEAVE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static INSIDE_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// The hook of the thread that stays inside its `reg` callback (in the
/// parent only) until the test lets it go.
fn stay_inside(_: &Counting) {
    if std::process::id() != INSIDE_PID.load(Ordering::SeqCst) {
        return;
    }
    // SAFETY: pthread_self has no preconditions.
    INSIDE_THREAD.store(unsafe { libc::pthread_self() } as usize, Ordering::SeqCst);
    // Bounded by the test, which lets it go after its child exits.
    while !INSIDE_MAY_LEAVE.load(Ordering::SeqCst) {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// A thread is inside a `reg` callback of the cache when another thread
/// forks. In the child that thread is gone, and a new thread there may get
/// its thread pointer (glibc reuses the vanished thread's stack): the new
/// thread must not be judged inside the vanished thread's callback.
#[test]
fn a_fork_child_thread_that_reuses_a_vanished_threads_token_is_not_inside_its_callback() {
    let c = Counting::default();
    let cache = create(&c, MRCACHE_MONITOR_NONE);
    INSIDE_PID.store(std::process::id(), Ordering::SeqCst);
    INSIDE_THREAD.store(0, Ordering::SeqCst);
    INSIDE_MAY_LEAVE.store(false, Ordering::SeqCst);
    c.hook.store(stay_inside as fn(&Counting) as usize as u64, Ordering::SeqCst);
    let addr = cache as usize;
    let inside = std::thread::spawn(move || {
        let mut l = mrcache_lease_t::default();
        // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
        unsafe {
            let cache = addr as *mut mrcache_t;
            assert_eq!(mrcache_acquire(cache, (5usize << 32) as *const c_void, 4096, 0, &mut l), MRCACHE_OK);
            assert_eq!(mrcache_release(cache, l), MRCACHE_OK);
        }
    });
    // Bounded: the thread reaches its callback at once.
    while INSIDE_THREAD.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // SAFETY: the child only calls the C API, makes a thread and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = std::panic::catch_unwind(|| {
            let t = std::thread::spawn(move || {
                let mut l = mrcache_lease_t::default();
                // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
                let st = unsafe { mrcache_acquire(addr as *mut mrcache_t, (6usize << 32) as *const c_void, 4096, 0, &mut l) };
                // SAFETY: as above.
                let reused = unsafe { libc::pthread_self() } as usize == INSIDE_THREAD.load(Ordering::SeqCst);
                (st, reused)
            });
            match t.join() {
                Ok((MRCACHE_OK, true)) => 0,
                Ok((MRCACHE_OK, false)) => 3, // passed, but the token was not reused: nothing tested
                Ok(_) => 1,
                Err(_) => 2,
            }
        })
        .unwrap_or(99);
        // SAFETY: leaves the child without running the harness's exit path.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    INSIDE_MAY_LEAVE.store(true, Ordering::SeqCst);
    inside.join().expect("the thread inside its callback");
    c.hook.store(0, Ordering::SeqCst);
    assert!(libc::WIFEXITED(status), "child status {status:#x}");
    match libc::WEXITSTATUS(status) {
        0 => {}
        3 => eprintln!("note: the child's thread did not reuse the vanished thread's pointer; nothing inherited to check"),
        code => panic!("child failed: {code} (1: the new thread was judged inside the vanished thread's callback)"),
    }
    // SAFETY: no lease is held.
    assert_eq!(unsafe { mrcache_destroy(cache) }, MRCACHE_OK);
}

static UNMAP_TARGET: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn unmap_other(_: &Counting) {
    let p = UNMAP_TARGET.swap(0, Ordering::SeqCst);
    if p != 0 {
        // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
        assert_eq!(unsafe { libc::munmap(p as *mut c_void, LEN) }, 0);
    }
}

#[test]
fn a_callback_that_unmaps_watched_memory_works_under_the_uffd_monitor() {
    let c = Counting::default();
    let cfg = config(MRCACHE_MONITOR_UFFD);
    let r = registrar(&c);
    let mut cache = null_mut();
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    let st = unsafe { mrcache_create(&cfg, &r, &mut cache) };
    if st == MRCACHE_UNSUPPORTED {
        eprintln!("skipped: userfaultfd unavailable: {}", last_error().0);
        return;
    }
    assert_eq!(st, MRCACHE_OK);
    c.cache.store(cache as u64, Ordering::SeqCst);
    let (a, b) = (map(LEN), map(LEN));
    let mut l = mrcache_lease_t::default();
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    unsafe {
        assert_eq!(mrcache_acquire(cache, b, LEN, 0, &mut l), MRCACHE_OK);
        assert_eq!(mrcache_release(cache, l), MRCACHE_OK);
        // While registering `a`, the callback unmaps `b` (cached, watched):
        // the munmap waits for the monitor thread, which needs the cache lock
        // the acquire does not hold while calling the registrar.
        UNMAP_TARGET.store(b as usize, Ordering::SeqCst);
        c.hook.store(unmap_other as fn(&Counting) as usize as u64, Ordering::SeqCst);
        assert_eq!(mrcache_acquire(cache, a, LEN, 0, &mut l), MRCACHE_OK, "{}", last_error().0);
        assert_eq!(UNMAP_TARGET.load(Ordering::SeqCst), 0, "the callback ran its munmap");
        c.hook.store(0, Ordering::SeqCst);
        assert_eq!(mrcache_release(cache, l), MRCACHE_OK);
        let s = stats(cache);
        assert_eq!(s.invalidations, 1, "{s:?}");
        assert_eq!(mrcache_destroy(cache), MRCACHE_OK);
        libc::munmap(a, LEN);
    }
    assert_eq!(c.registered.load(Ordering::SeqCst), c.deregistered.load(Ordering::SeqCst));
}

/// SysV shared memory (shmat) cannot be watched by userfaultfd: an acquire
/// of it under the uffd monitor is MRCACHE_UNWATCHABLE, names it, and
/// changes nothing; memfd memory is watched and cached.
#[test]
fn sysv_shared_memory_is_unwatchable_under_the_uffd_monitor() {
    let c = Counting::default();
    let cfg = config(MRCACHE_MONITOR_UFFD);
    let r = registrar(&c);
    let mut cache = null_mut();
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    let st = unsafe { mrcache_create(&cfg, &r, &mut cache) };
    if st == MRCACHE_UNSUPPORTED {
        eprintln!("skipped: userfaultfd unavailable: {}", last_error().0);
        return;
    }
    assert_eq!(st, MRCACHE_OK);
    let mut l = mrcache_lease_t::default();
    // SAFETY: a private SysV segment of our own, marked for removal at its
    // last detach; the C API called as C calls it.
    unsafe {
        let id = libc::shmget(libc::IPC_PRIVATE, LEN, libc::IPC_CREAT | 0o600);
        if id >= 0 {
            let a = libc::shmat(id, null(), 0);
            libc::shmctl(id, libc::IPC_RMID, null_mut());
            assert_ne!(a as isize, -1, "shmat: {}", std::io::Error::last_os_error());
            assert_eq!(mrcache_acquire(cache, a, LEN, 0, &mut l), MRCACHE_UNWATCHABLE);
            let (message, errno) = last_error();
            eprintln!("shmat memory: {message}");
            assert!(message.contains("SysV") && message.contains("shmat"), "{message}");
            assert_eq!(errno, 0);
            assert_eq!(l, mrcache_lease_t::default(), "no lease");
            let s = stats(cache);
            assert_eq!((s.leases_held, s.registrations), (0, 0), "nothing changed: {s:?}");
            assert_eq!(libc::shmdt(a), 0);
        } else {
            eprintln!("shmget: {}: the SysV half skipped", std::io::Error::last_os_error());
        }
        let fd = libc::memfd_create(c"mrcache-capi-test".as_ptr(), libc::MFD_CLOEXEC);
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, LEN as libc::off_t), 0);
        let a = libc::mmap(null_mut(), LEN, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0);
        libc::close(fd);
        assert_ne!(a, libc::MAP_FAILED);
        for _ in 0..2 {
            assert_eq!(mrcache_acquire(cache, a, LEN, 0, &mut l), MRCACHE_OK, "{}", last_error().0);
            assert_eq!(mrcache_release(cache, l), MRCACHE_OK);
        }
        assert_eq!(stats(cache).hits, 1, "memfd memory is watched, so cached");
        assert_eq!(mrcache_destroy(cache), MRCACHE_OK);
        libc::munmap(a, LEN);
    }
    assert_eq!(c.registered.load(Ordering::SeqCst), c.deregistered.load(Ordering::SeqCst));
}

#[test]
fn leases_released_on_other_threads() {
    let c = Counting::default();
    let cache = create(&c, MRCACHE_MONITOR_NONE) as usize;
    let leases: Vec<u64> = (0..64)
        .map(|i| {
            let mut l = mrcache_lease_t::default();
            // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
            let st = unsafe { mrcache_acquire(cache as *mut _, buf().add(i * 8192), 4096, 0, &mut l) };
            assert_eq!(st, MRCACHE_OK);
            l.opaque
        })
        .collect();
    std::thread::scope(|s| {
        for chunk in leases.chunks(16) {
            s.spawn(move || {
                for &l in chunk {
                    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
                    let st = unsafe { mrcache_release(cache as *mut _, mrcache_lease_t { opaque: l }) };
                    assert_eq!(st, MRCACHE_OK);
                }
            });
        }
    });
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    unsafe {
        assert_eq!(stats(cache as *mut _).leases_held, 0);
        assert_eq!(mrcache_destroy(cache as *mut _), MRCACHE_OK);
    }
}

#[test]
fn status_names() {
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    let name = |s: i32| unsafe { std::ffi::CStr::from_ptr(mrcache_status_name(s)) }.to_str().unwrap().to_owned();
    assert_eq!(name(MRCACHE_BUSY as i32), "MRCACHE_BUSY");
    assert_eq!(name(MRCACHE_UNWATCHABLE as i32), "MRCACHE_UNWATCHABLE");
    assert_eq!(MRCACHE_UNWATCHABLE as i32, 23);
    assert_eq!(name(12345), "(not an mrcache status)");
}

/// After fork the child's cache caches nothing through the parent's monitor
/// (spec.md#S2.6) until the child starts its own with mrcache_monitor_start.
#[test]
fn a_fork_child_starts_its_own_monitor() {
    let c = Counting::default();
    let cfg = config(MRCACHE_MONITOR_UFFD);
    let r = registrar(&c);
    let mut cache = null_mut();
    // SAFETY: valid pointers.
    let st = unsafe { mrcache_create(&cfg, &r, &mut cache) };
    if st == MRCACHE_UNSUPPORTED {
        eprintln!("skipped: userfaultfd unavailable: {}", last_error().0);
        return;
    }
    assert_eq!(st, MRCACHE_OK);
    let a = map(LEN);
    let hit = |cache: *mut mrcache_t| -> bool {
        let before = stats(cache).hits;
        let mut l = mrcache_lease_t::default();
        // SAFETY: a live cache, mapped memory.
        unsafe {
            assert_eq!(mrcache_acquire(cache, a, LEN, 0, &mut l), MRCACHE_OK);
            assert_eq!(mrcache_release(cache, l), MRCACHE_OK);
        }
        stats(cache).hits > before
    };
    hit(cache);
    assert!(hit(cache));
    // SAFETY: a live cache that has its monitor.
    assert_eq!(unsafe { mrcache_monitor_start(cache) }, MRCACHE_BUSY, "one monitor per cache");
    // SAFETY: the child only calls the C API and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut code = 0;
            if hit(cache) || hit(cache) {
                code |= 1; // cached through the parent's monitor
            }
            // SAFETY: the child's copy of the cache.
            if unsafe { mrcache_monitor_start(cache) } != MRCACHE_OK {
                code |= 2;
            }
            hit(cache);
            if !hit(cache) {
                code |= 4; // its own monitor: caching again
            }
            code
        }))
        .unwrap_or(99);
        // SAFETY: leaves the child without running the harness's exit path.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child status {status:#x}");
    assert_eq!(libc::WEXITSTATUS(status), 0, "child failed (bits: 1 cached early, 2 no monitor, 4 no hit)");
    assert!(hit(cache), "the parent still hits");
    // SAFETY: no lease is held.
    unsafe {
        assert_eq!(mrcache_destroy(cache), MRCACHE_OK);
        libc::munmap(a, LEN);
    }
}

/// Two threads releasing the same lease at once: exactly one succeeds, the
/// other gets MRCACHE_INVALID_LEASE (the slot's generation changes by one
/// compare-exchange), and the registration is released once.
#[test]
fn a_concurrent_double_release_releases_once() {
    let c = Counting::default();
    let cache = create(&c, MRCACHE_MONITOR_NONE) as usize;
    for _ in 0..500 {
        let mut l = mrcache_lease_t::default();
        // SAFETY: a live cache, a writable lease.
        assert_eq!(unsafe { mrcache_acquire(cache as *mut _, buf(), LEN, 0, &mut l) }, MRCACHE_OK);
        let barrier = std::sync::Barrier::new(2);
        let results: Vec<mrcache_status_t> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        // SAFETY: a live cache.
                        unsafe { mrcache_release(cache as *mut _, l) }
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let ok = results.iter().filter(|s| **s == MRCACHE_OK).count();
        assert_eq!(ok, 1, "{results:?}");
        assert!(results.contains(&MRCACHE_INVALID_LEASE));
    }
    let s = stats(cache as *mut _);
    assert_eq!((s.leases_held, s.releases, s.errors), (0, 1000, 500), "500 releases and 500 E4s");
    // SAFETY: no lease is held.
    assert_eq!(unsafe { mrcache_destroy(cache as *mut _) }, MRCACHE_OK);
    assert_eq!(c.deregistered.load(Ordering::SeqCst), 1);
}

/// The hook pair (spec.md#S1.8, S2.9): between begin and end the range's
/// cached registration is gone and a miss is served uncached; after the end
/// it caches again; an end without its begin is E7; bad ranges open nothing.
#[test]
fn release_begin_and_end_from_c() {
    let c = Counting::default();
    let cache = create(&c, MRCACHE_MONITOR_EXPLICIT);
    let mut l = mrcache_lease_t::default();
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    unsafe {
        assert_eq!(mrcache_acquire(cache, buf(), LEN, MRCACHE_ACCESS_LOCAL_WRITE, &mut l), MRCACHE_OK);
        assert_eq!(mrcache_release(cache, l), MRCACHE_OK);
        assert_eq!(stats(cache).cached_entries, 1);
        assert_eq!(mrcache_release_begin(cache, buf(), LEN), MRCACHE_OK);
        assert_eq!(stats(cache).cached_entries, 0, "begin takes the overlapping entry out");
        assert_eq!(c.deregistered.load(Ordering::SeqCst), 1);
        // In the window: served, never cached.
        assert_eq!(mrcache_acquire(cache, buf(), 4096, MRCACHE_ACCESS_LOCAL_WRITE, &mut l), MRCACHE_OK);
        assert_eq!(mrcache_release(cache, l), MRCACHE_OK);
        let s = stats(cache);
        assert_eq!((s.cached_entries, s.uncached), (0, 1));
        assert_eq!(c.deregistered.load(Ordering::SeqCst), 2, "deregistered at its release");
        assert_eq!(mrcache_release_end(cache, buf(), 4096), MRCACHE_UNMATCHED_RELEASE_END, "not the window's range");
        assert_eq!(mrcache_release_end(cache, buf(), LEN), MRCACHE_OK);
        assert_eq!(mrcache_release_end(cache, buf(), LEN), MRCACHE_UNMATCHED_RELEASE_END, "closed already");
        // After the end: cached again.
        assert_eq!(mrcache_acquire(cache, buf(), 4096, MRCACHE_ACCESS_LOCAL_WRITE, &mut l), MRCACHE_OK);
        assert_eq!(mrcache_release(cache, l), MRCACHE_OK);
        assert_eq!(stats(cache).cached_entries, 1);
        // Bad arguments.
        assert_eq!(mrcache_release_begin(null_mut(), buf(), LEN), MRCACHE_NULL_ARGUMENT);
        assert_eq!(mrcache_release_end(null_mut(), buf(), LEN), MRCACHE_NULL_ARGUMENT);
        assert_eq!(mrcache_release_begin(cache, buf(), 0), MRCACHE_EMPTY_RANGE);
        assert_eq!(mrcache_release_begin(cache, usize::MAX as *const c_void, 2), MRCACHE_WRAPPING_RANGE);
        assert_eq!(mrcache_release_end(cache, buf(), 0), MRCACHE_EMPTY_RANGE);
        assert_eq!(
            CStr::from_ptr(mrcache_status_name(MRCACHE_UNMATCHED_RELEASE_END as i32)).to_str().unwrap(),
            "MRCACHE_UNMATCHED_RELEASE_END"
        );
        assert_eq!(mrcache_destroy(cache), MRCACHE_OK);
    }
}

/// Threads keep free lease slots in buckets keyed by their thread pointer:
/// more threads than buckets at once (the rest use the shared free list),
/// and thread after thread (a new thread may inherit an exited one's
/// bucket, never a running one's). Every lease is released exactly once,
/// each handle is fresh, and slots are reused rather than leaked.
#[test]
fn many_threads_and_thread_generations_share_lease_slots() {
    let c = Counting::default();
    let cache = create(&c, MRCACHE_MONITOR_NONE) as usize;
    let round = |threads: usize| {
        std::thread::scope(|s| {
            for t in 0..threads {
                s.spawn(move || {
                    let mut held = Vec::new();
                    for i in 0..200usize {
                        let mut l = mrcache_lease_t::default();
                        // SAFETY: a live cache, a writable lease.
                        let st = unsafe { mrcache_acquire(cache as *mut _, buf().add((t % 4) * 8192), 4096, 0, &mut l) };
                        assert_eq!(st, MRCACHE_OK);
                        assert!(!held.contains(&l.opaque), "a handle given out twice while held");
                        held.push(l.opaque);
                        if i % 3 == 2 {
                            for l in held.drain(..) {
                                // SAFETY: a live cache.
                                let st = unsafe { mrcache_release(cache as *mut _, mrcache_lease_t { opaque: l }) };
                                assert_eq!(st, MRCACHE_OK);
                                // SAFETY: a live cache; `l` was just released.
                                let again = unsafe { mrcache_release(cache as *mut _, mrcache_lease_t { opaque: l }) };
                                assert_eq!(again, MRCACHE_INVALID_LEASE);
                            }
                        }
                    }
                    for l in held {
                        // SAFETY: a live cache.
                        assert_eq!(unsafe { mrcache_release(cache as *mut _, mrcache_lease_t { opaque: l }) }, MRCACHE_OK);
                    }
                });
            }
        })
    };
    round(48);
    for _ in 0..20 {
        round(2);
    }
    let s = stats(cache as *mut _);
    let acquires = (48 + 20 * 2) * 200;
    assert_eq!((s.leases_held, s.acquires), (0, acquires), "{s:?}");
    assert_eq!(s.releases, 2 * acquires - (48 + 40) * 2, "each lease released once, each second release an E4 ({s:?})");
    // SAFETY: no lease is held.
    assert_eq!(unsafe { mrcache_destroy(cache as *mut _) }, MRCACHE_OK);
    assert_eq!(c.registered.load(Ordering::SeqCst), c.deregistered.load(Ordering::SeqCst));
}
