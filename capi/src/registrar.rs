//! The caller's registrar: C callbacks behind [`Registrar`], the "inside a
//! callback of cache X" flag that turns re-entry into `MRCACHE_BUSY`, and
//! the built-in verbs registrar.
//!
//! Invariant: the cache never calls its registrar with its lock held
//! (spec.md#A4, L1), so a callback may free memory (a munmap is seen by the
//! uffd monitor, a hook's `mrcache_invalidate` only queues: H1/H2). A
//! callback may not acquire, release, flush, trim, start a monitor or destroy
//! on the same cache: those return `MRCACHE_BUSY` there.

use crate::status::{Failure, MRCACHE_BUSY};
use mrcache_impl::registrar::{Keys, Registrar, RegistrarError};
use mrcache_types::{Access, Range};
use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

type RegFn = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, u32, *mut *mut c_void, *mut u32, *mut u32) -> c_int;
type DeregFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int;

/// A registrar: two callbacks and their context.
///
/// Both may be called from any thread, concurrently, never with a cache lock
/// held. See "Callbacks" in the header for what they may call.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(non_camel_case_types)]
pub struct mrcache_registrar_t {
    /// Passed to both callbacks as is.
    pub ctx: *mut c_void,
    /// Required. `reg(ctx, addr, len, access, &handle, &lkey, &rkey)`: pin
    /// `[addr, addr+len)` (page-aligned) with `access` (`MRCACHE_ACCESS_*`
    /// bits); store a handle and the keys; return 0 or an errno (a negative
    /// errno counts as its absolute value). ENOMEM and EAGAIN make the cache
    /// evict its unleased registrations and retry once (spec.md#S5.4).
    pub reg: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            addr: *mut c_void,
            len: usize,
            access: u32,
            handle: *mut *mut c_void,
            lkey: *mut u32,
            rkey: *mut u32,
        ) -> c_int,
    >,
    /// Required. `dereg(ctx, handle)`: unpin a handle `reg` returned; 0 or an
    /// errno (the handle is gone either way: it is never passed again).
    pub dereg: Option<unsafe extern "C" fn(ctx: *mut c_void, handle: *mut c_void) -> c_int>,
}

thread_local! {
    /// The cache (its id) whose registrar callback this thread is inside, or 0.
    static IN_CALLBACK_OF: Cell<u64> = const { Cell::new(0) };
}

/// Marks this thread as inside a callback of cache `id` until dropped
/// (restoring any outer mark: a callback may use another cache), and counts
/// it in the cache's `active` callbacks.
struct InCallback<'a> {
    outer: u64,
    active: &'a AtomicU64,
}

