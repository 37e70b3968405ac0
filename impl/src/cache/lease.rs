//! Leases (spec.md#S1.6): RAII references to a cached registration.
//!
//! # Owned leases
//!
//! [`Lease`] borrows its cache. [`OwnedLease`], taken through a
//! [`SharedCache`] handle, does not: it holds a raw pointer to the cache and
//! relies on this invariant:
//!
//! **A `SharedCache`'s cache lives while any `OwnedLease` from it lives.**
//!
//! It holds without a shared write on the hit path:
//! - an owned lease is counted on the lane of the thread that took it
//!   (`Lane::owned_taken`, owner-only plain stores) and returned on the same
//!   lane, by its owner (`owned_returned`, a plain store) or by another
//!   thread (`owned_returned_remote`, an atomic add on a line of its own:
//!   a remote release already writes the slot's `remote` anyway). The
//!   stores are `Release`, and the return is the release's **last** access
//!   to the cache's memory: the lease's own release (R1, LN3, LN4, R2, a
//!   deregistration) is done before it;
//! - where the thread has no lane (lanes off, or every lane claimed), the
//!   lease holds a handle of its own instead (an `Arc` clone: two atomic
//!   read-modify-writes, what every owned lease paid before);
//! - the last `SharedCache` handle to be dropped (the one whose
//!   `Arc::into_inner` gets the cache: exactly one, even when two are
//!   dropped at once, and then no handle is left to make another), sums the
//!   outstanding owned leases over every lane of every generation (old
//!   generations, replaced by a fork or `simulate_fork`, live as long as the
//!   cache and are chained from the current one). If any is out, it leaks
//!   the cache (`Diagnostics::leaked_for_owned_leases`); a lease that outlives
//!   every handle is a program that never gives it back, or gives it back
//!   late, and the cache must stay valid for it either way.
//!
//! Why a sum of 0 means no release can touch the cache afterwards: every
//! owned acquire went through a handle, and every other handle was dropped
//! before the last one took the cache (the `Arc`'s `Release` decrements,
//! then an `Acquire` fence), so every take is visible to it. A
//! return is read with an `Acquire` load, which makes the whole release
//! before it happen before the drop. Returns are only ever undercounted by a
//! stale read (which leaks, never frees early), so a sum of 0 means every
//! lease taken has done its last access, and the cache can go.

use super::config::CacheConfig;
use super::counters::add;
use super::entry::{Entry, EntryPtr};
use super::generation::Generation;
use super::lanes::{Lane, LaneRef};
use super::Cache;
use crate::registrar::{Keys, Registrar};
use mrcache_types::{Access, Range, RegView};
use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::Arc;

/// The entry a lease keeps alive, for as long as the lease is borrowed.
#[inline]
pub(super) fn leased<'l, R: Registrar>(lease: &'l Lease<'_, R>) -> &'l Entry<R> {
    // SAFETY: the lease keeps the entry alive (A-H: nobody frees an entry
    // with leases; forgotten generations are freed, if ever, only in the
    // cache's `Drop`, which no lease outlives).
    unsafe { lease.entry.get() }
}

