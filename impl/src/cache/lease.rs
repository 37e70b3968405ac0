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

impl<'c, R: Registrar + 'static> Lease<'c, R> {
    /// The same lease with its borrow of the cache erased, for an owner that
    /// keeps the cache alive by other means: [`OwnedLease`] (an `Arc`), the C
    /// API (its handle owns the cache and refuses to be destroyed while a
    /// lease is out). Costs nothing: the lease is the same bits.
    ///
    /// # Safety
    /// The cache (and so every generation it owns: old ones are freed only
    /// in its `Drop`) must outlive the returned lease.
    pub unsafe fn erase_borrow(self) -> Lease<'static, R> {
        let this = std::mem::ManuallyDrop::new(self);
        let cache: *const Cache<R> = this.cache;
        let shared: *const Shared<R> = this.shared;
        Lease {
            // SAFETY: the caller keeps the cache alive as long as the lease.
            cache: unsafe { &*cache },
            // SAFETY: a generation lives as long as its cache (see above).
            shared: unsafe { &*shared },
            entry: this.entry,
            lane: this.lane,
            hit: this.hit,
            pressure: this.pressure,
        }
    }
}

/// A lease that keeps its cache alive by itself (an `Arc` to it), for a
/// request object that releases it at completion, on any thread. It is a
/// [`Lease`] plus that `Arc`: it is counted in the same lane slot or state
/// word, and a release on the thread that took it stays on the lane fast
/// path (spec.md#LN3).
///
/// Cost: taking one clones the `Arc` and releasing it drops the clone, two
/// atomic read-modify-writes on the `Arc`'s count that a borrowed lease does
/// not pay (with two threads, on one shared cache line). Without that count
/// nothing would stop the last `Arc` from freeing the cache under a live
/// lease. Prefer [`Cache::acquire`] where a borrow fits; the C API
/// (`mrcache-capi`) pays nothing of this: its handle owns the cache, and
/// `mrcache_destroy` refuses while leases are out.
#[must_use = "dropping a lease releases it at once"]
pub struct OwnedLease<R: Registrar + 'static> {
    /// Released in `Drop` before `cache` goes.
    lease: std::mem::ManuallyDrop<Lease<'static, R>>,
    cache: std::sync::Arc<Cache<R>>,
}

impl<R: Registrar + 'static> Cache<R> {
    /// [`Cache::acquire`], returning a lease that owns a reference to the
    /// cache ([`OwnedLease`]) instead of borrowing it.
    #[inline(always)]
    pub fn acquire_owned(self: &std::sync::Arc<Self>, addr: u64, len: u64, access: mrcache_types::Access) -> Result<OwnedLease<R>, crate::Error> {
        let lease = self.acquire(addr, len, access)?;
        // SAFETY: the `Arc` cloned beside it keeps the cache alive until the
        // lease is released (`OwnedLease::drop` releases it first).
        let lease = unsafe { lease.erase_borrow() };
        Ok(OwnedLease { lease: std::mem::ManuallyDrop::new(lease), cache: std::sync::Arc::clone(self) })
    }
}

impl<R: Registrar + 'static> OwnedLease<R> {
    /// The registration: id, page-aligned byte range, access (spec.md#S1.3).
    pub fn view(&self) -> RegView {
        self.lease.view()
    }

    /// The NIC keys the registrar reported for it.
    pub fn keys(&self) -> Keys {
        self.lease.keys()
    }

    /// The registrar's handle.
    pub fn handle(&self) -> &R::Handle {
        self.lease.handle()
    }

    /// An existing entry served the acquire.
    pub fn hit(&self) -> bool {
        self.lease.hit()
    }

    /// See [`Lease::pressure`].
    pub fn pressure(&self) -> bool {
        self.lease.pressure()
    }

    /// The cache the lease belongs to.
    pub fn cache(&self) -> &std::sync::Arc<Cache<R>> {
        &self.cache
    }

    /// Releases the lease (same as dropping it).
    #[inline(always)]
    pub fn release(self) {
        drop(self)
    }
}

impl<R: Registrar + 'static> Drop for OwnedLease<R> {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: taken once, here; the field is never used again.
        let lease = unsafe { std::mem::ManuallyDrop::take(&mut self.lease) };
        lease.release();
    }
}

impl<R: Registrar + 'static> fmt::Debug for OwnedLease<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedLease").field("lease", &*self.lease).finish()
    }
}
