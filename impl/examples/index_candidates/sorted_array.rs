//! Candidate: the index before the B+-tree (a sorted array with a prefix-maximum
//! array and an implicit max-end segment tree, rebuilt in `O(n)` after
//! updates), kept verbatim for the measurement in `main.rs`.
#![allow(dead_code)]

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
        IntervalIndex { starts: Vec::new(), slots: Vec::new(), pmax: Vec::new(), tree: Vec::new(), cap: 0, dirty: false }
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
