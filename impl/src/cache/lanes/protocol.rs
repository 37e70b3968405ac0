//! The lane protocol, owner side (spec.md#LN1–LN3): the hit, the memo and
//! the release on a slot.

use super::barriers::{light_barrier, plain_load_ptr, plain_store};
use super::slots::{key_rest, Lane, LaneRef, Lanes};
use crate::cache::entry::Entry;
use crate::registrar::Registrar;
use crate::sync::{MutexGuard, Ordering};
use mrcache_types::{Access, PageSpan};

/// What [`try_hit`] found.
pub(crate) enum LaneHit<R: Registrar> {
    /// LN1 succeeded: a lease on the slot.
    Hit(*mut Entry<R>, u32),
    /// No memo for this key.
    None,
    /// The memo was revoked under us, our `held + 1` still stored: the
    /// caller reads the slot's pin ([`keep_if_pinned`]).
    Revoked(*mut Entry<R>, u32),
}

//= spec.md#LN6
//# either LN1's load sees null (it reads the pin) or LN1's store is visible to LN5's
//# count read (LN5 pins)
//= spec.md#LN1
//# store `held + 1`; light barrier; load `ptr` again. If unchanged, touch the
//# LRU stamp and return the hit, a lease on the slot.
#[inline(always)]
pub(crate) fn try_hit<R: Registrar>(lane: &Lane<R>, span: PageSpan, access: Access) -> LaneHit<R> {
    let (i, s) = lane.slot(span, access);
    let p = s.ptr.load(Ordering::Relaxed);
    //= spec.md#LN2
    //# LN1 compares the slot's key with the request's before it takes the memo.
    if p.is_null() || s.key_first.load(Ordering::Relaxed) != span.first || s.key_rest.load(Ordering::Relaxed) != key_rest(span, access) {
        return LaneHit::None;
    }
    // Invariant: only the claim's holder writes `held` (module docs).
    debug_assert!(lane.held_by_this_thread(), "LN1: `held` written by a thread without the lane's claim");
    let h = s.held.load(Ordering::Relaxed);
    plain_store(&s.held, h.wrapping_add(1));
    light_barrier();
    if plain_load_ptr(&s.ptr) == p {
        return LaneHit::Hit(p, i);
    }
    LaneHit::Revoked(p, i)
}

//= spec.md#LN1
//# Else take the lanes mutex and read the slot's pin. If the pin is the
//# memoized entry, keep the count and return the hit as above
/// LN1 after [`LaneHit::Revoked`], with the lanes mutex held (`_mutex`,
/// its guard: no revoke or LN4 runs meanwhile):
/// whether the slot's pin is `p`, the entry [`try_hit`] read. If so the
/// count stays and the hit stands (the pin, a lease on `p`'s state word,
/// lasts while the count does). Else the count is undone.
pub(crate) fn keep_if_pinned<R: Registrar>(lane: &Lane<R>, i: u32, p: *mut Entry<R>, _mutex: &MutexGuard<'_, ()>) -> bool {
    let s = &lane.slots()[i as usize];
    if s.pin().load(Ordering::SeqCst) == p {
        return true;
    }
    //= spec.md#LN1
    //# Else store `held` back and go to A1: the entry is not pinned for this
    //# count, and `ptr` stays null while the count is out, so no revoke can pin
    //# it later and LN4 has nothing to return.
    // Invariant: only the claim's holder writes `held` (module docs), and
    // it has not released since its store of `held + 1`.
    debug_assert!(lane.held_by_this_thread(), "LN1: `held` undone by a thread without the lane's claim");
    let h = s.held.load(Ordering::Relaxed);
    debug_assert_ne!(h, 0, "LN1: an undo with `held` 0");
    plain_store(&s.held, h.wrapping_sub(1));
    light_barrier();
    false
}

/// Probes per window of the dry-spell detector.
const DRY_WINDOW: u32 = 64;
/// A dry lane probes (LN1) and memoizes (LN2) on one acquire in this many.
const DRY_SAMPLE: u32 = 16;