/// A lease on a registration. Dropping it releases it (spec.md#S2.2, R1,
/// R2). While it lives, its registration stays registered (P3), even if a
/// release event removes it from the cache meanwhile (S5.3).
///
/// ```
/// use mrcache::registrar::counting::CountingRegistrar;
/// use mrcache::types::Access;
/// use mrcache::{Cache, CacheConfig};
///
/// # fn main() -> Result<(), mrcache::Error> {
/// let cache = Cache::new(CountingRegistrar::default(), CacheConfig::explicit());
/// let buf = vec![0u8; 16 << 10];
/// let lease = cache.acquire_slice(&buf[4096..8192], Access::REMOTE_READ)?;
/// let keys = lease.keys(); // post the work request with keys.lkey / keys.rkey
/// let view = lease.view(); // the registration: it covers the request
/// assert!(view.addr <= buf[4096..].as_ptr() as u64);
/// assert!(view.access.suffices_for(Access::REMOTE_READ));
/// let _ = keys;
/// drop(lease); // at completion
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping a lease releases it at once"]
pub struct Lease<'c, R: Registrar> {
    cache: &'c Cache<R>,
    /// The generation the entry belongs to (see "Fork" in the cache docs).
    pub(super) shared: &'c Generation<R>,
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
    pub(crate) fn new(cache: &'c Cache<R>, shared: &'c Generation<R>, entry: EntryPtr<R>, hit: bool, pressure: bool) -> Self {
        Lease { cache, shared, entry, lane: None, hit, pressure }
    }

    /// A lane hit (spec.md#LN1).
    #[inline(always)]
    pub(crate) fn on_lane(cache: &'c Cache<R>, shared: &'c Generation<R>, entry: EntryPtr<R>, lane: LaneRef<R>) -> Self {
        Lease { cache, shared, entry, lane: Some(lane), hit: true, pressure: false }
    }

    #[inline]
    fn entry(&self) -> &Entry<R> {
        leased(self)
    }

    /// The registration: id, page-aligned byte range, access (spec.md#S1.3).
    pub fn view(&self) -> RegView {
        self.entry().view()
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
        f.debug_struct("Lease").field("view", &self.view()).field("hit", &self.hit).field("pressure", &self.pressure).finish()
    }
}

impl<'c, R: Registrar + 'static> Lease<'c, R> {
    /// The same lease with its borrow of the cache erased, for an owner that
    /// keeps the cache alive by other means: [`OwnedLease`] (its count), the C
    /// API (its handle owns the cache and refuses to be destroyed while a
    /// lease is out). Costs nothing: the lease is the same bits.
    ///
    /// # Safety
    /// The cache (and so every generation it owns: old ones are freed only
    /// in its `Drop`) must outlive the returned lease.
    pub unsafe fn erase_borrow(self) -> Lease<'static, R> {
        let this = std::mem::ManuallyDrop::new(self);
        let cache: *const Cache<R> = this.cache;
        let shared: *const Generation<R> = this.shared;
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

/// A handle that owns a cache (an `Arc` to it) and hands out
/// [`OwnedLease`]s. Cloning it clones the `Arc`; it dereferences to the
/// [`Cache`]. See "Owned leases" in this module's docs for the invariant:
/// the cache lives while any owned lease from it lives, even after the last
/// handle is dropped (the cache is then leaked, and
/// `Diagnostics::leaked_for_owned_leases` says so).
///
/// The `Arc` is never handed out (a bare `Arc` dropped last would free the
/// cache without the check); [`crate::monitor::MonitorThread::start_shared`]
/// keeps a handle, not an `Arc`.
///
/// ```
/// use mrcache::registrar::counting::CountingRegistrar;
/// use mrcache::types::Access;
/// use mrcache::{CacheConfig, MonitorThread, Monitoring, SharedCache};
///
/// # fn main() -> Result<(), mrcache::Error> {
/// let config = CacheConfig::default().monitored_by(Monitoring::Userfaultfd);
/// let cache = SharedCache::new(CountingRegistrar::default(), config);
/// let _monitor = MonitorThread::start_shared(&cache).ok();
/// let buf = vec![0u8; 8192];
/// // An owned lease: 'static, released wherever it is dropped.
/// let lease = cache.acquire_owned_slice(&buf, Access::LOCAL_WRITE | Access::REMOTE_READ)?;
/// let completion = std::thread::spawn(move || {
///     let _rkey = lease.keys().rkey; // handed to the peer
///     drop(lease); // the transfer completed
/// });
/// completion.join().unwrap();
/// assert_eq!(cache.stats().releases, 1);
/// # Ok(())
/// # }
/// ```
pub struct SharedCache<R: Registrar + 'static>(ManuallyDrop<CacheArc<R>>);

/// The cache is boxed inside the `Arc` so that the last handle can take it
/// out atomically (`Arc::into_inner`: exactly one of two handles dropped at
/// once gets it, where a `strong_count` test before the drop would let both
/// pass) *without moving it*: the leases point into the box, which is leaked
/// or freed in place.
#[allow(clippy::redundant_allocation)]
type CacheArc<R> = Arc<Box<Cache<R>>>;

