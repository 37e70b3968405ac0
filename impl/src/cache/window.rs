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
//!
//! [`Cache::release_begin`]: super::Cache::release_begin
//! [`Cache::release_end`]: super::Cache::release_end

use crate::sync::Mutex;
use mrcache_types::PageSpan;
use std::sync::PoisonError;

/// Windows preallocated per generation; more grow the buffer (outside the mutex).
const INITIAL: usize = 8;

/// The open windows of one generation of the cache.
pub(super) struct Windows {
    open: Mutex<Vec<PageSpan>>,
}

impl Windows {
    pub(super) fn new() -> Self {
        Windows { open: Mutex::new(Vec::with_capacity(INITIAL)) }
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
                true
            }
            None => false,
        }
    }

    /// Whether an open window overlaps `span` (A4 and A7, W3).
    pub(super) fn overlaps(&self, span: PageSpan) -> bool {
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
