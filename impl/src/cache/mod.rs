//! The registration cache: spec.md §A, step by step.
//!
//! # Shared state (spec.md#A)
//!
//! - the cache **lock**: a reader-writer lock over `Locked` (the index of
//!   findable entries, the in-flight records, the bytes of findable entries).
//!   Shared for the hit path (A1), exclusive for everything that changes the
//!   index (A2–A11, R2, H2, M2, flush);
//! - the **index** ([`crate::index::IntervalIndex`]) of findable entries;
//! - the **in-flight** list: one record (planned span, *stale* flag) per
//!   registration in progress, marked stale by every release event applied
//!   while the registrar runs without the lock (A4–A7, S3.7);
//! - the **release windows** (`window::Windows`, spec.md#W1–W3): a multiset
//!   of the page spans `release_begin` opened and `release_end` has not
//!   closed yet, behind a leaf mutex; A4 marks an in-flight record planned
//!   inside one *windowed*, and such a registration is never cached;
//! - the **invalidation queue** ([`InvalidationQueue`]): release events pushed
//!   by hooks that could not take the lock (H1, H2);
//! - per entry, the **state word** ([`EntryState`]: lease count, INVALID,
//!   PENDING and an incarnation) and the LRU / GreedyDual-Size stamps, all
//!   atomics, so the hit path needs the lock shared at most (A1), and
//!   without limits not at all (A0: a compare-exchange on the state word of
//!   the entry the hit memo names);
//! - the **gate** (`gate`, spec.md#M6): with the process's userfaultfd
//!   monitor, the event clock value this cache has applied; a hit needs it
//!   current (A0, LN1, A1 check it first), so the monitor's reader never
//!   takes this lock;
//! - the **over-limit flag** (R2);
//! - with limits, the **eviction order** (`evict_order`): a lazy min-heap
//!   of victim candidates in policy order, under the lock exclusive, so that
//!   A6 / R2 note only the least unleased entries that cover the excess and
//!   A10 evicts them without scanning the index (spec.md#A6 allows the
//!   shorter note; debug builds check each victim against the full note).
//!
//! The registrar is never called with the lock held. Every deregistration is
//! collected in a per-operation dereg list and performed after the lock is
//! released, or by the thread whose release dropped the last lease of an
//! invalidated entry (R1), which needs no lock at all.
//!
//! # Entry ownership
//!
//! An entry lives in its generation's pool (`entry_pool`), whose memory is
//! never freed before the generation: a raw pointer to it stays readable,
//! and A0 reads the state word of an entry it holds no lease on (the pool
//! never overwrites a state word but with a new incarnation). While
//! findable it is reachable from the index; each lease holds the raw pointer.
//! Whoever wins the handoff of spec.md#A-H — the invalidation that saw a lease
//! count of 0, or the release that took the count from 1 to 0 with INVALID
//! set — deregisters its handle and frees it, exactly once. Leases never
//! clone an `Arc`: an A0 hit is one compare-exchange on the state word, an
//! A1 hit one shared lock, one `fetch_add` and one unlock; a release is one
//! `fetch_sub`.
//!
//! # Lanes (spec.md#LN1)
//!
//! The usual hit skips even that: each thread memoizes its A1 hits in its own
//! lane (module `lanes`), and a repeated acquire of the same key is served there
//! with plain stores and loads and a compiler fence. A lane lease is counted
//! in its slot, not in the state word. Every removal from the index first
//! revokes the entry's memos (membarrier), turning a slot still counting
//! leases into one state-word lease (a pin), so the handoff above is unchanged.
//!
//! # Fork (spec.md#F1, S2.6)
//!
//! Everything an operation touches besides the registrar and the counters
//! lives in a `Generation` *generation* behind an atomic pointer. Each
//! operation first compares the process's fork generation (bumped by a
//! `pthread_atfork` child handler that only increments an atomic: it takes no
//! lock and does no work) and, on slow paths, the pid, with the cache's. In a
//! forked child the cache installs a fresh, empty generation and **leaks the
//! old one**: the old index, entries and registrar handles are never dropped
//! and never deregistered (deregistering through a registrar fd shared with
//! the parent would destroy the parent's registrations), and the old lock,
//! which a thread that does not exist in the child may hold, is never taken
//! again. Leases from the old generation are released as no-ops. The event
//! source (the monitor) belongs to a generation too: the old one's watches
//! the parent's memory and stays with it, and a child whose parent read a
//! monitor caches nothing until it installs its own (`Generation::caching`).
//! [`Cache::simulate_fork`] does the same on request, for replaying `Op::Fork`.
//!
//! # Layers
//!
//! The files of this module form layers, bottom to top. **No file imports
//! from a layer above its own** (`use super::x`, `super::x::..`,
//! `crate::cache::x`); a `Cache` method that needs a higher layer lives in
//! that layer's file (an `impl Cache` block may sit in any of them). The unit
//! test `layers::no_file_imports_from_a_higher_layer` (in this file) checks
//! every file against the table; a new file must be added to it.
//!
//! | Layer | Modules | What each owns |
//! |---|---|---|
//! | 1. plain data | `entry_state` | [`EntryState`]: an entry's lease count and INVALID flag |
//! | | `entry` | `Entry`, `EntryPtr`: the one conversion of an entry pointer into a reference (`indexed`) |
//! | | `queue` | [`InvalidationQueue`] (H1, H2) |
//! | | `window` | the release windows (W1–W3) |
//! | | `evict_order` | the lazy min-heap of victim candidates |
//! | | `counters` | the slow-path counters and the striped hot counters |
//! | | `config` | [`CacheConfig`], [`Monitoring`], the fault switches, [`LANE_SLOTS`] |
//! | | `source` | the event source: [`EventSource`], [`ReleaseEvent`], [`Watched`] |
//! | | `gate` | the event gate (M6): the process's event clock, and what a generation has applied of it |
//! | 2. lanes, the OS, entry memory | `os` | the system calls: `membarrier`, `pthread_atfork` and the `MADV_WIPEONFORK` page, the fork generation |
//! | | `lanes` (`barriers`, `claims`, `slots`, `protocol`) | a lane's slots and claims and the owner's side of LN1–LN3 |
//! | | `entry_pool` | entry memory: blocks carved by A9, given back by deregistrations to a push-only list |
//! | 3. the generation | `generation` | `Generation` (one generation) and `Locked` (its locked part), the write guard, `answered` |
//! | | `fork` | the cache's fork check (F1) and the installing of a fresh generation (S2.6) |
//! | | `Cache` (this file) | the cache's fields, construction, the freeing of its generations (the end of `Drop`), and the error and hot-path counts |
//! | 4. leases and deregistration | `lease` | [`Lease`], [`OwnedLease`], [`SharedCache`], `leased` |
//! | | `dereg` | the dereg list (A11: collected, then performed) and the freeing of an entry (A-H) |
//! | 5. the §A step groups | `acquire`, `release`, `events`, `evict`, `lane_steps` | A1–A11; R1, R2; H1, H2, M2, W1–W3, A11's post-unlock drain (`DeregList::finish` and the list's `Drop`); A6, A10, flush, trim, the cache's `Drop`; LN1, LN3–LN5 |
//! | 6. reports | `stats` | [`Diagnostics`], `stats()`, `cached_views()` |
//!
//! This file itself only declares and re-exports the modules (and defines
//! `Cache`, counted as layer 3).
//!
//! Calls go downward too: no code calls a method of a higher layer. Where a
//! lower layer's type ends with a higher layer's step, that method or `Drop`
//! impl lives in the higher layer's file (an `impl` block may sit in any
//! file of the crate): the dereg list (layer 4) ends with A11's post-unlock
//! drain, so `DeregList::finish` and its `Drop` are in `events`; the cache
//! (layer 3) is dropped with a flush, so its `Drop` is in `evict`. Like
//! `WriteGuard::unlock`, `finish` is called explicitly; the list's `Drop`
//! repeats its work only to stay safe and debug-asserts that it was
//! unwinding.
//!
//! # Sequential equivalence with the model
//!
//! For any sequential sequence of operations the cache returns the `Ret`s of
//! `mrcache_model::Model::step` and the same [`Stats`](mrcache_types::Stats): the same canonical hit
//! (lowest covering id), the same overlap plan (S6.1), ids in creation order
//! of cached registrations (registrations discarded by A7/A8 get none), the
//! same LRU / GreedyDual-Size victims (one logical clock ticked by every use;
//! ties by id), the same pressure handling (S5.4: the plan is recomputed
//! after the pressure eviction, as the model plans after evicting).

