//! Callbacks that end other than by returning (spec.md#S7.8): the Rust side
//! of the trampolines in `escape.cc`.
//!
//! Invariant: no unwind and no jump crosses a Rust frame of the library.
//! - A C++ exception is caught in the trampoline and destroyed: the callback
//!   counts as failed ([`Ended::Threw`]).
//! - A forced unwind (`pthread_exit`, or a cancel the callback re-enabled)
//!   runs the callback's own cleanups and lands in the trampoline
//!   ([`Ended::Exit`]): the callback counts as failed, the library call
//!   finishes as it would after a failure, and [`resume_exit_if_pending`],
//!   at the entry point after its `catch_unwind`, goes on with the thread's
//!   exit. On the monitor's service thread there is no entry point to go
//!   on from: the exit is dropped there, and the thread keeps serving.
//! - A longjmp over the trampoline (which the header forbids) runs, before
//!   it jumps, the per-thread repairs the skipped frames would have made
//!   (the thread's cancel state and its "inside a callback" mark) and, for
//!   `reg`, the cache's abandon of its registration in flight (the
//!   `on_abandon` of `Registrar::register_abandonable`), so the thread and
//!   the cache can go on.
//!
//! A Rust panic cannot leave a callback: the C API's callbacks are C
//! functions, and a Rust one declared `extern "C"` aborts on a panic itself.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicUsize, Ordering};

type RegFn = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, u32, *mut *mut c_void, *mut u32, *mut u32) -> c_int;
type DeregFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int;

// How a callback ended: escape.cc's enum.
const ESCAPE_RETURNED: c_int = 0;
const ESCAPE_THREW: c_int = 1;
const ESCAPE_EXIT: c_int = 2;

/// escape.cc's `struct mrcache_escape`.
#[repr(C)]
struct RawEscape {
    kind: c_int,
    on_longjmp: Option<unsafe extern "C" fn(*mut c_void)>,
    on_longjmp_arg: *mut c_void,
}

/// escape.cc's `struct mrcache_escape_reg_call`.
#[repr(C)]
pub(crate) struct RegCall {
    pub(crate) reg: RegFn,
    pub(crate) ctx: *mut c_void,
    pub(crate) addr: *mut c_void,
    pub(crate) len: usize,
    pub(crate) access: u32,
    pub(crate) handle: *mut *mut c_void,
    pub(crate) lkey: *mut u32,
    pub(crate) rkey: *mut u32,
}

extern "C" {
    // Neither unwinds: the trampoline stops everything that could.
    fn mrcache_escape_call_reg(call: *const RegCall, escape: *mut RawEscape) -> c_int;
    fn mrcache_escape_call_dereg(dereg: DeregFn, ctx: *mut c_void, handle: *mut c_void, escape: *mut RawEscape) -> c_int;
    // This thread's last caught exception's what(), NUL-terminated.
    fn mrcache_escape_what() -> *const c_char;
}

extern "C-unwind" {
    // Unwinds (a forced unwind: the thread's exit), and never returns.
    fn mrcache_escape_resume_exit() -> !;
}

/// A callback's guards: the per-thread state its call's frames restore when
/// they end (dropped after the call, or by the trampoline's handler before
/// a longjmp skips them), and what else a longjmp must repair first.
pub(crate) trait Guards {
    /// A longjmp is about to skip the library call around the callback:
    /// repairs what that call would have restored on its way out.
    fn on_longjmp(&mut self) {}
}

/// How a callback ended.
#[derive(Debug)]
pub(crate) enum Ended {
    /// It returned this value.
    Returned(c_int),
    /// It threw a C++ exception (its `what()`), which was destroyed.
    Threw(String),
    /// It called `pthread_exit` (or was cancelled after re-enabling
    /// cancellation): the thread exits when the library call returns.
    Exit,
}

