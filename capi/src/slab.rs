//! Lease handles: a slab of slots, each holding one [`Lease`], named by
//! `(cache tag, generation, index)` packed in a `u64`.
//!
//! Invariants:
//! - a slot's `state` is `generation << 1 | LIVE`; it is LIVE exactly while
//!   its `lease` cell holds a lease. Only the thread that popped the slot
//!   from the free list writes the cell (then sets LIVE, release order);
//!   only the thread whose compare-exchange cleared LIVE (and bumped the
//!   generation) releases the lease, in its cell. So a double release, a
//!   stale handle (its generation is gone) and a foreign one (another
//!   cache's tag, an index never handed out) fail the compare-exchange or
//!   the decoding and get `MRCACHE_INVALID_LEASE`; nothing is dereferenced
//!   on their behalf. Between that compare-exchange and the slot's return
//!   to a free list the slot belongs to the releasing thread, which drops
//!   the lease in the cell (the cell still holds it, the slot is not LIVE
//!   and on no list); the slot goes back even if that drop panics.
//! - slots are never freed before the slab: chunks are allocated once (on
//!   first use) and freed in `Drop`, so any index below the fresh counter
//!   names memory that stays valid.
//! - free slots are on the slab's lock-free free list or in the local free
//!   list of one thread (its [`ThreadBucket`] of this cache: up to
//!   [`crate::threads::LOCAL_FREE_MAX`] slots), which serves that thread's
//!   acquires and releases without an atomic read-modify-write or a
//!   thread-local lookup; a slot is in exactly one place. The entry points pass the calling
//!   thread's bucket (found once, by their re-entry check) to
//!   [`LeaseSlab::insert`] and [`LeaseSlab::release`].
//! - a generation wraps after 2^28 uses of one slot: a handle kept that long
//!   could alias; a tag is 16 bits: the 65,536th cache created reuses one.
//! - the free-list head carries a 32-bit tag that every successful pop and
//!   push increments: a pop whose compare-exchange saw the same index on
//!   top but another tag lost a race in which that index left the list and
//!   came back (ABA), and retries instead of installing a stale link.
//! - a read is a seqlock read of the slot's copies: the state must be this
//!   handle's LIVE word before and after the copies are loaded.
//!
//! Every atomic and the lease cell go through [`crate::sync`], so the loom
//! models (`models`, `--cfg loom`) explore this code as the library runs
//! it; the payload is generic ([`Held`]) only so that the models can hold a
//! lease without a cache. The deliberate breakages of [`SlabMutant`] exist
//! in test and loom builds only.

use crate::registrar::CRegistrar;
use crate::status::{Failure, MRCACHE_INVALID_LEASE, MRCACHE_TOO_MANY_LEASES};
use crate::sync::{fence, AtomicPtr, AtomicU32, AtomicU64, UnsafeCell};
use crate::threads::ThreadBucket;
use mrcache_impl::registrar::Keys;
use mrcache_impl::Lease;
use mrcache_types::RegView;
use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;

/// A lease as C holds it: an opaque value. An all-zero lease is
/// never a valid lease.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub struct mrcache_lease_t {
    /// Opaque: do not interpret.
    pub opaque: u64,
}

const INDEX_BITS: u32 = 20;
const GEN_BITS: u32 = 28;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
const GEN_MASK: u32 = (1 << GEN_BITS) - 1;
/// Leases one cache can hold at once (loom: a few, in chunks of two, so that
/// a model's slab is small and still allocates a second chunk).
#[cfg(not(loom))]
pub(crate) const MAX_LEASES: u32 = 1 << INDEX_BITS;
#[cfg(not(loom))]
const CHUNK: u32 = 1024;
#[cfg(loom)]
pub(crate) const MAX_LEASES: u32 = 4;
#[cfg(loom)]
const CHUNK: u32 = 2;
const CHUNKS: usize = (MAX_LEASES / CHUNK) as usize;
const LIVE: u32 = 1;

/// What a slot holds: the C API's leases; the loom models' stand-ins.
pub(crate) trait Held: Sized {
    fn keys(&self) -> Keys;
    fn view(&self) -> RegView;

    /// Drops the value in `cell` (its release, for a lease), in place.
    ///
    /// # Safety
    /// `cell` holds an initialised value that nothing else touches.
    unsafe fn drop_in(cell: *mut MaybeUninit<Self>) {
        // SAFETY: the caller's contract.
        unsafe { (*cell).assume_init_drop() }
    }
}

