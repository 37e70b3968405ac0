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
//! one whose entry left the index is dropped. The walk tells the two apart
//! without a descent of the index: a candidate keeps its entry's address
//! and incarnation, and under the lock exclusive an entry is in the index
//! iff its state word is findable with that incarnation (and its id is the
//! candidate's, as the incarnation wraps). The address may be of memory
//! freed or reused since: the pool keeps it allocated for the generation's
//! life, and its state word is always an `EntryState` (`entry_pool`), so the
//! word is the only field read before it says the entry is there. Entries
//! that may not be evicted now (leased, or not noted by A6) are set aside
//! and pushed back when the pass ends, so a pass costs
//! `O((k + v + 1) · log n)` for `v` victims and `k` entries passed over
//! (leased or not noted ones older than the last victim, and out-of-date keys).
//!
//! Garbage (candidates of entries that left the index without being popped)
//! is bounded: when the order holds more than twice the index plus
//! [`SLACK`], it is rebuilt from the index (`O(n log n)`, amortised `O(log n)`
//! per push).
//!
//! ## A sorted run in front of the heap
//!
//! Most pushes arrive in key order: A9 stamps a new entry from the clock
//! (LRU), so its key is above every key issued before it, and hence above
//! every candidate's. Such a push is appended to a *run* (a queue whose keys
//! never decrease: each append is at least the run's last), and a pop takes
//! the lesser of the run's front and the heap's top. An evicting miss whose
//! victim was not used since its push (a cyclic or streaming pattern, and
//! the bench's `evict`) then pushes and pops in `O(1)`, where the heap's pop
//! sifted through `log n` levels (about 390 instructions of 3,550 per
//! evicting miss at 10³ entries, callgrind). Pushes out of order (re-pushes
//! of used entries, and GreedyDual-Size keys, whose priorities are not
//! monotone) go to the heap as before. Which of the two holds a candidate
//! changes no pop: both are exact, so the least candidate is the lesser of
//! their least ones.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// Candidates allowed beyond twice the findable entries before a rebuild.
pub(super) const SLACK: usize = 1024;

/// One candidate: its entry's policy key when pushed (ending with the id,
/// so the order is total and ties go by id as S6.3 says) and first page
/// (with the id, the entry's key in the index), and where the entry is: its
/// address and incarnation, by which the note's walk finds it still in the
/// index without a descent (`entry::candidate`). Ordered by the key first,
/// which holds the id: the last two fields never decide an order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Candidate {
    pub(super) key: (u64, u64, u64),
    pub(super) first: u64,
    /// The entry's address (in its generation's pool, which outlives the order).
    pub(super) entry: usize,
    /// Its incarnation's bits when pushed (`EntryState::incarnation_bits`).
    pub(super) incarnation: u64,
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

/// The lazy min-heap behind a sorted run (module docs).
#[derive(Default)]
pub(super) struct EvictionOrder {
    /// Candidates pushed in key order: each at least the one before it.
    run: VecDeque<Candidate>,
    /// Every other candidate.
    heap: BinaryHeap<Reverse<Candidate>>,
}

impl EvictionOrder {
    pub(super) fn push(&mut self, c: Candidate) {
        if self.run.back().is_none_or(|last| *last <= c) {
            self.run.push_back(c);
        } else {
            self.heap.push(Reverse(c));
        }
    }

    /// Whether the least candidate is the run's front (else the heap's top;
    /// `None` when both are empty).
    fn least_in_run(&self) -> Option<bool> {
        match (self.run.front(), self.heap.peek()) {
            (Some(r), Some(Reverse(h))) => Some(r <= h),
            (Some(_), None) => Some(true),
            (None, Some(_)) => Some(false),
            (None, None) => None,
        }
    }

    pub(super) fn pop(&mut self) -> Option<Candidate> {
        match self.least_in_run()? {
            true => self.run.pop_front(),
            false => self.heap.pop().map(|Reverse(c)| c),
        }
    }

