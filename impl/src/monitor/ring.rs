//! The event ring (spec.md#M6): where the monitor's reader publishes each
//! release event it reads, for every attached cache to apply from its own
//! cursor. Bounded and preallocated: the reader writes it without
//! allocating, locking or waiting.
//!
//! Invariants:
//! - The ring is mapped once, populated, and never unmapped (the reader
//!   writes it for the life of the process; unmapping it could release
//!   memory a widened registration watches, the very wait the reader must
//!   never make).
//! - One writer (the reader thread). Event number `n` lives in slot
//!   `n % RING_EVENTS`; a slot's `seq` is `n + 1` once event `n` is whole in
//!   it, and `WRITING` while it is being overwritten (a seqlock per slot).
//! - A consumer that asks for event `n` gets it whole, or `None` if the slot
//!   no longer (or not yet) holds it: the consumer was *lapped* and applies
//!   the whole address space instead (spec.md#M6), never a torn event.

use mrcache_types::{Range, ReleaseEvent, ReleaseKind};
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// Events the ring holds: a cache that falls this far behind the reader is
/// lapped. 32 Ki events of 32 bytes: 1 MiB, mapped once per process.
pub const RING_EVENTS: u64 = 1 << 15;

/// A slot's `seq` while the writer overwrites it.
const WRITING: u64 = u64::MAX;

/// One event: its number + 1, its range and its kind (0: none, else the
/// kind's index in [`ReleaseKind::ALL`] + 1).
#[repr(C)]
struct Slot {
    seq: AtomicU64,
    addr: AtomicU64,
    len: AtomicU64,
    kind: AtomicU64,
}

fn kind_code(kind: Option<ReleaseKind>) -> u64 {
    match kind {
        None => 0,
        Some(k) => ReleaseKind::ALL.iter().position(|&x| x == k).map_or(0, |i| i as u64 + 1),
    }
}

fn kind_of(code: u64) -> Option<ReleaseKind> {
    code.checked_sub(1).and_then(|i| ReleaseKind::ALL.get(i as usize).copied())
}

/// The ring: [`RING_EVENTS`] slots in memory of its own, and a page that
/// says whether this is the process that mapped it.
pub struct EventRing {
    slots: &'static [Slot],
    /// [`MAPPED_HERE`] in the process that mapped the ring; 0 in any fork
    /// child (a `MADV_WIPEONFORK` page: every kind of fork, with no atfork
    /// handler). `None` if the kernel refused the advice.
    here: Option<&'static AtomicU64>,
    /// The pid that mapped it, for a kernel without `MADV_WIPEONFORK`.
    pid: u32,
}

/// The marker of the process that mapped the ring.
const MAPPED_HERE: u64 = 0x6d72_6361_7269_6e67;

impl EventRing {
    /// Maps and populates the ring (and locks it in memory if the limit
    /// allows: a reader that page-faults still waits on nothing a releasing
    /// thread holds, but it should not have to fault at all).
    pub fn map() -> std::io::Result<EventRing> {
        let bytes = RING_EVENTS * std::mem::size_of::<Slot>() as u64;
        let page = crate::mem::page_size();
        let addr = crate::mem::map_anon(bytes + page, libc::MAP_POPULATE)?;
        // SAFETY: `addr` is our fresh mapping of `bytes`; mlock only pins it.
        // Best effort: RLIMIT_MEMLOCK may refuse, and the ring works unlocked.
        let _ = unsafe { libc::mlock(addr as *const libc::c_void, bytes as usize) };
        // SAFETY: a fresh, zeroed, writable mapping of RING_EVENTS slots,
        // aligned to a page; an all-zero `Slot` is four zero atomics (valid);
        // never unmapped (module invariants), so `'static` holds.
        let slots = unsafe { std::slice::from_raw_parts(addr as *const Slot, RING_EVENTS as usize) };
        let marker = addr + bytes;
        // SAFETY: advice on the last page of our own mapping.
        let wiped = unsafe { libc::madvise(marker as *mut libc::c_void, page as usize, libc::MADV_WIPEONFORK) } == 0;
        let here = wiped.then(|| {
            // SAFETY: page-aligned zeroed memory of ours, never unmapped: a
            // valid AtomicU64 for the life of the process.
            let m = unsafe { &*(marker as *const AtomicU64) };
            m.store(MAPPED_HERE, Ordering::Relaxed);
            m
        });
        Ok(EventRing { slots, here, pid: std::process::id() })
    }

