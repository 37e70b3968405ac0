//! Status codes, the thread's last error, and the guard every entry point
//! runs its body in (no panic crosses the C boundary).

use mrcache_impl::Error;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// What every function returns. The spec's errors keep their numbers
/// (spec.md#S2: E1 = 1, ...); E3 has no meaning in C, where the caller does
/// not name leases; E4 (release of a lease that is not held) is
/// `MRCACHE_INVALID_LEASE`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum mrcache_status_t {
    MRCACHE_OK = 0,
    /// E1: `len` is 0.
    MRCACHE_EMPTY_RANGE = 1,
    /// E2: `addr + len` wraps, or the page-aligned range exceeds 2^63.
    MRCACHE_WRAPPING_RANGE = 2,
    /// E4: the lease is not held: released already, stale, from another
    /// cache, or never returned by `mrcache_acquire`.
    MRCACHE_INVALID_LEASE = 4,
    /// E5: the registrar failed (after one retry for ENOMEM/EAGAIN, with
    /// every unleased entry evicted in between). `mrcache_last_error` gives
    /// the errno and a message.
    MRCACHE_REGISTRAR = 5,
    /// E6: the registration was invalidated during each of its attempts.
    MRCACHE_RETRIES_EXHAUSTED = 6,
    /// E7: `mrcache_release_end` names a range with no open window of
    /// exactly its pages (spec.md#S2.9); nothing changed.
    MRCACHE_UNMATCHED_RELEASE_END = 7,
    /// A pointer argument is NULL.
    MRCACHE_NULL_ARGUMENT = 16,
    /// Called from inside a registrar callback of the same cache (see
    /// "Callbacks" in the header), or `mrcache_destroy` while leases are held.
    MRCACHE_BUSY = 17,
    /// `mrcache_create`: the configuration or the registrar is unusable.
    MRCACHE_INVALID_CONFIG = 18,
    /// No RDMA device, or the library was built without verbs.
    MRCACHE_NO_DEVICE = 19,
    /// An argument other than a pointer is out of range (access flags, a
    /// versioned struct's size).
    MRCACHE_INVALID_ARGUMENT = 20,
    /// The monitor the configuration asks for cannot be started here
    /// (userfaultfd unavailable or not permitted).
    MRCACHE_UNSUPPORTED = 21,
    /// More leases held at once than the cache can name (2^20).
    MRCACHE_TOO_MANY_LEASES = 22,
    /// E5 "cannot watch": the uffd monitor cannot watch this memory (SysV
    /// shared memory from shmat, or a file mapping); nothing changed.
    /// `mrcache_last_error` names the kind of mapping. memfd and shared
    /// anonymous memory (MAP_SHARED|MAP_ANONYMOUS) can be watched.
    MRCACHE_UNWATCHABLE = 23,
    /// A bug: a panic inside the library, caught at the boundary. The cache
    /// stays usable; `mrcache_last_error` gives the panic message.
    MRCACHE_INTERNAL = 99,
}

pub use mrcache_status_t::*;

/// A failure: its status, errno (0 if none) and message.
pub(crate) struct Failure {
    pub status: mrcache_status_t,
    pub errno: c_int,
    pub message: String,
}

impl Failure {
    pub fn new(status: mrcache_status_t, message: impl Into<String>) -> Failure {
        Failure { status, errno: 0, message: message.into() }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        let (status, errno) = match &e {
            Error::EmptyRange { .. } => (MRCACHE_EMPTY_RANGE, 0),
            Error::WrappingRange { .. } => (MRCACHE_WRAPPING_RANGE, 0),
            Error::Registrar { source, .. } => (MRCACHE_REGISTRAR, source.errno),
            Error::Watch { .. } => (MRCACHE_UNWATCHABLE, 0),
            Error::RetriesExhausted { .. } => (MRCACHE_RETRIES_EXHAUSTED, 0),
            Error::UnmatchedReleaseEnd { .. } => (MRCACHE_UNMATCHED_RELEASE_END, 0),
            Error::InvalidConfig { .. } => (MRCACHE_INVALID_CONFIG, libc::EINVAL),
            _ => (MRCACHE_INTERNAL, 0),
        };
        Failure { status, errno, message: e.to_string() }
    }
}

thread_local! {
    /// The last failure of a call on this thread (message, errno).
    static LAST_ERROR: RefCell<(CString, c_int)> = RefCell::new((CString::default(), 0));
}

fn set_last_error(message: &str, errno: c_int) {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    // try_with: during thread teardown the slot may be gone; then nothing is kept.
    let _ = LAST_ERROR.try_with(|l| *l.borrow_mut() = (text, errno));
}

