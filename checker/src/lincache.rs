//! A memo of the linearizability check: whether a history (a
//! `LinearizabilityTester`) has a valid serialization.
//!
//! The search for a serialization is most of the cost of a quiescent state,
//! and many states share a history (they differ only in the cache's internal
//! state), so each checker thread keeps the verdicts of the histories it has
//! judged. The key is the whole history (compared by `Eq`, not a hash), so
//! a verdict is never another history's; the memo is cleared when it holds
//! [`CAPACITY`] histories, which bounds its memory.

use crate::state::State;
use mrcache_model::Model as RefModel;
use stateright::semantics::LinearizabilityTester;
use std::cell::RefCell;
use std::collections::HashMap;

type Lin = LinearizabilityTester<u8, RefModel>;

/// Histories kept per thread before the memo starts again.
pub const CAPACITY: usize = 1 << 16;

thread_local! {
    static MEMO: RefCell<HashMap<Lin, bool, ahash::RandomState>> = RefCell::new(HashMap::default());
}

/// `lin.serialized_history().is_some()`, remembered per thread.
pub fn linearizable(lin: &Lin) -> bool {
    MEMO.with(|m| {
        if let Some(&v) = m.borrow().get(lin) {
            return v;
        }
        let v = lin.serialized_history().is_some();
        let mut m = m.borrow_mut();
        if m.len() >= CAPACITY {
            m.clear();
        }
        m.insert(lin.clone(), v);
        v
    })
}

/// Every cache's history in `s` is linearizable.
pub fn all_linearizable(s: &State) -> bool {
    linearizable(&s.lin) && s.others.iter().all(|o| linearizable(&o.lin))
}
