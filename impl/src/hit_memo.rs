//! The hit memo: a direct-mapped table of A1's answers, in front of the
//! index (spec.md#A1's "look up a covering findable entry").
//!
//! A1 asks the index for the canonical covering entry of a request
//! `(first page, end page, access)`. With 10⁴–10⁵ scattered entries that
//! descent waits on one cache miss per tree level. The memo remembers, per
//! request, the answer the index gave, so a repeated request costs one
//! hashed slot: one or two cache lines.
//!
//! # Invariants
//! - **An answer is valid for one version of the index.** The index's
//!   [`answers_version`](crate::index::IntervalIndex::answers_version) moves
//!   whenever a *positive* answer may change: on every removal, on
//!   `take_all`, and on an insert whose id is not above every id inserted
//!   before (only a lower id can become a new canonical answer; a new
//!   highest id cannot displace an older covering entry). A slot answers
//!   only when its tag is the current version's, so nothing written under
//!   an older version is ever used. Misses are never memoized.
//! - **A slot is one word: a 16-bit tag above a 48-bit pointer.** Tags
//!   name versions within an *epoch* of [`TAGS`] versions; the memo serves
//!   only the epoch it last followed ([`HitMemo::follow`], called as every
//!   exclusive section ends), and following a new epoch empties the table,
//!   so a tag never names two versions.
//! - **A slot holds an entry, and answers only the entry's own key.** The
//!   caller memoizes an answer only for the request that *is* the entry's
//!   key (its page span and access) and takes a memoized entry only for a
//!   request equal to its key, checked on the entry itself (whose line the
//!   hit reads anyway). That is sound because the answer stays canonical
//!   for that key while the version holds. The table is thus 8 bytes a
//!   slot, and at 10⁴ entries it fits beside them in a core's L2 cache.
//! - **Written at most once per version, read with one load.** Writers (A1,
//!   under the lock *shared*) CAS a slot from an older word to their own;
//!   a slot already tagged for the version is left alone. The version
//!   changes only under the lock *exclusive*, which waits for every reader
//!   and writer of the old one.
//! - **It only ever answers what the index would.** Debug builds check every
//!   memo answer against the index (`covering_answer` in the acquire step).
//! - **Memory is freed without the lock.** Growth (A9, under the lock
//!   exclusive) starts an empty table of 2–4 slots per entry and hands the
//!   old one back; its pages are given back after unlocking, like a
//!   deregistration (A11), but it stays mapped for [`MemoHint`]. Tables of
//!   [`MAP_BYTES`] or more are their own anonymous mapping: the kernel's
//!   zero pages make them empty without a memset, which a heap table's
//!   growth would pay on the miss that triggers it.
//!
//! The hash of a first page adds its higher bit groups to its lower ones
//! (`f + f >> b + f >> 2b` over `b` index bits): entries a stride apart
//! fill consecutive slots, so an in-order walk reads the table in order.
//! (An xor fold made that walk's cost depend on where ASLR put the
//! buffers.)

use crate::sync::{plain, AtomicU64, Ordering};
use std::ptr::NonNull;
use std::sync::Arc;

/// The tag sits above the pointer (user-space pointers stay below 2⁴⁸).
const TAG_SHIFT: u32 = 48;
const POINTER_MASK: u64 = (1 << TAG_SHIFT) - 1;
/// Versions per epoch: tags `1..=TAGS`, 0 marks an empty slot.
pub const TAGS: u64 = (1 << (64 - TAG_SHIFT)) - 1;

/// Slots of a new table (the smallest size).
#[cfg(not(loom))]
pub const MIN_SLOTS: usize = 256;
#[cfg(loom)]
pub const MIN_SLOTS: usize = 2;
/// Slots of the largest table (8 MiB): past 2¹⁹ entries the memo stops
/// growing and answers what fits.
pub const MAX_SLOTS: usize = 1 << 20;
/// Tables this large (or larger) are their own mapping (see module docs).
pub const MAP_BYTES: usize = 64 << 10;

/// One memoized answer: a tag and an entry pointer in one word (0: empty).
/// The word is what loom explores: it carries the protocol.
#[repr(transparent)]
struct MemoSlot {
    word: AtomicU64,
}

