//! libmrcache: the C API of the mrcache registration cache (include/mrcache.h,
//! generated from this crate by cbindgen; tests/header.rs keeps it fresh).
//!
//! Design: opaque handles and status codes. `mrcache_t` owns the cache (an
//! `Arc`, shared only with its monitor thread), its monitor and its lease
//! slab (`slab`). A C lease is a generation-checked value naming a slab
//! slot that holds a borrowed-lifetime-erased [`Lease`]: sound because the
//! handle outlives every lease (`mrcache_destroy` refuses while one is held),
//! and as cheap as the Rust lease plus the slot bookkeeping (no `Arc` count).
//!
//! Every entry point runs in `status::guard`: a panic becomes
//! `MRCACHE_INTERNAL`, never an unwind into C. Pointers are checked for NULL;
//! what a pointer points at cannot be checked (a freed `mrcache_t` is the
//! caller's bug, as with any C library).

#![allow(non_camel_case_types)]
#![allow(clippy::missing_safety_doc)] // the header documents each function's contract

mod escape;
mod registrar;
mod slab;
mod status;
mod sync;
#[cfg(test)]
mod tests;
mod thread_token;
mod threads;

pub use registrar::mrcache_registrar_t;
pub use slab::mrcache_lease_t;
pub use status::mrcache_status_t;

use mrcache_impl::sync::AtomicWord;
use mrcache_impl::{Cache, CacheConfig, Config, EvictionPolicy, Lease, Limits, MonitorThread, Monitoring, OverlapPolicy};
use mrcache_types::{Access, ReleaseKind};
use registrar::{not_in_callback, CRegistrar};
use slab::LeaseSlab;
use status::*;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use threads::ThreadBucket;

/// Access flags (`mrcache_acquire`'s `access`; combine with `|`). 0 is local read.
pub const MRCACHE_ACCESS_LOCAL_READ: u32 = 0;
pub const MRCACHE_ACCESS_LOCAL_WRITE: u32 = 1;
pub const MRCACHE_ACCESS_REMOTE_READ: u32 = 2;
pub const MRCACHE_ACCESS_REMOTE_WRITE: u32 = 4;
pub const MRCACHE_ACCESS_REMOTE_ATOMIC: u32 = 8;

/// The version of `mrcache_config_t` and `mrcache_stats_t` this header has.
pub const MRCACHE_ABI_VERSION: u32 = 1;

/// How overlapping registrations are cached (spec.md#S6.1).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub enum mrcache_overlap_t {
    MRCACHE_OVERLAP_INDEPENDENT = 0,
    MRCACHE_OVERLAP_MERGE = 1,
    MRCACHE_OVERLAP_NO_MERGE_UNCACHE_CONTAINED = 2,
}

/// Which unleased registration goes first when a limit is hit (spec.md#S6.3).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub enum mrcache_eviction_t {
    MRCACHE_EVICTION_LRU = 0,
    MRCACHE_EVICTION_COST_AWARE = 1,
}

