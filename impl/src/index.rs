//! The index of findable entries (spec.md#S1.5): an interval structure over
//! page spans that answers the two questions of §A.
//!
//! - **covering** (`A1`, `A3`, `A8`): the lowest-id entry whose span contains the
//!   request's pages and whose access suffices — the model's canonical hit;
//! - **overlapping** (`A-D`, S6.1 displacement): every entry sharing a page with
//!   a span.
//!
//! # Choice: a B+-tree keyed by `(first page, id)` with max-end summaries
//!
//! Entries sit in leaves of at most [`FANOUT`] entries, sorted by
//! `(first page, id)`; inner nodes hold, per child, a lower bound on its keys
//! (the separator), the largest end page below it (`max_end`) and the running
//! maximum of those over the node (`pmax`, a prefix maximum). Leaves keep
//! their first pages, end pages and prefix maxima in inline arrays, so a node
//! visit reads a few consecutive cache lines.
//!
//! An entry `[s, e)` covers `[f, g)` iff `s <= f` and `e >= g`. In every node
//! the candidates (`s <= f`) are a prefix of the children / entries (one
//! branch-free count over the inline array); walking that prefix backwards
//! stops as soon as the prefix maximum of the ends drops below `g`. With
//! disjoint or slightly nested entries only one child per level passes, so
//! **a hit is one root-to-leaf descent**: `O(log n)` node visits of `O(B)`
//! vectorisable work each. Every other child visited holds a covering entry
//! (its `max_end >= g` and its keys start at or before `f`), so a query with
//! `k` covering entries costs `O((k + 1) · log n)` node visits — the bound of
//! spec.md#S5.1 up to the log factor on `k`. Overlap queries are the same
//! walk with `s < g` and `e > f`, `k` = overlapping entries.
//!
//! Updates are `O(B · log n)`: an insert descends to its leaf, splits full
//! nodes on the way back (an append at a node's end splits it unevenly, so a
//! fill in address order leaves full leaves) and refreshes the summaries of
//! the path; a removal refreshes the path and unlinks nodes that become
//! empty, without merging half-empty ones. The tree is rebuilt, packed, from
//! its entries when it holds fewer than a quarter of the entries it held at
//! its last rebuild's peak, so the height stays `O(log n)` and the rebuild
//! costs `O(1)` amortised per removal. No summary is ever stale:
//! [`IntervalIndex::refresh`] is a no-op kept for the callers.
//!
//! ## Why this structure (measured, `cargo run --release --example index_candidates`)
//!
//! The previous index was a sorted array with a prefix-maximum array and an
//! implicit segment tree: its hits were one binary search, but every update
//! rebuilt the summaries (`O(n)`), so a miss into a cache of 10⁵ entries spent
//! ~50 µs in the index alone. The example runs it (verbatim)
//! beside this B+-tree at fanouts 16, 32 and 64, on 2-page entries. On
//! 2026-12-03 (2 shared cores, load average ~17–27, so ±30 %), per operation:
//!
//! | n = 10⁵ | insert (fill) | remove + insert | hit, random | hit, in order |
//! |---|---|---|---|---|
//! | sorted array | 42–63 µs at 10⁴ (O(n)) | 540–700 µs | 680–980 ns | 140–170 ns |
//! | B+-tree/16 | 240–360 ns | 1.3–3.0 µs | 1,000–1,440 ns | 200–280 ns |
//! | B+-tree/32 | 180–210 ns | 1.1–1.5 µs | 850–1,260 ns | 190–230 ns |
//! | B+-tree/64 | 160–350 ns | 1.1–1.5 µs | 670–1,280 ns | 180–220 ns |
//!
//! Fanout 32 won: updates 500× cheaper than the array's at 10⁵, hits within
//! the noise of 64's and of the array's at 10⁵ (about 1.5× the array's at
//! 10³–10⁴, where the array fits in cache), and cheaper updates than 64 at
//! 10⁴. The hit's cost is the dependent loads of the binary searches (one per
//! level); `covering` walks one path in a loop and falls back to the
//! recursive walk only when a second child may cover.
//!
//! A radix page table à la `ucs_pgtable` was considered and not built: it
//! stores a region once per aligned power-of-two block of its span (up to
//! 2·log(pages) slots), which makes lookups fast only for disjoint entries;
//! overlapping entries under `independent` would need a list per slot and the
//! lowest-id rule a scan of every list on the path, losing its advantage
//! exactly where S5.1 asks for bounds. A pointer-based balanced tree (AVL,
//! treap) has the same asymptotics as the B+-tree but one cache miss per
//! level over ~17 levels at 10⁵ entries, against ~4 levels here.
//!
//! ## In front of it: the hit memo
//!
//! At 10⁴–10⁵ scattered entries a descent waits on one cache miss per
//! level (~4) and on the leaf's binary search, twice UCX's page-table walk.
//! A1 therefore asks [`crate::hit_memo`] first: a direct-mapped table of
//! the answers this index gave, valid while [`IntervalIndex::answers_version`]
//! holds. A repeated request costs one hashed slot; the tree answers the
//! first one, and every request after a change that could alter an answer.
//!
//! Canonical hits: among covering entries with sufficient access, the lowest
//! id, which is the model's "oldest" choice (`Model::lookup`), so `Ret`s agree.

use mrcache_types::{Access, PageSpan};

/// Most entries per leaf and children per inner node (the default; the
/// index's const parameter is `FANOUT + 1`, the arrays' room while a node
/// splits).
pub const FANOUT: usize = 32;