    /// Whether this process mapped the ring (false in a fork child of any
    /// kind, whose copy no reader writes). One load where the kernel wipes
    /// the marker at fork; else a `getpid`.
    pub fn mapped_here(&self) -> bool {
        match self.here {
            Some(m) => m.load(Ordering::Relaxed) == MAPPED_HERE,
            None => self.pid == std::process::id(),
        }
    }

    fn slot(&self, n: u64) -> &Slot {
        &self.slots[(n % RING_EVENTS) as usize]
    }

    /// Writes event number `n`. Only the reader thread calls it, with
    /// consecutive `n`.
    pub fn put(&self, n: u64, ev: ReleaseEvent) {
        let s = self.slot(n);
        s.seq.store(WRITING, Ordering::Relaxed);
        // Release fence: a consumer that reads any field below and then
        // `seq` (after its Acquire fence) sees WRITING or a later value.
        fence(Ordering::Release);
        s.addr.store(ev.range.addr, Ordering::Relaxed);
        s.len.store(ev.range.len, Ordering::Relaxed);
        s.kind.store(kind_code(ev.kind), Ordering::Relaxed);
        // Release: the fields above are visible to whoever reads `n + 1`.
        s.seq.store(n + 1, Ordering::Release);
    }

    /// Event number `n`, whole, or `None` if its slot holds another event
    /// (the caller was lapped) or is being overwritten.
    pub fn get(&self, n: u64) -> Option<ReleaseEvent> {
        let s = self.slot(n);
        // Acquire: pairs with `put`'s final store.
        if s.seq.load(Ordering::Acquire) != n + 1 {
            return None;
        }
        let (addr, len, kind) = (s.addr.load(Ordering::Relaxed), s.len.load(Ordering::Relaxed), s.kind.load(Ordering::Relaxed));
        // Acquire fence: the loads above happen before the re-check; if the
        // writer began overwriting before any of them, the re-check sees it.
        fence(Ordering::Acquire);
        if s.seq.load(Ordering::Relaxed) != n + 1 {
            return None;
        }
        Some(ReleaseEvent { kind: kind_of(kind), range: Range { addr, len } })
    }
}

/// What a lapped cache applies instead of the events it lost: a REMOVE of
/// the whole address space (every entry leaves the lookup, every
/// registration in flight is stale, and a window stays open until M4
/// proves every madvise of the lost events returned).
pub fn lost_events() -> ReleaseEvent {
    ReleaseEvent::of(ReleaseKind::MadviseDontneed, Range { addr: 0, len: mrcache_types::ADDRESS_LIMIT })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_and_a_lapped_slot_says_so() {
        let ring = EventRing::map().unwrap();
        let ev = ReleaseEvent::of(ReleaseKind::Munmap, Range { addr: 0x1000, len: 0x2000 });
        ring.put(0, ev);
        assert_eq!(ring.get(0), Some(ev));
        assert_eq!(ring.get(1), None, "not written yet");
        let other = ReleaseEvent { kind: None, range: Range { addr: 0x5000, len: 0x1000 } };
        ring.put(RING_EVENTS, other);
        assert_eq!(ring.get(0), None, "overwritten: lapped");
        assert_eq!(ring.get(RING_EVENTS), Some(other));
        assert!(ring.mapped_here());
        for k in ReleaseKind::ALL {
            assert_eq!(kind_of(kind_code(Some(k))), Some(k));
        }
    }
}
