//! The stale-DMA oracle: the cache on real memory, checked by the loopback NIC.
//!
//! # Set-up
//!
//! An *arena* of `slots` slots of `slot_pages` pages each (anonymous,
//! private). Worker threads and churner threads share it; each slot has a
//! lock, held by a worker from before its acquire until after its lease is
//! released, and by a churner while it changes the slot's memory. So a
//! churner only touches slots that are not leased at that moment (releasing
//! a leased buffer is a user error, spec.md#S5.3, and would give false
//! reports), and a worker's acquire + DMA + check never races a churn of its
//! own slot.
//!
//! The cache uses the io_uring registrar ([`UringRegistrar`]: real long-term
//! pins) wrapped in a [`TestRegistrar`] that records each registration's
//! PFNs, and one of two monitors:
//! - [`MonitorKind::Uffd`]: the userfaultfd monitor ([`MonitorThread`], M1/M2);
//! - [`MonitorKind::Explicit`]: churners call [`Cache::invalidate`] after
//!   each release, before unlocking the slot (a synchronous hook reports
//!   after the frames are released and before the releasing call returns,
//!   spec.md#S1.8, S3.9).
//!
//! # Churn
//!
//! Churners pick a random unlocked slot and one of: `madvise(DONTNEED)` of
//! some of its pages; `munmap` + `mmap` of some pages at the same address;
//! `mmap(MAP_FIXED)` over some pages; `mremap` of the whole slot away (to a
//! scratch area) and a fresh `mmap` in its place; `mremap` shrinking the
//! slot in place and a fresh `mmap` of the tail. Every one leaves the
//! addresses backed by new frames. Churners are paced to `churn_per_100`
//! churns per 100 acquires.
//!
//! With `churn_in_register`, the registrar itself releases a page of the
//! range it just pinned (`madvise(DONTNEED)`, then `invalidate` with the
//! explicit monitor) from inside `register`, on the acquiring thread: the
//! register-vs-invalidate race of spec.md#S3.7 for real, and "a registrar
//! that frees memory while registering" (P6).
//!
//! # The oracles
//!
//! After every successful acquire (worker holding the slot lock):
//! 1. **DMA**: `dma_write` of a fresh pattern through the lease (the kernel
//!    copies into the frames the registration pinned), then read the
//!    application's mapping at the requested addresses: it must hold the
//!    pattern. If not, the registration was stale: a **stale DMA**.
//! 2. **PFN** (where `/proc/self/pagemap` shows frame numbers, i.e. as
//!    root): at grant time, the frames the registration pinned for the
//!    requested pages equal the frames the mapping has now.
//! 3. P1: the registration covers the request with sufficient access.
//!
//! An acquire is **churned** if some requested page was churned since it was
//! last granted: exactly the acquires a cache without invalidation would get
//! wrong. The report counts them; a run where they are rare proves nothing.
//!
//! After the run every lease is gone; the cache is flushed and must hold no
//! registration, and the registrar must have deregistered every
//! registration exactly once.
//!
//! # One run per process at a time
//!
//! A churn opens holes in the arena for a moment. Every thread of a run is
//! started before the first churn, but a thread created elsewhere in the
//! process meanwhile could get its stack or signal stack mapped into a hole
//! (seen: Rust's per-thread sigaltstack), and the harness would then DMA
//! into it. Tests that use the harness hold a lock (see
//! `impl/tests/dma_oracle.rs`); `mrcache fuzz` runs its layers one after
//! the other.

use super::registrar::TestRegistrar;
use super::rng::{mix, Rng};
use crate::cache::Diagnostics;
use crate::monitor::MonitorThread;
use crate::pagemap;
use crate::registrar::uring::UringRegistrar;
use crate::{Cache, CacheConfig, Faults};
use mrcache_model::{Config, OverlapPolicy};
use mrcache_types::{Access, Range, ReleaseKind, Stats};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// Which monitor tells the cache about releases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MonitorKind {
    /// userfaultfd, read by a monitor thread and by the cache's slow paths.
    Uffd,
    /// The churners call `Cache::invalidate` after every release.
    Explicit,
}

/// What one churn does to a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Churn {
    Dontneed,
    MunmapMmap,
    MapFixed,
    MremapMove,
    MremapShrink,
}

impl Churn {
    pub const ALL: [Churn; 5] =
        [Churn::Dontneed, Churn::MunmapMmap, Churn::MapFixed, Churn::MremapMove, Churn::MremapShrink];

    fn kind(self) -> ReleaseKind {
        match self {
            Churn::Dontneed => ReleaseKind::MadviseDontneed,
            Churn::MunmapMmap => ReleaseKind::Munmap,
            Churn::MapFixed => ReleaseKind::MapFixedOver,
            Churn::MremapMove | Churn::MremapShrink => ReleaseKind::MremapSource,
        }
    }
}

/// The run's parameters.
#[derive(Clone, Debug)]
pub struct DmaConfig {
    pub seed: u64,
    /// Acquires (each followed by a DMA and its check), over all workers.
    pub ops: u64,
    /// Stop earlier when this much time has passed.
    pub time_limit: Option<Duration>,
    pub workers: u32,
    pub churners: u32,
    pub slots: u64,
    pub slot_pages: u64,
    pub policy: OverlapPolicy,
    pub monitor: MonitorKind,
    pub faults: Faults,
    /// Per mille of `register` calls that release a page of their range.
    pub churn_in_register: u64,
    /// Pacing: churns per 100 acquires.
    pub churn_per_100: u64,
    /// Check PFNs at grant time (when pagemap shows them).
    pub pagemap: bool,
}

