//! The caller's registrar: C callbacks behind [`Registrar`], the "inside a
//! callback of cache X" flag that turns re-entry into `MRCACHE_BUSY`, and
//! the built-in verbs registrar.
//!
//! Invariant: the cache never calls its registrar with its lock held
//! (spec.md#A4, L1), so a callback may free memory (a munmap is seen by the
//! uffd monitor, a hook's `mrcache_invalidate` only queues: H1/H2). A
//! callback may not acquire, release, flush, trim, start a monitor or destroy
//! on the same cache: those return `MRCACHE_BUSY` there, and also in a
//! callback of another cache called from inside one of its own (the thread
//! is still inside its callback).
//!
//! Cancellation: a callback runs with the thread's cancelability disabled
//! ([`NoCancel`] for that callback, or once for all the callbacks of a miss:
//! `begin_scope`): a cancel requested meanwhile stays pending and acts at
//! the thread's next cancellation point after the entry point returned.
//! A callback that throws, exits its thread or longjmps out goes through
//! the trampolines of [`crate::escape`] (spec.md#S7.8).

use crate::escape::{self, Ended, RegCall};
use crate::status::{Failure, MRCACHE_BUSY};
use crate::threads::{Mine, ThreadBucket, ThreadBuckets, MAX_DEPTH};
use mrcache_impl::registrar::{Keys, Registrar, RegistrarError};
use mrcache_types::{Access, Range};
use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

type RegFn = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, u32, *mut *mut c_void, *mut u32, *mut u32) -> c_int;
type DeregFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int;

/// A registrar: two callbacks and their context.
///
/// Both may be called from any thread, concurrently, never with a cache lock
/// held, with cancellation disabled. A C++ exception or a thread exit out
/// of one makes it fail; a longjmp out of one is forbidden. See "Callbacks"
/// in the header for what they may call and for what happens then.
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

#[cfg(target_os = "linux")]
mod cancel {
    use std::ffi::c_int;

    // Not in the `libc` crate for Linux. The values are glibc's and musl's.
    pub(super) const PTHREAD_CANCEL_ENABLE: c_int = 0;
    pub(super) const PTHREAD_CANCEL_DISABLE: c_int = 1;

    extern "C" {
        pub(super) fn pthread_setcancelstate(state: c_int, oldstate: *mut c_int) -> c_int;
    }
}

/// The calling thread's cancelability disabled until dropped, then put
/// back as it was (on every path out of a callback: its return, or a panic
/// of the library's own code around it). A cancel requested meanwhile
/// stays pending: `pthread_setcancelstate` is no cancellation point, and
/// re-enabling a deferred cancel does not act on it, so it acts at the
/// thread's next cancellation point, after the library returned.
///
/// Two `pthread_setcancelstate` calls (an atomic update of the thread's
/// cancel word each) on the miss path only: registrations and
/// deregistrations, never a hit.
#[must_use]
pub(crate) struct NoCancel {
    /// It was enabled before: enabled again on drop.
    was_enabled: bool,
}

impl NoCancel {
    #[inline]
    pub(crate) fn new() -> NoCancel {
        NoCancel { was_enabled: disable_cancel() }
    }
}

impl Drop for NoCancel {
    #[inline]
    fn drop(&mut self) {
        if self.was_enabled {
            enable_cancel();
        }
    }
}

/// Disables this thread's cancelability; whether it was enabled.
#[inline]
fn disable_cancel() -> bool {
    #[cfg(target_os = "linux")]
    {
        let mut old = cancel::PTHREAD_CANCEL_DISABLE;
        // SAFETY: sets this thread's cancel state; `old` is a valid
        // out-pointer. It cannot fail for a valid state.
        unsafe { cancel::pthread_setcancelstate(cancel::PTHREAD_CANCEL_DISABLE, &mut old) };
        old == cancel::PTHREAD_CANCEL_ENABLE
    }
    #[cfg(not(target_os = "linux"))]
    false
}

/// Enables this thread's cancelability again (after [`disable_cancel`]
/// found it enabled).
#[inline]
fn enable_cancel() {
    #[cfg(target_os = "linux")]
    // SAFETY: restores this thread's state from before `disable_cancel`;
    // the old-state pointer may be NULL.
    unsafe {
        cancel::pthread_setcancelstate(cancel::PTHREAD_CANCEL_ENABLE, std::ptr::null_mut())
    };
}

