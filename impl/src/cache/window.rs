//! Open release windows (spec.md#S1.8, W1–W3): the ranges a hook that runs
//! *before* the release has announced with [`Cache::release_begin`] and not
//! yet closed with [`Cache::release_end`].
//!
//! Invariants:
//! - **A multiset.** Windows from several threads may overlap or be equal;
//!   each `end` closes one window with exactly its pages. A window that no
//!   `begin` opened is never closed (E7, nothing changes).
//! - **A leaf lock that never allocates or frees inside.** Its mutex is
//!   taken alone by W1/W2 and under the cache lock by A4 and A7 (W3), never the
//!   other way round, and nothing inside can call an allocator, so an
//!   allocator hook cannot re-enter it on the same thread (spec.md#P6):
//!   [`Windows::open`] grows the buffer outside the mutex and swaps it in.
//! - **No registration planned while an overlapping window is open is
//!   cached** (W3): A4 reads the windows under the exclusive cache lock and
//!   marks its in-flight record *windowed*; A9 serves a windowed
//!   registration uncached while an overlapping window is still open, and
//!   A7 retries it otherwise. One planned before a window's W1 event was
//!   drained is marked stale by that drain (A-D), so neither kind can be
//!   cached with frames a release inside the window took away.
//! - **`open_count` is the number of open windows**, stored under the mutex
//!   after every change, so A4 and A7 skip the mutex (two locked
//!   instructions on every miss) when it reads 0. That answer is as good
//!   as the mutex's: a plan that must see a window is one made after the
//!   drain of the window's W1 event, which [`super::Cache::release_begin`]
//!   queues after opening the window; the queue and the cache lock order
//!   that drain after the count's store, and A4 after the drain, so A4's
//!   load happens after the store and cannot read an older count (read
//!   coherence, whatever the orderings). A plan made before that drain
//!   may read 0 and is marked stale by the drain instead, as it may miss
//!   the window under the mutex too. The count reaches 0 again only when
//!   every window counted in it has been closed.
//!
//! [`Cache::release_begin`]: super::Cache::release_begin
//! [`Cache::release_end`]: super::Cache::release_end

use crate::sync::{AtomicUsize, Mutex, Ordering};
use mrcache_types::PageSpan;
use std::sync::PoisonError;

/// Windows preallocated per generation; more grow the buffer (outside the mutex).
const INITIAL: usize = 8;

/// The open windows of one generation of the cache.
pub(super) struct Windows {
    open: Mutex<Vec<PageSpan>>,
    /// `open.len()`, stored under the mutex after each change (module docs).
    open_count: AtomicUsize,
}

impl Windows {
    pub(super) fn new() -> Self {
        Windows { open: Mutex::new(Vec::with_capacity(INITIAL)), open_count: AtomicUsize::new(0) }
    }

    /// Mirrors the multiset's size into `open_count` (mutex held: `open`
    /// is its guard's contents). Release: a reader that sees the count sees
    /// the multiset it counts (module docs).
    //= spec.md#W1
    //# W1 stores the count with the window, before it queues its event
    fn counted(&self, open: &[PageSpan]) {
        self.open_count.store(open.len(), Ordering::Release);
    }

    //= spec.md#W1
    //# add the range's pages to the open windows (a multiset)
    /// Opens a window on `span`.
    pub(super) fn open(&self, span: PageSpan) {
        let mut spare: Option<Vec<PageSpan>> = None;
        loop {
            let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
            if open.len() < open.capacity() {
                open.push(span); // within the capacity: no reallocation
                self.counted(&open);
                drop(open);
                drop(spare);
                return;
            }
            if let Some(mut bigger) = spare.take() {
                if bigger.capacity() > open.len() {
                    // Within `bigger`'s capacity: no reallocation.
                    bigger.extend_from_slice(&open);
                    bigger.push(span);
                    let old = std::mem::replace(&mut *open, bigger);
                    self.counted(&open);
                    drop(open);
                    drop(old); // freed outside the mutex
                    return;
                }
            }
            let want = (open.capacity() * 2).max(INITIAL);
            drop(open);
            // Another thread may have grown or filled it meanwhile: retry.
            spare = Some(Vec::with_capacity(want));
        }
    }

    //= spec.md#W2
    //# remove one open window with exactly the range's pages
    /// Closes one window on exactly `span`; `false` if none is open.
    pub(super) fn close(&self, span: PageSpan) -> bool {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        match open.iter().position(|w| *w == span) {
            Some(i) => {
                open.swap_remove(i);
                self.counted(&open);
                true
            }
            None => false,
        }
    }

    /// Whether an open window overlaps `span` (A4 and A7, W3). No mutex
    /// while no window is open (module docs: `open_count`).
    //= spec.md#W3
    //# A4 and A7 may skip the windows' mutex when the count of open windows,
    //# stored under it after each change, reads 0
    pub(super) fn overlaps(&self, span: PageSpan) -> bool {
        // Acquire: pairs with `counted`'s release (module docs).
        if self.open_count.load(Ordering::Acquire) == 0 {
            return false;
        }
        self.open.lock().unwrap_or_else(PoisonError::into_inner).iter().any(|w| w.overlaps(&span))
    }

    /// How many windows are open.
    pub(super) fn len(&self) -> usize {
        self.open.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn sp(first: u64, end: u64) -> PageSpan {
        PageSpan { first, end }
    }

    #[test]
    fn a_multiset_that_grows() {
        let w = Windows::new();
        for i in 0..3 * INITIAL as u64 {
            w.open(sp(i, i + 2));
        }
        w.open(sp(0, 2));
        assert_eq!(w.len(), 3 * INITIAL + 1);
        assert!(w.overlaps(sp(1, 2)) && !w.overlaps(sp(100, 101)));
        // Two windows on [0,2): two ends close them, a third finds none.
        assert!(w.close(sp(0, 2)) && w.close(sp(0, 2)) && !w.close(sp(0, 2)));
        // Only exactly the same pages close a window.
        assert!(!w.close(sp(1, 2)));
        assert!(w.overlaps(sp(1, 2)));
        for i in 1..3 * INITIAL as u64 {
            assert!(w.close(sp(i, i + 2)));
        }
        assert_eq!(w.len(), 0);
        assert!(!w.overlaps(sp(0, 100)));
    }
}
