//! What to check: the scripts the application threads run, the monitor, the
//! overlap policy, the optional nested release events, the limits, and the
//! mutant (a deliberately broken variant of §A).

pub use crate::mutant::Mutant;
use mrcache_model::OverlapPolicy;
use mrcache_types::{Access, LeaseId, Op, Range, ReleaseKind, PAGE_SIZE};
use std::fmt;

/// Pages the checker's address space may use (scripts + the cache's private page).
pub const MAX_PAGES: u8 = 32;

/// Which monitor tells the cache about release events (spec.md#S1.8, S7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum MonitorKind {
    /// A hook in the releasing thread: H1 then H2 (spec.md#S3.9, S7.2).
    #[default]
    Sync,
    /// userfaultfd: the releasing thread sleeps until the monitor thread *reads*
    /// the event; the monitor applies it (M1, M2; spec.md#S3.8, S7.3).
    Async,
    /// A model of HPE's kdreg2 kernel module as libfabric drives it (a peer's
    /// monitor, not one of spec.md's): the notifier runs in the releasing
    /// thread after the frames changed and only *tries* the module's mutex;
    /// holding it, it changes the generation word of every monitored range
    /// the release overlaps and queues one event; finding it busy, it leaves
    /// the range to a kernel worker and returns. A hit also checks the
    /// entry's generation word; an evictor thread reads the queue (under
    /// the module's mutex) and applies each event under the cache lock.
    Kdreg2,
    /// [`MonitorKind::Kdreg2`] with a notifier that *waits* for the
    /// module's mutex instead of deferring (what the module's blocking path,
    /// `kdreg2_destroy_range_lock`, does): no worker.
    Kdreg2Wait,
}

impl MonitorKind {
    /// spec.md's monitors (the kdreg2 models are a peer's, judged apart).
    pub const ALL: [MonitorKind; 2] = [MonitorKind::Sync, MonitorKind::Async];
    pub fn name(&self) -> &'static str {
        match self {
            MonitorKind::Sync => "sync",
            MonitorKind::Async => "async",
            MonitorKind::Kdreg2 => "kdreg2",
            MonitorKind::Kdreg2Wait => "kdreg2-wait",
        }
    }

    /// One of the kdreg2 models.
    pub fn is_kdreg2(&self) -> bool {
        matches!(self, MonitorKind::Kdreg2 | MonitorKind::Kdreg2Wait)
    }
}

impl std::str::FromStr for MonitorKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sync" | "hook" => Ok(MonitorKind::Sync),
            "async" | "uffd" | "userfaultfd" => Ok(MonitorKind::Async),
            "kdreg2" => Ok(MonitorKind::Kdreg2),
            "kdreg2-wait" => Ok(MonitorKind::Kdreg2Wait),
            _ => Err(format!("unknown monitor `{s}` (expected sync, async, kdreg2 or kdreg2-wait)")),
        }
    }
}