/// Threads with an exit to resume at their entry point. Read by every
/// entry point ([`resume_exit_if_pending`]); non-zero only between a
/// callback's `pthread_exit` and the end of that thread's library call.
static EXITS_PENDING: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread has an exit to resume ([`EXITS_PENDING`] counts it).
    static EXIT_PENDING: Cell<bool> = const { Cell::new(false) };
}

/// Calls `reg` through its trampoline with `guards` alive: the per-thread
/// state the call's frames would restore when they end (the cancel state,
/// the "inside a callback" mark). Dropped after the call; on a longjmp out
/// of the callback, dropped by the trampoline's handler before the jump.
/// On a longjmp, `on_abandon` runs after the guards dropped (the cache's
/// abandon of its registration in flight).
#[inline(always)]
pub(crate) fn call_reg<G: Guards>(call: &RegCall, guards: G, on_abandon: &mut dyn FnMut()) -> Ended {
    // SAFETY: erases the closure's lifetime: it is called only by `on_jump`,
    // before the jump skips this frame, while the caller's frame (which
    // owns the closure) is alive.
    let on_abandon: *mut (dyn FnMut() + 'static) = unsafe { std::mem::transmute(on_abandon) };
    // SAFETY: `call` and the escape record outlive the call; the trampoline
    // calls `reg` with `call`'s arguments (the caller's contract for them).
    run(Jumped { guards, then: Some(on_abandon) }, |escape| unsafe { mrcache_escape_call_reg(call, escape) })
}

/// [`call_reg`] for `dereg(ctx, handle)`.
#[inline(always)]
pub(crate) fn call_dereg<G: Guards>(dereg: DeregFn, ctx: *mut c_void, handle: *mut c_void, guards: G) -> Ended {
    // SAFETY: as in `call_reg`.
    run(Jumped { guards, then: None }, |escape| unsafe { mrcache_escape_call_dereg(dereg, ctx, handle, escape) })
}

/// The guards of a callback call, and what a longjmp out of it runs after
/// dropping them.
struct Jumped<G> {
    guards: G,
    then: Option<*mut dyn FnMut()>,
}

//= spec.md#S7.8
//# A registrar callback runs with
//# cancellation disabled, and leaves the library by its return only: nothing
//# it does unwinds or jumps through the library's frames.
#[inline(always)]
fn run<G: Guards>(guards: Jumped<G>, call: impl FnOnce(*mut RawEscape) -> c_int) -> Ended {
    let mut guards = ManuallyDrop::new(guards);
    let mut escape = RawEscape {
        kind: ESCAPE_RETURNED,
        on_longjmp: Some(on_jump::<G>),
        on_longjmp_arg: (&mut guards as *mut ManuallyDrop<Jumped<G>>).cast(),
    };
    let rc = call(&mut escape);
    // SAFETY: the trampoline returned, so its longjmp handler did not run
    // (it runs only when a longjmp skips this frame): dropped once.
    unsafe { ManuallyDrop::drop(&mut guards) };
    match escape.kind {
        ESCAPE_RETURNED => Ended::Returned(rc),
        ESCAPE_THREW => {
            // SAFETY: the trampoline wrote it, NUL-terminated, on this thread.
            let what = unsafe { CStr::from_ptr(mrcache_escape_what()) };
            Ended::Threw(what.to_string_lossy().into_owned())
        }
        ESCAPE_EXIT => {
            if !mrcache_impl::monitor::process::on_service_thread() {
                // Ordering: read back by this thread only (program order);
                // other threads only see "maybe some" and read their own flag.
                if !exit_not_counted() {
                    EXITS_PENDING.fetch_add(1, Ordering::Relaxed);
                }
                EXIT_PENDING.with(|p| p.set(true));
            }
            Ended::Exit
        }
        other => unreachable!("escape.cc reported a callback ending {other}"),
    }
}

/// The trampoline's longjmp handler: drops the guards (at `arg`) in place
/// and runs what follows them, before the jump skips their frame.
unsafe extern "C" fn on_jump<G: Guards>(arg: *mut c_void) {
    // SAFETY: `arg` is `run`'s `guards`, alive (the jump has not happened
    // yet) and not dropped (`run` drops it only after the trampoline
    // returns, which it now never does).
    let jumped = unsafe { &mut *arg.cast::<ManuallyDrop<Jumped<G>>>() };
    jumped.guards.on_longjmp();
    let then = jumped.then;
    // SAFETY: as above; dropped once, here.
    unsafe { ManuallyDrop::drop(jumped) };
    if let Some(then) = then {
        // No unwind may leave this C handler: a panic here is a bug.
        // SAFETY: the caller's closure, alive (see `call_reg`), run once.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { (*then)() })).is_err() {
            std::process::abort();
        }
    }
}

