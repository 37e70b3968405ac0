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

use super::entry::leased;
use super::entry::{Entry, EntryPtr};
use super::generation::Shared;
use super::lease::Lease;
use super::state::Released;
use super::{fork, Cache};
use crate::thread_token::{bucket, thread_token};
use crate::registrar::Registrar;
use crate::sync::{plain, AtomicPtr, AtomicU64, Ordering};
use mrcache_types::{Access, PageSpan, Range};
use std::cell::{Cell, RefCell};
use std::sync::{Arc, Once, PoisonError};

/// Lanes per cache generation: threads beyond it use A1 only.
#[cfg(not(loom))]
pub const MAX_LANES: usize = 64;
#[cfg(loom)]
pub const MAX_LANES: usize = 2;

/// Buckets of [`Lanes`]' thread token table (a power of two). Unit tests
/// use two, so that threads running at once share buckets.
#[cfg(not(test))]
const TOKEN_BUCKETS: usize = 2 * MAX_LANES;
#[cfg(test)]
const TOKEN_BUCKETS: usize = 2;

/// A lane's claim. `taken` says whether a thread holds it; `holder` says
/// which (its [`thread_token`], or 0). Only the thread holding the claim
/// writes `holder`: after taking the claim, and back to 0 before giving it
/// up ([`Claim::release`]). So a thread that reads its own token there holds
/// the claim: it wrote that value itself, and a later write by another
/// thread needs the claim, which this thread gives up only after zeroing
/// `holder` (coherence orders the two writes for it).
pub(super) struct Claim {
    taken: plain::AtomicBool,
    holder: plain::AtomicUsize,
}

impl Claim {
    /// Gives the claim up (the holding thread only).
    fn release(&self) {
        self.holder.store(0, Ordering::Relaxed);
        // Release: the next owner sees this thread's last `held` stores.
        self.taken.store(false, Ordering::Release);
    }
}

/// Default memo slots per lane ([`crate::CacheConfig::lane_slots`]).
#[cfg(not(loom))]
pub const LANE_SLOTS: u32 = 1024;
#[cfg(loom)]
pub const LANE_SLOTS: u32 = 2;

// ---------------------------------------------------------------------------
// Barriers

const BARRIER_UNKNOWN: u8 = 0;
const BARRIER_MEMBARRIER: u8 = 1;
const BARRIER_FENCES: u8 = 2;

static BARRIER_KIND: plain::AtomicU8 = plain::AtomicU8::new(BARRIER_UNKNOWN);
static BARRIER_INIT: Once = Once::new();

/// Registers the process for private expedited membarrier, once. Must run
/// before any lane exists (a cache constructor calls it): the light barrier is
/// a compiler fence only once the heavy one is known to be membarrier.
pub fn init_barriers() {
    BARRIER_INIT.call_once(|| {
        let kind = if register_membarrier() { BARRIER_MEMBARRIER } else { BARRIER_FENCES };
        BARRIER_KIND.store(kind, Ordering::SeqCst);
    });
}

/// Which heavy barrier this process uses (for diagnostics and benches).
pub fn uses_membarrier() -> bool {
    BARRIER_KIND.load(Ordering::Relaxed) == BARRIER_MEMBARRIER
}

#[cfg(not(loom))]
mod sys {
    pub const CMD_QUERY: libc::c_long = 0;
    pub const CMD_GLOBAL: libc::c_long = 1;
    pub const CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    pub const CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

    /// `membarrier(cmd, 0, 0)`: its result, or -1.
    pub fn membarrier(cmd: libc::c_long) -> libc::c_long {
        // SAFETY: membarrier takes (cmd, flags, cpu_id) integers and touches
        // no memory.
        unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) }
    }
}

#[cfg(not(loom))]
fn register_membarrier() -> bool {
    let supported = sys::membarrier(sys::CMD_QUERY);
    supported >= 0
        && supported & sys::CMD_PRIVATE_EXPEDITED != 0
        && sys::membarrier(sys::CMD_REGISTER_PRIVATE_EXPEDITED) == 0
}

#[cfg(loom)]
fn register_membarrier() -> bool {
    false
}

//= spec.md#LN1
//# light barrier
/// The lane side's barrier between its count store and its `ptr` re-read.
#[inline(always)]
fn light_barrier() {
    if BARRIER_KIND.load(Ordering::Relaxed) == BARRIER_MEMBARRIER {
        plain::compiler_fence(Ordering::SeqCst);
    } else {
        plain::fence(Ordering::SeqCst);
    }
}

//= spec.md#LN5
//# heavy barrier
/// The revoking side's barrier: a full barrier in every running thread.
pub(crate) fn heavy_barrier() {
    #[cfg(not(loom))]
    if BARRIER_KIND.load(Ordering::Relaxed) == BARRIER_MEMBARRIER {
        // Registration lost (a forked child): re-register, else the slow
        // global barrier, which needs no registration. All are full barriers
        // in every thread of the process.
        if sys::membarrier(sys::CMD_PRIVATE_EXPEDITED) == 0
            || (register_membarrier() && sys::membarrier(sys::CMD_PRIVATE_EXPEDITED) == 0)
            || sys::membarrier(sys::CMD_GLOBAL) == 0
        {
            return;
        }
        // No barrier is available: lanes cannot be made safe, so the process
        // aborts rather than hand out a stale registration.
        eprintln!("mrcache: membarrier failed after registration; aborting (lanes cannot be revoked safely)");
        std::process::abort();
    }
    plain::fence(Ordering::SeqCst);
}

