//! The wait model: who may wait on whom around the userfaultfd monitor
//! (spec.md S7.7).
//!
//! A separate, small stateright model, apart from the §A model of the rest
//! of this crate. It knows nothing of entries, leases or ranges: only the
//! threads, the resources they hold and the things they wait for, and asks
//! one question: can the threads ever wait on each other in a cycle?
//!
//! # Threads
//!
//! * The **reader** ([`Tid::Reader`]): `poll` on the uffd, clock odd, a
//!   non-blocking read into memory that is mapped once and never freed
//!   (which wakes every thread whose event it read), publication into the
//!   preallocated ring, clock even, an eventfd write that wakes the service.
//!   In the correct design it holds nothing and waits on nothing but an
//!   empty uffd.
//! * The **service** ([`Tid::Service`]): waits on its eventfd; snapshots the
//!   member list under the members mutex and releases it; for each of the two
//!   caches takes its lock, drains the ring (which may free memory: a
//!   `free` that trims the heap), unlocks; then runs a deregistration
//!   callback with no lock held.
//! * Up to two **application threads**, each running `ops` operations chosen
//!   from [`Op`]: acquires (cache lock, allocation, the hit gate), `free`
//!   that trims the heap with `brk`, a callback's `munmap`, a create or
//!   destroy of a cache, an acquire on the other cache, `fork`.
//! * The **fork child**, once an application thread has forked: it creates a
//!   cache (the process lock, with the takeover rule; a fresh hub).
//!
//! # Resources and waits
//!
//! Five mutexes ([`Res`]): the heap (glibc's arena lock), the two caches'
//! locks, the hub's members mutex and the process lock. A thread that
//! releases watched memory (`munmap`, `madvise`, `brk`) queues an event in
//! the uffd and then waits until the reader has read it: a wait on the reader.
//! A3/A8 yield while the event clock is odd: a wait on the reader too.
//!
//! The wait-for graph has one edge per blocked thread: to the holder of the
//! mutex it waits for, or to the reader for a read or an odd clock. In the
//! fork child, a copy of a mutex held at the fork by a parent's thread is
//! held by a *ghost*, a thread that does not exist in the child and never
//! runs again: a node that waits on itself.
//!
//! # Properties
//!
//! * [`NO_WAIT_CYCLE`] (always): no cycle in the wait-for graph (a chain that
//!   ends at a ghost is one).
//! * [`READER_NEVER_BLOCKS`] (always): the reader waits on nothing but an
//!   empty uffd.
//! * [`ALL_APP_THREADS_FINISH`] (eventually): every path ends with every
//!   application thread (and the fork child) done; in particular every
//!   release is read and its thread woken. The model's state graph is
//!   acyclic (the reader runs a round per batch of events, the service one
//!   per wake, callbacks have a budget), so stateright checks this at every
//!   terminal state.
//!
//! [`WaitMutant`] lists the broken variants (the old design's hangs put
//! back); each must violate the property it names.
//!
//! # Reductions and bounds
//!
//! * A mutex held across one step that cannot block (an allocation's heap
//!   lock, the service's snapshot, a drain that frees nothing, glibc's heap
//!   lock across `fork`) is taken and released in that step (`Step::Brief`):
//!   its holder is runnable, so it cannot close a cycle.
//! * The service (or, under `reader-runs-deregs`, the reader) has a budget of
//!   `extras` per run: a drain that frees memory or a callback. Without it a
//!   callback's `munmap` would wake the service again, without end.
//! * The ring, the lapping and the events' contents are not modeled: the
//!   reader overwrites a lapped cache's slots instead of waiting for it, and
//!   draining is a non-blocking read of the ring (a drain that frees memory
//!   is modeled as such).
//! * Locks are taken in one order (process, members, cache, heap) by every
//!   thread; callbacks run with no cache lock held.

use stateright::{Checker, Expectation, Model, Property};
use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

/// Always: no cycle in the wait-for graph.
pub const NO_WAIT_CYCLE: &str = "no-wait-cycle";
/// Always: the reader is never blocked on anything but an empty uffd.
pub const READER_NEVER_BLOCKS: &str = "reader-never-blocks";
/// Eventually: every application thread (and the fork child) finishes, so
/// every releasing thread is woken.
pub const ALL_APP_THREADS_FINISH: &str = "all-app-threads-finish";
/// Sometimes: an application thread waits on another that waits on the reader.
pub const S_CHAIN: &str = "sometimes: a thread waits on a thread that waits for a read";
/// Sometimes: a callback on the service thread waits for a read.
pub const S_SERVICE_CALLBACK_READ: &str = "sometimes: a service callback waits for its read";
/// Sometimes: the fork child takes over the process lock from a parent's thread.
pub const S_TAKEOVER: &str = "sometimes: the fork child takes over the process lock";
/// Sometimes: an acquire yields at the hit gate while the clock is odd.
pub const S_GATE: &str = "sometimes: an acquire waits at the hit gate (clock odd)";

/// A thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tid {
    Reader,
    Service,
    /// Application thread `i` (0 or 1).
    App(u8),
    /// The fork child's (only) thread.
    Child,
}

