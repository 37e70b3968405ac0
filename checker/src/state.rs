//! The checker's state: shared cache state, physical truth, each actor's
//! program counter and locals, and the history for the linearizability check.

use crate::config::Span;
use mrcache_types::{Access, LeaseId, ReleaseKind};
use smallvec::SmallVec;
use std::fmt;

/// One generation per page (a configuration has a few pages): kept inline,
/// so that copying a state allocates nothing for it. A `SmallVec` hashes
/// and compares as the slice it holds, as a `Vec` does.
pub type Pages = SmallVec<[u8; 16]>;

/// Index of a registration in [`State::regs`]: every registrar call, in order.
pub type Handle = u8;
/// A thread index, or [`MONITOR`].
pub type Actor = u8;
/// The uffd monitor thread.
pub const MONITOR: Actor = u8::MAX;
/// Linearizability-tester thread id of a release event raised inside thread
/// `t`'s cache operation (registrar or cache free): `NESTED + t`.
pub const NESTED: u8 = 16;
/// The history's pseudo-thread of the hull a full queue collapses into
/// when thread `t` pushes (L2): `HULL + t`.
pub const HULL: u8 = 32;

/// The cache lock (a reader-writer lock), as explicit state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lock {
    Free,
    Shared(u8),
    Exclusive(Actor),
}

/// A registration made by the registrar, and its cache entry state if it was
/// inserted. Never removed from [`State::regs`]: deregistration counts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Reg {
    pub span: Span,
    pub access: Access,
    /// Page generations pinned at registration, one per page of `span`.
    pub pinned: Pages,
    /// Registrar deregistrations of this registration (P4: at most 1).
    pub deregs: u8,
    /// Cache id given at insertion (A9); 0 if never inserted.
    pub id: u8,
    /// In the index.
    pub findable: bool,
    /// The state word's lease count.
    pub leases: u8,
    /// The state word's INVALID bit.
    pub invalid: bool,
    /// Displaced by the overlap policy (merge or uncache) at an A9.
    pub displaced: bool,
    /// LRU stamp (only kept when limits are configured).
    pub last_use: u8,
    /// kdreg2 models: the module monitors the range (subscribed at A9,
    /// unsubscribed when deregistered).
    pub kmon: bool,
    /// kdreg2 models: the module changed the range's generation word (it
    /// destroyed its region), so a hit's generation check fails.
    pub kgen: bool,
    /// `CheckConfig::memo`: the entry memory A9 gave it (a cell of
    /// [`State::cells`]) and the incarnation that memory then got.
    pub cell: Option<(u8, u8)>,
    /// `CheckConfig::memo`: the state word's PENDING bit, set from A9's
    /// insert until it publishes the entry (never cleared on an entry A9
    /// takes out at once).
    pub pending: bool,
    /// Cost-aware eviction (`CheckConfig::cost_aware`): GreedyDual-Size's
    /// `H`, set on every use to the floor plus the per-page cost (S6.3).
    pub priority: u32,
    /// Made before a fork (F1): the parent's, forgotten by the child
    /// without registrar calls; its leases release as no-ops there.
    pub forgotten: bool,
}