impl MemoSlot {
    fn empty() -> Self {
        MemoSlot { word: AtomicU64::new(0) }
    }
}

/// A version's epoch and its tag in that epoch (never 0).
#[inline(always)]
fn epoch_and_tag(version: u64) -> (u64, u64) {
    (version / TAGS, version % TAGS + 1)
}

/// An anonymous mapping holding a table (large tables, never under loom).
/// Shared by the memo (current or retired, see [`HitMemo`]'s `retired`) and
/// a [`RetiredMemo`] waiting to give its pages back; unmapped by the last.
struct Mapping {
    ptr: NonNull<MemoSlot>,
    len: usize,
}

// SAFETY: owned memory holding atomics only, like a `Box<[MemoSlot]>`.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`: shared access goes through atomics only.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<MemoSlot>()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping of `bytes()` bytes; no reference into it
        // outlives the last `Arc` (every slice borrows one).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.bytes()) };
    }
}

/// A table's slots: on the heap, or an anonymous mapping.
enum Slots {
    Heap(Box<[MemoSlot]>),
    #[cfg_attr(loom, allow(dead_code))]
    Mapped(Arc<Mapping>),
}

impl Slots {
    fn new(len: usize) -> Self {
        debug_assert!(len.is_power_of_two());
        let bytes = len * std::mem::size_of::<MemoSlot>();
        #[cfg(not(loom))]
        if bytes >= MAP_BYTES {
            if let Ok(addr) = crate::mem::map_anon(bytes as u64, libc::MAP_NORESERVE) {
                // A failed mapping falls back to the heap below.
                if let Some(ptr) = NonNull::new(addr as *mut MemoSlot) {
                    return Slots::Mapped(Arc::new(Mapping { ptr, len }));
                }
            }
        }
        let _ = bytes;
        Slots::Heap((0..len).map(|_| MemoSlot::empty()).collect())
    }

    #[inline(always)]
    fn as_slice(&self) -> &[MemoSlot] {
        match self {
            Slots::Heap(b) => b,
            // SAFETY: a live private mapping of `len` slots, alive while the
            // `Arc` is borrowed; the kernel zero-fills it, and all zeroes is
            // an empty slot (an atomic holding 0); it is page-aligned, so
            // aligned for `MemoSlot`.
            Slots::Mapped(m) => unsafe { std::slice::from_raw_parts(m.ptr.as_ptr(), m.len) },
        }
    }
}

/// The slot of `first` in a table of `2^bits` slots (module docs: the hash).
#[inline(always)]
fn slot_index(first: u64, bits: u32) -> usize {
    let h = first.wrapping_add(first >> bits).wrapping_add(first >> (2 * bits));
    (h & ((1u64 << bits) - 1)) as usize
}

/// The offset of the second prefetch into the entry a memo slot names: an
/// 8-byte aligned entry's first 72 bytes (what a hit reads) lie on the
/// lines of its bytes 0 and 64 (start offsets in a line are 0, 8, ..., 56,
/// and 56 + 72 <= 128).
pub(crate) const SECOND_PREFETCH: usize = 64;

/// Where the current table is, readable without the lock, for a prefetch
/// *before* A1 takes the lock: it reads the request's slot and prefetches
/// the entry it names, so both cache misses overlap the lock's atomics
/// instead of following them. Only a hint: the slot is read racily (a stale
/// table, a slot being written, another request's answer) and its value is
/// never dereferenced, only prefetched, and a prefetch never faults. What
/// makes the racy read itself safe is that every table a hint ever named
/// stays mapped while the memo lives ([`HitMemo`]'s `retired`).
pub struct MemoHint(plain::AtomicU64);

impl MemoHint {
    /// Bits of the slot count's log, above the table's address (user
    /// addresses stay below 2⁵⁸).
    const BITS_SHIFT: u32 = 58;

    fn encode(memo: &HitMemo) -> u64 {
        let addr = memo.slots.as_slice().as_ptr() as usize as u64;
        debug_assert!(addr >> Self::BITS_SHIFT == 0);
        addr | (memo.bits as u64) << Self::BITS_SHIFT
    }