impl Tid {
    fn idx(self) -> usize {
        match self {
            Tid::Reader => 0,
            Tid::Service => 1,
            Tid::App(i) => 2 + i as usize,
            Tid::Child => 4,
        }
    }

    const ALL: [Tid; 5] = [Tid::Reader, Tid::Service, Tid::App(0), Tid::App(1), Tid::Child];
}

impl fmt::Display for Tid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tid::Reader => write!(f, "reader"),
            Tid::Service => write!(f, "service"),
            Tid::App(i) => write!(f, "T{i}"),
            Tid::Child => write!(f, "child"),
        }
    }
}

/// A mutex.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Res {
    /// glibc's arena lock: every allocation, and `free` across its `brk`.
    Heap,
    /// The lock of the cache the application threads use.
    Cache0,
    /// The lock of another cache (a callback acquires on it).
    Cache1,
    /// The hub's members mutex.
    Members,
    /// The process lock of create/destroy.
    Process,
}

impl Res {
    fn idx(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Res {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Res::Heap => "heap lock",
            Res::Cache0 => "cache 0's lock",
            Res::Cache1 => "cache 1's lock",
            Res::Members => "members mutex",
            Res::Process => "process lock",
        })
    }
}

/// One step of a thread's program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Step {
    Lock(Res),
    Unlock(Res),
    /// `munmap`/`madvise`/`brk` of watched memory: the kernel queues an event
    /// (the thread then waits for its read: [`Step::AwaitRead`]).
    Release,
    /// Blocked in the kernel until the reader has read this thread's event.
    AwaitRead,
    /// A3/A8's hit gate: yield while the event clock is odd.
    Gate,
    /// Holds a mutex for one step that cannot block (an allocation holds
    /// the heap lock, the service's snapshot the members mutex, a drain that
    /// frees nothing the cache lock): lock and unlock in one step. The holder
    /// is runnable throughout, so it cannot close a cycle.
    Brief(Res),
    /// Reader: `poll` until the uffd holds an event, then clock odd.
    PollOdd,
    /// Reader (`reader-takes-cache-lock`): `poll` alone.
    Poll,
    ClockOdd,
    /// Reader: the non-blocking read of every queued event (wakes their threads).
    Read,
    /// Reader: publish into the ring, clock even, the eventfd write.
    EvenWake,
    /// Service: wait on the eventfd.
    AwaitWake,
    /// Service: drain the ring into a cache under its lock; with extras
    /// left, a choice: the drain frees memory (`free`→`brk` under the
    /// cache lock) or not.
    Drain(Res),
    /// A deregistration callback (a choice among [`Cb`], or none).
    Callback,
    Fork,
    /// The fork child locks its copy of a mutex.
    ChildLock(Res),
    ChildUnlock(Res),
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Lock(r) | Step::ChildLock(r) => write!(f, "lock {r}"),
            Step::Unlock(r) | Step::ChildUnlock(r) => write!(f, "unlock {r}"),
            Step::Release => write!(f, "release watched memory (event queued)"),
            Step::AwaitRead => write!(f, "woken: its event was read"),
            Step::Gate => write!(f, "hit gate passed (clock even)"),
            Step::Brief(Res::Heap) => write!(f, "allocates (heap lock, briefly)"),
            Step::Brief(Res::Members) => write!(f, "snapshot of the members (members mutex, briefly)"),
            Step::Brief(r) => write!(f, "drain ({r}, briefly)"),
            Step::PollOdd => write!(f, "poll: an event is queued; clock odd"),
            Step::Poll => write!(f, "poll: an event is queued"),
            Step::ClockOdd => write!(f, "clock odd"),
            Step::Read => write!(f, "read the queued events (their threads wake)"),
            Step::EvenWake => write!(f, "publish, clock even, eventfd write"),
            Step::AwaitWake => write!(f, "woken by the eventfd"),
            Step::Drain(r) => write!(f, "drain ({r}, briefly)"),
            Step::Callback => write!(f, "callback"),
            Step::Fork => write!(f, "fork"),
        }
    }
}

/// What a deregistration callback's body does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cb {
    /// Frees its record: `free` trims the heap over watched memory.
    Free,
    /// `munmap`s the registered memory.
    Munmap,
    /// Creates or destroys another cache.
    CreateDestroy,
    /// Acquires on the other cache.
    AcquireOther,
}

impl Cb {
    const ALL: [Cb; 4] = [Cb::Free, Cb::Munmap, Cb::CreateDestroy, Cb::AcquireOther];

    fn body(self) -> Vec<Step> {
        use Step::*;
        match self {
            Cb::Free => vec![Lock(Res::Heap), Release, AwaitRead, Unlock(Res::Heap)],
            Cb::Munmap => vec![Release, AwaitRead],
            // Create/destroy: the process lock, the members mutex, and a
            // `free` that trims the heap under both.
            Cb::CreateDestroy => vec![
                Lock(Res::Process),
                Lock(Res::Members),
                Lock(Res::Heap),
                Release,
                AwaitRead,
                Unlock(Res::Heap),
                Unlock(Res::Members),
                Unlock(Res::Process),
            ],
            Cb::AcquireOther => acquire(Res::Cache1),
        }
    }
}