impl fmt::Display for MonitorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Mutant {
    /// Makes `cfg` able to exhibit the mutant: the monitor, policy, nested
    /// events or limits it needs. Returns what was changed, for messages.
    pub fn adjust(&self, cfg: &mut CheckConfig) -> Vec<String> {
        let mut changed = Vec::new();
        match self {
            Mutant::BlockingHook | Mutant::HolderSkipsDrain if cfg.cache_frees.is_none() => {
                cfg.cache_frees = Some(CacheFrees::Private);
                changed.push("the cache frees its own memory under its lock (--cache-frees private)".into());
            }
            Mutant::AsyncApplyOutsideLock | Mutant::AsyncBlockingReadOutsideLock if cfg.monitor != MonitorKind::Async => {
                cfg.monitor = MonitorKind::Async;
                changed.push("--monitor async".into());
            }
            Mutant::MergeDropsLeased | Mutant::StaleMergePlan if cfg.policy != OverlapPolicy::Merge => {
                cfg.policy = OverlapPolicy::Merge;
                changed.push("--policy merge".into());
            }
            Mutant::NoReleaseEviction | Mutant::OverLimitFlagLate | Mutant::NoteOneShort
                if cfg.max_regions.is_none() && cfg.max_pinned_bytes.is_none() =>
            {
                cfg.max_regions = Some(1);
                changed.push("--max-regions 1".into());
            }
            Mutant::LeaseCountSaturates if cfg.scripts.is_none() && (cfg.threads < 3 || cfg.ops < 4) => {
                cfg.threads = cfg.threads.max(3);
                cfg.ops = cfg.ops.max(4);
                changed.push(format!("{} threads x {} ops (three leases on one entry)", cfg.threads, cfg.ops));
            }
            Mutant::TrimEvictsLeased if cfg.registrar_failures == 0 => {
                cfg.registrar_failures = 1;
                changed.push("one registrar failure (ENOMEM: the trim)".into());
            }
            Mutant::TrimReadsThenOrs if cfg.scripts.is_none() => {
                cfg.registrar_failures = cfg.registrar_failures.max(1);
                cfg.lockless = true;
                cfg.max_regions = None;
                cfg.max_pinned_bytes = None;
                cfg.scripts = Some(trim_scripts());
                changed.push(
                    "--lockless, one registrar failure and the trim scripts (T0: acquire A, release, acquire A, release; T1: acquire B, release; T1's registrar fails with ENOMEM)"
                        .into(),
                );
            }
            Mutant::ReleaseFlagBeforeDecrement if !cfg.release_steps || !cfg.has_limits() => {
                cfg.release_steps = true;
                if !cfg.has_limits() {
                    cfg.max_regions = Some(1);
                }
                changed.push("--release-steps --max-regions 1".into());
            }
            Mutant::DrainOneRound if !cfg.drain_rounds || cfg.lanes || cfg.cache_frees.is_none() => {
                cfg.drain_rounds = true;
                cfg.lanes = false;
                cfg.monitor = MonitorKind::Sync;
                if cfg.cache_frees.is_none() {
                    cfg.cache_frees = Some(CacheFrees::Private);
                }
                changed.push("--drain-rounds --monitor sync --cache-frees private".into());
            }
            Mutant::LruSkipsRestamp | Mutant::RestampSkipWhenRecent if cfg.scripts.is_none() => {
                cfg.restamp_skip = true;
                cfg.scripts = Some(lru_scripts());
                cfg.max_regions = Some(2);
                changed.push(
                    "--restamp-skip, the LRU scripts (T0: acquire A, acquire B, release B, release A; T1: acquire C, acquire A, munmap A) and --max-regions 2"
                        .into(),
                );
            }
            Mutant::ReleaseNoLruTouch | Mutant::ReleaseTouchAfterDecrement if cfg.scripts.is_none() => {
                cfg.scripts = Some(lru_scripts());
                cfg.max_regions = Some(2);
                changed.push(
                    "the LRU scripts (T0: acquire A, acquire B, release B, release A; T1: acquire C, acquire A, munmap A) and --max-regions 2"
                        .into(),
                );
            }
            Mutant::LaneNoHeavyBarrier | Mutant::LaneNoRecheck | Mutant::LaneRevokeNoPin | Mutant::LaneDetachedNoMutex
                if cfg.scripts.is_none() =>
            {
                cfg.lanes = true;
                cfg.scripts = Some(lane_scripts());
                changed.push(
                    "--lanes and the lane scripts (T0: acquire A, release, acquire A, release; T1: acquire A, release, munmap A)".into(),
                );
            }
            Mutant::LaneQueueLenOnly if cfg.scripts.is_none() => {
                cfg.lanes = true;
                cfg.scripts = Some(lane_drain_scripts());
                changed.push(
                    "--lanes and the drain scripts (T0: acquire A, release, acquire B; T1: acquire A, release, munmap A, acquire A)".into(),
                );
            }
            Mutant::LaneHitIgnoresKey if cfg.scripts.is_none() => {
                cfg.lanes = true;
                cfg.lane_slots = 2;
                cfg.scripts = Some(lane_collide_scripts());
                changed.push("--lanes --lane-slots 2 and the collision scripts (T0: acquire A, release, acquire C, release; T1: acquire A, acquire C, munmap A; A and C share a slot)".into());
            }
            Mutant::LaneRemoteWritesHeld if cfg.scripts.is_none() => {
                cfg.lanes = true;
                cfg.scripts = Some(lane_remote_scripts());
                changed.push("--lanes and the remote-release scripts (T0: acquire A, release, acquire A (L2, handed to T1), acquire A; T1: acquire A, release, release L2, munmap A)".into());
            }
            Mutant::LaneReleaseByAcquirer if cfg.scripts.is_none() => {
                cfg.lanes = true;
                cfg.give_backs = 2;
                cfg.scripts = Some(lane_claim_scripts());
                changed.push("--lanes --give-backs 2 and the claim scripts (T0: acquire A, release, acquire A, release; T1: acquire A, release, acquire B, acquire A, munmap A)".into());
            }
            Mutant::LaneReuseBusySlot if cfg.scripts.is_none() => {
                cfg.lanes = true;
                cfg.scripts = Some(lane_reuse_scripts());
                changed.push(
                    "--lanes and the slot-reuse scripts (T0: acquire A, release, acquire A, acquire B; T1: acquire A, release, acquire B, munmap A)"
                        .into(),
                );
            }
            Mutant::NoteSkipsRevoke if cfg.scripts.is_none() => {
                cfg.lanes = true;
                cfg.scripts = Some(lane_note_scripts());
                cfg.max_regions = Some(1);
                changed.push(
                    "--lanes, the note scripts (T0: acquire A, release, acquire A, release; T1: acquire A, release, acquire B, release, acquire A) and --max-regions 1"
                        .into(),
                );
            }
            Mutant::LaneUndoDespitePin if cfg.scripts.is_none() => {
                cfg.lanes = true;
                let mut scripts = lane_note_scripts();
                scripts.push(default_scripts(3, 1).swap_remove(2));
                cfg.scripts = Some(scripts);
                cfg.max_regions = Some(1);
                cfg.policy = OverlapPolicy::Independent;
                cfg.monitor = MonitorKind::Sync;
                changed.push(
                    "--lanes, the note scripts with a third thread (T0: acquire A, release, acquire A, release; T1: acquire A, release, acquire B, release, acquire A; T2: madvise A), --max-regions 1, --policy independent --monitor sync"
                        .into(),
                );
            }
            Mutant::LocklessTakesRemoved if cfg.scripts.is_none() => {
                cfg.lockless = true;
                cfg.max_regions = None;
                cfg.max_pinned_bytes = None;
                cfg.scripts = Some(lane_drain_scripts());
                changed.push(
                    "--lockless, no limits and the drain scripts (T0: acquire A, release, acquire B; T1: acquire A, release, munmap A, acquire A)"
                        .into(),
                );
            }
            Mutant::A1SkipWithoutLookup => {
                cfg.skip_a1 = true;
                changed.push("--skip-a1".into());
                if !cfg.has_limits() {
                    cfg.max_regions = Some(1);
                    changed.push("--max-regions 1".into());
                }
            }
            Mutant::A1CountAfterUnlock | Mutant::A4CountAfterUnlock if cfg.scripts.is_none() => {
                cfg.lookup_skips = true;
                cfg.scripts = Some(lookup_scripts());
                changed.push("--lookup-skips and the lookup scripts (T0: munmap A, acquire A; T1: acquire A)".into());
            }
            Mutant::LocklessTakesPending if cfg.scripts.is_none() => {
                cfg.lockless = true;
                cfg.memo = true;
                cfg.pair = true;
                cfg.monitor = MonitorKind::Sync;
                cfg.max_regions = None;
                cfg.max_pinned_bytes = None;
                cfg.scripts = Some(memo_pending_scripts());
                changed.push("--lockless --memo --pair --monitor sync, no limits and the PENDING scripts (T0: acquire A, release, acquire A; T1: acquire A, release, munmap A, acquire A)".into());
            }
            Mutant::LocklessIgnoresKey if !cfg.memo => {
                cfg.lockless = true;
                cfg.memo = true;
                cfg.max_regions = None;
                cfg.max_pinned_bytes = None;
                changed.push("--lockless --memo, no limits".into());
            }
            Mutant::LocklessNoKeyRecheck if cfg.scripts.is_none() => {
                cfg.lockless = true;
                cfg.memo = true;
                cfg.max_regions = None;
                cfg.max_pinned_bytes = None;
                cfg.scripts = Some(memo_reuse_scripts());
                changed.push("--lockless --memo, no limits and the reuse scripts (T0: acquire A, release, acquire A, release, acquire A; T1: munmap A, acquire C, release, munmap C, acquire B; B is A's first page)".into());
            }
            Mutant::LocklessSkipsDraining if cfg.scripts.is_none() => {
                cfg.lockless = true;
                cfg.lanes = true;
                cfg.scripts = Some(lane_drain_scripts());
                changed.push(
                    "--lockless --lanes and the drain scripts (T0: acquire A, release, acquire B; T1: acquire A, release, munmap A, acquire A)"
                        .into(),
                );
            }
            Mutant::WindowedServedAfterEnd if cfg.scripts.is_none() => {
                cfg.scripts = Some(window_closed_scripts());
                changed.push("the closed-window scripts (T0: munmap A, acquire B, acquire A; T1: acquire A)".into());
            }
            Mutant::ProofWithoutAck | Mutant::ProofKernelOutside => {
                if cfg.scripts.is_none() {
                    cfg.scripts = Some(remove_scripts());
                }
                cfg.caches = 1;
                cfg.proof_steps = true;
                changed.push("--proof-steps and the REMOVE scripts (T0: madvise A, acquire A; T1: acquire A)".into());
            }
            Mutant::RemoveWithoutWindow if cfg.scripts.is_none() => {
                cfg.scripts = Some(remove_scripts());
                changed.push("the REMOVE scripts (T0: madvise A, acquire A; T1: acquire A)".into());
            }
            Mutant::EventToOneCache | Mutant::HitWithoutGate | Mutant::DrainIgnoresReading | Mutant::GateBeforeApply => {
                if cfg.scripts.is_none() {
                    cfg.scripts = Some(shared_monitor_scripts());
                }
                cfg.caches = 2;
                cfg.monitor = MonitorKind::Async;
                cfg.lanes = false;
                cfg.pair = false;
                cfg.remove = false;
                changed.push("--caches 2 --monitor async and the shared-monitor scripts (T0 on cache 0: acquire A, release, munmap A; T1 on cache 1: acquire A, release, acquire A)".into());
            }
            Mutant::FlagAtSecondPass if cfg.scripts.is_none() => {
                cfg.scripts = Some(limit_event_scripts());
                cfg.max_regions = Some(1);
                changed.push(
                    "the limit-event scripts (T0: acquire A, release, munmap B; T1: acquire B, acquire A) and --max-regions 1".into(),
                );
            }
            Mutant::RemoveWindowOneCache => {
                if cfg.scripts.is_none() {
                    cfg.scripts = Some(shared_remove_scripts());
                }
                cfg.caches = 2;
                cfg.monitor = MonitorKind::Async;
                cfg.lanes = false;
                cfg.pair = false;
                cfg.remove = true;
                changed.push("--caches 2 --monitor async --remove and the shared REMOVE scripts (T0 on cache 0: madvise A, acquire A; T1 on cache 1: acquire A, release, acquire A)".into());
            }
            Mutant::Kdreg2HitSkipsGeneration => {
                if cfg.scripts.is_none() {
                    cfg.scripts = Some(kdreg2_scripts());
                    changed.push(format!("the kdreg2 scripts ({})", KDREG2_SCRIPTS));
                }
                cfg.monitor = MonitorKind::Kdreg2Wait;
                cfg.lanes = false;
                cfg.lockless = false;
                changed.push("--monitor kdreg2-wait".into());
            }
            Mutant::InflightUnaligned if cfg.scripts.is_none() || cfg.chunk_pages < 2 => {
                if cfg.scripts.is_none() {
                    cfg.scripts = Some(chunk_scripts());
                }
                cfg.chunk_pages = 2;
                changed.push(
                    "--chunk-pages 2 and the chunk scripts (T0: acquire p[0,1), release, acquire p[1,2); T1: munmap p[1,2), acquire p[1,3), release)".into(),
                );
            }
            Mutant::GdsIgnoresPriority | Mutant::GdsFloorNotRaised if cfg.scripts.is_none() || !cfg.cost_aware => {
                if cfg.scripts.is_none() {
                    cfg.scripts = Some(cost_scripts());
                    cfg.max_regions = Some(2);
                }
                cfg.cost_aware = true;
                changed.push("--cost-aware, the cost scripts (T0: X, Y, W, V and X again, each acquired and released; T1: acquire Y, release) and --max-regions 2".into());
            }
            Mutant::ForkKeepsGeneration if cfg.scripts.is_none() => {
                cfg.scripts = Some(fork_scripts());
                cfg.monitor = MonitorKind::Sync;
                changed.push("--monitor sync and the fork scripts (T0: acquire A, fork, release A, acquire A, release; T1: acquire B, release, munmap B)".into());
            }
            Mutant::HullDropsQueued if cfg.scripts.is_none() || cfg.max_unreleased == 0 => {
                if cfg.scripts.is_none() {
                    cfg.scripts = Some(hull_scripts());
                }
                cfg.max_unreleased = 1;
                changed.push("--max-unreleased 1 and the hull scripts (T0: acquire B, acquire D, release B, acquire A; T1: acquire A, release, munmap A, munmap C)".into());
            }
            Mutant::FlushKeepsLeased | Mutant::FlushDeregsLeased if cfg.scripts.is_none() => {
                cfg.scripts = Some(flush_scripts());
                changed.push("the flush scripts (T0: acquire A, flush, release A, acquire B; T1: acquire B, release, munmap B)".into());
            }
            Mutant::EndClosesOldest if cfg.scripts.is_none() => {
                cfg.scripts = Some(window_scripts());
                changed.push("the window scripts (T0: munmap A, acquire B; T1: munmap B, acquire B)".into());
            }
            _ => {}
        }
        if self.needs_pair() && !cfg.pair {
            cfg.pair = true;
            cfg.monitor = MonitorKind::Sync;
            changed.push("--pair (the hook runs before the release: W1, the release, W2)".into());
        }
        if self.needs_remove() && !cfg.remove {
            cfg.remove = true;
            cfg.pair = false;
            cfg.lanes = false;
            cfg.monitor = MonitorKind::Async;
            changed.push("--monitor async --remove (script releases are madvise REMOVEs: M3, M4)".into());
        }
        if self.needs_lanes() && !cfg.lanes {
            cfg.lanes = true;
            changed.push("--lanes".into());
        }
        changed
    }
}

