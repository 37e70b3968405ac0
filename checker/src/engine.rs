//! The exhaustive engine for large checks: every reachable state once, with
//! little memory per state and no allocation beyond the model's own.
//!
//! The visited set holds 64-bit fingerprints only ([`Table`]: flat,
//! open-addressed shards); the states waiting to be expanded live on each
//! worker's depth-first stack, so pending states number about depth x
//! branching, not a BFS frontier. The model is used only through its
//! `stateright::Model` interface (`Clone + Hash` states), so a field added
//! to the state needs no change here.
//!
//! Invariants:
//! * a state is expanded at most once: it is pushed only by the worker whose
//!   insertion of its fingerprint into the table succeeded first;
//! * the set of states expanded, the number of successors generated, and
//!   each property's verdict equal those of stateright's BFS over the same
//!   model (same expansion rule: a state is not expanded when every
//!   `always` property fails in it and every `sometimes` one holds in it);
//!   only the order differs, so a discovery's path is *a* path, not a
//!   shortest one, and `max_depth` is the longest path followed;
//! * the run stops at the first violated `always` property, whatever the
//!   options: callers that need the shortest counterexample re-run the
//!   exact BFS (`run::check_with_progress` does).
//!
//! Workers share work by donation: a worker whose stack is deep gives the
//! oldest half of it (with the paths) to the pool when some worker is idle.

use stateright::{Expectation, Model, Property};
use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Shards of the fingerprint table: a power of two, so that growing one
/// shard (which briefly holds the old and new slots) costs little memory
/// and two workers rarely wait on the same lock.
const SHARD_BITS: u32 = 8;

/// Slots of a shard when it is created: the whole table starts at 128 KiB,
/// which a small check's states fit in the cache with (it doubles per
/// shard as needed).
const SHARD_START: usize = 1 << 6;

/// A set of nonzero 64-bit fingerprints: open addressing with linear
/// probing, 0 marks an empty slot, a shard doubles at 3/4 full.
pub struct Table {
    shards: Vec<Mutex<Shard>>,
    len: AtomicUsize,
}

struct Shard {
    slots: Vec<u64>,
    len: usize,
}

impl Shard {
    fn insert(&mut self, fp: u64) -> bool {
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        let mut i = (fp as usize) & mask;
        loop {
            match self.slots[i] {
                0 => {
                    self.slots[i] = fp;
                    self.len += 1;
                    return true;
                }
                x if x == fp => return false,
                _ => i = (i + 1) & mask,
            }
        }
    }

    fn grow(&mut self) {
        let size = (self.slots.len() * 2).max(SHARD_START);
        let old = std::mem::replace(&mut self.slots, vec![0; size]);
        let mask = self.slots.len() - 1;
        for fp in old.into_iter().filter(|&f| f != 0) {
            let mut i = (fp as usize) & mask;
            while self.slots[i] != 0 {
                i = (i + 1) & mask;
            }
            self.slots[i] = fp;
        }
    }
}

impl Default for Table {
    fn default() -> Self {
        Table {
            shards: (0..1usize << SHARD_BITS).map(|_| Mutex::new(Shard { slots: Vec::new(), len: 0 })).collect(),
            len: AtomicUsize::new(0),
        }
    }
}

impl Table {
    /// Adds `fp`; true if it was not there. A zero fingerprint is stored as 1.
    pub fn insert(&self, fp: u64) -> bool {
        let fp = fp.max(1);
        let shard = (fp >> (64 - SHARD_BITS)) as usize;
        let mut s = self.shards[shard].lock().unwrap_or_else(|e| e.into_inner());
        let new = s.insert(fp);
        if new {
            self.len.fetch_add(1, Ordering::Relaxed);
        }
        new
    }

    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of slots allocated.
    pub fn bytes(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).slots.len() * 8).sum()
    }
}

/// The fingerprint of a state: a keyed 64-bit hash of its `Hash` stream
/// (fixed keys, so runs and workers agree).
pub fn fingerprint<T: Hash>(value: &T) -> u64 {
    let mut h = Fingerprinter::default();
    value.hash(&mut h);
    h.finish()
}

/// Bytes a [`Fingerprinter`] gathers before it hashes them.
const FINGERPRINT_CHUNK: usize = 256;

/// A hasher that gathers a value's `Hash` stream (mostly one- and
/// eight-byte fields) into chunks and gives each chunk to ahash at once:
/// a state's derived `Hash` makes hundreds of small writes, and a keyed
/// round per write was a fifth of a check's time. The chunks depend only on
/// the stream of writes, so equal values still give equal fingerprints.
pub(crate) struct Fingerprinter {
    inner: ahash::AHasher,
    buf: [u8; FINGERPRINT_CHUNK],
    len: usize,
}