    /// Pushes `c` and pops the least candidate, in one sift at most: when
    /// `c` is below every candidate it comes straight back (the common case
    /// of a victim search meeting an entry whose key its last release
    /// raised: its new key is usually still the least).
    pub(super) fn push_pop(&mut self, c: Candidate) -> Candidate {
        let Some(in_run) = self.least_in_run() else { return c };
        if in_run {
            if self.run.front().is_some_and(|least| *least < c) {
                let least = self.run.pop_front().expect("the run's front was just read");
                self.push(c);
                return least;
            }
            return c;
        }
        // The heap's top is the least: replaced in one sift when `c` belongs
        // in the heap too (below the run's last).
        let c_in_heap = self.run.back().is_some_and(|last| c < *last);
        match self.heap.peek_mut() {
            Some(mut top) if top.0 < c => {
                if c_in_heap {
                    std::mem::replace(&mut *top, Reverse(c)).0
                } else {
                    let least = std::collections::binary_heap::PeekMut::pop(top).0;
                    self.run.push_back(c);
                    least
                }
            }
            _ => c,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.run.len() + self.heap.len()
    }

    pub(super) fn clear(&mut self) {
        self.run.clear();
        self.heap.clear();
    }

    /// Whether the garbage bound asks for a rebuild, for `findable` entries.
    pub(super) fn needs_rebuild(&self, findable: usize) -> bool {
        self.len() > findable.saturating_mul(2).saturating_add(SLACK)
    }

    /// Replaces the order with one candidate per entry, at its current key
    /// (sorted: all of them in the run).
    pub(super) fn rebuild(&mut self, candidates: impl Iterator<Item = Candidate>) {
        let mut v: Vec<Candidate> = candidates.collect();
        v.sort_unstable();
        self.run = VecDeque::from(v);
        self.heap.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A candidate of no entry (the order never reads its entry).
    fn cand(key: (u64, u64, u64), first: u64) -> Candidate {
        Candidate { key, first, entry: 0, incarnation: 0 }
    }

    #[test]
    fn pops_in_policy_order_with_ties_by_id() {
        let mut o = EvictionOrder::default();
        for (last, id) in [(5, 3), (2, 9), (5, 1), (7, 2)] {
            o.push(cand(policy_key(false, last, 0, id), id * 10));
        }
        let ids: Vec<u64> = std::iter::from_fn(|| o.pop()).map(|c| c.id()).collect();
        assert_eq!(ids, [9, 1, 3, 2]);
    }

    /// A seeded xorshift64: `next(m)` is the next value below `m`.
    fn xorshift(mut g: u64) -> impl FnMut(u64) -> u64 {
        move |m| {
            g ^= g << 13;
            g ^= g >> 7;
            g ^= g << 17;
            g % m
        }
    }

    #[test]
    fn push_pop_is_push_then_pop() {
        let mut next = xorshift(0x9E37_79B9_7F4A_7C15);
        for _ in 0..200 {
            let (mut a, mut b) = (EvictionOrder::default(), EvictionOrder::default());
            for id in 0..next(20) {
                let c = cand(policy_key(false, next(50), 0, id), id);
                a.push(c);
                b.push(c);
            }
            let c = cand(policy_key(false, next(60), 0, 100), 100);
            a.push(c);
            assert_eq!(a.pop(), Some(b.push_pop(c)));
            let (ra, rb): (Vec<_>, Vec<_>) = (std::iter::from_fn(|| a.pop()).collect(), std::iter::from_fn(|| b.pop()).collect());
            assert_eq!(ra, rb);
        }
    }

    /// The run and the heap together pop what one heap would, for pushes
    /// mostly in key order (A9's) mixed with re-pushes below the run's last
    /// (used entries) and push_pops, as the victim search makes them.
    #[test]
    fn run_and_heap_pop_as_one_heap() {
        let mut next = xorshift(0x2545_F491_4F6C_DD1D);
        for round in 0..300 {
            let (mut order, mut reference) = (EvictionOrder::default(), BinaryHeap::new());
            let (mut clock, mut id) = (0u64, 0u64);
            for _ in 0..next(200) {
                id += 1;
                let step = next(10);
                // A9: the clock's next stamp; a re-push: an older one.
                let stamp = if step < 6 {
                    clock += 1 + next(3);
                    clock
                } else {
                    next(clock + 1)
                };
                let c = cand(policy_key(round % 2 == 1 && step == 9, stamp, next(5), id), id);
                match step {
                    0..=6 => {
                        order.push(c);
                        reference.push(Reverse(c));
                    }
                    7 => assert_eq!(order.pop(), reference.pop().map(|Reverse(c)| c), "round {round}"),
                    _ => {
                        reference.push(Reverse(c));
                        let want = reference.pop().map(|Reverse(c)| c).unwrap();
                        assert_eq!(order.push_pop(c), want, "round {round}");
                    }
                }
                assert_eq!(order.len(), reference.len());
            }
            let rest: Vec<_> = std::iter::from_fn(|| order.pop()).collect();
            let want: Vec<_> = std::iter::from_fn(|| reference.pop().map(|Reverse(c)| c)).collect();
            assert_eq!(rest, want, "round {round}");
        }
    }

    #[test]
    fn in_order_pushes_stay_out_of_the_heap() {
        let mut o = EvictionOrder::default();
        for i in 0..100 {
            o.push(cand(policy_key(false, i, 0, i), i));
        }
        assert_eq!((o.run.len(), o.heap.len()), (100, 0));
        assert_eq!(o.pop().map(|c| c.id()), Some(0));
        o.push(cand(policy_key(false, 50, 0, 1000), 1000));
        assert_eq!((o.run.len(), o.heap.len()), (99, 1));
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
            o.push(cand((i, 0, i), i));
        }
        assert!(!o.needs_rebuild(10));
        o.push(cand((0, 0, 0), 0));
        assert!(o.needs_rebuild(10));
        o.rebuild((0..3).map(|i| cand((i, 0, i), i)));
        assert_eq!(o.len(), 3);
    }
}