/// Where the cache's own memory lives when it frees it under its lock (A9).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CacheFrees {
    /// A page of its own, never cached and not watched by userfaultfd.
    Private,
    /// An application page (the allocator gave back a page that also held
    /// registered user buffers), watched by userfaultfd like every app page.
    AppPage(u8),
}

/// One configuration of the checker.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CheckConfig {
    /// Application threads (ignored when `scripts` is set).
    pub threads: usize,
    /// Operations per thread (ignored when `scripts` is set).
    pub ops: usize,
    pub policy: OverlapPolicy,
    pub monitor: MonitorKind,
    /// The registrar frees this page while it registers (A5), at most once per run.
    pub registrar_frees: Option<u8>,
    /// The cache frees its own memory while it holds the lock (A9), at most once per run.
    pub cache_frees: Option<CacheFrees>,
    /// Registrar failures per run (0–2): an acquire's first fails with ENOMEM
    /// and trims (S5.4, A5); a failure after its trim is EINVAL (E5).
    pub registrar_failures: u8,
    pub max_regions: Option<u64>,
    pub max_pinned_bytes: Option<u64>,
    /// A7's bound on registration attempts (spec default 4).
    pub max_retries: u8,
    pub mutant: Option<Mutant>,
    /// Explicit scripts (acquire, release, release_event, flush and fork ops only).
    pub scripts: Option<Vec<Vec<Op>>>,
    /// Model the per-thread lanes (LN1–LN6) under x86-TSO: one memo slot per
    /// thread, store buffers, the light and heavy barriers, the lanes mutex.
    pub lanes: bool,
    /// Model A0, the lock-free hit (without limits only): an acquire may
    /// start with it (a lane may skip a memo, so the choice is free), its
    /// read and its compare-exchange two steps with anything between.
    pub lockless: bool,
    /// With limits, an acquire may skip A1 (straight to A2; spec.md#A1).
    pub skip_a1: bool,
    /// With limits, a use does not restamp an entry whose LRU stamp is the
    /// clock's (the most recent use), as the cache's touch skips it
    /// (spec.md#S6.3). Without it, every use takes a new stamp.
    pub restamp_skip: bool,
    /// With `lockless`: A0 reads the hit memo's slot for the request (the
    /// entry memory A1's last hit for a request on that first page named),
    /// the state word of whatever entry that memory holds now (PENDING,
    /// INVALID, a one-bit incarnation), the key, then compare-exchanges and
    /// checks the key again; A9 takes entry memory freed earlier, and
    /// publishes a new entry (clears PENDING) a step after its insert.
    /// Without it, A0's read is the canonical lookup.
    pub memo: bool,
    /// A3 and A8 skip their lookups while the index's insert counter is the
    /// one read when the acquire's last lookup missed (A1's, or A3's at A4),
    /// as the cache does (spec.md#A3, A8). Without it, both always look up.
    pub lookup_skips: bool,
    /// With limits, R1 takes the cache's atomics as steps of their own
    /// (spec.md#R1): the LRU touch, the decrement, the over-limit flag's
    /// load; other threads act between them. Without it, R1 is one step.
    pub release_steps: bool,
    /// A11's post-unlock drain as the cache runs it (spec.md#A11, H2, A1):
    /// after an operation's last exclusive section (or its A1 hit) the
    /// thread unlocks, and only then, in steps of its own, checks the
    /// queue and tries the lock exclusive to drain it, at most 4 rounds; a
    /// failed try hands the drain to the holder. Without it, an exclusive
    /// holder drains the queue as it unlocks (one step), and A4's, A7's
    /// retry and the trim's unlocks drain too. Not with lanes (their A1
    /// reader's drain is `Pc::A1Drain`, one round).
    pub drain_rounds: bool,
    /// The sync hook runs *before* the release, as the pair W1 (before) and
    /// W2 (after) of spec.md#S2.9: every script release event is
    /// `release_begin`, the release, `release_end` (two ops in the history).
    /// Sync monitor only.
    pub pair: bool,
    /// Every script release event is a madvise REMOVE (spec.md#S7.4 (b),
    /// M3, M4): userfaultfd queues it *before* the frames change, the
    /// thread sleeps until it is read, then the kernel zaps the frames and
    /// madvise returns. The read opens a release window (M3) that the
    /// monitor closes once the madvise has returned (M4). Async monitor only;
    /// nested events (registrar, cache) stay unmaps.
    pub remove: bool,
    /// With `remove` and one cache: M4 as the monitor's algorithm (S7.5)
    /// instead of an exact oracle: it lists the threads and looks at each,
    /// sends the proof signal to those that may be inside the madvise,
    /// and closes a window once each has acknowledged (its handler runs at
    /// a return to user mode, a step of the thread's own), been seen
    /// blocked elsewhere, or exited. The madvise's zap and its return are
    /// then two steps.
    pub proof_steps: bool,
    /// Caches sharing one userfaultfd monitor (spec.md#S7.6, M5, M6): 1,
    /// or 2 with thread `t` on cache `t % 2`. With 1, the async monitor is
    /// the single-cache source (M2: reads under the cache lock). With 2,
    /// the process's monitor: its reader (M6) marks the event clock odd,
    /// reads (waking the releasing threads) and publishes into the ring
    /// without any lock; each cache applies the ring from its `applied`
    /// count in its drains (A2, A6, and the service thread's round, M5, one
    /// cache at a time), waiting out an odd clock; A0 and A1 hit only
    /// through the gate. With `remove`, each cache's drain opens a REMOVE's
    /// window (M3) and one M4 closes it in every cache. Async monitor only;
    /// no lanes, limits, pair, or registrar and cache frees.
    pub caches: u8,
    /// Lanes: memo slots per lane (1–4). A key has one slot, by a hash of
    /// the key (direct-mapped, as in the cache: [`lane_slot`]); with 1 slot
    /// every key shares it.
    pub lane_slots: u8,
    /// Lanes: claims the threads may give back in a run (0–2). A thread
    /// between operations may give its lane's claim back (its claim list
    /// overflowed: it claimed lanes of other caches, MAX_CLAIMS; or it
    /// exits), with its lane leases still out: those are then released by a
    /// thread that does not hold the claim (`remote`), and its next A1
    /// claims the first free lane, which may be another thread's old lane
    /// with that thread's memos and counts.
    pub give_backs: u8,
    /// A miss's span is widened outwards to multiples of this many pages
    /// (spec.md#S6.2; 1 to 4): A4's plan, and the in-flight record of A4
    /// that A-D marks stale, cover the widened span.
    pub chunk_pages: u8,
    /// With limits, cost-aware eviction (spec.md#S6.3, GreedyDual-Size):
    /// the victim has the least priority (ties: LRU, then id), and each
    /// eviction raises the floor to the victim's priority.
    pub cost_aware: bool,
    /// The invalidation queue's capacity (spec.md#L2, `max_unreleased`):
    /// a push that finds it full replaces its contents by one event, the
    /// hull of theirs and its own. 0: unbounded (the queue never fills).
    pub max_unreleased: u8,
}

