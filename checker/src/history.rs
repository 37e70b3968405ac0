//! The history a state carries for the linearizability check (S9): every
//! operation's invocation and return, per thread, with what each thread had
//! completed when another invoked. The same information as stateright's
//! `LinearizabilityTester`, so two states are equal here exactly when their
//! testers would be, and the pinned state counts do not move; but held so
//! that a step costs little:
//!
//! * the record is shared (`Arc`): most steps invoke or return nothing, and
//!   a state's copy then costs one reference count, not a tree of maps;
//! * each thread's completed operations are a persistent list (newest
//!   first, each node shared by every later history), so a change copies
//!   one small vector per thread, never the operations;
//! * its 64-bit fingerprint is all a state's `Hash` writes for it (and the
//!   key of [`crate::lincache`]); a change recomputes it from each thread's
//!   few words, each list node carrying the fingerprint of its list;
//! * the verdict of the search for a serialization is kept in the record,
//!   so the states that share a record search once, and an invocation
//!   passes its history's verdict on (see [`History::invoke`]).
//!
//! Invariants:
//! * `fingerprint` is the fingerprint of `record`'s contents (every change
//!   goes through `History::change`, which recomputes it), and a node's
//!   `chain` the fingerprint of the list it heads;
//! * `record.threads` is sorted by thread id, each id once; a thread is
//!   there from its first invocation on (or from a return without an
//!   invocation, which also makes the history invalid);
//! * `record.verdict`, once known, is `linearizable()`'s answer for the
//!   record: it is set only by the search, or inherited by an invocation;
//! * once `valid` is false nothing changes any more.

use mrcache_model::Model as RefModel;
use mrcache_types::{Op, Ret};
use stateright::semantics::SequentialSpec;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

/// What the other threads had completed when an operation was invoked:
/// (thread id, index of its last completed operation) for every other
/// thread with at least one, sorted by id. An operation must be serialized
/// after each of those. Inline: a `Vec` here made an allocation per
/// operation.
type Seen = smallvec::SmallVec<[(u8, u16); 4]>;

/// A completed operation, and before it (through `prev`) the thread's
/// earlier ones.
struct Done {
    prev: Option<Arc<Done>>,
    /// Operations in the list this node heads.
    len: usize,
    /// The fingerprint of the list this node heads: of `prev`'s, and this
    /// operation's `seen`, `op` and `ret`.
    chain: u64,
    seen: Seen,
    op: Op,
    ret: Ret,
}

/// A thread's completed operations, newest first.
#[derive(Clone, Default)]
struct DoneList(Option<Arc<Done>>);

impl DoneList {
    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |d| d.len)
    }

    fn chain(&self) -> u64 {
        self.0.as_ref().map_or(0, |d| d.chain)
    }

    fn push(&mut self, seen: Seen, op: Op, ret: Ret) {
        let prev = self.0.take();
        let (prev_len, prev_chain) = prev.as_ref().map_or((0, 0), |d| (d.len, d.chain));
        let chain = crate::engine::fingerprint(&(prev_chain, &seen, &op, &ret));
        self.0 = Some(Arc::new(Done { prev, len: prev_len + 1, chain, seen, op, ret }));
    }

    /// Oldest first.
    fn in_order(&self) -> Vec<&Done> {
        let mut v = Vec::with_capacity(self.len());
        let mut at = self.0.as_deref();
        while let Some(d) = at {
            v.push(d);
            at = d.prev.as_deref();
        }
        v.reverse();
        v
    }
}

impl std::fmt::Debug for DoneList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.in_order().iter().map(|d| (&d.seen, &d.op, &d.ret))).finish()
    }
}

impl PartialEq for DoneList {
    fn eq(&self, other: &Self) -> bool {
        let (mut a, mut b) = (self.0.as_ref(), other.0.as_ref());
        loop {
            match (a, b) {
                (None, None) => return true,
                (Some(x), Some(y)) if Arc::ptr_eq(x, y) => return true,
                (Some(x), Some(y)) if x.len == y.len && x.seen == y.seen && x.op == y.op && x.ret == y.ret => {
                    a = x.prev.as_ref();
                    b = y.prev.as_ref();
                }
                _ => return false,
            }
        }
    }
}

