//! The counters behind [`crate::Cache::stats`] (spec.md#S8): plain data
//! (layer 1), read by `stats.rs`.
//!
//! The three counters the hit path bumps (`acquires`, `hits`, `releases`),
//! and `deregistrations` (performed after unlocking, by any thread), are
//! striped per thread: a thread bumps the slot its [`thread_token`] hashes
//! to if it owns that slot (the first token to claim a slot owns it for
//! good), with a plain load + store (no locked read-modify-write, no shared
//! cache line): running threads have distinct tokens, and a token passes to
//! another thread only after its holder exited, so a slot has one writer at
//! a time. Threads whose slot is another's share an overflow slot bumped
//! with `fetch_add`. Where there is no token (other targets, loom), each
//! thread gets a process-wide slot number once instead (a thread-local),
//! and a thread whose number is below [`SLOTS`] is the only writer of that
//! slot; later threads use the overflow slot. Counters written only under
//! the cache lock exclusive (`misses`, `registrations`, ...) are bumped with
//! a load and a store (`Locked::add_exclusive`); everything else on slow
//! paths with `fetch_add`. A [`crate::Cache::stats`] snapshot sums the
//! slots; it is exact when no operation is in flight (always, in sequential
//! use).
//!
//! These are plain `std` atomics even under loom (see [`crate::sync`]): the
//! cache's loom models do not explore them. The striped counters are
//! generic over their word ([`crate::sync::AtomicWord`]), so that their own
//! loom model (`counters_two_tokens_one_slot_and_an_heir`,
//! `impl/tests/loom.rs`) runs this code on loom's atomics, with the tokens
//! its threads are given: two running threads whose tokens share a slot
//! (one owns it, one takes the overflow), a reader summing meanwhile, and a
//! later thread with an exited thread's token that inherits its slot.

use crate::sync::Ordering::Relaxed;
use crate::sync::{plain, AtomicWord};
use crate::thread_token::{bucket, thread_token};
use std::cell::Cell;

/// Per-thread slots per cache.
pub const SLOTS: usize = 64;
/// The slots a thread token may hash to: all, but two in unit tests and
/// under loom, so that threads running at once share slots (and the owner
/// check matters).
#[cfg(not(any(test, loom)))]
pub const TOKEN_SLOTS: usize = SLOTS;
/// The slots a thread token may hash to (see the library's value).
#[cfg(any(test, loom))]
pub const TOKEN_SLOTS: usize = 2;

static NEXT_SLOT: plain::AtomicUsize = plain::AtomicUsize::new(0);

std::thread_local! {
    static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// This thread's slot number (assigned on first use, never reused).
#[inline]
fn slot_index() -> usize {
    SLOT.try_with(|s| {
        let v = s.get();
        if v != usize::MAX {
            v
        } else {
            let n = NEXT_SLOT.fetch_add(1, Relaxed);
            s.set(n);
            n
        }
    })
    // During thread-local destruction: use the shared slot.
    .unwrap_or(usize::MAX)
}

/// One thread's stripe of the hit counters. `W`: the word, `std`'s in the
/// library, loom's in the counters' loom model (`impl/tests/loom.rs`).
#[derive(Debug)]
#[repr(align(128))]
pub struct HotSlot<W = plain::AtomicU64> {
    /// The thread token that owns the slot (0: none yet).
    owner: W,
    acquires: W,
    hits: W,
    releases: W,
    deregistrations: W,
    /// Hits A0 served without the lock (spec.md#A0), also in `hits`.
    lockless_hits: W,
    /// Acquires that skipped A1 (spec.md#A1: a streak of A1 misses).
    a1_skips: W,
}

/// Which striped counter to bump.
#[derive(Clone, Copy, Debug)]
pub enum Hot {
    Acquires,
    Hits,
    Releases,
    /// A0's hits (also counted as `Hits`).
    LocklessHits,
    /// Acquires that skipped A1.
    A1Skips,
    /// Not on the hit path, but bumped after unlocking by whichever thread
    /// performs a deregistration: a locked `fetch_add` per evicting miss
    /// otherwise.
    Deregistrations,
}

impl<W: AtomicWord> HotSlot<W> {
    fn new() -> Self {
        HotSlot {
            owner: W::new(0),
            acquires: W::new(0),
            hits: W::new(0),
            releases: W::new(0),
            deregistrations: W::new(0),
            lockless_hits: W::new(0),
            a1_skips: W::new(0),
        }
    }

    #[inline]
    fn get(&self, which: Hot) -> &W {
        match which {
            Hot::Acquires => &self.acquires,
            Hot::Hits => &self.hits,
            Hot::Releases => &self.releases,
            Hot::LocklessHits => &self.lockless_hits,
            Hot::A1Skips => &self.a1_skips,
            Hot::Deregistrations => &self.deregistrations,
        }
    }
}

/// The counters' deliberate breakage, by its
/// name in `mrcache_types::mutants::LOOM_MUTANTS`; the counters' loom
/// model catches it. Only loom builds can select it: the library's
/// counters have no field for it, and `broken` is `false`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CounterMutant {
    /// A free slot is claimed with a load and a store instead of the
    /// compare-exchange: two running threads whose tokens share a slot can
    /// both own it, and their plain load + store bumps lose counts.
    ClaimWithoutCas,
}

