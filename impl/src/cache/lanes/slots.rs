//! Memo slots, lanes and a generation's lanes (spec.md#A, "lane").

use super::claims::{Claim, CLAIMS};
use super::MAX_LANES;
use crate::cache::entry::Entry;
use crate::registrar::Registrar;
use crate::sync::{plain, AtomicPtr, AtomicU64, Ordering};
use crate::thread_token::{bucket, thread_token};
use mrcache_types::{Access, PageSpan};
use std::sync::Arc;

/// Buckets of [`Lanes`]' thread token table (a power of two). Unit tests
/// use two, so that threads running at once share buckets.
#[cfg(not(test))]
const TOKEN_BUCKETS: usize = 2 * MAX_LANES;
#[cfg(test)]
const TOKEN_BUCKETS: usize = 2;

/// One memo slot (spec.md#A, "lane").
pub(crate) struct LaneSlot<R: Registrar> {
    /// Key: first page; and end page << 8 | access bits. Owner-only.
    pub(super) key_first: plain::AtomicU64,
    pub(super) key_rest: plain::AtomicU64,
    /// The memoized entry, or null (revoked / never set).
    pub(in crate::cache) ptr: AtomicPtr<Entry<R>>,
    /// Leases taken here by the owner, minus the owner's releases.
    pub(super) held: AtomicU64,
    /// Releases of this slot's leases by other threads.
    pub(super) remote: AtomicU64,
    /// The entry this slot holds one state-word lease on (LN5), or null.
    pub(super) pin: AtomicPtr<Entry<R>>,
    /// A1 hits of other keys that found this slot taken since its last
    /// memoize (owner-only): a live memo is replaced only after a few, so two
    /// keys sharing a slot do not re-memoize on every hit.
    pub(super) passed_over: plain::AtomicU32,
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
    pub(in crate::cache) fn count(&self) -> u64 {
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
    pub(in crate::cache) fn pin(&self) -> &AtomicPtr<Entry<R>> {
        &self.pin
    }
}

#[inline]
pub(super) fn key_rest(span: PageSpan, access: Access) -> u64 {
    (span.end << 8) | u64::from(access.bits())
}

//= spec.md#LN2
//# Each key has one slot, chosen by a hash of the key: keys that hash alike
//# share it
#[inline(always)]
fn slot_index(span: PageSpan, access: Access, mask: usize) -> usize {
    let h = span.first.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ span.end.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    ((h ^ u64::from(access.bits())) >> 32) as usize & mask
}

/// A1 misses in a row after which a thread with limits skips A1 (see
/// [`Lane::a1_misses`]): a miss then does not take the cache lock shared
/// for a lookup that misses before A2 takes it exclusive (about 9 ns of a
/// 250 ns evicting miss, bench/peers).
pub(crate) const A1_MISS_STREAK: u32 = 4;

/// One thread's memo table in one cache generation.
pub(crate) struct Lane<R: Registrar> {
    slots: Box<[LaneSlot<R>]>,
    /// Lane hits and lane releases by the owner (owner-only plain
    /// increments: no shared counter on the hit path). `Stats` adds them.
    pub(super) hits: plain::AtomicU64,
    releases: plain::AtomicU64,
    /// Memos made (LN2, under the cache lock shared), and their number when
    /// a revoke of every slot last left them all null (under the lock
    /// exclusive): equal means no slot points anywhere, so the revoke of
    /// every slot before a note (LN5) skips the lane instead of reading each
    /// slot. Ordered by the cache lock.
    pub(in crate::cache) memos: plain::AtomicU64,
    pub(in crate::cache) clean_at: plain::AtomicU64,
    /// The dry-spell detector ([`worth_probing`]; owner only, on this
    /// header's line): probes in the current window, `hits` when it began,
    /// whether the lane is dry, and acquires since the window began (the
    /// sampling clock of a dry lane).
    pub(super) probes: plain::AtomicU32,
    pub(super) window_hits: plain::AtomicU64,
    pub(super) dry: plain::AtomicBool,
    pub(super) tick: plain::AtomicU32,
    /// A1 lookups in a row that missed (owner only, plain): with limits, a
    /// thread whose last [`A1_MISS_STREAK`] A1 lookups missed skips A1 until
    /// its next hit (spec.md#A1; `Cache::acquire_a1`).
    pub(in crate::cache) a1_misses: plain::AtomicU32,
    /// Held by the thread that owns the lane; released by its thread-local
    /// destructor (or when it drops the claim to bound its claim list).
    claim: Arc<Claim>,
    /// Owned leases ([`crate::OwnedLease`]) counted on this lane: taken by
    /// the owner, returned by the owner (owner-only plain increments,
    /// `Release` stores) or by another thread (`remote`, an atomic add on its
    /// own cache line). See "Owned leases" in [`crate::cache::lease`].
    owned_taken: plain::AtomicU64,
    owned_returned: plain::AtomicU64,
    owned_returned_remote: RemoteCount,
}

/// A counter other threads add to, on a cache line of its own (so a remote
/// release does not write the line of the owner's hot counters).
#[repr(align(128))]
struct RemoteCount(plain::AtomicU64);

/// A lane lease's slot (see [`crate::Lease`]).
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
    pub(in crate::cache) unsafe fn slot<'a>(self) -> &'a LaneSlot<R> {
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
    /// holder. The last claimer of a bucket keeps it. A fixed-size array:
    /// a bucket needs no bounds check on the hit path.
    by_token: Box<[plain::AtomicPtr<Lane<R>>; TOKEN_BUCKETS]>,
    /// LN4/LN5 ordering.
    pub(in crate::cache) mutex: crate::sync::Mutex<()>,
}

static NEXT_UID: plain::AtomicU64 = plain::AtomicU64::new(1);

impl<R: Registrar> Lanes<R> {
    /// `slots_per_lane`: a power of two (the config validated it).
    pub fn new(slots_per_lane: u32) -> Self {
        Lanes {
            uid: NEXT_UID.fetch_add(1, Ordering::Relaxed),
            slots_per_lane: slots_per_lane as usize,
            table: (0..MAX_LANES).map(|_| plain::AtomicPtr::new(std::ptr::null_mut())).collect(),
            by_token: Box::new(std::array::from_fn(|_| plain::AtomicPtr::new(std::ptr::null_mut()))),
            mutex: crate::sync::Mutex::new(()),
        }
    }