impl Default for DmaConfig {
    fn default() -> Self {
        DmaConfig {
            seed: 1,
            ops: 20_000,
            time_limit: None,
            workers: 2,
            churners: 2,
            slots: 64,
            slot_pages: 4,
            policy: OverlapPolicy::Independent,
            monitor: MonitorKind::Uffd,
            faults: Faults::default(),
            churn_in_register: 0,
            churn_per_100: 25,
            pagemap: true,
        }
    }
}

/// What a run saw.
#[derive(Clone, Debug)]
pub struct DmaReport {
    /// Acquires attempted.
    pub ops: u64,
    pub granted: u64,
    pub hits: u64,
    pub misses: u64,
    /// Failed acquires by error code (E6 is expected with `churn_in_register`).
    pub errors: BTreeMap<String, u64>,
    /// Errors no configuration explains.
    pub unexpected_errors: u64,
    pub first_unexpected_error: Option<String>,
    /// DMAs the application's mapping did not see.
    pub stale_dmas: u64,
    pub first_stale: Option<String>,
    /// Grants whose registration did not cover the request (P1).
    pub coverage_violations: u64,
    /// `dma_write` calls that failed.
    pub dma_failures: u64,
    /// Grants whose pinned PFNs were compared with the mapping's.
    pub pfn_checked: u64,
    pub pfn_mismatches: u64,
    /// Why PFNs were not checked, if they were not.
    pub pfn_skipped: Option<String>,
    /// Acquires on a range churned since it was last granted.
    pub churned_acquires: u64,
    /// Of those, the ones a cache hit served (the cache found a newer entry).
    pub churned_hits: u64,
    pub churns: BTreeMap<String, u64>,
    /// Pages released from inside `register`.
    pub register_churns: u64,
    /// Slots given up because the kernel put another mapping in a hole.
    pub dead_slots: u64,
    pub elapsed: Duration,
    pub stats: Stats,
    pub diagnostics: Diagnostics,
    pub monitor_rounds: u64,
    /// `Err` if the cache or registrar held anything after the final flush.
    pub cleanup: Result<(), String>,
}

impl DmaReport {
    /// Violations of the contract: stale DMAs, PFN mismatches, coverage,
    /// failed DMAs, unexpected errors, and a dirty cleanup.
    pub fn violations(&self) -> u64 {
        self.stale_dmas
            + self.pfn_mismatches
            + self.coverage_violations
            + self.dma_failures
            + self.unexpected_errors
            + u64::from(self.cleanup.is_err())
    }

    pub fn churns_total(&self) -> u64 {
        self.churns.values().sum()
    }

    /// A one-paragraph summary.
    pub fn render(&self) -> String {
        format!(
            "{} acquires in {:.2} s ({:.0}/s): {} granted ({} hits, {} misses), errors {:?}; \
             {} stale DMAs, {} PFN mismatches of {} checked{}, {} coverage violations, {} DMA failures, \
             {} unexpected errors; {} churned acquires ({} served by hits); churns {:?} + {} inside register; \
             {} dead slots; cleanup {}",
            self.ops,
            self.elapsed.as_secs_f64(),
            self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9),
            self.granted,
            self.hits,
            self.misses,
            self.errors,
            self.stale_dmas,
            self.pfn_mismatches,
            self.pfn_checked,
            self.pfn_skipped.as_ref().map(|s| format!(" (PFN check skipped: {s})")).unwrap_or_default(),
            self.coverage_violations,
            self.dma_failures,
            self.unexpected_errors,
            self.churned_acquires,
            self.churned_hits,
            self.churns,
            self.register_churns,
            self.dead_slots,
            match &self.cleanup {
                Ok(()) => "clean".to_string(),
                Err(e) => e.clone(),
            }
        )
    }
}

type DmaCache = Cache<TestRegistrar<UringRegistrar>>;

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_READ).union(Access::REMOTE_WRITE);

use crate::mem::page_size;

/// Anonymous private read-write pages at `addr` (`MAP_FIXED` replaces what
/// is there; `MAP_FIXED_NOREPLACE` fails if anything is). `Err(errno)`.
fn map_at(addr: u64, len: u64, fixed: libc::c_int, prot: libc::c_int) -> Result<(), i32> {
    // SAFETY: callers pass page-aligned ranges inside mappings this harness
    // owns (arena slots, scratch areas) and hold the slot's lock, so no Rust
    // reference into them is live; MAP_FIXED_NOREPLACE never replaces anything.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len as usize,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | fixed,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO));
    }
    if p as u64 != addr {
        // An old kernel took NOREPLACE as a hint: undo, report EEXIST.
        // SAFETY: the mapping we just got, nobody else knows of it.
        unsafe { libc::munmap(p, len as usize) };
        return Err(libc::EEXIST);
    }
    Ok(())
}

const RW_PROT: libc::c_int = libc::PROT_READ | libc::PROT_WRITE;

/// The mappings the harness owns; unmapped on drop (after the cache is gone).
struct Arena {
    base: u64,
    len: u64,
    scratch: Vec<u64>,
    slot_bytes: u64,
}