/// Program counter of an application thread: the next step it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pc {
    /// Between operations: the next step starts the next script op.
    Idle,
    /// Holding the lock shared: A1's lookup.
    A1Look,
    /// A0: the memo named `h`, findable with the request's key when read;
    /// next, the compare-exchange on its state word (no lock).
    A0Cas(Handle),
    A2,
    /// A3 (and A4 on a miss).
    A3,
    A5,
    A6,
    /// A7, then A8 or A9.
    A7,
    A10,
    /// Second half of A10 (the scan in the correct order, the flag in `over-limit-flag-late`).
    A10b,
    A11,
    /// `release-touch-after-decrement`: the LRU touch of a release, after its decrement.
    R1Touch(Handle, bool),
    /// `CheckConfig::release_steps`: R1 touched the LRU stamp of `h`; next,
    /// its decrement of the state word (mutant
    /// `release-flag-before-decrement`: `flag` is the over-limit flag it
    /// loaded before the decrement).
    R1Dec {
        h: Handle,
        flag: Option<bool>,
    },
    /// `CheckConfig::release_steps`: R1's decrement took the count to 0
    /// without INVALID; next, its load of the over-limit flag (R2 if set).
    R1Flag,
    R2,
    /// Lanes: LN1's store of `held + 1` into the store buffer (the slot of
    /// the thread's lane and the entry its `ptr` held at LN1's first load).
    LN1Store {
        slot: u8,
        h: Handle,
    },
    /// Lanes: LN1's reload of `ptr` after the light barrier.
    LN1Load {
        slot: u8,
        h: Handle,
    },
    /// Lanes: LN1 reloaded null (a revoke): it takes the lanes mutex and
    /// reads the slot's pin (still counting its `held + 1`).
    LN1Pin {
        slot: u8,
        h: Handle,
    },
    /// Lanes: after an LN1 undo (mutant `lane-undo-despite-pin`: and its
    /// LN4): A1 (check the queue, take the lock shared).
    A1,
    /// Lanes: an A1 hit unlocked with events queued: try the lock exclusive
    /// and drain (a step of its own, so the drain can revoke), then return.
    A1Drain(Handle),
    /// Lanes: LN3's reload of `ptr` after its store of `held - 1` (the
    /// owner) or its atomic add to `remote` (another thread), on slot `slot`
    /// of lane `lane`.
    LN3Load {
        lane: u8,
        slot: u8,
        h: Handle,
    },
    /// Lanes: LN4, the detached release of the lane lease on `h` (it takes
    /// the lanes mutex and reads the slot's count); `then_a1`: an LN1 undo
    /// (mutant `lane-undo-despite-pin`), the acquire continues at A1.
    LN4 {
        lane: u8,
        slot: u8,
        h: Handle,
        then_a1: bool,
    },
    /// Lanes, where other threads can add to `remote` meanwhile: LN4 holds
    /// the lanes mutex and has read `remote`; next it reads `held`.
    LN4Held {
        lane: u8,
        slot: u8,
        h: Handle,
        then_a1: bool,
        remote: u8,
    },
    /// Lanes: R2 run by an LN1 undo's LN4 (mutant `lane-undo-despite-pin`),
    /// then A1.
    R2ThenA1,
    /// The ENOMEM trim (S2.8), holding the lock exclusive: one step per
    /// noted entry (in [`Thread::noted`]), each the compare-exchange of its
    /// state word from unleased to INVALID, as in the cache (A0 takes leases
    /// between them); then the re-plan and the unlock.
    Trim,
    /// Mutant `trim-reads-then-ors`: the trim read `h`'s lease count as 0;
    /// next, it ORs INVALID in, whatever the count is by then.
    TrimOr(Handle),
    /// `CheckConfig::memo`: A9 inserted the entry (PENDING) and displaced;
    /// next, still under the lock, it takes the entry out at once (W3) or
    /// publishes it (clears PENDING), then A10/A11 (`alt`: the cache frees
    /// its own memory there; `windowed`: the record was, W3).
    A9Pub {
        alt: bool,
        windowed: bool,
    },
    /// Running a script release event (its steps are in [`Thread::ev`]).
    Event,
    /// A flush (spec.md#S2.5) invoked; next, its exclusive section (one
    /// step: the lock, the drain, every findable entry out, the unlock).
    Flush,
    Done,
}

/// Steps of a release event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EvPc {
    /// The kernel releases the frames (new generations); with uffd it also
    /// queues the event and puts the thread to sleep.
    Bump,
    H1,
    H2,
    /// uffd, notify-before-release: queue the event before the frames change.
    Enqueue,
    /// uffd: asleep until the monitor (or A2/A6) reads the event.
    Wait,
    /// kdreg2 models: the mmu notifier (`invalidate_range_end`), in the
    /// releasing thread after the frames changed.
    Notify,
    /// notify-before-release: the frames change after the monitor was told.
    BumpLast,
    /// W1 (a hook before the release, `CheckConfig::pair`): open a window on
    /// the span, then H1 and H2 with it, then the frames change (`Bump`).
    Begin,
    /// W2 (after the release): close one window on the span.
    End,
    /// `CheckConfig::proof_steps`: a madvise REMOVE has zapped its frames
    /// (`BumpLast`); next, it returns to user mode (until then it is inside
    /// the kernel call, and the proof signal's handler cannot run on it).
    Return,
}

/// Where a release event comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Origin {
    /// A script op of the thread.
    Script,
    /// The registrar freed memory while registering (A5).
    Registrar,
    /// The cache freed its own memory while holding the lock (A9).
    Cache,
}

/// A release event in progress on a thread.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Ev {
    pub pc: EvPc,
    pub span: Span,
    pub kind: ReleaseKind,
    pub origin: Origin,
    /// The generations this event installed, one per page of `span`.
    pub assigned: Vec<u8>,
}

/// The registration A4 planned (S6.1).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Plan {
    pub span: Span,
    pub access: Access,
    pub displaced: Vec<Handle>,
}

/// Locals of the acquire a thread is running.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Acq {
    pub lease: LeaseId,
    pub req: Span,
    pub access: Access,
    /// For each page of `req`, the newest generation installed by a release
    /// event that had *completed* when this acquire was invoked (P2's bound).
    pub snap: Vec<u8>,
    /// Registrations thrown away as stale so far (A7).
    pub attempts: u8,
    pub plan: Option<Plan>,
    /// The registration this attempt made (A5).
    pub handle: Option<Handle>,
    /// This acquire trimmed after an ENOMEM (S5.4): its outcome says `pressure`.
    pub trimmed: bool,
    /// This acquire skipped A1 (went straight to A2; `CheckConfig::skip_a1`).
    pub skipped_a1: bool,
    /// `CheckConfig::lookup_skips`: what the index's insert counter says
    /// about this acquire's next lookup (A3's, A8's).
    pub inserts: InsertCount,
}

