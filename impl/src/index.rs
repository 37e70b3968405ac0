//! The index of findable entries (spec.md#S1.5): an interval structure over
//! page spans that answers the two questions of §A.
//!
//! - **covering** (`A1`, `A3`, `A8`): the lowest-id entry whose span contains the
//!   request's pages and whose access suffices — the model's canonical hit;
//! - **overlapping** (`A-D`, S6.1 displacement): every entry sharing a page with
//!   a span.
//!
//! # Choice: a sorted array with an implicit max-end segment tree
//!
//! Entries live in two parallel vectors sorted by `(first page, id)`: `starts`
//! (just the first pages, so the binary search touches one dense array) and
//! `slots` (end page, id, access, value). Over the slots' end pages sit a
//! prefix-maximum array (`pmax[i]` = the largest end among entries `0..=i`)
//! and an implicit, array-backed segment tree of maxima (`tree[1]` is the
//! root, leaf `i` is `tree[cap + i]`).
//!
//! An entry `[s, e)` covers `[f, g)` iff `s <= f` and `e >= g`. The entries with
//! `s <= f` are a prefix `0..p` of the array (one binary search). Among them:
//!
//! 1. scan backwards from `p - 1`, stopping as soon as `pmax[i] < g` (no entry
//!    at or before `i` reaches `g`). When entries are disjoint or nested only a
//!    little — always under `merge`, usually otherwise — this stops after one
//!    or two steps: **a hit is one binary search and O(1) work**;
//! 2. after [`LINEAR_SCAN`] steps without stopping, the segment tree reports
//!    the rest: exactly the leaves with `e >= g`, pruning every subtree whose
//!    maximum end is below `g`. Every reported leaf *is* a covering entry, so
//!    this costs `O(log n + k·log(n/k))` for `k` covering entries.
//!
//! Overlap queries are the same with `s < g` and `e > f`, `k` = overlapping
//! entries: `O(log n + k·log(n/k))` in the worst case, the bound of
//! spec.md#S5.1 up to the log factor on `k`.
//!
//! Updates (slow path only, under the exclusive lock) insert into / remove
//! from the sorted vectors (`O(n)` memmove) and mark the summaries dirty; they
//! are rebuilt (`O(n)`) once by [`IntervalIndex::refresh`] before the exclusive
//! lock is released, so a miss that displaces several entries pays for one
//! rebuild. Queries on a dirty index fall back to a plain scan of the prefix,
//! so they are correct whenever they run. The slow path also calls the registrar (tens of µs), so
//! `O(n)` updates are cheap next to it for caches up to ~10⁵ entries, while the
//! hit path — the one that matters — gets a branch-light binary search over a
//! dense array. A balanced augmented tree would make updates `O(log n)` at the
//! price of pointer chasing on every hit.
//!
//! Canonical hits: among covering entries with sufficient access, the lowest
//! id, which is the model's "oldest" choice (`Model::lookup`), so `Ret`s agree.

use mrcache_types::{Access, PageSpan};

/// Prefix length up to which queries scan linearly instead of walking the tree.
pub const LINEAR_SCAN: usize = 32;

/// One indexed entry (the first page is kept in the parallel `starts` array).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot<T> {
    /// One past the last page.
    pub end: u64,
    pub id: u64,
    pub access: Access,
    pub value: T,
}

/// Sorted-array interval index with a max-end segment tree (see module docs).
#[derive(Clone, Debug)]
//= spec.md#S1.5
pub struct IntervalIndex<T> {
    starts: Vec<u64>,
    slots: Vec<Slot<T>>,
    /// `pmax[i]` = max end of `slots[0..=i]`.
    pmax: Vec<u64>,
    /// `tree[cap + i]` = `slots[i].end` (0 past `len`); `tree[j]` = max of children.
    tree: Vec<u64>,
    cap: usize,
    dirty: bool,
}

