//! The history a state carries for the linearizability check (S9): every
//! operation's invocation and return, per thread, with what each thread had
//! completed when another invoked. The same information as stateright's
//! `LinearizabilityTester`, so two states are equal here exactly when their
//! testers would be, and the pinned state counts do not move; but held so
//! that a step costs little:
//!
//! * the record is shared (`Arc`): most steps invoke or return nothing, and
//!   a state's copy then costs one reference count, not a tree of maps;
//! * its 64-bit fingerprint is computed once per change and is all a
//!   state's `Hash` writes for it (and the key of [`crate::lincache`]).
//!
//! Invariants:
//! * `fingerprint` is the fingerprint of `record` (every change goes through
//!   `History::change`, which recomputes it);
//! * `record.threads` is sorted by thread id, each id once; a thread is
//!   there from its first invocation on (or from a return without an
//!   invocation, which also makes the history invalid);
//! * once `valid` is false nothing changes any more.

use mrcache_model::Model as RefModel;
use mrcache_types::{Op, Ret};
use stateright::semantics::SequentialSpec;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// What the other threads had completed when an operation was invoked:
/// (thread id, index of its last completed operation) for every other
/// thread with at least one, sorted by id. An operation must be serialized
/// after each of those. Inline: a change copies the record, and a `Vec`
/// here made that an allocation per operation.
type Seen = smallvec::SmallVec<[(u8, u16); 4]>;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ThreadHistory {
    id: u8,
    /// Completed operations, in order.
    done: Vec<(Seen, Op, Ret)>,
    /// The operation invoked and not returned yet.
    in_flight: Option<(Seen, Op)>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Record {
    threads: Vec<ThreadHistory>,
    valid: bool,
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
        let record = Record { threads: Vec::new(), valid: true };
        let fingerprint = crate::engine::fingerprint(&record);
        History { record: Arc::new(record), fingerprint, init: Arc::new(init) }
    }

    /// The 64-bit fingerprint of the history (not of the reference object).
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    fn change(&mut self, f: impl FnOnce(&mut Record)) {
        let r = Arc::make_mut(&mut self.record);
        f(r);
        self.fingerprint = crate::engine::fingerprint(&*self.record);
    }

    fn position(&self, thread: u8) -> Result<usize, usize> {
        self.record.threads.binary_search_by_key(&thread, |t| t.id)
    }

    /// `thread` invokes `op`. A thread with an operation in flight makes
    /// the history invalid (as stateright's tester does).
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
            .filter(|t| t.id != thread && !t.done.is_empty())
            .map(|t| (t.id, seen_index(t.done.len() - 1)))
            .collect();
        self.change(|r| match at {
            Ok(i) => r.threads[i].in_flight = Some((seen, op)),
            Err(i) => r.threads.insert(i, ThreadHistory { id: thread, done: Vec::new(), in_flight: Some((seen, op)) }),
        });
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
                Some((seen, op)) => r.threads[i].done.push((seen, op, ret)),
                None => r.valid = false,
            },
            Err(i) => {
                r.threads.insert(i, ThreadHistory { id: thread, done: Vec::new(), in_flight: None });
                r.valid = false;
            }
        });
    }

    /// Some total order of the operations agrees with each thread's order,
    /// with real time (an operation completed before another's invocation
    /// comes first), and with the reference object: each completed
    /// operation returns what it returned, and an operation in flight is
    /// either left out or placed anywhere after what it saw, returning
    /// whatever the object returns.
    pub fn linearizable(&self) -> bool {
        if !self.record.valid {
            return false;
        }
        let threads = &self.record.threads;
        // Bounded: each level serializes one more operation.
        let mut next = vec![0usize; threads.len()];
        let mut placed = vec![false; threads.len()];
        serialize(threads, &mut next, &mut placed, &self.init)
    }
}

fn seen_index(i: usize) -> u16 {
    u16::try_from(i).expect("fewer than 65,536 operations per thread in a checked history")
}

/// Whether an operation that saw `seen` may come next: each thread it saw
/// must have its operations up to the one seen serialized already.
fn may_come_next(threads: &[ThreadHistory], next: &[usize], seen: &Seen) -> bool {
    seen.iter().all(|&(peer, last)| match threads.binary_search_by_key(&peer, |t| t.id) {
        Ok(p) => next[p] >= threads[p].done.len() || next[p] > last as usize,
        Err(_) => true,
    })
}

/// Depth-first search for a serialization of what is left: `next[i]` is
/// thread i's first completed operation not serialized yet, `placed[i]`
/// whether its operation in flight was serialized.
fn serialize(threads: &[ThreadHistory], next: &mut [usize], placed: &mut [bool], obj: &RefModel) -> bool {
    if threads.iter().zip(next.iter()).all(|(t, &n)| n == t.done.len()) {
        return true;
    }
    for i in 0..threads.len() {
        let t = &threads[i];
        if let Some((seen, op, ret)) = t.done.get(next[i]) {
            if !may_come_next(threads, next, seen) {
                continue;
            }
            let mut o = obj.clone();
            if !o.is_valid_step(op, ret) {
                continue;
            }
            next[i] += 1;
            let found = serialize(threads, next, placed, &o);
            next[i] -= 1;
            if found {
                return true;
            }
        } else if let (Some((seen, op)), false) = (&t.in_flight, placed[i]) {
            if !may_come_next(threads, next, seen) {
                continue;
            }
            let mut o = obj.clone();
            let _ = o.invoke(op);
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
        let testers: std::collections::HashSet<u64> =
            seen.values().map(crate::engine::fingerprint).collect();
        assert_eq!(testers.len(), seen.len(), "two different histories with equal testers");
        assert!(verdicts[0] > 100 && verdicts[1] > 100, "both verdicts occur: {verdicts:?}");
    }
}