impl Eq for DoneList {}

#[derive(Clone, Debug, PartialEq, Eq)]
struct ThreadHistory {
    id: u8,
    done: DoneList,
    /// The operation invoked and not returned yet.
    in_flight: Option<(Seen, Op)>,
}

/// `Record::verdict`'s values.
const UNJUDGED: u8 = 0;
const NOT_LINEARIZABLE: u8 = 1;
const LINEARIZABLE: u8 = 2;

#[derive(Debug)]
struct Record {
    threads: Vec<ThreadHistory>,
    valid: bool,
    /// `UNJUDGED`, or the verdict on this record. Not part of its value
    /// (a function of it), so neither compared nor copied by a change.
    verdict: AtomicU8,
}

impl Clone for Record {
    fn clone(&self) -> Self {
        Record { threads: self.threads.clone(), valid: self.valid, verdict: AtomicU8::new(UNJUDGED) }
    }
}

impl PartialEq for Record {
    fn eq(&self, other: &Self) -> bool {
        self.valid == other.valid && self.threads == other.threads
    }
}

impl Record {
    /// The fingerprint of the record's contents: per thread its id, its
    /// list's fingerprint and its operation in flight.
    fn fingerprint(&self) -> u64 {
        let mut h = crate::engine::Fingerprinter::default();
        self.valid.hash(&mut h);
        self.threads.len().hash(&mut h);
        for t in &self.threads {
            t.id.hash(&mut h);
            t.done.len().hash(&mut h);
            t.done.chain().hash(&mut h);
            t.in_flight.hash(&mut h);
        }
        h.finish()
    }
}

/// A concurrent history of one cache (see the module doc).
#[derive(Clone)]
pub struct History {
    record: Arc<Record>,
    fingerprint: u64,
    /// The reference object the serialization starts from (the same in
    /// every state of a run, so neither hashed nor compared).
    init: Arc<RefModel>,
}

impl History {
    pub fn new(init: RefModel) -> Self {
        let record = Record { threads: Vec::new(), valid: true, verdict: AtomicU8::new(UNJUDGED) };
        let fingerprint = record.fingerprint();
        History { record: Arc::new(record), fingerprint, init: Arc::new(init) }
    }

    /// The 64-bit fingerprint of the history (not of the reference object).
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Changes the record (a copy of it, if shared); the copy is unjudged.
    fn change(&mut self, f: impl FnOnce(&mut Record)) {
        let r = Arc::make_mut(&mut self.record);
        r.verdict = AtomicU8::new(UNJUDGED);
        f(r);
        self.fingerprint = self.record.fingerprint();
    }

    fn position(&self, thread: u8) -> Result<usize, usize> {
        self.record.threads.binary_search_by_key(&thread, |t| t.id)
    }

    /// `thread` invokes `op`. A thread with an operation in flight makes
    /// the history invalid (as stateright's tester does).
    ///
    /// A valid invocation keeps the verdict: the new operation, invoked
    /// after every completed one returned, may be left out of a
    /// serialization, so one of the history before it serializes the
    /// history after it; and a serialization after it, less the new
    /// operation (after every completed one in it, by real time, so no
    /// return depends on it), serializes the history before it.
    pub fn invoke(&mut self, thread: u8, op: Op) {
        if !self.record.valid {
            return;
        }
        let at = self.position(thread);
        if let Ok(i) = at {
            if self.record.threads[i].in_flight.is_some() {
                self.change(|r| r.valid = false);
                return;
            }
        }
        let seen: Seen = self
            .record
            .threads
            .iter()
            .filter(|t| t.id != thread && t.done.len() > 0)
            .map(|t| (t.id, seen_index(t.done.len() - 1)))
            .collect();
        // Relaxed: the verdict is a function of the record, which is
        // immutable while shared; any value read is a right one.
        let verdict = self.record.verdict.load(Ordering::Relaxed);
        self.change(|r| match at {
            Ok(i) => r.threads[i].in_flight = Some((seen, op)),
            Err(i) => r.threads.insert(i, ThreadHistory { id: thread, done: DoneList::default(), in_flight: Some((seen, op)) }),
        });
        self.record.verdict.store(verdict, Ordering::Relaxed);
    }

