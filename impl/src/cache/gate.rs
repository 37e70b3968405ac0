//! The event gate (spec.md#M6): what a hit of a cache attached to the
//! process's monitor checks, so that the monitor's reader never has to take
//! the cache's lock. Plain data (layer 1): one process-wide clock and, per
//! generation, the clock value its cache has applied.
//!
//! The reader thread (`crate::monitor::process`) is the clock's one writer:
//! - before each `read()` of the userfaultfd it stores `2p + 1` (odd:
//!   *reading*), where `p` counts the events it has published so far;
//! - after it has published the `k` events that read returned (in the
//!   event ring), it stores `2(p + k)` (even).
//!
//! A releasing thread is woken inside that `read()`, after the odd store.
//! So any acquire that begins after the release returned sees the clock odd,
//! or at a value that counts the release's event (coherence, through the
//! kernel's wake-up and whatever ordered the acquire after the release).
//!
//! Invariants:
//! - A generation's `applied` is [`UNGATED`] (no monitor delivers to it) or
//!   an even clock value `2q`: every event of the first `q` published has
//!   been applied to it (A-D, M3). It is stored only under the cache lock
//!   exclusive, after the events are applied (Release).
//! - A hit (A0, LN1, A1, A3, A8) on a gated generation happens only while
//!   [`Gate::current`] holds: the clock is even and equal to `applied`.
//!   Otherwise the acquire takes the lock exclusive and drains (A2), which
//!   waits out an odd clock (the reader waits on nothing, so it ends).

use crate::sync::plain::AtomicU64;
use crate::sync::Ordering;

/// `applied` of a generation no monitor gates.
pub(crate) const UNGATED: u64 = u64::MAX;

/// The process's event clock (module docs): written by the monitor's reader
/// thread only, read by every gated hit.
pub static EVENT_CLOCK: AtomicU64 = AtomicU64::new(0);

/// Whether a clock value is odd: the reader is inside a `read()`, whose
/// events are not yet published.
#[inline(always)]
pub fn reading(clock: u64) -> bool {
    clock & 1 == 1
}

/// One generation's position against [`EVENT_CLOCK`].
pub(crate) struct Gate {
    applied: AtomicU64,
}

impl Gate {
    pub(crate) const fn new() -> Self {
        Gate { applied: AtomicU64::new(UNGATED) }
    }

    /// Whether a hit may be served now (module docs). One load for an
    /// ungated generation; two for a gated one.
    #[inline(always)]
    pub(crate) fn current(&self) -> bool {
        // Acquire: pairs with the Release store in `set`, so the removals
        // and revokes of the events counted in `applied` are visible to the
        // lookup that follows.
        let applied = self.applied.load(Ordering::Acquire);
        // Acquire: a clock value read here is at least the odd store that
        // preceded the read which woke any release this acquire follows.
        applied == UNGATED || applied == EVENT_CLOCK.load(Ordering::Acquire)
    }

    /// Whether a monitor gates this generation's hits.
    pub(crate) fn is_gated(&self) -> bool {
        self.applied.load(Ordering::Relaxed) != UNGATED
    }

    /// Records that every event up to `mark` (an even clock value, or
    /// [`UNGATED`]) has been applied. Call under the cache lock exclusive,
    /// after applying them.
    pub(crate) fn set(&self, mark: u64) {
        debug_assert!(mark == UNGATED || !reading(mark), "an odd clock value marked as applied");
        // Release: the applied events' effects happen before a hit that
        // reads this mark (see `current`).
        self.applied.store(mark, Ordering::Release);
    }
}