impl Arena {
    fn new(slots: u64, slot_bytes: u64, scratch: u32) -> Result<Arena, String> {
        let len = slots * slot_bytes;
        let base = crate::mem::map_anon(len, 0).map_err(|e| format!("arena mmap of {len} bytes: {e}"))?;
        let mut arena = Arena { base, len, scratch: Vec::new(), slot_bytes };
        for _ in 0..scratch {
            // SAFETY: as above; PROT_NONE reservations for mremap targets.
            let s = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    slot_bytes as usize,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if s == libc::MAP_FAILED {
                return Err(format!("scratch mmap: {}", std::io::Error::last_os_error()));
            }
            arena.scratch.push(s as u64);
        }
        // Touch every page.
        // SAFETY: our fresh writable mapping of `len` bytes; no reference into it exists.
        unsafe { std::ptr::write_bytes(arena.base as *mut u8, 0x5a, len as usize) };
        Ok(arena)
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: our own mappings (holes left by dead slots are harmless to munmap).
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.len as usize);
            for &s in &self.scratch {
                libc::munmap(s as *mut libc::c_void, self.slot_bytes as usize);
            }
        }
    }
}

struct SlotState {
    /// A hole could not be refilled (another mapping took it): never used again.
    dead: bool,
    /// Per page: the churn count when it was last granted.
    seen: Vec<Option<u64>>,
}

/// Counters the threads share.
#[derive(Default)]
struct Counters {
    issued: AtomicU64,
    done: AtomicU64,
    granted: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    stale: AtomicU64,
    coverage: AtomicU64,
    dma_failures: AtomicU64,
    pfn_checked: AtomicU64,
    pfn_mismatches: AtomicU64,
    churned: AtomicU64,
    churned_hits: AtomicU64,
    churns: AtomicU64,
    churn_kinds: [AtomicU64; 5],
    dead_slots: AtomicU64,
    unexpected: AtomicU64,
}

struct Ctx<'a> {
    cfg: &'a DmaConfig,
    cache: &'a DmaCache,
    base: u64,
    page: u64,
    slot_bytes: u64,
    slots: Vec<Mutex<SlotState>>,
    /// Churns per page (atomic: the registrar hook bumps them while the
    /// acquiring worker holds the slot's lock).
    churn: Arc<Vec<AtomicU64>>,
    pfn: bool,
    c: Counters,
    stop: AtomicBool,
    errors: Mutex<BTreeMap<String, u64>>,
    first_stale: Mutex<Option<String>>,
    first_unexpected: Mutex<Option<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs the harness (see the module docs). `progress` receives the number of