/// The slot of key (`span`, `access`) in a lane of `slots` slots. The
/// cache hashes the whole key; the model takes the first page, so that the
/// scripts choose which keys collide (what a collision does is the same).
pub fn lane_slot(span: Span, slots: u8) -> u8 {
    span.first % slots.max(1)
}

impl Default for CheckConfig {
    fn default() -> Self {
        CheckConfig {
            threads: 2,
            ops: 3,
            policy: OverlapPolicy::Independent,
            monitor: MonitorKind::Sync,
            registrar_frees: None,
            cache_frees: None,
            registrar_failures: 0,
            max_regions: None,
            max_pinned_bytes: None,
            max_retries: 4,
            mutant: None,
            scripts: None,
            lanes: false,
            lockless: false,
            skip_a1: false,
            memo: false,
            restamp_skip: false,
            lookup_skips: false,
            release_steps: false,
            drain_rounds: false,
            pair: false,
            remove: false,
            proof_steps: false,
            caches: 1,
            lane_slots: 1,
            give_backs: 0,
            chunk_pages: 1,
            cost_aware: false,
            max_unreleased: 0,
        }
    }
}

impl CheckConfig {
    pub fn new(threads: usize, ops: usize, policy: OverlapPolicy, monitor: MonitorKind) -> CheckConfig {
        CheckConfig { threads, ops, policy, monitor, ..CheckConfig::default() }
    }

    pub fn with_mutant(mut self, m: Mutant) -> CheckConfig {
        m.adjust(&mut self);
        self.mutant = Some(m);
        self
    }

    pub fn has_limits(&self) -> bool {
        self.max_regions.is_some() || self.max_pinned_bytes.is_some()
    }

    /// The scripts this configuration runs.
    pub fn scripts(&self) -> Vec<Vec<Op>> {
        match &self.scripts {
            Some(s) => s.clone(),
            None => default_scripts(self.threads, self.ops),
        }
    }

    /// The reference model's configuration for the same policy and limits.
    pub fn model_config(&self) -> mrcache_model::Config {
        let mut c = mrcache_model::Config::with_policy(self.policy);
        c.limits.max_regions = self.max_regions;
        c.limits.max_pinned_bytes = self.max_pinned_bytes;
        c.chunk_pages = u64::from(self.chunk_pages.max(1));
        if self.cost_aware {
            c.eviction = mrcache_types::config::EvictionPolicy::CostAware;
        }
        c
    }

