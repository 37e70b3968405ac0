//! The invalidation queue (spec.md#H1, H2, S3.9, L2).
//!
//! A bounded buffer of release events (with their kinds) behind a *leaf* mutex, plus an atomic
//! length that the hit path reads without any lock (spec.md#A1: the fast path
//! is taken only when the queue is empty).
//!
//! - **Never waits for the cache lock.** The queue's mutex is independent of
//!   the cache lock and is held only for a bounded, allocation-free critical
//!   section (the buffer's capacity is reserved when the queue is created;
//!   [`InvalidationQueue::take_all`] reserves room in its output *before*
//!   locking). Nothing inside can free memory, so no allocator hook can run
//!   inside it and re-enter the queue on the same thread (spec.md#P6, S7.2).
//!   A hook waits at most for another thread's push or take to finish.
//! - **Bounded** (spec.md#L2). A push that finds the buffer full replaces its
//!   contents by one event covering their hull and the new event
//!   ([`ReleaseEvent::hull`]: their kind if they all agree, else none):
//!   conservative (it may invalidate more, never less) and non-blocking. The
//!   hull of the buffered events is kept as they are pushed, so that
//!   collapse costs `O(1)`, not a pass over the buffer.
//!   Replacement happens inside the critical section, so the length never
//!   reads 0 while an event is held outside the buffer: no window in which a
//!   lookup could miss a queued event.
//! - **Emptiness** is the atomic length, written under the mutex (`Release`)
//!   and read with `Acquire`: an event whose push returned before a lookup
//!   began is seen by that lookup, which then takes the slow path and drains.
//!
//! Release events commute (each removes the entries it overlaps and marks
//! in-flight records stale), so drains may apply them in any order;
//! `take_all` returns them oldest first anyway.

use crate::sync::{AtomicUsize, Mutex, Ordering};
use mrcache_types::ReleaseEvent;
use std::sync::PoisonError;

/// Largest buffer a queue preallocates (24 B per event: 1.5 MiB). A larger
/// `max_unreleased` is clamped to it.
pub const MAX_QUEUE_CAPACITY: usize = 1 << 16;

/// What [`InvalidationQueue::push`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pushed {
    /// Appended; the queue now holds this many events.
    Queued(usize),
    /// The queue was full: its contents and the new event became one hull event.
    Merged,
}

/// The buffered events and their hull (`None` when empty).
struct Buffered {
    events: Vec<ReleaseEvent>,
    hull: Option<ReleaseEvent>,
}

/// The bounded queue of pending release events.
pub struct InvalidationQueue {
    events: Mutex<Buffered>,
    len: AtomicUsize,
    cap: usize,
}

impl std::fmt::Debug for InvalidationQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InvalidationQueue").field("len", &self.len()).field("capacity", &self.cap).finish()
    }
}

impl InvalidationQueue {
    /// A queue of at most `capacity` events (at least 1, at most
    /// [`MAX_QUEUE_CAPACITY`]), preallocated.
    pub fn with_capacity(capacity: usize) -> Self {
        let cap = capacity.clamp(1, MAX_QUEUE_CAPACITY);
        InvalidationQueue { events: Mutex::new(Buffered { events: Vec::with_capacity(cap), hull: None }), len: AtomicUsize::new(0), cap }
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    //= spec.md#H1
    //= spec.md#L2
    /// Queues an event; never waits for the cache lock and never allocates.
    pub fn push(&self, event: ReleaseEvent) -> Pushed {
        let mut q = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        let hull = q.hull.map_or(event, |h| h.hull(&event));
        q.hull = Some(hull);
        let pushed = if q.events.len() < self.cap {
            q.events.push(event); // within the reserved capacity: no reallocation
            Pushed::Queued(q.events.len())
        } else {
            // O(1): the hull is kept as events are pushed.
            q.events.clear();
            q.events.push(hull);
            Pushed::Merged
        };
        self.len.store(q.events.len(), Ordering::Release);
        pushed
    }

    /// No event is queued (spec.md#A1: the fast path is taken only then).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
    }

