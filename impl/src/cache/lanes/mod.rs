//! Lanes: the lock-free hit path of spec.md LN1–LN6.
//!
//! Each thread claims, per cache generation, one [`Lane`]: a direct-mapped
//! table of memo slots keyed by (page span, access). A hit on a memoized key
//! (LN1) stores the slot's `held + 1` with a plain store, runs the *light*
//! barrier (a compiler fence) and re-reads the slot's `ptr`: no lock and no
//! atomic read-modify-write. The revoking side (LN5: under the cache lock
//! exclusive and the lanes mutex) nulls `ptr`, runs the *heavy* barrier
//! (`membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`: every running thread of
//! the process executes a full barrier), then reads the count; a slot still
//! counting leases gets a *pin*, one lease on the entry's state word, which
//! the last release returns (LN4). So the entry's A-H handoff is unchanged.
//!
//! Invariants:
//! - `held` is written only by the thread holding the lane's claim; other
//!   threads that release a lane lease add to `remote` (an atomic add).
//! - A slot's `ptr` is set non-null only by its owner under the cache lock
//!   shared (LN2), and nulled only under the lock exclusive (LN5): the two never
//!   race. A slot is re-keyed only when its count is 0 and it has no pin.
//! - A non-null `pin` is one lease on that entry's state word.
//! - `Entry::memoized` is set before any slot points to the entry (under the
//!   shared lock), so a revoke that sees it clear scans nothing.
//!
//! Under `--cfg loom` the plain store/load pair and the barriers are modelled
//! by sequentially consistent swaps and reads (loom has no membarrier): the
//! same protocol with the barrier's effect made explicit.
//!
//! The files, bottom up (layer 2 of [`crate::cache`]; none knows the cache):
//! `barriers` (the light and heavy barriers, over [`crate::cache::os`]'s
//! membarrier), `claims` (a lane's claim and each thread's claim list),
//! `slots` (slots, lanes and a generation's lanes) and `protocol` (the owner's
//! side of LN1–LN3). The cache's side (LN1, LN3–LN5 as `Cache` methods) is
//! `lane_steps.rs`, a step-group file above the generation.

mod barriers;
mod claims;
mod protocol;
mod slots;

pub(crate) use barriers::{heavy_barrier, null_ptr};
pub use barriers::{init_barriers, uses_membarrier};
pub(crate) use protocol::{dry_skip, keep_if_pinned, memoize, owns, release, try_hit, worth_probing, LaneHit, LaneReleased};
pub(crate) use slots::{Lane, LaneRef, Lanes, A1_MISS_STREAK};

/// Lanes per cache generation: threads beyond it use A1 only.
#[cfg(not(loom))]
pub const MAX_LANES: usize = 64;
#[cfg(loom)]
pub const MAX_LANES: usize = 2;