    /// A one-line description, for summaries and trace headers.
    pub fn describe(&self) -> String {
        let mut s = match &self.scripts {
            Some(sc) => format!("{} scripted thread(s)", sc.len()),
            None => format!("{} threads x {} ops", self.threads, self.ops),
        };
        s += &format!(", policy {}, monitor {}", self.policy.name(), self.monitor);
        if let Some(p) = self.registrar_frees {
            s += &format!(", registrar frees page {p}");
        }
        match self.cache_frees {
            Some(CacheFrees::Private) => s += ", cache frees its private page under the lock",
            Some(CacheFrees::AppPage(p)) => s += &format!(", cache frees app page {p} under the lock"),
            None => {}
        }
        if self.registrar_failures > 0 {
            s += &format!(", {} registrar failure(s) (ENOMEM first)", self.registrar_failures);
        }
        if let Some(m) = self.max_regions {
            s += &format!(", max_regions {m}");
        }
        if let Some(m) = self.max_pinned_bytes {
            s += &format!(", max_pinned_bytes {m}");
        }
        if self.lanes {
            s += ", lanes (x86-TSO store buffers)";
            if self.lane_slots != 1 {
                s += &format!(", {} slots per lane", self.lane_slots);
            }
            if self.give_backs > 0 {
                s += &format!(", {} lane claim(s) given back", self.give_backs);
            }
        }
        if self.drain_rounds && !self.lanes {
            s += ", A11's post-unlock drain in rounds";
        }
        if self.pair {
            s += ", hook before the release (W1/W2 pair)";
        }
        if self.remove {
            s += ", script releases are madvise REMOVEs (M3/M4 windows)";
            if self.proof_steps && self.caches == 1 {
                s += ", M4 as the proof's steps (scan, signal, acknowledgements)";
            }
        }
        if self.caches > 1 {
            s += &format!(", {} caches on the process's uffd monitor (M5, M6; T<i> on cache i mod {})", self.caches, self.caches);
        }
        if self.max_unreleased > 0 {
            s += &format!(", max_unreleased {}", self.max_unreleased);
        }
        if self.cost_aware {
            s += ", cost-aware eviction";
        }
        if self.chunk_pages > 1 {
            s += &format!(", chunk_pages {}", self.chunk_pages);
        }
        if self.max_retries != 4 {
            s += &format!(", max_retries {}", self.max_retries);
        }
        if let Some(m) = self.mutant {
            s += &format!(", mutant {}", m.name());
        }
        s
    }
}

/// A page span `[first, end)`, the checker's compact form of a byte range.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Span {
    pub first: u8,
    pub end: u8,
}

impl Span {
    pub fn new(first: u8, end: u8) -> Span {
        debug_assert!(first < end);
        Span { first, end }
    }
    pub fn len(&self) -> u8 {
        self.end - self.first
    }
    pub fn is_empty(&self) -> bool {
        self.end <= self.first
    }
    pub fn overlaps(&self, o: &Span) -> bool {
        self.first < o.end && o.first < self.end
    }
    pub fn contains(&self, o: &Span) -> bool {
        self.first <= o.first && o.end <= self.end
    }
    pub fn union(&self, o: &Span) -> Span {
        Span { first: self.first.min(o.first), end: self.end.max(o.end) }
    }
    /// Widened outwards to multiples of `chunk` pages (spec.md#S6.2).
    pub fn align(&self, chunk: u8) -> Span {
        let c = chunk.max(1);
        Span { first: self.first / c * c, end: self.end.div_ceil(c) * c }
    }
    pub fn pages(&self) -> std::ops::Range<u8> {
        self.first..self.end
    }
    pub fn addr(&self) -> u64 {
        self.first as u64 * PAGE_SIZE
    }
    pub fn bytes(&self) -> u64 {
        self.len() as u64 * PAGE_SIZE
    }
    fn of(range: Range) -> Result<Span, String> {
        let p = range.pages(PAGE_SIZE);
        if p.end > MAX_PAGES as u64 {
            return Err(format!("{range} reaches page {}; the checker has pages 0..{}", p.end - 1, MAX_PAGES - 1));
        }
        Ok(Span { first: p.first as u8, end: p.end as u8 })
    }
}

impl fmt::Debug for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p[{},{})", self.first, self.end)
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A script operation in the checker's compact form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScriptOp {
    Acquire {
        lease: LeaseId,
        span: Span,
        access: Access,
    },
    Release {
        lease: LeaseId,
    },
    Event {
        kind: ReleaseKind,
        span: Span,
    },
    /// The user's flush of the cache (spec.md#S2.5).
    Flush,
    /// The process forks; this thread goes on in the child (spec.md#S2.6, F1).
    Fork,
}

/// Checks and converts scripts: only acquire, release, release_event, flush and fork;
/// valid ranges inside the checker's pages; lease names unique; a release
/// names a lease its own thread acquired before, or one another thread
/// acquires (handed over: the release waits for that acquire to return),
/// each released by one thread at most.
pub fn compile_scripts(scripts: &[Vec<Op>]) -> Result<Vec<Vec<(Op, ScriptOp)>>, String> {
    if scripts.is_empty() || scripts.len() > 6 {
        return Err(format!("{} threads: the checker handles 1 to 6", scripts.len()));
    }
    let mut names = std::collections::BTreeMap::new();
    for (t, script) in scripts.iter().enumerate() {
        for op in script {
            if let Op::Acquire { lease, .. } = *op {
                names.entry(lease).or_insert(t);
            }
        }
    }
    let mut released = std::collections::BTreeSet::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for (t, script) in scripts.iter().enumerate() {
        let mut mine = std::collections::BTreeSet::new();
        let mut compiled = Vec::new();
        for op in script {
            let sop = match *op {
                Op::Acquire { lease, access, .. } => {
                    let range = op.range().expect("acquire has a range").map_err(|e| format!("thread {t}: {op}: {e}"))?;
                    if !seen.insert(lease) {
                        return Err(format!("thread {t}: {op}: lease L{lease} is used twice"));
                    }
                    mine.insert(lease);
                    ScriptOp::Acquire { lease, span: Span::of(range).map_err(|e| format!("thread {t}: {e}"))?, access }
                }
                Op::Release { lease } => {
                    if !mine.contains(&lease) && names.get(&lease).is_none_or(|&by| by == t) {
                        return Err(format!("thread {t}: {op}: no thread acquires L{lease}"));
                    }
                    if !mine.contains(&lease) && !released.insert(lease) {
                        return Err(format!("thread {t}: {op}: L{lease} is released by two threads"));
                    }
                    ScriptOp::Release { lease }
                }
                Op::ReleaseEvent { kind, .. } => {
                    let range = op.range().expect("event has a range").map_err(|e| format!("thread {t}: {op}: {e}"))?;
                    ScriptOp::Event { kind, span: Span::of(range).map_err(|e| format!("thread {t}: {e}"))? }
                }
                Op::Flush => ScriptOp::Flush,
                Op::Fork => ScriptOp::Fork,
                _ => return Err(format!("thread {t}: {op}: scripts hold only acquire, release, release_event, flush and fork")),
            };
            compiled.push((*op, sop));
        }
        out.push(compiled);
    }
    Ok(out)
}

