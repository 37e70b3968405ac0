//! Unit tests of the C API's internals: lease slots are reused; the panic
//! tests (in an acquire's registration, and in a release's deregistration).
//!
//! The panic test. A panic can only start in Rust code, and the production
//! library has no panicking path a C caller can reach on purpose, so the
//! unit-test build (only) can make the registrar adapter panic on request, in
//! the middle of an acquire (after the cache planned the registration, before
//! the callback). The entry point must return MRCACHE_INTERNAL with the
//! message, and the cache must stay usable and consistent.

use crate::*;
use std::cell::Cell;
use std::ffi::CStr;

thread_local! {
    static PANIC_IN_REG: Cell<bool> = const { Cell::new(false) };
    static PANIC_IN_DEREG: Cell<bool> = const { Cell::new(false) };
}

/// Called by `CRegistrar::register` in test builds.
pub(crate) fn maybe_panic() {
    if PANIC_IN_REG.with(|p| p.replace(false)) {
        panic!("injected registrar panic");
    }
}

/// Called by `CRegistrar::deregister` in test builds.
pub(crate) fn maybe_panic_in_dereg() {
    if PANIC_IN_DEREG.with(|p| p.replace(false)) {
        panic!("injected deregistration panic");
    }
}

/// The callbacks' context: (registered, deregistered).
type Counts = (AtomicU64, AtomicU64);

unsafe extern "C" fn reg(
    ctx: *mut c_void,
    addr: *mut c_void,
    _: usize,
    _: u32,
    handle: *mut *mut c_void,
    lkey: *mut u32,
    rkey: *mut u32,
) -> c_int {
    // SAFETY: `ctx` is the test's `Counts`, alive until its cache is destroyed.
    unsafe { &*(ctx as *const Counts) }.0.fetch_add(1, Ordering::SeqCst);
    // SAFETY: the adapter's out-pointers.
    unsafe {
        *handle = addr;
        *lkey = 7;
        *rkey = 8;
    }
    0
}

unsafe extern "C" fn dereg(ctx: *mut c_void, _: *mut c_void) -> c_int {
    // SAFETY: as in `reg`.
    unsafe { &*(ctx as *const Counts) }.1.fetch_add(1, Ordering::SeqCst);
    0
}

/// A cache over the counting callbacks above, with `monitor`.
fn create(counts: &Counts, monitor: mrcache_monitor_t) -> *mut mrcache_t {
    let r = mrcache_registrar_t { ctx: counts as *const Counts as *mut c_void, reg: Some(reg), dereg: Some(dereg) };
    let mut cfg = std::mem::MaybeUninit::uninit();
    let mut cache = std::ptr::null_mut();
    // SAFETY: valid pointers, as a C caller passes them; `counts` outlives
    // the cache (each test destroys it first).
    unsafe {
        assert_eq!(mrcache_config_init(cfg.as_mut_ptr()), MRCACHE_OK);
        (*cfg.as_mut_ptr()).monitor = monitor as u32;
        assert_eq!(mrcache_create(cfg.as_ptr(), &r, &mut cache), MRCACHE_OK);
    }
    cache
}

/// This thread's last error message and errno.
fn last_error() -> (String, c_int) {
    let mut errno = -1;
    // SAFETY: a valid out-pointer; the message lives until this thread's next call.
    let msg = unsafe { CStr::from_ptr(mrcache_last_error(&mut errno)) };
    (msg.to_string_lossy().into_owned(), errno)
}

fn stats(cache: *const mrcache_t) -> mrcache_stats_t {
    let mut s = mrcache_stats_t { size: std::mem::size_of::<mrcache_stats_t>() as u32, ..Default::default() };
    // SAFETY: a live cache, a valid out-pointer.
    assert_eq!(unsafe { mrcache_stats(cache, &mut s) }, MRCACHE_OK);
    s
}