impl Default for Fingerprinter {
    fn default() -> Self {
        let keys =
            ahash::RandomState::with_seeds(0x243f_6a88_85a3_08d3, 0x1319_8a2e_0370_7344, 0xa409_3822_299f_31d0, 0x082e_fa98_ec4e_6c89);
        Fingerprinter { inner: keys.build_hasher(), buf: [0; FINGERPRINT_CHUNK], len: 0 }
    }
}

impl Fingerprinter {
    #[inline(always)]
    fn push<const N: usize>(&mut self, bytes: [u8; N]) {
        if self.len + N > FINGERPRINT_CHUNK {
            self.inner.write(&self.buf[..self.len]);
            self.len = 0;
        }
        self.buf[self.len..self.len + N].copy_from_slice(&bytes);
        self.len += N;
    }

    /// A 64-bit value as one byte when below 255 (most are: lengths,
    /// discriminants, indices), else 255 and its eight bytes. The encoding
    /// is prefix-free, so a value's stream of writes still determines it,
    /// and the stream is up to eight times shorter to hash.
    #[inline(always)]
    fn push_varint(&mut self, i: u64) {
        if i < 0xff {
            self.push([i as u8]);
        } else {
            self.push([0xff]);
            self.push(i.to_le_bytes());
        }
    }
}

impl Hasher for Fingerprinter {
    #[inline(always)]
    fn write(&mut self, bytes: &[u8]) {
        if self.len + bytes.len() > FINGERPRINT_CHUNK {
            self.inner.write(&self.buf[..self.len]);
            self.len = 0;
        }
        if bytes.len() > FINGERPRINT_CHUNK {
            self.inner.write(bytes);
        } else {
            self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
            self.len += bytes.len();
        }
    }
    #[inline(always)]
    fn write_u8(&mut self, i: u8) {
        self.push(i.to_le_bytes());
    }
    #[inline(always)]
    fn write_u16(&mut self, i: u16) {
        self.push(i.to_le_bytes());
    }
    #[inline(always)]
    fn write_u32(&mut self, i: u32) {
        self.push(i.to_le_bytes());
    }
    #[inline(always)]
    fn write_u64(&mut self, i: u64) {
        self.push_varint(i);
    }
    #[inline(always)]
    fn write_usize(&mut self, i: usize) {
        self.push_varint(i as u64);
    }
    #[inline(always)]
    fn write_isize(&mut self, i: isize) {
        // Enum discriminants come here: small, and never negative.
        self.push_varint(i as u64);
    }
    fn finish(&self) -> u64 {
        let mut h = self.inner.clone();
        h.write(&self.buf[..self.len]);
        h.finish()
    }
}

/// Limits of a run.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub workers: usize,
    pub timeout: Option<Duration>,
}

/// Counters a progress report reads while the workers run.
#[derive(Default)]
pub struct Counters {
    /// Successors generated (with repeats), plus the initial states.
    pub generated: AtomicUsize,
    pub max_depth: AtomicUsize,
}

/// What a run found.
pub struct Found<A> {
    pub unique: usize,
    pub generated: usize,
    /// The longest path followed (stateright's convention: the initial
    /// state is at depth 1).
    pub max_depth: usize,
    /// Every reachable state was expanded (no timeout, no violation).
    pub complete: bool,
    /// The first discovery of each property, with a path to it.
    pub discoveries: BTreeMap<&'static str, Vec<A>>,
    /// Bytes the fingerprint table allocated.
    pub table_bytes: usize,
}

struct Job<S, A> {
    state: S,
    path: Vec<A>,
}

struct Pool<S, A> {
    jobs: Vec<Job<S, A>>,
    idle: usize,
    done: bool,
}

struct Shared<'m, M: Model> {
    model: &'m M,
    properties: Vec<Property<M>>,
    /// Per property: discovered (a violation, or an example).
    discovered: Vec<AtomicBool>,
    discoveries: Mutex<BTreeMap<&'static str, Vec<M::Action>>>,
    table: Table,
    pool: Mutex<Pool<M::State, M::Action>>,
    wake: Condvar,
    /// Mirrors `Pool::idle` so busy workers can check it without the lock.
    hungry: AtomicUsize,
    stop: AtomicBool,
    counters: &'m Counters,
    workers: usize,
    deadline: Option<Instant>,
    timed_out: AtomicBool,
}