/// At an entry point, after its body (outside its `catch_unwind`, with no
/// library frame left but its own): if a callback of this thread called
/// `pthread_exit` during the call, the thread's exit goes on from here. One
/// relaxed load of a shared word when no thread has an exit pending.
#[inline(always)]
pub(crate) fn resume_exit_if_pending() {
    if EXITS_PENDING.load(Ordering::Relaxed) != 0 {
        resume_exit_if_mine();
    }
}

#[cold]
#[inline(never)]
fn resume_exit_if_mine() {
    if EXIT_PENDING.try_with(|p| p.replace(false)).unwrap_or(false) {
        EXITS_PENDING.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: no frame of the library below the caller holds anything
        // (the body returned); the unwind is glibc's forced unwind of an
        // exit already under way, which the entry point (C-unwind) passes.
        unsafe { mrcache_escape_resume_exit() }
    }
}

// The mutant's switch, after every spec citation of this file (the
// citation check counts what follows a `#[cfg(test)]` as tests).
#[cfg(test)]
thread_local! {
    /// This thread runs with mutant `escape-exit-not-counted` (test builds
    /// only): a callback's exit is flagged but not counted in
    /// [`EXITS_PENDING`], so the entry point's filter never reads the flag
    /// and the thread goes on past its `pthread_exit`.
    static EXIT_NOT_COUNTED: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread runs with mutant `escape-exit-not-counted` (always
/// `false` in the library).
#[inline(always)]
fn exit_not_counted() -> bool {
    #[cfg(test)]
    return EXIT_NOT_COUNTED.with(Cell::get);
    #[cfg(not(test))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoGuards;
    impl Guards for NoGuards {}

    /// A callback that ended by its thread's exit, as the trampoline reports
    /// it, on a thread of its own (with mutant `escape-exit-not-counted` if
    /// `mutant`): whether the entry point's filter, [`resume_exit_if_pending`],
    /// would reach the thread's flag and resume the exit. The flag is then
    /// cleared as the resume would, without exiting.
    fn exit_reaches_the_entry_point(mutant: bool) -> bool {
        std::thread::spawn(move || {
            EXIT_NOT_COUNTED.with(|m| m.set(mutant));
            // SAFETY: `escape` is `run`'s record, alive for the call.
            let ended = run(Jumped { guards: NoGuards, then: None }, |escape| unsafe {
                (*escape).kind = ESCAPE_EXIT;
                0
            });
            assert!(matches!(ended, Ended::Exit), "{ended:?}");
            let reached = EXITS_PENDING.load(Ordering::Relaxed) != 0 && EXIT_PENDING.with(Cell::get);
            if EXIT_PENDING.with(|p| p.replace(false)) && !mutant {
                EXITS_PENDING.fetch_sub(1, Ordering::Relaxed);
            }
            reached
        })
        .join()
        .unwrap()
    }

    /// One test, in sequence: [`EXITS_PENDING`] is the process's, so a
    /// correct run beside the mutant's would hide it.
    #[test]
    fn a_callback_exit_reaches_the_entry_point_and_the_mutant_is_caught() {
        assert!(exit_reaches_the_entry_point(false), "a callback's exit is not resumed at its entry point");
        assert!(!exit_reaches_the_entry_point(true), "mutant escape-exit-not-counted not caught");
    }
}