/// An acquire on `cache`: its lock, the hit gate, an allocation under the lock.
fn acquire(cache: Res) -> Vec<Step> {
    use Step::*;
    vec![Lock(cache), Gate, Brief(Res::Heap), Unlock(cache)]
}

/// An application thread's operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// An acquire on cache 0: lock, hit gate, allocation, unlock.
    Acquire,
    /// An acquire whose drain (A2/A6) frees memory: `free`→`brk` under the
    /// cache lock, then the hit gate.
    AcquireFrees,
    /// `free` trims the heap with `brk` over once-watched pages: the heap
    /// lock is held while the thread waits for the read.
    FreeBrk,
    /// A callback (after its acquire's unlock): one of [`Cb`].
    Callback(Cb),
    /// `fork` (at most once per run): glibc takes the heap lock across it
    /// (one step: it cannot block while it holds it) and resets it in the child.
    Fork,
}

impl Op {
    fn body(self) -> Vec<Step> {
        use Step::*;
        match self {
            Op::Acquire => acquire(Res::Cache0),
            Op::AcquireFrees => {
                vec![Lock(Res::Cache0), Lock(Res::Heap), Release, AwaitRead, Unlock(Res::Heap), Gate, Unlock(Res::Cache0)]
            }
            Op::FreeBrk => Cb::Free.body(),
            Op::Callback(cb) => cb.body(),
            Op::Fork => vec![Fork],
        }
    }

    /// Every operation (a callback that frees is [`Op::FreeBrk`]).
    const ALL: [Op; 7] = [
        Op::Acquire,
        Op::AcquireFrees,
        Op::FreeBrk,
        Op::Callback(Cb::Munmap),
        Op::Callback(Cb::CreateDestroy),
        Op::Callback(Cb::AcquireOther),
        Op::Fork,
    ];
}

/// The fork child's copy of a mutex.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Inherited {
    Free,
    /// Held at the fork by this parent's thread, which does not exist in the child.
    Ghost(Tid),
    Child,
}

/// The wait model's broken variants: the old design's hangs put back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WaitMutant {
    /// The reader allocates (takes the heap lock) before it reads.
    ReaderAllocates,
    /// The reader runs the deregistration callbacks.
    ReaderRunsDeregs,
    /// The service holds the members mutex across the callbacks.
    MembersLockAcrossCallbacks,
    /// The process lock is a plain mutex: a fork child that finds it held
    /// waits forever.
    ForkWithProcessLock,
    /// The old round: the reader takes every cache's lock before it reads.
    ReaderTakesCacheLock,
    /// The fork child reuses the parent's hub: it locks its copy of the
    /// members mutex, which a parent's thread may hold.
    ChildReusesHub,
}

impl WaitMutant {
    /// Every wait mutant.
    pub const ALL: [WaitMutant; 6] = [
        WaitMutant::ReaderAllocates,
        WaitMutant::ReaderRunsDeregs,
        WaitMutant::MembersLockAcrossCallbacks,
        WaitMutant::ForkWithProcessLock,
        WaitMutant::ReaderTakesCacheLock,
        WaitMutant::ChildReusesHub,
    ];

    /// The mutant's name.
    pub fn name(self) -> &'static str {
        match self {
            WaitMutant::ReaderAllocates => "reader-allocates",
            WaitMutant::ReaderRunsDeregs => "reader-runs-deregs",
            WaitMutant::MembersLockAcrossCallbacks => "members-lock-across-callbacks",
            WaitMutant::ForkWithProcessLock => "fork-with-process-lock",
            WaitMutant::ReaderTakesCacheLock => "reader-takes-cache-lock",
            WaitMutant::ChildReusesHub => "child-reuses-hub",
        }
    }

    /// One line: what the mutant breaks.
    pub fn description(self) -> &'static str {
        match self {
            WaitMutant::ReaderAllocates => "the reader takes the heap lock before it reads",
            WaitMutant::ReaderRunsDeregs => "the reader runs the deregistration callbacks",
            WaitMutant::MembersLockAcrossCallbacks => "the service holds the members mutex while it runs callbacks",
            WaitMutant::ForkWithProcessLock => "the process lock is a plain mutex: no takeover in a fork child",
            WaitMutant::ReaderTakesCacheLock => "the reader takes every cache's lock before it reads",
            WaitMutant::ChildReusesHub => "a fork child locks the parent's members mutex (no fresh hub)",
        }
    }

    /// The properties that catch it: the first is the one that must be
    /// violated; the others may be.
    pub fn caught_by(self) -> &'static [&'static str] {
        match self {
            WaitMutant::ReaderAllocates | WaitMutant::ReaderRunsDeregs | WaitMutant::ReaderTakesCacheLock => {
                &[NO_WAIT_CYCLE, READER_NEVER_BLOCKS, ALL_APP_THREADS_FINISH]
            }
            WaitMutant::MembersLockAcrossCallbacks | WaitMutant::ForkWithProcessLock | WaitMutant::ChildReusesHub => {
                &[NO_WAIT_CYCLE, ALL_APP_THREADS_FINISH]
            }
        }
    }
}