// Layer 1: plain data.
mod config;
mod counters;
mod entry;
mod entry_state;
mod evict_order;
mod gate;
mod queue;
mod source;
mod window;
// Layer 2: lane slots and claims, the system calls, entry memory.
mod entry_pool;
mod lanes;
mod os;
// Layer 3: the generation.
mod fork;
mod generation;
// Layer 4: leases and deregistration.
mod dereg;
mod lease;
// Layer 5: the step groups of spec.md §A.
mod acquire;
mod events;
mod evict;
mod lane_steps;
mod release;
// Layer 6: reports.
mod stats;

#[cfg(any(test, feature = "faults"))]
pub use config::Faults;
pub use config::{CacheConfig, Monitoring, DEFAULT_MAX_RETRIES, DEFAULT_MAX_UNRELEASED, LANE_SLOTS};
pub use entry_state::{EntryState, Invalidated, Released};
pub use events::{RoundDeregs, RoundLock};
pub use gate::{reading as clock_reading, EVENT_CLOCK};
pub use lanes::{uses_membarrier, MAX_LANES};
pub use lease::{Lease, OwnedLease, SharedCache};
pub use os::{fork_generation, forking_thread};
pub use queue::{InvalidationQueue, Pushed, MAX_QUEUE_CAPACITY};
pub use source::{EventSource, ReleaseEvent, Watched};
pub use stats::Diagnostics;
/// The hit counters, for their loom model (`impl/tests/loom.rs`).
#[cfg(loom)]
pub mod hot_counters {
    pub use super::counters::{CounterMutant, Hot, HotCounters, TOKEN_SLOTS};
}
pub(crate) use generation::Generation;

