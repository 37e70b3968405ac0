//! The mutants: deliberately broken variants of the §A algorithm. Each one's
//! name, description and the properties that catch it are written once, in
//! the table below. A leaf module: it depends only on the property names.

use crate::props::{L1, LINEARIZABLE, P1, P2, P3, P4, P5, P6};
use std::fmt;

macro_rules! mutants {
    ($($(#[doc = $doc:literal])* $v:ident = $name:literal, $desc:literal, &[$($p:ident),+];)*) => {
        /// A deliberately broken variant of the §A algorithm. Each must be caught by
        /// the property [`Mutant::caught_by`] names.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Mutant {
            $($(#[doc = $doc])* $v,)*
        }

        impl Mutant {
            /// Every mutant, in the order of their numbers (`--mutant N`).
            pub const ALL: [Mutant; <[()]>::len(&[$(mutants!(@unit $v)),*])] = [$(Mutant::$v),*];

            /// The name `--mutant` takes.
            pub fn name(&self) -> &'static str {
                match self {
                    $(Mutant::$v => $name,)*
                }
            }

            /// One line for listings.
            pub fn description(&self) -> &'static str {
                match self {
                    $(Mutant::$v => $desc,)*
                }
            }

            /// The properties (names from [`crate::props`]) whose counterexample
            /// catches this mutant; the first is the one the pinned configuration hits.
            pub fn caught_by(&self) -> &'static [&'static str] {
                match self {
                    $(Mutant::$v => &[$($p),+],)*
                }
            }
        }
    };
    (@unit $v:ident) => {
        ()
    };
}