#[test]
fn a_panic_inside_an_entry_point_is_mrcache_internal_and_the_cache_stays_usable() {
    let counts: Counts = Default::default();
    let addr = (1usize << 32) as *const c_void;
    let mut lease = mrcache_lease_t::default();
    // SAFETY: valid pointers throughout, as a C caller passes them.
    unsafe {
        let cache = create(&counts, mrcache_monitor_t::MRCACHE_MONITOR_NONE);
        PANIC_IN_REG.with(|p| p.set(true));
        assert_eq!(mrcache_acquire(cache, addr, 65536, 0, &mut lease), MRCACHE_INTERNAL);
        let (msg, errno) = last_error();
        assert!(msg.contains("injected registrar panic"), "{msg}");
        assert_eq!(errno, 0);
        assert_eq!(lease, mrcache_lease_t::default(), "no lease handed out");
        // Usable: the same acquire now registers, hits, releases; destroy
        // deregisters everything registered.
        assert_eq!(mrcache_acquire(cache, addr, 65536, 0, &mut lease), MRCACHE_OK);
        assert_eq!(mrcache_release(cache, lease), MRCACHE_OK);
        assert_eq!(mrcache_acquire(cache, addr, 65536, 0, &mut lease), MRCACHE_OK);
        let mut view = std::mem::MaybeUninit::uninit();
        assert_eq!(mrcache_lease_view(cache, lease, view.as_mut_ptr()), MRCACHE_OK);
        assert_eq!(mrcache_release(cache, lease), MRCACHE_OK);
        let s = stats(cache);
        assert_eq!((s.hits, s.leases_held, s.cached_entries), (1, 0, 1), "{s:?}");
        assert_eq!(mrcache_destroy(cache), MRCACHE_OK);
    }
    assert_eq!(counts.0.load(Ordering::SeqCst), 1);
    assert_eq!(counts.1.load(Ordering::SeqCst), 1);
}

#[test]
fn a_thread_reuses_its_lease_slots() {
    let counts: Counts = Default::default();
    let addr = (1usize << 33) as *const c_void;
    let mut lease = mrcache_lease_t::default();
    // SAFETY: valid pointers throughout, as a C caller passes them.
    unsafe {
        let cache = create(&counts, mrcache_monitor_t::MRCACHE_MONITOR_NONE);
        for _ in 0..1000 {
            assert_eq!(mrcache_acquire(cache, addr, 4096, 0, &mut lease), MRCACHE_OK);
            assert_eq!(mrcache_release(cache, lease), MRCACHE_OK);
        }
        assert_eq!((*cache).leases.slots_made(), 1, "one slot serves a thread's acquire/release loop");
        assert_eq!(mrcache_destroy(cache), MRCACHE_OK);
    }
}

/// A release whose lease's drop panics (its registration was invalidated
/// while leased, so the release deregisters, and the deregistration
/// panics): the entry point returns MRCACHE_INTERNAL, the handle is dead,
/// and its slot went back to the thread's list (the slab's drop guard):
/// later acquires reuse it instead of making new ones.
#[test]
fn a_panic_in_a_releases_deregistration_returns_the_lease_slot() {
    let counts: Counts = Default::default();
    let addr = (1usize << 34) as *const c_void;
    let mut lease = mrcache_lease_t::default();
    // SAFETY: valid pointers throughout, as a C caller passes them.
    unsafe {
        let cache = create(&counts, mrcache_monitor_t::MRCACHE_MONITOR_EXPLICIT);
        assert_eq!(mrcache_acquire(cache, addr, 4096, 0, &mut lease), MRCACHE_OK);
        let slots = (*cache).leases.slots_made();
        assert_eq!(mrcache_invalidate(cache, addr, 4096), MRCACHE_OK);
        PANIC_IN_DEREG.with(|p| p.set(true));
        assert_eq!(mrcache_release(cache, lease), MRCACHE_INTERNAL);
        let (msg, errno) = last_error();
        assert!(msg.contains("injected deregistration panic"), "{msg}");
        assert_eq!(errno, 0);
        assert!(!PANIC_IN_DEREG.with(Cell::get), "the release reached the deregistration");
        assert_eq!(mrcache_release(cache, lease), MRCACHE_INVALID_LEASE, "the handle died with its release");
        for _ in 0..100 {
            assert_eq!(mrcache_acquire(cache, addr, 4096, 0, &mut lease), MRCACHE_OK);
            assert_eq!(mrcache_release(cache, lease), MRCACHE_OK);
        }
        assert_eq!((*cache).leases.slots_made(), slots, "the panicking release's slot was reused");
        let s = stats(cache);
        assert_eq!(s.leases_held, 0, "{s:?}");
        assert_eq!(mrcache_destroy(cache), MRCACHE_OK);
    }
}