#[cfg(loom)]
impl CounterMutant {
    /// Every counter mutant, in the order of `LOOM_MUTANTS`.
    pub const ALL: [CounterMutant; 1] = [CounterMutant::ClaimWithoutCas];

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            CounterMutant::ClaimWithoutCas => "counter-claim-without-cas",
        }
    }
}

/// The striped hit counters of one cache.
#[derive(Debug)]
pub struct HotCounters<W = plain::AtomicU64> {
    slots: Box<[HotSlot<W>]>,
    overflow: HotSlot<W>,
    /// The breakage these counters run with (loom builds only).
    #[cfg(loom)]
    mutant: Option<CounterMutant>,
}

impl HotCounters {
    pub(crate) fn new() -> Self {
        Self::with_slots(SLOTS)
    }

    #[inline]
    pub(crate) fn bump(&self, which: Hot) {
        self.bump_each(&[which]);
    }

    /// Bumps each counter of `which` by one, finding this thread's slot
    /// once (an A1 hit counts an acquire and a hit).
    #[inline(always)]
    pub(crate) fn bump_each(&self, which: &[Hot]) {
        let token = thread_token();
        let own = if token != 0 { self.owned(token) } else { self.slots.get(slot_index()) };
        Self::bump_in(&self.overflow, own, which);
    }
}

impl<W: AtomicWord> HotCounters<W> {
    /// Counters with `slots` per-thread slots (the library: [`SLOTS`]; the
    /// loom model: [`TOKEN_SLOTS`], the ones a token can hash to).
    pub fn with_slots(slots: usize) -> Self {
        HotCounters {
            slots: (0..slots.max(TOKEN_SLOTS)).map(|_| HotSlot::new()).collect(),
            overflow: HotSlot::new(),
            #[cfg(loom)]
            mutant: None,
        }
    }

    /// [`HotCounters::with_slots`], running with the breakage `m`.
    #[cfg(loom)]
    pub fn with_mutant(slots: usize, m: CounterMutant) -> Self {
        HotCounters { mutant: Some(m), ..Self::with_slots(slots) }
    }

    /// Whether these counters run with the breakage `m` (always `false` in
    /// the library).
    #[inline(always)]
    #[allow(unused_variables)]
    fn broken(&self, m: CounterMutant) -> bool {
        #[cfg(loom)]
        return self.mutant == Some(m);
        #[cfg(not(loom))]
        false
    }

    /// The slot of the thread whose token is `token` (non-zero), if it owns
    /// it: it does if its token is there, or if it claims the free slot.
    #[inline(always)]
    fn owned(&self, token: usize) -> Option<&HotSlot<W>> {
        let slot = &self.slots[bucket(token, TOKEN_SLOTS)];
        let owner = slot.owner.load(Relaxed);
        let token = token as u64;
        // Relaxed: a thread reads its own token here only if its own
        // compare-exchange put it there (module docs).
        (owner == token || (owner == 0 && self.claim(slot, token))).then_some(slot)
    }