/// Most levels above the leaves that a removal's path array holds. A split
/// leaves every node but the rightmost of its level at least half full (16
/// children at fanout 32), so 2^64 entries need fewer than 17 levels; a
/// taller tree is packed before a removal (a rebuild: 3/4-full nodes).
const MAX_HEIGHT: usize = 24;

/// One indexed entry (its first and end pages are kept in the leaf's
/// `starts` and `ep` arrays, where the searches read them: a copy here
/// would cost every entry 8 bytes and every shift of a leaf 8 more per entry).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot<T> {
    pub id: u64,
    pub access: Access,
    pub value: T,
}

/// Asks for every cache line of a leaf's first pages at once, before its
/// binary search: the search's probes would otherwise miss one line after
/// another (a leaf's `starts` span five lines), and a hit among 10⁵ scattered
/// entries waits on those misses. A hint only: no effect on results.
#[inline(always)]
fn prefetch_leaf<T, const ROOM: usize>(leaf: &Leaf<T, ROOM>) {
    #[cfg(target_arch = "x86_64")]
    {
        let p = leaf.starts.as_ptr().cast::<i8>();
        let bytes = std::mem::size_of_val(&leaf.starts);
        let mut off = 0;
        // Bounded by the array's size (ROOM * 8 bytes).
        while off < bytes {
            // SAFETY: a prefetch is a hint that never faults; the address is
            // inside `leaf.starts`.
            unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.add(off)) };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = leaf;
}

/// An entry's end page and the prefix maximum of the ends up to it, side by
/// side: a hit reads both from one cache line.
#[derive(Clone, Copy, Debug, Default)]
struct EndMax {
    end: u64,
    /// Max of the ends of this entry / child and every one before it in the node.
    pmax: u64,
}

/// Recomputes the prefix maxima (`pmax`) of a node's used entries from
/// index `from` on (`from <= maxima.len()`), from the one before it (0 at
/// the start) and each entry's `end`: the one loop behind both nodes'
/// `refresh_from` and `refresh_after`.
///
/// With `stop_when_unchanged`, the caller changed the node at `from` only
/// (an entry inserted, removed or its end changed there, those after it
/// shifted as they were): the loop stops at the first prefix maximum that is
/// already right, since every one after it was computed from it and from
/// unchanged ends. Without it, every maximum from `from` on is rewritten
/// (a node just built or split, whose later maxima may be stale).
///
/// Inlined: it runs on every insert and removal (the miss path), and the
/// flag is a constant at each call site.
#[inline(always)]
fn refresh_prefix_max(maxima: &mut [EndMax], from: usize, stop_when_unchanged: bool) {
    let mut m = if from == 0 { 0 } else { maxima[from - 1].pmax };
    for e in &mut maxima[from..] {
        m = m.max(e.end);
        if stop_when_unchanged && e.pmax == m {
            return;
        }
        e.pmax = m;
    }
}

/// `repr(C)`: the count and the slots' pointer share the first cache line
/// with the first pages.
#[derive(Clone, Debug)]
#[repr(C)]
struct Leaf<T, const ROOM: usize> {
    n: usize,
    slots: Vec<Slot<T>>,
    starts: [u64; ROOM],
    ep: [EndMax; ROOM],
}

#[derive(Clone, Debug)]
#[repr(C)]
struct Inner<const ROOM: usize> {
    n: usize,
    /// Per child: a lower bound on its keys `(first page, id)` (with
    /// `lo_id`); every key of child `i` is below child `i + 1`'s bound.
    lo_start: [u64; ROOM],
    /// Per child: the largest end page in it (`em.end`) and the prefix
    /// maximum of those (`em.pmax`), and its node number (leaves if this node
    /// is at level 1, inner nodes else).
    em: [EndMax; ROOM],
    child: [u32; ROOM],
    lo_id: [u64; ROOM],
}

/// The B+-tree interval index (see module docs).
#[derive(Clone, Debug)]
//= spec.md#S1.5
pub struct IntervalIndex<T, const ROOM: usize = { FANOUT + 1 }> {
    leaves: Vec<Leaf<T, ROOM>>,
    inners: Vec<Inner<ROOM>>,
    free_leaves: Vec<u32>,
    free_inners: Vec<u32>,
    root: u32,
    /// 0: the root is a leaf.
    height: u32,
    len: usize,
    /// Most entries since the last rebuild (see module docs).
    peak: usize,
    /// Inserts ever made (never reset): while it is unchanged, a request
    /// that had no covering entry still has none, since only an insert can
    /// add one (the callers' A3 and A8 skip their lookups so).
    inserts: u64,
    /// Moves whenever a covering answer may change (see
    /// [`Self::answers_version`]).
    answers_version: u64,
    /// The highest id ever inserted.
    max_id: u64,
}

/// What [`IntervalIndex::remove_if`] did.
#[derive(Debug)]
pub enum Removal<T> {
    /// No entry has that first page and id.
    Absent,
    /// The entry is there and `take` refused it: the index is unchanged.
    Kept,
    /// The entry's slot, out of the index.
    Removed(Slot<T>),
}

impl<T, const ROOM: usize> Leaf<T, ROOM> {
    fn new() -> Self {
        Leaf { n: 0, slots: Vec::with_capacity(ROOM), starts: [0; ROOM], ep: [EndMax::default(); ROOM] }
    }

    /// Recomputes every prefix maximum from `from` on.
    fn refresh_from(&mut self, from: usize) {
        refresh_prefix_max(&mut self.ep[..self.n], from, false);
    }

    /// [`Self::refresh_from`] after a change at `from` only (an entry
    /// inserted, removed or its end changed there, those after it shifted
    /// as they were): see [`refresh_prefix_max`]'s `stop_when_unchanged`.
    fn refresh_after(&mut self, from: usize) {
        refresh_prefix_max(&mut self.ep[..self.n], from, true);
    }

