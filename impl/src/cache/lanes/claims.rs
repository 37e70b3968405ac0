//! Lane claims: which thread holds a lane ([`Claim`]), and each thread's
//! list of its claims (a thread-local).

use crate::sync::{plain, Ordering};
use std::cell::{Cell, RefCell};
use std::sync::Arc;

/// A lane's claim. `taken` says whether a thread holds it; `holder` says
/// which (its [`thread_token`], or 0). Only the thread holding the claim
/// writes `holder`: after taking the claim, and back to 0 before giving it
/// up ([`Claim::release`]). So a thread that reads its own token there holds
/// the claim: it wrote that value itself, and a later write by another
/// thread needs the claim, which this thread gives up only after zeroing
/// `holder` (coherence orders the two writes for it).
pub(super) struct Claim {
    pub(super) taken: plain::AtomicBool,
    pub(super) holder: plain::AtomicUsize,
}

impl Claim {
    /// Gives the claim up (the holding thread only).
    pub(super) fn release(&self) {
        self.holder.store(0, Ordering::Relaxed);
        // Release: the next owner sees this thread's last `held` stores.
        self.taken.store(false, Ordering::Release);
    }
}

/// This thread's lane claims: `(generation uid, lane, claim flag)`, most
/// recent last, and a one-entry hint for the hot path.
pub(super) struct Claims {
    pub(super) hint: Cell<(u64, Option<*const ()>)>,
    list: RefCell<Vec<(u64, *const (), Arc<Claim>)>>,
}

/// Claims kept per thread; the oldest is given back beyond it (a thread that
/// made many short-lived caches must not pin a lane in each forever).
const MAX_CLAIMS: usize = 8;

impl Claims {
    pub(super) fn find(&self, uid: u64) -> Option<*const ()> {
        let list = self.list.try_borrow().ok()?;
        let found = list.iter().rev().find(|(u, _, _)| *u == uid).map(|(_, p, _)| *p);
        if found.is_some() {
            self.hint.set((uid, found));
        }
        found
    }

    //= spec.md#LN3
    //# gives the claim back when it exits, or when it holds claims on too many
    //# caches (the oldest goes first), with its lane leases still out
    /// Keeps the claim; `false` if it cannot (the list is borrowed, by a
    /// re-entrant call): the caller then gives the claim back.
    pub(super) fn add(&self, uid: u64, lane: *const (), claim: Arc<Claim>) -> bool {
        let Ok(mut list) = self.list.try_borrow_mut() else {
            return false;
        };
        if list.len() >= MAX_CLAIMS {
            let (old_uid, _, old) = list.remove(0);
            old.release();
            if self.hint.get().0 == old_uid {
                self.hint.set((0, None));
            }
        }
        list.push((uid, lane, claim));
        self.hint.set((uid, Some(lane)));
        true
    }
}

impl Drop for Claims {
    fn drop(&mut self) {
        for (_, _, claim) in self.list.get_mut().drain(..) {
            claim.release();
        }
    }
}

crate::sync::thread_local! {
    #[allow(clippy::missing_const_for_thread_local)]
    pub(super) static CLAIMS: Claims = Claims { hint: Cell::new((0, None)), list: RefCell::new(Vec::new()) };
}