/// The index's insert counter as an acquire last read it, relative to now:
/// the model keeps only whether an insert came since (the cache compares
/// two counts; states that differ only in the count's value would be
/// distinct for nothing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum InsertCount {
    /// Not read, or an insert came since: the next lookup runs.
    #[default]
    Changed,
    /// Read when a lookup missed (A1's, under its shared lock; A4's, after
    /// A3's), and nothing was inserted since: the next lookup would miss
    /// again (the drains only remove entries), and is skipped.
    Unchanged,
    /// Mutants `a1-count-after-unlock` and `a4-count-after-unlock`: the
    /// lookup missed, and the counter is read in the acquire's next step,
    /// after the unlock; inserts before that read are not seen.
    Unread,
}

/// One memo slot of a thread's lane (LN1–LN6). `held` is written only by the
/// lane's owner (plain stores, through its store buffer); the lease count of
/// the slot is `held - remote`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Slot {
    /// The memoized request: (page span, access).
    pub key: Option<(Span, Access)>,
    /// The memoized entry; `None` once revoked (LN5).
    pub ptr: Option<Handle>,
    pub held: u8,
    /// Releases by threads that do not hold the lane's claim (a lease
    /// handed to another thread, or released after its taker gave the claim
    /// back): an atomic add, straight to memory.
    pub remote: u8,
    /// The entry whose state word holds one lease for this slot (LN5).
    pub pin: Option<Handle>,
}

/// A plain store waiting in a thread's store buffer (x86-TSO).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Store {
    /// The owner's store of `held` of slot `slot` of lane `lane`.
    Held { lane: u8, slot: u8, val: u8 },
    /// A revoke's store of `ptr` (null) into slot `slot` of lane `lane`.
    Ptr { lane: u8, slot: u8, val: Option<Handle> },
    /// The store that gives lane `lane`'s claim back (`taken = false`, after
    /// the holder's last `held` stores: a claimer's compare-exchange sees
    /// the lane free only once the stores before it have reached memory).
    Claim { lane: u8 },
    /// The store that hands lease `lease` to the thread whose script
    /// releases it (a message through memory, after the stores of the
    /// acquire that took it).
    Handover { lease: LeaseId },
}

/// Where an actor's revoke (LN5) stands: it has stored null into the slots
/// (and holds the lock exclusive and the lanes mutex); next the heavy
/// barrier, then the count reads and pins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RevokePhase {
    Barrier,
    /// Read the slots' counts (`remote`, then `held`) and pin; one step
    /// while no other thread can add to `remote`.
    Count,
    /// Where other threads can add to `remote` meanwhile: the two reads of
    /// slot `i` (of [`Revoke::slots`]) are steps of their own. `Remote(i)`
    /// reads `remote`; `Held(i, remote)` reads `held` and pins.
    Remote(u8),
    Held(u8, u8),
}

/// An LN5 in progress: its phase and its slots (lane, slot, entry revoked).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Revoke {
    pub phase: RevokePhase,
    pub slots: Vec<(u8, u8, Handle)>,
}

/// The thread's record in the in-flight list (A4..A9).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InFlight {
    pub span: Span,
    pub stale: bool,
    /// Planned while an overlapping release window was open (W3).
    pub windowed: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Thread {
    pub pc: Pc,
    /// Index of the script op running (or next to run).
    pub next_op: u8,
    pub acq: Option<Acq>,
    pub ev: Option<Ev>,
    pub inflight: Option<InFlight>,
    /// Leases held: (name, registration).
    pub held: SmallVec<[(LeaseId, Handle); 2]>,
    /// The current operation's dereg list.
    pub dereg: Vec<Handle>,
    /// `handoff-toctou`: entries marked INVALID whose count is still to be read.
    pub toctou: Vec<Handle>,
    /// Asleep in the kernel until its uffd event is read.
    pub waiting: bool,
    /// The entries A6/R2 noted unleased (sorted): the only possible victims.
    pub noted: Vec<Handle>,
    /// Lanes: the thread's store buffer, oldest first.
    pub sb: Vec<Store>,
    /// Lanes: the LN5 this thread is running.
    pub revoke: Option<Revoke>,
    /// Lanes: events taken from the queue or read from uffd, not applied yet
    /// (the step that applies them revokes first).
    pub popped: Vec<Span>,
    /// Lanes: an LN5 took the lock exclusive for the step that follows it.
    pub prelocked: bool,
    /// Lanes: the leases of `held` that are lane leases, with their lane
    /// and slot.
    pub lane_leases: Vec<(LeaseId, u8, u8)>,
    /// Lanes: the lane this thread holds the claim on (its thread-local
    /// claim list), if any.
    pub lane: Option<u8>,
    /// Lanes: the registrar failed (A5); its trim waits for its LN5.
    pub failing: bool,
    /// `CheckConfig::drain_rounds`: the post-unlock drain of A11 this
    /// thread runs (after its exclusive section, or its A1 hit), before it
    /// goes on; `None` when it runs none.
    pub post: Option<PostDrain>,
    /// `CheckConfig::proof_steps`: the monitor's proof signal to this thread
    /// (S7.5): at most one outstanding per thread.
    pub sig: Sig,
}

