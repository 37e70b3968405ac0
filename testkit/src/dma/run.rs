//! One run of the harness: set-up (arena, registrar, cache, monitor), the
//! worker and churner threads (all started before the first churn), the
//! progress and time limit, then the final check: with the monitor thread
//! stopped and the cache flushed, nothing may stay registered, pinned or
//! cached, and no registration may be deregistered twice.

use super::arena::Arena;
use super::churn::{churner, install_register_churn};
use super::worker::worker;
use super::{lock, Churn, Counters, Ctx, DmaCache, DmaConfig, DmaReport, MonitorKind, SlotState};
use crate::registrar::TestRegistrar;
use mrcache::mem::page_size;
use mrcache::monitor::MonitorThread;
use mrcache::pagemap;
use mrcache::registrar::uring::UringRegistrar;
use mrcache::{Cache, CacheConfig};
use mrcache_model::Config;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Runs the harness (see the docs of `testkit::dma`). `progress` receives
/// the number of acquires done so far, for progress bars. `Err` if the
/// set-up failed (io_uring or userfaultfd unavailable, mmap refused).
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
    let mut cc =
        CacheConfig::new(Config { policy: cfg.policy, page_size: page, ..Config::default() }).monitored_by(cfg.monitor.monitoring());
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
        slots: (0..cfg.slots).map(|_| Mutex::new(SlotState { dead: false, seen: vec![None; cfg.slot_pages as usize] })).collect(),
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
    // a leak. That false alarm was the "1 registrations live ... 0
    // entries cached" (impl/tests/oracle.rs reproduces it).
    let monitor_rounds = monitor.as_ref().map_or(0, MonitorThread::rounds);
    drop(monitor);
    cache.flush();
    let reg = cache.registrar();
    let stats = cache.stats();
    let doubles = reg.double_deregistrations.load(Relaxed);
    let in_use = reg.inner.in_use();
    let live = reg.live();
    let cleanup = if live != 0 || in_use != 0 || doubles != 0 || stats.pinned_bytes != 0 || stats.cached_entries != 0 {
        Err(format!(
            "after the final flush: {live} registrations live, {in_use} io_uring slots in use, {doubles} double deregistrations, \
             {} bytes pinned, {} entries cached",
            stats.pinned_bytes, stats.cached_entries
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
        churns: Churn::ALL.iter().enumerate().map(|(i, k)| (format!("{k:?}"), c.churn_kinds[i].load(Relaxed))).collect(),
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

/// Whether the harness can run here: io_uring fixed buffers and (for
/// [`MonitorKind::Uffd`]) userfaultfd.
pub fn available(monitor: MonitorKind) -> Result<(), String> {
    let r = UringRegistrar::new(1).map_err(|e| format!("io_uring: {e}"))?;
    drop(r);
    if monitor == MonitorKind::Uffd {
        mrcache::monitor::uffd::UffdMonitor::open().map_err(|e| format!("userfaultfd: {e}"))?;
    }
    Ok(())
}
