//! Entry memory, recycled per generation, instead of a `malloc` and a
//! `free` per registration.
//!
//! A9 takes memory for a new entry under the lock exclusive
//! ([`EntryPool::alloc`]). The owner of a deregistration (A-H) gives it
//! back: under the lock, straight to the allocator's free list
//! ([`EntryPool::put_back`]: an eviction, an invalidation, a flush); without
//! it (the last release of an invalidated entry, R1), to a list any thread
//! can push to ([`Returned::give_back`]).
//!
//! - Blocks of entries are carved in order and never moved or freed before
//!   the generation drops: an entry's address is stable, as a `Box`'s was.
//! - Memory given back without the lock goes on a push-only list
//!   ([`Returned`]): one compare-exchange per entry, from any thread. The
//!   allocator takes the whole list with one swap, under the lock, into its
//!   own free list (plain, the lock's). A list only pushed to and emptied
//!   whole has no ABA problem: no pop ever reads a node another thread may
//!   take.
//! - Memory is recycled only once its entry is freed, which A-H makes happen
//!   exactly once, after the entry left the index and every lease and pin
//!   on it went (as before, with `free`): the stale raw pointers the lanes
//!   may hold are never read after that (LN5).
//! - **The state word outlives the entry.** A0 (spec.md#A0) reads and
//!   compare-exchanges the state word of an entry the hit memo named, with
//!   no lock, so that word may belong to memory freed or reused meanwhile.
//!   Freeing leaves it as the last owner left it (INVALID set: A-H), the
//!   free list's link and the debug poison go after it, and reuse writes
//!   it last, with one atomic store of a new *incarnation*
//!   ([`EntryState::PENDING`], published by A9 once the entry is findable).
//!   So every value the word ever holds is one A0 can judge: a compare-
//!   exchange expecting a findable incarnation fails on any other.
//!
//! The fill (cold misses) carved a fresh `malloc` chunk per entry (about
//! 190 instructions); here it is a pointer bump. An evicting miss reuses
//! its last victim's memory, as `malloc`'s thread cache did, with no
//! atomic instruction.

use super::entry::Entry;
use super::entry_state::EntryState;
use crate::registrar::Registrar;
use crate::sync::{AtomicPtr, Ordering};
use std::mem::MaybeUninit;
use std::ptr::NonNull;

/// Entries per block. A block of C API entries (88 bytes) is about 22 KiB.
#[cfg(not(loom))]
const BLOCK: usize = 256;
/// Under loom, blocks of two, so the cache's loom tests (a handful of
/// entries) reach the take of the given-back list and the reuse.
#[cfg(loom)]
const BLOCK: usize = 2;

/// A free entry's memory: the link of the free lists, in its first bytes.
struct Free {
    next: *mut Free,
}

/// Debug builds fill a freed entry's bytes after the link with this, and
/// check them when the memory is handed out again: a write through a stale
/// pointer after the free is caught there, and a read sees an impossible
/// state word (the pool hides such errors from valgrind, which saw each
/// entry's `free`).
#[cfg(debug_assertions)]
const POISON: u8 = 0xA5;

/// Where the bytes after an entry's state word start: freeing poisons them
/// (but the link) and reuse writes them; the state word itself is never
/// overwritten (module docs).
#[inline(always)]
fn after_state<R: Registrar>() -> usize {
    std::mem::offset_of!(Entry<R>, last_use)
}

/// Where a free entry's link lives: over its id, which nothing writes after
/// A9 and A0 does not read (a stale write of the LRU stamp or of a note
/// number then hits the poison, not the free list).
#[inline(always)]
fn link_offset<R: Registrar>() -> usize {
    std::mem::offset_of!(Entry<R>, view_id)
}

