//! The per-entry state word: lease count, INVALID, PENDING and incarnation
//! (spec.md#A-H, A0).
//!
//! One `AtomicU64` per entry:
//!
//! | bits | what |
//! |---|---|
//! | 0..40 | the lease count (10¹² leases: more than memory holds lease slots for) |
//! | 40..61 | the *incarnation*: a number the pool gives each use of an entry's memory ([`super::entry_pool`]), modulo 2²¹ |
//! | 61 | PENDING: the entry is not findable yet (A9 publishes it) |
//! | 62 | handle-gone (only the P3 fault switch sets it: the handle was already deregistered; test builds only) |
//! | 63 | INVALID: the entry left the index |
//!
//! Three operations race on it without the cache lock:
//!
//! - a release ([`EntryState::release`], spec.md#R1) decrements; it owns the
//!   deregistration iff it took the count from 1 to 0 with INVALID set;
//! - an invalidation ([`EntryState::invalidate`], under the exclusive lock)
//!   sets INVALID with one `fetch_or`; it owns the deregistration iff the count
//!   it saw was 0.
//!
//! - A0's lease ([`EntryState::try_acquire_seen`], spec.md#A0): a
//!   compare-exchange from a word it read, which must be findable (neither
//!   INVALID nor PENDING), to the same word plus one lease.
//!
//! All are single read-modify-writes on the same word, so they are totally
//! ordered: if the OR comes first the release sees INVALID (and the OR saw a
//! count ≥ 1); if the decrement comes first the OR sees 0. Exactly one of
//! them owns the deregistration (spec.md#P4). Leases are otherwise *added*
//! under the lock (shared, spec.md#A1, or exclusive, A3/A8/A9) to entries that
//! are in the index, hence never INVALID: invalidation needs the lock
//! exclusive. A0's compare-exchange succeeds only on the word it read, so
//! only while the entry is in the index: a word that is findable was
//! published by A9 after the insert and has not been ORed INVALID since,
//! and the incarnation tells the same memory's next entry from this one.
//!
//! `AcqRel` (or stronger) on both sides makes the owner see every write made
//! to the entry by the other party before it frees it.

use crate::sync::{AtomicU64, Ordering};

