//! x86-TSO: the per-actor store buffers the lanes' plain stores go through
//! (not a step group: the memory model the lane steps run on).

use super::Ctx;
use crate::state::*;

impl Ctx<'_> {
    pub(super) fn sb_mut(&mut self, a: Actor) -> &mut Vec<Store> {
        if a == MONITOR {
            &mut self.s.monitor.sb
        } else {
            &mut self.s.threads[a as usize].sb
        }
    }

    pub(super) fn apply_store(&mut self, st: Store) {
        match st {
            Store::Held { lane, slot, val } => self.s.lanes[lane as usize][slot as usize].held = val,
            Store::Ptr { lane, slot, val } => self.s.lanes[lane as usize][slot as usize].ptr = val,
            Store::Claim { lane } => self.s.claimed[lane as usize] = false,
            Store::Handover { .. } => {}
        }
    }

    /// The oldest store in `a`'s store buffer reaches memory.
    pub(super) fn flush_one(&mut self, a: Actor) {
        let st = self.sb_mut(a).remove(0);
        note!(self, "{}'s buffered store {} reaches memory", actor_name(a), buf_line(&[st]));
        self.apply_store(st);
    }

    /// A full barrier on `a` (a locked instruction, a system call): its
    /// buffered stores reach memory, in order.
    pub(super) fn fence(&mut self, a: Actor) {
        for st in std::mem::take(self.sb_mut(a)) {
            self.apply_store(st);
        }
    }
}
