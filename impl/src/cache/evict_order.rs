//! The eviction order of spec.md#S6.3 without an `O(n)` scan per victim: a
//! lazy min-heap of candidates keyed by the policy's order, kept under the
//! cache lock exclusive (part of the **evict** group: A10, R2).
//!
//! # Invariants
//!
//! - **Every findable entry has at least one candidate** whose key is at
//!   most its current key: A9 pushes one when it inserts (the entry's key
//!   then), and a candidate leaves the heap only when the victim search pops
//!   it, which pushes it back (same or current key) unless its entry left the
//!   index or is the victim.
//! - **Keys only grow**: an entry's key is `(last_use, id)` (LRU) or
//!   `(priority, last_use, id)` (GreedyDual-Size), and both stamps are raised
//!   with `fetch_max` (`Cache::touch`), from a clock and an inflation floor
//!   that only grow.
//!
//! So the first popped candidate whose key is still its entry's current key
//! is the least current key among all candidates' entries: any other entry's
//! key is at least its candidate's, which is at least the popped one. A
//! candidate whose key is out of date is pushed back with the current key
//! (each use makes at most one such re-push, `O(log n)` amortised per use);
//! one whose entry left the index is dropped (found by `(first page, id)` in
//! the index, never by dereferencing a pointer to a freed entry). Entries
//! that may not be evicted now (leased, or not noted by A6) are set aside
//! and pushed back when the pass ends, so a pass costs
//! `O((k + v + 1) · log n)` for `v` victims and `k` entries passed over
//! (leased or not noted ones older than the last victim, and out-of-date keys).
//!
//! Garbage (candidates of entries that left the index without being popped)
//! is bounded: when the heap holds more than twice the index plus
//! [`SLACK`], it is rebuilt from the index (`O(n)`, amortised `O(1)` per push).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Candidates allowed beyond twice the findable entries before a rebuild.
pub(super) const SLACK: usize = 1024;

/// One candidate: its entry's policy key when pushed (ending with the id,
/// so the order is total and ties go by id as S6.3 says) and first page
/// (with the id, the entry's key in the index).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Candidate {
    pub(super) key: (u64, u64, u64),
    pub(super) first: u64,
}

impl Candidate {
    pub(super) fn id(&self) -> u64 {
        self.key.2
    }
}

/// The policy key of an entry with these stamps (S6.3: least `(last_use,
/// id)` for LRU, least `(H, last_use, id)` for GreedyDual-Size).
#[inline]
pub(super) fn policy_key(cost_aware: bool, last_use: u64, priority: u64, id: u64) -> (u64, u64, u64) {
    if cost_aware {
        (priority, last_use, id)
    } else {
        (last_use, 0, id)
    }
}

/// The lazy min-heap (module docs).
#[derive(Default)]
pub(super) struct EvictionOrder {
    heap: BinaryHeap<Reverse<Candidate>>,
}

impl EvictionOrder {
    pub(super) fn push(&mut self, c: Candidate) {
        self.heap.push(Reverse(c));
    }

    pub(super) fn pop(&mut self) -> Option<Candidate> {
        self.heap.pop().map(|Reverse(c)| c)
    }

    /// Pushes `c` and pops the least candidate, in one sift at most: when
    /// `c` is below every candidate it comes straight back (the common case
    /// of a victim search meeting an entry whose key its last release
    /// raised: its new key is usually still the least).
    pub(super) fn push_pop(&mut self, c: Candidate) -> Candidate {
        match self.heap.peek_mut() {
            Some(mut top) if top.0 < c => std::mem::replace(&mut *top, Reverse(c)).0,
            _ => c,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.heap.len()
    }

    pub(super) fn clear(&mut self) {
        self.heap.clear();
    }

    /// Whether the garbage bound asks for a rebuild, for `findable` entries.
    pub(super) fn needs_rebuild(&self, findable: usize) -> bool {
        self.len() > findable.saturating_mul(2).saturating_add(SLACK)
    }

    /// Replaces the heap with one candidate per entry, at its current key.
    pub(super) fn rebuild(&mut self, candidates: impl Iterator<Item = Candidate>) {
        let v: Vec<Reverse<Candidate>> = candidates.map(Reverse).collect();
        self.heap = BinaryHeap::from(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_policy_order_with_ties_by_id() {
        let mut o = EvictionOrder::default();
        for (last, id) in [(5, 3), (2, 9), (5, 1), (7, 2)] {
            o.push(Candidate { key: policy_key(false, last, 0, id), first: id * 10 });
        }
        let ids: Vec<u64> = std::iter::from_fn(|| o.pop()).map(|c| c.id()).collect();
        assert_eq!(ids, [9, 1, 3, 2]);
    }

    #[test]
    fn push_pop_is_push_then_pop() {
        let mut g = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |m: u64| {
            g ^= g << 13;
            g ^= g >> 7;
            g ^= g << 17;
            g % m
        };
        for _ in 0..200 {
            let (mut a, mut b) = (EvictionOrder::default(), EvictionOrder::default());
            for id in 0..next(20) {
                let c = Candidate { key: policy_key(false, next(50), 0, id), first: id };
                a.push(c);
                b.push(c);
            }
            let c = Candidate { key: policy_key(false, next(60), 0, 100), first: 100 };
            a.push(c);
            assert_eq!(a.pop(), Some(b.push_pop(c)));
            let (ra, rb): (Vec<_>, Vec<_>) = (std::iter::from_fn(|| a.pop()).collect(), std::iter::from_fn(|| b.pop()).collect());
            assert_eq!(ra, rb);
        }
    }

    #[test]
    fn cost_aware_orders_by_priority_first() {
        assert!(policy_key(true, 9, 1, 5) < policy_key(true, 1, 2, 4));
        assert!(policy_key(false, 1, 2, 4) < policy_key(false, 9, 1, 5));
    }

    #[test]
    fn garbage_bound() {
        let mut o = EvictionOrder::default();
        for i in 0..(2 * 10 + SLACK as u64) {
            o.push(Candidate { key: (i, 0, i), first: i });
        }
        assert!(!o.needs_rebuild(10));
        o.push(Candidate { key: (0, 0, 0), first: 0 });
        assert!(o.needs_rebuild(10));
        o.rebuild((0..3).map(|i| Candidate { key: (i, 0, i), first: i }));
        assert_eq!(o.len(), 3);
    }
}
