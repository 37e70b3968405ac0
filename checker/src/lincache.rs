//! A memo of the linearizability check: whether a history (a
//! `LinearizabilityTester`) has a valid serialization.
//!
//! The search for a serialization is most of the cost of a quiescent state,
//! and many states share a history (they differ only in the cache's internal
//! state), so each checker thread keeps the verdicts of the histories it has
//! judged: a direct-mapped table of [`SLOTS`] words (8 MiB), each a
//! history's 64-bit fingerprint with its verdict in the low bit; a history
//! whose slot holds another's is judged again and takes the slot. Two
//! histories confused would need equal fingerprints: the same assumption
//! as the checker's visited set of state fingerprints.

use crate::state::State;
use mrcache_model::Model as RefModel;
use stateright::semantics::LinearizabilityTester;
use std::cell::RefCell;

type Lin = LinearizabilityTester<u8, RefModel>;

/// Slots of each thread's table (a power of two).
pub const SLOTS: usize = 1 << 20;

thread_local! {
    static MEMO: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// `lin.serialized_history().is_some()`, remembered per thread.
pub fn linearizable(lin: &Lin) -> bool {
    // The low bit carries the verdict; 0 marks an empty slot.
    let key = crate::engine::fingerprint(lin) & !1;
    if key == 0 {
        return lin.serialized_history().is_some();
    }
    let slot = (key >> 1) as usize & (SLOTS - 1);
    MEMO.with(|m| {
        let mut m = m.borrow_mut();
        if m.is_empty() {
            m.resize(SLOTS, 0);
        }
        let word = m[slot];
        if word & !1 == key {
            return word & 1 == 1;
        }
        let v = lin.serialized_history().is_some();
        m[slot] = key | v as u64;
        v
    })
}

/// Every cache's history in `s` is linearizable.
pub fn all_linearizable(s: &State) -> bool {
    linearizable(&s.lin) && s.others.iter().all(|o| linearizable(&o.lin))
}