    /// # Safety
    /// `memo` must outlive the hint, and be the only memo it is ever set from.
    pub unsafe fn new(memo: &HitMemo) -> Self {
        MemoHint(plain::AtomicU64::new(Self::encode(memo)))
    }

    /// After the table changed (under the lock exclusive).
    ///
    /// # Safety
    /// As for [`Self::new`]: the memo the hint was made from.
    pub unsafe fn set(&self, memo: &HitMemo) {
        // Release: publishes the new table's initialisation (a heap table's
        // plain writes) to `prefetch`'s acquire. Readers may still see the
        // old table (type docs).
        self.0.store(Self::encode(memo), Ordering::Release);
    }

    /// The entry pointer in the slot `first` would use, read without the
    /// lock (0: none): some entry the memo named for some version, or for
    /// another request in the slot, or a table's stale word (type docs).
    /// Never trusted: A0 (spec.md#A0) and the prefetch below judge it on
    /// the entry's own state word and key.
    #[inline(always)]
    pub fn racy_answer(&self, first: u64) -> u64 {
        // Acquire: pairs with `set`'s release, so a new table's
        // initialisation happens before this thread reads it.
        let h = self.0.load(Ordering::Acquire);
        let bits = (h >> Self::BITS_SHIFT) as u32;
        let base = (h & ((1 << Self::BITS_SHIFT) - 1)) as usize as *const MemoSlot;
        // SAFETY: `base` is a table of `2^bits` slots of the memo this
        // hint was made from (the contract of `new` / `set`), the
        // current one or a retired one, and every such table stays
        // mapped while the memo lives (`HitMemo::retired`); the index is
        // masked to the table. Only atomics are read.
        // Acquire: pairs with `put`'s Release, so the entry a slot names (its
        // memory's first initialisation included) happens before A0 reads it.
        (unsafe { (*base.add(slot_index(first, bits))).word.load(Ordering::Acquire) }) & POINTER_MASK
    }

    /// Prefetches the slot `first` would use, and the entry it names.
    #[inline(always)]
    pub fn prefetch(&self, first: u64) {
        #[cfg(all(target_arch = "x86_64", not(loom)))]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let value = self.racy_answer(first);
            // PREFETCHW (a prefetch for writing): A1 increments the entry's
            // state word at once, and a line fetched for reading would need
            // a second transaction to be written. Where the CPU lacks it,
            // the encoding (0F 0D /1) is a NOP.
            // SAFETY: a prefetch is a hint that never faults, whatever the
            // address (a live entry, a freed one, or garbage); it reads and
            // writes no register or flag.
            unsafe { std::arch::asm!("prefetchw [{0}]", in(reg) value, options(nostack, preserves_flags, readonly)) };
            // A hit's fields (the key, the stamp, the keys and view a lease
            // hands out) may end on the next line (`Entry`'s docs).
            // SAFETY: as above.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(value.wrapping_add(SECOND_PREFETCH as u64) as usize as *const i8) };
        }
        #[cfg(not(all(target_arch = "x86_64", not(loom))))]
        let _ = first;
    }
}

/// A mapped table the memo replaced: dropped after unlocking (A11), it
/// gives the table's pages back (`MADV_DONTNEED`: the memory reads as zeroes,
/// empty slots, from then on) but leaves it mapped, since a [`MemoHint`] may
/// still read it without the lock. The mapping goes with the memo.
pub struct RetiredMemo(Option<Arc<Mapping>>);

impl Drop for RetiredMemo {
    fn drop(&mut self) {
        if let Some(m) = self.0.take() {
            // SAFETY: our own mapping, alive while `m` is held; what it
            // holds after this call (zeroes) is a valid table of empty slots,
            // and only atomics ever read it.
            unsafe { libc::madvise(m.ptr.as_ptr().cast(), m.bytes(), libc::MADV_DONTNEED) };
        }
    }
}

/// The hit memo (module docs).
pub struct HitMemo {
    slots: Slots,
    /// `log2` of the slot count.
    bits: u32,
    /// The tables growth replaced, kept until the memo goes: a
    /// [`MemoHint`] reads them without the lock. Bounded: heap tables are
    /// below [`MAP_BYTES`] in all (unless a mapping failed and a larger
    /// table fell back to the heap: then at most the current table's size
    /// again), and mapped ones hold no pages once their [`RetiredMemo`]
    /// dropped.
    retired: Vec<Slots>,
    /// The epoch of versions the table's tags belong to (module docs).
    epoch: u64,
}