/// How the cache learns that memory was released (spec.md#S3).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub enum mrcache_monitor_t {
    /// None: the caller guarantees registered memory stays mapped while cached.
    MRCACHE_MONITOR_NONE = 0,
    /// The caller reports releases with `mrcache_invalidate` (its own hooks).
    MRCACHE_MONITOR_EXPLICIT = 1,
    /// The library watches registered memory with userfaultfd and a thread
    /// of its own (spec.md#S7.3); `mrcache_invalidate` stays available.
    /// A madvise (DONTNEED, FREE, REMOVE) of watched memory keeps its pages
    /// uncached until the monitor has proven the madvise returned (spec.md#S7.5):
    /// it sends a real-time signal (`MRCACHE_PROOF_SIGNAL`, default
    /// SIGRTMAX-2) to threads that may still be inside it. The monitor does not
    /// start (`MRCACHE_UNSUPPORTED`, naming the signal) if the process already
    /// handles or ignores that signal. The handler uses SA_RESTART; calls the
    /// kernel never restarts (epoll_wait, nanosleep, ...) may return EINTR in a
    /// signalled thread, as for any signal.
    /// Every cache of the process with this monitor shares one userfaultfd and
    /// one thread (spec.md#S7.6), whatever its registrar: two caches (two NICs,
    /// two libraries) can hold registrations of the same buffer, and a release
    /// reaches both. Memory that another userfaultfd of the process already
    /// watches (the kernel's EBUSY) is served uncached, never cached unwatched
    /// (counted in `mrcache_stats_t.uncached`). Memory userfaultfd cannot
    /// watch at all, SysV shared memory (shmat) and file mappings, is refused:
    /// `mrcache_acquire` returns `MRCACHE_UNWATCHABLE` and changes nothing
    /// (memfd and MAP_SHARED|MAP_ANONYMOUS memory can be watched).
    MRCACHE_MONITOR_UFFD = 2,
}

/// Cache configuration. Fill it with `mrcache_config_init`, then change fields.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mrcache_config_t {
    /// `sizeof(mrcache_config_t)`, set by `mrcache_config_init` (the struct's version).
    pub size: u32,
    /// A `mrcache_overlap_t`.
    pub overlap: u32,
    /// A `mrcache_eviction_t`.
    pub eviction: u32,
    /// A `mrcache_monitor_t`.
    pub monitor: u32,
    /// At most this many cached registrations; 0: no limit.
    pub max_regions: u64,
    /// At most this many pinned bytes; 0: no limit.
    pub max_pinned_bytes: u64,
    /// Bound on queued release events (spec.md#L2); 0: the default (1024).
    pub max_unreleased: u64,
}

/// A registration as a lease sees it (spec.md#S1.3).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mrcache_view_t {
    /// The registration's id (creation order, from 1).
    pub id: u64,
    /// Its page-aligned start and length: it covers the acquired range.
    pub addr: *mut c_void,
    pub len: usize,
    /// Its `MRCACHE_ACCESS_*` flags (at least those acquired).
    pub access: u32,
}

/// Counters (spec.md#S5). Set `size` to `sizeof(mrcache_stats_t)` before the call.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct mrcache_stats_t {
    /// In: the caller's `sizeof(mrcache_stats_t)`. Out: the bytes written
    /// (an older header gets the fields it knows).
    pub size: u32,
    /// Out: `MRCACHE_ABI_VERSION` of the library.
    pub version: u32,
    // The counters of mrcache_types::Stats, in the order of
    // mrcache_types::for_each_stat: c_stats below names each of them, so a
    // counter missing here (or one here that Stats lacks) does not compile.
    pub acquires: u64,
    pub hits: u64,
    pub misses: u64,
    pub errors: u64,
    pub releases: u64,
    pub release_events: u64,
    pub registrations: u64,
    pub deregistrations: u64,
    pub bytes_registered: u64,
    pub pinned_bytes: u64,
    pub peak_pinned_bytes: u64,
    pub cached_entries: u64,
    pub invalidations: u64,
    pub leased_invalidations: u64,
    pub deferred_deregistrations: u64,
    pub merges: u64,
    pub uncached: u64,
    pub evictions: u64,
    pub pressure_evictions: u64,
    pub forgotten: u64,
    /// Leases held now (acquired, not yet released).
    pub leases_held: u64,
}

macro_rules! c_stats {
    ($($field:ident,)*) => {
        /// `mrcache_stats_t` of `s` (every counter [`mrcache_types::Stats`]
        /// has: [`mrcache_types::for_each_stat`]), of `size` bytes.
        fn c_stats(s: mrcache_types::Stats, size: u32, leases_held: u64) -> mrcache_stats_t {
            mrcache_stats_t { size, version: MRCACHE_ABI_VERSION, $($field: s.$field,)* leases_held }
        }
    };
}
mrcache_types::for_each_stat!(c_stats);

