//! Registrars: what turns a byte range into a NIC-visible registration
//! (spec.md#S1.9). The cache never holds its lock across a registrar call
//! (spec.md#A4), and deregisters by handle, never by address.

use mrcache_types::{Access, Range, RegistrarFailure};

pub mod counting;
pub mod uring;
#[cfg(feature = "verbs")]
pub mod verbs;

/// The NIC-side keys of a registration, or the backend's equivalent handle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Keys {
    pub lkey: u32,
    pub rkey: u32,
}

/// A registrar call that failed. `failure` is what the cache and the model
/// act on (S5.4); `verb` and `errno` say exactly what broke.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{verb} failed: {detail} ({failure:?}, errno {errno})")]
pub struct RegistrarError {
    pub failure: RegistrarFailure,
    pub verb: &'static str,
    pub errno: i32,
    pub detail: String,
}

impl RegistrarError {
    pub fn from_errno(verb: &'static str, errno: i32, detail: impl Into<String>) -> Self {
        let failure = match errno {
            libc::ENOMEM => RegistrarFailure::NoMemory,
            libc::EAGAIN => RegistrarFailure::Again,
            libc::EFAULT => RegistrarFailure::Fault,
            _ => RegistrarFailure::Other,
        };
        RegistrarError { failure, verb, errno, detail: detail.into() }
    }
}

/// A backend that pins memory and makes it addressable by the NIC.
///
/// Contract: `register` either returns a handle whose pages stay pinned until
/// `deregister(handle)` is called, or an error and no side effect. Both may be
/// called from any thread, concurrently. A registrar may trigger release
/// events of its own (spec.md#S3.6); the cache tolerates that.
//= spec.md#S1.9
pub trait Registrar: Send + Sync + 'static {
    type Handle: Send + Sync + 'static;

    /// Pins the page-aligned `range` with `access`.
    fn register(&self, range: Range, access: Access) -> Result<Self::Handle, RegistrarError>;

    /// [`Self::register`], for a caller with work to undo if the call never
    /// returns: a callback that leaves by a jump, skipping the caller's
    /// frames (spec.md#S7.8). An adapter that can see such a jump coming
    /// (the C API's, under glibc) runs `on_abandon` before it, once, on the
    /// calling thread; the cache then abandons the registration in flight,
    /// as after a failure. Others need do nothing: the default ignores it.
    fn register_abandonable(&self, range: Range, access: Access, on_abandon: &mut dyn FnMut()) -> Result<Self::Handle, RegistrarError> {
        let _ = on_abandon;
        self.register(range, access)
    }

    /// Unpins. Called exactly once per successful `register`.
    fn deregister(&self, handle: Self::Handle) -> Result<(), RegistrarError>;

    /// Called on the calling thread by an operation that may call the
    /// registrar several times (a miss: its `register`, then an eviction's
    /// `deregister`), before the first call; [`Self::end_callbacks`] gets
    /// the value back after the last, also when the operation fails or
    /// unwinds. An adapter can then set the thread up once per operation
    /// instead of once per call (the C API disables cancelability once:
    /// spec.md#S7.8). The default does nothing.
    #[inline(always)]
    fn begin_callbacks(&self) -> usize {
        0
    }

    /// Ends what [`Self::begin_callbacks`] began (its value).
    #[inline(always)]
    fn end_callbacks(&self, begun: usize) {
        let _ = begun;
    }

    fn keys(&self, handle: &Self::Handle) -> Keys;

    /// Short backend name for reports: `counting`, `uring`, `verbs`.
    fn name(&self) -> &'static str;
}

/// [`Registrar::begin_callbacks`] until dropped (then `end_callbacks`).
pub(crate) struct CallbackSpan<'r, R: Registrar> {
    registrar: &'r R,
    begun: usize,
}

impl<'r, R: Registrar> CallbackSpan<'r, R> {
    #[inline(always)]
    pub(crate) fn begin(registrar: &'r R) -> Self {
        CallbackSpan { registrar, begun: registrar.begin_callbacks() }
    }
}

impl<R: Registrar> Drop for CallbackSpan<'_, R> {
    #[inline(always)]
    fn drop(&mut self) {
        self.registrar.end_callbacks(self.begun);
    }
}
