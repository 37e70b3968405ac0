//! The per-entry state word: lease count and INVALID bit (spec.md#A-H).
//!
//! One `AtomicU64` per entry. Bits 0..62 count leases, bit 63 is INVALID (the
//! entry left the index), bit 62 is the handle-gone bit (only the P3 fault
//! switch sets it: the handle was already deregistered; it exists in test
//! builds only). Two operations race on it without the cache lock:
//!
//! - a release ([`EntryState::release`], spec.md#R1) decrements; it owns the
//!   deregistration iff it took the count from 1 to 0 with INVALID set;
//! - an invalidation ([`EntryState::invalidate`], under the exclusive lock)
//!   sets INVALID with one `fetch_or`; it owns the deregistration iff the count
//!   it saw was 0.
//!
//! Both are single read-modify-writes on the same word, so they are totally
//! ordered: if the OR comes first the release sees INVALID (and the OR saw a
//! count ≥ 1); if the decrement comes first the OR sees 0. Exactly one of
//! them owns the deregistration (spec.md#P4). Leases are only *added* under
//! the lock (shared, spec.md#A1, or exclusive, A3/A8/A9) to entries that are in
//! the index, hence never INVALID: invalidation needs the lock exclusive.
//!
//! `AcqRel` (or stronger) on both sides makes the owner see every write made
//! to the entry by the other party before it frees it.

use crate::sync::{AtomicU64, Ordering};

/// Lease count + INVALID bit of one cache entry (spec.md#A-H).
#[derive(Debug)]
//= spec.md#S5.1
pub struct EntryState {
    word: AtomicU64,
}

/// What a release did (spec.md#R1, R2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// Other leases remain.
    Held,
    /// The count reached 0 on a findable entry: it is now evictable (R2).
    Unleased,
    /// The count reached 0 with INVALID set: this thread deregisters (R1).
    /// `handle_gone`: a fault already deregistered the handle; only free.
    Owner { handle_gone: bool },
}

/// What an invalidation did (spec.md#A-D, A-H).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalidated {
    /// No lease: the invalidating thread deregisters.
    Owner,
    /// Leased: the last release will deregister (spec.md#S5.3).
    Leased,
}

impl EntryState {
    pub const INVALID: u64 = 1 << 63;
    #[cfg(any(test, feature = "faults"))]
    pub const HANDLE_GONE: u64 = 1 << 62;
    pub const COUNT_MASK: u64 = (1 << 62) - 1;

    /// A findable entry with `leases` leases.
    pub fn new(leases: u64) -> Self {
        EntryState { word: AtomicU64::new(leases & Self::COUNT_MASK) }
    }

    /// Takes a lease. Only on a findable entry, under the cache lock.
    #[inline]
    pub fn acquire(&self) {
        // Relaxed: the lock orders this against invalidation; a later release
        // of this lease is program-ordered after it.
        let prev = self.word.fetch_add(1, Ordering::Relaxed);
        debug_assert_eq!(prev & Self::INVALID, 0, "lease taken on an invalidated entry");
        // The count never wraps into the flag bits.
        debug_assert!(prev & Self::COUNT_MASK < Self::COUNT_MASK, "lease count overflow");
    }

    //= spec.md#R1
    /// Gives a lease back.
    #[inline]
    pub fn release(&self) -> Released {
        // SeqCst (AcqRel would do for the handoff): pairs with the SeqCst
        // over-limit flag of spec.md#R2/A10, so that either this release sees
        // the flag or the evicting thread sees the count at 0.
        let prev = self.word.fetch_sub(1, Ordering::SeqCst);
        debug_assert_ne!(prev & Self::COUNT_MASK, 0, "release of an unleased entry");
        if prev & Self::COUNT_MASK != 1 {
            Released::Held
        } else if prev & Self::INVALID != 0 {
            Released::Owner { handle_gone: Self::handle_gone(prev) }
        } else {
            Released::Unleased
        }
    }

    //= spec.md#A-H
    /// Marks the entry INVALID (it left the index). `extra` may add
    /// the handle-gone bit (test builds only).
    #[inline]
    pub fn invalidate(&self, extra: u64) -> Invalidated {
        let prev = self.word.fetch_or(Self::INVALID | Self::extra(extra), Ordering::AcqRel);
        debug_assert_eq!(prev & Self::INVALID, 0, "entry invalidated twice");
        if prev & Self::COUNT_MASK == 0 {
            Invalidated::Owner
        } else {
            Invalidated::Leased
        }
    }

    /// Whether the handle-gone bit is set in `word` (never, in a production
    /// build).
    #[cfg(any(test, feature = "faults"))]
    fn handle_gone(word: u64) -> bool {
        word & Self::HANDLE_GONE != 0
    }
    #[cfg(not(any(test, feature = "faults")))]
    fn handle_gone(_word: u64) -> bool {
        false
    }

    /// The bits `invalidate` may set besides INVALID: none in a production
    /// build.
    #[cfg(any(test, feature = "faults"))]
    fn extra(extra: u64) -> u64 {
        extra & Self::HANDLE_GONE
    }
    #[cfg(not(any(test, feature = "faults")))]
    fn extra(_extra: u64) -> u64 {
        0
    }

    /// Current lease count (SeqCst, see [`EntryState::release`]).
    #[inline]
    pub fn leases(&self) -> u64 {
        self.word.load(Ordering::SeqCst) & Self::COUNT_MASK
    }

    pub fn is_invalid(&self) -> bool {
        self.word.load(Ordering::Acquire) & Self::INVALID != 0
    }
}