/// A cache (opaque).
pub struct mrcache_t {
    cache: Arc<Cache<CRegistrar>>,
    /// Stopped (joined) first in `mrcache_destroy`.
    monitor: Mutex<Option<MonitorThread>>,
    leases: LeaseSlab,
}

static NEXT_CACHE_ID: AtomicU64 = AtomicU64::new(1);

/// The next cache id from `next` ([`NEXT_CACHE_ID`] in the library; a loom
/// word in its model, `slab::models`): unique in the process while fewer
/// than 2^64 caches were made, so that two caches alive at once have
/// different slab handle tags (a handle given to the wrong cache is
/// refused unless 65535 caches were made between them) and registrar
/// marks. A `fetch_add`: two caches created at once take two ids.
#[inline(always)]
pub(crate) fn take_cache_id<W: AtomicWord>(next: &W, mutant: Option<sync::LoomMutant>) -> u64 {
    if sync::broken(mutant, sync::LoomMutant::CacheIdNotAtomic) {
        let id = next.load(Ordering::Relaxed);
        next.store(id + 1, Ordering::Relaxed);
        return id;
    }
    next.fetch_add(1, Ordering::Relaxed)
}

/// The handle behind `cache`, or NULL_ARGUMENT.
///
/// # Safety
/// `cache` is NULL or a handle from `mrcache_create` not yet destroyed.
unsafe fn handle<'a>(cache: *const mrcache_t) -> Result<&'a mrcache_t, Failure> {
    non_null(cache, "cache")?;
    // SAFETY: non-null, and the caller passes a live handle (header).
    Ok(unsafe { &*cache })
}

/// An entry point's argument checks, stated in one line (as rustls-ffi's
/// `try_ref_from_ptr!`), for a body run in [`guard`]: a failed check
/// returns its `Err`. In the order written:
/// - `non_null a, b`: each pointer is not NULL, else `MRCACHE_NULL_ARGUMENT`
///   naming it (`"a is NULL"`);
/// - `handle cache`: the handle behind `cache` ([`handle`]), the value of the
///   macro; then `; non_null ...` or `; not_in_callback` (not inside a
///   registrar callback of that cache, else `MRCACHE_BUSY`).
macro_rules! check {
    (non_null $($p:ident),+) => {
        $(non_null($p, stringify!($p))?;)+
    };
    (handle $cache:ident) => {
        // SAFETY: the caller passes NULL or a live handle (header).
        unsafe { handle($cache) }?
    };
    (handle $cache:ident; non_null $($p:ident),+) => {{
        let h = check!(handle $cache);
        check!(non_null $($p),+);
        h
    }};
    (handle $cache:ident; not_in_callback) => {{
        let h = check!(handle $cache);
        (h, not_in_callback(h.cache.registrar())?)
    }};
}

/// [`check!`] for the hit path's bodies, run in [`guard_status`]: a failed
/// check returns its status ([`fail`], [`fail_null`]). `live cache`: `cache`
/// was checked non-NULL already.
macro_rules! check_or_return {
    (non_null $($p:ident),+) => {
        $(if $p.is_null() {
            return fail_null(stringify!($p));
        })+
    };
    (live $cache:ident; not_in_callback) => {{
        // SAFETY: non-null, and the caller passes a live handle (header).
        let h = unsafe { &*$cache };
        match not_in_callback(h.cache.registrar()) {
            Ok(mine) => (h, mine),
            Err(f) => return fail(f),
        }
    }};
    (handle $cache:ident; not_in_callback) => {{
        check_or_return!(non_null $cache);
        check_or_return!(live $cache; not_in_callback)
    }};
}

#[cold]
fn bad_access(bits: u32) -> Failure {
    Failure::new(MRCACHE_INVALID_ARGUMENT, format!("access {bits:#x} has bits other than MRCACHE_ACCESS_* (0xf)"))
}

