//! Entries and their ownership (spec.md#A-H): the one place that turns an
//! entry pointer into a reference.

use super::entry_state::EntryState;
use crate::index::Slot;
use crate::registrar::{Keys, Registrar};
use crate::sync::plain;
use mrcache_types::{Access, PageSpan, RegView};
use std::mem::ManuallyDrop;
use std::ptr::NonNull;

/// One cached registration. Immutable after creation except for its atomics.
///
/// `repr(C)`: what a hit touches leads, in the first 72 bytes: the state
/// word and the LRU stamp (A1), then the keys and the view a lease hands
/// out (the C API copies them into its lease slot at every acquire), which
/// is also the key the hit memo checks. An entry is 8-byte aligned in its
/// pool's block ([`super::entry_pool`]), so those 72 bytes lie on at most
/// two cache lines, and the hit memo prefetches both (at the entry and 64
/// bytes on: [`crate::hit_memo`]). Eviction's fields follow.
///
/// The view is kept field by field, not as a [`RegView`], so that its
/// one-byte access shares a word with `memoized` and the cost instead of
/// padding a word of its own, and it doubles as the key the hit memo
/// checks (no separate copy of the page span): the fields before the
/// handle take 72 bytes, not 104, and with the C API's 16-byte handle an
/// entry is a 96-byte glibc chunk instead of 128 (fewer pages touched per
/// registration: the fill's page faults).
#[repr(C)]
pub(crate) struct Entry<R: Registrar> {
    pub(crate) state: EntryState,
    /// Logical time of the last use (LRU).
    pub(super) last_use: plain::AtomicU64,
    pub(crate) keys: Keys,
    /// The view ([`Entry::view`]): id, byte range and access. The byte
    /// range is the entry's page span times the page size (A4's plan), so
    /// the view is also the entry's key ([`Entry::has_key`]).
    pub(crate) view_id: u64,
    pub(crate) view_addr: u64,
    pub(crate) view_len: u64,
    pub(crate) view_access: Access,
    /// Some lane slot may point to it (LN2 sets it; LN5 skips the scan if clear).
    pub(super) memoized: plain::AtomicBool,
    /// Per-page registration cost, ns (S6.3): at most 16,000 + 0.06 ns per
    /// byte of a page, and pages are at most 2^20 bytes (`CacheConfig`'s
    /// check), so below 80,000 (`per_page_cost_ns`); `u32` keeps it in the
    /// word the two bytes above leave.
    pub(super) cost: u32,
    /// GreedyDual-Size priority `H`.
    pub(super) priority: plain::AtomicU64,
    /// The number of the last note (A6, R2, trim) that found it unleased.
    /// Written only under the lock exclusive (the lock orders it).
    pub(super) noted: plain::AtomicU64,
    /// Taken exactly once by the deregistration owner (or by the P3 fault).
    pub(crate) handle: ManuallyDrop<R::Handle>,
}

/// Where a hit's fields end (`Entry`'s docs): the hit memo's two prefetches
/// cover `[0, HIT_BYTES)` of an 8-byte aligned entry.
const HIT_BYTES: usize = 72;
const _: () = {
    use crate::registrar::counting::{CountingHandle, CountingRegistrar as C};
    assert!(std::mem::offset_of!(Entry<C>, view_access) + std::mem::size_of::<Access>() <= HIT_BYTES);
    assert!(std::mem::offset_of!(Entry<C>, view_id) >= std::mem::offset_of!(Entry<C>, keys));
    // The fields before the handle (type docs).
    assert!(std::mem::size_of::<Entry<C>>() - std::mem::size_of::<CountingHandle>() == 72);
    assert!(std::mem::offset_of!(Entry<C>, keys) + std::mem::size_of::<Keys>() <= HIT_BYTES);
    assert!(std::mem::offset_of!(Entry<C>, last_use) + 8 <= HIT_BYTES);
    // An 8-byte aligned entry starts at byte 0, 8, ..., or 56 of a line: its
    // first HIT_BYTES lie on that line and the next, the lines of its bytes
    // 0 and 64.
    assert!(std::mem::align_of::<Entry<C>>() >= 8);
    assert!(crate::hit_memo::SECOND_PREFETCH == 64 && 56 + HIT_BYTES <= 128);
};

/// A raw pointer to an [`Entry`]; ownership follows spec.md#A-H (module docs).
pub(crate) struct EntryPtr<R: Registrar>(NonNull<Entry<R>>);

impl<R: Registrar> Clone for EntryPtr<R> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<R: Registrar> Copy for EntryPtr<R> {}