impl<T> Default for IntervalIndex<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> IntervalIndex<T> {
    pub fn new() -> Self {
        IntervalIndex {
            starts: Vec::new(),
            slots: Vec::new(),
            pmax: Vec::new(),
            tree: Vec::new(),
            cap: 0,
            dirty: false,
        }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Inserts an entry. `O(n)` (memmove); marks the tree dirty.
    pub fn insert(&mut self, span: PageSpan, id: u64, access: Access, value: T) {
        let mut pos = self.starts.partition_point(|&s| s < span.first);
        while pos < self.starts.len() && self.starts[pos] == span.first && self.slots[pos].id < id {
            pos += 1;
        }
        self.starts.insert(pos, span.first);
        self.slots.insert(pos, Slot { end: span.end, id, access, value });
        self.dirty = true;
    }

    /// Removes the entry with this first page and id. `O(n)`; marks the tree dirty.
    pub fn remove(&mut self, first: u64, id: u64) -> Option<Slot<T>> {
        let mut pos = self.starts.partition_point(|&s| s < first);
        while pos < self.starts.len() && self.starts[pos] == first {
            if self.slots[pos].id == id {
                self.starts.remove(pos);
                self.dirty = true;
                return Some(self.slots.remove(pos));
            }
            pos += 1;
        }
        None
    }

    /// Removes every entry, in `(first, id)` order.
    pub fn take_all(&mut self) -> Vec<(PageSpan, Slot<T>)> {
        let starts = std::mem::take(&mut self.starts);
        let slots = std::mem::take(&mut self.slots);
        self.dirty = true;
        self.refresh();
        starts.into_iter().zip(slots).map(|(first, s)| (PageSpan { first, end: s.end }, s)).collect()
    }

    /// Rebuilds the segment tree if an update dirtied it. Call before readers
    /// may query again (the cache does so before releasing its exclusive lock).
    pub fn refresh(&mut self) {
        if !self.dirty {
            return;
        }
        self.dirty = false;
        let n = self.slots.len();
        self.pmax.clear();
        let mut m = 0;
        for s in &self.slots {
            m = m.max(s.end);
            self.pmax.push(m);
        }
        if n <= LINEAR_SCAN {
            // Queries never use the tree for such small prefixes.
            self.tree.clear();
            self.cap = 0;
            return;
        }
        let cap = n.next_power_of_two();
        self.cap = cap;
        self.tree.clear();
        self.tree.resize(2 * cap, 0);
        for (i, s) in self.slots.iter().enumerate() {
            self.tree[cap + i] = s.end;
        }
        for j in (1..cap).rev() {
            self.tree[j] = self.tree[2 * j].max(self.tree[2 * j + 1]);
        }
    }

    /// Calls `f(i)`, in no particular order, for every `i < p` with
    /// `slots[i].end >= min_end`.
    #[inline]
    fn visit_prefix(&self, p: usize, min_end: u64, mut f: impl FnMut(usize)) {
        if self.dirty {
            for (i, s) in self.slots[..p].iter().enumerate() {
                if s.end >= min_end {
                    f(i);
                }
            }
            return;
        }
        // Backwards from the last candidate while something at or before `i`
        // can still reach `min_end`.
        let mut i = p;
        let mut steps = 0;
        while i > 0 {
            if self.pmax[i - 1] < min_end {
                return;
            }
            if steps == LINEAR_SCAN && self.cap != 0 {
                break;
            }
            i -= 1;
            steps += 1;
            if self.slots[i].end >= min_end {
                f(i);
            }
        }
        if i == 0 {
            return;
        }
        // The rest, `0..i`, through the segment tree.
        let p = i;
        // Depth-first, left child first, over (node, first leaf, width).
        let mut stack = [(0usize, 0usize, 0usize); 66];
        let mut top = 0;
        stack[top] = (1, 0, self.cap);
        top += 1;
        while top > 0 {
            top -= 1;
            let (node, lo, width) = stack[top];
            if lo >= p || self.tree[node] < min_end {
                continue;
            }
            if width == 1 {
                f(lo);
                continue;
            }
            let half = width / 2;
            stack[top] = (2 * node + 1, lo + half, half);
            stack[top + 1] = (2 * node, lo, half);
            top += 2;
        }
    }

    /// The canonical covering entry: lowest id among entries whose span
    /// contains `span` and whose access suffices for `access` (spec.md#S2.1).
    #[inline]
    pub fn covering(&self, span: PageSpan, access: Access) -> Option<&Slot<T>> {
        let p = self.starts.partition_point(|&s| s <= span.first);
        let mut best: Option<usize> = None;
        self.visit_prefix(p, span.end, |i| {
            let s = &self.slots[i];
            if !s.access.suffices_for(access) {
                return;
            }
            match best {
                Some(b) if self.slots[b].id < s.id => {}
                _ => best = Some(i),
            }
        });
        best.map(|i| &self.slots[i])
    }

    /// Every entry sharing at least one page with `span`, as `(span, slot)`,
    /// in `(first, id)` order.
    pub fn overlapping(&self, span: PageSpan) -> Vec<(PageSpan, &Slot<T>)> {
        let p = self.starts.partition_point(|&s| s < span.end);
        let mut idx = Vec::new();
        self.visit_prefix(p, span.first.saturating_add(1), |i| idx.push(i));
        idx.sort_unstable();
        idx.into_iter().map(|i| (PageSpan { first: self.starts[i], end: self.slots[i].end }, &self.slots[i])).collect()
    }

    /// Every entry, in `(first, id)` order.
    pub fn iter(&self) -> impl Iterator<Item = (PageSpan, &Slot<T>)> {
        self.starts.iter().zip(&self.slots).map(|(&first, s)| (PageSpan { first, end: s.end }, s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sp(first: u64, end: u64) -> PageSpan {
        PageSpan { first, end }
    }

    #[derive(Clone, Debug)]
    enum Step {
        Insert(u64, u64, u8),
        Remove(usize),
        Refresh,
        Cover(u64, u64, u8),
        Overlap(u64, u64),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0u64..200, 1u64..40, 0u8..16).prop_map(|(f, l, a)| Step::Insert(f, f + l, a)),
            2 => any::<usize>().prop_map(Step::Remove),
            1 => Just(Step::Refresh),
            3 => (0u64..220, 1u64..20, 0u8..16).prop_map(|(f, l, a)| Step::Cover(f, f + l, a)),
            3 => (0u64..220, 1u64..20).prop_map(|(f, l)| Step::Overlap(f, f + l)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// The index agrees with a brute-force list, dirty or refreshed, with
        /// small and large prefixes (both the linear and the tree path).
        #[test]
        fn matches_brute_force(steps in proptest::collection::vec(step(), 1..400)) {
            let mut idx = IntervalIndex::new();
            let mut naive: Vec<(PageSpan, u64, Access)> = Vec::new();
            let mut next_id = 1;
            for s in steps {
                match s {
                    Step::Insert(f, e, a) => {
                        let acc = Access::from_bits(a).unwrap();
                        idx.insert(sp(f, e), next_id, acc, next_id * 10);
                        naive.push((sp(f, e), next_id, acc));
                        next_id += 1;
                    }
                    Step::Remove(k) => {
                        if !naive.is_empty() {
                            let (span, id, _) = naive.remove(k % naive.len());
                            let slot = idx.remove(span.first, id).unwrap();
                            prop_assert_eq!(slot.value, id * 10);
                            prop_assert!(idx.remove(span.first, id).is_none());
                        }
                    }
                    Step::Refresh => idx.refresh(),
                    Step::Cover(f, e, a) => {
                        let acc = Access::from_bits(a).unwrap();
                        let want = naive.iter().filter(|(s, _, ac)| s.contains(&sp(f, e)) && ac.suffices_for(acc)).map(|x| x.1).min();
                        prop_assert_eq!(idx.covering(sp(f, e), acc).map(|s| s.id), want);
                    }
                    Step::Overlap(f, e) => {
                        let mut want: Vec<u64> = naive.iter().filter(|(s, _, _)| s.overlaps(&sp(f, e))).map(|x| x.1).collect();
                        let mut got: Vec<u64> = idx.overlapping(sp(f, e)).iter().map(|(_, s)| s.id).collect();
                        want.sort();
                        got.sort();
                        prop_assert_eq!(got, want);
                    }
                }
                prop_assert_eq!(idx.len(), naive.len());
            }
            idx.refresh();
            // Sorted by (first, id).
            let keys: Vec<(u64, u64)> = idx.iter().map(|(s, slot)| (s.first, slot.id)).collect();
            let mut sorted = keys.clone();
            sorted.sort();
            prop_assert_eq!(keys, sorted);
        }
    }

    #[test]
    fn large_index_uses_the_tree() {
        let mut idx = IntervalIndex::new();
        for i in 0..1000u64 {
            idx.insert(sp(i * 2, i * 2 + 1), i + 1, Access::LOCAL_READ, ());
        }
        idx.insert(sp(0, 5000), 5000, Access::REMOTE_READ, ());
        idx.refresh();
        assert!(idx.cap >= 1001);
        assert_eq!(idx.covering(sp(1500, 1501), Access::LOCAL_READ).unwrap().id, 751);
        assert_eq!(idx.covering(sp(1500, 1501), Access::REMOTE_READ).unwrap().id, 5000);
        assert_eq!(idx.covering(sp(1000, 1001), Access::LOCAL_READ).unwrap().id, 501);
        assert_eq!(idx.overlapping(sp(10, 13)).len(), 3);
        let all = idx.take_all();
        assert_eq!(all.len(), 1001);
        assert!(idx.is_empty());
        assert!(idx.covering(sp(0, 1), Access::LOCAL_READ).is_none());
    }
}