/// The memory of a freed entry as a free-list node (its link, over the
/// entry's id), its other bytes after the state word poisoned (debug
/// builds); the caller writes the link.
///
/// # Safety
/// `e` came from an [`EntryPool`] and nobody reads the entry again (A-H)
/// but A0, which reads only its state word and (volatile) its key.
#[inline]
unsafe fn as_free<R: Registrar>(e: NonNull<Entry<R>>) -> *mut Free {
    // SAFETY: the entry's memory is the caller's (the contract).
    unsafe { poison::<R>(e.as_ptr().cast()) };
    // SAFETY: inside the entry's memory (`LAYOUT_OK`).
    unsafe { e.as_ptr().cast::<u8>().add(link_offset::<R>()) }.cast::<Free>()
}

/// The entry whose memory `node` is (the inverse of [`as_free`]).
#[inline]
fn entry_of<R: Registrar>(node: *mut Free) -> *mut Entry<R> {
    node.cast::<u8>().wrapping_sub(link_offset::<R>()).cast()
}

/// The poisoned byte ranges of a free entry: after the state word, but the
/// link.
#[cfg(debug_assertions)]
fn poisoned<R: Registrar>() -> [std::ops::Range<usize>; 2] {
    let link = link_offset::<R>();
    [after_state::<R>()..link, link + std::mem::size_of::<Free>()..std::mem::size_of::<Entry<R>>()]
}

/// Poisons a freed entry's bytes after its state word, but the link (debug
/// builds).
///
/// # Safety
/// `e` is the memory of a freed entry, owned by the caller.
#[inline]
// Release builds do not poison, so `R` (the entry layout) goes unused there.
#[cfg_attr(not(debug_assertions), allow(clippy::extra_unused_type_parameters))]
unsafe fn poison<R: Registrar>(e: *mut u8) {
    #[cfg(debug_assertions)]
    for r in poisoned::<R>() {
        // SAFETY: inside the entry's memory (the contract).
        unsafe { std::ptr::write_bytes(e.add(r.start), POISON, r.len()) };
    }
    #[cfg(not(debug_assertions))]
    let _ = e;
}

/// Checks the poison of free memory about to be handed out (debug builds).
///
/// # Safety
/// As for [`poison`], and `e` was poisoned when it was freed.
#[inline]
// Release builds do not poison, so `R` (the entry layout) goes unused there.
#[cfg_attr(not(debug_assertions), allow(clippy::extra_unused_type_parameters))]
unsafe fn check_poison<R: Registrar>(e: *const u8) {
    #[cfg(debug_assertions)]
    for r in poisoned::<R>() {
        // SAFETY: inside the entry's memory (the contract).
        let bytes = unsafe { std::slice::from_raw_parts(e.add(r.start), r.len()) };
        assert!(bytes.iter().all(|&b| b == POISON), "a freed entry was written to after its free (A-H)");
    }
    #[cfg(not(debug_assertions))]
    let _ = e;
}

/// Entries given back since the allocator last took them: a push-only
/// list of free memory, shared by every thread that deregisters.
pub(crate) struct Returned {
    head: AtomicPtr<Free>,
}

impl Returned {
    pub(crate) fn new() -> Self {
        Returned { head: AtomicPtr::new(std::ptr::null_mut()) }
    }

    /// Gives back the memory of an entry whose fields were moved out or
    /// need no drop.
    ///
    /// # Safety
    /// `e` came from [`EntryPool::alloc`] of the pool this list serves, and
    /// nobody reads the entry again (A-H: its deregistration owner, once).
    pub(super) unsafe fn give_back<R: Registrar>(&self, e: NonNull<Entry<R>>) {
        // SAFETY: the contract.
        let node = unsafe { as_free(e) };
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            // SAFETY: the entry's memory is ours (the contract), aligned and
            // large enough for a pointer (`EntryPool::LAYOUT_OK`).
            unsafe { node.write(Free { next: head }) };
            // Release: the allocator's Acquire swap sees this link, and every
            // write to the entry before it, before it reuses the memory.
            match self.head.compare_exchange_weak(head, node, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => head = now,
            }
        }
    }

    /// Takes every entry given back so far (null: none).
    fn take_all(&self) -> *mut Free {
        // A load first: most misses find the list empty, and a swap is a
        // locked instruction. Acquire: pairs with `give_back`'s Release.
        if self.head.load(Ordering::Relaxed).is_null() {
            return std::ptr::null_mut();
        }
        self.head.swap(std::ptr::null_mut(), Ordering::Acquire)
    }
}