/// A thread's proof signal (spec.md#S7.5, `CheckConfig::proof_steps`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Sig {
    /// None outstanding.
    #[default]
    None,
    /// Sent; its handler has not run yet (it runs at the thread's next
    /// return to user mode).
    Pending,
    /// Its handler ran after the send (the acknowledgement slot holds its
    /// token); the prover's next pass collects it.
    Acked,
}

/// One REMOVE window the monitor is proving (spec.md#S7.5, M4;
/// `CheckConfig::proof_steps`): the threads that may still be inside its
/// madvise, each with whether it waits on a signal.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Proof {
    pub span: Span,
    pub m: Madvise,
    /// The prover has listed the threads and looked at each (its `begin`).
    pub scanned: bool,
    /// (thread, a signal sent or adopted for it).
    pub waiting: Vec<(u8, bool)>,
}

/// A11's post-unlock drain (`CheckConfig::drain_rounds`), as the cache runs
/// it: at most [`POST_DRAIN_ROUNDS`] rounds, each a check of the queue and
/// a try of the lock exclusive (a failure hands the drain to the holder,
/// which runs its own after its unlock), the drain, and the unlock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PostDrain {
    /// Rounds already run (0 before the first check).
    pub round: u8,
    /// The round holds the lock exclusive and has drained; next, its unlock.
    pub locked: bool,
}

/// Rounds of A11's post-unlock drain (the cache's `POST_UNLOCK_DRAINS`).
pub const POST_DRAIN_ROUNDS: u8 = 4;

/// Program counter of the uffd monitor thread (with several caches, of the
/// process monitor's reader, M6: `Idle`, then `Apply` once it has read,
/// until it publishes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MonPc {
    Idle,
    /// Polled readable (M1); waiting for the lock.
    Lock,
    /// Ready to read (holding the lock, except in `async-apply-outside-lock` and `async-blocking-read-outside-lock`).
    Read,
    /// Holding events it read, not yet applied.
    Apply,
}

/// A madvise REMOVE (`CheckConfig::remove`): the thread that raised it and
/// the index of the script op it is, which tells when it has returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Madvise {
    pub thread: u8,
    pub op: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Monitor {
    pub pc: MonPc,
    /// Events read, not yet applied (with the madvise, for a REMOVE); with
    /// several caches, read by the reader and not yet published (M6).
    pub buf: Vec<(Span, Option<Madvise>)>,
    pub dereg: Vec<Handle>,
    pub toctou: Vec<Handle>,
    /// Lanes: the monitor's store buffer (a revoke's null stores).
    pub sb: Vec<Store>,
    /// Lanes: the LN5 the monitor is running.
    pub revoke: Option<Revoke>,
    /// Lanes: events taken from the queue, not applied yet.
    pub popped: Vec<Span>,
    /// The process's monitor (`CheckConfig::caches` 2, M5): the cache the
    /// service thread's round drains next; `None` between rounds.
    pub svc: Option<u8>,
    /// Mutant `gate-before-apply`: per cache, the ring position its
    /// drain in the current round starts from (its gate was set ahead).
    pub svc_from: Vec<u8>,
}

/// A violation detected when a lease is granted (P1, P2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Bad {
    /// `props::P1` or `props::P2`.
    pub property: &'static str,
    pub thread: u8,
    pub lease: LeaseId,
    pub handle: Handle,
    /// P2: the first stale page, the generation pinned there, and the
    /// generation a release event completed before the acquire installed.
    pub page: u8,
    pub pinned: u8,
    pub needed: u8,
}