/// Shrinks the pages `scripts` touch to a few, keeping every relation between
/// their ranges: the address space is cut at every range's first and end page,
/// and each piece that some range covers becomes one page (in address order).
/// Overlap, containment and adjacency are kept; sizes and gaps are not. This
/// lets a trace recorded at real addresses run in the checker.
pub fn compact_pages(scripts: &[Vec<Op>]) -> Vec<Vec<Op>> {
    let spans: Vec<(u64, u64)> = scripts
        .iter()
        .flatten()
        .filter_map(|op| op.range().and_then(Result::ok))
        .map(|r| {
            let p = r.pages(PAGE_SIZE);
            (p.first, p.end)
        })
        .collect();
    let mut cuts: Vec<u64> = spans.iter().flat_map(|&(a, b)| [a, b]).collect();
    cuts.sort_unstable();
    cuts.dedup();
    // Pieces [cuts[i], cuts[i+1]) covered by some range, numbered in order.
    let covered: Vec<u64> = cuts.windows(2).filter(|w| spans.iter().any(|&(a, b)| a <= w[0] && w[1] <= b)).map(|w| w[0]).collect();
    let page_of = |cut: u64| covered.partition_point(|&c| c < cut) as u64;
    let remap = |addr: u64, len: u64| {
        let p = Range { addr, len }.pages(PAGE_SIZE);
        let (first, end) = (page_of(p.first), page_of(p.end));
        (first * PAGE_SIZE, (end - first) * PAGE_SIZE)
    };
    scripts
        .iter()
        .map(|ops| {
            ops.iter()
                .map(|op| match *op {
                    Op::Acquire { lease, addr, len, access } if len > 0 && addr.checked_add(len).is_some() => {
                        let (addr, len) = remap(addr, len);
                        Op::Acquire { lease, addr, len, access }
                    }
                    Op::ReleaseEvent { kind, addr, len } if len > 0 && addr.checked_add(len).is_some() => {
                        let (addr, len) = remap(addr, len);
                        Op::ReleaseEvent { kind, addr, len }
                    }
                    other => other,
                })
                .collect()
        })
        .collect()
}

const RR: Access = Access::REMOTE_READ;
const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_READ).union(Access::REMOTE_WRITE);

fn acq(lease: LeaseId, first: u64, end: u64, access: Access) -> Op {
    Op::Acquire { lease, addr: first * PAGE_SIZE, len: (end - first) * PAGE_SIZE, access }
}
fn rel(lease: LeaseId) -> Op {
    Op::Release { lease }
}
fn ev(kind: ReleaseKind, first: u64, end: u64) -> Op {
    Op::ReleaseEvent { kind, addr: first * PAGE_SIZE, len: (end - first) * PAGE_SIZE }
}

/// Scripts where the LRU order decides which of A and B is evicted when T1's
/// miss on C goes over `max_regions 2`; T1 then asks for A again and
/// unmaps it while it holds it.
pub fn lru_scripts() -> Vec<Vec<Op>> {
    vec![
        vec![acq(1, 0, 1, RR), acq(2, 1, 2, RR), rel(2), rel(1)],
        vec![acq(11, 2, 3, RR), acq(12, 0, 1, RR), ev(ReleaseKind::Munmap, 0, 1)],
    ]
}

/// Scripts for `chunk_pages` 2 (spec.md#S6.2): T0's miss on p[0,1)
/// registers the chunk p[0,2), while T1's munmap of p1, a page only the
/// rounding added, may come between its plan and its insert (the in-flight
/// record must cover the chunk), and T0's acquire of p[1,2) may then hit
/// the chunk; T1's miss on p[1,3) registers p[0,4), which overlaps and
/// contains T0's (a merge, an uncache).
pub fn chunk_scripts() -> Vec<Vec<Op>> {
    vec![vec![acq(1, 0, 1, RR), rel(1), acq(2, 1, 2, RR)], vec![ev(ReleaseKind::Munmap, 1, 2), acq(11, 1, 3, RW), rel(11)]]
}

/// Scripts for cost-aware eviction (spec.md#S6.3) under `max_regions` 2:
/// T0 uses X = p[2,3) (one page: H 16245 over the floor), then Y = p[0,2)
/// (two pages: 8245), and W = p[4,6) (two pages) goes over the limit: the
/// victim is Y, the cheaper per page, though X is older (LRU would take
/// X), and the floor rises to Y's H; W's release sets its H to that floor
/// plus 8245, above X's, so V = p[6,7) evicts X (without the raised floor
/// it would evict W); T0's last acquire of X then misses. T1 acquires and
/// releases Y anywhere in between (a hit, a new entry, or an entry T0
/// then hits).
pub fn cost_scripts() -> Vec<Vec<Op>> {
    vec![
        vec![acq(1, 2, 3, RR), rel(1), acq(2, 0, 2, RR), rel(2), acq(3, 4, 6, RR), rel(3), acq(4, 6, 7, RR), rel(4), acq(5, 2, 3, RR)],
        vec![acq(11, 0, 2, RR), rel(11)],
    ]
}

/// Scripts for the queue's hull (spec.md#L2) with `max_unreleased` 1: T1
/// unmaps A = p0, then C = p2, and both hooks may find the lock busy
/// (T0's miss on D = p3 holds it): the second push finds the queue full
/// and collapses it into p[0,3), which covers B = p1, leased by T0 or
/// released, though no event released it. T0's acquire of A after both
/// munmaps returned must not hit A's old registration.
pub fn hull_scripts() -> Vec<Vec<Op>> {
    vec![
        vec![acq(1, 1, 2, RR), acq(2, 3, 4, RR), rel(1), acq(3, 0, 1, RR)],
        vec![acq(11, 0, 1, RR), rel(11), ev(ReleaseKind::Munmap, 0, 1), ev(ReleaseKind::Munmap, 2, 3)],
    ]
}

/// Scripts for the fork (spec.md#F1, S2.6): T0 forks while it holds a
/// lease on A = p0, and T1, which does not exist in the child, may be
/// anywhere in its acquire of B = p1 (holding the lock, registering),
/// its release, or its munmap (its event queued, the lock held for H2's
/// drain). In the child T0 releases its lease (a no-op) and acquires A
/// again: a miss on a fresh generation, whose lock is free.
pub fn fork_scripts() -> Vec<Vec<Op>> {
    vec![
        vec![acq(1, 0, 1, RR), Op::Fork, rel(1), acq(2, 0, 1, RR), rel(2)],
        vec![acq(11, 1, 2, RR), rel(11), ev(ReleaseKind::Munmap, 1, 2)],
    ]
}

/// Scripts for the flush (spec.md#S2.5): T0 flushes while it holds L1 on
/// A = p[0,2) (leased: INVALID, deregistered at its release) and T1 may
/// hold, have released, or be registering B = p[1,2) (an in-flight
/// registration the flush leaves alone); T0's acquire of B after its flush
/// must not hit A, which the flush took out; T1's munmap of B may
/// invalidate what the flush left, or find nothing.
pub fn flush_scripts() -> Vec<Vec<Op>> {
    vec![vec![acq(1, 0, 2, RR), Op::Flush, rel(1), acq(2, 1, 2, RR)], vec![acq(11, 1, 2, RW), rel(11), ev(ReleaseKind::Munmap, 1, 2)]]
}

/// Scripts where T1's miss on B goes over `max_regions 1` while T0 holds A,
/// and T0's release of A and its munmap of B (queued: H2's try-lock fails)
/// can both happen while T1 holds the lock between A6 and A10. A6's note
/// falls short if it saw A leased, and raises the over-limit flag before
/// noting again: the release is seen by that note or runs R2 (and has not
/// returned); no drain after A9 applies the munmap before the eviction
/// (`flag-at-second-pass` has one). T1 acquires A again: the
/// contract has evicted A (at the release or at B's insert), whichever
/// order, since the release returned before the munmap began
/// (`flag-at-second-pass`).
pub fn limit_event_scripts() -> Vec<Vec<Op>> {
    vec![vec![acq(1, 0, 1, RR), rel(1), ev(ReleaseKind::Munmap, 1, 2)], vec![acq(11, 1, 2, RR), acq(12, 0, 1, RR)]]
}

