//! The hub's userfaultfds, which a fork child closes at once (spec.md#S7.6,
//! *Stopping*).
//!
//! A forked child inherits the parent's fds, and a userfaultfd's context
//! lives until its last fd is closed. `O_CLOEXEC` covers a child that execs;
//! one that does not (a fork-based worker pool) would keep the parent's
//! context alive after the parent's monitor thread closed its fd: every
//! range it watched would stay watched, a later release of one in the
//! parent would wait forever for a reader that is gone, and the exiting
//! monitor thread could wait on itself again. So an atfork child handler
//! closes the child's copies (the child's own memory is never watched
//! through them: without `UFFD_FEATURE_EVENT_FORK` the kernel drops the
//! watch from the child's mappings at fork).
//!
//! Invariants:
//! - A hub's fd is in [`FDS`] from its open until its close, both done
//!   while holding the gate, which the atfork prepare handler also takes
//!   (and the parent and child handlers release). So a fork sees every hub
//!   fd that is open at that moment and no number that was closed (which
//!   might have been reused for another file).
//! - At most [`SLOTS`] hub fds are tracked at once: the process's one hub,
//!   plus hubs still stopping while a new one starts. One past that is left
//!   untracked (its child keeps it, the behaviour before this module).
//! - The child handler only closes fds and stores atomics
//!   (async-signal-safe); the child has one thread there.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

/// Hub fds tracked at once.
pub(super) const SLOTS: usize = 4;

/// The tracked fds; -1 is a free slot.
static FDS: [AtomicI32; SLOTS] = [const { AtomicI32::new(-1) }; SLOTS];
/// Held across an open or a close of a hub fd, and across a fork.
static GATE: AtomicBool = AtomicBool::new(false);
/// Forks seen by the child handler: a hub that was launched at another
/// count lives in a fork child, where its fd is closed.
static FORKS: AtomicU64 = AtomicU64::new(0);
/// Whether the handlers were registered. A flag, not a `Once`: a fork while
/// another thread ran a `Once` would leave it running forever in the child.
static HANDLERS: AtomicBool = AtomicBool::new(false);

/// The gate, held: no fork passes its prepare handler until this is dropped.
pub(super) struct Held(());

/// Takes the gate (registering the atfork handlers the first time).
pub(super) fn hold() -> Held {
    if !HANDLERS.swap(true, Ordering::AcqRel) {
        // SAFETY: registers three handlers that touch only the statics of
        // this module and call close(2). A failure (ENOMEM) leaves fork
        // children keeping their copies, as before.
        unsafe {
            libc::pthread_atfork(Some(prepare), Some(parent), Some(child));
        }
    }
    take_gate();
    Held(())
}

impl Drop for Held {
    fn drop(&mut self) {
        // Release: the slot changes made while held are seen by the next
        // holder (a prepare handler, and so the child).
        GATE.store(false, Ordering::Release);
    }
}

/// Not bounded by a count: the holder is inside one open or close of a
/// userfaultfd, or inside a fork, each of which returns.
fn take_gate() {
    while GATE.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
        std::thread::yield_now();
    }
}

extern "C" fn prepare() {
    take_gate();
}

extern "C" fn parent() {
    GATE.store(false, Ordering::Release);
}

//= spec.md#S7.6
//# A fork child closes its copy of the fd at once
extern "C" fn child() {
    for slot in &FDS {
        let fd = slot.swap(-1, Ordering::Relaxed);
        if fd >= 0 {
            // SAFETY: a hub fd the parent had open at the fork (the gate
            // kept its close out), so the child's copy is open and is that
            // userfaultfd; nothing in the child uses it after this (see
            // the fork check in `HubSource::watch`).
            unsafe { libc::close(fd) };
        }
    }
    FORKS.fetch_add(1, Ordering::Relaxed);
    GATE.store(false, Ordering::Release);
}

/// Records `fd`, just opened while `_held`. Returns its slot, or `None` if
/// every slot is taken (then a fork child keeps its copy).
pub(super) fn track(_held: &Held, fd: RawFd) -> Option<usize> {
    let slot = FDS.iter().position(|s| s.load(Ordering::Relaxed) == -1)?;
    FDS[slot].store(fd, Ordering::Relaxed);
    Some(slot)
}

/// Forgets the fd of `slot`, about to be closed while `_held`.
pub(super) fn untrack(_held: &Held, slot: Option<usize>) {
    if let Some(slot) = slot {
        FDS[slot].store(-1, Ordering::Relaxed);
    }
}

/// Forks this process's line has gone through (counted in each child).
pub(super) fn forks() -> u64 {
    FORKS.load(Ordering::Relaxed)
}