/// The allocator's side, under the cache lock exclusive (in `Locked`).
pub(crate) struct EntryPool<R: Registrar> {
    /// Each block's first entry, from a leaked `Box<[MaybeUninit<Entry>]>`
    /// of `BLOCK` (freed by `Drop`). Raw, not boxed: a `&mut` to a block
    /// while carving would, under Rust's aliasing rules, invalidate the
    /// pointers to its live entries that other threads are using.
    blocks: Vec<NonNull<MaybeUninit<Entry<R>>>>,
    /// Entries of the last block not handed out yet.
    carved: usize,
    /// Free memory taken from [`Returned`] (null: none).
    free: *mut Free,
    /// The last incarnation number handed out (see [`Self::alloc`]).
    incarnation: u64,
}

// SAFETY: the pool owns its blocks; its raw pointers point into them and are
// used only by the holder of the lock exclusive that guards the pool.
unsafe impl<R: Registrar> Send for EntryPool<R> {}
// SAFETY: as above; `&EntryPool` gives no access to entries.
unsafe impl<R: Registrar> Sync for EntryPool<R> {}

impl<R: Registrar> EntryPool<R> {
    /// The free list's link fits in an entry's memory, aligned, over its id,
    /// after its state word.
    const LAYOUT_OK: () = assert!(
        std::mem::offset_of!(Entry<R>, state) == 0
            && std::mem::offset_of!(Entry<R>, last_use) >= std::mem::size_of::<EntryState>()
            && std::mem::offset_of!(Entry<R>, view_id) >= std::mem::offset_of!(Entry<R>, last_use)
            && std::mem::size_of::<Entry<R>>() >= std::mem::offset_of!(Entry<R>, view_id) + std::mem::size_of::<Free>()
            && std::mem::align_of::<Entry<R>>() >= std::mem::align_of::<Free>()
            && std::mem::offset_of!(Entry<R>, view_id) % std::mem::align_of::<Free>() == 0
            && !std::mem::needs_drop::<Entry<R>>()
    );

    pub(crate) fn new() -> Self {
        EntryPool { blocks: Vec::new(), carved: BLOCK, free: std::ptr::null_mut(), incarnation: 0 }
    }

    /// Takes back the memory of an entry freed under the lock exclusive (its
    /// fields moved out or needing no drop): the next A9 reuses it without
    /// an atomic instruction.
    ///
    /// # Safety
    /// `e` came from [`EntryPool::alloc`] of this pool, and nobody reads
    /// the entry again (A-H: its deregistration owner, once).
    pub(super) unsafe fn put_back(&mut self, e: NonNull<Entry<R>>) {
        // SAFETY: the contract.
        let node = unsafe { as_free(e) };
        // SAFETY: the entry's memory is ours (the contract), aligned and
        // large enough for a pointer (`LAYOUT_OK`).
        unsafe { node.write(Free { next: self.free }) };
        self.free = node;
    }