/// Explores every state reachable from `model`'s initial states with
/// `limits.workers` threads; `tick` runs on the calling thread about every
/// `every` while they do.
pub fn explore<M>(model: &M, limits: Limits, counters: &Counters, every: Duration, mut tick: impl FnMut(usize)) -> Found<M::Action>
where
    M: Model + Sync,
    M::State: Hash + Send + Sync,
    M::Action: Clone + Send + Sync,
{
    let properties = model.properties();
    let shared = Shared {
        model,
        discovered: properties.iter().map(|_| AtomicBool::new(false)).collect(),
        properties,
        discoveries: Mutex::new(BTreeMap::new()),
        table: Table::default(),
        pool: Mutex::new(Pool { jobs: Vec::new(), idle: 0, done: false }),
        wake: Condvar::new(),
        hungry: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        counters,
        workers: limits.workers.max(1),
        deadline: limits.timeout.map(|t| Instant::now() + t),
        timed_out: AtomicBool::new(false),
    };
    {
        let mut pool = shared.pool.lock().unwrap_or_else(|e| e.into_inner());
        for s in model.init_states() {
            if !model.within_boundary(&s) {
                continue;
            }
            counters.generated.fetch_add(1, Ordering::Relaxed);
            if shared.table.insert(fingerprint(&s)) {
                pool.jobs.push(Job { state: s, path: Vec::new() });
            }
        }
    }
    std::thread::scope(|scope| {
        // Each worker holds a sender until it returns or unwinds: the
        // channel disconnects the moment the last one ends, so the run's
        // end is seen at once (a small check takes a few milliseconds,
        // which polling would round up).
        let (alive, ended) = std::sync::mpsc::channel::<()>();
        let sh = &shared;
        let handles: Vec<_> = (0..shared.workers)
            .map(|_| {
                let alive = alive.clone();
                scope.spawn(move || {
                    let _alive = alive;
                    worker(sh)
                })
            })
            .collect();
        drop(alive);
        let every = every.max(Duration::from_millis(2));
        while ended.recv_timeout(every) != Err(std::sync::mpsc::RecvTimeoutError::Disconnected) {
            tick(shared.table.len());
        }
        for h in handles {
            if let Err(p) = h.join() {
                std::panic::resume_unwind(p);
            }
        }
    });
    tick(shared.table.len());
    let violated =
        shared.properties.iter().zip(&shared.discovered).any(|(p, d)| p.expectation == Expectation::Always && d.load(Ordering::Relaxed));
    Found {
        unique: shared.table.len(),
        generated: counters.generated.load(Ordering::Relaxed),
        max_depth: counters.max_depth.load(Ordering::Relaxed),
        complete: !violated && !shared.timed_out.load(Ordering::Relaxed),
        table_bytes: shared.table.bytes(),
        discoveries: shared.discoveries.into_inner().unwrap_or_else(|e| e.into_inner()),
    }
}

/// A stack entry: a state, the action that led to it from the state that
/// pushed it, and its depth (the initial states' is 0).
struct Entry<S, A> {
    state: S,
    action: Option<A>,
    depth: usize,
}