fn invalid_config(reason: impl Into<String>) -> Failure {
    Failure { status: MRCACHE_INVALID_CONFIG, errno: libc::EINVAL, message: reason.into() }
}

const CONFIG_V1_SIZE: u32 = std::mem::size_of::<mrcache_config_t>() as u32;

/// Fills `*config` with the defaults: independent overlap, LRU, no
/// monitor, no limits, `max_unreleased` 1024.
#[no_mangle]
pub unsafe extern "C-unwind" fn mrcache_config_init(config: *mut mrcache_config_t) -> mrcache_status_t {
    guard(|| {
        check!(non_null config);
        let defaults = mrcache_config_t {
            size: CONFIG_V1_SIZE,
            overlap: mrcache_overlap_t::MRCACHE_OVERLAP_INDEPENDENT as u32,
            eviction: mrcache_eviction_t::MRCACHE_EVICTION_LRU as u32,
            monitor: mrcache_monitor_t::MRCACHE_MONITOR_NONE as u32,
            max_regions: 0,
            max_pinned_bytes: 0,
            max_unreleased: 0,
        };
        // SAFETY: non-null; the caller passes a writable mrcache_config_t.
        unsafe { config.write(defaults) };
        Ok(())
    })
}

fn cache_config(c: &mrcache_config_t) -> Result<(CacheConfig, u32), Failure> {
    if c.size != CONFIG_V1_SIZE {
        return Err(invalid_config(format!(
            "config.size is {} but this library's mrcache_config_t has {CONFIG_V1_SIZE} bytes (call mrcache_config_init)",
            c.size
        )));
    }
    let policy = match c.overlap {
        0 => OverlapPolicy::Independent,
        1 => OverlapPolicy::Merge,
        2 => OverlapPolicy::NoMergeUncacheContained,
        n => return Err(invalid_config(format!("config.overlap {n} is not an mrcache_overlap_t"))),
    };
    let eviction = match c.eviction {
        0 => EvictionPolicy::Lru,
        1 => EvictionPolicy::CostAware,
        n => return Err(invalid_config(format!("config.eviction {n} is not an mrcache_eviction_t"))),
    };
    if c.monitor > mrcache_monitor_t::MRCACHE_MONITOR_UFFD as u32 {
        return Err(invalid_config(format!("config.monitor {} is not an mrcache_monitor_t", c.monitor)));
    }
    let limit = |v: u64| (v != 0).then_some(v);
    let contract = Config {
        policy,
        eviction,
        limits: Limits {
            max_regions: limit(c.max_regions),
            max_pinned_bytes: limit(c.max_pinned_bytes),
            max_unreleased: Some(limit(c.max_unreleased).unwrap_or(Limits::DEFAULT_MAX_UNRELEASED)),
        },
        ..Config::default()
    };
    let monitoring = if c.monitor == mrcache_monitor_t::MRCACHE_MONITOR_UFFD as u32 {
        Monitoring::Userfaultfd
    } else {
        // MRCACHE_MONITOR_NONE: the header's contract is mrcache_invalidate
        // (or the release hooks) on every release.
        Monitoring::Explicit
    };
    let config = CacheConfig::new(contract).monitored_by(monitoring);
    config.validate().map_err(|e| invalid_config(e.to_string()))?;
    Ok((config, c.monitor))
}

