//! Leases (spec.md#S1.6): RAII references to a cached registration.

use super::lanes::LaneRef;
use super::entry::leased;
use super::{Cache, EntryPtr, Shared};
use crate::registrar::{Keys, Registrar};
use mrcache_types::RegView;
use std::fmt;

/// A lease on a registration. Dropping it releases it (spec.md#S2.2, R1,
/// R2). While it lives, its registration stays registered (P3), even if a
/// release event removes it from the cache meanwhile (S5.3).
#[must_use = "dropping a lease releases it at once"]
pub struct Lease<'c, R: Registrar> {
    cache: &'c Cache<R>,
    /// The generation the entry belongs to (see "Fork" in the cache docs).
    pub(super) shared: &'c Shared<R>,
    pub(super) entry: EntryPtr<R>,
    /// The lane slot whose count holds this lease (LN1), or `None` for a
    /// state-word lease.
    pub(super) lane: Option<LaneRef<R>>,
    hit: bool,
    pressure: bool,
}

// SAFETY: a lease is a counted reference to an entry whose shared parts are
// atomics or immutable (`R::Handle: Send + Sync`), and a reference to a
// `Sync` cache; releasing it from another thread is allowed (R1 needs no
// lock, R2 takes it like any operation).
unsafe impl<R: Registrar> Send for Lease<'_, R> {}
// SAFETY: as for `Send` above.
unsafe impl<R: Registrar> Sync for Lease<'_, R> {}

impl<'c, R: Registrar> Lease<'c, R> {
    pub(crate) fn new(
        cache: &'c Cache<R>,
        shared: &'c Shared<R>,
        entry: EntryPtr<R>,
        hit: bool,
        pressure: bool,
    ) -> Self {
        Lease { cache, shared, entry, lane: None, hit, pressure }
    }

    /// A lane hit (spec.md#LN1).
    #[inline(always)]
    pub(crate) fn on_lane(cache: &'c Cache<R>, shared: &'c Shared<R>, entry: EntryPtr<R>, lane: LaneRef<R>) -> Self {
        Lease { cache, shared, entry, lane: Some(lane), hit: true, pressure: false }
    }

    #[inline]
    fn entry(&self) -> &super::Entry<R> {
        leased(self)
    }

    /// The registration: id, page-aligned byte range, access (spec.md#S1.3).
    pub fn view(&self) -> RegView {
        self.entry().view
    }

    /// The NIC keys the registrar reported for it.
    pub fn keys(&self) -> Keys {
        self.entry().keys
    }

    /// The registrar's handle.
    pub fn handle(&self) -> &R::Handle {
        &self.entry().handle
    }

    /// An existing entry served the acquire.
    pub fn hit(&self) -> bool {
        self.hit
    }

    /// The registrar first failed with ENOMEM/EAGAIN and the cache evicted
    /// every unleased entry before the retry that succeeded (spec.md#S5.4).
    pub fn pressure(&self) -> bool {
        self.pressure
    }

    /// Releases the lease (same as dropping it, and what a hot loop should
    /// call: it is inlined whole, where the drop glue may not be).
    #[inline(always)]
    pub fn release(self) {
        let this = std::mem::ManuallyDrop::new(self);
        this.cache.release(&this);
    }
}

impl<R: Registrar> Drop for Lease<'_, R> {
    #[inline(always)]
    fn drop(&mut self) {
        self.cache.release(self);
    }
}

impl<R: Registrar> fmt::Debug for Lease<'_, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("view", &self.view())
            .field("hit", &self.hit)
            .field("pressure", &self.pressure)
            .finish()
    }
}