/// Scripts for the lanes (LN1–LN6): T1 inserts A, so T0's first acquire is an
/// A1 hit that memoizes A in T0's lane (LN2) and its second is a lane hit
/// (LN1) released on the lane (LN3); T1's munmap of A revokes the slot (LN5)
/// wherever T0 is.
pub fn lane_scripts() -> Vec<Vec<Op>> {
    vec![vec![acq(1, 0, 1, RR), rel(1), acq(2, 0, 1, RR), rel(2)], vec![acq(11, 0, 1, RR), rel(11), ev(ReleaseKind::Munmap, 0, 1)]]
}

/// Scripts where T1's miss on B, over `max_regions` 1, notes while T0 may
/// hold a lane lease on A (its second acquire, after an A1 hit memoized A):
/// the note must revoke A's slot to see that lease, else A10 evicts A under
/// T0's lease and T1's last acquire of A misses where the contract hits.
pub fn lane_note_scripts() -> Vec<Vec<Op>> {
    vec![
        vec![acq(1, 0, 1, RR), rel(1), acq(2, 0, 1, RR), rel(2)],
        vec![acq(11, 0, 1, RR), rel(11), acq(12, 1, 2, RR), rel(12), acq(13, 0, 1, RR)],
    ]
}

/// Scripts where T1's munmap of A can return while T0 holds the lock and
/// drains it (H2's try-lock fails): T1 memoized A (an A1 hit on T0's entry)
/// and acquires it again after its munmap returned, so a lane hit there
/// would be stale unless LN1 sees the event pending.
pub fn lane_drain_scripts() -> Vec<Vec<Op>> {
    vec![
        vec![acq(1, 0, 1, RR), rel(1), acq(2, 1, 2, RR)],
        vec![acq(11, 0, 1, RR), rel(11), ev(ReleaseKind::Munmap, 0, 1), acq(12, 0, 1, RR)],
    ]
}

/// Scripts for the ENOMEM trim beside A0 (`trim-reads-then-ors`): T0
/// caches A, releases it, and acquires A again (A0's key: exactly A's);
/// T1's miss on B fails with ENOMEM, and its trim notes A (unleased).
pub fn trim_scripts() -> Vec<Vec<Op>> {
    vec![vec![acq(1, 0, 1, RR), rel(1), acq(2, 0, 1, RR), rel(2)], vec![acq(11, 1, 2, RW), rel(11)]]
}

/// Scripts where T0 holds a lane lease on A (slot 0) when its A1 hit on B
/// would memoize B (`lane-reuse-busy-slot` takes the busy slot); T1's munmap of A then
/// revokes A.
pub fn lane_reuse_scripts() -> Vec<Vec<Op>> {
    vec![
        vec![acq(1, 0, 1, RR), rel(1), acq(2, 0, 1, RR), acq(3, 1, 2, RR)],
        vec![acq(11, 0, 1, RR), rel(11), acq(12, 1, 2, RR), ev(ReleaseKind::Munmap, 0, 1)],
    ]
}

/// Scripts for a direct-mapped lane of 2 slots, where A (page 0) and C
/// (page 2) share slot 0: T0 memoizes A (an A1 hit on T1's entry), then
/// asks for C, whose slot holds A's memo (LN1 must compare the key), and
/// may memoize C over it (count 0, no pin); T1's munmap of A revokes A's
/// slot if it still holds A.
pub fn lane_collide_scripts() -> Vec<Vec<Op>> {
    vec![
        vec![acq(1, 0, 1, RR), rel(1), acq(2, 2, 3, RR), rel(2)],
        vec![acq(11, 0, 1, RR), acq(12, 2, 3, RR), ev(ReleaseKind::Munmap, 0, 1)],
    ]
}

/// Scripts where a lane lease is released on another thread: T0 memoizes
/// A (an A1 hit on T1's entry) and takes L2 on its lane (LN1), which T1
/// releases (LN3 by a thread that does not hold the lane: `remote`), while
/// T0 takes L3 on the same slot; T1's munmap of A then revokes the slot,
/// whose count must still see L3.
pub fn lane_remote_scripts() -> Vec<Vec<Op>> {
    vec![
        vec![acq(1, 0, 1, RR), rel(1), acq(2, 0, 1, RR), acq(3, 0, 1, RR)],
        vec![acq(11, 0, 1, RR), rel(11), rel(2), ev(ReleaseKind::Munmap, 0, 1)],
    ]
}

/// Scripts for lane claims that move (`give_backs` 2): T0 memoizes A (an
/// A1 hit on T1's entry) and takes L2 on its lane; either thread may give
/// its claim back between operations, so T1's A1 for B may claim T0's old
/// lane, with T0's memo of A and L2 still counted there, and its acquire
/// of A take a lane hit there, while T0 releases L2 as a thread that no
/// longer holds the lane; T1's munmap of A then revokes the slot.
pub fn lane_claim_scripts() -> Vec<Vec<Op>> {
    vec![
        vec![acq(1, 0, 1, RR), rel(1), acq(2, 0, 1, RR), rel(2)],
        vec![acq(11, 0, 1, RR), rel(11), acq(12, 1, 2, RR), acq(13, 0, 1, RR), ev(ReleaseKind::Munmap, 0, 1)],
    ]
}

/// Scripts with two release windows open at once: T0's release of A
/// (page 0) and T1's of B (page 1). While T1's window on B is open, T0's
/// acquire of B must not be cached (W3), whatever T0's own W2 does: a W2
/// that closes T1's window instead of its own lets T0 cache B with the
/// frames T1 is releasing, and T1's acquire after its release hits it.
pub fn window_scripts() -> Vec<Vec<Op>> {
    vec![vec![ev(ReleaseKind::Munmap, 0, 1), acq(1, 1, 2, RR)], vec![ev(ReleaseKind::Munmap, 1, 2), acq(11, 1, 2, RR)]]
}

/// Scripts where T1's acquire of A is planned inside T0's window on A and
/// may reach A9 after T0's W2, with T0's miss on B inserted in between: the
/// acquire then takes effect after the window (B's id is lower), so it must
/// not be served uncached (A7 retries it), or T0's acquire of A, which must
/// hit it, misses.
pub fn window_closed_scripts() -> Vec<Vec<Op>> {
    vec![vec![ev(ReleaseKind::Munmap, 0, 1), acq(1, 1, 2, RR), acq(2, 0, 1, RR)], vec![acq(11, 0, 1, RR)]]
}

/// Scripts for A0's PENDING check (with `memo` and `pair`): T1's A1 hit
/// memoizes T0's entry of A; T1's munmap of A (W1) takes it out and frees
/// its memory; T0's acquire of A, planned inside the window, gets that
/// memory for its windowed entry, which A9 inserts (PENDING) and takes out
/// at once (W3); T1's acquire of A after its munmap returned reads the
/// memo between the two.
pub fn memo_pending_scripts() -> Vec<Vec<Op>> {
    vec![
        vec![acq(1, 0, 1, RR), rel(1), acq(2, 0, 1, RR)],
        vec![acq(11, 0, 1, RR), rel(11), ev(ReleaseKind::Munmap, 0, 1), acq(12, 0, 1, RR)],
    ]
}