/// Creates a cache with `config` and `registrar` (copied; `registrar->ctx`
/// must stay valid until `mrcache_destroy`) into `*cache_out`.
#[no_mangle]
pub unsafe extern "C-unwind" fn mrcache_create(
    config: *const mrcache_config_t,
    registrar: *const mrcache_registrar_t,
    cache_out: *mut *mut mrcache_t,
) -> mrcache_status_t {
    guard(|| {
        check!(non_null config, registrar, cache_out);
        // SAFETY: non-null; the caller passes an initialised config. Only its
        // first 4 bytes (`size`) are read before the size is known to match.
        let size = unsafe { std::ptr::addr_of!((*config).size).read() };
        if size != CONFIG_V1_SIZE {
            return Err(invalid_config(format!(
                "config.size is {size} but this library's mrcache_config_t has {CONFIG_V1_SIZE} bytes (call mrcache_config_init)"
            )));
        }
        // SAFETY: as above, and `size` says the whole struct is there.
        let (config, monitor) = cache_config(&unsafe { config.read() })?;
        let id = take_cache_id(&NEXT_CACHE_ID, None);
        // SAFETY: non-null; the caller passes an initialised registrar.
        let r = unsafe { registrar.read() };
        let r = CRegistrar::new(&r, id).ok_or_else(|| invalid_config("registrar.reg and registrar.dereg are required"))?;
        let cache = Arc::new(Cache::try_new(r, config).map_err(Failure::from)?);
        let monitor = if monitor == mrcache_monitor_t::MRCACHE_MONITOR_UFFD as u32 {
            Some(MonitorThread::start(&cache).map_err(monitor_failure)?)
        } else {
            None
        };
        let h = Box::new(mrcache_t { cache, monitor: Mutex::new(monitor), leases: LeaseSlab::new(id) });
        // SAFETY: non-null; the caller passes a writable pointer.
        unsafe { cache_out.write(Box::into_raw(h)) };
        Ok(())
    })
}

/// Destroys a cache: deregisters everything cached and frees it. Refuses
/// with `MRCACHE_BUSY` (changing nothing) while any lease is held (in a
/// fork child: any lease taken in the child; those from before the fork
/// are void there and not waited for).
#[no_mangle]
pub unsafe extern "C-unwind" fn mrcache_destroy(cache: *mut mrcache_t) -> mrcache_status_t {
    guard(|| {
        let (h, _) = check!(handle cache; not_in_callback);
        let held = h.leases.held();
        if held > 0 {
            return Err(Failure::new(MRCACHE_BUSY, format!("{held} leases are still held: release them first")));
        }
        let monitor = h.monitor.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        drop(monitor);
        // SAFETY: from Box::into_raw in mrcache_create; the caller gives it up.
        drop(unsafe { Box::from_raw(cache) });
        Ok(())
    })
}

/// Acquires a lease on a registration covering `[addr, addr+len)` with at
/// least `access` (spec.md#S2.1) into `*lease`. On failure `*lease` is the
/// all-zero lease (when `lease` is not NULL), which no acquire returns:
/// releasing it gives `MRCACHE_INVALID_LEASE`. `addr` NULL is
/// `MRCACHE_NULL_ARGUMENT`.
#[no_mangle]
#[inline(never)]
pub unsafe extern "C-unwind" fn mrcache_acquire(
    cache: *mut mrcache_t,
    addr: *const c_void,
    len: usize,
    access: u32,
    lease: *mut mrcache_lease_t,
) -> mrcache_status_t {
    // The hit path: a `move` body (its arguments are copied, not
    // referenced), failures reported off the path by `fail`.
    guard_status(move || {
        check_or_return!(non_null cache, lease);
        // First: A1's cache misses then overlap the checks and the lane
        // probe below instead of following them (`prefetch_acquire`).
        // SAFETY: non-null, and the caller passes a live handle (header).
        unsafe { &*cache }.cache.prefetch_acquire(addr as u64);
        // Every failure leaves the all-zero lease, which is never valid.
        // SAFETY: non-null and writable (header).
        unsafe { lease.write(mrcache_lease_t { opaque: 0 }) };
        check_or_return!(non_null addr);
        let (h, mine) = check_or_return!(live cache; not_in_callback);
        let Some(access) = u8::try_from(access).ok().and_then(Access::from_bits) else {
            return fail(bad_access(access));
        };
        // The lane hit first, then A1 onwards (`acquire_past_lane`). Each
        // hands its lease out on its own branch: joined, the two would pass
        // the lease through memory, and reading it back stalls store
        // forwarding.
        match h.cache.acquire_on_lane(addr as u64, len as u64, access) {
            // SAFETY: `lease` is non-null and writable (header).
            Some(l) => unsafe { hand_out(h, mine, l, lease) },
            None => acquire_past_lane(h, mine, addr as u64, len as u64, access, lease),
        }
    })
}