// Loom has no store buffers to flush: a sequentially consistent swap/read is
// the model of "plain access + the barrier pair".
#[inline(always)]
fn plain_store(a: &AtomicU64, v: u64) {
    if cfg!(loom) {
        a.swap(v, Ordering::SeqCst);
    } else {
        a.store(v, Ordering::Relaxed);
    }
}

#[inline(always)]
fn plain_load_ptr<T>(a: &AtomicPtr<T>) -> *mut T {
    if cfg!(loom) {
        a.fetch_update(Ordering::SeqCst, Ordering::SeqCst, Some).unwrap_or_else(|p| p)
    } else {
        a.load(Ordering::Relaxed)
    }
}

/// LN5's store of null into a slot's `ptr`.
pub(crate) fn null_ptr<R: Registrar>(s: &LaneSlot<R>) {
    if cfg!(loom) {
        s.ptr.swap(std::ptr::null_mut(), Ordering::SeqCst);
    } else {
        s.ptr.store(std::ptr::null_mut(), Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------
// Slots and lanes

/// One memo slot (spec.md#A, "lane").
pub(crate) struct LaneSlot<R: Registrar> {
    /// Key: first page; and end page << 8 | access bits. Owner-only.
    key_first: plain::AtomicU64,
    key_rest: plain::AtomicU64,
    /// The memoized entry, or null (revoked / never set).
    pub(super) ptr: AtomicPtr<Entry<R>>,
    /// Leases taken here by the owner, minus the owner's releases.
    held: AtomicU64,
    /// Releases of this slot's leases by other threads.
    remote: AtomicU64,
    /// The entry this slot holds one state-word lease on (LN5), or null.
    pin: AtomicPtr<Entry<R>>,
    /// A1 hits of other keys that found this slot taken since its last
    /// memoize (owner-only): a live memo is replaced only after a few, so two
    /// keys sharing a slot do not re-memoize on every hit.
    passed_over: plain::AtomicU32,
}

impl<R: Registrar> LaneSlot<R> {
    fn new() -> Self {
        LaneSlot {
            key_first: plain::AtomicU64::new(u64::MAX),
            key_rest: plain::AtomicU64::new(u64::MAX),
            ptr: AtomicPtr::new(std::ptr::null_mut()),
            held: AtomicU64::new(0),
            remote: AtomicU64::new(0),
            pin: AtomicPtr::new(std::ptr::null_mut()),
            passed_over: plain::AtomicU32::new(0),
        }
    }

    /// Outstanding leases: `held − remote` (remote read first, so that the
    /// owner's increments before a transferred lease are seen).
    pub(super) fn count(&self) -> u64 {
        // SeqCst, not just Acquire: these are the loads of LN6's store-buffering
        // pair (LN1: store `held`, load `ptr`; LN5: store `ptr`, load the
        // count), whose barriers loom models with sequentially consistent
        // accesses.
        let remote = self.remote.load(Ordering::SeqCst);
        self.held.load(Ordering::SeqCst).wrapping_sub(remote)
    }

    /// Every access is SeqCst: written only under the lanes mutex (LN4, LN5),
    /// which orders them; SeqCst keeps them in the one order in which loom
    /// checks LN6 against the counts.
    pub(super) fn pin(&self) -> &AtomicPtr<Entry<R>> {
        &self.pin
    }
}

fn key_rest(span: PageSpan, access: Access) -> u64 {
    (span.end << 8) | u64::from(access.bits())
}

#[inline(always)]
fn slot_index(span: PageSpan, access: Access, mask: usize) -> usize {
    let h = span.first.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ span.end.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    ((h ^ u64::from(access.bits())) >> 32) as usize & mask
}

/// One thread's memo table in one cache generation.
pub(crate) struct Lane<R: Registrar> {
    slots: Box<[LaneSlot<R>]>,
    /// Lane hits and lane releases by the owner (owner-only plain
    /// increments: no shared counter on the hit path). `Stats` adds them.
    hits: plain::AtomicU64,
    releases: plain::AtomicU64,
    /// Memos made (LN2, under the cache lock shared), and their number when
    /// a revoke of every slot last left them all null (under the lock
    /// exclusive): equal means no slot points anywhere, so the revoke of
    /// every slot before a note (LN5) skips the lane instead of reading each
    /// slot. Ordered by the cache lock.
    memos: plain::AtomicU64,
    clean_at: plain::AtomicU64,
    /// The dry-spell detector ([`worth_probing`]; owner only, on this
    /// header's line): probes in the current window, `hits` when it began,
    /// whether the lane is dry, and acquires since the window began (the
    /// sampling clock of a dry lane).
    probes: plain::AtomicU32,
    window_hits: plain::AtomicU64,
    dry: plain::AtomicBool,
    tick: plain::AtomicU32,
    /// Held by the thread that owns the lane; released by its thread-local
    /// destructor (or when it drops the claim to bound its claim list).
    claim: Arc<Claim>,
    /// Owned leases ([`super::OwnedLease`]) counted on this lane: taken by
    /// the owner, returned by the owner (owner-only plain increments,
    /// `Release` stores) or by another thread (`remote`, an atomic add on its
    /// own cache line). See "Owned leases" in [`super::lease`].
    owned_taken: plain::AtomicU64,
    owned_returned: plain::AtomicU64,
    owned_returned_remote: RemoteCount,
}

/// A counter other threads add to, on a cache line of its own (so a remote
/// release does not write the line of the owner's hot counters).
#[repr(align(128))]
struct RemoteCount(plain::AtomicU64);

/// A lane lease's slot (see [`super::Lease`]).
/// One pointer, so that a lease stays small (it is returned by value on the
/// hit path).
pub(crate) struct LaneRef<R: Registrar> {
    slot: std::ptr::NonNull<LaneSlot<R>>,
}

impl<R: Registrar> Clone for LaneRef<R> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<R: Registrar> Copy for LaneRef<R> {}

impl<R: Registrar> LaneRef<R> {
    /// # Safety
    /// The lane's generation must be alive (a lease borrows its cache).
    pub(super) unsafe fn slot<'a>(self) -> &'a LaneSlot<R> {
        // SAFETY: lanes are freed only with their generation.
        unsafe { self.slot.as_ref() }
    }
}

/// All lanes of one generation. Lanes are installed left to right and freed
/// with the generation. A lane installed while a revoke scans has no memo
/// (memos are set under the cache lock shared, revokes hold it exclusive).
pub(crate) struct Lanes<R: Registrar> {
    /// Unique among all generations of all caches ever made (thread-local
    /// claims are keyed by it, so a freed generation's key never matches).
    uid: u64,
    /// Slots per lane (a power of two).
    slots_per_lane: usize,
    table: Box<[plain::AtomicPtr<Lane<R>>]>,
    /// A claimed lane by its holder's [`thread_token`] bucket: the hot path's
    /// way to this thread's lane without a thread-local lookup (in a shared
    /// library, a call). Only a hint: [`Self::mine`] checks the lane's
    /// holder. The last claimer of a bucket keeps it.
    by_token: Box<[plain::AtomicPtr<Lane<R>>]>,
    /// LN4/LN5 ordering.
    pub(super) mutex: crate::sync::Mutex<()>,
}

static NEXT_UID: plain::AtomicU64 = plain::AtomicU64::new(1);

impl<R: Registrar> Lanes<R> {
    /// `slots_per_lane`: a power of two (the config validated it).
    pub fn new(slots_per_lane: u32) -> Self {
        Lanes {
            uid: NEXT_UID.fetch_add(1, Ordering::Relaxed),
            slots_per_lane: slots_per_lane as usize,
            table: (0..MAX_LANES).map(|_| plain::AtomicPtr::new(std::ptr::null_mut())).collect(),
            by_token: (0..TOKEN_BUCKETS).map(|_| plain::AtomicPtr::new(std::ptr::null_mut())).collect(),
            mutex: crate::sync::Mutex::new(()),
        }
    }

    /// Every installed lane.
    pub(super) fn installed(&self) -> impl Iterator<Item = &Lane<R>> {
        self.table.iter().map_while(|p| {
            let p = p.load(Ordering::Acquire);
            // SAFETY: installed lanes live as long as `self`.
            (!p.is_null()).then(|| unsafe { &*p })
        })
    }

    /// This thread's lane here, if it has claimed one (hot path: the lane
    /// its thread token's bucket names, if the lane's claim holder is this
    /// thread; else one thread-local read and a compare).
    #[inline(always)]
    pub(super) fn mine(&self) -> Option<&Lane<R>> {
        let token = thread_token();
        if token != 0 {
            // Acquire: pairs with `remember`'s release (the lane's fields).
            let p = self.by_token[bucket(token, TOKEN_BUCKETS)].load(Ordering::Acquire);
            if !p.is_null() {
                // SAFETY: only lanes of this generation are stored here, and
                // they live as long as it (`self`).
                let lane = unsafe { &*p };
                // The holder is written only by the thread holding the claim
                // (`Claim`): it equals this thread's token exactly while this
                // thread holds the claim. Another thread that shares the
                // bucket, or a successor with this token, reads 0 or another
                // token and takes the thread-local path.
                if lane.claim.holder.load(Ordering::Relaxed) == token {
                    debug_assert!(lane.claim.taken.load(Ordering::Relaxed), "a holder without the claim");
                    return Some(lane);
                }
            }
        }
        self.mine_by_thread_local()
    }

    /// [`Self::mine`] through this thread's claim list.
    #[inline(always)]
    fn mine_by_thread_local(&self) -> Option<&Lane<R>> {
        let uid = self.uid;
        CLAIMS
            .try_with(|c| {
                let (hint_uid, hint) = c.hint.get();
                if hint_uid == uid {
                    return hint;
                }
                c.find(uid)
            })
            .ok()
            .flatten()
            // SAFETY: a claim's lane lives as long as its generation, which
            // `self` is.
            .map(|p| unsafe { &*p.cast::<Lane<R>>() })
    }

    /// [`Self::mine`], claiming a lane if the thread has none (before LN2,
    /// without the cache lock: the first claim allocates).
    pub(super) fn mine_or_claim(&self) -> Option<&Lane<R>> {
        if let Some(l) = self.mine() {
            return Some(l);
        }
        for cell in self.table.iter() {
            let mut p = cell.load(Ordering::Acquire);
            if p.is_null() {
                let fresh = Box::into_raw(Box::new(Lane {
                    slots: (0..self.slots_per_lane).map(|_| LaneSlot::new()).collect(),
                    hits: plain::AtomicU64::new(0),
                    releases: plain::AtomicU64::new(0),
                    memos: plain::AtomicU64::new(0),
                    clean_at: plain::AtomicU64::new(0),
                    probes: plain::AtomicU32::new(0),
                    window_hits: plain::AtomicU64::new(0),
                    dry: plain::AtomicBool::new(false),
                    tick: plain::AtomicU32::new(0),
                    claim: Arc::new(Claim { taken: plain::AtomicBool::new(true), holder: plain::AtomicUsize::new(0) }),
                    owned_taken: plain::AtomicU64::new(0),
                    owned_returned: plain::AtomicU64::new(0),
                    owned_returned_remote: RemoteCount(plain::AtomicU64::new(0)),
                }));
                match cell.compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => p = fresh,
                    Err(other) => {
                        // SAFETY: ours, never shared.
                        drop(unsafe { Box::from_raw(fresh) });
                        p = other;
                    }
                }
                if p == fresh {
                    // SAFETY: installed; lives with the generation.
                    let lane = unsafe { &*p };
                    return self.remember(lane).then_some(lane);
                }
            }
            // SAFETY: installed lanes live as long as `self`.
            let lane = unsafe { &*p };
            if lane.claim.taken.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                return self.remember(lane).then_some(lane);
            }
        }
        None
    }

    /// Called with `lane`'s claim just taken by this thread. Returns whether
    /// the thread keeps it: during its thread-locals' destruction it gives
    /// the claim back at once, and then must not use the lane (another
    /// thread may claim it and write its slots meanwhile).
    fn remember(&self, lane: &Lane<R>) -> bool {
        debug_assert!(lane.claim.taken.load(Ordering::Relaxed), "remember without the claim");
        debug_assert_eq!(lane.claim.holder.load(Ordering::Relaxed), 0, "a claim just taken has no holder");
        let ptr = (lane as *const Lane<R>).cast::<()>();
        let claim = lane.claim.clone();
        let token = thread_token();
        // Before the claim goes on the list (whose eviction or destructor
        // clears it again), so that the list's release always follows it.
        claim.holder.store(token, Ordering::Relaxed);
        let kept = CLAIMS.try_with(|c| c.add(self.uid, ptr, claim.clone())).unwrap_or(false);
        if !kept {
            // Thread-locals are being destroyed (or the list is busy): give
            // the lane back at once.
            claim.release();
            return false;
        }
        if token != 0 {
            // Release: a thread that reads the pointer reads the lane's
            // fields (made before `table` published it); pairs with `mine`.
            self.by_token[bucket(token, TOKEN_BUCKETS)].store(lane as *const Lane<R> as *mut Lane<R>, Ordering::Release);
        }
        true
    }
}

impl<R: Registrar> Drop for Lanes<R> {
    fn drop(&mut self) {
        for cell in self.table.iter() {
            let p = cell.swap(std::ptr::null_mut(), Ordering::AcqRel);
            if !p.is_null() {
                // SAFETY: installed by `mine_or_claim` with Box::into_raw.
                drop(unsafe { Box::from_raw(p) });
            }
        }
    }
}

impl<R: Registrar> Lane<R> {
    /// Counts a lane hit (owner only).
    #[inline(always)]
    pub(super) fn count_hit(&self) {
        self.hits.store(self.hits.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
    }

    /// Counts an owner's lane release (owner only).
    #[inline(always)]
    pub(super) fn count_release(&self) {
        self.releases.store(self.releases.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
    }

    /// Counts an owned lease taken (owner only). `Release`: a last handle's
    /// `Acquire` load that sees a later count sees this one.
    #[inline(always)]
    pub(super) fn count_owned_taken(&self) {
        self.owned_taken.store(self.owned_taken.load(Ordering::Relaxed).wrapping_add(1), Ordering::Release);
    }

    /// Counts an owned lease returned, by the owner of the lane (`owner`) or
    /// by another thread. `Release`: everything the releasing thread did
    /// before (its whole release) happens before the accesses of a thread
    /// whose `Acquire` load reads this count (or a later one).
    #[inline(always)]
    pub(super) fn count_owned_returned(&self, owner: bool) {
        if owner {
            self.owned_returned.store(self.owned_returned.load(Ordering::Relaxed).wrapping_add(1), Ordering::Release);
        } else {
            self.owned_returned_remote.0.fetch_add(1, Ordering::Release);
        }
    }

    /// Owned leases counted on this lane and not yet returned. The counts
    /// only grow; the returns are read before the takes (`Acquire` loads),
    /// so a return seen has its take seen too (the take happens before it).
    pub(super) fn owned_outstanding(&self) -> u64 {
        let remote = self.owned_returned_remote.0.load(Ordering::Acquire);
        let returned = self.owned_returned.load(Ordering::Acquire);
        let taken = self.owned_taken.load(Ordering::Acquire);
        taken.wrapping_sub(returned).wrapping_sub(remote)
    }

    /// (hits, releases) counted so far.
    pub(super) fn counts(&self) -> (u64, u64) {
        (self.hits.load(Ordering::Relaxed), self.releases.load(Ordering::Relaxed))
    }

    #[inline(always)]
    pub(super) fn slot(&self, span: PageSpan, access: Access) -> (u32, &LaneSlot<R>) {
        let i = slot_index(span, access, self.slots.len() - 1);
        (i as u32, &self.slots[i])
    }

    pub(super) fn slots(&self) -> &[LaneSlot<R>] {
        &self.slots
    }

    pub(super) fn lane_ref(&self, slot: u32) -> LaneRef<R> {
        LaneRef { slot: std::ptr::NonNull::from(&self.slots[slot as usize]) }
    }

    /// Whether `r` is one of this lane's slots.
    #[inline(always)]
    pub(super) fn holds(&self, r: LaneRef<R>) -> bool {
        self.slots.as_ptr_range().contains(&r.slot.as_ptr().cast_const())
    }

    /// Whether this thread holds the lane's claim, as far as a debug check
    /// can tell: its thread token is the claim's holder (where there are no
    /// tokens, as under loom, it cannot tell and says yes).
    pub(super) fn held_by_this_thread(&self) -> bool {
        let token = thread_token();
        token == 0 || (self.claim.taken.load(Ordering::Relaxed) && self.claim.holder.load(Ordering::Relaxed) == token)
    }
}

// ---------------------------------------------------------------------------
// The protocol (owner side)

/// What [`try_hit`] found.
pub(crate) enum LaneHit<R: Registrar> {
    /// LN1 succeeded: a lease on the slot.
    Hit(*mut Entry<R>, u32),
    /// No memo for this key.
    None,
    /// The memo was revoked under us: the caller runs LN4 for the undo.
    Undone(*mut Entry<R>, u32),
}

//= spec.md#LN6
//# either LN1's load sees null (it undoes) or LN1's store is visible to LN5's
//# count read (LN5 pins)
//= spec.md#LN1
//# store `held + 1`; light barrier; load `ptr` again. If unchanged, touch the
//# LRU stamp and return the hit, a lease on the slot. Else store `held` back
#[inline(always)]
pub(crate) fn try_hit<R: Registrar>(lane: &Lane<R>, span: PageSpan, access: Access) -> LaneHit<R> {
    let (i, s) = lane.slot(span, access);
    let p = s.ptr.load(Ordering::Relaxed);
    if p.is_null() || s.key_first.load(Ordering::Relaxed) != span.first || s.key_rest.load(Ordering::Relaxed) != key_rest(span, access)
    {
        return LaneHit::None;
    }
    // Invariant: only the claim's holder writes `held` (module docs).
    debug_assert!(lane.held_by_this_thread(), "LN1: `held` written by a thread without the lane's claim");
    let h = s.held.load(Ordering::Relaxed);
    plain_store(&s.held, h.wrapping_add(1));
    light_barrier();
    if plain_load_ptr(&s.ptr) == p {
        return LaneHit::Hit(p, i);
    }
    plain_store(&s.held, h);
    light_barrier();
    LaneHit::Undone(p, i)
}

/// Probes per window of the dry-spell detector.
const DRY_WINDOW: u32 = 64;
/// A dry lane probes (LN1) and memoizes (LN2) on one acquire in this many.
const DRY_SAMPLE: u32 = 16;

/// Whether the owner probes its lane on this acquire. A lane whose probes
/// hit less than a quarter of the time is *dry* (more buffers in use than
/// slots, each reused rarely): there a probe and a memo cost more than the
/// rare lane hit saves (about 20 ns per A1 hit against 50 ns saved per lane
/// hit), so it probes and memoizes on one acquire in [`DRY_SAMPLE`], and
/// leaves the spell when its sampled probes hit again. Skipping a probe or a
/// memo is always allowed: memos only save work (spec.md#LN1, LN2).
#[inline(always)]
fn worth_probing<R: Registrar>(lane: &Lane<R>) -> bool {
    if lane.dry.load(Ordering::Relaxed) {
        let t = lane.tick.load(Ordering::Relaxed).wrapping_add(1);
        lane.tick.store(t, Ordering::Relaxed);
        if !t.is_multiple_of(DRY_SAMPLE) {
            return false;
        }
    }
    let p = lane.probes.load(Ordering::Relaxed) + 1;
    if p >= DRY_WINDOW {
        let hits = lane.hits.load(Ordering::Relaxed);
        let in_window = hits.wrapping_sub(lane.window_hits.load(Ordering::Relaxed));
        lane.dry.store(in_window * 4 < u64::from(p), Ordering::Relaxed);
        lane.window_hits.store(hits, Ordering::Relaxed);
        lane.probes.store(0, Ordering::Relaxed);
    } else {
        lane.probes.store(p, Ordering::Relaxed);
    }
    true
}

/// Whether a dry lane skips this A1 hit's memo (see [`worth_probing`]).
#[inline(always)]
fn dry_skip<R: Registrar>(lane: &Lane<R>) -> bool {
    lane.dry.load(Ordering::Relaxed) && !lane.tick.load(Ordering::Relaxed).is_multiple_of(DRY_SAMPLE)
}

//= spec.md#LN2
//# after an A1 hit, if no slot has the key, take a slot with count 0 and no
//# pin and set its key and `ptr`.
/// Memoizes `e` for this key (cache lock shared held, `e` findable).
pub(crate) fn memoize<R: Registrar>(lane: &Lane<R>, span: PageSpan, access: Access, e: &Entry<R>, p: *mut Entry<R>) {
    /// A live memo survives this many A1 hits of other keys.
    const KEEP_LIVE_MEMO: u32 = 4;
    if dry_skip(lane) {
        return;
    }
    debug_assert!(lane.held_by_this_thread(), "LN2: a memo set by a thread without the lane's claim");
    let (_, s) = lane.slot(span, access);
    let current = s.ptr.load(Ordering::Relaxed);
    if !current.is_null() {
        if current == p && s.key_first.load(Ordering::Relaxed) == span.first && s.key_rest.load(Ordering::Relaxed) == key_rest(span, access)
        {
            return;
        }
        let n = s.passed_over.load(Ordering::Relaxed) + 1;
        s.passed_over.store(n, Ordering::Relaxed);
        if n < KEEP_LIVE_MEMO {
            return;
        }
    }
    if s.count() != 0 || !s.pin.load(Ordering::SeqCst).is_null() {
        return;
    }
    // Before `ptr` is published: a revoke that sees the flag clear finds no
    // slot pointing to the entry (both under the cache lock).
    e.memoized.store(true, Ordering::Relaxed);
    lane.memos.store(lane.memos.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    s.key_first.store(span.first, Ordering::Relaxed);
    s.key_rest.store(key_rest(span, access), Ordering::Relaxed);
    s.passed_over.store(0, Ordering::Relaxed);
    s.ptr.store(p, Ordering::Release);
}

/// What a lane release needs next.
pub(crate) enum LaneReleased {
    /// The slot still points to the entry: done (then the over-limit check).
    Done,
    /// Revoked meanwhile: run LN4.
    Detached,
}

//= spec.md#LN3
//# the owner stores `held − 1`, another thread adds 1 to `remote` (release
//# order). Light barrier; load `ptr`
#[inline(always)]
pub(crate) fn release<R: Registrar>(r: LaneRef<R>, e: *mut Entry<R>, owner: bool) -> LaneReleased {
    // SAFETY: the caller's lease keeps the generation alive.
    let s = unsafe { r.slot() };
    if owner {
        let h = s.held.load(Ordering::Relaxed);
        // `held` counts this lease's own LN1 store: it never goes below 0.
        debug_assert_ne!(h, 0, "LN3: an owner release with `held` 0");
        plain_store(&s.held, h.wrapping_sub(1));
    } else {
        s.remote.fetch_add(1, Ordering::SeqCst);
    }
    light_barrier();
    if plain_load_ptr(&s.ptr) == e {
        LaneReleased::Done
    } else {
        LaneReleased::Detached
    }
}

/// Whether this thread holds the claim on `r`'s lane (then it is the only
/// writer of its `held`).
#[inline(always)]
pub(crate) fn owns<R: Registrar>(lanes: &Lanes<R>, r: LaneRef<R>) -> bool {
    lanes.mine().is_some_and(|l| l.holds(r))
}

// ---------------------------------------------------------------------------
// Thread-local claims

/// This thread's lane claims: `(generation uid, lane, claim flag)`, most
/// recent last, and a one-entry hint for the hot path.
struct Claims {
    hint: Cell<(u64, Option<*const ()>)>,
    list: RefCell<Vec<(u64, *const (), Arc<Claim>)>>,
}

/// Claims kept per thread; the oldest is given back beyond it (a thread that
/// made many short-lived caches must not pin a lane in each forever).
const MAX_CLAIMS: usize = 8;

impl Claims {
    fn find(&self, uid: u64) -> Option<*const ()> {
        let list = self.list.try_borrow().ok()?;
        let found = list.iter().rev().find(|(u, _, _)| *u == uid).map(|(_, p, _)| *p);
        if found.is_some() {
            self.hint.set((uid, found));
        }
        found
    }

    /// Keeps the claim; `false` if it cannot (the list is borrowed, by a
    /// re-entrant call): the caller then gives the claim back.
    fn add(&self, uid: u64, lane: *const (), claim: Arc<Claim>) -> bool {
        let Ok(mut list) = self.list.try_borrow_mut() else {
            return false;
        };
        if list.len() >= MAX_CLAIMS {
            let (old_uid, _, old) = list.remove(0);
            old.release();
            if self.hint.get().0 == old_uid {
                self.hint.set((0, None));
            }
        }
        list.push((uid, lane, claim));
        self.hint.set((uid, Some(lane)));
        true
    }
}

impl Drop for Claims {
    fn drop(&mut self) {
        for (_, _, claim) in self.list.get_mut().drain(..) {
            claim.release();
        }
    }
}

crate::sync::thread_local! {
    #[allow(clippy::missing_const_for_thread_local)]
    static CLAIMS: Claims = Claims { hint: Cell::new((0, None)), list: RefCell::new(Vec::new()) };
}

// ---------------------------------------------------------------------------
// The cache's side: LN1, LN3, LN4, LN5

impl<R: Registrar> Cache<R> {
    /// LN1, before A1: a hit on a memo of this thread's lane, if any.
    #[inline(always)]
    pub(super) fn lane_hit<'c>(&'c self, shared: &'c Shared<R>, range: Range, access: Access) -> Option<Lease<'c, R>> {
        self.lane_hit_mine(shared, range, access).map(|(lease, _)| lease)
    }

    /// [`Self::lane_hit`], with this thread's lane that served it (for an
    /// owned lease, counted there without a second lookup).
    #[inline(always)]
    pub(super) fn lane_hit_mine<'c>(&'c self, shared: &'c Shared<R>, range: Range, access: Access) -> Option<(Lease<'c, R>, &'c Lane<R>)> {
        //= spec.md#LN1
        //# lane hit (before A1): if the queue is empty, the draining count is 0,
        //# and a slot of this thread's lane has exactly the request's key
        if self.lanes_on && shared.queue.is_empty() && shared.draining.load(Ordering::Acquire) == 0 {
            // A match, not `Option::filter`: in the shared library the
            // filter stayed a call (callgrind).
            let probe = match shared.lanes.mine() {
                Some(lane) if worth_probing(lane) => Some(lane),
                _ => None,
            };
            if let Some(lane) = probe {
                let span = range.pages(self.page_size);
                match try_hit(lane, span, access) {
                    LaneHit::Hit(p, slot) => {
                        // SAFETY: from a slot's `ptr`; LN6: the slot's count
                        // keeps the entry alive, a lease the returned one owns.
                        let lease = Lease::on_lane(self, shared, unsafe { EntryPtr::from_raw(p) }, lane.lane_ref(slot));
                        self.touch(leased(&lease));
                        lane.count_hit();
                        return Some((lease, lane));
                    }
                    LaneHit::Undone(p, slot) => self.lane_detached(shared, lane.lane_ref(slot), p),
                    LaneHit::None => {}
                }
            }
        }
        None
    }

    /// LN3 on this thread's own lane without limits: the whole release.
    /// Returns `false` if the release needs [`Self::release_slow`].
    #[inline(always)]
    pub(super) fn release_on_own_lane(&self, shared: &Shared<R>, e: EntryPtr<R>, r: LaneRef<R>) -> bool {
        if !self.limits_active
            && fork::generation() == self.forks_seen.load(Ordering::Relaxed)
            && std::ptr::eq(self.shared.load(Ordering::Relaxed), shared)
        {
            let mine = match shared.lanes.mine() {
                Some(mine) if mine.holds(r) => Some(mine),
                _ => None,
            };
            if let Some(mine) = mine {
                //= spec.md#LN3
                //# the owner stores `held − 1`, another thread adds 1 to
                //# `remote` (release order). Light barrier; load `ptr`
                mine.count_release();
                if let LaneReleased::Detached = release(r, e.as_ptr(), true) {
                    self.lane_detached(shared, r, e.as_ptr());
                }
                return true;
            }
        }
        false
    }

    /// [`Self::release_on_own_lane`] where the caller knows that `mine` is
    /// this thread's lane (an owned lease's release, which looked it up).
    #[inline(always)]
    pub(super) fn release_on_lane(&self, shared: &Shared<R>, e: EntryPtr<R>, r: LaneRef<R>, mine: &Lane<R>) -> bool {
        if !self.limits_active
            && fork::generation() == self.forks_seen.load(Ordering::Relaxed)
            && std::ptr::eq(self.shared.load(Ordering::Relaxed), shared)
            && mine.holds(r)
        {
            //= spec.md#LN3
            //# the owner stores `held − 1`, another thread adds 1 to
            //# `remote` (release order). Light barrier; load `ptr`
            mine.count_release();
            if let LaneReleased::Detached = release(r, e.as_ptr(), true) {
                self.lane_detached(shared, r, e.as_ptr());
            }
            return true;
        }
        false
    }

    /// LN3 (any thread, or with limits): the lane release, then R2 or LN4.
    pub(super) fn lane_release(&self, shared: &Shared<R>, e: EntryPtr<R>, r: LaneRef<R>) {
        //= spec.md#LN3
        //# if it is still the lease's entry, read the over-limit flag and
        //# run R2 if it is set; else run LN4.
        let owner = owns(&shared.lanes, r);
        if let LaneReleased::Detached = release(r, e.as_ptr(), owner) {
            self.lane_detached(shared, r, e.as_ptr());
        }
        crate::sync::loom_sc_fence();
        if self.limits_active && shared.over_limit.load(Ordering::SeqCst) {
            self.release_over_limit(shared);
        }
    }

    //= spec.md#LN4
    //# detached release: take the lanes mutex; if the slot's count is 0 and its
    //# pin is the lease's entry, clear the pin and release the pin as R1
    #[cold]
    pub(super) fn lane_detached(&self, shared: &Shared<R>, r: LaneRef<R>, p: *mut Entry<R>) {
        // SAFETY: `shared` is alive, so its lanes are.
        let slot = unsafe { r.slot() };
        let unpinned = {
            let _g = shared.lanes.mutex.lock().unwrap_or_else(PoisonError::into_inner);
            let pinned = slot.pin().load(Ordering::SeqCst) == p && slot.count() == 0;
            if pinned {
                slot.pin().store(std::ptr::null_mut(), Ordering::SeqCst);
            }
            pinned
        };
        if !unpinned {
            return;
        }
        // SAFETY: from a slot's `pin`, which was a lease on `p`; we own it
        // now, and it keeps the entry alive until the release below.
        let e = unsafe { EntryPtr::from_raw(p) };
        // SAFETY: as above.
        match unsafe { e.get() }.state.release() {
            Released::Held => {}
            Released::Owner { handle_gone } => self.deregister_entry(shared, e, handle_gone),
            Released::Unleased => {
                crate::sync::loom_sc_fence();
                if self.limits_active && shared.over_limit.load(Ordering::SeqCst) {
                    self.release_over_limit(shared);
                }
            }
        }
    }

    //= spec.md#LN5
    //# set `ptr` to null in every slot that points to the entries being
    //# revoked; if any, heavy barrier; then for each such slot whose count (read
    //# `remote`, then `held`) is above 0, pin it
    /// Revokes the lane memos of the entries `which` selects (lock exclusive).
    pub(super) fn revoke(&self, shared: &Shared<R>, which: impl Fn(*mut Entry<R>) -> bool) {
        self.revoke_where(shared, false, which)
    }

    /// The entries a slot of some lane points to while counting a lane
    /// lease on them (debug builds' full note; lock exclusive held, so no
    /// slot gains an entry meanwhile). One pass over the lanes.
    #[cfg(debug_assertions)]
    pub(super) fn lane_leased(&self, shared: &Shared<R>) -> std::collections::HashSet<*mut Entry<R>> {
        shared
            .lanes
            .installed()
            .flat_map(|l| l.slots().iter())
            .filter(|s| s.count() != 0)
            .map(|s| s.ptr.load(Ordering::Relaxed))
            .filter(|p| !p.is_null())
            .collect()
    }

    /// Revokes every slot's memo (trim, before it notes).
    pub(super) fn revoke_all(&self, shared: &Shared<R>) {
        self.revoke_where(shared, true, |_| true)
    }

    /// `every`: `which` selects every entry (so a lane whose memos are all
    /// revoked already can be skipped).
    fn revoke_where(&self, shared: &Shared<R>, every: bool, which: impl Fn(*mut Entry<R>) -> bool) {
        let mut installed = shared.lanes.installed().peekable();
        if installed.peek().is_none() {
            return;
        }
        let _g = shared.lanes.mutex.lock().unwrap_or_else(PoisonError::into_inner);
        debug_assert!(super::generation::held_by_this_thread(), "LN5: a revoke without the cache lock exclusive");
        let mut nulled = Vec::new();
        for l in installed {
            let memos = l.memos.load(Ordering::Relaxed);
            if every && memos == l.clean_at.load(Ordering::Relaxed) {
                continue; // no memo since the last revoke of every slot
            }
            if every {
                l.clean_at.store(memos, Ordering::Relaxed);
            }
            for s in l.slots() {
                let p = s.ptr.load(Ordering::Relaxed);
                if !p.is_null() && which(p) {
                    null_ptr(s);
                    nulled.push((s, p));
                }
            }
        }
        if nulled.is_empty() {
            return;
        }
        heavy_barrier();
        for (s, p) in nulled {
            if s.count() != 0 {
                debug_assert!(s.pin().load(Ordering::SeqCst).is_null(), "a memoized slot is never pinned");
                // SAFETY: from a slot's `ptr`; findable (revokes precede
                // removal), lock held exclusive. (LN4 reads the pin under
                // the lanes mutex, held here: the two steps are one to it.)
                let state = &unsafe { EntryPtr::from_raw(p).get() }.state;
                s.pin().store(p, Ordering::SeqCst);
                state.acquire();
                // Invariant: a set pin is a lease on the entry's state word.
                debug_assert!(state.leases() >= 1, "LN5: a pin without its lease");
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::registrar::counting::CountingRegistrar;
    use crate::thread_token::thread_token;

    /// The address of this thread's lane in `lanes`, if it has one.
    fn mine_addr(lanes: &Lanes<CountingRegistrar>) -> Option<usize> {
        lanes.mine().map(|l| l as *const Lane<CountingRegistrar> as usize)
    }

    /// A thread that exits gives its lane back, and a later thread, even one
    /// with the same thread token (glibc reuses an exited thread's stack,
    /// and the token with it), does not find the lane as its own until it
    /// claims one: `mine`'s token path checks the claim's holder, which the
    /// claim's release clears. Without that (the holder left set), the
    /// successor would write `held` of a lane it never claimed.
    #[test]
    fn a_successor_with_the_same_token_does_not_inherit_a_lane() {
        let lanes = Lanes::<CountingRegistrar>::new(4);
        let mut seen = Vec::new();
        let mut repeated = false;
        for round in 0..16 {
            let (token, before, claimed, after) = std::thread::scope(|s| {
                s.spawn(|| {
                    let before = mine_addr(&lanes);
                    let claimed = lanes.mine_or_claim().map(|l| l as *const Lane<CountingRegistrar> as usize);
                    (thread_token(), before, claimed, mine_addr(&lanes))
                })
                .join()
                .unwrap()
            });
            assert_eq!(before, None, "round {round}: a new thread (token {token:#x}) found a lane before claiming one");
            assert!(claimed.is_some(), "round {round}: no lane claimed");
            assert_eq!(after, claimed, "round {round}: the claimed lane is not this thread's");
            repeated |= token != 0 && seen.contains(&token);
            seen.push(token);
        }
        if thread_token() != 0 {
            assert!(repeated, "no thread token repeated in 16 sequential threads ({seen:x?}): the token path was not exercised");
        }
    }

    /// Threads running at once each get a lane of their own, through the
    /// token path and after it, though they share the token table's two
    /// buckets (under test): a bucket that names another thread's lane is
    /// not taken for this thread's (the holder check).
    #[test]
    fn threads_running_at_once_have_distinct_lanes() {
        let lanes = Lanes::<CountingRegistrar>::new(4);
        let barrier = std::sync::Barrier::new(8);
        let got: Vec<(usize, usize)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        let claimed = lanes.mine_or_claim().unwrap() as *const Lane<CountingRegistrar> as usize;
                        barrier.wait();
                        // Every thread has claimed: each still finds its own.
                        let again = mine_addr(&lanes).unwrap();
                        barrier.wait();
                        (claimed, again)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut lanes_seen: Vec<usize> = got.iter().map(|&(c, a)| {
            assert_eq!(c, a, "a thread's lane changed while it ran");
            c
        }).collect();
        lanes_seen.sort_unstable();
        lanes_seen.dedup();
        assert_eq!(lanes_seen.len(), 8, "two running threads share a lane: {got:x?}");
    }
}