    fn max_end(&self) -> u64 {
        if self.n == 0 {
            0
        } else {
            self.ep[self.n - 1].pmax
        }
    }

    fn key(&self, i: usize) -> (u64, u64) {
        (self.starts[i], self.slots[i].id)
    }
}

impl<const ROOM: usize> Inner<ROOM> {
    fn new() -> Self {
        Inner { n: 0, lo_start: [0; ROOM], em: [EndMax::default(); ROOM], child: [0; ROOM], lo_id: [0; ROOM] }
    }

    /// As [`Leaf::refresh_from`].
    fn refresh_from(&mut self, from: usize) {
        refresh_prefix_max(&mut self.em[..self.n], from, false);
    }

    /// As [`Leaf::refresh_after`]: after a change at `from` only.
    fn refresh_after(&mut self, from: usize) {
        refresh_prefix_max(&mut self.em[..self.n], from, true);
    }

    fn max_end(&self) -> u64 {
        if self.n == 0 {
            0
        } else {
            self.em[self.n - 1].pmax
        }
    }

    /// The child whose key range holds `key`: the last one whose bound is
    /// `<= key`, or the first.
    fn route(&self, key: (u64, u64)) -> usize {
        let last = self.n.saturating_sub(1);
        // The last child first: an insert in address order (a fill, or the
        // new end of a cache cycling through its buffers) goes there, and
        // the scan below would pass every child to reach it.
        if last > 0 && (self.lo_start[last], self.lo_id[last]) <= key {
            return last;
        }
        let mut i = 0;
        while i + 1 < self.n && (self.lo_start[i + 1], self.lo_id[i + 1]) <= key {
            i += 1;
        }
        i
    }

    fn insert_at(&mut self, i: usize, lo: (u64, u64), max_end: u64, child: u32) {
        let n = self.n;
        self.lo_start.copy_within(i..n, i + 1);
        self.lo_id.copy_within(i..n, i + 1);
        self.em.copy_within(i..n, i + 1);
        self.child.copy_within(i..n, i + 1);
        self.lo_start[i] = lo.0;
        self.lo_id[i] = lo.1;
        self.em[i].end = max_end;
        self.child[i] = child;
        self.n += 1;
    }

    fn remove_at(&mut self, i: usize) {
        let n = self.n;
        self.lo_start.copy_within(i + 1..n, i);
        self.lo_id.copy_within(i + 1..n, i);
        self.em.copy_within(i + 1..n, i);
        self.child.copy_within(i + 1..n, i);
        self.n -= 1;
    }
}

/// Where a node splits after an insert at `pos`: an append keeps the left
/// node full (fills in address order pack their leaves), else halves.
fn split_point(pos: usize, n: usize) -> usize {
    if pos + 1 == n {
        n - 1
    } else {
        n / 2
    }
}

impl<T, const ROOM: usize> Default for IntervalIndex<T, ROOM> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T, const ROOM: usize> IntervalIndex<T, ROOM> {
    const FAN: usize = ROOM - 1;

    pub fn new() -> Self {
        assert!(ROOM >= 4, "fanout below 3");
        IntervalIndex {
            leaves: vec![Leaf::new()],
            inners: Vec::new(),
            free_leaves: Vec::new(),
            free_inners: Vec::new(),
            root: 0,
            height: 0,
            len: 0,
            peak: 0,
            inserts: 0,
            answers_version: 0,
            max_id: 0,
        }
    }

    /// The number of inserts ever made (see the field's docs).
    pub fn inserts(&self) -> u64 {
        self.inserts
    }