    /// Events queued now.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    //= spec.md#A-D
    /// Takes every queued event, oldest first, appending to `out`. Called by
    /// the holder of the exclusive cache lock. Returns how many were taken.
    pub fn take_all(&self, out: &mut Vec<ReleaseEvent>) -> usize {
        if self.is_empty() {
            return 0;
        }
        // Allocate before locking: nothing may free memory inside.
        out.reserve(self.cap);
        let mut q = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        let n = q.events.len();
        // Moves the events; the buffer keeps its capacity (nothing is freed here).
        out.append(&mut q.events);
        q.hull = None;
        self.len.store(0, Ordering::Release);
        n
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use mrcache_types::{PageSpan, ReleaseKind};

    const P: u64 = 4096;

    /// A munmap of pages `[first, end)`.
    fn sp(first: u64, end: u64) -> ReleaseEvent {
        ReleaseEvent::new(ReleaseKind::Munmap, first * P, (end - first) * P).unwrap()
    }

    #[test]
    fn fifo_len_and_hull_when_full() {
        let q = InvalidationQueue::with_capacity(3);
        assert!(q.is_empty());
        assert_eq!(q.push(sp(1, 2)), Pushed::Queued(1));
        assert_eq!(q.push(sp(5, 6)), Pushed::Queued(2));
        assert_eq!(q.push(sp(3, 4)), Pushed::Queued(3));
        assert_eq!(q.push(sp(10, 12)), Pushed::Merged);
        assert_eq!(q.len(), 1);
        let mut out = vec![sp(0, 1)];
        assert_eq!(q.take_all(&mut out), 1);
        assert_eq!(out, vec![sp(0, 1), sp(1, 12)]);
        assert!(q.is_empty());
        q.push(sp(7, 8));
        let mut out = Vec::new();
        q.take_all(&mut out);
        assert_eq!(out, vec![sp(7, 8)]);
        assert_eq!(InvalidationQueue::with_capacity(0).capacity(), 1);
        // A collapse keeps the kind its events agree on, and only that.
        let q = InvalidationQueue::with_capacity(1);
        let dontneed = |page| ReleaseEvent::new(ReleaseKind::MadviseDontneed, page * P, P).unwrap();
        q.push(dontneed(1));
        assert_eq!(q.push(dontneed(3)), Pushed::Merged);
        let mut out = Vec::new();
        q.take_all(&mut out);
        assert_eq!(out, vec![ReleaseEvent::new(ReleaseKind::MadviseDontneed, P, 3 * P).unwrap()]);
        q.push(dontneed(1));
        q.push(sp(3, 4));
        out.clear();
        q.take_all(&mut out);
        assert_eq!((out[0].kind, out[0].pages(P)), (None, PageSpan { first: 1, end: 4 }));
        assert_eq!(InvalidationQueue::with_capacity(usize::MAX).capacity(), MAX_QUEUE_CAPACITY);
    }

    #[test]
    fn concurrent_pushes_are_all_covered() {
        let q = std::sync::Arc::new(InvalidationQueue::with_capacity(64));
        let taken = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let hs: Vec<_> = (0..4u64)
            .map(|t| {
                let (q, taken) = (q.clone(), taken.clone());
                std::thread::spawn(move || {
                    for i in 0..1000 {
                        q.push(sp(t * 1000 + i, t * 1000 + i + 1));
                        if i % 100 == 0 {
                            let mut out = Vec::new();
                            q.take_all(&mut out);
                            taken.lock().unwrap().extend(out);
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let mut all = taken.lock().unwrap().clone();
        q.take_all(&mut all);
        for p in 0..4000 {
            assert!(all.iter().any(|s| s.pages(P).contains(&PageSpan { first: p, end: p + 1 })), "event {p} lost");
        }
    }
}