impl fmt::Display for WaitMutant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for WaitMutant {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let wanted = s.trim().replace('_', "-");
        WaitMutant::ALL.into_iter().find(|m| m.name() == wanted).ok_or_else(|| {
            let names: Vec<_> = WaitMutant::ALL.iter().map(|m| m.name()).collect();
            format!("unknown wait mutant `{s}` (expected one of: {})", names.join(", "))
        })
    }
}

/// A configuration of the wait model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitConfig {
    /// Application threads (1 or 2).
    pub apps: u8,
    /// Operations per application thread.
    pub ops: u8,
    /// An application thread may fork (once per run).
    pub fork: bool,
    /// Budget of service (or, under `reader-runs-deregs`, reader) extras per
    /// run: a callback, or a drain that frees memory.
    pub extras: u8,
    pub mutant: Option<WaitMutant>,
}

impl Default for WaitConfig {
    fn default() -> Self {
        WaitConfig { apps: 2, ops: 1, fork: true, extras: 1, mutant: None }
    }
}

impl WaitConfig {
    /// The configuration with `m` (the default one suffices for each mutant).
    pub fn with_mutant(self, m: WaitMutant) -> Self {
        WaitConfig { mutant: Some(m), ..self }
    }

    /// One line.
    pub fn describe(&self) -> String {
        format!(
            "wait model: {} app thread(s) x {} op(s){}, {} extra(s){}",
            self.apps,
            self.ops,
            if self.fork { ", fork" } else { "" },
            self.extras,
            self.mutant.map(|m| format!(", mutant {m}")).unwrap_or_default()
        )
    }

    fn is(&self, m: WaitMutant) -> bool {
        self.mutant == Some(m)
    }

    /// The reader's round.
    //= spec.md#M6
    //# The reader allocates nothing, takes no lock, runs no user code, deregisters nothing and never exits
    fn reader_round(&self) -> Vec<Step> {
        use Step::*;
        if self.is(WaitMutant::ReaderTakesCacheLock) {
            return vec![Poll, Lock(Res::Cache0), Lock(Res::Cache1), ClockOdd, Read, Unlock(Res::Cache1), Unlock(Res::Cache0), EvenWake];
        }
        let mut round = vec![PollOdd];
        if self.is(WaitMutant::ReaderAllocates) {
            round.push(Brief(Res::Heap));
        }
        round.extend([Read, EvenWake]);
        if self.is(WaitMutant::ReaderRunsDeregs) {
            round.push(Callback);
        }
        round
    }

    /// The service's round.
    fn service_round(&self) -> Vec<Step> {
        use Step::*;
        if self.is(WaitMutant::MembersLockAcrossCallbacks) {
            return vec![AwaitWake, Lock(Res::Members), Drain(Res::Cache0), Brief(Res::Cache1), Callback, Unlock(Res::Members)];
        }
        let mut round = vec![AwaitWake, Brief(Res::Members), Drain(Res::Cache0), Brief(Res::Cache1)];
        if !self.is(WaitMutant::ReaderRunsDeregs) {
            round.push(Callback);
        }
        round
    }

    fn child_program(&self) -> Vec<Step> {
        use Step::*;
        if self.is(WaitMutant::ChildReusesHub) {
            vec![ChildLock(Res::Process), ChildLock(Res::Members), ChildUnlock(Res::Members), ChildUnlock(Res::Process)]
        } else {
            vec![ChildLock(Res::Process), ChildUnlock(Res::Process)]
        }
    }
}

/// A thread's state: its remaining steps (the next one last) and the
/// operations it has yet to choose.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Th {
    todo: Vec<Step>,
    ops_left: u8,
}

impl Th {
    fn next(&self) -> Option<Step> {
        self.todo.last().copied()
    }

    fn push(&mut self, body: Vec<Step>) {
        self.todo.extend(body.into_iter().rev());
    }
}

/// A state of the wait model.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WState {
    th: [Th; 5],
    holder: [Option<Tid>; 5],
    child_copy: [Inherited; 5],
    /// Threads whose event is queued in the uffd and not yet read (by index).
    pending: u8,
    clock_odd: bool,
    wake: bool,
    forked: bool,
    extras_left: u8,
}

/// An action: a thread's next step, or its choice at a choice point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WAction {
    Step(Tid),
    /// An application thread starts an operation.
    Begin(Tid, Op),
    /// A `Callback` step: a callback body, or `None` (none left to run).
    Callback(Tid, Option<Cb>),
    /// The service's drain frees memory (`free`→`brk` under cache 0's lock), or not.
    Drain(Tid, bool),
}

/// What a thread is waiting on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// It can take a step (or is choosing).
    Runs,
    /// Finished (application threads), or not forked (the child).
    Done,
    /// Idle on an empty uffd (reader) or an unwritten eventfd (service).
    Idle,
    /// Blocked on a node of the wait-for graph.
    On(Node, Why),
}