mutants! {
    /// 1. A7 is skipped: a registration is inserted although a release event
    ///    overlapping it was applied while it was being registered (libfabric,
    ///    Open MPI: peers.md §3 items 1, 3).
    NoSeqRecheck = "no-seq-recheck", "A7 skipped: a registration invalidated while it was made is inserted", &[P2, LINEARIZABLE];
    /// 2. H2 blocks on the lock instead of trying it; a release event raised
    ///    on a thread that holds the lock (the cache freeing its own memory)
    ///    waits for itself (libfabric memhooks, peers.md Q6).
    BlockingHook = "blocking-hook", "H2 blocks on the lock instead of try-locking", &[P6];
    /// 3. A-D deregisters leased entries at once instead of setting INVALID.
    DeregLeasedOnInvalidate = "dereg-leased-on-invalidate", "A-D deregisters leased entries at once", &[P3];
    /// 4. The uffd monitor reads and applies events without the lock, and A2/A6
    ///    do not read pending events.
    AsyncApplyOutsideLock = "async-apply-outside-lock", "uffd events read and applied outside the lock; A2/A6 do not read", &[P2];
    /// 5. A-D leaves leased entries findable (MVAPICH2 dreg, peers.md §3 item 7).
    LeasedStaysFindable = "leased-stays-findable", "A-D leaves leased entries findable (MVAPICH2 dreg)", &[P2];
    /// 6. A-D invalidates only entries that start at the released address.
    PartialUnmapStartOnly = "partial-unmap-start-only", "A-D invalidates only entries starting at the released address", &[P2];
    /// 7. A merge (A9) deregisters the displaced registration although it is leased.
    MergeDropsLeased = "merge-drops-leased", "a merge deregisters a displaced registration that is leased", &[P3];
    /// 8. Events a hook queued while the lock was busy are not drained by the
    ///    holder before it unlocks (nor by a fast-path reader after it unlocks):
    ///    they wait for a later slow path, which may never come (MVAPICH2
    ///    `delayed_buf_region`, peers.md §3 item 9).
    QueueNeverDrained = "queue-never-drained", "the lock holder never drains events queued while it held the lock", &[L1];
    /// 9. The uffd monitor reads events with a blocking read outside the lock,
    ///    then takes the lock and applies them.
    AsyncBlockingReadOutsideLock = "async-blocking-read-outside-lock", "uffd monitor reads outside the lock, then locks and applies", &[P2];
    /// 10. A-H split in two: invalidation sets INVALID, then reads the lease
    ///     count in a separate step (Open MPI `add_to_gc`, peers.md §3 item 5).
    HandoffToctou = "handoff-toctou", "A-H: set INVALID, then read the lease count in a separate step", &[P4];
    /// 11. A lookup ignores access rights (libfabric's hit rule, peers.md Q9).
    HitIgnoresAccess = "hit-ignores-access", "lookups ignore access rights", &[P1];
    /// 12. R2 is missing: a release that leaves an evictable entry while the
    ///     cache is over a limit does not evict (UCX: eviction only on a miss).
    NoReleaseEviction = "no-release-eviction", "R2 missing: releases never evict", &[P5];
    /// 13. A6 notes the lease counts without raising the over-limit flag,
    ///     which A10 raises afterwards, so a release in between is neither
    ///     noted nor sees the flag, and skips R2.
    OverLimitFlagLate = "over-limit-flag-late", "A10 raises the over-limit flag after scanning the lease counts", &[P5];
    /// 14. The monitor is told before the frames change (a hook that runs
    ///     before munmap, as Open MPI's patcher does; uffd REMOVE, which the
    ///     kernel delivers before it zaps the pages).
    NotifyBeforeRelease = "notify-before-release", "the monitor learns of a release before the frames change", &[P2];
    /// 15. A9 displaces what A4 planned, without re-planning under the lock:
    ///     entries inserted or removed while the lock was dropped are missed.
    StaleMergePlan = "stale-merge-plan", "A9 displaces the entries A4 planned, without re-planning", &[LINEARIZABLE];
    /// 16. R1 does not touch the LRU stamp, although S2.2 makes a released
    ///     entry the most recently used: evictions pick other victims than the
    ///     contract's.
    ReleaseNoLruTouch = "release-no-lru-touch", "R1 does not touch the LRU stamp", &[LINEARIZABLE];
    /// 17. Half of mutant 8: the exclusive holder does not drain before it
    ///     unlocks (a fast-path reader still does).
    HolderSkipsDrain = "holder-skips-drain", "the exclusive holder does not drain the queue before it unlocks", &[L1];
    /// 18. The other half: a fast-path reader that unlocks with events queued
    ///     does not try the lock to drain them (the holder still does).
    ReaderSkipsDrain = "reader-skips-drain", "a fast-path reader leaves events queued while it held the lock", &[L1];
    /// 19. R1 decrements first and touches the LRU stamp afterwards: an
    ///     eviction in between sees an unleased entry with its old stamp.
    ReleaseTouchAfterDecrement = "release-touch-after-decrement", "R1 touches the LRU stamp after its decrement", &[LINEARIZABLE];
    /// 20. The pressure trim (S5.4) evicts leased entries too: a lease's
    ///     registration is deregistered under it.
    TrimEvictsLeased = "trim-evicts-leased", "the ENOMEM trim evicts leased entries too", &[P3];
    /// 21. LN5's heavy barrier is a full fence on the revoking thread only (no
    ///     membarrier): a lane hit's `held + 1` still in its store buffer is
    ///     not seen by the count read, while its reload of `ptr` ran before
    ///     the null store (the store-buffering litmus test).
    LaneNoHeavyBarrier = "lane-no-heavy-barrier", "LN5 fences only the revoking thread (no membarrier)", &[P3];
    /// 22. LN1 does not reload `ptr` after its store of `held + 1`: a revoke
    ///     between LN1's first load and its store is missed.
    LaneNoRecheck = "lane-no-recheck", "LN1 does not reload ptr after storing held + 1", &[P3];
    /// 23. LN5 nulls the slots and runs the heavy barrier but pins nothing.
    LaneRevokeNoPin = "lane-revoke-no-pin", "LN5 does not pin slots whose count is above 0", &[P3];
    /// 24. LN2 memoizes into a slot that still counts a lane lease: the lease's
    ///     entry is no longer in any slot, so its revoke pins nothing.
    LaneReuseBusySlot = "lane-reuse-busy-slot", "LN2 memoizes into a slot that still counts a lane lease", &[P3];
    /// 25. LN4 reads the slot's count and pin without the lanes mutex: it can
    ///     run between LN5's count read and its pin, and the pin is never
    ///     returned.
    LaneDetachedNoMutex = "lane-detached-no-mutex", "LN4 runs without the lanes mutex", &[L1];
    /// 26. LN1 checks only the invalidation queue's length, which the drain
    ///     empties when it takes the events, before it revokes (and the uffd
    ///     monitor reads events, waking the releasing threads, before it
    ///     revokes): a lane hit between the two returns an entry whose release
    ///     event has already returned.
    LaneQueueLenOnly = "lane-queue-len-only", "LN1 checks only the queue length, emptied before the drain revokes", &[P2];
}

impl Mutant {
    pub fn number(&self) -> usize {
        Mutant::ALL.iter().position(|m| m == self).expect("listed") + 1
    }

    /// The mutant breaks the lanes (LN1–LN6): it needs `CheckConfig::lanes`.
    pub fn needs_lanes(&self) -> bool {
        matches!(
            self,
            Mutant::LaneNoHeavyBarrier
                | Mutant::LaneNoRecheck
                | Mutant::LaneRevokeNoPin
                | Mutant::LaneReuseBusySlot
                | Mutant::LaneDetachedNoMutex
                | Mutant::LaneQueueLenOnly
        )
    }
}

impl std::str::FromStr for Mutant {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let wanted = s.trim().replace('_', "-");
        if let Ok(n) = wanted.parse::<usize>() {
            if (1..=Mutant::ALL.len()).contains(&n) {
                return Ok(Mutant::ALL[n - 1]);
            }
        }
        Mutant::ALL.iter().copied().find(|m| m.name() == wanted).ok_or_else(|| {
            let names: Vec<&str> = Mutant::ALL.iter().map(|m| m.name()).collect();
            format!("unknown mutant `{s}` (expected a number 1-{} or one of: {})", Mutant::ALL.len(), names.join(", "))
        })
    }
}

impl fmt::Display for Mutant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