/// Puts `l` in a handle slot (from `mine`, the calling thread's bucket, if
/// it has one) and writes its handle to `*lease`.
///
/// # Safety
/// `lease` is non-null and writable.
#[inline(always)]
unsafe fn hand_out(h: &mrcache_t, mine: Option<&ThreadBucket>, l: Lease<'_, CRegistrar>, lease: *mut mrcache_lease_t) -> mrcache_status_t {
    // SAFETY: the handle (which owns the cache) outlives the lease:
    // mrcache_destroy refuses while the slab holds one.
    match h.leases.insert(mine, unsafe { l.erase_borrow() }) {
        Ok(out) => {
            // SAFETY: the caller's contract.
            unsafe { lease.write(out) };
            MRCACHE_OK
        }
        Err(f) => fail(f),
    }
}

/// `mrcache_acquire` after a lane miss: A1 onwards. Inlined: a frame of
/// its own cost an A1 hit 30 instructions (607 against 577 per get+put at
/// 10^4 buffers in order, callgrind), and lane hits kept their time
/// (2026-12-06, interleaved).
#[inline(always)]
fn acquire_past_lane(
    h: &mrcache_t,
    mine: Option<&ThreadBucket>,
    addr: u64,
    len: u64,
    access: Access,
    lease: *mut mrcache_lease_t,
) -> mrcache_status_t {
    match h.cache.acquire_past_lane(addr, len, access) {
        // SAFETY: `lease` was checked non-null by the caller, writable (header).
        Ok(l) => unsafe { hand_out(h, mine, l, lease) },
        Err(e) => fail(Failure::from(e)),
    }
}

/// Releases a lease (spec.md#S2.2). A lease released already, stale or of
/// another cache gives `MRCACHE_INVALID_LEASE` and changes nothing.
#[no_mangle]
#[inline(never)]
pub unsafe extern "C-unwind" fn mrcache_release(cache: *mut mrcache_t, lease: mrcache_lease_t) -> mrcache_status_t {
    guard_status(move || {
        let (h, mine) = check_or_return!(handle cache; not_in_callback);
        if h.leases.release(mine, lease) {
            MRCACHE_OK
        } else {
            // E4: counted as a release call and an error (spec.md#S2).
            h.cache.count_unknown_release();
            fail(slab::invalid(lease))
        }
    })
}

/// The keys the registrar reported for a held lease's registration.
#[no_mangle]
pub unsafe extern "C-unwind" fn mrcache_lease_keys(
    cache: *const mrcache_t,
    lease: mrcache_lease_t,
    lkey: *mut u32,
    rkey: *mut u32,
) -> mrcache_status_t {
    guard(|| {
        let h = check!(handle cache; non_null lkey, rkey);
        let (keys, _) = h.leases.read(lease)?;
        // SAFETY: both non-null and writable (header).
        unsafe {
            lkey.write(keys.lkey);
            rkey.write(keys.rkey);
        }
        Ok(())
    })
}

/// The registration a held lease names.
#[no_mangle]
pub unsafe extern "C-unwind" fn mrcache_lease_view(
    cache: *const mrcache_t,
    lease: mrcache_lease_t,
    view: *mut mrcache_view_t,
) -> mrcache_status_t {
    guard(|| {
        let h = check!(handle cache; non_null view);
        let (_, v) = h.leases.read(lease)?;
        let out =
            mrcache_view_t { id: v.id, addr: v.addr as usize as *mut c_void, len: v.len as usize, access: u32::from(v.access.bits()) };
        // SAFETY: non-null and writable (header).
        unsafe { view.write(out) };
        Ok(())
    })
}