/// One cache's shared state, for a configuration with several caches on
/// one monitor (`CheckConfig::caches`, spec.md#M5): the caches other than
/// the one being stepped are kept here, and [`State::swap_cache`] exchanges
/// one with [`State`]'s own fields, so every step of §A runs unchanged on
/// the cache of the thread that takes it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct CacheSide {
    pub lock: Lock,
    pub regs: crate::shared::Shared<Vec<Reg>>,
    pub next_id: u8,
    pub queue: Vec<Span>,
    pub windows: Vec<Span>,
    pub windowed_served: bool,
    pub remove_windows: Vec<(Span, Madvise)>,
    pub over_limit: bool,
    pub clock: u8,
    pub trim_evicted: bool,
    pub applied: u8,
    pub lin: crate::history::History,
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// Physical truth: the generation of the frame mapped at each page.
    pub gens: Pages,
    /// Per page, the newest generation installed by a completed release event.
    pub done_gens: Pages,
    pub lock: Lock,
    pub regs: crate::shared::Shared<Vec<Reg>>,
    /// The id the next inserted entry gets (A9).
    pub next_id: u8,
    /// The invalidation queue (H1).
    pub queue: Vec<Span>,
    /// Open release windows (W1–W3), in opening order (a multiset).
    pub windows: Vec<Span>,
    /// `CheckConfig::memo`: the hit memo's slots, one per first page of a
    /// request (page, cell): the entry memory A1's last hit for a request
    /// starting there named. Never cleared (A0 reads them racily: the memory
    /// may hold another entry, or none, by then).
    pub memo: Vec<(u8, u8)>,
    /// `CheckConfig::memo`: the entry memory, one cell per entry that ever
    /// lived at once: the registration it holds now (the last A9 that took
    /// it) and its incarnation, one bit (the cache's has 21: a cell reused
    /// twice between A0's read and its compare-exchange stands for 2^21
    /// reuses, which only A0's key recheck covers).
    pub cells: Vec<(Handle, u8)>,
    /// Mutant `window-count-after-queue`: windows in `windows` whose W1 has
    /// not stored the open count yet (the count A4 and A7 load first is
    /// `windows.len()` minus this; 0 in the correct algorithm, where W1
    /// stores it with the window, under the windows' mutex).
    pub uncounted_windows: u8,
    /// Some registration planned inside a window was served uncached (W3).
    pub windowed_served: bool,
    /// The windows REMOVEs opened (M3), each also in `windows`, with the
    /// madvise that raised it: the monitor closes one once its madvise has
    /// returned (M4).
    pub remove_windows: Vec<(Span, Madvise)>,
    /// `CheckConfig::proof_steps`: the windows of `remove_windows` the
    /// monitor is proving, in opening order (one cache only).
    pub proofs: Vec<Proof>,
    /// uffd events queued by the kernel and not read yet, with the sleeping thread.
    pub uffd: Vec<(Span, Actor)>,
    /// The process's monitor (`CheckConfig::caches` 2, M6): the event ring,
    /// the events published and not yet applied by every cache (a prefix
    /// every cache applied is dropped, and the `applied` counts lowered).
    pub ring: Vec<(Span, Option<Madvise>)>,
    /// M6: the event clock is odd (the reader is inside a read whose
    /// events are not published yet).
    pub reading: bool,
    /// M6: how many events of `ring` this cache has applied (its gate).
    pub applied: u8,
    /// A10's over-limit flag.
    pub over_limit: bool,
    /// LRU clock (only advanced when limits are configured).
    pub clock: u8,
    /// Cost-aware eviction: the GreedyDual-Size floor, raised to each
    /// victim's priority (S6.3).
    pub gds_floor: u32,
    /// Shared with the states before, each until it changes (a step moves
    /// one thread; the others are not copied).
    pub threads: Vec<crate::shared::Shared<Thread>>,
    /// Shared with the states before until the monitor moves.
    pub monitor: crate::shared::Shared<Monitor>,
    /// The registrar may still free memory at an A5 (once per run).
    pub registrar_free_left: bool,
    /// The cache may still free its own memory at an A9 (once per run).
    pub cache_free_left: bool,
    /// Registrar failures still to come (see `CheckConfig::registrar_failures`).
    pub reg_failures_left: u8,
    /// Some trim evicted an entry (for the `sometimes` goal).
    pub trim_evicted: bool,
    /// Lanes: the lanes, in memory (empty without lanes); lane `t` starts
    /// claimed by thread `t`.
    pub lanes: Vec<Vec<Slot>>,
    /// Lanes: each lane's claim flag (`taken`) in memory.
    pub claimed: Vec<bool>,
    /// Lanes: claims threads may still give back (`CheckConfig::give_backs`).
    pub give_backs_left: u8,
    pub bad: Vec<Bad>,
    /// Invocations and returns of every operation, per thread.
    pub lin: crate::history::History,
    /// The other caches on the same monitor (cache `c` is `others[c - 1]`
    /// while cache 0's state is in the fields above; see [`CacheSide`]).
    pub others: Vec<CacheSide>,
    /// kdreg2 models: the module's mutex is held by the evictor's read
    /// (between its lock and its copy-out).
    pub klock: bool,
    /// kdreg2 models: the module's event queue (one event per destroyed
    /// region: its range), not read yet; `pending_events` is its length.
    pub kqueue: Vec<Span>,
    /// kdreg2 (9a31fe2): ranges a notifier found the mutex busy for, left
    /// to the kernel worker.
    pub kdeferred: Vec<Span>,
}

impl State {
    /// Exchanges cache `c`'s state (c >= 1) with the fields of `self`, which
    /// hold cache 0's between steps. Call it again to swap back.
    pub fn swap_cache(&mut self, c: usize) {
        if c == 0 {
            return;
        }
        let o = &mut self.others[c - 1];
        std::mem::swap(&mut self.lock, &mut o.lock);
        std::mem::swap(&mut self.regs, &mut o.regs);
        std::mem::swap(&mut self.next_id, &mut o.next_id);
        std::mem::swap(&mut self.queue, &mut o.queue);
        std::mem::swap(&mut self.windows, &mut o.windows);
        std::mem::swap(&mut self.windowed_served, &mut o.windowed_served);
        std::mem::swap(&mut self.remove_windows, &mut o.remove_windows);
        std::mem::swap(&mut self.over_limit, &mut o.over_limit);
        std::mem::swap(&mut self.clock, &mut o.clock);
        std::mem::swap(&mut self.trim_evicted, &mut o.trim_evicted);
        std::mem::swap(&mut self.applied, &mut o.applied);
        std::mem::swap(&mut self.lin, &mut o.lin);
    }

