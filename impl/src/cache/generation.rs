//! One generation of the cache's shared state (see "Fork" in the module
//! docs) and its lock.

use super::counters::get;
use super::entry::{Entry, EntryPtr};
use super::entry_pool::{EntryPool, Returned};
use super::evict_order::{Candidate, EvictionOrder};
use super::gate::Gate;
use super::lanes;
use super::queue::InvalidationQueue;
use super::source::EventSource;
use super::window::Windows;
use super::Cache;
use crate::hit_memo::{HitMemo, MemoHint};
use crate::index::IntervalIndex;
use crate::registrar::Registrar;
use crate::sync::{plain, thread_local, AtomicBool, AtomicU64, Ordering, RwLock, RwLockWriteGuard};
use mrcache_types::PageSpan;
use std::cell::Cell;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::sync::OnceLock;
use std::sync::{PoisonError, TryLockError};

/// A registration in progress (spec.md#A4).
#[derive(Clone, Copy, Debug)]
pub(super) struct InFlight {
    pub(super) token: u64,
    pub(super) span: PageSpan,
    pub(super) stale: bool,
    /// Planned while an overlapping release window was open (W3): A9
    /// serves it but never caches it.
    pub(super) windowed: bool,
}

/// What the cache lock protects.
pub(crate) struct Locked<R: Registrar> {
    pub(super) index: IntervalIndex<EntryPtr<R>>,
    /// The memory of this generation's entries (A9 takes it here).
    pub(super) entries: EntryPool<R>,
    /// A1's answers, valid while the index's answers version holds.
    pub(super) memo: HitMemo,
    pub(super) inflight: Vec<InFlight>,
    pub(super) next_token: u64,
    /// Bytes of findable entries (max_pinned_bytes, S6.4).
    pub(super) cached_bytes: u64,
    /// Victim candidates in policy order (A10, R2), kept only with limits.
    pub(super) order: EvictionOrder,
    /// The last note's number (A6, R2, trim; 0: none yet).
    pub(super) note_epoch: u64,
    /// The candidates the last A6 / R2 note took out of `order`, in policy
    /// order, until its A10 (or the next note) puts them back.
    pub(super) noted: Vec<Candidate>,
    /// Scratch for the note: leased candidates passed over (kept for its
    /// allocation).
    pub(super) passed: Vec<Candidate>,
    /// Debug builds: the ids the full note would have noted (A10's check).
    #[cfg(debug_assertions)]
    pub(super) full_note: Vec<u64>,
}

impl<R: Registrar> Locked<R> {
    /// Adds `n` to a counter that only a holder of the lock exclusive
    /// writes (the `&mut self` is the proof), returning the value before:
    /// a load and a store instead of a locked read-modify-write, a full
    /// barrier on x86 that a miss would otherwise pay per counter. Readers
    /// (`stats()`, the hit path) load it at any time and see a value it
    /// had, as with `fetch_add`.
    #[inline]
    pub(super) fn add_exclusive(&mut self, counter: &plain::AtomicU64, n: u64) -> u64 {
        let before = counter.load(std::sync::atomic::Ordering::Relaxed);
        counter.store(before.wrapping_add(n), std::sync::atomic::Ordering::Relaxed);
        before
    }

    /// Takes `n` from a counter written only under the lock exclusive
    /// ([`Locked::add_exclusive`]).
    #[inline]
    pub(super) fn sub_exclusive(&mut self, counter: &plain::AtomicU64, n: u64) {
        let before = counter.load(std::sync::atomic::Ordering::Relaxed);
        debug_assert!(before >= n, "an exclusive counter went below 0");
        counter.store(before.wrapping_sub(n), std::sync::atomic::Ordering::Relaxed);
    }