impl Default for HitMemo {
    fn default() -> Self {
        Self::new()
    }
}

impl HitMemo {
    pub fn new() -> Self {
        Self::with_slots(MIN_SLOTS)
    }

    fn with_slots(len: usize) -> Self {
        HitMemo { slots: Slots::new(len), bits: len.trailing_zeros(), retired: Vec::new(), epoch: 0 }
    }

    pub fn slots(&self) -> usize {
        1 << self.bits
    }

    /// Whether the table is its own mapping (tests).
    pub fn is_mapped(&self) -> bool {
        matches!(self.slots, Slots::Mapped(_))
    }

    #[inline(always)]
    fn slot(&self, first: u64) -> &MemoSlot {
        // In bounds: masked to the slot count.
        &self.slots.as_slice()[slot_index(first, self.bits)]
    }

    /// The entry pointer memoized for requests starting at page `first`
    /// at `version`, if any. The caller takes it only if the request is the
    /// entry's key (module docs).
    #[inline(always)]
    pub fn get(&self, version: u64, first: u64) -> Option<u64> {
        let (epoch, tag) = epoch_and_tag(version);
        // Relaxed: the word is the whole datum. The entry it names was
        // published by the lock exclusive that inserted it, and readers and
        // writers of one version all hold the lock shared.
        let word = self.slot(first).word.load(Ordering::Relaxed);
        (epoch == self.epoch && word >> TAG_SHIFT == tag).then_some(word & POINTER_MASK)
    }

    /// Memoizes `pointer` (an entry whose key starts at page `first`, the
    /// index's answer for that key under the caller's hold of the lock) at
    /// `version`, unless the slot already answers for this version.
    #[inline]
    pub fn put(&self, version: u64, first: u64, pointer: u64) {
        let (epoch, tag) = epoch_and_tag(version);
        if epoch != self.epoch || pointer == 0 || pointer & !POINTER_MASK != 0 {
            return;
        }
        let slot = self.slot(first);
        // The CAS only keeps two writers of one version from both writing;
        // Release for A0, which reads the slot without the lock
        // (`MemoHint::racy_answer`'s Acquire; free on x86).
        let old = slot.word.load(Ordering::Relaxed);
        if old >> TAG_SHIFT != tag {
            let _ = slot.word.compare_exchange(old, tag << TAG_SHIFT | pointer, Ordering::Release, Ordering::Relaxed);
        }
    }

    /// As an exclusive section ends: if `version` starts a new epoch, empties
    /// the table (its tags would name versions of the new one) and serves
    /// that epoch from then on. `O(1)`, except once per [`TAGS`] versions:
    /// `O(slots)` then (stores, not `madvise`: nothing is given back under
    /// the lock, spec.md#A11).
    #[inline]
    pub fn follow(&mut self, version: u64) {
        let (epoch, _) = epoch_and_tag(version);
        if epoch != self.epoch {
            // Only words that hold something: a mapped table's pages never
            // written (or given back) then stay unallocated.
            for slot in self.slots.as_slice() {
                if slot.word.load(Ordering::Relaxed) != 0 {
                    slot.word.store(0, Ordering::Relaxed);
                }
            }
            self.epoch = epoch;
        }
    }

    /// Under the lock exclusive, with `entries` findable: if they exceed
    /// half the slots, starts an empty table of 2–4 slots per entry and
    /// returns the old one's [`RetiredMemo`], to be dropped after unlocking
    /// (A11). Then call [`MemoHint::set`].
    ///
    /// Inlined up to its usual answer (no growth): every insert asks, and
    /// the call cost more than the answer.
    #[inline(always)]
    pub fn grow_for(&mut self, entries: usize) -> Option<RetiredMemo> {
        let len = self.slots();
        if entries <= len / 2 || len >= MAX_SLOTS {
            return None;
        }
        self.grow(entries)
    }