    /// A copy with cache `c`'s state in the fields (for predicates).
    pub fn seen_from_cache(&self, c: usize) -> std::borrow::Cow<'_, State> {
        if c == 0 {
            return std::borrow::Cow::Borrowed(self);
        }
        let mut v = self.clone();
        v.swap_cache(c);
        std::borrow::Cow::Owned(v)
    }

    /// No operation is in flight on any thread (the monitor may be busy).
    pub fn quiescent(&self) -> bool {
        self.threads.iter().all(|t| matches!(t.pc, Pc::Idle | Pc::Done) && t.ev.is_none() && t.toctou.is_empty() && t.post.is_none())
    }

    /// Every script finished and nothing is left to do for anyone.
    pub fn all_finished(&self) -> bool {
        self.threads.iter().all(|t| t.pc == Pc::Done && t.ev.is_none() && t.toctou.is_empty() && t.post.is_none())
            && self.monitor.pc == MonPc::Idle
            && self.monitor.buf.is_empty()
            && self.monitor.svc.is_none()
            && self.applied as usize == self.ring.len()
            && self.others.iter().all(|o| o.applied as usize == self.ring.len())
            && self.monitor.toctou.is_empty()
            && self.uffd.is_empty()
            && self.kqueue.is_empty()
            && self.kdeferred.is_empty()
            && self.remove_windows.is_empty()
            && self.others.iter().all(|o| o.remove_windows.is_empty())
    }

    /// Actor `a`'s store buffer.
    pub fn sb(&self, a: Actor) -> &[Store] {
        if a == MONITOR {
            &self.monitor.sb
        } else {
            &self.threads[a as usize].sb
        }
    }

    /// `held` of a slot as actor `a` loads it (x86-TSO: its own newest
    /// buffered store to it, else memory).
    pub fn load_held(&self, a: Actor, lane: usize, slot: usize) -> u8 {
        self.sb(a)
            .iter()
            .rev()
            .find_map(|st| match *st {
                Store::Held { lane: l, slot: i, val } if l as usize == lane && i as usize == slot => Some(val),
                _ => None,
            })
            .unwrap_or(self.lanes[lane][slot].held)
    }

    /// `ptr` of a slot as actor `a` loads it.
    pub fn load_ptr(&self, a: Actor, lane: usize, slot: usize) -> Option<Handle> {
        self.sb(a)
            .iter()
            .rev()
            .find_map(|st| match *st {
                Store::Ptr { lane: l, slot: i, val } if l as usize == lane && i as usize == slot => Some(val),
                _ => None,
            })
            .unwrap_or(self.lanes[lane][slot].ptr)
    }

    /// The thread holding lane `lane`'s claim, if any.
    pub fn lane_holder(&self, lane: usize) -> Option<Actor> {
        self.threads.iter().position(|t| t.lane == Some(lane as u8)).map(|t| t as Actor)
    }

    /// A slot's lease count (`held - remote`) as its lane's holder sees it
    /// (memory if no thread holds the lane).
    pub fn slot_count(&self, lane: usize, slot: usize) -> u8 {
        let held = match self.lane_holder(lane) {
            Some(a) => self.load_held(a, lane, slot),
            None => self.lanes[lane][slot].held,
        };
        held.wrapping_sub(self.lanes[lane][slot].remote)
    }

    /// Where lane lease `lease` is counted: (the thread holding it, lane, slot).
    pub fn lane_lease(&self, lease: LeaseId) -> Option<(usize, u8, u8)> {
        self.threads
            .iter()
            .enumerate()
            .find_map(|(t, th)| th.lane_leases.iter().find(|(l, _, _)| *l == lease).map(|&(_, lane, slot)| (t, lane, slot)))
    }

    /// Some thread holds a lease (state word or lane) on registration `h`.
    pub fn lease_held_on(&self, h: Handle) -> bool {
        self.threads.iter().any(|t| t.held.iter().any(|(_, x)| *x == h))
    }

    /// An actor is running LN5, or an LN4 between its two count reads: it
    /// holds the lanes mutex.
    pub fn lanes_mutex_held(&self) -> bool {
        self.monitor.revoke.is_some() || self.threads.iter().any(|t| t.revoke.is_some() || matches!(t.pc, Pc::LN4Held { .. }))
    }

    /// The registrations of every cache (one unless `CheckConfig::caches`).
    pub fn all_regs(&self) -> impl Iterator<Item = &Reg> {
        self.regs.iter().chain(self.others.iter().flat_map(|o| o.regs.iter()))
    }

    pub fn findable_count(&self) -> usize {
        self.regs.iter().filter(|r| r.findable).count()
    }

    /// The cache's lock, its queue, and its windows and over-limit flag
    /// (the fields [`State::swap_cache`] exchanges, but the registrations):
    /// three parts of a summary line, each but the lock empty or led by ` | `.
    fn cache_parts(&self) -> [String; 3] {
        let lock = match self.lock {
            Lock::Free => "lock free".to_string(),
            Lock::Shared(n) => format!("lock shared({n})"),
            Lock::Exclusive(a) => format!("lock exclusive({})", actor_name(a)),
        };
        let mut queue = String::new();
        if !self.queue.is_empty() {
            queue += &format!(" | queue {:?}", self.queue);
        }
        let mut rest = String::new();
        if !self.windows.is_empty() {
            rest += &format!(" | open windows {:?}", self.windows);
        }
        if !self.remove_windows.is_empty() {
            let w: Vec<String> = self.remove_windows.iter().map(|(s, m)| format!("{s} (T{}'s madvise, op {})", m.thread, m.op)).collect();
            rest += &format!(" | REMOVE windows for M4 {}", w.join(", "));
        }
        for p in &self.proofs {
            let w: Vec<String> = p.waiting.iter().map(|(t, sent)| format!("T{t}{}", if *sent { " (signalled)" } else { "" })).collect();
            if p.scanned {
                rest += &format!(" | M4 proving {}: waits on [{}]", p.span, w.join(", "));
            } else {
                rest += &format!(" | M4 proving {}: not scanned yet", p.span);
            }
        }
        let sigs: Vec<String> =
            self.threads.iter().enumerate().filter(|(_, t)| t.sig != Sig::None).map(|(i, t)| format!("T{i} {:?}", t.sig)).collect();
        if !sigs.is_empty() {
            rest += &format!(" | proof signals {}", sigs.join(", "));
        }
        if self.over_limit {
            rest += " | over-limit flag";
        }
        if !self.ring.is_empty() || self.applied > 0 {
            rest += &format!(" | applied {} of the ring's {}", self.applied, self.ring.len());
        }
        [lock, queue, rest]
    }

    /// The cache's registrations, one line each.
    fn regs_lines(&self) -> String {
        if self.regs.is_empty() {
            return "    registrations: none\n".into();
        }
        self.regs.iter().enumerate().map(|(h, r)| format!("    {}\n", reg_line(h as Handle, r))).collect()
    }

    /// One line per piece of shared state, for timelines and the Explorer.
    /// With several caches on one monitor (`CheckConfig::caches`), each
    /// cache's lock, queue, windows and registrations under its number, and
    /// each thread's cache.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let multi = !self.others.is_empty();
        let gens: Vec<String> = self.gens.iter().enumerate().map(|(p, g)| format!("p{p}:g{g}")).collect();
        let [lock, queue, rest] = self.cache_parts();
        out += &format!("{}{lock} | truth {}{queue}", if multi { "cache 0: " } else { "" }, gens.join(" "));
        if !self.uffd.is_empty() {
            let u: Vec<String> = self.uffd.iter().map(|(s, w)| format!("{s} (T{w} asleep)")).collect();
            out += &format!(" | uffd unread {}", u.join(", "));
        }
        if !self.monitor.buf.is_empty() {
            let b: Vec<String> = self
                .monitor
                .buf
                .iter()
                .map(|(s, m)| match m {
                    Some(m) => format!("{s} (REMOVE by T{})", m.thread),
                    None => format!("{s}"),
                })
                .collect();
            let what = if multi { "reader read, not published" } else { "monitor read, not applied" };
            out += &format!(" | {what} [{}]", b.join(", "));
        }
        if self.reading {
            out += " | event clock odd (reading)";
        }
        if self.klock {
            out += " | kdreg2 mutex held by the evictor";
        }
        if !self.kqueue.is_empty() {
            let q: Vec<String> = self.kqueue.iter().map(|s| s.to_string()).collect();
            out += &format!(" | kdreg2 events pending [{}]", q.join(", "));
        }
        if !self.kdeferred.is_empty() {
            let q: Vec<String> = self.kdeferred.iter().map(|s| s.to_string()).collect();
            out += &format!(" | kdreg2 worker to run on [{}]", q.join(", "));
        }
        if !self.ring.is_empty() {
            let r: Vec<String> = self
                .ring
                .iter()
                .map(|(s, m)| match m {
                    Some(m) => format!("{s} (REMOVE by T{})", m.thread),
                    None => format!("{s}"),
                })
                .collect();
            out += &format!(" | ring [{}]", r.join(", "));
        }
        out += &rest;
        out += "\n";
        out += &self.regs_lines();
        for c in 1..=self.others.len() {
            let v = self.seen_from_cache(c);
            out += &format!("cache {c}: {}\n", v.cache_parts().concat());
            out += &v.regs_lines();
        }
        for (t, th) in self.threads.iter().enumerate() {
            let mut line = if multi {
                format!("    T{t} (cache {}): {:?}", t % (self.others.len() + 1), th.pc)
            } else {
                format!("    T{t}: {:?}", th.pc)
            };
            if let Some(ev) = &th.ev {
                line += &format!(" event {:?} {} ({:?})", ev.kind, ev.span, ev.pc);
            }
            if let Some(a) = &th.acq {
                line += &format!(" acquiring L{} {} {}", a.lease, a.req, a.access);
                if a.attempts > 0 {
                    line += &format!(" (attempt {})", a.attempts + 1);
                }
            }
            if let Some(i) = &th.inflight {
                line += &format!(" in-flight {}{}", i.span, if i.stale { " STALE" } else { "" });
            }
            if th.waiting {
                line += " asleep until its uffd event is read";
            }
            if !th.held.is_empty() {
                let h: Vec<String> = th
                    .held
                    .iter()
                    .map(|(l, h)| {
                        let lane = th.lane_leases.iter().any(|(x, _, _)| x == l);
                        format!("L{l}->#{h}{}", if lane { " (lane)" } else { "" })
                    })
                    .collect();
                line += &format!(" holds {}", h.join(" "));
            }
            if let Some(lane) = self.lanes.get(t) {
                let claim = match (th.lane, self.claimed.get(t)) {
                    (Some(l), _) if l as usize == t => String::new(),
                    (Some(l), _) => format!(" | holds the claim on lane {l}"),
                    (None, _) => " | holds no lane claim".to_string(),
                };
                line += &claim;
                for (i, sl) in lane.iter().enumerate() {
                    if sl.key.is_some() || sl.held > 0 || sl.remote > 0 || sl.pin.is_some() {
                        line += &format!(" | slot{i} {}", slot_line(sl));
                    }
                }
                if self.claimed.get(t) == Some(&false) {
                    line += &format!(" | lane {t} free");
                }
            }
            if !th.sb.is_empty() {
                line += &format!(" | store buffer {}", buf_line(&th.sb));
            }
            if let Some(r) = &th.revoke {
                line += &format!(" | LN5 ({:?} next) on {:?}", r.phase, r.slots);
            }
            if !th.popped.is_empty() {
                line += &format!(" | taken, not applied {:?}", th.popped);
            }
            out += &line;
            out += "\n";
        }
        if let Some(c) = self.monitor.svc {
            out += &format!("    service thread: its round drains cache {c} next\n");
        }
        if self.monitor.pc != MonPc::Idle || !self.monitor.buf.is_empty() {
            let mut line = format!("    {}: {:?}", if multi { "reader" } else { "monitor" }, self.monitor.pc);
            if !self.monitor.sb.is_empty() {
                line += &format!(" | store buffer {}", buf_line(&self.monitor.sb));
            }
            if let Some(r) = &self.monitor.revoke {
                line += &format!(" | LN5 ({:?} next) on {:?}", r.phase, r.slots);
            }
            out += &line;
            out += "\n";
        }
        out
    }
}

