//! The checker's mutants: deliberately broken variants of spec.md §A, each
//! with its name, what it breaks and the property that must catch it, once.
//!
//! A leaf module: it depends on the property names ([`crate::props`]) and on
//! the shared list of mutant names (`mrcache_types::mutants::MUTANTS`), not on
//! the rest of the checker. How a configuration is adjusted so that a mutant
//! can show is `Mutant::adjust` (config.rs); where each one breaks the
//! algorithm, the `mutant(Mutant::…)` checks of algo/.

use crate::props::{L1, LINEARIZABLE, P1, P2, P3, P4, P5, P6};
use mrcache_types::mutants::MUTANTS;
use std::fmt;

/// Declares the mutants: variant, docs, description and the properties that
/// catch it, in the order of [`MUTANTS`] (their names).
macro_rules! mutants {
    ($($(#[doc = $doc:literal])* $v:ident: $desc:literal, [$($p:ident),+];)+) => {
        /// A deliberately broken variant of the §A algorithm. Each must be caught by
        /// the property [`Mutant::caught_by`] names.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Mutant {
            $($(#[doc = $doc])* $v,)+
        }

        impl Mutant {
            /// Every mutant, in the order of [`MUTANTS`].
            pub const ALL: [Mutant; MUTANTS.len()] = [$(Mutant::$v),+];

            /// One line: what the mutant breaks.
            pub fn description(&self) -> &'static str {
                match self {
                    $(Mutant::$v => $desc,)+
                }
            }

            /// The properties (names from [`crate::props`]) whose counterexample
            /// catches this mutant; the first is the one the pinned configuration hits.
            pub fn caught_by(&self) -> &'static [&'static str] {
                match self {
                    $(Mutant::$v => &[$($p),+],)+
                }
            }
        }
    };
}

mutants! {
    /// A7 is skipped: a registration is inserted although a release event
    /// overlapping it was applied while it was being registered (libfabric,
    /// Open MPI: peers.md §3 items 1, 3).
    NoSeqRecheck: "A7 skipped: a registration invalidated while it was made is inserted", [P2, LINEARIZABLE];
    /// H2 blocks on the lock instead of trying it; a release event raised
    /// on a thread that holds the lock (the cache freeing its own memory)
    /// waits for itself (libfabric memhooks, peers.md Q6).
    BlockingHook: "H2 blocks on the lock instead of try-locking", [P6];
    /// A-D deregisters leased entries at once instead of setting INVALID.
    DeregLeasedOnInvalidate: "A-D deregisters leased entries at once", [P3];
    /// The uffd monitor reads and applies events without the lock, and A2/A6
    /// do not read pending events.
    AsyncApplyOutsideLock: "uffd events read and applied outside the lock; A2/A6 do not read", [P2];
    /// A-D leaves leased entries findable (MVAPICH2 dreg, peers.md §3 item 7).
    LeasedStaysFindable: "A-D leaves leased entries findable (MVAPICH2 dreg)", [P2];
    /// A-D invalidates only entries that start at the released address.
    PartialUnmapStartOnly: "A-D invalidates only entries starting at the released address", [P2];
    /// A merge (A9) deregisters the displaced registration although it is leased.
    MergeDropsLeased: "a merge deregisters a displaced registration that is leased", [P3];
    /// Events a hook queued while the lock was busy are not drained by the
    /// holder before it unlocks (nor by a fast-path reader after it unlocks):
    /// they wait for a later slow path, which may never come (MVAPICH2
    /// `delayed_buf_region`, peers.md §3 item 9).
    QueueNeverDrained: "the lock holder never drains events queued while it held the lock", [L1];
    /// The uffd monitor reads events with a blocking read outside the lock,
    /// then takes the lock and applies them.
    AsyncBlockingReadOutsideLock: "uffd monitor reads outside the lock, then locks and applies", [P2];
    /// A-H split in two: invalidation sets INVALID, then reads the lease
    /// count in a separate step (Open MPI `add_to_gc`, peers.md §3 item 5).
    HandoffToctou: "A-H: set INVALID, then read the lease count in a separate step", [P4];
    /// A lookup ignores access rights (libfabric's hit rule, peers.md Q9).
    HitIgnoresAccess: "lookups ignore access rights", [P1];
    /// R2 is missing: a release that leaves an evictable entry while the
    /// cache is over a limit does not evict (UCX: eviction only on a miss).
    NoReleaseEviction: "R2 missing: releases never evict", [P5];
    /// A10, still over a limit after its pass, raises the over-limit flag
    /// without noting again: a release after A6's note is neither noted
    /// nor sees the flag, and skips R2.
    OverLimitFlagLate: "the over-limit flag raised only when A10 ends over, without a second note", [P5];
    /// A6/R2's prefix note stops one entry before it covers the excess:
    /// A10 cannot evict enough, and the cache stays over its limit with an
    /// unleased entry.
    NoteOneShort: "A6/R2 note one unleased entry fewer than the excess needs", [P5];
    /// The monitor is told before the frames change (a hook that runs
    /// before munmap, as Open MPI's patcher does; uffd REMOVE, which the
    /// kernel delivers before it zaps the pages).
    NotifyBeforeRelease: "the monitor learns of a release before the frames change", [P2];
    /// A9 displaces what A4 planned, without re-planning under the lock:
    /// entries inserted or removed while the lock was dropped are missed.
    StaleMergePlan: "A9 displaces the entries A4 planned, without re-planning", [LINEARIZABLE];
    /// R1 does not touch the LRU stamp, although S2.2 makes a released
    /// entry the most recently used: evictions pick other victims than the
    /// contract's.
    ReleaseNoLruTouch: "R1 does not touch the LRU stamp", [LINEARIZABLE];
    /// Half of `queue-never-drained`: the exclusive holder does not drain before it
    /// unlocks (a fast-path reader still does).
    HolderSkipsDrain: "the exclusive holder does not drain the queue before it unlocks", [L1];
    /// The other half: a fast-path reader that unlocks with events queued
    /// does not try the lock to drain them (the holder still does).
    ReaderSkipsDrain: "a fast-path reader leaves events queued while it held the lock", [L1];
    /// R1 decrements first and touches the LRU stamp afterwards: an
    /// eviction in between sees an unleased entry with its old stamp.
    ReleaseTouchAfterDecrement: "R1 touches the LRU stamp after its decrement", [LINEARIZABLE];
    /// The pressure trim (S5.4) evicts leased entries too: a lease's
    /// registration is deregistered under it.
    TrimEvictsLeased: "the ENOMEM trim evicts leased entries too", [P3];
    TrimReadsThenOrs: "the ENOMEM trim reads an entry's lease count, then ORs INVALID in a later step (A0 may lease it between)", [P3];
    /// LN5's heavy barrier is a full fence on the revoking thread only (no
    /// membarrier): a lane hit's `held + 1` still in its store buffer is
    /// not seen by the count read, while its reload of `ptr` ran before
    /// the null store (the store-buffering litmus test).
    LaneNoHeavyBarrier: "LN5 fences only the revoking thread (no membarrier)", [P3];
    /// LN1 does not reload `ptr` after its store of `held + 1`: a revoke
    /// between LN1's first load and its store is missed.
    LaneNoRecheck: "LN1 does not reload ptr after storing held + 1", [P3];
    /// LN5 nulls the slots and runs the heavy barrier but pins nothing.
    LaneRevokeNoPin: "LN5 does not pin slots whose count is above 0", [P3];
    /// LN2 memoizes into a slot that still counts a lane lease: the lease's
    /// entry is no longer in any slot, so its revoke pins nothing.
    LaneReuseBusySlot: "LN2 memoizes into a slot that still counts a lane lease", [P3];
    /// LN4 reads the slot's count and pin without the lanes mutex: it can
    /// run between LN5's count read and its pin, and the pin is never
    /// returned.
    LaneDetachedNoMutex: "LN4 runs without the lanes mutex", [L1];
    /// LN1 checks only the invalidation queue's length, which the drain
    /// empties when it takes the events, before it revokes (and the uffd
    /// monitor reads events, waking the releasing threads, before it
    /// revokes): a lane hit between the two returns an entry whose release
    /// event has already returned.
    LaneQueueLenOnly: "LN1 checks only the queue length, emptied before the drain revokes", [P2];
    /// W1's event leaves the overlapping entries findable (it only marks
    /// in-flight records stale): an entry that pinned the released frames
    /// is hit after the release returned.
    BeginKeepsEntries: "W1's event leaves overlapping entries findable", [P2];
    /// W1's event does not mark in-flight records stale: a registration
    /// planned before it, whose registrar call pinned the frames about to
    /// go, is cached once the window has closed.
    BeginKeepsInflight: "W1's event does not mark in-flight records stale", [P2];
    /// W3 ignored: A7 and A9 treat a windowed registration as any other, so
    /// one planned inside the window, which pinned the frames the release
    /// then took away, is cached.
    WindowedCached: "A7/A9 ignore W3: a registration planned inside a release window is cached", [P2];
    /// W2 closes the oldest open window, whatever its range: another
    /// thread's window closes before its release, and a registration
    /// planned then is cached with the frames that release takes away.
    EndClosesOldest: "W2 closes the oldest open window, not the one on its range", [P2];
    /// A7 lets a windowed record through although its window has closed
    /// (A9 then serves it uncached): safe, but the acquire takes effect
    /// after the window, where the contract caches it.
    WindowedServedAfterEnd: "A7 serves a windowed registration uncached after its window closed", [LINEARIZABLE];
    /// W1 queues its event first and opens the window only after its H2:
    /// a registration planned between the event's drain and the opening is
    /// neither stale nor windowed, pins the frames about to go, and is
    /// cached.
    WindowAfterQueue: "W1 opens the window after its event is queued and drained", [P2];
    /// A6/R2 read a noted entry's lease count without revoking its lane
    /// slots (LN5): a lane lease the state word does not count goes unseen,
    /// and A10 evicts an entry another thread holds.
    NoteSkipsRevoke: "A6/R2 note an entry without revoking its lane slots", [LINEARIZABLE];
    /// M3 missing: a REMOVE (madvise) read from userfaultfd is applied as a
    /// plain event (A-D only), with no window: a registration planned after
    /// the read and before the zap pins the frames about to go and is cached
    /// (spec.md#S7.4 (b)).
    RemoveWithoutWindow: "a REMOVE read from uffd is applied as a plain event, no window (M3 missing)", [P2];
    /// M5/M6 broken: each event the shared monitor publishes is applied by
    /// the first attached cache only; the other caches' drains skip it but
    /// set their gate: one keeps a registration of the released frames and
    /// hits it after the release returned (spec.md#S7.6).
    EventToOneCache: "a shared monitor's event is applied by one cache only; the others' drains skip it (M5, M6)", [P2];
    /// The over-limit flag and the second note come in a second pass after
    /// A9's insert, with a drain of their own (the algorithm before
    /// 2026-12-05): a release the first note saw leased reads the flag clear
    /// and returns, its thread's munmap of the new entry is queued, and the
    /// second pass notes the release, drains the munmap (back within the
    /// limit) and keeps the released entry, which the contract evicts
    /// (spec.md#A10).
    FlagAtSecondPass: "the over-limit flag, a second note and a drain after A9 (not in A6)", [LINEARIZABLE];
    /// M3 broken for a shared monitor: every cache's drain applies a
    /// REMOVE from the ring (A-D), but only the first cache's opens its
    /// window; the other caches a registration planned between the drain
    /// and the zap, which pins the frames about to go (spec.md#S7.6, S7.4 (b)).
    RemoveWindowOneCache: "a shared monitor's REMOVE opens its window (M3) in one cache only (M5, M6)", [P2];
    /// A0's compare-exchange succeeds on an entry that left the index since
    /// A0 read it (it ignores INVALID): a lease on a registration that is
    /// being deregistered (spec.md#A0).
    LocklessTakesRemoved: "A0's compare-exchange ignores INVALID: it leases a removed entry", [P3];
    /// A0 checks only the queue's length, not the draining count: a drain
    /// has taken a munmap's event off the queue and revokes before it
    /// applies it, the munmap returns, and the releasing thread's next
    /// acquire hits the stale entry without a lock (spec.md#A0).
    LocklessSkipsDraining: "A0 checks only the queue length, not the draining count", [P2];
    /// An acquire that skipped A1 takes itself for one whose A1 missed with
    /// nothing inserted since, and skips the lookups of A3 and A8 (as the
    /// cache may then): a request a findable entry covers is registered and
    /// cached again (spec.md#A1).
    A1SkipWithoutLookup: "an acquire that skipped A1 skips the lookups of A3 and A8", [LINEARIZABLE];
    /// M6's gate skipped: A0 and A1 (LN1 too, in the cache) hit a cache the
    /// process's monitor delivers to without checking that it applied every
    /// event published and that no read is in progress: a release woken by
    /// the reader returns, and an acquire on another cache, whose drain has
    /// not come yet, hits the registration of the released frames
    /// (spec.md#M6).
    HitWithoutGate: "A0/A1 hit without checking the gate (M6)", [P2];
    /// A drain (A2, A6, a service round) does not wait out an odd clock: it
    /// applies what is published and sets its gate while the reader has read
    /// an event (and woken its releasing thread) but not yet published it;
    /// A3's lookup after A2 then hits the released frames (spec.md#M6).
    /// (Under merge, with two threads on one cache, the stale entry may
    /// instead be merged into a new registration: linearizability.)
    DrainIgnoresReading: "a drain does not wait out a read in progress (odd clock, M6)", [P2, LINEARIZABLE];
    /// The service round sets every attached cache's gate as it starts,
    /// before it locks each cache and applies the events to it (M5, M6): a
    /// hit on a cache the round has not reached passes the gate with the
    /// event unapplied. (Inside one critical section the order would be
    /// masked by the lock and the draining count.)
    GateBeforeApply: "the service round sets every cache's gate before it applies the events to each (M5, M6)", [P2];
    /// The state word's lease count saturates at 2 (a narrow field that
    /// sticks at its maximum): a third concurrent lease on one entry is not
    /// counted, the releases take the count to 0 while a lease is still
    /// held, and A-H then deregisters the entry under that lease. It needs
    /// three threads on one entry and an event after their grants: the
    /// generated 3 x 4 scripts, which no pinned configuration reaches; the
    /// swarm catches it ([`mod@crate::swarm`], [`Mutant::swarm_only`]).
    LeaseCountSaturates: "the lease count saturates at 2: a third concurrent lease is not counted", [P3];
    /// LN1 takes the memo of the request's slot without comparing the
    /// slot's key (a direct-mapped lane: another key that hashes to the
    /// same slot left its memo there): a lease on an entry that does not
    /// cover the request.
    LaneHitIgnoresKey: "LN1 takes the slot's memo without comparing its key (a colliding key's entry)", [P1, LINEARIZABLE];
    /// A lane lease released on a thread that does not hold the lane's
    /// claim stores `held − 1` as the owner does (a plain read and store)
    /// instead of adding 1 to `remote`: the owner's `held + 1` of a lane hit
    /// between the two is lost, the revoke counts 0 under that hit's lease
    /// and pins nothing.
    LaneRemoteWritesHeld: "a release on a thread that does not hold the lane stores held - 1 (not remote + 1)", [P3];
    /// A release decides that it is the lane's owner by having taken the
    /// lease, not by holding the lane's claim now: after a claim given back
    /// (MAX_CLAIMS, or the thread's exit) and taken by another thread, the
    /// old owner's plain store of `held − 1` races the new owner's.
    LaneReleaseByAcquirer: "a release takes itself for the lane's owner because it took the lease (the claim moved since)", [P3];
    /// With R1's atomics as steps (`CheckConfig::release_steps`): R1 loads
    /// the over-limit flag before its decrement. A miss over the limit
    /// between them raises the flag, finds the entry still leased and
    /// leaves the cache over; the release's count then reaches 0 under a
    /// flag it read clear, and nothing evicts the entry.
    ReleaseFlagBeforeDecrement: "R1 loads the over-limit flag before its decrement", [P5];
    /// The kdreg2 model's hit does not check the entry's generation word
    /// (libfabric's `valid` callback skipped): after a munmap whose
    /// notifier changed the generation, and before the evictor applied the
    /// event, the releasing thread's next acquire hits the registration of
    /// the frames it released. Run on `kdreg2-wait`, which otherwise holds
    /// on the kdreg2 scripts.
    Kdreg2HitSkipsGeneration: "the kdreg2 model's hit skips the generation check", [P2];
    /// With A11's post-unlock drain in rounds (`CheckConfig::drain_rounds`):
    /// one round only. A hook whose try-lock failed against that round's
    /// lock left its event to the holder, which returns without checking
    /// the queue again: the event stays queued.
    DrainOneRound: "A11's post-unlock drain runs one round: a hook's event queued during it stays queued", [L1];
    /// With M4 as the proof's steps (`CheckConfig::proof_steps`): a thread
    /// that may be inside the madvise counts as out once it was signalled,
    /// without its acknowledgement: the window closes while the madvising
    /// thread is still inside, before its zap.
    ProofWithoutAck: "M4 closes a REMOVE window once it signalled every thread that may be inside, without their acknowledgements", [P2];
    /// With M4 as the proof's steps: a thread inside a system call (asleep
    /// or running in the kernel) is judged blocked elsewhere, as an
    /// io_uring worker inside madvise once was: the madvising thread is
    /// never waited for.
    ProofKernelOutside: "M4 judges a thread inside the kernel (in the madvise) as outside it", [P2];
    /// With A3's skip (`CheckConfig::lookup_skips`): A1 reads the index's
    /// insert counter after it unlocks, not under the lock its lookup
    /// missed under. An entry inserted between the unlock and the read is
    /// counted as seen, A3 skips its lookup, and the request is registered
    /// and cached a second time.
    A1CountAfterUnlock: "A1 reads the insert counter after its unlock: A3 skips a lookup that would hit", [LINEARIZABLE];
    /// With A8's skip: A4 reads the insert counter after it unlocks. An
    /// entry inserted between the unlock and the read is counted as seen,
    /// A8 skips its lookup, and A9 caches the request a second time.
    A4CountAfterUnlock: "A4 reads the insert counter after its unlock: A8 skips a lookup that would hit", [LINEARIZABLE];
    /// With the memo (`CheckConfig::memo`): A0 takes a word with PENDING
    /// set for a findable one. The memo names memory freed and reused by a
    /// windowed miss for an entry of the same key, which A9 inserts and
    /// takes out at once (W3); A0's compare-exchange between the two leases
    /// that registration, planned inside a release window, after the
    /// release returned (spec.md#A0, A9).
    LocklessTakesPending: "A0 ignores PENDING: it leases an entry A9 inserts and takes out at once (W3)", [P2];
    /// With the memo: A0 compares no key, before or after its
    /// compare-exchange: the slot of the request's first page names the
    /// entry of another request there (another span or access).
    LocklessIgnoresKey: "A0 compares no key: it leases the entry the memo's slot names for another request", [P1, LINEARIZABLE];
    /// With the memo: A0 does not check the key again after its
    /// compare-exchange. The memory it read was reused twice since (the
    /// model's incarnation is one bit: it stands for 2^21 reuses), now for
    /// another key, and the compare-exchange leases that entry.
    LocklessNoKeyRecheck: "A0 does not check the key after its compare-exchange (the incarnation wrapped)", [P1, LINEARIZABLE];
    /// W1 stores the windows' open count after its event is queued and
    /// drained (not with the window, under the mutex): a registration
    /// planned between reads the count 0, skips the mutex, is not windowed,
    /// pins the frames about to go and is cached (spec.md#W3).
    WindowCountAfterQueue: "W1 stores the open-window count after its event is queued: A4 reads 0 and skips the windows", [P2];
    /// No use restamps an entry, only its creation stamps it (the cache's
    /// fault switch of the same name): evictions follow creation order,
    /// not the contract's least recent use.
    LruSkipsRestamp: "no use restamps an entry's LRU stamp, only its creation stamps it", [LINEARIZABLE];
    /// With `CheckConfig::restamp_skip`: the skip also takes a stamp one use
    /// older than the clock for the most recent: another entry was used
    /// since, and the skipped restamp was needed to order this use after it.
    RestampSkipWhenRecent: "the restamp skip also skips a stamp one use older than the clock", [LINEARIZABLE];
    FlushKeepsLeased: "the flush leaves leased entries findable", [LINEARIZABLE, P5];
    FlushDeregsLeased: "the flush deregisters leased entries at once", [P3];
    InflightUnaligned: "A4's in-flight record covers the request, not its chunk-aligned registration", [P2];
    GdsIgnoresPriority: "cost-aware eviction chooses its victims in LRU order, ignoring their priorities", [LINEARIZABLE];
    GdsFloorNotRaised: "cost-aware eviction does not raise the floor to the victim's priority", [LINEARIZABLE];
    HullDropsQueued: "a push on a full queue replaces its contents by its own event, not by the hull (L2)", [P2];
    ForkKeepsGeneration: "a fork child keeps the parent's generation: its lock (held by a thread gone), entries and queue (F1)", [P2, P6, L1];
    /// LN1 undoes its count after a reload of null although the revoke
    /// pinned the entry for it: a note (A6) that read the pin as a lease
    /// spared the entry over the limit, and the lookup then misses, so a
    /// later hit on the spared entry has no linearization (it needs a third
    /// thread whose release invalidates the entry meanwhile).
    LaneUndoDespitePin: "LN1 undoes its count after a revoke that pinned the entry for it", [LINEARIZABLE];
}

impl Mutant {
    /// The mutant's name (`mrcache check --mutant NAME`), from the shared list.
    pub fn name(&self) -> &'static str {
        MUTANTS[*self as usize]
    }

    /// The mutant breaks the release windows (W1–W3): it needs `CheckConfig::pair`.
    pub fn needs_pair(&self) -> bool {
        matches!(
            self,
            Mutant::BeginKeepsEntries
                | Mutant::BeginKeepsInflight
                | Mutant::WindowedCached
                | Mutant::EndClosesOldest
                | Mutant::WindowedServedAfterEnd
                | Mutant::WindowAfterQueue
                | Mutant::WindowCountAfterQueue
        )
    }

    /// The mutant breaks M3/M4: it needs `CheckConfig::remove` (async monitor).
    pub fn needs_remove(&self) -> bool {
        matches!(self, Mutant::RemoveWithoutWindow | Mutant::RemoveWindowOneCache | Mutant::ProofWithoutAck | Mutant::ProofKernelOutside)
    }

    /// The mutant needs a configuration past exhaustive checking (3 threads x
    /// 4 ops): its test and `mrcache check --mutant` catch it with the swarm.
    pub fn swarm_only(&self) -> bool {
        self.swarm_seed().is_some()
    }

    /// For a swarm-only mutant, the seed whose search (the swarm's default
    /// options, `mrcache check --mutant NAME --swarm --seed S --searches 1`)
    /// catches it. A swarm from seed 0 on this machine's 2 cores reaches it
    /// in about 10 s, after 25 searches that miss it.
    pub fn swarm_seed(&self) -> Option<u64> {
        match self {
            Mutant::LeaseCountSaturates => Some(25),
            _ => None,
        }
    }

    /// The mutant breaks M5 or M6: it needs two caches on one monitor.
    pub fn needs_caches(&self) -> bool {
        matches!(
            self,
            Mutant::EventToOneCache
                | Mutant::RemoveWindowOneCache
                | Mutant::HitWithoutGate
                | Mutant::DrainIgnoresReading
                | Mutant::GateBeforeApply
        )
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
                | Mutant::NoteSkipsRevoke
                | Mutant::LocklessSkipsDraining
                | Mutant::LaneHitIgnoresKey
                | Mutant::LaneRemoteWritesHeld
                | Mutant::LaneReleaseByAcquirer
                | Mutant::LaneUndoDespitePin
        )
    }
}

impl std::str::FromStr for Mutant {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let wanted = s.trim().replace('_', "-");
        Mutant::ALL
            .iter()
            .copied()
            .find(|m| m.name() == wanted)
            .ok_or_else(|| format!("unknown mutant `{s}` (expected one of: {})", MUTANTS.join(", ")))
    }
}

impl fmt::Display for Mutant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
