//! A counting registrar written as C callbacks, and helpers.
#![allow(dead_code)]

use mrcache_capi::*;
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

/// The callbacks' context.
#[derive(Default)]
pub struct Counting {
    pub registered: AtomicU64,
    pub deregistered: AtomicU64,
    /// Non-zero: `reg` returns it (an errno) instead of registering.
    pub fail_with: AtomicI32,
    /// Set by a callback to what its re-entrant call returned.
    pub reentry: AtomicI32,
    /// Non-zero: `reg` calls `hook` with this context.
    pub hook: AtomicU64,
    pub cache: AtomicU64,
}

pub unsafe extern "C" fn reg(
    ctx: *mut c_void,
    addr: *mut c_void,
    _len: usize,
    _access: u32,
    handle: *mut *mut c_void,
    lkey: *mut u32,
    rkey: *mut u32,
) -> c_int {
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    let c = unsafe { &*(ctx as *const Counting) };
    let e = c.fail_with.load(Ordering::SeqCst);
    if e != 0 {
        return e;
    }
    let hook = c.hook.load(Ordering::SeqCst);
    if hook != 0 {
        // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
        let f: fn(&Counting) = unsafe { std::mem::transmute(hook as usize) };
        f(c);
    }
    let n = c.registered.fetch_add(1, Ordering::SeqCst) + 1;
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    unsafe {
        *handle = addr;
        *lkey = n as u32;
        *rkey = 1000 + n as u32;
    }
    0
}

pub unsafe extern "C" fn dereg(ctx: *mut c_void, _handle: *mut c_void) -> c_int {
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    let c = unsafe { &*(ctx as *const Counting) };
    c.deregistered.fetch_add(1, Ordering::SeqCst);
    0
}

pub fn registrar(c: &Counting) -> mrcache_registrar_t {
    mrcache_registrar_t { ctx: c as *const Counting as *mut c_void, reg: Some(reg), dereg: Some(dereg) }
}

pub fn config(monitor: mrcache_monitor_t) -> mrcache_config_t {
    let mut cfg = std::mem::MaybeUninit::<mrcache_config_t>::uninit();
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    assert_eq!(unsafe { mrcache_config_init(cfg.as_mut_ptr()) }, mrcache_status_t::MRCACHE_OK);
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    let mut cfg = unsafe { cfg.assume_init() };
    cfg.monitor = monitor as u32;
    cfg
}

pub fn create(c: &Counting, monitor: mrcache_monitor_t) -> *mut mrcache_t {
    let (cfg, r) = (config(monitor), registrar(c));
    let mut cache = std::ptr::null_mut();
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    let st = unsafe { mrcache_create(&cfg, &r, &mut cache) };
    assert_eq!(st, mrcache_status_t::MRCACHE_OK, "{}", last_error().0);
    c.cache.store(cache as u64, Ordering::SeqCst);
    cache
}

pub fn last_error() -> (String, i32) {
    let mut errno = 0;
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    let p = unsafe { mrcache_last_error(&mut errno) };
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    (unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned(), errno)
}

pub fn stats(cache: *const mrcache_t) -> mrcache_stats_t {
    let mut s = mrcache_stats_t { size: std::mem::size_of::<mrcache_stats_t>() as u32, ..Default::default() };
    // SAFETY: the C API called as C calls it: the pointers are valid or NULL on purpose, handles live.
    assert_eq!(unsafe { mrcache_stats(cache, &mut s) }, mrcache_status_t::MRCACHE_OK);
    s
}

/// Fresh anonymous memory at an address nothing in this process mapped
/// before (a per-process counter far below where the kernel places
/// mappings, `MAP_FIXED_NOREPLACE`). An address another test just unmapped
/// would do for the kernel, but that test's `UNMAP` event may still be
/// unread when this test watches the address again: the uffd monitor then
/// applies it here too, and the test's registration is invalidated (safe,
/// and what the cache must do with an event it cannot date, but a test
/// that counts hits or invalidations would fail when tests run at once).
pub fn map(len: usize) -> *mut c_void {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0x5a00_0000_0000);
    let step = len.next_multiple_of(1 << 21) + (1 << 21);
    // Bounded: a taken range (EEXIST) moves on to the next one.
    for _ in 0..64 {
        let hint = NEXT.fetch_add(step, Ordering::Relaxed);
        // SAFETY: a private anonymous mapping at an address no Rust object
        // uses (NOREPLACE fails rather than replace anything there).
        let p = unsafe {
            libc::mmap(
                hint as *mut c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            assert_eq!(p as usize, hint, "MAP_FIXED_NOREPLACE placed the mapping elsewhere");
            return p;
        }
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EEXIST), "mmap at {hint:#x}");
    }
    panic!("no free range for a test mapping of {len} bytes");
}