    /// A number that stays the same while every *positive* answer of
    /// [`Self::covering`] stays the same: it moves on every removal, on
    /// [`Self::take_all`], and on an insert whose id is not above every id
    /// inserted before. An insert of a new highest id cannot change a
    /// positive answer (the canonical answer is the lowest covering id, and
    /// every entry it could displace is older); it may turn a miss into a
    /// hit, so misses must not be memoized. The hit memo
    /// ([`crate::hit_memo`]) keys its answers by it.
    #[inline(always)]
    pub fn answers_version(&self) -> u64 {
        self.answers_version
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Levels above the leaves.
    pub fn height(&self) -> u32 {
        self.height
    }

    fn alloc_leaf(&mut self, leaf: Leaf<T, ROOM>) -> u32 {
        match self.free_leaves.pop() {
            Some(i) => {
                self.leaves[i as usize] = leaf;
                i
            }
            None => {
                self.leaves.push(leaf);
                (self.leaves.len() - 1) as u32
            }
        }
    }

    fn alloc_inner(&mut self, inner: Inner<ROOM>) -> u32 {
        match self.free_inners.pop() {
            Some(i) => {
                self.inners[i as usize] = inner;
                i
            }
            None => {
                self.inners.push(inner);
                (self.inners.len() - 1) as u32
            }
        }
    }

    /// The largest end page of any entry (0 when empty): a request whose
    /// pages end after it has no covering entry.
    #[inline(always)]
    pub fn max_end(&self) -> u64 {
        self.node_max_end(self.root, self.height)
    }

    #[inline(always)]
    fn node_max_end(&self, node: u32, level: u32) -> u64 {
        if level == 0 {
            self.leaves[node as usize].max_end()
        } else {
            self.inners[node as usize].max_end()
        }
    }

    /// Inserts an entry. `O(B · log n)`; `O(log n)` with no search for an
    /// append (see [`Self::append`]).
    pub fn insert(&mut self, span: PageSpan, id: u64, access: Access, value: T) {
        let slot = Slot { id, access, value };
        let split = match self.append(span, id, slot) {
            Ok(()) => None,
            Err(slot) => self.insert_in(self.root, self.height, (span.first, id), span.end, slot),
        };
        if let Some((lo, max_end, node)) = split {
            let old = self.root;
            let old_max = self.node_max_end(old, self.height);
            let mut root = Inner::new();
            root.insert_at(0, (0, 0), old_max, old);
            root.insert_at(1, lo, max_end, node);
            root.refresh_from(0);
            self.root = self.alloc_inner(root);
            self.height += 1;
        }
        self.len += 1;
        self.inserts += 1;
        self.peak = self.peak.max(self.len);
        if id <= self.max_id {
            self.answers_version += 1;
        }
        self.max_id = self.max_id.max(id);
    }

    /// Appends an entry whose key `(first page, id)` is above every key in
    /// the tree to the rightmost leaf, if it has room: the common insert of
    /// a fill in address order and of a cache cycling through its buffers.
    /// The rightmost leaf is reached down the last children (no search),
    /// nothing shifts, and the only summaries that change are the end and
    /// prefix maximum of the last child on each level, which rise to the
    /// new end at most. Gives the slot back, changing nothing, when the key
    /// is not above every key or the leaf is full (a split: the general
    /// path).
    fn append(&mut self, span: PageSpan, id: u64, slot: Slot<T>) -> Result<(), Slot<T>> {
        // Down the last children to the rightmost leaf (bounded by the
        // height); it holds the largest keys.
        let mut node = self.root;
        for _ in 0..self.height {
            let inner = &self.inners[node as usize];
            node = inner.child[inner.n - 1];
        }
        let leaf = &self.leaves[node as usize];
        let n = leaf.n;
        if n >= Self::FAN || (n == 0 && self.height > 0) || (n > 0 && leaf.key(n - 1) >= (span.first, id)) {
            return Err(slot);
        }
        let leaf = &mut self.leaves[node as usize];
        leaf.starts[n] = span.first;
        let before = if n == 0 { 0 } else { leaf.ep[n - 1].pmax };
        leaf.ep[n] = EndMax { end: span.end, pmax: before.max(span.end) };
        leaf.slots.push(slot);
        leaf.n += 1;
        // The same path again, raising the last child's summaries.
        let mut node = self.root;
        for _ in 0..self.height {
            let inner = &mut self.inners[node as usize];
            let last = inner.n - 1;
            inner.em[last].end = inner.em[last].end.max(span.end);
            let before = if last == 0 { 0 } else { inner.em[last - 1].pmax };
            inner.em[last].pmax = before.max(inner.em[last].end);
            node = inner.child[last];
        }
        Ok(())
    }

    /// Inserts into the subtree at `node`; on a split, returns the new right
    /// sibling as (key bound, max end, node).
    fn insert_in(&mut self, node: u32, level: u32, key: (u64, u64), end: u64, slot: Slot<T>) -> Option<((u64, u64), u64, u32)> {
        if level == 0 {
            let leaf = &mut self.leaves[node as usize];
            let n = leaf.n;
            let mut pos = leaf.starts[..n].partition_point(|&s| s <= key.0);
            while pos > 0 && leaf.starts[pos - 1] == key.0 && leaf.slots[pos - 1].id > key.1 {
                pos -= 1;
            }
            // An append (a fill in address order, the new end of a cycle)
            // moves nothing: no call to `memmove` for zero bytes.
            if pos < n {
                leaf.starts.copy_within(pos..n, pos + 1);
                leaf.ep.copy_within(pos..n, pos + 1);
            }
            leaf.starts[pos] = key.0;
            leaf.ep[pos].end = end;
            leaf.slots.insert(pos, slot);
            leaf.n += 1;
            leaf.refresh_after(pos);
            if leaf.n <= Self::FAN {
                return None;
            }
            let n = leaf.n;
            let at = split_point(pos, n);
            let mut right = Leaf::new();
            let rn = n - at;
            right.starts[..rn].copy_from_slice(&leaf.starts[at..n]);
            right.ep[..rn].copy_from_slice(&leaf.ep[at..n]);
            right.slots.extend(leaf.slots.drain(at..));
            right.n = rn;
            leaf.n = at;
            right.refresh_from(0);
            let lo = right.key(0);
            let max_end = right.max_end();
            let r = self.alloc_leaf(right);
            return Some((lo, max_end, r));
        }
        let inner = &mut self.inners[node as usize];
        let ci = inner.route(key);
        if ci == 0 && key < (inner.lo_start[0], inner.lo_id[0]) {
            inner.lo_start[0] = key.0;
            inner.lo_id[0] = key.1;
        }
        let child = inner.child[ci];
        let split = self.insert_in(child, level - 1, key, end, slot);
        let Some((lo, max_end, new)) = split else {
            let inner = &mut self.inners[node as usize];
            if end > inner.em[ci].end {
                inner.em[ci].end = end;
                inner.refresh_after(ci);
            }
            return None;
        };
        let child_max = self.node_max_end(child, level - 1);
        let inner = &mut self.inners[node as usize];
        inner.em[ci].end = child_max;
        inner.insert_at(ci + 1, lo, max_end, new);
        inner.refresh_from(ci);
        if inner.n <= Self::FAN {
            return None;
        }
        let n = inner.n;
        let at = split_point(ci + 1, n);
        let mut right = Inner::new();
        let rn = n - at;
        right.lo_start[..rn].copy_from_slice(&inner.lo_start[at..n]);
        right.lo_id[..rn].copy_from_slice(&inner.lo_id[at..n]);
        right.em[..rn].copy_from_slice(&inner.em[at..n]);
        right.child[..rn].copy_from_slice(&inner.child[at..n]);
        right.n = rn;
        inner.n = at;
        right.refresh_from(0);
        let lo = (right.lo_start[0], right.lo_id[0]);
        let max_end = right.max_end();
        let r = self.alloc_inner(right);
        Some((lo, max_end, r))
    }

    /// The entry with this first page and id, if present. `O(log n)`: one
    /// descent by key (the eviction order's validity check, spec.md#A10).
    pub fn find(&self, first: u64, id: u64) -> Option<&Slot<T>> {
        let (mut node, mut level) = (self.root, self.height);
        // One step per level: bounded by the height.
        while level > 0 {
            let inner = &self.inners[node as usize];
            node = inner.child[inner.route((first, id))];
            level -= 1;
        }
        let leaf = &self.leaves[node as usize];
        let n = leaf.n;
        let mut pos = leaf.starts[..n].partition_point(|&s| s < first);
        while pos < n && leaf.starts[pos] == first {
            if leaf.slots[pos].id == id {
                return Some(&leaf.slots[pos]);
            }
            pos += 1;
        }
        None
    }

    /// Removes the entry with this first page and id. `O(B · log n)`
    /// (amortised: see the rebuild in the module docs).
    pub fn remove(&mut self, first: u64, id: u64) -> Option<Slot<T>> {
        match self.remove_if(first, id, |_| true) {
            Removal::Removed(slot) => Some(slot),
            Removal::Absent | Removal::Kept => None,
        }
    }

    /// Removes the entry with this first page and id if `take` accepts its
    /// slot: one descent where a [`Self::find`] followed by a
    /// [`Self::remove`] took two (A10 checks each noted victim before it
    /// evicts it). `take` runs at most once, on the entry's slot.
    ///
    /// A loop down and back up the path, not a recursion: the path is kept
    /// in a fixed array, and the climb stops at the first node whose
    /// summaries the removal left as they were (an entry that was not the
    /// largest end of its leaf, as the oldest of a cycle through buffers in
    /// address order, changes nothing above its leaf).
    pub fn remove_if(&mut self, first: u64, id: u64, take: impl FnOnce(&Slot<T>) -> bool) -> Removal<T> {
        let key = (first, id);
        if self.height as usize > MAX_HEIGHT {
            // Not reached (see MAX_HEIGHT); packed, the tree is far lower.
            self.rebuild();
        }
        let height = self.height as usize;
        debug_assert!(height <= MAX_HEIGHT, "a packed tree of height {height}");
        // Each inner node on the way down and the child taken there.
        let mut path = [(0u32, 0usize); MAX_HEIGHT];
        let mut node = self.root;
        // One step per level: bounded by the height.
        for step in path.iter_mut().take(height) {
            let inner = &self.inners[node as usize];
            let ci = inner.route(key);
            *step = (node, ci);
            node = inner.child[ci];
        }
        let leaf = &mut self.leaves[node as usize];
        let n = leaf.n;
        let mut pos = leaf.starts[..n].partition_point(|&s| s < first);
        while pos < n && leaf.starts[pos] == first && leaf.slots[pos].id != id {
            pos += 1;
        }
        if pos == n || leaf.starts[pos] != first {
            return Removal::Absent;
        }
        if !take(&leaf.slots[pos]) {
            return Removal::Kept;
        }
        leaf.starts.copy_within(pos + 1..n, pos);
        leaf.ep.copy_within(pos + 1..n, pos);
        let slot = leaf.slots.remove(pos);
        leaf.n -= 1;
        leaf.refresh_after(pos);
        let (mut empty, mut max_end, mut child) = (leaf.n == 0, leaf.max_end(), node);
        // Back up the path (bounded by the height): a parent drops an
        // emptied child or takes its child's new largest end.
        for level in (0..height).rev() {
            let (parent, ci) = path[level];
            let inner = &mut self.inners[parent as usize];
            if empty {
                inner.remove_at(ci);
                if level + 1 == height {
                    self.free_leaves.push(child);
                } else {
                    self.free_inners.push(child);
                }
            } else if inner.em[ci].end == max_end {
                // This node's summaries stand, so do those above it.
                break;
            } else {
                inner.em[ci].end = max_end;
            }
            let inner = &mut self.inners[parent as usize];
            inner.refresh_after(ci);
            (empty, max_end, child) = (inner.n == 0, inner.max_end(), parent);
        }
        self.answers_version += 1;
        self.len -= 1;
        if self.len == 0 {
            self.reset();
        } else {
            while self.height > 0 && self.inners[self.root as usize].n == 1 {
                let old = self.root;
                self.root = self.inners[old as usize].child[0];
                self.free_inners.push(old);
                self.height -= 1;
            }
            if self.len * 4 < self.peak && self.peak > 4 * Self::FAN {
                self.rebuild();
            }
        }
        Removal::Removed(slot)
    }

    fn reset(&mut self) {
        self.leaves.clear();
        self.leaves.push(Leaf::new());
        self.inners.clear();
        self.free_leaves.clear();
        self.free_inners.clear();
        self.root = 0;
        self.height = 0;
        self.len = 0;
        self.peak = 0;
    }

    /// Leaves in key order.
    fn leaf_order(&self) -> Vec<u32> {
        let mut out = Vec::new();
        let mut stack = vec![(self.root, self.height)];
        while let Some((node, level)) = stack.pop() {
            if level == 0 {
                out.push(node);
                continue;
            }
            let inner = &self.inners[node as usize];
            for i in (0..inner.n).rev() {
                stack.push((inner.child[i], level - 1));
            }
        }
        out
    }

    /// Every entry as `(span, slot)`, in `(first, id)` order, leaving the
    /// tree empty.
    fn drain_sorted(&mut self) -> Vec<(PageSpan, Slot<T>)> {
        let mut out = Vec::with_capacity(self.len);
        for l in self.leaf_order() {
            let leaf = &mut self.leaves[l as usize];
            let (starts, ep) = (leaf.starts, leaf.ep);
            let spans = starts.into_iter().zip(ep).map(|(first, e)| PageSpan { first, end: e.end });
            out.extend(spans.zip(std::mem::take(&mut leaf.slots)));
        }
        self.reset();
        out
    }

    /// Packs the tree again (see module docs).
    fn rebuild(&mut self) {
        let all = self.drain_sorted();
        self.bulk_load(all);
    }

    /// Builds the tree from entries sorted by `(first, id)`, nodes 3/4 full.
    fn bulk_load(&mut self, items: Vec<(PageSpan, Slot<T>)>) {
        self.reset();
        let n = items.len();
        if n == 0 {
            return;
        }
        let per = (Self::FAN * 3 / 4).max(2);
        self.leaves.clear();
        let mut level: Vec<((u64, u64), u64, u32)> = Vec::with_capacity(n / per + 1);
        let mut it = items.into_iter().peekable();
        while it.peek().is_some() {
            let mut leaf = Leaf::new();
            for (span, slot) in it.by_ref().take(per) {
                let i = leaf.n;
                leaf.starts[i] = span.first;
                leaf.ep[i].end = span.end;
                leaf.slots.push(slot);
                leaf.n += 1;
            }
            leaf.refresh_from(0);
            level.push((leaf.key(0), leaf.max_end(), self.leaves.len() as u32));
            self.leaves.push(leaf);
        }
        let mut height = 0;
        while level.len() > 1 {
            let mut next = Vec::with_capacity(level.len() / per + 1);
            for group in level.chunks(per) {
                let mut inner = Inner::new();
                for (i, &(lo, max_end, child)) in group.iter().enumerate() {
                    inner.insert_at(i, lo, max_end, child);
                }
                inner.refresh_from(0);
                next.push((group[0].0, inner.max_end(), self.inners.len() as u32));
                self.inners.push(inner);
            }
            level = next;
            height += 1;
        }
        self.root = level[0].2;
        self.height = height;
        self.len = n;
        self.peak = n;
    }

    /// Removes every entry, in `(first, id)` order.
    pub fn take_all(&mut self) -> Vec<(PageSpan, Slot<T>)> {
        self.answers_version += 1;
        self.drain_sorted()
    }

    /// Kept for the callers: the summaries are never stale.
    #[inline(always)]
    pub fn refresh(&mut self) {}

    /// Calls `f(span, slot)` in descending `(first, id)` order for every
    /// entry with `first <= max_start` and `end >= min_end`.
    #[inline]
    fn visit<'a>(&'a self, max_start: u64, min_end: u64, f: &mut impl FnMut(PageSpan, &'a Slot<T>)) {
        self.visit_in(self.root, self.height, max_start, min_end, f)
    }

    fn visit_in<'a>(&'a self, node: u32, level: u32, max_start: u64, min_end: u64, f: &mut impl FnMut(PageSpan, &'a Slot<T>)) {
        if level == 0 {
            let leaf = &self.leaves[node as usize];
            let mut i = leaf.starts[..leaf.n].partition_point(|&s| s <= max_start);
            while i > 0 && leaf.ep[i - 1].pmax >= min_end {
                i -= 1;
                if leaf.ep[i].end >= min_end {
                    f(PageSpan { first: leaf.starts[i], end: leaf.ep[i].end }, &leaf.slots[i]);
                }
            }
            return;
        }
        let inner = &self.inners[node as usize];
        let mut i = inner.lo_start[..inner.n].partition_point(|&s| s <= max_start);
        while i > 0 && inner.em[i - 1].pmax >= min_end {
            i -= 1;
            if inner.em[i].end >= min_end {
                self.visit_in(inner.child[i], level - 1, max_start, min_end, f);
            }
        }
    }

    /// The canonical covering entry: lowest id among entries whose span
    /// contains `span` and whose access suffices for `access` (spec.md#S2.1).
    ///
    /// Inlined up to one check: a request whose pages end past every
    /// entry's end (a fill in address order, a buffer pool cycling onwards)
    /// has no covering entry, and the search's call is skipped too.
    #[inline(always)]
    pub fn covering(&self, span: PageSpan, access: Access) -> Option<&Slot<T>> {
        if span.end > self.max_end() {
            return None;
        }
        self.covering_search(span, access)
    }

    /// [`Self::covering`] when an entry may reach the request's end.
    #[inline(never)]
    fn covering_search(&self, span: PageSpan, access: Access) -> Option<&Slot<T>> {
        // The usual case, one loop: a single descent while, at every node,
        // only the last candidate child (or entry) can reach `span.end`.
        let (f, g) = (span.first, span.end);
        let (mut node, mut level) = (self.root as usize, self.height);
        while level > 0 {
            let inner = &self.inners[node];
            let c = match inner.lo_start[..inner.n].partition_point(|&s| s <= f) {
                0 => return None,
                i => i - 1,
            };
            if c > 0 && inner.em[c - 1].pmax >= g {
                return self.covering_walk(span, access);
            }
            if inner.em[c].end < g {
                return None;
            }
            node = inner.child[c] as usize;
            if level == 1 {
                prefetch_leaf(&self.leaves[node]);
            }
            level -= 1;
        }
        let leaf = &self.leaves[node];
        let c = match leaf.starts[..leaf.n].partition_point(|&s| s <= f) {
            0 => return None,
            i => i - 1,
        };
        // No entry of an earlier leaf reaches `g` (the descent checked every
        // earlier sibling's prefix maximum), so the covering entries are
        // among this leaf's candidates `0..=c`: walk them backwards while
        // the prefix maximum before them still reaches `g` (overlapping
        // entries, e.g. 16 KiB at an 8 KiB stride), keeping the lowest id.
        // Bounded by the leaf: O(B), no second descent.
        let mut best: Option<&Slot<T>> = None;
        let mut j = c;
        loop {
            let s = &leaf.slots[j];
            if leaf.ep[j].end >= g && s.access.suffices_for(access) && best.is_none_or(|b| s.id < b.id) {
                best = Some(s);
            }
            if j == 0 || leaf.ep[j - 1].pmax < g {
                return best;
            }
            j -= 1;
        }
    }

    /// [`Self::covering`] when several entries may cover: the full walk.
    #[inline(never)]
    fn covering_walk(&self, span: PageSpan, access: Access) -> Option<&Slot<T>> {
        let mut best: Option<&Slot<T>> = None;
        self.visit(span.first, span.end, &mut |_, s| {
            if s.access.suffices_for(access) && best.is_none_or(|b| s.id < b.id) {
                best = Some(s);
            }
        });
        best
    }

    /// Every entry sharing at least one page with `span`, as `(span, slot)`,
    /// in `(first, id)` order.
    pub fn overlapping(&self, span: PageSpan) -> Vec<(PageSpan, &Slot<T>)> {
        let mut out = Vec::new();
        if span.end == 0 {
            return out;
        }
        self.visit(span.end - 1, span.first.saturating_add(1), &mut |entry, s| {
            out.push((entry, s));
        });
        out.reverse();
        out
    }

    /// Every entry, in `(first, id)` order.
    pub fn iter(&self) -> impl Iterator<Item = (PageSpan, &Slot<T>)> {
        self.leaf_order().into_iter().flat_map(move |l| {
            let leaf = &self.leaves[l as usize];
            (0..leaf.n).map(move |i| (PageSpan { first: leaf.starts[i], end: leaf.ep[i].end }, &leaf.slots[i]))
        })
    }
}

#[cfg(test)]
impl<T, const ROOM: usize> IntervalIndex<T, ROOM> {
    /// Checks the module's "no summary is ever stale": every node's ends and
    /// prefix maxima are exact (not only upper bounds, which would answer
    /// every query right but prune less). Returns the subtree's largest end.
    fn check_summaries(&self, node: u32, level: u32) -> Result<u64, String> {
        let check = |ep: &[EndMax]| -> Result<u64, String> {
            let mut m = 0;
            for (i, e) in ep.iter().enumerate() {
                m = m.max(e.end);
                if e.pmax != m {
                    return Err(format!("node {node} level {level}: pmax[{i}] {} != {m}", e.pmax));
                }
            }
            Ok(m)
        };
        if level == 0 {
            let leaf = &self.leaves[node as usize];
            return check(&leaf.ep[..leaf.n]);
        }
        let inner = &self.inners[node as usize];
        for i in 0..inner.n {
            let below = self.check_summaries(inner.child[i], level - 1)?;
            if inner.em[i].end != below {
                return Err(format!("node {node} level {level}: child {i} end {} != {below}", inner.em[i].end));
            }
        }
        check(&inner.em[..inner.n])
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
        /// An insert at the largest first page so far plus a gap (0: the
        /// same first page, a higher id): the index's append path.
        Append(u64, u64, u8),
        Remove(usize),
        Refresh,
        Cover(u64, u64, u8),
        Overlap(u64, u64),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0u64..200, 1u64..40, 0u8..16).prop_map(|(f, l, a)| Step::Insert(f, f + l, a)),
            3 => (0u64..3, 1u64..40, 0u8..16).prop_map(|(g, l, a)| Step::Append(g, l, a)),
            2 => any::<usize>().prop_map(Step::Remove),
            1 => Just(Step::Refresh),
            3 => (0u64..220, 1u64..20, 0u8..16).prop_map(|(f, l, a)| Step::Cover(f, f + l, a)),
            3 => (0u64..220, 1u64..20).prop_map(|(f, l)| Step::Overlap(f, f + l)),
        ]
    }

    /// Runs `steps` against an index of fanout `ROOM - 1` and a brute-force
    /// list; panics on the first disagreement.
    fn check_against_brute_force<const ROOM: usize>(steps: &[Step]) -> Result<(), TestCaseError> {
        let mut idx: IntervalIndex<u64, ROOM> = IntervalIndex::new();
        let mut naive: Vec<(PageSpan, u64, Access)> = Vec::new();
        let mut next_id = 1;
        for s in steps.iter().cloned() {
            match s {
                Step::Insert(f, e, a) => {
                    let acc = Access::from_bits(a).unwrap();
                    idx.insert(sp(f, e), next_id, acc, next_id * 10);
                    naive.push((sp(f, e), next_id, acc));
                    next_id += 1;
                }
                Step::Append(gap, l, a) => {
                    let acc = Access::from_bits(a).unwrap();
                    let f = naive.iter().map(|x| x.0.first).max().unwrap_or(0) + gap;
                    idx.insert(sp(f, f + l), next_id, acc, next_id * 10);
                    naive.push((sp(f, f + l), next_id, acc));
                    next_id += 1;
                }
                Step::Remove(k) => {
                    if !naive.is_empty() {
                        let (span, id, _) = naive.remove(k % naive.len());
                        // A refusal changes nothing; `take` sees the entry's slot.
                        let mut seen = None;
                        let refused = idx.remove_if(span.first, id, |s| {
                            seen = Some(s.value);
                            false
                        });
                        prop_assert!(matches!(refused, Removal::Kept));
                        prop_assert_eq!(seen, Some(id * 10));
                        prop_assert_eq!(idx.len(), naive.len() + 1);
                        let slot = if k % 2 == 0 {
                            idx.remove(span.first, id)
                        } else {
                            match idx.remove_if(span.first, id, |_| true) {
                                Removal::Removed(slot) => Some(slot),
                                Removal::Absent | Removal::Kept => None,
                            }
                        };
                        prop_assert_eq!(slot.map(|s| s.value), Some(id * 10));
                        prop_assert!(idx.remove(span.first, id).is_none());
                        prop_assert!(matches!(idx.remove_if(span.first, id, |_| true), Removal::Absent));
                    }
                }
                Step::Refresh => idx.refresh(),
                Step::Cover(f, e, a) => {
                    let acc = Access::from_bits(a).unwrap();
                    let want = naive.iter().filter(|(s, _, ac)| s.contains(&sp(f, e)) && ac.suffices_for(acc)).map(|x| x.1).min();
                    prop_assert_eq!(idx.covering(sp(f, e), acc).map(|s| s.id), want);
                }
                Step::Overlap(f, e) => {
                    let mut want: Vec<(u64, u64)> =
                        naive.iter().filter(|(s, _, _)| s.overlaps(&sp(f, e))).map(|x| (x.0.first, x.1)).collect();
                    let got: Vec<(u64, u64)> = idx.overlapping(sp(f, e)).iter().map(|(s, slot)| (s.first, slot.id)).collect();
                    want.sort();
                    // In (first, id) order.
                    prop_assert_eq!(got, want);
                }
            }
            prop_assert_eq!(idx.len(), naive.len());
            let max = idx.check_summaries(idx.root, idx.height).map_err(TestCaseError::fail)?;
            prop_assert_eq!(max, naive.iter().map(|x| x.0.end).max().unwrap_or(0));
            prop_assert_eq!(idx.max_end(), max);
        }
        // Sorted by (first, id), and every entry there.
        let keys: Vec<(u64, u64)> = idx.iter().map(|(s, slot)| (s.first, slot.id)).collect();
        let mut want: Vec<(u64, u64)> = naive.iter().map(|x| (x.0.first, x.1)).collect();
        want.sort();
        prop_assert_eq!(&keys, &want);
        let all: Vec<(u64, u64)> = idx.take_all().iter().map(|(s, slot)| (s.first, slot.id)).collect();
        prop_assert_eq!(all, want);
        prop_assert!(idx.is_empty());
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// The index agrees with a brute-force list, at the default fanout and
        /// at fanout 3 (deep trees: splits at every level, empty nodes
        /// unlinked, root collapses and rebuilds).
        #[test]
        fn matches_brute_force(steps in proptest::collection::vec(step(), 1..400)) {
            check_against_brute_force::<{ FANOUT + 1 }>(&steps)?;
            check_against_brute_force::<4>(&steps)?;
            check_against_brute_force::<5>(&steps)?;
        }

        /// Long histories at fanout 3: many splits, then mostly removals
        /// (rebuilds), then inserts again.
        #[test]
        fn deep_trees_match_brute_force(
            grow in proptest::collection::vec((0u64..2000, 1u64..60, 0u8..16).prop_map(|(f, l, a)| Step::Insert(f, f + l, a)), 100..600),
            shrink in proptest::collection::vec(any::<usize>().prop_map(Step::Remove), 50..600),
            mixed in proptest::collection::vec(step(), 1..300),
        ) {
            let steps: Vec<Step> = grow.into_iter().chain(shrink).chain(mixed).collect();
            check_against_brute_force::<4>(&steps)?;
            check_against_brute_force::<{ FANOUT + 1 }>(&steps)?;
        }
    }

    #[test]
    fn appends_pack_the_leaves() {
        let mut idx: IntervalIndex<()> = IntervalIndex::new();
        for i in 0..100_000u64 {
            idx.insert(sp(i * 2, i * 2 + 2), i + 1, Access::LOCAL_READ, ());
        }
        // Full leaves: 100,000 / 32 = 3,125 leaves; three levels above them.
        assert_eq!(idx.height(), 3);
        assert!(idx.leaves.len() <= 3_126, "{} leaves", idx.leaves.len());
        assert_eq!(idx.covering(sp(2 * 77_777, 2 * 77_777 + 1), Access::LOCAL_READ).unwrap().id, 77_778);
        for i in 0..99_990u64 {
            idx.remove(i * 2, i + 1).unwrap();
        }
        assert_eq!(idx.len(), 10);
        assert!(idx.height() <= 1, "rebuilt");
        assert_eq!(idx.covering(sp(2 * 99_995, 2 * 99_995 + 1), Access::LOCAL_READ).unwrap().id, 99_996);
    }

    #[test]
    fn large_index_uses_the_tree() {
        let mut idx: IntervalIndex<()> = IntervalIndex::new();
        for i in 0..1000u64 {
            idx.insert(sp(i * 2, i * 2 + 1), i + 1, Access::LOCAL_READ, ());
        }
        idx.insert(sp(0, 5000), 5000, Access::REMOTE_READ, ());
        assert!(idx.height() >= 1);
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