/// acquires done so far, for progress bars. `Err` if the set-up failed
/// (io_uring or userfaultfd unavailable, mmap refused).
pub fn run(cfg: &DmaConfig, progress: Option<&AtomicU64>) -> Result<DmaReport, String> {
    let page = page_size();
    let slot_bytes = cfg.slot_pages.max(1) * page;
    if cfg.slots == 0 || cfg.workers == 0 {
        return Err("need at least one slot and one worker".into());
    }
    // Transparent huge pages would let the kernel move unpinned frames
    // behind our back (collapse/split); 4 KiB pages keep the PFN oracle exact.
    // SAFETY: prctl with plain integer arguments.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    let arena = Arena::new(cfg.slots, slot_bytes, cfg.churners)?;
    let pfn_available = pagemap::pfns_available();
    let pfn = cfg.pagemap && pfn_available;
    let registrar = UringRegistrar::with_defaults().map_err(|e| format!("io_uring registrar: {e}"))?;
    let mut cc = CacheConfig::new(Config { policy: cfg.policy, page_size: page, ..Config::default() });
    cc.faults = cfg.faults;
    let cache: Arc<DmaCache> = Arc::new(Cache::new(TestRegistrar::new(registrar).logging(false).record_pfns(pfn), cc));
    let churn: Arc<Vec<AtomicU64>> = Arc::new((0..cfg.slots * cfg.slot_pages).map(|_| AtomicU64::new(0)).collect());
    let register_churns = Arc::new(AtomicU64::new(0));
    if cfg.churn_in_register > 0 {
        install_register_churn(&cache, cfg, arena.base, page, churn.clone(), register_churns.clone());
    }
    let monitor = match cfg.monitor {
        MonitorKind::Uffd => Some(MonitorThread::start(&cache).map_err(|e| format!("userfaultfd monitor: {e}"))?),
        MonitorKind::Explicit => None,
    };
    let ctx = Ctx {
        cfg,
        cache: &cache,
        base: arena.base,
        page,
        slot_bytes,
        slots: (0..cfg.slots)
            .map(|_| Mutex::new(SlotState { dead: false, seen: vec![None; cfg.slot_pages as usize] }))
            .collect(),
        churn,
        pfn,
        c: Counters::default(),
        stop: AtomicBool::new(false),
        errors: Mutex::new(BTreeMap::new()),
        first_stale: Mutex::new(None),
        first_unexpected: Mutex::new(None),
    };
    // Every thread exists before the first churn: a thread created while a
    // churn has a hole open could get its stack or signal stack mapped into
    // it (seen: Rust's per-thread sigaltstack, a guard page and two pages).
    let ready = std::sync::Barrier::new((cfg.workers + cfg.churners + 1) as usize);
    let start = Instant::now();
    std::thread::scope(|s| {
        for w in 0..cfg.workers {
            let (ctx, ready) = (&ctx, &ready);
            s.spawn(move || worker(ctx, w, ready));
        }
        for c in 0..cfg.churners {
            let (ctx, scratch, ready) = (&ctx, arena.scratch[c as usize], &ready);
            s.spawn(move || {
                ready.wait();
                churner(ctx, c, scratch)
            });
        }
        ready.wait();
        // The calling thread: progress and the time limit.
        loop {
            let done = ctx.c.done.load(Relaxed);
            if let Some(p) = progress {
                p.store(done, Relaxed);
            }
            if done >= cfg.ops || ctx.stop.load(Relaxed) {
                break;
            }
            if cfg.time_limit.is_some_and(|t| start.elapsed() >= t) {
                ctx.stop.store(true, Relaxed);
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    let elapsed = start.elapsed();
    if let Some(p) = progress {
        p.store(ctx.c.done.load(Relaxed), Relaxed);
    }
    // Teardown: no lease is held any more. Stop the monitor thread first: a
    // monitor round still running may hold registrations it took out of the
    // index and will deregister after its unlock (spec.md#L1: before the end
    // of the round), so a check beside it reads a registration in transit as
    // a leak. That false alarm is issue 10's "1 registrations live ... 0
    // entries cached" (impl/tests/oracle.rs reproduces it).
    let monitor_rounds = monitor.as_ref().map_or(0, MonitorThread::rounds);
    drop(monitor);
    cache.flush();
    let reg = cache.registrar();
    let stats = cache.stats();
    let doubles = reg.double_deregistrations.load(Relaxed);
    let in_use = reg.inner.in_use();
    let live = reg.live();
    let cleanup = if live != 0
        || in_use != 0
        || doubles != 0
        || stats.pinned_bytes != 0
        || stats.cached_entries != 0
    {
        Err(format!(
            "after the final flush: {live} registrations live, {in_use} io_uring slots in use, {doubles} double deregistrations, \
             {} bytes pinned, {} entries cached",
            stats.pinned_bytes,
            stats.cached_entries
        ))
    } else {
        Ok(())
    };
    let diagnostics = cache.diagnostics();
    let c = &ctx.c;
    let report = DmaReport {
        ops: c.done.load(Relaxed),
        granted: c.granted.load(Relaxed),
        hits: c.hits.load(Relaxed),
        misses: c.misses.load(Relaxed),
        errors: lock(&ctx.errors).clone(),
        unexpected_errors: c.unexpected.load(Relaxed),
        first_unexpected_error: lock(&ctx.first_unexpected).clone(),
        stale_dmas: c.stale.load(Relaxed),
        first_stale: lock(&ctx.first_stale).clone(),
        coverage_violations: c.coverage.load(Relaxed),
        dma_failures: c.dma_failures.load(Relaxed),
        pfn_checked: c.pfn_checked.load(Relaxed),
        pfn_mismatches: c.pfn_mismatches.load(Relaxed),
        pfn_skipped: if !cfg.pagemap {
            Some("disabled".into())
        } else if !pfn_available {
            Some("/proc/self/pagemap hides frame numbers (needs root / CAP_SYS_ADMIN)".into())
        } else {
            None
        },
        churned_acquires: c.churned.load(Relaxed),
        churned_hits: c.churned_hits.load(Relaxed),
        churns: Churn::ALL
            .iter()
            .enumerate()
            .map(|(i, k)| (format!("{k:?}"), c.churn_kinds[i].load(Relaxed)))
            .collect(),
        register_churns: register_churns.load(Relaxed),
        dead_slots: c.dead_slots.load(Relaxed),
        elapsed,
        stats,
        diagnostics,
        monitor_rounds,
        cleanup,
    };
    // Order matters: the monitor thread (it holds the cache) stopped above;
    // drop the cache (closing the userfaultfd: nothing waits for events any
    // more), then unmap the arena.
    drop(ctx);
    drop(cache);
    drop(arena);
    Ok(report)
}

/// The registrar hook of `churn_in_register`: release one page of the range
/// just pinned, on the acquiring thread (which holds the slot's lock).
fn install_register_churn(
    cache: &Arc<DmaCache>,
    cfg: &DmaConfig,
    base: u64,
    page: u64,
    churn: Arc<Vec<AtomicU64>>,
    count: Arc<AtomicU64>,
) {
    let weak: Weak<DmaCache> = Arc::downgrade(cache);
    let calls = AtomicU64::new(0);
    let (seed, per_mille, explicit) = (cfg.seed, cfg.churn_in_register, cfg.monitor == MonitorKind::Explicit);
    cache.registrar().set_hook(Box::new(move |range: Range| {
        let n = calls.fetch_add(1, Relaxed);
        let mut rng = Rng::new(seed).split(0x5eed_0000_0000 + n);
        if !rng.chance(per_mille, 1000) {
            return;
        }
        let span = range.pages(page);
        let p = span.first + rng.below(span.count());
        // SAFETY: the page is inside the slot the acquiring thread has locked
        // (registrations never leave the requested slot, see `worker`); no
        // Rust reference into it is live. DONTNEED drops the frame from the
        // mapping; the registration keeps its pin.
        let rc = unsafe { libc::madvise((p * page) as *mut libc::c_void, page as usize, libc::MADV_DONTNEED) };
        if explicit {
            // The hook reports after the release (S1.8).
            if let Some(c) = weak.upgrade() {
                let _ = c.invalidate(p * page, page, ReleaseKind::MadviseDontneed);
            }
        }
        if rc == 0 {
            if let Some(c) = churn.get(((p * page - base) / page) as usize) {
                c.fetch_add(1, Relaxed);
            }
            count.fetch_add(1, Relaxed);
        }
    }));
}

/// A pattern no earlier op wrote (8 fresh bytes per word).
fn fill(buf: &mut [u8], op: u64) {
    let x = mix(op ^ 0xd1a_5eed);
    for (i, chunk) in buf.chunks_mut(8).enumerate() {
        let w = mix(x.wrapping_add(i as u64)).to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
}

fn record(first: &Mutex<Option<String>>, what: impl FnOnce() -> String) {
    let mut f = lock(first);
    if f.is_none() {
        *f = Some(what());
    }
}

fn worker(ctx: &Ctx<'_>, id: u32, ready: &std::sync::Barrier) {
    let cfg = ctx.cfg;
    let mut rng = Rng::new(cfg.seed).split(u64::from(id));
    let sb = ctx.slot_bytes;
    let mut buf = vec![0u8; sb as usize];
    let mut back = vec![0u8; sb as usize];
    ready.wait();
    loop {
        let n = ctx.c.issued.fetch_add(1, Relaxed);
        if n >= cfg.ops || ctx.stop.load(Relaxed) {
            break;
        }
        // Pacing from this side too: on a loaded machine churners (which wait
        // for the monitor) fall behind, and the run would prove less. Wait a
        // bounded while for them to come within 4 churns of the rate.
        for _ in 0..2000 {
            let lag = ctx.c.done.load(Relaxed) * cfg.churn_per_100;
            if ctx.c.churns.load(Relaxed) * 100 + 400 >= lag || ctx.stop.load(Relaxed) {
                break;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        let slot = rng.below(cfg.slots);
        let mut st = lock(&ctx.slots[slot as usize]);
        if st.dead {
            ctx.c.done.fetch_add(1, Relaxed);
            continue;
        }
        // A request inside the slot: mostly whole pages, sometimes bytes.
        let (off, len) = if rng.chance(3, 4) {
            let first = rng.below(cfg.slot_pages);
            let pages = 1 + rng.below(cfg.slot_pages - first);
            (first * ctx.page, pages * ctx.page)
        } else {
            let off = rng.below(sb - 1);
            (off, 1 + rng.below(sb - off))
        };
        let addr = ctx.base + slot * sb + off;
        let (p0, p1) = (off / ctx.page, (off + len).div_ceil(ctx.page));
        let page_index = |p: u64| (slot * cfg.slot_pages + p) as usize;
        let churned = (p0..p1).any(|p| st.seen[p as usize].is_some_and(|s| ctx.churn[page_index(p)].load(Relaxed) > s));
        match ctx.cache.acquire(addr, len, RW) {
            Ok(lease) => {
                ctx.c.granted.fetch_add(1, Relaxed);
                if lease.hit() {
                    ctx.c.hits.fetch_add(1, Relaxed);
                } else {
                    ctx.c.misses.fetch_add(1, Relaxed);
                }
                if churned {
                    ctx.c.churned.fetch_add(1, Relaxed);
                    if lease.hit() {
                        ctx.c.churned_hits.fetch_add(1, Relaxed);
                    }
                }
                let v = lease.view();
                let h = lease.handle();
                if !(v.addr <= addr && addr + len <= v.addr + v.len && v.access.suffices_for(RW))
                    || (h.range.addr, h.range.len) != (v.addr, v.len)
                {
                    ctx.c.coverage.fetch_add(1, Relaxed);
                } else {
                    // Oracle 2: the frames pinned are the frames mapped now.
                    if ctx.pfn {
                        if let (Some(pinned), Ok(now)) = (&h.pfns, pagemap::pfns(Range { addr, len })) {
                            let skip = ((addr - h.range.addr) / ctx.page) as usize;
                            ctx.c.pfn_checked.fetch_add(1, Relaxed);
                            if pinned.get(skip..skip + now.len()) != Some(&now[..]) {
                                ctx.c.pfn_mismatches.fetch_add(1, Relaxed);
                            }
                        }
                    }
                    // Oracle 1: DMA a fresh pattern, then look at the mapping.
                    let pattern = &mut buf[..len as usize];
                    fill(pattern, cfg.seed ^ (n << 8) ^ u64::from(id));
                    // SAFETY: the slot is locked by this thread, so nothing else
                    // reads or writes these bytes, and no Rust reference into
                    // them is live.
                    let dma = unsafe { ctx.cache.registrar().inner.dma_write(&h.inner, addr - h.range.addr, pattern) };
                    match dma {
                        Err(e) => {
                            ctx.c.dma_failures.fetch_add(1, Relaxed);
                            record(&ctx.first_unexpected, || format!("dma_write to {v}: {e}"));
                        }
                        Ok(()) => {
                            let seen = &mut back[..len as usize];
                            // SAFETY: `[addr, addr+len)` is mapped (slot locked, not
                            // dead) and readable; `seen` is our buffer of `len` bytes.
                            unsafe {
                                std::ptr::copy_nonoverlapping(addr as *const u8, seen.as_mut_ptr(), len as usize)
                            };
                            if seen != pattern {
                                ctx.c.stale.fetch_add(1, Relaxed);
                                record(&ctx.first_stale, || {
                                    format!(
                                        "acquire #{n} of slot {slot} [{addr:#x}, +{len:#x}) got {} {v} (churned since last grant: {churned}); \
                                         the DMA through it is not in the mapping",
                                        if lease.hit() { "hit" } else { "miss" }
                                    )
                                });
                            }
                        }
                    }
                }
                for p in p0..p1 {
                    st.seen[p as usize] = Some(ctx.churn[page_index(p)].load(Relaxed));
                }
                drop(lease);
            }
            Err(e) => {
                *lock(&ctx.errors).entry(e.code().to_string()).or_default() += 1;
                let expected = e.code() == "E6" && cfg.churn_in_register > 0;
                if !expected {
                    ctx.c.unexpected.fetch_add(1, Relaxed);
                    record(&ctx.first_unexpected, || format!("acquire [{addr:#x}, +{len:#x}): {e}"));
                }
            }
        }
        drop(st);
        ctx.c.done.fetch_add(1, Relaxed);
    }
}

fn churner(ctx: &Ctx<'_>, id: u32, scratch: u64) {
    let cfg = ctx.cfg;
    let mut rng = Rng::new(cfg.seed).split(1000 + u64::from(id));
    let (sb, page) = (ctx.slot_bytes, ctx.page);
    while !ctx.stop.load(Relaxed) && ctx.c.done.load(Relaxed) < cfg.ops {
        // Pacing: `churn_per_100` churns per 100 acquires (and a few to start).
        let churns = ctx.c.churns.load(Relaxed);
        if churns * 100 > ctx.c.done.load(Relaxed) * cfg.churn_per_100 + 100 {
            std::thread::sleep(Duration::from_micros(50));
            continue;
        }
        let slot = rng.below(cfg.slots);
        let Ok(mut st) = ctx.slots[slot as usize].try_lock() else { continue };
        if st.dead {
            continue;
        }
        let kind = *rng.pick(&Churn::ALL);
        let slot_addr = ctx.base + slot * sb;
        // Pages [first, end) of the slot that change frames.
        let (first, end) = match kind {
            Churn::MremapMove => (0, cfg.slot_pages),
            Churn::MremapShrink if cfg.slot_pages > 1 => (1 + rng.below(cfg.slot_pages - 1), cfg.slot_pages),
            Churn::MremapShrink => (0, 0),
            _ => {
                let f = rng.below(cfg.slot_pages);
                (f, f + 1 + rng.below(cfg.slot_pages - f))
            }
        };
        if first == end {
            continue;
        }
        let (addr, len) = (slot_addr + first * page, (end - first) * page);
        let done = churn(kind, slot_addr, sb, addr, len, scratch);
        if cfg.monitor == MonitorKind::Explicit {
            // A synchronous hook runs after the frames are released and
            // before the releasing call returns (S1.8): here, before the
            // slot is unlocked.
            let _ = ctx.cache.invalidate(addr, len, kind.kind());
        }
        if !done.intact {
            st.dead = true;
            ctx.c.dead_slots.fetch_add(1, Relaxed);
        }
        if done.changed {
            for p in first..end {
                ctx.churn[(slot * cfg.slot_pages + p) as usize].fetch_add(1, Relaxed);
            }
            ctx.c.churns.fetch_add(1, Relaxed);
            ctx.c.churn_kinds[Churn::ALL.iter().position(|k| *k == kind).unwrap_or(0)].fetch_add(1, Relaxed);
        }
        drop(st);
    }
}

/// What one churn did.
struct Churned {
    /// The slot is fully mapped again.
    intact: bool,
    /// Frames behind the churned pages changed (a failed mremap changes
    /// nothing; it is not counted as a churn).
    changed: bool,
}

/// Performs one churn (see [`Churned`]).
fn churn(kind: Churn, slot_addr: u64, slot_bytes: u64, addr: u64, len: u64, scratch: u64) -> Churned {
    // SAFETY: (all calls below) the ranges are page-aligned parts of the
    // arena slot whose lock the caller holds (no lease, no reference into
    // it) or of this churner's own scratch reservation. Every hole made is
    // refilled at once with MAP_FIXED_NOREPLACE, which never replaces a
    // mapping someone else put there; if that fails the slot is given up.
    let changed = unsafe {
        match kind {
            Churn::Dontneed => libc::madvise(addr as *mut libc::c_void, len as usize, libc::MADV_DONTNEED) == 0,
            Churn::MunmapMmap => libc::munmap(addr as *mut libc::c_void, len as usize) == 0,
            Churn::MapFixed => map_at(addr, len, libc::MAP_FIXED, RW_PROT).is_ok(),
            Churn::MremapMove => {
                // Measured on 6.18: when the slot spans several VMAs (the
                // cache watched part of it) and one of them after the first
                // is userfaultfd-registered, the move fails with EFAULT
                // *after* moving the VMAs before it, leaving holes. The
                // refill below handles every outcome.
                let p = libc::mremap(
                    slot_addr as *mut libc::c_void,
                    slot_bytes as usize,
                    slot_bytes as usize,
                    libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                    scratch as *mut libc::c_void,
                );
                let partial = p == libc::MAP_FAILED && unmapped_any(slot_addr, slot_bytes);
                // Replace whatever moved with the reservation again (frees
                // the old frames, unless a registration pins them).
                let _ = map_at(scratch, slot_bytes, libc::MAP_FIXED | libc::MAP_NORESERVE, libc::PROT_NONE);
                p != libc::MAP_FAILED || partial
            }
            Churn::MremapShrink => {
                let p =
                    libc::mremap(slot_addr as *mut libc::c_void, slot_bytes as usize, (addr - slot_addr) as usize, 0);
                p != libc::MAP_FAILED
            }
        }
    };
    Churned { intact: refill_holes(slot_addr, slot_bytes), changed }
}

fn unmapped_any(addr: u64, len: u64) -> bool {
    unmapped(addr, len, page_size())
}

/// Maps fresh pages into every hole of the slot (`MAP_FIXED_NOREPLACE`,
/// page by page). `false` if a hole could not be refilled, or was taken by
/// another mapping between the check and the map (the slot is then given
/// up and never touched again).
///
/// The harness assumes no other thread of the process maps memory at a
/// kernel-chosen address while a churn has a hole open (threads are all
/// started first; tests using the harness run one at a time): a mapping
/// that slipped into a hole before the check would be taken for ours.
fn refill_holes(slot_addr: u64, slot_bytes: u64) -> bool {
    let page = page_size();
    (0..slot_bytes / page)
        .map(|i| slot_addr + i * page)
        .all(|p| !unmapped(p, page, page) || map_at(p, page, libc::MAP_FIXED_NOREPLACE, RW_PROT).is_ok())
}

/// Whether the harness can run here: io_uring fixed buffers and (for
/// [`MonitorKind::Uffd`]) userfaultfd.
pub fn available(monitor: MonitorKind) -> Result<(), String> {
    let r = UringRegistrar::new(1).map_err(|e| format!("io_uring: {e}"))?;
    drop(r);
    if monitor == MonitorKind::Uffd {
        crate::monitor::uffd::UffdMonitor::open().map_err(|e| format!("userfaultfd: {e}"))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The windows of spec.md#S7.4, measured

/// Parameters of [`race`].
#[derive(Clone, Debug)]
pub struct RaceConfig {
    pub seed: u64,
    /// Rounds of each window.
    pub rounds: u64,
    pub monitor: MonitorKind,
    pub faults: Faults,
}

/// What [`race`] measured. *Window* acquires are concurrent with the
/// release (it had not returned when they began): P2 allows them a stale
/// registration. *Later* acquires begin after the release returned: P2
/// requires them fresh.
#[derive(Clone, Debug)]
pub struct RaceReport {
    /// (a) munmap by one thread, mmap of fresh pages at the same address and
    /// acquire by another while the munmap has not returned.
    pub unmap_rounds: u64,
    pub unmap_window_acquires: u64,
    pub unmap_window_stale: u64,
    pub unmap_later_stale: u64,
    /// (b) madvise(DONTNEED) by one thread, acquires by another while it
    /// runs, then one acquire after it returned.
    pub remove_rounds: u64,
    pub remove_window_acquires: u64,
    pub remove_window_stale: u64,
    pub remove_later_stale: u64,
    pub elapsed: Duration,
    pub cleanup: Result<(), String>,
}

impl Default for RaceConfig {
    fn default() -> Self {
        RaceConfig { seed: 1, rounds: 2000, monitor: MonitorKind::Uffd, faults: Faults::default() }
    }
}

impl RaceReport {
    pub fn render(&self) -> String {
        format!(
            "(a) munmap: {} rounds, {} acquires inside the window, {} of them stale (allowed: concurrent), {} stale after munmap returned; \
             (b) madvise: {} rounds, {} acquires inside the window, {} stale (allowed), {} stale after madvise returned; {:.2} s; cleanup {}",
            self.unmap_rounds,
            self.unmap_window_acquires,
            self.unmap_window_stale,
            self.unmap_later_stale,
            self.remove_rounds,
            self.remove_window_acquires,
            self.remove_window_stale,
            self.remove_later_stale,
            self.elapsed.as_secs_f64(),
            match &self.cleanup {
                Ok(()) => "clean".to_string(),
                Err(e) => e.clone(),
            }
        )
    }
}

/// Acquires `[addr, addr+len)`, DMAs a fresh pattern through the lease and
/// reads the mapping back: `Some(stale)`, or `None` if the acquire failed.
fn dma_check(cache: &DmaCache, addr: u64, len: u64, op: u64) -> Option<bool> {
    let lease = cache.acquire(addr, len, RW).ok()?;
    let h = lease.handle();
    let mut pattern = vec![0u8; len as usize];
    fill(&mut pattern, op);
    // SAFETY: the racing threads own this slot; no Rust reference into it.
    unsafe { cache.registrar().inner.dma_write(&h.inner, addr - h.range.addr, &pattern) }.ok()?;
    let mut seen = vec![0u8; len as usize];
    // SAFETY: the caller made sure the range is mapped (it mapped it, or it
    // never unmaps it) and readable.
    unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, seen.as_mut_ptr(), len as usize) };
    Some(seen != pattern)
}

fn unmapped(addr: u64, len: u64, page: u64) -> bool {
    let mut v = vec![0u8; (len / page) as usize];
    // SAFETY: mincore only reads page tables; `v` has one byte per page.
    unsafe { libc::mincore(addr as *mut libc::c_void, len as usize, v.as_mut_ptr()) != 0 }
}

/// Measures the userfaultfd windows of spec.md#S7.4 (and shows the explicit
/// monitor, whose hook reports after the release, has no *later* stale
/// acquire). Two threads: a releaser and an acquirer, racing on purpose on
/// the same slot (unlike [`run`], where a slot is never released while it is
/// being acquired).
pub fn race(cfg: &RaceConfig) -> Result<RaceReport, String> {
    use std::sync::Barrier;
    let page = page_size();
    const SLOTS: u64 = 8;
    let slot_bytes = 2 * page;
    // SAFETY: prctl with plain integer arguments (see `run`).
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    let arena = Arena::new(SLOTS, slot_bytes, 0)?;
    let registrar = UringRegistrar::new(256).map_err(|e| format!("io_uring registrar: {e}"))?;
    let mut cc = CacheConfig::new(Config { page_size: page, ..Config::default() });
    cc.faults = cfg.faults;
    let cache: Arc<DmaCache> = Arc::new(Cache::new(TestRegistrar::new(registrar).logging(false), cc));
    let monitor = match cfg.monitor {
        MonitorKind::Uffd => Some(MonitorThread::start(&cache).map_err(|e| format!("userfaultfd monitor: {e}"))?),
        MonitorKind::Explicit => None,
    };
    let explicit = cfg.monitor == MonitorKind::Explicit;
    let barrier = Barrier::new(2);
    let released = AtomicBool::new(false);
    let mut report = RaceReport {
        unmap_rounds: 0,
        unmap_window_acquires: 0,
        unmap_window_stale: 0,
        unmap_later_stale: 0,
        remove_rounds: 0,
        remove_window_acquires: 0,
        remove_window_stale: 0,
        remove_later_stale: 0,
        elapsed: Duration::ZERO,
        cleanup: Ok(()),
    };
    let start = Instant::now();
    let (base, c) = (arena.base, &*cache);
    let counts: [AtomicU64; 8] = Default::default();
    std::thread::scope(|s| {
        // The releaser.
        s.spawn(|| {
            for round in 0..2 * cfg.rounds {
                let addr = base + (round % SLOTS) * slot_bytes;
                barrier.wait(); // the slot has a cached entry
                if round % 2 == 0 {
                    // (a) munmap; the acquirer maps fresh pages there.
                    // SAFETY: a slot of our arena; the acquirer refills it.
                    unsafe { libc::munmap(addr as *mut libc::c_void, slot_bytes as usize) };
                    if explicit {
                        let _ = c.invalidate(addr, slot_bytes, ReleaseKind::Munmap);
                    }
                } else {
                    // (b) madvise(DONTNEED).
                    // SAFETY: as above; the mapping stays, its frames go.
                    unsafe { libc::madvise(addr as *mut libc::c_void, slot_bytes as usize, libc::MADV_DONTNEED) };
                    if explicit {
                        let _ = c.invalidate(addr, slot_bytes, ReleaseKind::MadviseDontneed);
                    }
                }
                released.store(true, Relaxed);
                barrier.wait(); // the acquirer's later check may begin
                barrier.wait(); // round over
            }
        });
        // The acquirer.
        s.spawn(|| {
            let mut op = cfg.seed << 20;
            for round in 0..2 * cfg.rounds {
                let addr = base + (round % SLOTS) * slot_bytes;
                released.store(false, Relaxed);
                op += 1;
                let _ = dma_check(c, addr, slot_bytes, op); // cache an entry
                barrier.wait();
                if round % 2 == 0 {
                    // (a): wait (bounded) for the hole, fill it, acquire.
                    let mut spins = 0u32;
                    while !unmapped(addr, slot_bytes, page) && !released.load(Relaxed) && spins < 200_000 {
                        spins += 1;
                        std::hint::spin_loop();
                    }
                    let concurrent = !released.load(Relaxed);
                    if unmapped(addr, slot_bytes, page) {
                        let _ = refill_holes(addr, slot_bytes);
                    }
                    op += 1;
                    if concurrent {
                        counts[0].fetch_add(1, Relaxed);
                        if dma_check(c, addr, slot_bytes, op) == Some(true) {
                            counts[1].fetch_add(1, Relaxed);
                        }
                    }
                } else {
                    // (b): acquire again and again while madvise runs.
                    let mut n = 0;
                    while !released.load(Relaxed) && n < 10_000 {
                        n += 1;
                        op += 1;
                        counts[3].fetch_add(1, Relaxed);
                        if dma_check(c, addr, slot_bytes, op) == Some(true) {
                            counts[4].fetch_add(1, Relaxed);
                        }
                    }
                }
                barrier.wait(); // the release returned
                if unmapped(addr, slot_bytes, page) {
                    let _ = refill_holes(addr, slot_bytes);
                }
                op += 1;
                if dma_check(c, addr, slot_bytes, op) == Some(true) {
                    counts[if round % 2 == 0 { 2 } else { 5 }].fetch_add(1, Relaxed);
                }
                barrier.wait();
            }
        });
    });
    report.elapsed = start.elapsed();
    report.unmap_rounds = cfg.rounds;
    report.remove_rounds = cfg.rounds;
    report.unmap_window_acquires = counts[0].load(Relaxed);
    report.unmap_window_stale = counts[1].load(Relaxed);
    report.unmap_later_stale = counts[2].load(Relaxed);
    report.remove_window_acquires = counts[3].load(Relaxed);
    report.remove_window_stale = counts[4].load(Relaxed);
    report.remove_later_stale = counts[5].load(Relaxed);
    // As in `run`: no monitor round may be in flight during the final check.
    drop(monitor);
    cache.flush();
    let reg = cache.registrar();
    report.cleanup = if reg.live() == 0 && reg.inner.in_use() == 0 && reg.double_deregistrations.load(Relaxed) == 0 {
        Ok(())
    } else {
        Err(format!("{} registrations live after the final flush", reg.live()))
    };
    drop(cache);
    drop(arena);
    Ok(report)
}