// SAFETY: an entry is shared between the index (under the lock) and lease
// holders. Its mutable parts are atomics; `R::Handle: Send + Sync`; it is
// freed exactly once, by the owner the state word designates.
unsafe impl<R: Registrar> Send for EntryPtr<R> {}
// SAFETY: as for `Send` above.
unsafe impl<R: Registrar> Sync for EntryPtr<R> {}

// Every reference to an entry is made through `EntryPtr` (here), by one of
// three accessors whose lifetime carries the reason the entry is alive (as
// crossbeam ties "alive while guarded" to `Shared<'g, T>`), and by one for the
// hit memo (`answered` lives beside the state it borrows, in `generation.rs`,
// and `leased` beside the lease, in `lease.rs`: this file is below both):
// - [`indexed`]: an index slot, borrowed from the state behind the cache lock
//   (A1–A11, A-D, the notes and evictions, flush): an entry leaves the index
//   only under the lock exclusive, and is freed only after it left;
// - [`leased`]: a lease (R1, LN1, LN3, which reach entries without the lock):
//   nobody frees an entry with leases (A-H); forgotten generations are never
//   freed;
// - [`answered`] (unsafe): the hit memo's answer (A1), borrowed from the
//   state behind the lock like `indexed`; the memo's version rule is what
//   makes it findable;
// - [`EntryPtr::get`] (unsafe) for the two raw lane pointers: a pin (LN4) and
//   a memo revoked under the lock exclusive (LN5), and for A0's entry once
//   its compare-exchange took a lease;
// - [`peek`] (unsafe): A0's look at an entry it holds no lease on, which
//   reads only its state word and, volatile, its key.

/// The entry of an index slot, alive while the slot is borrowed: the borrow
/// comes from the index, which the cache lock guards.
#[inline]
pub(super) fn indexed<R: Registrar>(slot: &Slot<EntryPtr<R>>) -> &Entry<R> {
    // SAFETY: an `EntryPtr` is made only by A9 (`EntryPtr::new`) and by the
    // lanes from a live entry; a slot holds one while the entry is findable,
    // and the entry is freed only after its slot has left the index under
    // the lock exclusive (A-H), which the borrow of the slot excludes (or,
    // for a slot just taken out, before the handoff of `retire`).
    unsafe { slot.value.0.as_ref() }
}

/// The entry an eviction-order candidate was pushed for, if it is still in
/// the index: its state word (read under the lock exclusive) says findable
/// with the candidate's incarnation, and its id is the candidate's. Alive
/// while `index` is borrowed, as [`indexed`]'s entry: it is in the index,
/// which only a holder of the lock exclusive changes. Costs the entry's
/// word and id instead of a descent of the index (the note's walk).
///
/// # Safety
/// The caller holds the lock exclusive, `index` is its index, and `p` was
/// an entry of this generation's pool (its memory stays allocated until the
/// pool drops, [`super::entry_pool`], and its state word is only ever an
/// `EntryState`).
#[inline(always)]
pub(super) unsafe fn candidate<R: Registrar>(
    _index: &crate::index::IntervalIndex<EntryPtr<R>>,
    p: *const Entry<R>,
    incarnation: u64,
    id: u64,
) -> Option<&Entry<R>> {
    // SAFETY: the contract: an allocated entry whose state word is always
    // a valid atomic.
    let word = unsafe { (*p).state.seen() };
    if !EntryState::findable_incarnation(word, incarnation) {
        return None;
    }
    // SAFETY: findable under the lock exclusive: in the index, so alive for
    // as long as the index is borrowed (an entry leaves it only under the
    // lock exclusive, through `&mut` of the index); its fields are its own.
    let e = unsafe { &*p };
    // The incarnation wraps (mod 2^21); the id never repeats.
    (e.view_id == id).then_some(e)
}

impl<R: Registrar> Entry<R> {
    /// The registration a lease hands out (spec.md#S1.3).
    #[inline(always)]
    pub(crate) fn view(&self) -> RegView {
        RegView { id: self.view_id, addr: self.view_addr, len: self.view_len, access: self.view_access }
    }

    /// Whether a request is exactly this entry's key (span and access),
    /// for pages of `page_size` bytes: the view's byte range is the key's
    /// pages times the page size (A4's plan). A request's first page times
    /// the page size is at most its address, so it does not overflow; its
    /// length in bytes may (a range ending at 2⁶⁴), and then it matches no
    /// entry, whose length fits.
    #[inline(always)]
    pub(super) fn has_key(&self, span: PageSpan, access: Access, page_size: u64) -> bool {
        self.view_addr == span.first.wrapping_mul(page_size)
            && span.count().checked_mul(page_size) == Some(self.view_len)
            && self.view_access == access
    }
}