/// A node of the wait-for graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    T(Tid),
    /// A parent's thread, seen from the fork child: it never runs there.
    Ghost(Tid),
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Node::T(t) => write!(f, "{t}"),
            Node::Ghost(t) => write!(f, "{t} (absent in the child)"),
        }
    }
}

/// Why a thread waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    Lock(Res),
    /// Its event is unread.
    Read,
    /// The hit gate: the clock is odd.
    Clock,
    /// A ghost: it does not exist in the fork child, so it never runs there.
    Absent,
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Why::Lock(r) => write!(f, "{r}"),
            Why::Read => write!(f, "the read of its event"),
            Why::Clock => write!(f, "an even clock"),
            Why::Absent => write!(f, "nothing: it never runs in the child"),
        }
    }
}

/// The wait model.
#[derive(Clone, Debug)]
pub struct WaitModel {
    pub cfg: WaitConfig,
}

impl WaitModel {
    pub fn new(cfg: WaitConfig) -> Self {
        assert!((1..=2).contains(&cfg.apps), "1 or 2 application threads");
        WaitModel { cfg }
    }

    fn threads(&self) -> impl Iterator<Item = Tid> + '_ {
        Tid::ALL.into_iter().filter(|t| match t {
            Tid::App(i) => *i < self.cfg.apps,
            _ => true,
        })
    }

    /// What `t` waits on in `s`.
    pub fn wait_of(&self, s: &WState, t: Tid) -> Wait {
        let th = &s.th[t.idx()];
        let Some(step) = th.next() else {
            return Wait::Done;
        };
        let on_lock = |r: Res| match s.holder[r.idx()] {
            Some(h) => Wait::On(Node::T(h), Why::Lock(r)),
            None => Wait::Runs,
        };
        match step {
            Step::Lock(r) | Step::Brief(r) => on_lock(r),
            Step::Drain(r) if s.extras_left == 0 => on_lock(r),
            Step::Fork => on_lock(Res::Heap),
            Step::ChildLock(r) => match s.child_copy[r.idx()] {
                Inherited::Free => Wait::Runs,
                Inherited::Child => Wait::On(Node::T(Tid::Child), Why::Lock(r)),
                Inherited::Ghost(g) => {
                    let takeover = r == Res::Process && !self.cfg.is(WaitMutant::ForkWithProcessLock);
                    if takeover {
                        Wait::Runs
                    } else {
                        Wait::On(Node::Ghost(g), Why::Lock(r))
                    }
                }
            },
            Step::AwaitRead if s.pending & bit(t) != 0 => Wait::On(Node::T(Tid::Reader), Why::Read),
            Step::Gate if s.clock_odd => Wait::On(Node::T(Tid::Reader), Why::Clock),
            Step::Poll | Step::PollOdd if s.pending == 0 => Wait::Idle,
            Step::AwaitWake if !s.wake => Wait::Idle,
            _ => Wait::Runs,
        }
    }

    /// The wait-for cycle reachable from a blocked thread, if any: the
    /// nodes in order, each waiting on the next (and the last on the first).
    pub fn wait_cycle(&self, s: &WState) -> Option<Vec<(Node, Why)>> {
        for t in self.threads() {
            let mut chain: Vec<(Node, Why)> = Vec::new();
            let mut node = Node::T(t);
            loop {
                let w = match node {
                    Node::T(t) => self.wait_of(s, t),
                    Node::Ghost(g) => Wait::On(Node::Ghost(g), Why::Absent),
                };
                let Wait::On(next, why) = w else { break };
                if let Some(i) = chain.iter().position(|(n, _)| *n == node) {
                    return Some(chain.split_off(i));
                }
                chain.push((node, why));
                node = next;
            }
        }
        None
    }

    fn describe_cycle(cycle: &[(Node, Why)]) -> String {
        if let [(Node::Ghost(g), _)] = cycle {
            return format!(
                "wait cycle: a wait on {g}'s copy of a mutex in the fork child: {g} does not exist there and \
                 never runs (a wait on itself)"
            );
        }
        let mut out = String::from("wait cycle: ");
        for (n, why) in cycle {
            match why {
                Why::Lock(_) => out.push_str(&format!("{n} waits for {why}, held by ")),
                Why::Read | Why::Clock => out.push_str(&format!("{n} waits for {why}, up to ")),
                Why::Absent => out.push_str(&format!("{n}, which never runs in the child, ")),
            }
        }
        out.push_str(&format!("{}", cycle[0].0));
        out
    }

    fn reader_blocked(&self, s: &WState) -> Option<Wait> {
        match self.wait_of(s, Tid::Reader) {
            w @ Wait::On(..) => Some(w),
            _ => None,
        }
    }

    fn app_done(&self, s: &WState) -> bool {
        self.threads()
            .filter(|t| matches!(t, Tid::App(_) | Tid::Child))
            .all(|t| s.th[t.idx()].todo.is_empty() && s.th[t.idx()].ops_left == 0)
    }

    /// One line describing the step `a` from `s`.
    pub fn describe_step(&self, s: &WState, a: WAction) -> String {
        match a {
            WAction::Step(t) => {
                let step = s.th[t.idx()].next().expect("a step");
                match step {
                    Step::ChildLock(Res::Process) if matches!(s.child_copy[Res::Process.idx()], Inherited::Ghost(_)) => {
                        format!("{t}: takes over the process lock (held by a parent's thread)")
                    }
                    Step::Callback => format!("{t}: no callback (no extras left)"),
                    _ => format!("{t}: {step}"),
                }
            }
            WAction::Begin(t, op) => format!("{t}: begins {op:?}"),
            WAction::Callback(t, Some(cb)) => format!("{t}: callback {cb:?}"),
            WAction::Callback(t, None) => format!("{t}: no callback"),
            WAction::Drain(t, frees) => {
                if frees {
                    format!("{t}: its drain frees memory (free→brk under cache 0's lock)")
                } else {
                    format!("{t}: its drain frees nothing")
                }
            }
        }
    }

    /// Why `s` violates a property, in words.
    pub fn explain(&self, s: &WState) -> String {
        let mut out = Vec::new();
        if let Some(c) = self.wait_cycle(s) {
            out.push(Self::describe_cycle(&c));
        }
        if let Some(Wait::On(n, why)) = self.reader_blocked(s) {
            out.push(format!("the reader is blocked: it waits for {why} ({n})"));
        }
        for t in self.threads() {
            if let Wait::On(n, why) = self.wait_of(s, t) {
                out.push(format!("  {t} waits for {why} ({n})"));
            }
        }
        out.join("\n")
    }
}