/// The message of the last failed call on this thread ("" if none), valid
/// until the thread's next call into the library; its errno in `*errno_out`.
pub(crate) fn last_error(errno_out: *mut c_int) -> *const c_char {
    LAST_ERROR
        .try_with(|l| {
            let l = l.borrow();
            if !errno_out.is_null() {
                // SAFETY: non-null, and the caller passes a writable int (header).
                unsafe { *errno_out = l.1 };
            }
            l.0.as_ptr()
        })
        .unwrap_or(c"".as_ptr())
}

/// Runs an entry point's body: a failure becomes its status (and the last
/// error); a panic becomes `MRCACHE_INTERNAL`, never an unwind into C.
/// The only unwind out of an entry point is a thread's exit that one of
/// its callbacks began ([`crate::escape`]): entry points are `C-unwind`.
pub(crate) fn guard(body: impl FnOnce() -> Result<(), Failure>) -> mrcache_status_t {
    guard_status(|| match body() {
        Ok(()) => MRCACHE_OK,
        Err(f) => fail(f),
    })
}

/// [`guard`] for a body that reports its failures itself ([`fail`]) and
/// returns a status: the hit path's entry points, whose success path then
/// moves no `Result<_, Failure>` around.
#[inline(always)]
pub(crate) fn guard_status(body: impl FnOnce() -> mrcache_status_t) -> mrcache_status_t {
    let status = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(status) => status,
        Err(panic) => panicked(panic),
    };
    // Outside the catch_unwind, which would abort on glibc's forced unwind:
    // a callback's pthread_exit goes on from here (spec.md#S7.8).
    crate::escape::resume_exit_if_pending();
    status
}

/// A failure as an entry point's status, kept as the thread's last error.
#[cold]
#[inline(never)]
pub(crate) fn fail(f: Failure) -> mrcache_status_t {
    set_last_error(&f.message, f.errno);
    f.status
}

#[cold]
#[inline(never)]
fn panicked(panic: Box<dyn std::any::Any + Send>) -> mrcache_status_t {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    set_last_error(&format!("internal error (a bug in libmrcache, please report): {what}"), 0);
    MRCACHE_INTERNAL
}

/// `MRCACHE_NULL_ARGUMENT` naming `what`, as the last error.
#[cold]
#[inline(never)]
pub(crate) fn fail_null(what: &str) -> mrcache_status_t {
    fail(null_argument(what))
}

#[cold]
fn null_argument(what: &str) -> Failure {
    Failure::new(MRCACHE_NULL_ARGUMENT, format!("{what} is NULL"))
}

/// `Err(NULL_ARGUMENT)` naming `what` if `p` is null.
pub(crate) fn non_null<T>(p: *const T, what: &str) -> Result<(), Failure> {
    if p.is_null() {
        Err(null_argument(what))
    } else {
        Ok(())
    }
}

/// The name of a status value (any int: C may pass one that is not a status).
pub(crate) fn name(status: c_int) -> &'static std::ffi::CStr {
    const ALL: [(mrcache_status_t, &std::ffi::CStr); 16] = [
        (MRCACHE_OK, c"MRCACHE_OK"),
        (MRCACHE_EMPTY_RANGE, c"MRCACHE_EMPTY_RANGE"),
        (MRCACHE_WRAPPING_RANGE, c"MRCACHE_WRAPPING_RANGE"),
        (MRCACHE_INVALID_LEASE, c"MRCACHE_INVALID_LEASE"),
        (MRCACHE_REGISTRAR, c"MRCACHE_REGISTRAR"),
        (MRCACHE_RETRIES_EXHAUSTED, c"MRCACHE_RETRIES_EXHAUSTED"),
        (MRCACHE_UNMATCHED_RELEASE_END, c"MRCACHE_UNMATCHED_RELEASE_END"),
        (MRCACHE_NULL_ARGUMENT, c"MRCACHE_NULL_ARGUMENT"),
        (MRCACHE_BUSY, c"MRCACHE_BUSY"),
        (MRCACHE_INVALID_CONFIG, c"MRCACHE_INVALID_CONFIG"),
        (MRCACHE_NO_DEVICE, c"MRCACHE_NO_DEVICE"),
        (MRCACHE_INVALID_ARGUMENT, c"MRCACHE_INVALID_ARGUMENT"),
        (MRCACHE_UNSUPPORTED, c"MRCACHE_UNSUPPORTED"),
        (MRCACHE_TOO_MANY_LEASES, c"MRCACHE_TOO_MANY_LEASES"),
        (MRCACHE_UNWATCHABLE, c"MRCACHE_UNWATCHABLE"),
        (MRCACHE_INTERNAL, c"MRCACHE_INTERNAL"),
    ];
    ALL.iter().find(|(s, _)| *s as c_int == status).map_or(c"(not an mrcache status)", |(_, n)| n)
}