/// A release event: the process no longer maps `[addr, addr+len)` (or is
/// about to reuse it). Never waits for the cache lock (spec.md#H1, H2):
/// callable from memory hooks and from inside registrar callbacks.
#[no_mangle]
pub unsafe extern "C-unwind" fn mrcache_invalidate(cache: *mut mrcache_t, addr: *const c_void, len: usize) -> mrcache_status_t {
    guard(|| {
        let h = check!(handle cache; non_null addr);
        h.cache.invalidate(addr as u64, len as u64, ReleaseKind::Munmap).map_err(Failure::from)
    })
}

/// For a memory hook that runs *before* the release (Open MPI's patcher,
/// UCX's UCM, libfabric's memhooks): call it before the memory is released,
/// and [`mrcache_release_end`] with the same range after. Overlapping cached
/// registrations leave the lookup, registrations of the range in flight
/// become stale, and until the matching end no registration overlapping the
/// range is cached (acquires still succeed, served uncached), as the
/// kernel's `mmu_notifier` `invalidate_range_start`/`end` (spec.md#S1.8,
/// S2.9, W1). A plain notification before the release is unsafe: a
/// registration that starts in between would pin the frames about to go.
/// Never waits for the cache lock: callable from memory hooks and registrar
/// callbacks. `MRCACHE_EMPTY_RANGE`/`MRCACHE_WRAPPING_RANGE` open no window.
#[no_mangle]
pub unsafe extern "C-unwind" fn mrcache_release_begin(cache: *mut mrcache_t, addr: *const c_void, len: usize) -> mrcache_status_t {
    guard(|| {
        let h = check!(handle cache; non_null addr);
        h.cache.release_begin(addr as u64, len as u64).map_err(Failure::from)
    })
}

/// After the release: closes the window [`mrcache_release_begin`] opened
/// for exactly this range (spec.md#W2). With no such window:
/// `MRCACHE_UNMATCHED_RELEASE_END`, and nothing changes.
#[no_mangle]
pub unsafe extern "C-unwind" fn mrcache_release_end(cache: *mut mrcache_t, addr: *const c_void, len: usize) -> mrcache_status_t {
    guard(|| {
        let h = check!(handle cache; non_null addr);
        h.cache.release_end(addr as u64, len as u64).map_err(Failure::from)
    })
}

/// Deregisters every unleased cached registration and forgets the leased ones
/// (they are deregistered at their release).
#[no_mangle]
pub unsafe extern "C-unwind" fn mrcache_flush(cache: *mut mrcache_t) -> mrcache_status_t {
    guard(|| {
        let (h, _) = check!(handle cache; not_in_callback);
        h.cache.flush();
        Ok(())
    })
}

/// Deregisters every unleased cached registration (spec.md#S2.8).
#[no_mangle]
pub unsafe extern "C-unwind" fn mrcache_trim(cache: *mut mrcache_t) -> mrcache_status_t {
    guard(|| {
        let (h, _) = check!(handle cache; not_in_callback);
        h.cache.trim();
        Ok(())
    })
}

/// The counters, into `*stats`; set `stats->size = sizeof *stats` first.
#[no_mangle]
pub unsafe extern "C-unwind" fn mrcache_stats(cache: *const mrcache_t, stats: *mut mrcache_stats_t) -> mrcache_status_t {
    guard(|| {
        let h = check!(handle cache; non_null stats);
        // SAFETY: non-null; `size` is the first field of any version.
        let size = unsafe { std::ptr::addr_of!((*stats).size).read() } as usize;
        let ours = std::mem::size_of::<mrcache_stats_t>();
        if size < 8 {
            return Err(Failure::new(
                MRCACHE_INVALID_ARGUMENT,
                format!("stats->size is {size}: set it to sizeof(mrcache_stats_t) ({ours})"),
            ));
        }
        let n = size.min(ours);
        let out = c_stats(h.cache.stats(), n as u32, h.leases.held());
        // SAFETY: the caller's struct has `size` >= n bytes; ours has n.
        unsafe { std::ptr::copy_nonoverlapping(&out as *const _ as *const u8, stats as *mut u8, n) };
        Ok(())
    })
}