use self::counters::{inc, Hot};
use self::counters::{Counters, HotCounters};
use crate::error::Error;
use crate::registrar::Registrar;
use crate::sync::{plain, Ordering};

/// A memory-registration cache implementing spec.md §A. `Send + Sync`; share
/// it by reference, in an `Arc`, or in a [`SharedCache`] handle (which hands
/// out [`OwnedLease`]s, leases that do not borrow it).
///
/// A cache needs a monitor to stay fresh: a [`crate::MonitorThread`], or
/// [`Cache::invalidate`] (or [`Cache::release_begin`] / [`Cache::release_end`])
/// called on every release of memory it may hold (the crate docs show both).
///
/// ```
/// use mrcache::registrar::counting::CountingRegistrar;
/// use mrcache::types::{Access, ReleaseKind};
/// use mrcache::{Cache, CacheConfig};
///
/// # fn main() -> Result<(), mrcache::Error> {
/// let cache = Cache::new(CountingRegistrar::default(), CacheConfig::explicit());
/// let buf = vec![1u8; 4096];
/// let lease = cache.acquire_slice(&buf, Access::LOCAL_WRITE)?; // a miss: registers
/// let view = lease.view(); // what was registered: id, addr, len, access
/// assert!(view.addr <= buf.as_ptr() as u64 && view.len >= 4096);
/// drop(lease);
/// // This program's own memory hook: the buffer goes back to the system.
/// cache.invalidate(buf.as_ptr() as u64, 4096, ReleaseKind::Munmap)?;
/// assert_eq!(cache.stats().invalidations, 1);
/// # Ok(())
/// # }
/// ```
pub struct Cache<R: Registrar> {
    registrar: R,
    config: CacheConfig,
    page_size: u64,
    chunk_pages: u64,
    limits_active: bool,
    /// [`CacheConfig::lanes`].
    lanes_on: bool,
    /// spec.md#L2 bound on the invalidation queue.
    queue_capacity: usize,
    /// The current generation; never null; freed in `Drop` (old ones leak).
    shared: plain::AtomicPtr<Generation<R>>,
    forks_seen: plain::AtomicU64,
    pid: plain::AtomicU32,
    forgetting: plain::AtomicBool,
    /// Generations replaced by [`Cache::simulate_fork`] (same process): unlike
    /// a real child's, they are freed in `Drop`, with their monitor (whose fd
    /// would otherwise stay open, and a later munmap of watched memory wait
    /// forever for a reader).
    replayed: std::sync::Mutex<Vec<usize>>,
    /// Logical clock of uses (LRU) and GreedyDual-Size inflation value.
    clock: plain::AtomicU64,
    gds_floor: plain::AtomicU64,
    next_id: plain::AtomicU64,
    counters: Counters,
    hot: HotCounters,
    /// Page hull `[lo, hi)` of every registration ever planned (A4): a
    /// release event outside it cannot concern the cache. Only grows.
    hull_lo: plain::AtomicU64,
    hull_hi: plain::AtomicU64,
}