/// Lease count, flags and incarnation of one cache entry (spec.md#A-H, A0).
#[derive(Debug)]
//= spec.md#S5.1
#[repr(transparent)]
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
    /// Not findable yet: A0 must not lease it (A9 publishes it).
    pub const PENDING: u64 = 1 << 61;
    pub const COUNT_MASK: u64 = (1 << 40) - 1;
    const INCARNATION_SHIFT: u32 = 40;
    const INCARNATION_MASK: u64 = ((1 << 21) - 1) << Self::INCARNATION_SHIFT;

    /// A findable entry with `leases` leases (tests).
    pub fn new(leases: u64) -> Self {
        EntryState { word: AtomicU64::new(leases & Self::COUNT_MASK) }
    }

    /// A9's new entry with `leases` leases, not findable until
    /// [`Self::publish`].
    pub fn pending(leases: u64) -> Self {
        EntryState { word: AtomicU64::new(Self::PENDING | leases & Self::COUNT_MASK) }
    }

    /// A state made from [`Self::with_incarnation`]'s word (the pool).
    pub(super) fn from_word(word: u64) -> Self {
        EntryState { word: AtomicU64::new(word) }
    }

    /// The word of a state not shared yet (the pool).
    pub(super) fn initial_word(&self) -> u64 {
        self.word.load(Ordering::Relaxed)
    }

    /// `word` with incarnation `n` (its low 21 bits). A wrap is harmless to
    /// A0's answers: A0 checks the key again under its lease, so a
    /// compare-exchange that lands on a later entry of the same memory
    /// whose word happens to be equal hands out that entry only if it has
    /// the request's key (then it is the right answer: spec.md#A0), and
    /// otherwise gives the lease back. The incarnation makes that give-back
    /// need 2²¹ reuses of one entry's memory within one A0.
    pub(super) fn with_incarnation(word: u64, n: u64) -> u64 {
        word & !Self::INCARNATION_MASK | (n << Self::INCARNATION_SHIFT) & Self::INCARNATION_MASK
    }

    /// The pool reuses the memory of a freed entry: its word, INVALID since
    /// its last owner freed it, becomes `word` (a new incarnation, PENDING).
    /// Release: the entry's other fields, written before, go with it (A0
    /// reads the key after an Acquire load of the word).
    pub(super) fn reincarnate(&self, word: u64) {
        debug_assert!(word & Self::PENDING != 0, "a reused entry findable before A9 publishes it");
        self.word.store(word, Ordering::Release);
    }

    //= spec.md#A9
    //# it becomes findable to A0 (its PENDING mark cleared) only after the
    //# displacement, and only if A9 does not take it out at once
    /// A9: the new entry is in the index and stays there: A0 may lease it.
    /// A plain store, not a read-modify-write: nothing else changes the
    /// word before this (A9 holds its only lease, it is in no lane, an
    /// invalidation needs the lock exclusive, which A9 holds, and A0's
    /// compare-exchange fails on a PENDING word). Release: the entry's
    /// fields (and the index insert) before it, for A0's Acquire load.
    #[inline]
    pub fn publish(&self) {
        let w = self.word.load(Ordering::Relaxed);
        debug_assert_eq!(w & (Self::PENDING | Self::INVALID), Self::PENDING, "publish of a findable or invalidated entry");
        self.word.store(w & !Self::PENDING, Ordering::Release);
    }

    /// Takes a lease. Only on a findable entry, under the cache lock.
    #[inline]
    pub fn acquire(&self) {
        // Relaxed: the lock orders this against invalidation; a later release
        // of this lease is program-ordered after it.
        let prev = self.word.fetch_add(1, Ordering::Relaxed);
        debug_assert_eq!(prev & (Self::INVALID | Self::PENDING), 0, "lease taken on an invalidated or unpublished entry");
        // The count never carries into the incarnation bits (10¹² leases).
        debug_assert!(prev & Self::COUNT_MASK < Self::COUNT_MASK, "lease count overflow");
    }

    /// A0's first read: the word a lease may then be taken from
    /// ([`Self::try_acquire_seen`]). Acquire: pairs with the Release of
    /// [`Self::publish`] and of the pool's reuse store, so the key read after it
    /// is the one of the incarnation this word names (or, if the memory was
    /// reused meanwhile, the compare-exchange fails).
    #[inline(always)]
    pub fn seen(&self) -> u64 {
        self.word.load(Ordering::Acquire)
    }

    /// The incarnation bits of a word (module docs), for the eviction order's
    /// candidates ([`super::evict_order::Candidate`]).
    #[inline(always)]
    pub(super) fn incarnation_bits(word: u64) -> u64 {
        word & Self::INCARNATION_MASK
    }

    /// Whether `word` is the word of a findable entry (neither INVALID nor
    /// PENDING) of incarnation `bits` ([`Self::incarnation_bits`]). Read
    /// under the lock exclusive, that is "this incarnation is in the index":
    /// A9 inserts and publishes, and every removal from the index sets
    /// INVALID, under one hold of the lock exclusive; the pool reuses memory
    /// under it too (a new incarnation, PENDING).
    #[inline(always)]
    pub(super) fn findable_incarnation(word: u64, bits: u64) -> bool {
        word & (Self::INVALID | Self::PENDING | Self::INCARNATION_MASK) == bits
    }

    /// Whether `seen` is a findable entry's word that can take one more lease.
    #[inline(always)]
    pub fn leasable(seen: u64) -> bool {
        seen & (Self::INVALID | Self::PENDING) == 0 && seen & Self::COUNT_MASK < Self::COUNT_MASK
    }

    //= spec.md#A0
    //# compare-exchange its state word from the word read to the same word
    //# with one more lease
    /// A0's lease: succeeds only if the word is still `seen` (a
    /// [`Self::leasable`] word), that is, the same incarnation, still
    /// findable. Acquire on success: the key is checked again after it,
    /// on an entry this lease now keeps alive.
    #[inline(always)]
    pub fn try_acquire_seen(&self, seen: u64) -> bool {
        debug_assert!(Self::leasable(seen));
        self.word.compare_exchange(seen, seen + 1, Ordering::Acquire, Ordering::Relaxed).is_ok()
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

    //= spec.md#A5
    //# with one compare-exchange of its state word from unleased to INVALID
    /// The trim's removal (S2.8): sets INVALID only if the entry has no
    /// lease, in one compare-exchange, so that a lease A0 took since the
    /// trim's note keeps its entry (as every lease does); `true`: this
    /// thread owns the deregistration. At most two rounds: the word moves
    /// under the lock exclusive only by A0's leases (the count is then
    /// above 0) and not at all by releases (none at count 0).
    #[inline]
    pub fn invalidate_unleased(&self) -> bool {
        let mut w = self.word.load(Ordering::Relaxed);
        loop {
            if w & (Self::COUNT_MASK | Self::INVALID) != 0 {
                return false;
            }
            // AcqRel, as `invalidate`.
            match self.word.compare_exchange(w, w | Self::INVALID, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(now) => w = now,
            }
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    //= spec.md#A0 type=test
    //= spec.md#A9 type=test
    /// A0's compare-exchange takes a lease only from the word it read, and
    /// only from a findable one: not before A9 publishes, not once INVALID,
    /// not on the next incarnation of the same memory, even at the same
    /// count.
    #[test]
    fn a0_leases_only_the_findable_incarnation_it_read() {
        let s = EntryState::from_word(EntryState::with_incarnation(EntryState::pending(1).initial_word(), 7));
        assert!(!EntryState::leasable(s.seen()), "a PENDING entry is not findable yet");
        s.publish();
        let seen = s.seen();
        assert!(EntryState::leasable(seen));
        assert!(s.try_acquire_seen(seen));
        assert_eq!(s.leases(), 2);
        assert!(!s.try_acquire_seen(seen), "a word that moved since it was read");
        assert_eq!(s.release(), Released::Held);
        assert_eq!(s.release(), Released::Unleased);
        let seen = s.seen();
        assert_eq!(s.invalidate(0), Invalidated::Owner);
        assert!(!s.try_acquire_seen(seen), "an entry taken out of the index");
        assert!(!EntryState::leasable(s.seen()));
        // The memory is reused: a new incarnation with the old count.
        s.reincarnate(EntryState::with_incarnation(EntryState::pending(0).initial_word(), 8));
        s.publish();
        assert_eq!(s.seen() & EntryState::COUNT_MASK, seen & EntryState::COUNT_MASK);
        assert!(!s.try_acquire_seen(seen), "a word of the memory's last incarnation");
        assert_eq!(s.leases(), 0);
    }

    /// The incarnation never spills into the count or the flags, and wraps.
    #[test]
    fn incarnations_stay_in_their_bits() {
        for n in [0, 1, (1 << 21) - 1, 1 << 21, u64::MAX] {
            let w = EntryState::with_incarnation(EntryState::PENDING | 5, n);
            assert_eq!(w & EntryState::COUNT_MASK, 5);
            assert_eq!(w & (EntryState::INVALID | EntryState::PENDING), EntryState::PENDING);
        }
        assert_eq!(EntryState::with_incarnation(0, 1 << 21), EntryState::with_incarnation(0, 0), "wraps");
    }

    /// A lease taken by A0 is an ordinary lease for the handoff (A-H): an
    /// invalidation after it leaves the deregistration to its release.
    #[test]
    fn an_a0_lease_hands_the_deregistration_to_its_release() {
        let s = EntryState::new(0);
        let seen = s.seen();
        assert!(s.try_acquire_seen(seen));
        assert_eq!(s.invalidate(0), Invalidated::Leased);
        assert_eq!(s.release(), Released::Owner { handle_gone: false });
    }
}
