//! The windows of spec.md#S7.4, measured: one thread releases a slot while
//! another acquires it, on purpose (unlike [`run`](super::run), where a slot
//! is never released while it is being acquired). Acquires inside the
//! window may be stale (P2 allows it); acquires that begin after the release
//! returned must not be.

use super::arena::{refill_holes, unmapped, Arena};
use super::worker::fill;
use super::{DmaCache, MonitorKind, RW};
use crate::registrar::TestRegistrar;
use mrcache::mem::page_size;
use mrcache::monitor::MonitorThread;
use mrcache::registrar::uring::UringRegistrar;
use mrcache::{Cache, CacheConfig, Faults};
use mrcache_model::Config;
use mrcache_types::ReleaseKind;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Parameters of [`race`].
#[derive(Clone, Debug)]
pub struct RaceConfig {
    pub seed: u64,
    /// Rounds of each window.
    pub rounds: u64,
    pub monitor: MonitorKind,
    pub faults: Faults,
    /// The advice of window (b): `MADV_DONTNEED`, `MADV_FREE`, or
    /// `MADV_REMOVE` (the arena is then shared anonymous memory, shmem, and
    /// window (a) is skipped: its refills would be private).
    pub advice: i32,
    /// The cache's contract (policy, chunk_pages); the page size is the
    /// machine's.
    pub contract: Config,
    /// Window (b)'s acquires inside the window take the *other* slot of the
    /// same 2-slot pair, so with `chunk_pages` 4 (or `merge`) their
    /// registrations cover the pages being purged that they never asked
    /// for; the later check takes the purged slot itself.
    pub neighbour: bool,
    /// A second cache, with these faults, attached to the same monitor
    /// (spec.md#S7.6): every slot is cached in both, the window acquires
    /// alternate between them, and the check after the release takes both
    /// (a stale one in either counts). `monitor_off` on it is the mutant
    /// whose monitor applies events to the first cache only.
    pub second_cache: Option<Faults>,
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
        RaceConfig {
            seed: 1,
            rounds: 2000,
            monitor: MonitorKind::Uffd,
            faults: Faults::default(),
            advice: libc::MADV_DONTNEED,
            contract: Config::default(),
            neighbour: false,
            second_cache: None,
        }
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

/// Measures the userfaultfd windows of spec.md#S7.4 (and shows the explicit
/// monitor, whose hook reports after the release, has no *later* stale
/// acquire). Two threads: a releaser and an acquirer, racing on purpose on
/// the same slot (unlike [`run`], where a slot is never released while it is
/// being acquired).
///
/// [`run`]: super::run
pub fn race(cfg: &RaceConfig) -> Result<RaceReport, String> {
    use std::sync::Barrier;
    let page = page_size();
    const SLOTS: u64 = 8;
    let slot_bytes = 2 * page;
    // SAFETY: prctl with plain integer arguments (see `run`).
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    let arena = Arena::new(SLOTS, slot_bytes, 0)?;
    let shmem = cfg.advice == libc::MADV_REMOVE;
    if shmem {
        // SAFETY: replaces our own arena's pages (no reference into them)
        // with shared anonymous memory at the same address.
        let p = unsafe {
            libc::mmap(
                arena.base as *mut libc::c_void,
                (SLOTS * slot_bytes) as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!("shmem arena: {}", std::io::Error::last_os_error()));
        }
    }
    let mut caches: Vec<Arc<DmaCache>> = Vec::new();
    let mut monitors = Vec::new();
    for faults in std::iter::once(cfg.faults).chain(cfg.second_cache) {
        let registrar = UringRegistrar::new(256).map_err(|e| format!("io_uring registrar: {e}"))?;
        let mut cc = CacheConfig::new(Config { page_size: page, ..cfg.contract }).monitored_by(cfg.monitor.monitoring());
        cc.faults = faults;
        let cache: Arc<DmaCache> = Arc::new(Cache::new(TestRegistrar::new(registrar).logging(false), cc));
        if cfg.monitor == MonitorKind::Uffd {
            monitors.push(MonitorThread::start(&cache).map_err(|e| format!("userfaultfd monitor: {e}"))?);
        }
        caches.push(cache);
    }
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
    let base = arena.base;
    let all: Vec<&DmaCache> = caches.iter().map(|c| &**c).collect();
    let all = &all[..];
    // The window acquires' cache: each in turn.
    let pick = |round: u64| all[(round / 2) as usize % all.len()];
    let counts: [AtomicU64; 8] = Default::default();
    std::thread::scope(|s| {
        // The releaser.
        s.spawn(|| {
            for round in 0..2 * cfg.rounds {
                let addr = base + (round % SLOTS) * slot_bytes;
                barrier.wait(); // the slot has a cached entry
                if round % 2 == 0 && shmem {
                    // no window (a) on shmem
                } else if round % 2 == 0 {
                    // (a) munmap; the acquirer maps fresh pages there.
                    // SAFETY: a slot of our arena; the acquirer refills it.
                    unsafe { libc::munmap(addr as *mut libc::c_void, slot_bytes as usize) };
                    if explicit {
                        for c in all {
                            let _ = c.invalidate(addr, slot_bytes, ReleaseKind::Munmap);
                        }
                    }
                } else {
                    // (b) madvise(DONTNEED).
                    // SAFETY: as above; the mapping stays, its frames go.
                    unsafe { libc::madvise(addr as *mut libc::c_void, slot_bytes as usize, cfg.advice) };
                    if explicit {
                        for c in all {
                            let _ = c.invalidate(addr, slot_bytes, ReleaseKind::MadviseDontneed);
                        }
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
                for c in all {
                    op += 1;
                    let _ = dma_check(c, addr, slot_bytes, op); // cache an entry
                }
                let c = pick(round);
                barrier.wait();
                if round % 2 == 0 && shmem {
                    // no window (a) on shmem
                } else if round % 2 == 0 {
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
                } else if round % 2 == 1 {
                    // (b): acquire again and again while madvise runs (the
                    // purged slot, or its neighbour: see `neighbour`).
                    let target = if cfg.neighbour { base + ((round % SLOTS) ^ 1) * slot_bytes } else { addr };
                    let mut n = 0;
                    while !released.load(Relaxed) && n < 10_000 {
                        n += 1;
                        op += 1;
                        counts[3].fetch_add(1, Relaxed);
                        if dma_check(c, target, slot_bytes, op) == Some(true) {
                            counts[4].fetch_add(1, Relaxed);
                        }
                    }
                }
                barrier.wait(); // the release returned
                if unmapped(addr, slot_bytes, page) {
                    let _ = refill_holes(addr, slot_bytes);
                }
                let mut stale = false;
                for c in all {
                    op += 1;
                    stale |= dma_check(c, addr, slot_bytes, op) == Some(true);
                }
                if stale {
                    counts[if round % 2 == 0 { 2 } else { 5 }].fetch_add(1, Relaxed);
                }
                barrier.wait();
            }
        });
    });
    report.elapsed = start.elapsed();
    report.unmap_rounds = if shmem { 0 } else { cfg.rounds };
    report.remove_rounds = cfg.rounds;
    report.unmap_window_acquires = counts[0].load(Relaxed);
    report.unmap_window_stale = counts[1].load(Relaxed);
    report.unmap_later_stale = counts[2].load(Relaxed);
    report.remove_window_acquires = counts[3].load(Relaxed);
    report.remove_window_stale = counts[4].load(Relaxed);
    report.remove_later_stale = counts[5].load(Relaxed);
    // As in `run`: no monitor round may be in flight during the final check.
    drop(monitors);
    let mut live = 0;
    for cache in &caches {
        cache.flush();
        let reg = cache.registrar();
        if reg.live() != 0 || reg.inner.in_use() != 0 || reg.double_deregistrations.load(Relaxed) != 0 {
            live += reg.live().max(1);
        }
    }
    report.cleanup = if live == 0 { Ok(()) } else { Err(format!("{live} registrations live after the final flush")) };
    drop(caches);
    drop(arena);
    Ok(report)
}