fn bit(t: Tid) -> u8 {
    1 << t.idx()
}

impl Model for WaitModel {
    type State = WState;
    type Action = WAction;

    fn init_states(&self) -> Vec<WState> {
        let mut th: [Th; 5] = Default::default();
        th[Tid::Reader.idx()].push(self.cfg.reader_round());
        th[Tid::Service.idx()].push(self.cfg.service_round());
        for i in 0..self.cfg.apps {
            th[Tid::App(i).idx()].ops_left = self.cfg.ops;
        }
        vec![WState {
            th,
            holder: [None; 5],
            child_copy: [Inherited::Free; 5],
            pending: 0,
            clock_odd: false,
            wake: false,
            forked: false,
            extras_left: self.cfg.extras,
        }]
    }

    fn actions(&self, s: &WState, actions: &mut Vec<WAction>) {
        for t in self.threads() {
            let th = &s.th[t.idx()];
            match th.next() {
                None => {
                    if th.ops_left > 0 {
                        for op in Op::ALL {
                            if op != Op::Fork || (self.cfg.fork && !s.forked) {
                                actions.push(WAction::Begin(t, op));
                            }
                        }
                    }
                }
                Some(Step::Callback) if s.extras_left > 0 => {
                    actions.push(WAction::Callback(t, None));
                    for cb in Cb::ALL {
                        actions.push(WAction::Callback(t, Some(cb)));
                    }
                }
                Some(Step::Drain(_)) if s.extras_left > 0 => {
                    actions.push(WAction::Drain(t, false));
                    actions.push(WAction::Drain(t, true));
                }
                Some(_) => {
                    if self.wait_of(s, t) == Wait::Runs {
                        actions.push(WAction::Step(t));
                    }
                }
            }
        }
    }

    fn next_state(&self, s: &WState, a: WAction) -> Option<WState> {
        let mut n = s.clone();
        match a {
            WAction::Begin(t, op) => {
                let th = &mut n.th[t.idx()];
                th.ops_left -= 1;
                th.push(op.body());
            }
            WAction::Callback(t, cb) => {
                n.th[t.idx()].todo.pop();
                if let Some(cb) = cb {
                    n.extras_left -= 1;
                    n.th[t.idx()].push(cb.body());
                }
            }
            WAction::Drain(t, frees) => {
                let Some(Step::Drain(c)) = n.th[t.idx()].todo.pop() else { unreachable!("a drain") };
                if frees {
                    n.extras_left -= 1;
                    n.th[t.idx()].push(vec![
                        Step::Lock(c),
                        Step::Lock(Res::Heap),
                        Step::Release,
                        Step::AwaitRead,
                        Step::Unlock(Res::Heap),
                        Step::Unlock(c),
                    ]);
                } else {
                    n.th[t.idx()].push(vec![Step::Brief(c)]);
                }
            }
            WAction::Step(t) => {
                let step = n.th[t.idx()].todo.pop().expect("a step");
                match step {
                    Step::Lock(r) => n.holder[r.idx()] = Some(t),
                    Step::Unlock(r) => {
                        debug_assert_eq!(n.holder[r.idx()], Some(t));
                        n.holder[r.idx()] = None;
                    }
                    Step::ChildLock(r) => n.child_copy[r.idx()] = Inherited::Child,
                    Step::ChildUnlock(r) => n.child_copy[r.idx()] = Inherited::Free,
                    Step::Release => n.pending |= bit(t),
                    Step::AwaitRead | Step::Gate | Step::Poll | Step::Brief(_) => {}
                    Step::PollOdd | Step::ClockOdd => n.clock_odd = true,
                    Step::Read => n.pending = 0,
                    Step::EvenWake => {
                        n.clock_odd = false;
                        n.wake = true;
                    }
                    Step::AwaitWake => n.wake = false,
                    // With no extras left, a drain frees nothing and no callback runs.
                    Step::Drain(_) | Step::Callback => {}
                    Step::Fork => {
                        n.forked = true;
                        for r in [Res::Heap, Res::Cache0, Res::Cache1, Res::Members, Res::Process] {
                            n.child_copy[r.idx()] = match n.holder[r.idx()] {
                                // glibc's atfork handlers reset the arena locks in the child.
                                _ if r == Res::Heap => Inherited::Free,
                                Some(h) => Inherited::Ghost(h),
                                None => Inherited::Free,
                            };
                        }
                        n.th[Tid::Child.idx()].push(self.cfg.child_program());
                    }
                }
                if n.th[t.idx()].todo.is_empty() {
                    match t {
                        Tid::Reader => n.th[t.idx()].push(self.cfg.reader_round()),
                        Tid::Service => n.th[t.idx()].push(self.cfg.service_round()),
                        _ => {}
                    }
                }
            }
        }
        Some(n)
    }