    /// `thread`'s operation in flight returns `ret`. Without one the
    /// history becomes invalid, and the thread gets an (empty) entry, as
    /// stateright's tester does.
    pub fn ret(&mut self, thread: u8, ret: Ret) {
        if !self.record.valid {
            return;
        }
        let at = self.position(thread);
        self.change(|r| match at {
            Ok(i) => match r.threads[i].in_flight.take() {
                Some((seen, op)) => r.threads[i].done.push(seen, op, ret),
                None => r.valid = false,
            },
            Err(i) => {
                r.threads.insert(i, ThreadHistory { id: thread, done: DoneList::default(), in_flight: None });
                r.valid = false;
            }
        });
    }

    /// The verdict kept with the record, if it was judged.
    pub fn known_verdict(&self) -> Option<bool> {
        match self.record.verdict.load(Ordering::Relaxed) {
            LINEARIZABLE => Some(true),
            NOT_LINEARIZABLE => Some(false),
            _ => None,
        }
    }

    /// Keeps `v`, the verdict on this history, with the record (for every
    /// state that shares it).
    pub fn keep_verdict(&self, v: bool) {
        self.record.verdict.store(if v { LINEARIZABLE } else { NOT_LINEARIZABLE }, Ordering::Relaxed);
    }

    /// Some total order of the operations agrees with each thread's order,
    /// with real time (an operation completed before another's invocation
    /// comes first), and with the reference object: each completed
    /// operation returns what it returned, and an operation in flight is
    /// either left out or placed anywhere after what it saw, returning
    /// whatever the object returns. Searches every time (the kept verdict
    /// is [`crate::lincache`]'s to use).
    pub fn linearizable(&self) -> bool {
        if !self.record.valid {
            return false;
        }
        let threads: Vec<ThreadView<'_>> =
            self.record.threads.iter().map(|t| ThreadView { id: t.id, done: t.done.in_order(), in_flight: t.in_flight.as_ref() }).collect();
        // Bounded: each level serializes one more operation.
        let mut next = vec![0usize; threads.len()];
        let mut placed = vec![false; threads.len()];
        serialize(&threads, &mut next, &mut placed, &self.init)
    }
}

/// A thread's history laid out for the search.
struct ThreadView<'a> {
    id: u8,
    done: Vec<&'a Done>,
    in_flight: Option<&'a (Seen, Op)>,
}

fn seen_index(i: usize) -> u16 {
    u16::try_from(i).expect("fewer than 65,536 operations per thread in a checked history")
}