impl<'a> InCallback<'a> {
    fn enter(id: u64, active: &'a AtomicU64) -> InCallback<'a> {
        active.fetch_add(1, Ordering::SeqCst);
        InCallback { outer: IN_CALLBACK_OF.with(|c| c.replace(id)), active }
    }
}

impl Drop for InCallback<'_> {
    fn drop(&mut self) {
        IN_CALLBACK_OF.with(|c| c.set(self.outer));
        self.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `Err(BUSY)` if this thread is inside a registrar callback of `registrar`'s
/// cache. The hit path pays one load: the thread-local flag is read only
/// while some thread runs a callback of this cache (a thread inside one has
/// counted itself in `active` before setting its flag).
#[inline(always)]
pub(crate) fn not_in_callback(registrar: &CRegistrar) -> Result<(), Failure> {
    if registrar.active.load(Ordering::SeqCst) != 0 && IN_CALLBACK_OF.with(|c| c.get()) == registrar.cache_id {
        return Err(Failure::new(
            MRCACHE_BUSY,
            "called from inside a registrar callback of the same cache (only mrcache_invalidate, mrcache_stats, mrcache_lease_keys, mrcache_lease_view and mrcache_last_error are allowed there)",
        ));
    }
    Ok(())
}

/// The C callbacks as the cache's [`Registrar`].
pub struct CRegistrar {
    ctx: *mut c_void,
    reg: RegFn,
    dereg: DeregFn,
    /// The owning cache's id, for the re-entry flag.
    pub(crate) cache_id: u64,
    /// Callbacks running now, on any thread.
    active: AtomicU64,
}

// SAFETY: the header requires both callbacks to be callable from any thread
// with `ctx`, concurrently; the cache shares nothing else of it.
unsafe impl Send for CRegistrar {}
// SAFETY: as for Send.
unsafe impl Sync for CRegistrar {}

impl CRegistrar {
    pub(crate) fn new(r: &mrcache_registrar_t, cache_id: u64) -> Option<CRegistrar> {
        Some(CRegistrar { ctx: r.ctx, reg: r.reg?, dereg: r.dereg?, cache_id, active: AtomicU64::new(0) })
    }
}

/// A handle `reg` returned, with its keys.
#[derive(Debug)]
pub struct CHandle {
    ptr: *mut c_void,
    keys: Keys,
}

// SAFETY: an opaque value the cache only passes back to `dereg`, which may
// run on any thread (header).
unsafe impl Send for CHandle {}
// SAFETY: never dereferenced by the library.
unsafe impl Sync for CHandle {}

/// A callback's return value as an errno (a negative one counts as its absolute value).
fn errno_of(rc: c_int) -> c_int {
    rc.checked_abs().unwrap_or(libc::EINVAL)
}

impl Registrar for CRegistrar {
    type Handle = CHandle;

    fn register(&self, range: Range, access: Access) -> Result<CHandle, RegistrarError> {
        let (mut ptr, mut lkey, mut rkey) = (std::ptr::null_mut(), 0u32, 0u32);
        #[cfg(test)]
        crate::tests::maybe_panic();
        let rc = {
            let _mark = InCallback::enter(self.cache_id, &self.active);
            // SAFETY: the callback's contract (header): it reads nothing but
            // its arguments and writes the three out-pointers, which point at
            // our locals.
            unsafe {
                (self.reg)(self.ctx, range.addr as *mut c_void, range.len as usize, u32::from(access.bits()), &mut ptr, &mut lkey, &mut rkey)
            }
        };
        if rc != 0 {
            let errno = errno_of(rc);
            return Err(RegistrarError::from_errno("reg", errno, format!("the reg callback returned {rc}")));
        }
        Ok(CHandle { ptr, keys: Keys { lkey, rkey } })
    }

    fn deregister(&self, handle: CHandle) -> Result<(), RegistrarError> {
        let rc = {
            let _mark = InCallback::enter(self.cache_id, &self.active);
            // SAFETY: `handle.ptr` is what `reg` returned, passed back once.
            unsafe { (self.dereg)(self.ctx, handle.ptr) }
        };
        if rc != 0 {
            return Err(RegistrarError::from_errno("dereg", errno_of(rc), format!("the dereg callback returned {rc}")));
        }
        Ok(())
    }

    fn keys(&self, handle: &CHandle) -> Keys {
        handle.keys
    }

    fn name(&self) -> &'static str {
        "c-callbacks"
    }
}

/// The built-in verbs registrar's callbacks: `ctx` is the caller's `struct ibv_pd *`.
#[cfg(feature = "verbs")]
pub(crate) mod verbs {
    use super::*;
    use rdma_sys::{ibv_dereg_mr, ibv_mr, ibv_pd, ibv_reg_mr};

    pub(crate) unsafe extern "C" fn reg(
        ctx: *mut c_void,
        addr: *mut c_void,
        len: usize,
        access: u32,
        handle: *mut *mut c_void,
        lkey: *mut u32,
        rkey: *mut u32,
    ) -> c_int {
        let Some(access) = Access::from_bits(access as u8) else { return libc::EINVAL };
        let flags = mrcache_impl::registrar::verbs::access_flags(access);
        // SAFETY: `ctx` is the protection domain the caller passed to
        // `mrcache_registrar_verbs` and keeps alive for the cache's life.
        let mr: *mut ibv_mr = unsafe { ibv_reg_mr(ctx as *mut ibv_pd, addr, len, flags.0 as c_int) };
        if mr.is_null() {
            return std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
        }
        // SAFETY: the out-pointers are the adapter's locals; `mr` is valid.
        unsafe {
            *handle = mr as *mut c_void;
            *lkey = (*mr).lkey;
            *rkey = (*mr).rkey;
        }
        0
    }

    pub(crate) unsafe extern "C" fn dereg(_ctx: *mut c_void, handle: *mut c_void) -> c_int {
        // SAFETY: `handle` is an `ibv_mr *` that `reg` returned, passed once.
        unsafe { ibv_dereg_mr(handle as *mut ibv_mr) }
    }
}