impl<R: Registrar + 'static> SharedCache<R> {
    /// The handle of a new cache (see [`Cache::new`]).
    ///
    /// # Panics
    ///
    /// If the configuration is invalid (see [`Cache::try_new`]).
    pub fn new(registrar: R, config: impl Into<CacheConfig>) -> Self {
        Self::from(Cache::new(registrar, config))
    }

    /// [`Cache::acquire_slice`], returning a lease that refers to the cache
    /// by itself ([`OwnedLease`]), for a request object released at
    /// completion, on any thread. On the hit path it writes no shared cache
    /// line and allocates nothing: it is a [`Lease`] (the lane slot, or the
    /// state word) plus one owner-only count on this thread's lane.
    #[inline(always)]
    pub fn acquire_owned_slice<T>(&self, buf: &[T], access: Access) -> Result<OwnedLease<R>, crate::Error> {
        self.acquire_owned(buf.as_ptr() as u64, std::mem::size_of_val(buf) as u64, access)
    }

    /// [`Cache::acquire`], returning a lease that refers to the cache by
    /// itself ([`OwnedLease`]): see [`Self::acquire_owned_slice`] for a
    /// buffer.
    #[inline(always)]
    pub fn acquire_owned(&self, addr: u64, len: u64, access: Access) -> Result<OwnedLease<R>, crate::Error> {
        let cache: &Cache<R> = self;
        let shared = cache.shared();
        let range = Range::new(addr, len);
        if let Ok(range) = range {
            if let Some((lease, lane)) = cache.lane_hit_mine(shared, range, access) {
                lane.count_owned_taken();
                // SAFETY: as below.
                let lease = unsafe { lease.erase_borrow() };
                return Ok(OwnedLease { lease: ManuallyDrop::new(lease), counted: Counted::Lane(NonNull::from(lane)) });
            }
        }
        let lease = cache.acquire_locked(shared, range, access)?;
        // This thread's lane in the lease's generation (claimed by the
        // acquire already, unless lanes are off or none was free). `mine`
        // again after a claim: a claim made while the thread's locals are
        // being destroyed is given back at once, and then the lane is not
        // this thread's to count on.
        let lanes = &lease.shared.lanes;
        let lane = if cache.lanes_on { lanes.mine().or_else(|| lanes.mine_or_claim().and_then(|_| lanes.mine())) } else { None };
        let counted = match lane {
            Some(lane) => {
                lane.count_owned_taken();
                Counted::Lane(NonNull::from(lane))
            }
            None => Counted::Handle(self.clone()),
        };
        // SAFETY: the count just taken (or the handle) keeps the cache alive
        // until the lease is released (see the module docs);
        // `OwnedLease::drop` releases the lease before it returns the count.
        let lease = unsafe { lease.erase_borrow() };
        Ok(OwnedLease { lease: ManuallyDrop::new(lease), counted })
    }

    /// Handles to the cache, counting those that owned leases taken without
    /// a lane hold. For tests and diagnostics.
    pub fn handle_count(&self) -> usize {
        Arc::strong_count(&self.0)
    }

    fn cache(&self) -> &Cache<R> {
        &self.0
    }
}

impl<R: Registrar + 'static> From<Cache<R>> for SharedCache<R> {
    fn from(cache: Cache<R>) -> Self {
        SharedCache(ManuallyDrop::new(Arc::new(Box::new(cache))))
    }
}

impl<R: Registrar + 'static> Clone for SharedCache<R> {
    fn clone(&self) -> Self {
        SharedCache(ManuallyDrop::new(Arc::clone(&self.0)))
    }
}

impl<R: Registrar + 'static> Deref for SharedCache<R> {
    type Target = Cache<R>;
    fn deref(&self) -> &Cache<R> {
        self.cache()
    }
}

impl<R: Registrar + 'static> fmt::Debug for SharedCache<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SharedCache").field(self.cache()).finish()
    }
}