    /// Claims the free `slot` for `token`: whether it now owns it.
    #[inline(always)]
    fn claim(&self, slot: &HotSlot<W>, token: u64) -> bool {
        if self.broken(CounterMutant::ClaimWithoutCas) {
            slot.owner.store(token, Relaxed);
            return true;
        }
        slot.owner.compare_exchange(0, token, Relaxed, Relaxed).is_ok()
    }

    #[inline(always)]
    fn bump_in(overflow: &HotSlot<W>, own: Option<&HotSlot<W>>, which: &[Hot]) {
        for &w in which {
            match own {
                // Only the owning thread writes this slot: no RMW needed.
                Some(slot) => {
                    let c = slot.get(w);
                    c.store(c.load(Relaxed).wrapping_add(1), Relaxed);
                }
                None => {
                    overflow.get(w).fetch_add(1, Relaxed);
                }
            }
        }
    }

    /// [`HotCounters::bump_each`] by the thread whose token is `token`
    /// (non-zero): the loom model names its threads' tokens, since loom's
    /// threads share one OS thread and so one real token.
    #[cfg(loom)]
    pub fn bump_each_as(&self, token: usize, which: &[Hot]) {
        assert_ne!(token, 0, "a token is non-zero");
        Self::bump_in(&self.overflow, self.owned(token), which);
    }

    /// The sum of one counter over the slots.
    pub fn sum(&self, which: Hot) -> u64 {
        self.slots.iter().chain(std::iter::once(&self.overflow)).map(|s| s.get(which).load(Relaxed)).sum()
    }
}

/// Slow-path counters (spec.md#S8): one `fetch_add` each, or a load and a
/// store for those written only under the lock exclusive.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub misses: plain::AtomicU64,
    pub errors: plain::AtomicU64,
    pub release_events: plain::AtomicU64,
    pub registrations: plain::AtomicU64,
    pub bytes_registered: plain::AtomicU64,
    pub peak_pinned_bytes: plain::AtomicU64,
    pub invalidations: plain::AtomicU64,
    pub leased_invalidations: plain::AtomicU64,
    pub deferred_deregistrations: plain::AtomicU64,
    pub merges: plain::AtomicU64,
    pub uncached: plain::AtomicU64,
    pub evictions: plain::AtomicU64,
    pub pressure_evictions: plain::AtomicU64,
    pub forgotten: plain::AtomicU64,
    // Diagnostics, not in `Stats`.
    pub discarded_registrations: plain::AtomicU64,
    pub stale_retries: plain::AtomicU64,
    pub dereg_failures: plain::AtomicU64,
    pub early_deregistrations: plain::AtomicU64,
    /// Lane counts of forgotten generations (spec.md#S2.6).
    pub lane_hits_forgotten: plain::AtomicU64,
    pub lane_releases_forgotten: plain::AtomicU64,
    /// Times the last [`crate::SharedCache`] handle leaked the cache because
    /// owned leases were still out (0 or 1).
    pub leaked_for_owned_leases: plain::AtomicU64,
    /// REMOVE windows opened (spec.md#M3) and closed (M4).
    pub remove_windows: plain::AtomicU64,
    pub remove_windows_closed: plain::AtomicU64,
    /// Misses served uncached because the monitor did not watch their range
    /// (spec.md#S7.6: another userfaultfd watches it, or the cache detached).
    pub unwatched_uncached: plain::AtomicU64,
}

#[inline]
pub(crate) fn inc(c: &plain::AtomicU64) {
    c.fetch_add(1, Relaxed);
}

#[inline]
pub(crate) fn add(c: &plain::AtomicU64, n: u64) {
    c.fetch_add(n, Relaxed);
}

#[inline]
pub(crate) fn get(c: &plain::AtomicU64) -> u64 {
    c.load(Relaxed)
}