    /// Memory for one entry, holding `entry` (A9, under the lock exclusive):
    /// from the free list, else the next of the last block; once the block
    /// is used up, what was given back meanwhile, and only if nothing was, a
    /// new block.
    ///
    /// Taking the given-back list only when the block is used up costs one
    /// swap (a locked instruction) per block of allocations, not one per
    /// evicting miss, and at most one block of memory that a take on every
    /// allocation would not have carved.
    ///
    /// The entry's state word gets the next incarnation number
    /// ([`EntryState::with_incarnation`]): memory reused at one address
    /// shows A0 a different word each time, until the numbers wrap.
    pub(super) fn alloc(&mut self, returned: &Returned, mut entry: Entry<R>) -> NonNull<Entry<R>> {
        #[allow(clippy::let_unit_value)]
        let () = Self::LAYOUT_OK;
        self.incarnation = self.incarnation.wrapping_add(1);
        let word = EntryState::with_incarnation(entry.state.initial_word(), self.incarnation);
        if self.free.is_null() && self.carved == BLOCK {
            self.free = returned.take_all();
        }
        if !self.free.is_null() {
            let node = self.free;
            let p = entry_of::<R>(node);
            // SAFETY: a node of our free lists: memory of a freed entry of
            // this pool, poisoned and its link written by `give_back` or
            // `put_back` (made visible by `take_all`'s Acquire).
            unsafe {
                check_poison::<R>(p.cast());
                self.free = (*node).next;
            }
            let from = after_state::<R>();
            // SAFETY: `p` is memory of a freed entry that nobody else uses
            // but A0, which only reads and compare-exchanges its state word
            // (module docs). Every field after the state word is written
            // from `entry` (plain data and `plain` atomics, no drop:
            // `LAYOUT_OK`); `entry`'s own state word is left behind, and
            // the word in place, still INVALID
            // from the last owner, becomes the new incarnation's with one
            // atomic store, last (Release: with the fields before it).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (&entry as *const Entry<R>).cast::<u8>().add(from),
                    p.cast::<u8>().add(from),
                    std::mem::size_of::<Entry<R>>() - from,
                );
                // `entry` goes out of scope with nothing to drop
                // (`LAYOUT_OK`): its handle, now copied, is `ManuallyDrop`.
                (*p).state.reincarnate(word);
                return NonNull::new_unchecked(p);
            }
        }
        let p: *mut Entry<R> = {
            if self.carved == BLOCK {
                let block: Box<[MaybeUninit<Entry<R>>]> = Box::new_uninit_slice(BLOCK);
                let first = Box::into_raw(block).cast::<MaybeUninit<Entry<R>>>();
                // SAFETY: `Box::into_raw` never returns null.
                self.blocks.push(unsafe { NonNull::new_unchecked(first) });
                self.carved = 0;
            }
            let block = *self.blocks.last().expect("pushed above");
            // SAFETY: `carved < BLOCK`: inside the block's allocation.
            let p = unsafe { block.as_ptr().add(self.carved) }.cast::<Entry<R>>();
            self.carved += 1;
            p
        };
        entry.state = EntryState::from_word(word);
        // SAFETY: `p` is memory for one entry never handed out: nobody
        // else uses it (A0 reads only entries the memo named).
        unsafe {
            p.write(entry);
            NonNull::new_unchecked(p)
        }
    }
}