pub fn actor_name(a: Actor) -> String {
    if a == MONITOR {
        "monitor".into()
    } else {
        format!("T{a}")
    }
}

pub fn slot_line(sl: &Slot) -> String {
    let mut s = match sl.key {
        Some((span, acc)) => format!("key {span} {acc}"),
        None => "no key".to_string(),
    };
    match sl.ptr {
        Some(h) => s += &format!(" ptr #{h}"),
        None => s += " ptr null",
    }
    s += &format!(" held {}", sl.held);
    if sl.remote > 0 {
        s += &format!(" remote {}", sl.remote);
    }
    if let Some(p) = sl.pin {
        s += &format!(" pin #{p}");
    }
    s
}

pub fn buf_line(buf: &[Store]) -> String {
    let v: Vec<String> = buf
        .iter()
        .map(|st| match st {
            Store::Held { lane, slot, val } => format!("T{lane}.slot{slot}.held={val}"),
            Store::Ptr { lane, slot, val: Some(h) } => format!("T{lane}.slot{slot}.ptr=#{h}"),
            Store::Ptr { lane, slot, val: None } => format!("T{lane}.slot{slot}.ptr=null"),
            Store::Claim { lane } => format!("lane{lane}.taken=false"),
            Store::Handover { lease } => format!("hand L{lease} over"),
        })
        .collect();
    format!("[{}]", v.join(", "))
}

pub fn reg_line(h: Handle, r: &Reg) -> String {
    let mut s = format!("#{h} {} {} pinned {:?}", r.span, r.access, r.pinned);
    if r.id > 0 {
        s += &format!(" R{}", r.id);
    }
    s += if r.findable {
        " findable"
    } else if r.id > 0 {
        " out of the index"
    } else {
        " never cached"
    };
    if r.invalid {
        s += " INVALID";
    }
    if r.kgen {
        s += " generation changed";
    } else if r.kmon {
        s += " monitored";
    }
    if r.leases > 0 {
        s += &format!(" leases={}", r.leases);
    }
    match r.deregs {
        0 => {}
        1 => s += " deregistered",
        n => s += &format!(" deregistered x{n}"),
    }
    s
}

impl fmt::Debug for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.summary())
    }
}