impl<R: Registrar> std::fmt::Debug for Cache<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("registrar", &self.registrar.name())
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish()
    }
}

impl<R: Registrar> Cache<R> {
    /// Creates a cache.
    ///
    /// # Panics
    ///
    /// If the configuration is invalid (see [`Cache::try_new`]).
    pub fn new(registrar: R, config: impl Into<CacheConfig>) -> Self {
        match Self::try_new(registrar, config) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    /// Creates a cache; fails if [`CacheConfig::validate`] does.
    pub fn try_new(registrar: R, config: impl Into<CacheConfig>) -> Result<Self, Error> {
        let config = config.into();
        config.validate()?;
        os::install();
        lanes::init_barriers();
        let l = &config.contract.limits;
        let max_unreleased = l.max_unreleased.unwrap_or(DEFAULT_MAX_UNRELEASED);
        let queue_capacity = usize::try_from(max_unreleased).unwrap_or(usize::MAX).clamp(1, MAX_QUEUE_CAPACITY);
        Ok(Cache {
            registrar,
            page_size: config.contract.page_size,
            chunk_pages: config.contract.chunk_pages.max(1),
            limits_active: l.max_regions.is_some() || l.max_pinned_bytes.is_some(),
            lanes_on: config.lanes,
            queue_capacity,
            config,
            shared: plain::AtomicPtr::new(Box::into_raw(Box::new(Generation::new(queue_capacity, config.lane_slots, false)))),
            forks_seen: plain::AtomicU64::new(os::fork_generation()),
            pid: plain::AtomicU32::new(std::process::id()),
            forgetting: plain::AtomicBool::new(false),
            replayed: std::sync::Mutex::new(Vec::new()),
            clock: plain::AtomicU64::new(0),
            gds_floor: plain::AtomicU64::new(0),
            next_id: plain::AtomicU64::new(1),
            hull_lo: plain::AtomicU64::new(u64::MAX),
            hull_hi: plain::AtomicU64::new(0),
            counters: Counters::default(),
            hot: HotCounters::new(),
        })
    }

    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    pub fn registrar(&self) -> &R {
        &self.registrar
    }

    /// Counts a failed operation and passes its error through.
    pub(super) fn fail(&self, e: Error) -> Error {
        inc(&self.counters.errors);
        e
    }

    /// Counts a failed op the harness rejects itself (E3, E4).
    #[doc(hidden)]
    pub fn count_error(&self) {
        let _ = self.shared();
        inc(&self.counters.errors);
    }

    pub(crate) fn count_release(&self) {
        let _ = self.shared();
        self.hot.bump(Hot::Releases);
    }

    /// Counts a release of a lease that is not held: E4, which changes nothing
    /// but the counters (spec.md#S2: a release call and an error). The typed
    /// Rust API cannot express it; a handle-based one (the C API's stale or
    /// double-released handles) can.
    pub fn count_unknown_release(&self) {
        self.count_release();
        self.count_error();
    }

    /// Counts an acquire the harness rejects itself (E3: its lease is held).
    #[doc(hidden)]
    pub fn count_acquire(&self) {
        let _ = self.shared();
        self.hot.bump(Hot::Acquires);
    }

    /// Installs the asynchronous monitor that A2, A6 and [`Cache::drain_with`]
    /// read under the exclusive lock. Only one per process; later calls return
    /// the source. A forked child starts without one and caches nothing until
    /// it installs its own (spec.md#S2.6): the parent's monitor neither sees
    /// the child's releases nor may be read by it.
    pub fn set_event_source(&self, source: Box<dyn EventSource>) -> Result<(), Box<dyn EventSource>> {
        self.shared_slow().install_source(source)
    }
}

impl<R: Registrar> Cache<R> {
    /// The end of the cache's `Drop` (in `evict`, layer 5, after the flush
    /// it starts with): frees the current generation and those a replayed
    /// fork replaced. Call once, from `Drop` only.
    fn free_generations(&mut self) {
        let p = self.shared.swap(std::ptr::null_mut(), Ordering::AcqRel);
        // SAFETY: the current generation, created by Box::into_raw; no lease
        // can outlive the cache, so nothing refers to it any more.
        drop(unsafe { Box::from_raw(p) });
        // The generations a replayed fork replaced, newest first (a newer one
        // may read an older one's monitor). Same process: no fork happened,
        // and no lease outlives the cache.
        let replayed = std::mem::take(&mut *self.replayed.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        if std::process::id() == self.pid.load(Ordering::Acquire) {
            for g in replayed.into_iter().rev() {
                // SAFETY: created by Box::into_raw, swapped out by
                // `simulate_fork` and referred to by nothing any more.
                drop(unsafe { Box::from_raw(g as *mut Generation<R>) });
            }
        }
    }
}

/// The layer rule of the module docs ("Layers"), checked on the source.
#[cfg(all(test, not(loom)))]
mod layers {
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};