impl<R: Registrar> Drop for EntryPool<R> {
    /// Frees the blocks (the generation's drop). Entries still in them are
    /// those a forgotten generation never freed (spec.md#S2.6): their
    /// handles are leaked, as before, and nothing reads them after the
    /// cache is gone.
    fn drop(&mut self) {
        for first in self.blocks.drain(..) {
            let slice = std::ptr::slice_from_raw_parts_mut(first.as_ptr(), BLOCK);
            // SAFETY: from `Box::into_raw` of a boxed slice of `BLOCK`, freed
            // once, here; `MaybeUninit` runs no destructor.
            drop(unsafe { Box::from_raw(slice) });
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::cache::entry_state::EntryState;
    use crate::registrar::counting::{CountingHandle, CountingRegistrar};
    use crate::registrar::Keys;
    use crate::sync::plain;
    use mrcache_types::{Access, Range};
    use std::collections::HashSet;
    use std::mem::ManuallyDrop;

    fn entry(id: u64) -> Entry<CountingRegistrar> {
        Entry {
            state: EntryState::pending(0),
            last_use: plain::AtomicU64::new(0),
            keys: Keys { lkey: id as u32, rkey: 0 },
            view_id: id,
            view_addr: id << 12,
            view_len: 4096,
            view_access: Access::LOCAL_WRITE,
            memoized: plain::AtomicBool::new(false),
            cost: 0,
            priority: plain::AtomicU64::new(0),
            noted: plain::AtomicU64::new(0),
            handle: ManuallyDrop::new(CountingHandle { id, range: Range { addr: id << 12, len: 4096 }, access: Access::LOCAL_WRITE }),
        }
    }

    /// Handed-out memory is never handed out again before it is given back;
    /// given-back memory is reused, so an evicting workload (one freed per
    /// one taken) stays within two blocks.
    #[test]
    fn memory_is_unique_while_held_and_reused_once_given_back() {
        let mut pool = EntryPool::<CountingRegistrar>::new();
        let returned = Returned::new();
        let mut held: Vec<NonNull<Entry<CountingRegistrar>>> = Vec::new();
        let mut seen_held = HashSet::new();
        for id in 0..1000u64 {
            let p = pool.alloc(&returned, entry(id));
            assert!(seen_held.insert(p.as_ptr() as usize), "memory handed out twice while held");
            // SAFETY: just written by `alloc`, held by this test alone.
            assert_eq!(unsafe { p.as_ref() }.view_id, id);
            held.push(p);
        }
        for id in 1000..100_000u64 {
            let victim = held.remove(0);
            seen_held.remove(&(victim.as_ptr() as usize));
            // Both ways back: under the lock (an eviction) and from any
            // thread (a last release).
            if id % 3 == 0 {
                // SAFETY: from this pool, given back once, not read again.
                unsafe { returned.give_back(victim) };
            } else {
                // SAFETY: as above.
                unsafe { pool.put_back(victim) };
            }
            let p = pool.alloc(&returned, entry(id));
            assert!(seen_held.insert(p.as_ptr() as usize), "memory handed out twice while held");
            held.push(p);
        }
        // Held entries are intact (no reuse overwrote one).
        for (k, p) in held.iter().enumerate() {
            // SAFETY: held by this test.
            assert_eq!(unsafe { p.as_ref() }.view_id, 99_000 + k as u64);
        }
        assert!(pool.blocks.len() <= 1000 / BLOCK + 2, "{} blocks for 1,000 live entries", pool.blocks.len());
    }

    /// Debug builds catch a write to an entry after its free when the
    /// memory is handed out again.
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "written to after its free")]
    fn a_write_after_the_free_is_caught_at_the_next_alloc() {
        let mut pool = EntryPool::<CountingRegistrar>::new();
        let returned = Returned::new();
        let e = pool.alloc(&returned, entry(1));
        // SAFETY: from this pool, given back once.
        unsafe { pool.put_back(e) };
        // A stale writer: the LRU stamp of the freed entry (a `touch`
        // through a lease pointer after the free).
        // SAFETY: the memory is the pool's (a test of exactly this misuse).
        unsafe { (*e.as_ptr()).last_use.store(7, std::sync::atomic::Ordering::Relaxed) };
        let _ = pool.alloc(&returned, entry(2));
    }

    /// Memory given back from several threads at once is all taken, each
    /// piece once.
    #[test]
    fn concurrent_give_backs_are_each_taken_once() {
        let mut pool = EntryPool::<CountingRegistrar>::new();
        let returned = Returned::new();
        let all: Vec<usize> = (0..4 * BLOCK as u64).map(|id| pool.alloc(&returned, entry(id)).as_ptr() as usize).collect();
        std::thread::scope(|s| {
            for chunk in all.chunks(BLOCK) {
                let returned = &returned;
                s.spawn(move || {
                    for &p in chunk {
                        // SAFETY: from the pool, given back once, by this thread only.
                        unsafe { returned.give_back(NonNull::new(p as *mut Entry<CountingRegistrar>).unwrap()) };
                    }
                });
            }
        });
        // The last block is used up: the next allocations take the list.
        let again: HashSet<usize> = (0..4 * BLOCK as u64).map(|id| pool.alloc(&returned, entry(id)).as_ptr() as usize).collect();
        assert_eq!(again, all.iter().copied().collect::<HashSet<_>>(), "every piece given back is reused, once");
        assert_eq!(pool.blocks.len(), 4, "no new block while memory was given back");
    }
}