    /// [`Self::grow_for`] when the table grows.
    #[inline(never)]
    fn grow(&mut self, entries: usize) -> Option<RetiredMemo> {
        let want = entries.saturating_mul(2).checked_next_power_of_two().unwrap_or(MAX_SLOTS).min(MAX_SLOTS);
        let old = std::mem::replace(&mut self.slots, Slots::new(want));
        self.bits = want.trailing_zeros();
        let pages = match &old {
            Slots::Heap(_) => None,
            Slots::Mapped(m) => Some(Arc::clone(m)),
        };
        self.retired.push(old);
        Some(RetiredMemo(pages))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn answers_only_its_version() {
        let m = HitMemo::new();
        assert_eq!(m.get(0, 10), None);
        m.put(0, 10, 0x1000);
        assert_eq!(m.get(0, 10), Some(0x1000));
        assert_eq!(m.get(1, 10), None, "another version");
        // Written once per version: a second answer in the same version
        // (same slot) is not taken.
        m.put(0, 10, 0x2000);
        assert_eq!(m.get(0, 10), Some(0x1000));
        // A later version rewrites it.
        m.put(1, 10, 0x3000);
        assert_eq!(m.get(1, 10), Some(0x3000));
        assert_eq!(m.get(0, 10), None);
    }

    #[test]
    fn a_new_epoch_empties_the_table() {
        let mut m = HitMemo::new();
        m.put(5, 10, 0x1000);
        let later = 5 + TAGS;
        assert_eq!(epoch_and_tag(later).1, epoch_and_tag(5).1, "the same tag, one epoch on");
        assert_eq!(m.get(later, 10), None, "an epoch not followed yet is not served");
        m.put(later, 10, 0x2000);
        assert_eq!(m.get(later, 10), None, "nor written");
        m.follow(later);
        assert_eq!(m.get(later, 10), None, "followed: the old epoch's word is gone");
        m.put(later, 10, 0x2000);
        assert_eq!(m.get(later, 10), Some(0x2000));
        m.follow(later + 1);
        assert_eq!(m.get(later + 1, 10), None);
    }

    #[test]
    fn pointers_beyond_48_bits_are_not_memoized() {
        let m = HitMemo::new();
        m.put(0, 1, 1 << TAG_SHIFT);
        assert_eq!(m.get(0, 1), None);
        m.put(0, 1, 0);
        assert_eq!(m.get(0, 1), None, "0 is the empty word");
    }

    #[test]
    fn grows_empty_into_a_mapping_and_stops_at_the_cap() {
        let mut m = HitMemo::new();
        m.put(0, 3, 9);
        assert!(m.grow_for(MIN_SLOTS / 2).is_none(), "at half: no growth");
        let old = m.grow_for(MIN_SLOTS / 2 + 1).expect("grows past half");
        drop(old);
        assert_eq!(m.slots(), MIN_SLOTS * 2);
        assert_eq!(m.get(0, 3), None, "a new table is empty");
        m.grow_for(100_000).expect("grows");
        assert_eq!(m.slots(), 1 << 18);
        assert!(m.is_mapped(), "{} slots is a mapping", m.slots());
        assert!(m.retired.len() == 2);
        for f in 1..=10_000u64 {
            m.put(5, f * 2, f);
        }
        let hits = (1..=10_000u64).filter(|&f| m.get(5, f * 2) == Some(f)).count();
        // Stride-2 firsts under the additive hash fill distinct slots.
        assert_eq!(hits, 10_000);
        m.grow_for(usize::MAX).expect("grows to the cap");
        assert_eq!(m.slots(), MAX_SLOTS);
        assert!(m.grow_for(usize::MAX).is_none());
    }

    use crate::index::IntervalIndex;
    use mrcache_types::{Access, PageSpan};

    /// How the memo is consulted in [`memo_against_index`]: as A1 does, or
    /// as a mutant that forgets the version (every answer kept forever).
    #[derive(Clone, Copy, PartialEq)]
    enum Keying {
        ByVersion,
        IgnoringVersion,
    }

    /// One run of random inserts (ids in random order, so lower-id inserts
    /// are common), removals, flushes and lookups on an index with the memo
    /// in front, from `seed`; every lookup's memo answer must be the
    /// index's. `Err` names the seed and step of the first disagreement.
    fn memo_against_index(seed: u64, keying: Keying) -> Result<(), String> {
        let mut x = seed | 1;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut idx: IntervalIndex<u64> = IntervalIndex::new();
        let memo = HitMemo::new();
        let mut live: Vec<(u64, u64)> = Vec::new();
        let mut used = std::collections::HashSet::new();
        // Ids ever inserted, with their keys (ids are never reused).
        let mut keys = std::collections::HashMap::new();
        let accesses = [Access::LOCAL_READ, Access::LOCAL_WRITE, Access::LOCAL_WRITE | Access::REMOTE_WRITE];
        for step in 0..400 {
            let version = match keying {
                Keying::ByVersion => idx.answers_version(),
                Keying::IgnoringVersion => 0,
            };
            match next(10) {
                0..=2 => {
                    let first = next(12);
                    let span = PageSpan { first, end: first + 1 + next(4) };
                    let id = 1 + next(1000);
                    if used.insert(id) {
                        let access = accesses[next(3) as usize];
                        idx.insert(span, id, access, id);
                        keys.insert(id, (span, access));
                        live.push((first, id));
                    }
                }
                3 if !live.is_empty() => {
                    let (first, id) = live.swap_remove(next(live.len() as u64) as usize);
                    idx.remove(first, id).expect("live entry");
                }
                4 if next(20) == 0 => {
                    idx.take_all();
                    live.clear();
                }
                _ => {
                    // Mostly entries' own keys (what the memo serves), and
                    // other requests that must leave it alone.
                    let (span, access) = match keys.get(&(1 + next(1000))) {
                        Some(&k) if next(2) == 0 => k,
                        _ => {
                            let first = next(14);
                            (PageSpan { first, end: first + 1 + next(3) }, accesses[next(3) as usize])
                        }
                    };
                    let truth = idx.covering(span, access).map(|s| s.value);
                    // As `covering_answer` does: a memoized entry only for
                    // its own key, and only an entry's own key memoized.
                    let is_key = |id: u64| keys.get(&id) == Some(&(span, access));
                    let got = match memo.get(version, span.first).filter(|&id| is_key(id)) {
                        Some(id) => Some(id),
                        None => {
                            if let Some(id) = truth.filter(|&id| is_key(id)) {
                                memo.put(version, span.first, id);
                            }
                            truth
                        }
                    };
                    if got != truth {
                        return Err(format!("seed {seed} step {step}: memo {got:?}, index {truth:?} for {span:?}"));
                    }
                }
            }
        }
        Ok(())
    }

    #[test]
    fn memo_and_index_agree() {
        for seed in 1..=300 {
            memo_against_index(seed, Keying::ByVersion).unwrap();
        }
    }

    /// The mutant the version exists against: a memo that keeps answers
    /// across removals and lower-id inserts. The same runs must catch it.
    #[test]
    fn a_memo_that_ignores_the_version_is_caught() {
        let caught = (1..=300).filter(|&seed| memo_against_index(seed, Keying::IgnoringVersion).is_err()).count();
        assert!(caught > 0, "no run caught the versionless memo");
    }

    #[test]
    fn a_lower_id_insert_moves_the_version_and_a_higher_one_does_not() {
        let mut idx: IntervalIndex<u64> = IntervalIndex::new();
        let span = PageSpan { first: 4, end: 6 };
        idx.insert(PageSpan { first: 0, end: 10 }, 5, Access::LOCAL_WRITE, 5);
        let v = idx.answers_version();
        idx.insert(PageSpan { first: 2, end: 8 }, 9, Access::LOCAL_WRITE, 9);
        assert_eq!(idx.answers_version(), v, "a new highest id changes no positive answer");
        assert_eq!(idx.covering(span, Access::LOCAL_READ).map(|s| s.value), Some(5));
        idx.insert(PageSpan { first: 3, end: 7 }, 2, Access::LOCAL_WRITE, 2);
        assert_ne!(idx.answers_version(), v, "a lower id may be the new canonical answer");
        assert_eq!(idx.covering(span, Access::LOCAL_READ).map(|s| s.value), Some(2));
        let v = idx.answers_version();
        idx.remove(0, 5);
        assert_ne!(idx.answers_version(), v, "every removal moves it");
    }
}