    /// Each module's layer (a file under `lanes/` belongs to `lanes`).
    /// `Cache` is defined in `mod.rs`.
    const LAYERS: &[(&str, u8)] = &[
        ("entry_state", 1),
        ("entry", 1),
        ("queue", 1),
        ("window", 1),
        ("evict_order", 1),
        ("counters", 1),
        ("config", 1),
        ("source", 1),
        ("gate", 1),
        ("os", 2),
        ("lanes", 2),
        ("entry_pool", 2),
        ("generation", 3),
        ("fork", 3),
        ("Cache", 3),
        ("lease", 4),
        ("dereg", 4),
        ("acquire", 5),
        ("release", 5),
        ("events", 5),
        ("evict", 5),
        ("lane_steps", 5),
        ("stats", 6),
    ];

    /// Items whose layer is not their module's (none).
    const ITEM_LAYERS: &[(&str, &str, u8)] = &[];

    fn files(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    /// The code of a file: no comment lines, nothing from `mod tests {` on.
    fn code(text: &str) -> String {
        let mut out = String::new();
        for line in text.lines() {
            if line.starts_with("mod tests {") {
                break;
            }
            if !line.trim_start().starts_with("//") {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }

    fn ident(s: &str) -> (&str, &str) {
        let n = s.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(s.len());
        (&s[..n], &s[n..])
    }

    /// The paths of a use tree at the start of `s` (`a::b`, `{a, b::{c, d}}`,
    /// `a as b`), as their segments.
    fn tree(s: &str, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
        let t = s.trim_start();
        let skipped = s.len() - t.len();
        if let Some(rest) = t.strip_prefix('{') {
            let mut used = skipped + 1;
            let mut rest = rest;
            loop {
                let r = rest.trim_start();
                used += rest.len() - r.len();
                if let Some(r2) = r.strip_prefix('}') {
                    let _ = r2;
                    return used + 1;
                }
                let n = tree(r, prefix, out);
                used += n;
                rest = &r[n..];
                let r = rest.trim_start();
                used += rest.len() - r.len();
                rest = r.strip_prefix(',').map_or(r, |r2| {
                    used += 1;
                    r2
                });
            }
        }
        let (id, rest) = ident(t);
        let mut path = prefix.to_vec();
        if !id.is_empty() {
            path.push(id.to_string());
        }
        if let Some(rest2) = rest.strip_prefix("::") {
            return skipped + id.len() + 2 + tree(rest2, &path, out);
        }
        if !path.is_empty() {
            out.push(path);
        }
        // Skip an `as` alias.
        let r = rest.trim_start();
        if let Some(alias) = r.strip_prefix("as ") {
            let (a, _) = ident(alias.trim_start());
            return skipped + id.len() + (rest.len() - r.len()) + 3 + (alias.len() - alias.trim_start().len()) + a.len();
        }
        skipped + id.len()
    }

    /// Every path after one of `prefixes` in `code`.
    fn paths(code: &str, prefixes: &[&str]) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        for (i, _) in code.char_indices() {
            let before = code[..i].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            for p in prefixes {
                if let Some(rest) = code[i..].strip_prefix(p) {
                    // `super::super::x`: only the longest prefix counts.
                    if prefixes.iter().any(|q| q.len() > p.len() && code[i..].starts_with(q)) {
                        continue;
                    }
                    tree(rest, &[], &mut out);
                }
            }
        }
        out
    }

    /// The names `mod.rs` re-exports, with their module.
    fn reexports(mod_rs: &str) -> HashMap<String, String> {
        let mut map = HashMap::new();
        for line in code(mod_rs).lines() {
            let Some(rest) = line.strip_prefix("pub use ").or_else(|| line.strip_prefix("pub(crate) use ")) else { continue };
            let mut found = Vec::new();
            tree(rest, &[], &mut found);
            let alias = rest.split(" as ").nth(1).map(|a| a.trim_end_matches(';').trim().to_string());
            for p in found {
                let name = alias.clone().unwrap_or_else(|| p.last().unwrap().clone());
                map.insert(name, p[0].clone());
            }
        }
        map
    }

    /// The layer of a path (its first segment a module, `Cache` or a name
    /// `mod.rs` re-exports), or `None` if it names none of them.
    fn layer_of(path: &[String], names: &HashMap<String, String>) -> Option<(String, u8)> {
        let (module, item) = match names.get(&path[0]) {
            Some(m) => (m.clone(), Some(path[0].clone())),
            None => (path[0].clone(), path.get(1).cloned()),
        };
        if let Some(item) = &item {
            if let Some(&(_, _, l)) = ITEM_LAYERS.iter().find(|(m, i, _)| *m == module && i == item) {
                return Some((format!("{module}::{item}"), l));
            }
        }
        LAYERS.iter().find(|(m, _)| *m == module).map(|&(m, l)| (m.to_string(), l))
    }

    /// The violations in one file of module `module` (`nested`: a file of a
    /// directory module, where `super::` names a sibling).
    fn violations(module: &str, nested: bool, text: &str, names: &HashMap<String, String>) -> Vec<String> {
        let own = LAYERS.iter().find(|(m, _)| *m == module).map(|&(_, l)| l);
        let Some(own) = own else { return vec![format!("module `{module}` is not in the layer table")] };
        let prefixes: &[&str] = if nested { &["super::super::", "crate::cache::"] } else { &["super::", "crate::cache::"] };
        let mut v = Vec::new();
        for p in paths(&code(text), prefixes) {
            if p[0] == "crate" || p[0] == "self" {
                continue;
            }
            match layer_of(&p, names) {
                Some((m, l)) if l > own => v.push(format!("`{module}` (layer {own}) imports `{}` from `{m}` (layer {l})", p.join("::"))),
                _ => {}
            }
        }
        v
    }

    fn check(root: &Path) -> Vec<String> {
        let names = reexports(&std::fs::read_to_string(root.join("mod.rs")).unwrap());
        let mut all = Vec::new();
        files(root, &mut all);
        all.sort();
        let mut v = Vec::new();
        for f in all {
            let rel = f.strip_prefix(root).unwrap();
            if rel == Path::new("mod.rs") {
                continue;
            }
            let nested = rel.components().count() > 1;
            let module = rel.components().next().unwrap().as_os_str().to_str().unwrap().trim_end_matches(".rs").to_string();
            let text = std::fs::read_to_string(&f).unwrap();
            v.extend(violations(&module, nested, &text, &names).into_iter().map(|e| format!("{}: {e}", rel.display())));
        }
        v
    }

    #[test]
    fn no_file_imports_from_a_higher_layer() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cache");
        let v = check(&root);
        assert!(v.is_empty(), "layer violations (see \"Layers\" in src/cache/mod.rs):\n{}", v.join("\n"));
    }

    /// The checker sees the import forms the files use.
    #[test]
    fn an_upward_import_is_caught() {
        let names = reexports("pub use lease::{Lease, OwnedLease};\npub use os::fork_generation as fork_gen;\n");
        for (module, nested, text) in [
            ("entry", false, "use super::lease::Lease;\n"),
            ("entry", false, "use super::{entry_state::EntryState, lease};\n"),
            ("entry", false, "use super::Lease;\n"),
            ("entry", false, "fn f() { super::generation::held_by_this_thread(); }\n"),
            ("lanes", true, "use super::super::Cache;\n"),
            ("lanes", true, "use crate::cache::generation::{Generation, Locked};\n"),
            ("generation", false, "use super::events::Draining;\n"),
            ("entry_state", false, "use super::fork_gen;\n"),
        ] {
            assert!(!violations(module, nested, text, &names).is_empty(), "not caught in `{module}`: {text}");
        }
        for (module, nested, text) in [
            ("generation", false, "use super::source::EventSource;\n"),
            ("lanes", true, "use super::slots::Lane;\nuse crate::cache::entry::Entry;\n"),
            ("entry", false, "// use super::lease::Lease;\nuse super::entry_state::EntryState;\n"),
            ("acquire", false, "use super::{Cache, lease::Lease};\n"),
        ] {
            assert_eq!(violations(module, nested, text, &names), Vec::<String>::new(), "in `{module}`: {text}");
        }
    }
}