// A miss's callback scope on the calling thread's bucket
// (`Registrar::begin_callbacks`): every callback of this cache that the
// miss runs on this thread finds the thread's cancelability disabled by the
// first of them, and the scope enables it again (if it was enabled) when it
// ends. One pair of `pthread_setcancelstate` calls per miss instead of one
// per callback: an evicting miss runs a `reg` and a `dereg`. (A callback
// that changes its thread's cancel state restores it before it returns:
// the header says so.)
//
// The scope's bits live in the bucket (owner only): SCOPE_OPEN, then at
// most one of SCOPE_CANCEL_HELD (the first callback disabled it; the end
// enables it) and SCOPE_CANCEL_CHECKED (it was disabled already; nothing to
// restore). A longjmp out of a callback skips the scope's end: the
// callback's guard ends the scope then ([`CallbackGuard`]'s
// `escape::Guards`).
const SCOPE_OPEN: u32 = 1;
const SCOPE_CANCEL_HELD: u32 = 2;
const SCOPE_CANCEL_CHECKED: u32 = 4;
/// The scope bits kept in a begin token's low bits (a bucket is 64-byte
/// aligned).
const SCOPE_BITS: usize = 7;

/// Opens a scope on the calling thread's bucket: its address with the
/// bits it had (a scope begun inside another on the same bucket, as by a
/// signal handler's call, puts them back), or 0 without a bucket.
#[inline(always)]
fn begin_scope(r: &CRegistrar) -> usize {
    match r.threads.mine() {
        Mine::Idle(b) | Mine::InCallback(b) => {
            let outer = b.scope();
            b.set_scope(SCOPE_OPEN);
            b as *const ThreadBucket as usize | outer as usize
        }
        Mine::None => 0,
    }
}

/// Ends the scope [`begin_scope`] opened.
#[inline(always)]
fn end_scope(begun: usize) {
    if begun == 0 {
        return;
    }
    // SAFETY: a bucket of the cache whose operation began the scope and is
    // ending it (`&self` of the registrar that owns the buckets is alive),
    // owned by this thread (`begin_scope` found it its own, and the
    // operation runs on one thread).
    let b = unsafe { &*((begun & !SCOPE_BITS) as *const ThreadBucket) };
    let bits = b.scope();
    b.set_scope((begun & SCOPE_BITS) as u32);
    if bits & SCOPE_CANCEL_HELD != 0 {
        enable_cancel();
    }
}

const _: () = assert!(std::mem::align_of::<ThreadBucket>() > SCOPE_BITS, "scope bits fit below a bucket's address");

/// Disables cancelability for a callback about to run on `bucket`'s
/// owner: for this callback alone outside a scope (the guard), else once
/// for the scope.
#[inline(always)]
fn no_cancel_for_callback(bucket: &ThreadBucket) -> Option<NoCancel> {
    let bits = bucket.scope();
    if bits & SCOPE_OPEN == 0 {
        return Some(NoCancel::new());
    }
    if bits & (SCOPE_CANCEL_HELD | SCOPE_CANCEL_CHECKED) == 0 {
        let held = if disable_cancel() { SCOPE_CANCEL_HELD } else { SCOPE_CANCEL_CHECKED };
        bucket.set_scope(bits | held);
    }
    None
}

/// What a callback runs with, until dropped: its cancelability disabled
/// (for itself, or by its scope) and its "inside a callback" mark.
pub(crate) struct CallbackGuard<'a> {
    /// Dropped first, as the mark was made last.
    cancel: Option<NoCancel>,
    mark: InCallback<'a>,
}

impl<'a> CallbackGuard<'a> {
    #[inline(always)]
    fn enter(r: &'a CRegistrar) -> CallbackGuard<'a> {
        match r.threads.mine() {
            Mine::Idle(b) | Mine::InCallback(b) if b.depth() < MAX_DEPTH => {
                let cancel = no_cancel_for_callback(b);
                b.enter_callback();
                CallbackGuard { cancel, mark: InCallback::Bucket(b) }
            }
            // No bucket, or nested deeper than its mark counts.
            _ => CallbackGuard { cancel: Some(NoCancel::new()), mark: InCallback::enter_shared(r) },
        }
    }
}

impl escape::Guards for CallbackGuard<'_> {
    /// The jump skips the entry point, and with it the close of its scope.
    fn on_longjmp(&mut self) {
        if let (None, InCallback::Bucket(b)) = (&self.cancel, &self.mark) {
            if b.scope() & SCOPE_CANCEL_HELD != 0 {
                enable_cancel();
            }
            b.set_scope(0);
        }
    }
}