impl Held for Lease<'static, CRegistrar> {
    #[inline(always)]
    fn keys(&self) -> Keys {
        Lease::keys(self)
    }
    #[inline(always)]
    fn view(&self) -> RegView {
        Lease::view(self)
    }
    /// Concrete, so that the lease's release is inlined into
    /// `mrcache_release` as it was before the slab was generic (dropped
    /// through the generic `L`, it became an out-of-line call).
    #[inline(always)]
    unsafe fn drop_in(cell: *mut MaybeUninit<Self>) {
        // SAFETY: the caller's contract.
        unsafe { (*cell).assume_init_drop() }
    }
}

/// The slab's deliberate breakages, by the names of
/// `mrcache_types::mutants::SLAB_MUTANTS`; each is caught by a model of
/// `models`. Only test and loom builds can select one (the library's slab
/// has no field for it, and `broken` is `false`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SlabMutant {
    /// The free-list tag is never incremented: a pop's compare-exchange
    /// succeeds across an ABA and hands out a slot that is in use.
    TagNotIncremented,
    /// A handle's generation is not compared: a stale handle names
    /// whatever lease its slot holds now.
    NoGenerationCheck,
    /// A read does not load the state again after the copies: it can
    /// return another lease's keys and view.
    NoSeqlockRecheck,
    /// A released slot goes to its thread's list with the generation it had,
    /// not the next one: the thread that reuses it (the same one, or the one
    /// that inherits the list after it exits) revives the old handle.
    LocalListKeepsGeneration,
}

#[cfg(any(test, loom))]
impl SlabMutant {
    pub(crate) const ALL: [SlabMutant; 4] =
        [SlabMutant::TagNotIncremented, SlabMutant::NoGenerationCheck, SlabMutant::NoSeqlockRecheck, SlabMutant::LocalListKeepsGeneration];

    pub(crate) fn name(self) -> &'static str {
        match self {
            SlabMutant::TagNotIncremented => "slab-tag-not-incremented",
            SlabMutant::NoGenerationCheck => "slab-no-generation-check",
            SlabMutant::NoSeqlockRecheck => "slab-no-seqlock-recheck",
            SlabMutant::LocalListKeepsGeneration => "slab-local-list-keeps-generation",
        }
    }
}

/// One cache line each: two threads' leases never share one.
#[repr(align(64))]
struct Slot<L> {
    /// `generation << 1 | LIVE`.
    state: AtomicU32,
    /// Free list link: index + 1 of the next free slot, 0 at the end.
    next_free: AtomicU32,
    lease: UnsafeCell<MaybeUninit<L>>,
    /// Copies of the lease's keys and view, readable by any thread without
    /// owning the slot (a seqlock on `state`).
    lkey: AtomicU32,
    rkey: AtomicU32,
    access: AtomicU32,
    id: AtomicU64,
    addr: AtomicU64,
    len: AtomicU64,
    /// The process's fork generation when the lease was taken: in a fork
    /// child, a lease from before the fork is void (its holder may not
    /// exist there), and [`LeaseSlab::held`] does not count it.
    fork_generation: AtomicU64,
}

impl<L> Slot<L> {
    fn empty() -> Slot<L> {
        Slot {
            state: AtomicU32::new(0),
            next_free: AtomicU32::new(0),
            lease: UnsafeCell::new(MaybeUninit::uninit()),
            lkey: AtomicU32::new(0),
            rkey: AtomicU32::new(0),
            access: AtomicU32::new(0),
            id: AtomicU64::new(0),
            addr: AtomicU64::new(0),
            len: AtomicU64::new(0),
            fork_generation: AtomicU64::new(0),
        }
    }
}

/// The lease handles of one cache.
pub(crate) struct LeaseSlab<L = Lease<'static, CRegistrar>> {
    /// This cache's tag in every handle (1..=65535).
    tag: u64,
    /// Each a leaked `Box<[Slot]>` of `CHUNK` slots, or null (a fixed-size
    /// array: a decoded handle's chunk number needs no bounds check).
    chunks: Box<[AtomicPtr<Slot<L>>; CHUNKS]>,
    /// Treiber stack of free slots: `aba counter << 32 | (index + 1)`.
    free_head: AtomicU64,
    /// Slots handed out so far (indices below it have a chunk).
    fresh: AtomicU32,
    /// The breakage this slab runs with (test and loom builds only).
    #[cfg(any(test, loom))]
    mutant: Option<SlabMutant>,
}

