//! A part of a state that the states after it share until one changes it.
//!
//! Most steps change one actor: a successor that copied every thread would
//! copy (and allocate, and hash) the threads that did not move. A
//! [`Shared`] part is copied by a reference count; the first write through
//! it (`DerefMut`) takes a copy of its own, so a state's parts never change
//! under another state. Its fingerprint is computed once per value and is
//! all the part writes to a `Hash`er.
//!
//! Invariants:
//! * a node's `fingerprint` is 0 (not computed yet) or the fingerprint of
//!   its `value`, which cannot change while the node is shared: a write
//!   goes through `Arc::make_mut` (which copies a shared node) and clears
//!   the fingerprint first;
//! * equal values hash alike (the fingerprint is a function of the value),
//!   so a state's `Eq` and `Hash` agree as with the value itself.

use std::hash::{Hash, Hasher};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A value shared between states (see the module doc).
pub struct Shared<T>(Arc<Node<T>>);

struct Node<T> {
    value: T,
    /// 0, or the fingerprint of `value` (never 0 itself: a computed 0 is
    /// stored as 1).
    fingerprint: AtomicU64,
}

impl<T: Clone> Clone for Node<T> {
    fn clone(&self) -> Self {
        Node { value: self.value.clone(), fingerprint: AtomicU64::new(0) }
    }
}

impl<T> Shared<T> {
    pub fn new(value: T) -> Self {
        Shared(Arc::new(Node { value, fingerprint: AtomicU64::new(0) }))
    }
}

impl<T: Hash> Shared<T> {
    /// The value's fingerprint, computed at its first use.
    fn fingerprint(&self) -> u64 {
        // Relaxed: the value is immutable while shared, so every thread
        // that computes the fingerprint computes the same one; a stale 0
        // only means computing it again.
        let fp = self.0.fingerprint.load(Ordering::Relaxed);
        if fp != 0 {
            return fp;
        }
        let fp = crate::engine::fingerprint(&self.0.value).max(1);
        self.0.fingerprint.store(fp, Ordering::Relaxed);
        fp
    }
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Shared(Arc::clone(&self.0))
    }
}

impl<T> Deref for Shared<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0.value
    }
}

impl<T: Clone> DerefMut for Shared<T> {
    fn deref_mut(&mut self) -> &mut T {
        let node = Arc::make_mut(&mut self.0);
        *node.fingerprint.get_mut() = 0;
        &mut node.value
    }
}

impl<T: PartialEq> PartialEq for Shared<T> {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.value == other.0.value
    }
}

impl<T: Eq> Eq for Shared<T> {}

impl<T: Hash> Hash for Shared<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.fingerprint());
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.value.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_copies_a_shared_value_and_forgets_its_fingerprint() {
        let a = Shared::new(vec![1u8, 2]);
        let mut b = a.clone();
        let before = crate::engine::fingerprint(&b);
        assert_eq!(before, crate::engine::fingerprint(&a));
        b.push(3);
        assert_eq!(*a, vec![1, 2], "the other state's part is unchanged");
        assert_ne!(crate::engine::fingerprint(&b), before, "the fingerprint follows the new value");
        b.pop();
        assert_eq!(a, b);
        assert_eq!(crate::engine::fingerprint(&b), before, "equal values hash alike");
    }
}