impl<R: Registrar + 'static> Drop for SharedCache<R> {
    fn drop(&mut self) {
        // SAFETY: taken once, here; the field is never used again.
        let arc = unsafe { ManuallyDrop::take(&mut self.0) };
        // Only the last handle gets the cache: `into_inner` decrements the
        // strong count (`Release`) and, for the one that takes it to 0, runs
        // an `Acquire` fence. Every other handle was dropped before, so
        // every owned acquire made through one, and so its take, happens
        // before what follows. No handle is left to make a new one.
        let Some(cache) = Arc::into_inner(arc) else { return };
        if cache.owned_outstanding() > 0 {
            // Leases still out will touch the cache when they are released:
            // leak it, in place (they point into the box). A sum of 0
            // instead means each lease's return, its last access to the
            // cache, was read with `Acquire`, so the whole release happens
            // before this drop: the cache can go.
            add(&cache.counters.leaked_for_owned_leases, 1);
            let _leaked: &mut Cache<R> = Box::leak(cache);
        }
    }
}

/// How an [`OwnedLease`] is counted.
enum Counted<R: Registrar> {
    /// On this lane (its `owned_taken`): the lane lives as long as the
    /// cache, which the count keeps alive.
    Lane(NonNull<Lane<R>>),
    /// By a handle of its own (no lane was available): its drop, after the
    /// release, is a handle's drop, with its check.
    Handle(#[allow(dead_code, reason = "held for its drop")] SharedCache<R>),
}

/// A lease that refers to its cache by itself, from
/// [`SharedCache::acquire_owned`], for a request object that releases it at
/// completion, on any thread. It is a [`Lease`] plus a count on the lane of
/// the thread that took it: it is counted in the same lane slot or state
/// word, a release on the thread that took it stays on the lane fast path
/// (spec.md#LN3), and neither the acquire nor that release writes a shared
/// cache line or allocates. The cache lives as long as it (see "Owned
/// leases" in the module docs).
#[must_use = "dropping a lease releases it at once"]
pub struct OwnedLease<R: Registrar + 'static> {
    /// Released in `Drop`, before the count is returned.
    lease: ManuallyDrop<Lease<'static, R>>,
    counted: Counted<R>,
}

// SAFETY: a `Lease` (which is `Send + Sync`) plus a pointer to a lane whose
// owned-lease counts any thread may return (the owner with a plain store
// after checking that it holds the lane's claim, any other thread with an
// atomic add); the lane lives as long as the cache, which the count keeps
// alive.
unsafe impl<R: Registrar + 'static> Send for OwnedLease<R> {}
// SAFETY: `&OwnedLease` only reads the lease (as for `Lease`).
unsafe impl<R: Registrar + 'static> Sync for OwnedLease<R> {}

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

    /// The cache the lease belongs to (alive as long as the lease).
    pub fn cache(&self) -> &Cache<R> {
        self.lease.cache
    }

    /// Whether the lease is counted on a lane (else it holds a handle of the
    /// cache: lanes off, or no lane was free).
    pub fn on_lane(&self) -> bool {
        matches!(self.counted, Counted::Lane(_))
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
        match &self.counted {
            Counted::Lane(lane) => {
                // SAFETY: our count is not returned yet, so the cache, its
                // generations and their lanes are alive (module docs).
                let lane = unsafe { lane.as_ref() };
                // The release, then the return of the count as its last
                // access to the cache. `self.lease` is not dropped (it is
                // in a `ManuallyDrop`): this is its release.
                self.lease.cache.release_owned(&self.lease, lane);
            }
            Counted::Handle(_) => {
                // SAFETY: taken once, here; the field is never used again.
                let lease = unsafe { ManuallyDrop::take(&mut self.lease) };
                // The handle goes with `self`, after the release.
                lease.release();
            }
        }
    }
}

impl<R: Registrar + 'static> fmt::Debug for OwnedLease<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedLease").field("lease", &*self.lease).field("on_lane", &self.on_lane()).finish()
    }
}