/// A0's first look at an entry the hit memo named, before any lease keeps
/// it alive: its state word ([`EntryState::seen`]), and whether the key
/// read after it is the request's. The answer is only a filter: the
/// memory may be reused meanwhile (then the key read is of another entry,
/// or torn, and the compare-exchange from the returned word fails), and
/// A0 checks the key again under its lease ([`Entry::has_key`]).
///
/// The key is read with volatile loads, as a seqlock reads its data
/// (crossbeam's `AtomicCell` does the same): the pool may write it
/// concurrently, and the value is never trusted before the compare-exchange
/// proves it was the incarnation's.
///
/// # Safety
/// `p` names an entry of a pool that is still alive (its memory stays
/// allocated until the pool drops: [`super::entry_pool`]), and its state
/// word is only ever an `EntryState` (the pool never overwrites it).
#[inline(always)]
pub(super) unsafe fn peek<R: Registrar>(p: *const Entry<R>, span: PageSpan, access: Access, page_size: u64) -> Option<u64> {
    // SAFETY: the contract: an allocated entry whose state word is always
    // a valid atomic.
    let seen = unsafe { (*p).state.seen() };
    if !EntryState::leasable(seen) {
        return None;
    }
    // SAFETY: inside an allocated entry (the contract); every bit pattern
    // is a valid `u64` and a valid `Access` (a `u8`); a racing write only
    // makes the filter answer wrongly, which the lease's check catches.
    let (addr, len, acc) = unsafe {
        (
            std::ptr::read_volatile(std::ptr::addr_of!((*p).view_addr)),
            std::ptr::read_volatile(std::ptr::addr_of!((*p).view_len)),
            std::ptr::read_volatile(std::ptr::addr_of!((*p).view_access)),
        )
    };
    let key = addr == span.first.wrapping_mul(page_size) && span.count().checked_mul(page_size) == Some(len) && acc == access;
    key.then_some(seen)
}

impl<R: Registrar> EntryPtr<R> {
    /// A9: the pointer to a new entry in its generation's pool
    /// ([`super::entry_pool`]), given back by the owner of its
    /// deregistration (A-H).
    pub(super) fn new(entry: NonNull<Entry<R>>) -> Self {
        EntryPtr(entry)
    }

    /// Moves the handle out, with the entry's bytes, for its deregistration.
    ///
    /// # Safety
    /// The caller owns the entry's deregistration (A-H) and gives its memory
    /// back right after: nobody reads the entry again.
    pub(super) unsafe fn take_handle(self) -> (ManuallyDrop<R::Handle>, u64) {
        let p = self.0.as_ptr();
        // SAFETY: alive and ours (the contract); the handle is read once.
        unsafe { (std::ptr::read(&(*p).handle), (*p).view_len) }
    }

    /// The entry's memory, for the pool.
    pub(super) fn non_null(self) -> NonNull<Entry<R>> {
        self.0
    }

    /// The pointer a lane slot's `ptr` or `pin` holds.
    ///
    /// # Safety
    /// `p` must come from [`Self::as_ptr`].
    #[inline]
    pub(super) unsafe fn from_raw(p: *mut Entry<R>) -> Self {
        // SAFETY: from `as_ptr` of a `NonNull`.
        EntryPtr(unsafe { NonNull::new_unchecked(p) })
    }

    /// The pointer as the hit memo stores it.
    #[inline(always)]
    pub(super) fn memo_bits(self) -> u64 {
        self.0.as_ptr() as usize as u64
    }

    /// The pointer the hit memo gave back.
    ///
    /// # Safety
    /// `bits` must come from [`Self::memo_bits`].
    #[inline(always)]
    pub(super) unsafe fn from_memo_bits(bits: u64) -> Self {
        // SAFETY: from `memo_bits` of a `NonNull`.
        EntryPtr(unsafe { NonNull::new_unchecked(bits as usize as *mut Entry<R>) })
    }

    #[inline]
    pub(super) fn as_ptr(self) -> *mut Entry<R> {
        self.0.as_ptr()
    }

    /// # Safety
    /// The entry must be alive for `'a`: pinned by the caller (LN4), or
    /// findable with the lock held exclusive (LN5); or as `leased` and
    /// `answered` (comment above) say.
    #[inline]
    pub(super) unsafe fn get<'a>(self) -> &'a Entry<R> {
        // SAFETY: per the contract above.
        unsafe { self.0.as_ref() }
    }
}
