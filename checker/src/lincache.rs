//! A memo of the linearizability check: whether a history (a
//! [`History`]) has a valid serialization.
//!
//! The search for a serialization is most of the cost of a quiescent state,
//! and many states share a history (they differ only in the cache's internal
//! state), so each checker thread keeps the verdicts of the histories it has
//! judged: a direct-mapped table of words, each a history's 64-bit
//! fingerprint with its verdict in the low bit; a history whose slot holds
//! another's is judged again and takes the slot. Two histories confused
//! would need equal fingerprints: the same assumption as the checker's
//! visited set of state fingerprints.
//!
//! The table starts small and grows fourfold (keeping its verdicts) each
//! time it has taken as many new verdicts as it has slots, up to
//! [`MAX_SLOTS`] (8 MiB): a small check does not pay for zeroing the
//! whole table, a large one ends with it.

use crate::history::History;
use crate::state::State;
use std::cell::RefCell;

/// Slots of a thread's table when it is created (a power of two).
const START_SLOTS: usize = 1 << 12;

/// The most slots a thread's table grows to (a power of two).
pub const MAX_SLOTS: usize = 1 << 20;

#[derive(Default)]
struct Memo {
    slots: Vec<u64>,
    /// Verdicts stored since the table last grew.
    stored: usize,
}

impl Memo {
    fn slot(&self, key: u64) -> usize {
        (key >> 1) as usize & (self.slots.len() - 1)
    }

    fn grow(&mut self) {
        let len = if self.slots.is_empty() { START_SLOTS } else { (self.slots.len() * 4).min(MAX_SLOTS) };
        let old = std::mem::replace(&mut self.slots, vec![0; len]);
        for word in old.into_iter().filter(|&w| w != 0) {
            let i = self.slot(word);
            self.slots[i] = word;
        }
        self.stored = 0;
    }
}

thread_local! {
    static MEMO: RefCell<Memo> = RefCell::new(Memo::default());
}

/// `history.linearizable()`: the verdict kept with the history's record,
/// else remembered per thread (and then kept with the record).
pub fn linearizable(history: &History) -> bool {
    if let Some(v) = history.known_verdict() {
        return v;
    }
    let v = judged(history);
    history.keep_verdict(v);
    v
}

fn judged(history: &History) -> bool {
    // The low bit carries the verdict; 0 marks an empty slot.
    let key = history.fingerprint() & !1;
    if key == 0 {
        return history.linearizable();
    }
    MEMO.with(|m| {
        let mut m = m.borrow_mut();
        if m.slots.is_empty() || (m.stored >= m.slots.len() && m.slots.len() < MAX_SLOTS) {
            m.grow();
        }
        let slot = m.slot(key);
        let word = m.slots[slot];
        if word & !1 == key {
            return word & 1 == 1;
        }
        let v = history.linearizable();
        m.slots[slot] = key | v as u64;
        m.stored += 1;
        v
    })
}

/// Every cache's history in `s` is linearizable.
pub fn all_linearizable(s: &State) -> bool {
    linearizable(&s.lin) && s.others.iter().all(|o| linearizable(&o.lin))
}