/// Whether an operation that saw `seen` may come next: each thread it saw
/// must have its operations up to the one seen serialized already.
fn may_come_next(threads: &[ThreadView<'_>], next: &[usize], seen: &Seen) -> bool {
    seen.iter().all(|&(peer, last)| match threads.binary_search_by_key(&peer, |t| t.id) {
        Ok(p) => next[p] >= threads[p].done.len() || next[p] > last as usize,
        Err(_) => true,
    })
}

/// Depth-first search for a serialization of what is left: `next[i]` is
/// thread i's first completed operation not serialized yet, `placed[i]`
/// whether its operation in flight was serialized.
fn serialize(threads: &[ThreadView<'_>], next: &mut [usize], placed: &mut [bool], obj: &RefModel) -> bool {
    if threads.iter().zip(next.iter()).all(|(t, &n)| n == t.done.len()) {
        return true;
    }
    for i in 0..threads.len() {
        let t = &threads[i];
        if let Some(d) = t.done.get(next[i]) {
            if !may_come_next(threads, next, &d.seen) {
                continue;
            }
            let mut o = obj.clone();
            if !o.follows(&d.op, &d.ret) {
                continue;
            }
            next[i] += 1;
            let found = serialize(threads, next, placed, &o);
            next[i] -= 1;
            if found {
                return true;
            }
        } else if let (Some((seen, op)), false) = (t.in_flight, placed[i]) {
            if !may_come_next(threads, next, seen) {
                continue;
            }
            let mut o = obj.clone();
            let _ = o.invoke(op);
            // The effects are of no use here, and each copy would carry them.
            let _ = o.take_effects();
            placed[i] = true;
            let found = serialize(threads, next, placed, &o);
            placed[i] = false;
            if found {
                return true;
            }
        }
    }
    false
}

impl PartialEq for History {
    fn eq(&self, other: &Self) -> bool {
        self.fingerprint == other.fingerprint && (Arc::ptr_eq(&self.record, &other.record) || self.record == other.record)
    }
}

impl Eq for History {}

impl Hash for History {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.fingerprint.hash(state);
    }
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History").field("threads", &self.record.threads).field("valid", &self.record.valid).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mrcache_types::{Access, ReleaseKind};
    use stateright::semantics::{ConsistencyTester, LinearizabilityTester};

    /// A seeded generator (xorshift), so a failure names its case.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    fn ops() -> Vec<Op> {
        vec![
            Op::Acquire { lease: 1, addr: 0x1000, len: 0x1000, access: Access::default() },
            Op::Acquire { lease: 2, addr: 0x1000, len: 0x2000, access: Access::default() },
            Op::Release { lease: 1 },
            Op::ReleaseEvent { kind: ReleaseKind::Munmap, addr: 0x1000, len: 0x1000 },
        ]
    }

    /// The same events drive stateright's tester and a `History`: the
    /// verdicts agree, and two event sequences give equal histories exactly
    /// when they give equal testers (so the state counts cannot move).
    #[test]
    fn agrees_with_stateright_on_random_histories() {
        let model = || RefModel::new(Default::default()).concurrent().trims_logged();
        let mut seen: std::collections::HashMap<u64, LinearizabilityTester<u8, RefModel>> = Default::default();
        let mut verdicts = [0usize; 2];
        for seed in 1..4000u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let mut tester = LinearizabilityTester::new(model());
            let mut history = History::new(model());
            // A return yields what a fresh reference object would, or a
            // failure, so both verdicts occur.
            for _ in 0..rng.below(9) {
                let thread = [0u8, 1, 2, 16][rng.below(4) as usize];
                if rng.below(2) == 0 {
                    let op = ops()[rng.below(4) as usize];
                    let _ = tester.on_invoke(thread, op);
                    history.invoke(thread, op);
                } else {
                    let ret = if rng.below(3) == 0 {
                        Ret::Done
                    } else {
                        let mut o = model();
                        o.invoke(&ops()[rng.below(2) as usize])
                    };
                    let _ = tester.on_return(thread, ret);
                    history.ret(thread, ret);
                }
                // After every event: the verdict the checker uses (kept with
                // the record, inherited by an invocation) is the tester's.
                let v = tester.serialized_history().is_some();
                assert_eq!(crate::lincache::linearizable(&history), v, "seed {seed}: kept verdicts differ on {history:?}");
            }
            let v = tester.serialized_history().is_some();
            assert_eq!(history.linearizable(), v, "seed {seed}: verdicts differ on {history:?}");
            verdicts[v as usize] += 1;
            if let Some(t) = seen.get(&history.fingerprint()) {
                assert!(*t == tester, "seed {seed}: equal histories, different testers");
            } else {
                seen.insert(history.fingerprint(), tester);
            }
        }
        // Distinct testers map to distinct histories: as many of each.
        let testers: std::collections::HashSet<u64> = seen.values().map(crate::engine::fingerprint).collect();
        assert_eq!(testers.len(), seen.len(), "two different histories with equal testers");
        assert!(verdicts[0] > 100 && verdicts[1] > 100, "both verdicts occur: {verdicts:?}");
    }
}
