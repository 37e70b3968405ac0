//! The lanes' barriers (spec.md#LN1, LN5): the light one on the owner's
//! side, the heavy one (membarrier, [`crate::cache::os`]) on the revoking side.

use super::slots::LaneSlot;
use crate::cache::os::membarrier;
use crate::registrar::Registrar;
use crate::sync::{plain, AtomicPtr, AtomicU64, Ordering};

const BARRIER_UNKNOWN: u8 = 0;
const BARRIER_MEMBARRIER: u8 = 1;
const BARRIER_FENCES: u8 = 2;

static BARRIER_KIND: plain::AtomicU8 = plain::AtomicU8::new(BARRIER_UNKNOWN);
/// Fork-safe (registration is idempotent, so a child may run it again).
static BARRIER_INIT: crate::fork_safe::ForkSafeOnce = crate::fork_safe::ForkSafeOnce::new();

/// Registers the process for private expedited membarrier, once. Must run
/// before any lane exists (a cache constructor calls it): the light barrier is
/// a compiler fence only once the heavy one is known to be membarrier.
pub fn init_barriers() {
    BARRIER_INIT.call_once(|| {
        let kind = if membarrier::register() { BARRIER_MEMBARRIER } else { BARRIER_FENCES };
        BARRIER_KIND.store(kind, Ordering::SeqCst);
    });
}

/// Which heavy barrier this process uses (for diagnostics and benches).
pub fn uses_membarrier() -> bool {
    BARRIER_KIND.load(Ordering::Relaxed) == BARRIER_MEMBARRIER
}

//= spec.md#LN1
//# light barrier
/// The lane side's barrier between its count store and its `ptr` re-read.
#[inline(always)]
pub(super) fn light_barrier() {
    if BARRIER_KIND.load(Ordering::Relaxed) == BARRIER_MEMBARRIER {
        plain::compiler_fence(Ordering::SeqCst);
    } else {
        plain::fence(Ordering::SeqCst);
    }
}

//= spec.md#LN5
//# heavy barrier
/// The revoking side's barrier: a full barrier in every running thread.
pub(crate) fn heavy_barrier() {
    #[cfg(not(loom))]
    if BARRIER_KIND.load(Ordering::Relaxed) == BARRIER_MEMBARRIER {
        // Registration lost (a forked child): re-register, else the slow
        // global barrier, which needs no registration. All are full barriers
        // in every thread of the process.
        if membarrier::membarrier(membarrier::CMD_PRIVATE_EXPEDITED) == 0
            || (membarrier::register() && membarrier::membarrier(membarrier::CMD_PRIVATE_EXPEDITED) == 0)
            || membarrier::membarrier(membarrier::CMD_GLOBAL) == 0
        {
            return;
        }
        // No barrier is available: lanes cannot be made safe, so the process
        // aborts rather than hand out a stale registration.
        eprintln!("mrcache: membarrier failed after registration; aborting (lanes cannot be revoked safely)");
        std::process::abort();
    }
    plain::fence(Ordering::SeqCst);
}

// Loom has no store buffers to flush: a sequentially consistent swap/read is
// the model of "plain access + the barrier pair".
#[inline(always)]
pub(super) fn plain_store(a: &AtomicU64, v: u64) {
    if cfg!(loom) {
        a.swap(v, Ordering::SeqCst);
    } else {
        a.store(v, Ordering::Relaxed);
    }
}

#[inline(always)]
pub(super) fn plain_load_ptr<T>(a: &AtomicPtr<T>) -> *mut T {
    if cfg!(loom) {
        a.fetch_update(Ordering::SeqCst, Ordering::SeqCst, Some).unwrap_or_else(|p| p)
    } else {
        a.load(Ordering::Relaxed)
    }
}

/// LN5's store of null into a slot's `ptr`.
pub(crate) fn null_ptr<R: Registrar>(s: &LaneSlot<R>) {
    if cfg!(loom) {
        s.ptr.swap(std::ptr::null_mut(), Ordering::SeqCst);
    } else {
        s.ptr.store(std::ptr::null_mut(), Ordering::Relaxed);
    }
}