    fn format_action(&self, a: &WAction) -> String {
        format!("{a:?}")
    }

    fn format_step(&self, s: &WState, a: WAction) -> Option<String> {
        Some(self.describe_step(s, a))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(NO_WAIT_CYCLE, |m: &WaitModel, s| m.wait_cycle(s).is_none()),
            Property::always(READER_NEVER_BLOCKS, |m: &WaitModel, s| m.reader_blocked(s).is_none()),
            Property::eventually(ALL_APP_THREADS_FINISH, |m: &WaitModel, s| m.app_done(s)),
            Property::sometimes(S_CHAIN, |m: &WaitModel, s| {
                m.threads().any(|t| match m.wait_of(s, t) {
                    Wait::On(Node::T(u), Why::Lock(_)) => {
                        matches!(m.wait_of(s, u), Wait::On(Node::T(Tid::Reader), Why::Read))
                    }
                    _ => false,
                })
            }),
            Property::sometimes(S_SERVICE_CALLBACK_READ, |m: &WaitModel, s| {
                matches!(m.wait_of(s, Tid::Service), Wait::On(_, Why::Read)) && s.holder[Res::Cache0.idx()] != Some(Tid::Service)
            }),
            Property::sometimes(S_TAKEOVER, |_, s: &WState| {
                s.th[Tid::Child.idx()].next() == Some(Step::ChildLock(Res::Process))
                    && matches!(s.child_copy[Res::Process.idx()], Inherited::Ghost(_))
            }),
            Property::sometimes(S_GATE, |m: &WaitModel, s| m.threads().any(|t| matches!(m.wait_of(s, t), Wait::On(_, Why::Clock)))),
        ]
    }
}

/// A property's counterexample (or example, for `sometimes`).
#[derive(Clone, Debug)]
pub struct WaitDiscovery {
    pub property: &'static str,
    /// Its steps, one line each.
    pub steps: Vec<String>,
    /// Why the last state violates it.
    pub explanation: String,
}

impl WaitDiscovery {
    /// The number of actions.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The steps, numbered, then the explanation.
    pub fn timeline(&self) -> String {
        let mut out = format!("{}: {} steps\n", self.property, self.steps.len());
        for (i, l) in self.steps.iter().enumerate() {
            out.push_str(&format!("{:>3}. {l}\n", i + 1));
        }
        out.push_str(&self.explanation);
        out.push('\n');
        out
    }
}

/// The result of checking the wait model.
#[derive(Clone, Debug)]
pub struct WaitOutcome {
    pub unique_states: usize,
    pub states: usize,
    pub max_depth: usize,
    pub elapsed: Duration,
    pub complete: bool,
    /// Counterexamples of `always`/`eventually` properties and examples of
    /// `sometimes` goals, by property.
    pub discoveries: BTreeMap<&'static str, WaitDiscovery>,
}

impl WaitOutcome {
    /// The `always`/`eventually` properties violated.
    pub fn violated(&self) -> Vec<&'static str> {
        [NO_WAIT_CYCLE, READER_NEVER_BLOCKS, ALL_APP_THREADS_FINISH].into_iter().filter(|p| self.discoveries.contains_key(p)).collect()
    }

    /// The `sometimes` goals not reached.
    pub fn unreached(&self) -> Vec<&'static str> {
        [S_CHAIN, S_SERVICE_CALLBACK_READ, S_TAKEOVER, S_GATE].into_iter().filter(|p| !self.discoveries.contains_key(p)).collect()
    }

    /// Every property holds and the run completed.
    pub fn passed(&self) -> bool {
        self.complete && self.violated().is_empty()
    }

    /// A summary: counts and each property's verdict.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "explored: {} unique states ({} generated), max depth {}, {:.2?}{}\n",
            self.unique_states,
            self.states,
            self.max_depth,
            self.elapsed,
            if self.complete { "" } else { " (incomplete)" }
        );
        for p in [NO_WAIT_CYCLE, READER_NEVER_BLOCKS, ALL_APP_THREADS_FINISH] {
            let v = match self.discoveries.get(p) {
                Some(d) => format!("VIOLATED ({} steps)", d.len()),
                None => "holds".into(),
            };
            out.push_str(&format!("  {p}: {v}\n"));
        }
        for g in [S_CHAIN, S_SERVICE_CALLBACK_READ, S_TAKEOVER, S_GATE] {
            let v = if self.discoveries.contains_key(g) { "reached" } else { "not reached" };
            out.push_str(&format!("  {g}: {v}\n"));
        }
        out
    }
}