thread_local! {
    /// The caches (their ids) whose registrar callbacks this thread is
    /// inside and that have no bucket for it ([`ThreadBuckets::mine`] is
    /// `None`), innermost last. Only threads without a bucket use it.
    /// Read with `try_with`: it has a destructor, and a C caller may call
    /// in from a pthread key destructor, after it ran (then the thread can
    /// be in no callback it could record: nothing is marked there).
    static IN_CALLBACKS: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Marks this thread as inside a callback of the registrar's cache until
/// dropped. With a bucket, the mark is its depth (a plain load and store of
/// a line of this thread's); without one (or nested deeper than a bucket
/// counts), the cache id pushed on [`IN_CALLBACKS`] and counted in the
/// cache's `active`.
enum InCallback<'a> {
    Bucket(&'a ThreadBucket),
    Shared(&'a CRegistrar),
    /// No mark could be made: the thread's thread-locals are gone (it is
    /// exiting, in a pthread key destructor).
    Unmarked,
}

impl<'a> InCallback<'a> {
    /// The mark alone ([`CallbackGuard::enter`] makes it with the
    /// cancelability guard, from one bucket lookup).
    #[cfg(test)]
    fn enter(r: &'a CRegistrar) -> InCallback<'a> {
        match r.threads.mine() {
            Mine::Idle(b) | Mine::InCallback(b) if b.depth() < MAX_DEPTH => {
                b.enter_callback();
                InCallback::Bucket(b)
            }
            // No bucket, or nested deeper than its mark counts.
            _ => Self::enter_shared(r),
        }
    }

    /// The thread-local mark: counted in `active` first (`not_in_callback`
    /// reads the thread-locals only while it is non-zero).
    fn enter_shared(r: &'a CRegistrar) -> InCallback<'a> {
        r.active.fetch_add(1, Ordering::SeqCst);
        match IN_CALLBACKS.try_with(|s| s.borrow_mut().push(r.cache_id)) {
            Ok(()) => InCallback::Shared(r),
            Err(_) => {
                r.active.fetch_sub(1, Ordering::SeqCst);
                InCallback::Unmarked
            }
        }
    }
}

impl Drop for InCallback<'_> {
    fn drop(&mut self) {
        match self {
            InCallback::Bucket(b) => b.leave_callback(),
            InCallback::Shared(r) => {
                // Err: the thread-locals went during the callback (the
                // thread is exiting), and the mark with them.
                let _ = IN_CALLBACKS.try_with(|s| {
                    let mut s = s.borrow_mut();
                    // The innermost mark of this cache is this guard's:
                    // guards drop in reverse order of entry.
                    if let Some(i) = s.iter().rposition(|&id| id == r.cache_id) {
                        s.remove(i);
                    }
                });
                r.active.fetch_sub(1, Ordering::SeqCst);
            }
            InCallback::Unmarked => {}
        }
    }
}

#[cold]
fn busy() -> Failure {
    Failure::new(
        MRCACHE_BUSY,
        "called from inside a registrar callback of the same cache (only mrcache_invalidate, mrcache_stats, mrcache_lease_keys, mrcache_lease_view and mrcache_last_error are allowed there)",
    )
}

/// `Err(BUSY)` if this thread is inside a registrar callback of
/// `registrar`'s cache (however nested); else this thread's bucket, if it
/// has one, for the slab's free lists. With a bucket, the check is the
/// load and compare that finds it; without one, the thread-local marks are
/// read only while some thread without a bucket runs a callback of this
/// cache (such a thread counts itself in `active` before its mark). A
/// thread with a bucket that is nested deeper than the bucket counts is
/// found by its bucket already (depth [`MAX_DEPTH`]).
#[inline(always)]
pub(crate) fn not_in_callback(registrar: &CRegistrar) -> Result<Option<&ThreadBucket>, Failure> {
    match registrar.threads.mine() {
        Mine::Idle(b) => Ok(Some(b)),
        Mine::InCallback(_) => Err(busy()),
        Mine::None => {
            if registrar.active.load(Ordering::SeqCst) != 0
                && IN_CALLBACKS.try_with(|s| s.borrow().contains(&registrar.cache_id)).unwrap_or(false)
            {
                return Err(busy());
            }
            Ok(None)
        }
    }
}

/// The C callbacks as the cache's [`Registrar`].
pub struct CRegistrar {
    ctx: *mut c_void,
    reg: RegFn,
    dereg: DeregFn,
    /// The owning cache's id, for the thread-local marks.
    pub(crate) cache_id: u64,
    /// Callbacks running now on threads without a bucket.
    active: AtomicU64,
    /// Each thread's state in this cache: its callback depth, and its free
    /// lease slots (the slab's, passed to it by the entry points).
    pub(crate) threads: ThreadBuckets,
}

// SAFETY: the header requires both callbacks to be callable from any thread
// with `ctx`, concurrently; the cache shares nothing else of it.
unsafe impl Send for CRegistrar {}
// SAFETY: as for Send.
unsafe impl Sync for CRegistrar {}

impl CRegistrar {
    pub(crate) fn new(r: &mrcache_registrar_t, cache_id: u64) -> Option<CRegistrar> {
        Some(CRegistrar { ctx: r.ctx, reg: r.reg?, dereg: r.dereg?, cache_id, active: AtomicU64::new(0), threads: ThreadBuckets::new() })
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

/// A callback that threw or exited, as its failure (errno `ECANCELED`):
/// the registration is abandoned as after any failed `reg`; a `dereg`'s
/// handle is gone as after any failed `dereg` (spec.md#S7.8).
#[cold]
fn escaped(callback: &'static str, ended: Ended) -> RegistrarError {
    let detail = match ended {
        Ended::Threw(what) => format!("the {callback} callback threw an exception ({what}); it was caught and destroyed"),
        Ended::Exit => {
            format!("the {callback} callback called pthread_exit (or was cancelled); the thread exits when the library call returns")
        }
        Ended::Returned(_) => unreachable!("a callback that returned did not escape"),
    };
    RegistrarError::from_errno(callback, libc::ECANCELED, detail)
}

/// A callback's return value as an errno (a negative one counts as its absolute value).
fn errno_of(rc: c_int) -> c_int {
    rc.checked_abs().unwrap_or(libc::EINVAL)
}

impl Registrar for CRegistrar {
    type Handle = CHandle;

    fn register(&self, range: Range, access: Access) -> Result<CHandle, RegistrarError> {
        self.register_abandonable(range, access, &mut || {})
    }

    fn register_abandonable(&self, range: Range, access: Access, on_abandon: &mut dyn FnMut()) -> Result<CHandle, RegistrarError> {
        let (mut ptr, mut lkey, mut rkey) = (std::ptr::null_mut(), 0u32, 0u32);
        #[cfg(test)]
        crate::tests::maybe_panic();
        let call = RegCall {
            reg: self.reg,
            ctx: self.ctx,
            addr: range.addr as *mut c_void,
            len: range.len as usize,
            access: u32::from(access.bits()),
            handle: &mut ptr,
            lkey: &mut lkey,
            rkey: &mut rkey,
        };
        // The callback's contract (header): it reads nothing but its
        // arguments and writes the three out-pointers, our locals.
        let rc = match escape::call_reg(&call, CallbackGuard::enter(self), on_abandon) {
            Ended::Returned(rc) => rc,
            ended => return Err(escaped("reg", ended)),
        };
        if rc != 0 {
            let errno = errno_of(rc);
            return Err(RegistrarError::from_errno("reg", errno, format!("the reg callback returned {rc}")));
        }
        Ok(CHandle { ptr, keys: Keys { lkey, rkey } })
    }

    fn deregister(&self, handle: CHandle) -> Result<(), RegistrarError> {
        #[cfg(test)]
        crate::tests::maybe_panic_in_dereg();
        // `handle.ptr` is what `reg` returned, passed back once.
        let rc = match escape::call_dereg(self.dereg, self.ctx, handle.ptr, CallbackGuard::enter(self)) {
            Ended::Returned(rc) => rc,
            ended => return Err(escaped("dereg", ended)),
        };
        if rc != 0 {
            return Err(RegistrarError::from_errno("dereg", errno_of(rc), format!("the dereg callback returned {rc}")));
        }
        Ok(())
    }

    fn keys(&self, handle: &CHandle) -> Keys {
        handle.keys
    }

    #[inline(always)]
    fn begin_callbacks(&self) -> usize {
        begin_scope(self)
    }

    #[inline(always)]
    fn end_callbacks(&self, begun: usize) {
        end_scope(begun);
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

#[cfg(test)]
mod tests {
    use super::*;

    unsafe extern "C" fn never_reg(
        _: *mut c_void,
        _: *mut c_void,
        _: usize,
        _: u32,
        _: *mut *mut c_void,
        _: *mut u32,
        _: *mut u32,
    ) -> c_int {
        libc::EINVAL
    }

    unsafe extern "C" fn never_dereg(_: *mut c_void, _: *mut c_void) -> c_int {
        libc::EINVAL
    }

    /// Calls the thread-local path of the re-entry marks from a thread-local
    /// destructor that runs after `IN_CALLBACKS`' (destructors run in the
    /// reverse order of first use), as a C caller's pthread key destructor
    /// may: no panic, no mark, and `active` back at 0.
    #[test]
    fn the_thread_local_marks_after_their_destructor_ran() {
        struct AtExit(Option<std::sync::Arc<CRegistrar>>, std::sync::Arc<std::sync::atomic::AtomicU32>);
        impl Drop for AtExit {
            fn drop(&mut self) {
                let Some(r) = self.0.take() else { return };
                let gone = IN_CALLBACKS.try_with(|_| ()).is_err();
                let mark = InCallback::enter_shared(&r);
                let unmarked = matches!(mark, InCallback::Unmarked);
                let outside = not_in_callback(&r).is_ok();
                drop(mark);
                let settled = r.active.load(Ordering::SeqCst) == 0;
                let got = u32::from(gone) | u32::from(unmarked) << 1 | u32::from(outside) << 2 | u32::from(settled) << 3;
                self.1.store(got, Ordering::SeqCst);
            }
        }
        thread_local! {
            static AT_EXIT: RefCell<AtExit> = RefCell::new(AtExit(None, Default::default()));
        }
        let r = mrcache_registrar_t { ctx: std::ptr::null_mut(), reg: Some(never_reg), dereg: Some(never_dereg) };
        let r = std::sync::Arc::new(CRegistrar::new(&r, 78).expect("both callbacks given"));
        let got = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let (r2, got2) = (r.clone(), got.clone());
        std::thread::spawn(move || {
            // First use of AT_EXIT, then of IN_CALLBACKS: AT_EXIT's
            // destructor runs last.
            AT_EXIT.with(|a| *a.borrow_mut() = AtExit(Some(r2), got2));
            drop(InCallback::enter_shared(&AT_EXIT.with(|a| a.borrow().0.clone()).expect("set")));
        })
        .join()
        .expect("no panic at thread exit");
        assert_eq!(got.load(Ordering::SeqCst), 0b1111, "gone, unmarked, outside, active settled (bits 0-3)");
    }

    /// Callbacks nested deeper than a bucket's mark counts go on the
    /// thread-local marks; the thread is inside a callback at every depth,
    /// and outside once every guard is dropped, on both kinds of marks.
    #[test]
    fn nesting_beyond_the_bucket_depth_is_still_inside() {
        let r = mrcache_registrar_t { ctx: std::ptr::null_mut(), reg: Some(never_reg), dereg: Some(never_dereg) };
        let r = CRegistrar::new(&r, 77).expect("both callbacks given");
        let Ok(bucket) = not_in_callback(&r) else { panic!("outside every callback") };
        let has_bucket = bucket.is_some();
        let mut marks = Vec::new();
        for depth in 1..=MAX_DEPTH + 5 {
            marks.push(InCallback::enter(&r));
            assert!(not_in_callback(&r).is_err(), "inside at depth {depth}");
            let shared = matches!(marks.last(), Some(InCallback::Shared(_)));
            assert_eq!(shared, !has_bucket || depth > MAX_DEPTH, "depth {depth}");
        }
        while let Some(mark) = marks.pop() {
            assert!(not_in_callback(&r).is_err(), "inside at depth {}", marks.len() + 1);
            drop(mark);
        }
        assert!(not_in_callback(&r).is_ok(), "outside again");
        assert_eq!(r.active.load(Ordering::SeqCst), 0);
        assert!(IN_CALLBACKS.with(|s| s.borrow().is_empty()));
    }
}