/// Scripts for A0's key recheck (with `memo`): T0's A1 hit memoizes its
/// entry of A, and its A0 reads it; meanwhile T1 frees that memory twice
/// (munmap A, then C after C took it) and B, a request on A's first page
/// that does not cover A, takes it: the incarnation (one bit) is back to
/// the one T0 read.
pub fn memo_reuse_scripts() -> Vec<Vec<Op>> {
    vec![
        vec![acq(1, 0, 2, RR), rel(1), acq(2, 0, 2, RR), rel(2), acq(3, 0, 2, RR)],
        vec![ev(ReleaseKind::Munmap, 0, 2), acq(11, 2, 3, RR), rel(11), ev(ReleaseKind::Munmap, 2, 3), acq(12, 0, 1, RR)],
    ]
}

/// Scripts where T0 inserts A while T1's acquire of A is between lookups:
/// after its A1 missed (A3 must see the insert: `a1-count-after-unlock`),
/// or after its A4 (A8 must: `a4-count-after-unlock`); and, if T0's munmap
/// is drained after T1's A4, T1's record is stale when T0's entry covers
/// its request (A7 runs A8's test first: the acquire hits).
pub fn lookup_scripts() -> Vec<Vec<Op>> {
    vec![vec![ev(ReleaseKind::Munmap, 0, 1), acq(1, 0, 1, RR)], vec![acq(11, 0, 1, RR)]]
}

/// Scripts where T1's acquire of A may be planned after T0's madvise REMOVE
/// of A was read (by the monitor or by T1's own A2) and before the frames
/// are zapped: its registration pins the frames about to go. Without M3's
/// window it is cached, and T0's acquire of A after its madvise returned
/// hits it (`remove-without-window`); with the window it is served uncached
/// (W3), or retried if M4 closed the window before its A7.
pub fn remove_scripts() -> Vec<Vec<Op>> {
    vec![vec![ev(ReleaseKind::MadviseDontneed, 0, 1), acq(1, 0, 1, RR)], vec![acq(11, 0, 1, RR)]]
}

/// Two caches on one monitor (spec.md#S7.6, M5, M6): both cache A; T0 (cache
/// 0) unmaps it; T1's second acquire of A, on cache 1, may begin after the
/// munmap returned, and must then not hit its cached registration of A.
pub fn shared_monitor_scripts() -> Vec<Vec<Op>> {
    vec![vec![acq(1, 0, 1, RR), rel(1), ev(ReleaseKind::Munmap, 0, 1)], vec![acq(11, 0, 1, RR), rel(11), acq(12, 0, 1, RR)]]
}

/// Two caches on one monitor with a madvise REMOVE (spec.md#S7.6, M5,
/// M3): T0 (cache 0) madvises A, then acquires it; T1 (cache 1) acquires A,
/// releases it and acquires it again. T1's first registration may be
/// planned after cache 1 drained the REMOVE from the ring and made before
/// the zap: it must be windowed in cache 1 (M3 in every cache), or T1's second acquire,
/// begun after the madvise returned, hits the frames it dropped.
pub fn shared_remove_scripts() -> Vec<Vec<Op>> {
    vec![vec![ev(ReleaseKind::MadviseDontneed, 0, 1), acq(1, 0, 1, RR)], vec![acq(11, 0, 1, RR), rel(11), acq(12, 0, 1, RR)]]
}

/// [`kdreg2_scripts`] in words.
pub const KDREG2_SCRIPTS: &str = "T0: acquire A, release, acquire B, release, munmap B, munmap A, acquire A";

/// One application thread for the kdreg2 models: B's munmap gives the
/// evictor an event to read, and its read holds the module's mutex; A's
/// munmap may come meanwhile, and the acquire of A after it must not hit
/// the registration of the frames it released.
pub fn kdreg2_scripts() -> Vec<Vec<Op>> {
    vec![vec![
        acq(1, 0, 1, RR),
        rel(1),
        acq(2, 1, 2, RR),
        rel(2),
        ev(ReleaseKind::Munmap, 1, 2),
        ev(ReleaseKind::Munmap, 0, 1),
        acq(3, 0, 1, RR),
    ]]
}

/// The generated scripts: thread `t` runs the first `ops` operations of
/// pattern `t` (two pages, 0 and 1). With 2 threads x 3 ops:
///
/// ```text
/// T0: acquire L1 p[0,2) remote_read; release L1; acquire L2 p[1,2) remote_read
/// T1: acquire L11 p[1,2) rw;         release L11; munmap p[1,2)
/// ```
///
/// That is enough for every race §A must handle: an acquire registering while
/// an overlapping page is released, a leased entry invalidated, a partial
/// release not at the start of an entry, overlapping requests with different
/// access (a merge, an uncache, a miss that must not hit), and a re-acquire
/// after a release event, by the releasing thread and by another.
pub fn default_scripts(threads: usize, ops: usize) -> Vec<Vec<Op>> {
    use ReleaseKind::*;
    let patterns: [Vec<Op>; 4] = [
        vec![acq(1, 0, 2, RR), rel(1), acq(2, 1, 2, RR), rel(2), ev(MadviseDontneed, 0, 1), acq(3, 0, 2, RR), rel(3)],
        vec![acq(11, 1, 2, RW), rel(11), ev(Munmap, 1, 2), acq(12, 1, 2, RW), rel(12), ev(MremapSource, 0, 2)],
        vec![ev(MadviseDontneed, 0, 1), acq(21, 0, 1, RR), rel(21), acq(22, 0, 2, RW), rel(22), ev(Munmap, 1, 2)],
        vec![acq(31, 0, 1, RW), ev(MapFixedOver, 0, 1), rel(31), acq(32, 1, 2, RR), rel(32)],
    ];
    (0..threads.clamp(1, 4)).map(|t| patterns[t].iter().take(ops).copied().collect()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compacting_keeps_overlap_containment_and_adjacency() {
        let a = |lease, addr: u64, len: u64| Op::Acquire { lease, addr, len, access: RR };
        let scripts = vec![
            vec![a(1, 0x7f00_0000_0000, 0x10_0000), a(2, 0x7f00_0008_0000, 0x10_0000)],
            vec![
                Op::ReleaseEvent { kind: ReleaseKind::Munmap, addr: 0x7f00_0010_0000, len: 0x1000 },
                a(3, 0x7f00_0000_0800, 10),
                a(4, 0x9000_0000, 0x1000),
            ],
        ];
        let out = compact_pages(&scripts);
        let spans: Vec<Span> = compile_scripts(&out)
            .unwrap()
            .into_iter()
            .flatten()
            .map(|(_, op)| match op {
                ScriptOp::Acquire { span, .. } | ScriptOp::Event { span, .. } => span,
                ScriptOp::Release { .. } | ScriptOp::Flush | ScriptOp::Fork => unreachable!(),
            })
            .collect();
        // A4 (lowest address) is page 0, apart. A1 = [1,4) and A2 = [3,6)
        // overlap on page 3; A3 is A1's first page, split off; the event
        // (page 4) is inside A2 only.
        assert_eq!(spans, vec![Span::new(1, 4), Span::new(3, 6), Span::new(4, 5), Span::new(1, 2), Span::new(0, 1)]);
    }
}