    /// Raises a maximum written only under the lock exclusive.
    #[inline]
    pub(super) fn max_exclusive(&mut self, counter: &plain::AtomicU64, v: u64) {
        if v > counter.load(std::sync::atomic::Ordering::Relaxed) {
            counter.store(v, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Appends an in-flight record and returns its token (the record only;
    /// A4's bookkeeping around it is `Cache::add_inflight`).
    pub(super) fn push_inflight(&mut self, span: PageSpan, windowed: bool) -> u64 {
        let token = self.next_token;
        self.next_token += 1;
        self.inflight.push(InFlight { token, span, stale: false, windowed });
        token
    }

    pub(super) fn take_inflight(&mut self, token: u64) -> Option<InFlight> {
        let i = self.inflight.iter().position(|r| r.token == token)?;
        Some(self.inflight.swap_remove(i))
    }
}

/// The entry the hit memo answered, alive while the state is borrowed (the
/// lock held, at least shared).
///
/// # Safety
/// `e` must be the memo's answer at the index's current answers version
/// (`crate::hit_memo`): such an answer is findable, since every removal
/// moves the version, and a findable entry is freed only after it left the
/// index under the lock exclusive, which the borrow of `st` excludes.
#[inline]
pub(super) unsafe fn answered<R: Registrar>(st: &Locked<R>, e: EntryPtr<R>) -> &Entry<R> {
    let _ = st;
    // SAFETY: per the contract above.
    unsafe { e.get() }
}

/// One generation of the cache (see "Fork" in the module docs).
pub(crate) struct Generation<R: Registrar> {
    pub(super) lock: RwLock<Locked<R>>,
    /// Where the lock's hit memo is, for A1's prefetch before the lock.
    pub(super) memo_hint: MemoHint,
    pub(super) queue: InvalidationQueue,
    /// Entry memory given back by deregistrations, for A9 to reuse.
    pub(super) returned_entries: Returned,
    /// Set by A10 when every remaining entry is leased and a limit is still
    /// exceeded; read by R2.
    pub(super) over_limit: AtomicBool,
    /// Findable entries (mirror of the index length, for stats).
    pub(super) cached: plain::AtomicU64,
    /// Cached registrations of this generation not yet deregistered, and
    /// their bytes (pinned_bytes, forgotten).
    pub(super) live_regs: plain::AtomicU64,
    pub(super) live_bytes: plain::AtomicU64,
    /// Per-thread memo lanes (LN1–LN6).
    pub(super) lanes: lanes::Lanes<R>,
    /// The generation this one replaced (fork, `simulate_fork`), or null. Set
    /// before this one is published, then never changed: the last
    /// [`crate::SharedCache`] handle walks the chain to count the owned
    /// leases still out in every generation (older ones live as long as the
    /// cache).
    pub(super) older: plain::AtomicPtr<Generation<R>>,
    /// Drains in progress (LN1): raised before events are taken off the queue
    /// or read from the monitor, lowered once they are applied, so a lane hit
    /// never runs between an event's removal and its revokes.
    pub(super) draining: AtomicU64,
    /// The asynchronous monitor this generation reads (A2, A6, M2). It
    /// belongs to the process that installed it: a forked child's generation
    /// starts without one (spec.md#S2.6, F1).
    pub(super) source: OnceLock<Box<dyn EventSource>>,
    /// What a hit checks when `source` gates (spec.md#M6): the event clock
    /// value this generation has applied up to.
    pub(super) gate: Gate,
    /// Set in a forked child whose parent read a monitor: until a monitor is
    /// installed in the child, nothing is cached (F1), since no release in
    /// the child would be seen.
    pub(super) monitor_required: bool,
    /// Open release windows (W1–W3): nothing overlapping them is cached.
    /// A forked child starts with none (the threads inside a window do not
    /// exist there).
    pub(super) windows: Windows,
}

impl<R: Registrar> Generation<R> {
    pub(super) fn new(queue_capacity: usize, lane_slots: u32, monitor_required: bool) -> Self {
        let memo = HitMemo::new();
        Generation {
            // SAFETY: `memo` moves into this generation's state, which lives
            // as long as the hint beside it, and is the one memo it names.
            memo_hint: unsafe { MemoHint::new(&memo) },
            lock: RwLock::new(Locked {
                index: IntervalIndex::new(),
                entries: EntryPool::new(),
                memo,
                inflight: Vec::new(),
                next_token: 0,
                cached_bytes: 0,
                order: Default::default(),
                note_epoch: 0,
                noted: Vec::new(),
                passed: Vec::new(),
                #[cfg(debug_assertions)]
                full_note: Vec::new(),
            }),
            queue: InvalidationQueue::with_capacity(queue_capacity),
            returned_entries: Returned::new(),
            over_limit: AtomicBool::new(false),
            cached: plain::AtomicU64::new(0),
            live_regs: plain::AtomicU64::new(0),
            live_bytes: plain::AtomicU64::new(0),
            lanes: lanes::Lanes::new(lane_slots),
            older: plain::AtomicPtr::new(std::ptr::null_mut()),
            draining: AtomicU64::new(0),
            source: OnceLock::new(),
            gate: Gate::new(),
            monitor_required,
            windows: Windows::new(),
        }
    }

    /// Installs the generation's event source (once) and, if it gates hits
    /// (spec.md#M6), the gate at the source's start.
    pub(super) fn install_source(&self, source: Box<dyn EventSource>) -> Result<(), Box<dyn EventSource>> {
        let start = source.gate_start();
        self.source.set(source)?;
        if let Some(mark) = start {
            self.gate.set(mark);
        }
        Ok(())
    }

    //= spec.md#F1
    //# until a monitor runs in the child, a miss's registration is not
    //# cached
    /// Whether A9 may make an entry findable: false in a forked child that
    /// has not yet installed its own monitor (spec.md#S2.6), and in a cache
    /// detached from a shared monitor (S7.6).
    pub(super) fn caching(&self) -> bool {
        match self.source.get() {
            Some(src) => src.delivering(),
            None => !self.monitor_required,
        }
    }
}

#[cfg(not(loom))]
thread_local! {
    /// Exclusive cache locks this thread holds (any cache). A hook raised by
    /// such a thread never waits for a lock (spec.md#S7.2, L2).
    static HELD: Cell<u32> = const { Cell::new(0) };
}

#[cfg(loom)]
thread_local! {
    /// As above (loom's `thread_local!` takes no `const` initialiser).
    static HELD: Cell<u32> = Cell::new(0);
}

pub(super) fn held_by_this_thread() -> bool {
    HELD.with(|h| h.get() > 0)
}

/// The exclusive lock, marked in [`HELD`]. [`WriteGuard::unlock`] refreshes
/// the index's search tree and moves the hit memo to the answers the section
/// leaves, then unlocks; every section ends with it. Dropping a guard that
/// was not unlocked is a bug (debug builds assert it), except while
/// unwinding, when `Drop` does the same work so no reader meets a stale tree.
pub(crate) struct WriteGuard<'a, R: Registrar> {
    pub(super) guard: ManuallyDrop<RwLockWriteGuard<'a, Locked<R>>>,
    /// This thread's [`HELD`], found once per section: in the shared
    /// library each lookup is a call to `__tls_get_addr`, and an evicting
    /// miss has two sections.
    held: *const Cell<u32>,
}

impl<'a, R: Registrar> WriteGuard<'a, R> {
    pub(super) fn new(guard: RwLockWriteGuard<'a, Locked<R>>) -> Self {
        let held = HELD.with(|h| {
            h.set(h.get() + 1);
            h as *const Cell<u32>
        });
        WriteGuard { guard: ManuallyDrop::new(guard), held }
    }

    /// Ends the section: refreshes the index and the memo, then unlocks.
    pub(super) fn unlock(mut self) {
        self.publish();
        self.release();
        std::mem::forget(self);
    }

    /// What readers after this section must see: the index's search tree
    /// refreshed, and the hit memo serving the epoch of the version this
    /// section leaves.
    fn publish(&mut self) {
        self.guard.index.refresh();
        let version = self.guard.index.answers_version();
        self.guard.memo.follow(version);
    }

    /// Releases the lock and the mark in [`HELD`]; call once.
    fn release(&mut self) {
        // SAFETY: called once per guard: by `unlock` (which then forgets the
        // guard, so `Drop` does not run) or by `Drop`.
        unsafe { ManuallyDrop::drop(&mut self.guard) };
        // SAFETY: `held` is this thread's `HELD`: the guard is not `Send`
        // (a lock guard), so it is released on the thread that made it,
        // whose thread-locals outlive every guard it holds (`HELD` has no
        // destructor: its memory lasts as long as the thread).
        let held = unsafe { &*self.held };
        held.set(held.get() - 1);
    }
}

impl<R: Registrar> Deref for WriteGuard<'_, R> {
    type Target = Locked<R>;
    fn deref(&self) -> &Locked<R> {
        &self.guard
    }
}

impl<R: Registrar> DerefMut for WriteGuard<'_, R> {
    fn deref_mut(&mut self) -> &mut Locked<R> {
        &mut self.guard
    }
}

impl<R: Registrar> Drop for WriteGuard<'_, R> {
    fn drop(&mut self) {
        // The work first: a failed assertion must not leave the lock held.
        self.publish();
        self.release();
        debug_assert!(std::thread::panicking(), "an exclusive section ended without WriteGuard::unlock");
    }
}