/// Checks the wait model exhaustively (BFS: shortest counterexamples), on
/// `workers` threads.
//= spec.md#S7.7
//# A stateright model of who waits on
//# whom around the monitor
pub fn check_waits(cfg: &WaitConfig, workers: usize) -> WaitOutcome {
    let model = WaitModel::new(cfg.clone());
    let start = Instant::now();
    let checker = model.clone().checker().threads(workers.max(1)).spawn_bfs().join();
    let elapsed = start.elapsed();
    let properties = model.properties();
    let mut discoveries = BTreeMap::new();
    for (name, path) in checker.discoveries() {
        let p = properties.iter().find(|p| p.name == name).expect("a property of the model");
        // Stateright keeps the last violating state it met, not the first:
        // a counterexample is recomputed as a shortest path to a violation.
        let pairs = match p.expectation {
            Expectation::Sometimes => path.into_vec(),
            _ => shortest_violation(&model, p),
        };
        let last = pairs.last().expect("a path has a state").0.clone();
        let steps: Vec<String> = pairs.iter().filter_map(|(s, a)| a.map(|a| model.describe_step(s, a))).collect();
        let explanation = match p.expectation {
            Expectation::Sometimes => String::new(),
            Expectation::Eventually => {
                format!("a terminal state with an application thread unfinished:\n{}", model.explain(&last))
            }
            Expectation::Always => model.explain(&last),
        };
        discoveries.insert(name, WaitDiscovery { property: name, steps, explanation });
    }
    WaitOutcome {
        unique_states: checker.unique_state_count(),
        states: checker.state_count(),
        max_depth: checker.max_depth(),
        elapsed,
        complete: checker.is_done(),
        discoveries,
    }
}

/// A shortest path from the initial state to a state that violates `p`
/// (an `always` property) or to a terminal state where `p` (an `eventually`
/// property, monotone in this model) does not hold: the states, each with the
/// action taken from it (none for the last).
fn shortest_violation(model: &WaitModel, p: &Property<WaitModel>) -> Vec<(WState, Option<WAction>)> {
    use std::collections::{HashMap, VecDeque};
    let init = model.init_states().remove(0);
    let mut parent: HashMap<WState, Option<(WState, WAction)>> = HashMap::from([(init.clone(), None)]);
    let mut queue = VecDeque::from([init]);
    let mut actions = Vec::new();
    while let Some(s) = queue.pop_front() {
        actions.clear();
        model.actions(&s, &mut actions);
        let bad = match p.expectation {
            Expectation::Always => !(p.condition)(model, &s),
            _ => actions.is_empty() && !(p.condition)(model, &s),
        };
        if bad {
            let mut path = vec![(s.clone(), None)];
            let mut cur = s;
            while let Some(Some((prev, a))) = parent.get(&cur) {
                path.push((prev.clone(), Some(*a)));
                cur = prev.clone();
            }
            path.reverse();
            return path;
        }
        for &a in &actions {
            if let Some(n) = model.next_state(&s, a) {
                if !parent.contains_key(&n) {
                    parent.insert(n.clone(), Some((s.clone(), a)));
                    queue.push_back(n);
                }
            }
        }
    }
    unreachable!("stateright found a violation of {}", p.name)
}

/// A pinned configuration of the wait model.
#[derive(Clone, Debug)]
pub struct WaitPinned {
    pub name: &'static str,
    pub cfg: WaitConfig,
    /// Its unique states (checker/tests/waits.rs checks them).
    pub unique_states: usize,
    /// Too slow for the default test run (seconds): an ignored test.
    pub heavy: bool,
}

/// The pinned configurations of the wait model, the default one first.
pub fn pinned_wait_configs() -> Vec<WaitPinned> {
    let d = WaitConfig::default();
    let pin = |name, cfg, unique_states, heavy| WaitPinned { name, cfg, unique_states, heavy };
    vec![
        pin("waits 2x1+fork", d.clone(), 19_176, false),
        pin("waits 2x1+fork+extras2", WaitConfig { extras: 2, ..d.clone() }, 41_107, false),
        pin("waits 1x3+fork", WaitConfig { apps: 1, ops: 3, ..d.clone() }, 19_367, false),
        pin("waits 2x2", WaitConfig { ops: 2, fork: false, ..d.clone() }, 227_815, false),
        pin("waits 2x2+fork", WaitConfig { ops: 2, ..d }, 2_184_818, true),
    ]
}