/// Whether the owner probes its lane on this acquire. A lane whose probes
/// hit less than a quarter of the time is *dry* (more buffers in use than
/// slots, each reused rarely): there a probe and a memo cost more than the
/// rare lane hit saves (about 20 ns per A1 hit against 50 ns saved per lane
/// hit), so it probes and memoizes on one acquire in [`DRY_SAMPLE`], and
/// leaves the spell when its sampled probes hit again. Skipping a probe or a
/// memo is always allowed: memos only save work (spec.md#LN1, LN2).
#[inline(always)]
pub(crate) fn worth_probing<R: Registrar>(lane: &Lane<R>) -> bool {
    if lane.dry.load(Ordering::Relaxed) {
        let t = lane.tick.load(Ordering::Relaxed).wrapping_add(1);
        lane.tick.store(t, Ordering::Relaxed);
        if !t.is_multiple_of(DRY_SAMPLE) {
            return false;
        }
    }
    let p = lane.probes.load(Ordering::Relaxed) + 1;
    if p >= DRY_WINDOW {
        let hits = lane.hits.load(Ordering::Relaxed);
        let in_window = hits.wrapping_sub(lane.window_hits.load(Ordering::Relaxed));
        lane.dry.store(in_window * 4 < u64::from(p), Ordering::Relaxed);
        lane.window_hits.store(hits, Ordering::Relaxed);
        lane.probes.store(0, Ordering::Relaxed);
    } else {
        lane.probes.store(p, Ordering::Relaxed);
    }
    true
}

/// Whether a dry lane skips this A1 hit's memo (see [`worth_probing`]).
/// A0 (spec.md#A0) runs only then: it takes no lock, so it sets no memo.
#[inline(always)]
pub(crate) fn dry_skip<R: Registrar>(lane: &Lane<R>) -> bool {
    lane.dry.load(Ordering::Relaxed) && !lane.tick.load(Ordering::Relaxed).is_multiple_of(DRY_SAMPLE)
}

//= spec.md#LN2
//# after an A1 hit, if no slot has the key, take a slot with count 0 and no
//# pin and set its key and `ptr`.
/// Memoizes `e` for this key (cache lock shared held, `e` findable).
pub(crate) fn memoize<R: Registrar>(lane: &Lane<R>, span: PageSpan, access: Access, e: &Entry<R>, p: *mut Entry<R>) {
    /// A live memo survives this many A1 hits of other keys.
    const KEEP_LIVE_MEMO: u32 = 4;
    if dry_skip(lane) {
        return;
    }
    debug_assert!(lane.held_by_this_thread(), "LN2: a memo set by a thread without the lane's claim");
    let (_, s) = lane.slot(span, access);
    let current = s.ptr.load(Ordering::Relaxed);
    if !current.is_null() {
        if current == p && s.key_first.load(Ordering::Relaxed) == span.first && s.key_rest.load(Ordering::Relaxed) == key_rest(span, access)
        {
            return;
        }
        let n = s.passed_over.load(Ordering::Relaxed) + 1;
        s.passed_over.store(n, Ordering::Relaxed);
        if n < KEEP_LIVE_MEMO {
            return;
        }
    }
    if s.count() != 0 || !s.pin.load(Ordering::SeqCst).is_null() {
        return;
    }
    // Before `ptr` is published: a revoke that sees the flag clear finds no
    // slot pointing to the entry (both under the cache lock).
    e.memoized.store(true, Ordering::Relaxed);
    lane.memos.store(lane.memos.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    s.key_first.store(span.first, Ordering::Relaxed);
    s.key_rest.store(key_rest(span, access), Ordering::Relaxed);
    s.passed_over.store(0, Ordering::Relaxed);
    s.ptr.store(p, Ordering::Release);
}

/// What a lane release needs next.
pub(crate) enum LaneReleased {
    /// The slot still points to the entry: done (then the over-limit check).
    Done,
    /// Revoked meanwhile: run LN4.
    Detached,
}

//= spec.md#LN3
//# the owner stores `held − 1`, another thread adds 1 to `remote` (release
//# order). Light barrier; load `ptr`
#[inline(always)]
pub(crate) fn release<R: Registrar>(r: LaneRef<R>, e: *mut Entry<R>, owner: bool) -> LaneReleased {
    // SAFETY: the caller's lease keeps the generation alive.
    let s = unsafe { r.slot() };
    if owner {
        let h = s.held.load(Ordering::Relaxed);
        // `held` counts this lease's own LN1 store: it never goes below 0.
        debug_assert_ne!(h, 0, "LN3: an owner release with `held` 0");
        plain_store(&s.held, h.wrapping_sub(1));
    } else {
        s.remote.fetch_add(1, Ordering::SeqCst);
    }
    light_barrier();
    if plain_load_ptr(&s.ptr) == e {
        LaneReleased::Done
    } else {
        LaneReleased::Detached
    }
}

//= spec.md#LN3
//# The owner is the thread that holds the lane's claim when it releases.
/// Whether this thread holds the claim on `r`'s lane (then it is the only
/// writer of its `held`).
#[inline(always)]
pub(crate) fn owns<R: Registrar>(lanes: &Lanes<R>, r: LaneRef<R>) -> bool {
    lanes.mine().is_some_and(|l| l.holds(r))
}