impl<R: Registrar> Cache<R> {
    /// Lane hits and owner lane releases: the current generation's lanes plus
    /// those of forgotten generations (folded in at the fork).
    pub(super) fn lane_counts(&self, shared: &Generation<R>) -> (u64, u64) {
        let (h, r) = shared.lanes.installed().map(|l| l.counts()).fold((0, 0), |(a, b), (h, r)| (a + h, b + r));
        (h + get(&self.counters.lane_hits_forgotten), r + get(&self.counters.lane_releases_forgotten))
    }

    /// Owned leases counted on lanes and not yet returned, over every lane
    /// of every generation (see "Owned leases" in [`super::lease`]).
    pub(super) fn owned_outstanding(&self) -> u64 {
        let mut g = self.shared.load(Ordering::Acquire);
        let mut n = 0u64;
        while !g.is_null() {
            // SAFETY: the current generation, or one it (transitively)
            // replaced: generations are freed only in the cache's `Drop`.
            let s = unsafe { &*g };
            n = s.lanes.installed().fold(n, |n, l| n.wrapping_add(l.owned_outstanding()));
            g = s.older.load(Ordering::Acquire);
        }
        n
    }

    pub(super) fn write<'a>(&self, shared: &'a Generation<R>) -> WriteGuard<'a, R> {
        WriteGuard::new(shared.lock.write().unwrap_or_else(PoisonError::into_inner))
    }

    pub(super) fn try_write<'a>(&self, shared: &'a Generation<R>) -> Option<WriteGuard<'a, R>> {
        match shared.lock.try_write() {
            Ok(g) => Some(WriteGuard::new(g)),
            Err(TryLockError::Poisoned(p)) => Some(WriteGuard::new(p.into_inner())),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}