/// The message of this thread's last failed call ("" if none; valid until
/// the thread's next call into the library), and its errno (the registrar's,
/// for `MRCACHE_REGISTRAR`; 0 if none) in `*errno_out` unless NULL.
#[no_mangle]
pub unsafe extern "C" fn mrcache_last_error(errno_out: *mut c_int) -> *const c_char {
    std::panic::catch_unwind(|| status::last_error(errno_out)).unwrap_or(c"".as_ptr())
}

/// Starts the userfaultfd monitor (spec.md#S7.3) for a cache that has none:
/// one created without it, or, after `fork`, the child's cache (the parent's
/// monitor does not follow the child, whose cache caches nothing until it has
/// its own, spec.md#S2.6). `MRCACHE_BUSY` if this process's cache already
/// has a monitor; `MRCACHE_UNSUPPORTED` if userfaultfd is unavailable.
#[no_mangle]
pub unsafe extern "C-unwind" fn mrcache_monitor_start(cache: *mut mrcache_t) -> mrcache_status_t {
    guard(|| {
        let (h, _) = check!(handle cache; not_in_callback);
        let mut slot = h.monitor.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match MonitorThread::start(&h.cache) {
            Ok(m) => {
                // A parent's monitor, copied by fork, is dropped here: its
                // drop sees another pid and leaves the (absent) thread alone.
                *slot = Some(m);
                Ok(())
            }
            Err(mrcache_impl::monitor::uffd::UffdError::AlreadyMonitored) => {
                Err(Failure::new(MRCACHE_BUSY, "the cache already has a monitor in this process"))
            }
            Err(e) => Err(monitor_failure(e)),
        }
    })
}

/// A monitor that did not start: `MRCACHE_UNSUPPORTED`, with ENOSYS, or
/// EBUSY when the proof signal belongs to the application (spec.md#S7.5).
fn monitor_failure(e: mrcache_impl::monitor::uffd::UffdError) -> Failure {
    use mrcache_impl::monitor::uffd::UffdError;
    let errno = match e {
        UffdError::ProofSignal { taken: true, .. } => libc::EBUSY,
        UffdError::ProofSignal { taken: false, .. } => libc::EINVAL,
        _ => libc::ENOSYS,
    };
    Failure { status: MRCACHE_UNSUPPORTED, errno, message: format!("userfaultfd monitor: {e}") }
}

/// Fills `*out` with the built-in verbs registrar for `pd` (a `struct
/// ibv_pd *` the caller owns and keeps until `mrcache_destroy`).
/// `MRCACHE_NO_DEVICE` if the library was built without verbs.
#[no_mangle]
pub unsafe extern "C-unwind" fn mrcache_registrar_verbs(pd: *mut c_void, out: *mut mrcache_registrar_t) -> mrcache_status_t {
    guard(|| {
        check!(non_null pd, out);
        #[cfg(feature = "verbs")]
        {
            let r = mrcache_registrar_t { ctx: pd, reg: Some(registrar::verbs::reg), dereg: Some(registrar::verbs::dereg) };
            // SAFETY: non-null and writable (header).
            unsafe { out.write(r) };
            Ok(())
        }
        #[cfg(not(feature = "verbs"))]
        Err(Failure::new(MRCACHE_NO_DEVICE, "libmrcache was built without verbs (cargo feature `verbs`)"))
    })
}

/// A short name of a status ("MRCACHE_OK", ...); never NULL.
#[no_mangle]
pub extern "C" fn mrcache_status_name(status: c_int) -> *const c_char {
    status::name(status).as_ptr()
}