    /// Every installed lane.
    pub(in crate::cache) fn installed(&self) -> impl Iterator<Item = &Lane<R>> {
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
    pub(in crate::cache) fn mine(&self) -> Option<&Lane<R>> {
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
    #[inline(always)]
    pub(in crate::cache) fn mine_or_claim(&self) -> Option<&Lane<R>> {
        if let Some(l) = self.mine() {
            return Some(l);
        }
        self.claim()
    }

    //= spec.md#LN3
    //# A thread claims the first free lane at its first A1 on the cache
    /// A claim of a free or new lane (a thread's first A1 on this
    /// generation, or after its claim was lost): out of line.
    #[cold]
    #[inline(never)]
    fn claim(&self) -> Option<&Lane<R>> {
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
                    a1_misses: plain::AtomicU32::new(0),
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
    pub(in crate::cache) fn count_hit(&self) {
        self.hits.store(self.hits.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
    }

    /// Counts an owner's lane release (owner only).
    #[inline(always)]
    pub(in crate::cache) fn count_release(&self) {
        self.releases.store(self.releases.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
    }

    /// Counts an owned lease taken (owner only). `Release`: a last handle's
    /// `Acquire` load that sees a later count sees this one.
    #[inline(always)]
    pub(in crate::cache) fn count_owned_taken(&self) {
        self.owned_taken.store(self.owned_taken.load(Ordering::Relaxed).wrapping_add(1), Ordering::Release);
    }

    /// Counts an owned lease returned, by the owner of the lane (`owner`) or
    /// by another thread. `Release`: everything the releasing thread did
    /// before (its whole release) happens before the accesses of a thread
    /// whose `Acquire` load reads this count (or a later one).
    #[inline(always)]
    pub(in crate::cache) fn count_owned_returned(&self, owner: bool) {
        if owner {
            self.owned_returned.store(self.owned_returned.load(Ordering::Relaxed).wrapping_add(1), Ordering::Release);
        } else {
            self.owned_returned_remote.0.fetch_add(1, Ordering::Release);
        }
    }

    /// Owned leases counted on this lane and not yet returned. The counts
    /// only grow; the returns are read before the takes (`Acquire` loads),
    /// so a return seen has its take seen too (the take happens before it).
    pub(in crate::cache) fn owned_outstanding(&self) -> u64 {
        let remote = self.owned_returned_remote.0.load(Ordering::Acquire);
        let returned = self.owned_returned.load(Ordering::Acquire);
        let taken = self.owned_taken.load(Ordering::Acquire);
        taken.wrapping_sub(returned).wrapping_sub(remote)
    }

    /// (hits, releases) counted so far.
    pub(in crate::cache) fn counts(&self) -> (u64, u64) {
        (self.hits.load(Ordering::Relaxed), self.releases.load(Ordering::Relaxed))
    }

    #[inline(always)]
    pub(in crate::cache) fn slot(&self, span: PageSpan, access: Access) -> (u32, &LaneSlot<R>) {
        let i = slot_index(span, access, self.slots.len() - 1);
        (i as u32, &self.slots[i])
    }

    pub(in crate::cache) fn slots(&self) -> &[LaneSlot<R>] {
        &self.slots
    }

    pub(in crate::cache) fn lane_ref(&self, slot: u32) -> LaneRef<R> {
        LaneRef { slot: std::ptr::NonNull::from(&self.slots[slot as usize]) }
    }

    /// Whether `r` is one of this lane's slots.
    #[inline(always)]
    pub(in crate::cache) fn holds(&self, r: LaneRef<R>) -> bool {
        self.slots.as_ptr_range().contains(&r.slot.as_ptr().cast_const())
    }

    /// Whether this thread holds the lane's claim, as far as a debug check
    /// can tell: its thread token is the claim's holder (where there are no
    /// tokens, as under loom, it cannot tell and says yes).
    pub(in crate::cache) fn held_by_this_thread(&self) -> bool {
        let token = thread_token();
        token == 0 || (self.claim.taken.load(Ordering::Relaxed) && self.claim.holder.load(Ordering::Relaxed) == token)
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
        let mut lanes_seen: Vec<usize> = got
            .iter()
            .map(|&(c, a)| {
                assert_eq!(c, a, "a thread's lane changed while it ran");
                c
            })
            .collect();
        lanes_seen.sort_unstable();
        lanes_seen.dedup();
        assert_eq!(lanes_seen.len(), 8, "two running threads share a lane: {got:x?}");
    }
}