fn worker<M>(sh: &Shared<'_, M>)
where
    M: Model,
    M::State: Hash,
    M::Action: Clone,
{
    let mut stack: Vec<Entry<M::State, M::Action>> = Vec::new();
    let mut path: Vec<M::Action> = Vec::new();
    let mut actions = Vec::new();
    let mut local_depth = 0;
    let mut since_check = 0u32;
    loop {
        let Some(entry) = stack.pop().or_else(|| take_job(sh, &mut path)) else { return };
        if let Some(a) = entry.action {
            path.truncate(entry.depth - 1);
            path.push(a);
        }
        if entry.depth + 1 > local_depth {
            local_depth = entry.depth + 1;
            sh.counters.max_depth.fetch_max(local_depth, Ordering::Relaxed);
        }
        let state = entry.state;
        if !evaluate(sh, &state, &path) {
            continue;
        }
        if sh.stop.load(Ordering::Relaxed) {
            stop_all(sh);
            return;
        }
        since_check += 1;
        if since_check >= 1024 {
            since_check = 0;
            if sh.deadline.is_some_and(|d| Instant::now() >= d) {
                sh.timed_out.store(true, Ordering::Relaxed);
                sh.stop.store(true, Ordering::Relaxed);
                stop_all(sh);
                return;
            }
        }
        sh.model.actions(&state, &mut actions);
        let mut generated = 0;
        for a in actions.drain(..) {
            let Some(next) = sh.model.next_state(&state, a.clone()) else { continue };
            if !sh.model.within_boundary(&next) {
                continue;
            }
            generated += 1;
            if sh.table.insert(fingerprint(&next)) {
                stack.push(Entry { state: next, action: Some(a), depth: entry.depth + 1 });
            }
        }
        sh.counters.generated.fetch_add(generated, Ordering::Relaxed);
        if stack.len() >= 2 && sh.hungry.load(Ordering::Relaxed) > 0 {
            donate(sh, &mut stack, &path);
        }
    }
}

/// Evaluates the properties in `state` (reached by `path`): records first
/// discoveries, and says whether the state is to be expanded.
fn evaluate<M: Model<Action: Clone>>(sh: &Shared<'_, M>, state: &M::State, path: &[M::Action]) -> bool {
    let mut awaiting = false;
    let mut skipped = false;
    for (i, p) in sh.properties.iter().enumerate() {
        if sh.discovered[i].load(Ordering::Relaxed) {
            // Known already: it changes nothing unless the expansion rule
            // needs it (checked below, rarely).
            skipped = true;
            continue;
        }
        let holds = (p.condition)(sh.model, state);
        let found = match p.expectation {
            Expectation::Always => !holds,
            Expectation::Sometimes => holds,
            // The model defines none; treated as stateright does not (no
            // path bits), so a model with one must use the BFS path.
            Expectation::Eventually => false,
        };
        if found {
            discover(sh, i, path);
        } else {
            awaiting = true;
        }
    }
    if !awaiting && skipped {
        awaiting = sh.properties.iter().any(|p| {
            let holds = (p.condition)(sh.model, state);
            match p.expectation {
                Expectation::Always => holds,
                Expectation::Sometimes => !holds,
                Expectation::Eventually => true,
            }
        });
    }
    awaiting
}

fn discover<M: Model<Action: Clone>>(sh: &Shared<'_, M>, i: usize, path: &[M::Action]) {
    let mut d = sh.discoveries.lock().unwrap_or_else(|e| e.into_inner());
    let p = &sh.properties[i];
    d.entry(p.name).or_insert_with(|| path.to_vec());
    sh.discovered[i].store(true, Ordering::Relaxed);
    if p.expectation == Expectation::Always {
        sh.stop.store(true, Ordering::Relaxed);
    }
}

/// The next job from the pool, waiting while other workers may still give
/// one; `None` once every worker is idle (or the run stops).
fn take_job<M: Model>(sh: &Shared<'_, M>, path: &mut Vec<M::Action>) -> Option<Entry<M::State, M::Action>> {
    let mut pool = sh.pool.lock().unwrap_or_else(|e| e.into_inner());
    pool.idle += 1;
    sh.hungry.fetch_add(1, Ordering::Relaxed);
    loop {
        if pool.done || sh.stop.load(Ordering::Relaxed) {
            pool.done = true;
            sh.wake.notify_all();
            return None;
        }
        if let Some(job) = pool.jobs.pop() {
            pool.idle -= 1;
            sh.hungry.fetch_sub(1, Ordering::Relaxed);
            *path = job.path;
            return Some(Entry { state: job.state, action: None, depth: path.len() });
        }
        if pool.idle == sh.workers {
            pool.done = true;
            sh.wake.notify_all();
            return None;
        }
        pool = sh.wake.wait(pool).unwrap_or_else(|e| e.into_inner());
    }
}

fn stop_all<M: Model>(sh: &Shared<'_, M>) {
    let mut pool = sh.pool.lock().unwrap_or_else(|e| e.into_inner());
    pool.done = true;
    pool.jobs.clear();
    sh.wake.notify_all();
}

/// Gives the oldest half of `stack` (the states nearest the root, likely the
/// largest subtrees) to the pool, each with its path.
fn donate<M: Model<Action: Clone>>(sh: &Shared<'_, M>, stack: &mut Vec<Entry<M::State, M::Action>>, path: &[M::Action]) {
    let n = stack.len() / 2;
    let jobs: Vec<_> = stack
        .drain(..n)
        .map(|e| {
            let mut p = path[..e.depth.saturating_sub(1)].to_vec();
            p.extend(e.action);
            Job { state: e.state, path: p }
        })
        .collect();
    let mut pool = sh.pool.lock().unwrap_or_else(|e| e.into_inner());
    pool.jobs.extend(jobs);
    sh.wake.notify_all();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_keeps_each_fingerprint_once_through_growth() {
        let t = Table::default();
        for i in 1..=100_000u64 {
            assert!(t.insert(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
        }
        for i in 1..=100_000u64 {
            assert!(!t.insert(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
        }
        assert_eq!(t.len(), 100_000);
        // Zero is stored as 1.
        assert!(t.insert(0));
        assert!(!t.insert(1));
    }
}