// SAFETY: the `lease` cells are only touched by the thread that owns the slot
// (see the module invariants); everything else is atomic.
unsafe impl<L: Send> Sync for LeaseSlab<L> {}
// SAFETY: as above; leases are `Send`.
unsafe impl<L: Send> Send for LeaseSlab<L> {}

#[cold]
fn no_chunk() -> Failure {
    Failure::new(crate::status::MRCACHE_INTERNAL, "lease slot without a chunk")
}

#[cold]
pub(crate) fn invalid(h: mrcache_lease_t) -> Failure {
    Failure::new(
        MRCACHE_INVALID_LEASE,
        format!("lease {:#x} is not held by this cache (released already, stale, or another cache's)", h.opaque),
    )
}

impl<L: Held> LeaseSlab<L> {
    /// `id`: unique per process; its low bits are the handles' tag.
    pub(crate) fn new(id: u64) -> LeaseSlab<L> {
        let tag = (id % 0xffff) as u16 + 1;
        LeaseSlab {
            tag: u64::from(tag),
            chunks: Box::new(std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut()))),
            free_head: AtomicU64::new(0),
            fresh: AtomicU32::new(0),
            #[cfg(any(test, loom))]
            mutant: None,
        }
    }

    /// A slab that runs with the breakage `m`.
    #[cfg(any(test, loom))]
    pub(crate) fn with_mutant(id: u64, m: SlabMutant) -> LeaseSlab<L> {
        let mut slab = LeaseSlab::new(id);
        slab.mutant = Some(m);
        slab
    }

    /// Whether this slab runs with the breakage `m` (always `false` in the
    /// library).
    #[inline(always)]
    #[allow(unused_variables)]
    fn broken(&self, m: SlabMutant) -> bool {
        #[cfg(any(test, loom))]
        return self.mutant == Some(m);
        #[cfg(not(any(test, loom)))]
        false
    }

    /// The free-list tag after `h`'s: one more, so a compare-exchange
    /// against `h` fails once the head changed, even back to `h`'s index.
    #[inline(always)]
    fn next_tag(&self, h: u64) -> u64 {
        if self.broken(SlabMutant::TagNotIncremented) {
            return h >> 32;
        }
        (h >> 32).wrapping_add(1)
    }

    #[inline(always)]
    fn slot(&self, index: u32) -> Option<&Slot<L>> {
        let chunk = self.chunks.get((index / CHUNK) as usize)?.load(Ordering::Acquire);
        if chunk.is_null() {
            return None;
        }
        // SAFETY: a non-null chunk holds CHUNK slots and lives as long as the slab.
        Some(unsafe { &*chunk.add((index % CHUNK) as usize) })
    }

    fn pop_free(&self) -> Option<u32> {
        let mut h = self.free_head.load(Ordering::Acquire);
        loop {
            let top = h as u32;
            if top == 0 {
                return None;
            }
            let next = self.slot(top - 1)?.next_free.load(Ordering::Relaxed);
            let new = (self.next_tag(h) << 32) | u64::from(next);
            match self.free_head.compare_exchange_weak(h, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(top - 1),
                Err(now) => h = now,
            }
        }
    }

    fn push_free(&self, index: u32, slot: &Slot<L>) {
        let mut h = self.free_head.load(Ordering::Relaxed);
        loop {
            slot.next_free.store(h as u32, Ordering::Relaxed);
            let new = (self.next_tag(h) << 32) | u64::from(index + 1);
            match self.free_head.compare_exchange_weak(h, new, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => h = now,
            }
        }
    }

    /// A free slot and its generation from the shared free list, or fresh.
    #[cold]
    #[inline(never)]
    fn shared_slot(&self) -> Result<(u32, u32), Failure> {
        let index = match self.pop_free() {
            Some(i) => i,
            None => self.fresh_slot()?,
        };
        let slot = self.slot(index).ok_or_else(no_chunk)?;
        Ok((index, slot.state.load(Ordering::Relaxed) >> 1))
    }

    /// A free slot, from the free list or fresh (allocating its chunk once).
    #[cold]
    fn fresh_slot(&self) -> Result<u32, Failure> {
        let index = self
            .fresh
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < MAX_LEASES).then_some(n + 1))
            .map_err(|_| Failure::new(MRCACHE_TOO_MANY_LEASES, format!("more than {MAX_LEASES} leases held at once")))?;
        let cell = &self.chunks[(index / CHUNK) as usize];
        if cell.load(Ordering::Acquire).is_null() {
            let chunk: Box<[Slot<L>]> = (0..CHUNK).map(|_| Slot::empty()).collect();
            let p = Box::into_raw(chunk) as *mut Slot<L>;
            if cell.compare_exchange(std::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire).is_err() {
                // SAFETY: ours, from Box::into_raw just above, never shared.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, CHUNK as usize)) });
            }
        }
        Ok(index)
    }

    /// Stores `lease` and returns its handle. Always inlined: the caller's
    /// lease is then stored from registers (passed by pointer, it is read
    /// back from the stack with wider loads than it was written with, and
    /// store forwarding stalls).
    #[inline(always)]
    pub(crate) fn insert(&self, mine: Option<&ThreadBucket>, lease: L) -> Result<mrcache_lease_t, Failure> {
        let (index, generation) = match mine.and_then(ThreadBucket::pop_free_slot) {
            Some(local) => local,
            None => self.shared_slot()?,
        };
        let Some(slot) = self.slot(index) else {
            return Err(no_chunk());
        };
        debug_assert_eq!(slot.state.load(Ordering::Relaxed), generation << 1, "a free slot's state");
        // Read from the lease in hand, not back from the cell: that copy is
        // written with wider stores than the fields are read with, and the
        // loads would wait for it to reach the cache (no store forwarding).
        let (keys, view) = (lease.keys(), lease.view());
        // SAFETY: the slot is ours (popped or fresh, not LIVE): nobody else
        // touches the cell until the LIVE store below publishes it.
        #[cfg(not(loom))]
        unsafe {
            (*slot.lease.get()).write(lease)
        };
        // SAFETY: as above; loom checks the access against the happens-before order.
        #[cfg(loom)]
        slot.lease.with_mut(|cell| unsafe { (*cell).write(lease) });
        // Seqlock writer: the copies change only after the slot left LIVE
        // (its release bumped the generation); readers recheck the state.
        fence(Ordering::Release);
        slot.lkey.store(keys.lkey, Ordering::Relaxed);
        slot.rkey.store(keys.rkey, Ordering::Relaxed);
        slot.access.store(u32::from(view.access.bits()), Ordering::Relaxed);
        slot.id.store(view.id, Ordering::Relaxed);
        slot.addr.store(view.addr, Ordering::Relaxed);
        slot.len.store(view.len, Ordering::Relaxed);
        slot.fork_generation.store(mrcache_impl::cache::fork_generation(), Ordering::Relaxed);
        slot.state.store(generation << 1 | LIVE, Ordering::Release);
        Ok(mrcache_lease_t { opaque: self.tag << 48 | u64::from(generation) << INDEX_BITS | u64::from(index) })
    }

    /// The slot and generation a handle names, if it is this slab's.
    #[inline(always)]
    fn decode(&self, h: mrcache_lease_t) -> Option<(u32, &Slot<L>, u32)> {
        if h.opaque >> 48 != self.tag {
            return None;
        }
        let index = (h.opaque & INDEX_MASK) as u32;
        let slot = self.slot(index)?;
        if self.broken(SlabMutant::NoGenerationCheck) {
            return Some((index, slot, slot.state.load(Ordering::Relaxed) >> 1));
        }
        let generation = (h.opaque >> INDEX_BITS) as u32 & GEN_MASK;
        Some((index, slot, generation))
    }

    /// Releases the lease a handle names (the handle is dead afterwards):
    /// `false` if it names no lease held here ([`invalid`]).
    ///
    /// The lease is released where it lies, in its slot (its `Drop` is the
    /// release): moved out first, it went through the stack twice (24 more
    /// instructions per acquire and release, callgrind). The slot goes back
    /// to a free list only after that, so no insert reuses it meanwhile.
    #[inline(always)]
    pub(crate) fn release(&self, mine: Option<&ThreadBucket>, h: mrcache_lease_t) -> bool {
        let Some((index, slot, generation)) = self.decode(h) else {
            return false;
        };
        let next = (generation + 1) & GEN_MASK;
        // AcqRel: acquire pairs with `insert`'s LIVE store (the cell's
        // lease); the read-modify-write makes one of two racing releases of
        // a handle the one that releases.
        if slot.state.compare_exchange(generation << 1 | LIVE, next << 1, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return false;
        }
        // The slot goes back to a free list after the drop below, also if
        // the drop panics (the C entry point catches it): else the slot
        // would be lost for the cache's life.
        let keep = if self.broken(SlabMutant::LocalListKeepsGeneration) { generation } else { next };
        let _back = SlotBack { slab: self, mine, index, next: keep, slot };
        // SAFETY: our compare-exchange cleared LIVE: the cell holds the lease
        // the inserting thread wrote (acquire order), only we touch it, and
        // it is dropped once (no handle reaches a slot that is not LIVE, and
        // no insert reaches it until `_back` returns it to a free list).
        #[cfg(not(loom))]
        unsafe {
            L::drop_in(slot.lease.get())
        };
        // SAFETY: as above; loom checks the access against the happens-before order.
        #[cfg(loom)]
        slot.lease.with_mut(|cell| unsafe { L::drop_in(cell) });
        true
    }

    /// The keys and view of a held lease.
    pub(crate) fn read(&self, h: mrcache_lease_t) -> Result<(Keys, RegView), Failure> {
        let (_, slot, generation) = self.decode(h).ok_or_else(|| invalid(h))?;
        let live = generation << 1 | LIVE;
        if slot.state.load(Ordering::Acquire) != live {
            return Err(invalid(h));
        }
        let keys = Keys { lkey: slot.lkey.load(Ordering::Relaxed), rkey: slot.rkey.load(Ordering::Relaxed) };
        let access = mrcache_types::Access::from_bits(slot.access.load(Ordering::Relaxed) as u8);
        let (id, addr, len) = (slot.id.load(Ordering::Relaxed), slot.addr.load(Ordering::Relaxed), slot.len.load(Ordering::Relaxed));
        fence(Ordering::Acquire);
        if !self.broken(SlabMutant::NoSeqlockRecheck) && slot.state.load(Ordering::Relaxed) != live {
            return Err(invalid(h));
        }
        let access = access.ok_or_else(|| invalid(h))?;
        Ok((keys, RegView { id, addr, len, access }))
    }

    /// Slots made so far.
    #[cfg(any(test, loom))]
    pub(crate) fn slots_made(&self) -> u32 {
        self.fresh.load(Ordering::Relaxed)
    }

    /// Leases held now (a scan; for `mrcache_destroy` and the stats).
    /// Leases held in this process: a lease taken before a fork is void in
    /// the child (spec.md#S2.6) and not counted there, so a child can
    /// always destroy its cache; such a lease is leaked with the slab.
    pub(crate) fn held(&self) -> u64 {
        let fresh = self.fresh.load(Ordering::Acquire);
        let now = mrcache_impl::cache::fork_generation();
        (0..fresh)
            .filter_map(|i| self.slot(i))
            // Acquire on the state: the fork generation was stored before
            // the LIVE store that this load reads.
            .filter(|s| s.state.load(Ordering::Acquire) & LIVE != 0 && s.fork_generation.load(Ordering::Relaxed) == now)
            .count() as u64
    }
}

/// Returns a released slot to this thread's free list or the shared one
/// when dropped ([`LeaseSlab::release`]).
struct SlotBack<'a, L: Held> {
    slab: &'a LeaseSlab<L>,
    mine: Option<&'a ThreadBucket>,
    index: u32,
    next: u32,
    slot: &'a Slot<L>,
}

impl<L: Held> Drop for SlotBack<'_, L> {
    #[inline(always)]
    fn drop(&mut self) {
        if !self.mine.is_some_and(|b| b.push_free_slot(self.index, self.next)) {
            self.slab.push_free(self.index, self.slot);
        }
    }
}

impl<L> Drop for LeaseSlab<L> {
    fn drop(&mut self) {
        for cell in self.chunks.iter() {
            let p = cell.load(Ordering::Acquire);
            if !p.is_null() {
                // SAFETY: from Box::into_raw of a CHUNK-slot box in `fresh_slot`.
                // A lease still inside is leaked (not dropped): its cache may
                // be gone; `mrcache_destroy` refuses while any is held.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, CHUNK as usize)) });
            }
        }
    }
}

#[cfg(test)]
mod models;
