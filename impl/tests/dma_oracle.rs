//! The stale-DMA oracle, short version (the long one is `ci/stress.sh`):
//! the cache on real memory, io_uring registrar, userfaultfd or explicit
//! monitor, two threads churning memory (munmap+mmap, madvise DONTNEED,
//! mremap move and shrink, mmap MAP_FIXED) under two acquiring threads that
//! DMA a fresh pattern through every lease and check the mapping sees it.
//! See `mrcache_testkit::dma` for the set-up and the oracles.
//!
//! - the real cache: 0 stale DMAs, 0 PFN mismatches (where pagemap shows
//!   PFNs; skipped with a message otherwise), many acquires on churned
//!   ranges, nothing left registered, under both monitors, with releases
//!   raised inside `register` too, and under `merge`;
//! - the oracle has teeth: with `monitor_off`, the same seed gives at least
//!   one stale DMA per `N_MONITOR_OFF` acquires; with `skip_seq_recheck` and
//!   a page released inside every fourth registration, at least one per
//!   `N_SKIP_RECHECK`.
//!
//! Every run is bounded by its op count and a watchdog (no hang). The runs
//! never overlap (`SERIAL`), and the short ones are one `#[test]`: libtest
//! spawns a test's thread when another test ends, and a thread created
//! while a churn has a hole open could get its stack mapped into the arena.

use mrcache::{Faults, OverlapPolicy};
use mrcache_testkit::dma::{self, DmaConfig, DmaReport, MonitorKind};
use mrcache_testkit::watchdog::{contention, must_finish};
use std::time::Duration;

/// Acquires per run of the short versions.
const OPS: u64 = 12_000;
/// With the monitor off: at least one stale DMA per this many acquires.
/// (Measured: about 9 in 10 acquires are stale once the first churns
/// happened, since nothing is ever invalidated; 10 leaves a wide margin.)
const N_MONITOR_OFF: u64 = 10;
/// With `skip_seq_recheck` and a page released inside 1 in 4
/// registrations: at least one stale DMA per this many acquires (measured:
/// about 1 in 4–5).
const N_SKIP_RECHECK: u64 = 25;

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn skip_unless_available(monitor: MonitorKind) -> bool {
    match dma::available(monitor) {
        Ok(()) => false,
        Err(e) => {
            eprintln!("stale-DMA oracle skipped: {e}");
            true
        }
    }
}

fn run(name: &str, cfg: DmaConfig) -> DmaReport {
    let name2 = name.to_string();
    let r =
        must_finish(name, Duration::from_secs(120), move || dma::run(&cfg, None)).unwrap_or_else(|e| panic!("{name2}: set-up failed: {e}"));
    eprintln!("{name}: {}", r.render());
    if let Some(s) = &r.first_stale {
        eprintln!("{name}: first stale DMA: {s}");
    }
    r
}

fn assert_clean(name: &str, r: &DmaReport) {
    assert_eq!(r.stale_dmas, 0, "{name}: {:?}", r.first_stale);
    assert_eq!(r.pfn_mismatches, 0, "{name}");
    assert_eq!((r.coverage_violations, r.dma_failures), (0, 0), "{name}");
    assert_eq!(r.unexpected_errors, 0, "{name}: {:?}", r.first_unexpected_error);
    assert!(r.cleanup.is_ok(), "{name}: {:?}", r.cleanup);
    assert_eq!(r.ops, OPS, "{name}: every acquire ran");
    // The test proves something only if many acquires hit churned memory.
    // A rate, so measured on a quiet machine (under contention the churners
    // may get little CPU: the run then checks safety only).
    if !contention() {
        assert!(r.churned_acquires * 10 >= r.ops, "{name}: only {} churned acquires", r.churned_acquires);
        assert!(r.churns.values().all(|&n| n > 50), "{name}: every kind of churn ran: {:?}", r.churns);
    }
    match &r.pfn_skipped {
        None => assert_eq!(r.pfn_checked, r.granted, "{name}: PFNs checked at every grant"),
        Some(why) => eprintln!("{name}: PFN oracle skipped: {why}"),
    }
}

fn cfg(seed: u64, monitor: MonitorKind) -> DmaConfig {
    DmaConfig { seed, ops: OPS, monitor, ..DmaConfig::default() }
}

/// Every short case, one after another (see the module docs for why one
/// test): each panics with its name on failure.
#[test]
fn short_oracle_runs() {
    no_stale_dma_with_the_uffd_monitor();
    no_stale_dma_with_the_explicit_monitor();
    no_stale_dma_under_merge();
    releases_inside_register_no_deadlock_no_stale_dma();
    teeth_monitor_off_gives_stale_dmas();
    teeth_skip_seq_recheck_gives_stale_dmas();
    teeth_leak_deregistration_fails_cleanup();
}

fn no_stale_dma_with_the_uffd_monitor() {
    let _g = serial();
    if skip_unless_available(MonitorKind::Uffd) {
        return;
    }
    let r = run("uffd", cfg(1, MonitorKind::Uffd));
    assert_clean("uffd", &r);
    assert!(r.monitor_rounds > 0);
}

fn no_stale_dma_with_the_explicit_monitor() {
    let _g = serial();
    if skip_unless_available(MonitorKind::Explicit) {
        return;
    }
    let r = run("explicit", cfg(2, MonitorKind::Explicit));
    assert_clean("explicit", &r);
}

fn no_stale_dma_under_merge() {
    let _g = serial();
    if skip_unless_available(MonitorKind::Uffd) {
        return;
    }
    let r = run("uffd merge", DmaConfig { policy: OverlapPolicy::Merge, ..cfg(3, MonitorKind::Uffd) });
    assert_clean("uffd merge", &r);
}

/// A registrar that frees memory while registering (a release event inside
/// a cache operation, on the same thread): no deadlock under either monitor
/// (the watchdog fails the test instead of hanging), no stale DMA; E6 is
/// the allowed outcome when every attempt was hit.
fn releases_inside_register_no_deadlock_no_stale_dma() {
    let _g = serial();
    for (name, monitor) in [("uffd, release in register", MonitorKind::Uffd), ("explicit, release in register", MonitorKind::Explicit)] {
        if skip_unless_available(monitor) {
            return;
        }
        let r = run(name, DmaConfig { churn_in_register: 500, ..cfg(4, monitor) });
        assert_clean(name, &r);
        assert!(r.register_churns > 500, "{name}: {} releases inside register", r.register_churns);
        assert!(r.diagnostics.stale_retries > 100, "{name}: the cache retried stale registrations: {:?}", r.diagnostics);
    }
}

fn teeth_monitor_off_gives_stale_dmas() {
    let _g = serial();
    for (name, monitor) in [("uffd, monitor off", MonitorKind::Uffd), ("explicit, monitor off", MonitorKind::Explicit)] {
        if skip_unless_available(monitor) {
            return;
        }
        let mut faults = Faults::default();
        faults.monitor_off = true;
        let r = run(name, DmaConfig { faults, ..cfg(5, monitor) });
        // Teeth: a rate on a quiet machine; under contention, at least one.
        let n = if contention() { r.ops } else { N_MONITOR_OFF };
        assert!(
            r.stale_dmas * n >= r.ops && r.stale_dmas > 0,
            "{name}: {} stale DMAs in {} acquires: fewer than one per {N_MONITOR_OFF}",
            r.stale_dmas,
            r.ops
        );
        if r.pfn_skipped.is_none() {
            assert!(r.pfn_mismatches > 0, "{name}: the PFN oracle sees it too");
        }
        assert!(r.cleanup.is_ok(), "{name}: even the broken cache deregisters everything: {:?}", r.cleanup);
    }
}

fn teeth_skip_seq_recheck_gives_stale_dmas() {
    let _g = serial();
    for (name, monitor) in [("uffd, skip recheck", MonitorKind::Uffd), ("explicit, skip recheck", MonitorKind::Explicit)] {
        if skip_unless_available(monitor) {
            return;
        }
        let mut faults = Faults::default();
        faults.skip_seq_recheck = true;
        let r = run(name, DmaConfig { faults, churn_in_register: 250, ..cfg(6, monitor) });
        let n = if contention() { r.ops } else { N_SKIP_RECHECK };
        assert!(
            r.stale_dmas * n >= r.ops && r.stale_dmas > 0,
            "{name}: {} stale DMAs in {} acquires: fewer than one per {N_SKIP_RECHECK}",
            r.stale_dmas,
            r.ops
        );
        assert_eq!(r.errors.get("E6"), None, "{name}: the broken cache never retries");
    }
}

/// The final check (after the monitor thread stopped) still sees a
/// cache that loses deregistrations (P4).
fn teeth_leak_deregistration_fails_cleanup() {
    let _g = serial();
    for (name, monitor) in [("uffd, leak", MonitorKind::Uffd), ("explicit, leak", MonitorKind::Explicit)] {
        if skip_unless_available(monitor) {
            return;
        }
        let mut faults = Faults::default();
        faults.leak_deregistration = true;
        let r = run(name, DmaConfig { faults, ..cfg(7, monitor) });
        let err = r.cleanup.expect_err("the leak must be seen");
        assert!(err.contains("registrations live"), "{name}: {err}");
        assert_eq!(r.stale_dmas, 0, "{name}: a leak is not a stale DMA");
    }
}

/// The long run (`ci/stress.sh`): `MRCACHE_STRESS_OPS` acquires (default
/// 1,000,000), each DMA-checked, under `MRCACHE_STRESS_MONITOR` (`uffd`,
/// default, or `explicit`), policy `MRCACHE_STRESS_POLICY` (`independent`
/// or `merge`), seed `MRCACHE_STRESS_SEED`. Must report 0 stale DMAs and 0
/// PFN mismatches, and many acquires on churned memory.
#[test]
#[ignore = "long: run by ci/stress.sh"]
fn stress() {
    let _g = serial();
    let var = |k: &str| std::env::var(k).ok();
    let ops = var("MRCACHE_STRESS_OPS").and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let seed = var("MRCACHE_STRESS_SEED").and_then(|v| v.parse().ok()).unwrap_or(2026);
    let monitor = match var("MRCACHE_STRESS_MONITOR").as_deref() {
        Some("explicit") => MonitorKind::Explicit,
        _ => MonitorKind::Uffd,
    };
    let policy = match var("MRCACHE_STRESS_POLICY").as_deref() {
        Some("merge") => OverlapPolicy::Merge,
        _ => OverlapPolicy::Independent,
    };
    let churn_in_register = var("MRCACHE_STRESS_REGISTER_CHURN").and_then(|v| v.parse().ok()).unwrap_or(0);
    if skip_unless_available(monitor) {
        return;
    }
    let name = format!("stress {monitor:?} {policy:?} seed {seed}");
    let cfg = DmaConfig { seed, ops, monitor, policy, churn_in_register, ..DmaConfig::default() };
    let n2 = name.clone();
    let r =
        must_finish(&name, Duration::from_secs(3600), move || dma::run(&cfg, None)).unwrap_or_else(|e| panic!("{n2}: set-up failed: {e}"));
    println!("{name}: {}", r.render());
    println!(
        "FIGURES ops={} stale_dmas={} pfn_mismatches={} pfn_checked={} churned_acquires={} churns={} register_churns={} seconds={:.1}",
        r.ops,
        r.stale_dmas,
        r.pfn_mismatches,
        r.pfn_checked,
        r.churned_acquires,
        r.churns_total(),
        r.register_churns,
        r.elapsed.as_secs_f64()
    );
    assert_eq!(r.stale_dmas, 0, "{name}: {:?}", r.first_stale);
    assert_eq!(r.pfn_mismatches, 0, "{name}");
    assert_eq!((r.coverage_violations, r.dma_failures, r.unexpected_errors), (0, 0, 0), "{name}: {:?}", r.first_unexpected_error);
    assert!(r.cleanup.is_ok(), "{name}: {:?}", r.cleanup);
    assert_eq!(r.ops, ops);
    assert!(r.churned_acquires * 10 >= r.ops, "{name}: only {} churned acquires", r.churned_acquires);
}

/// The windows of spec.md#S7.4, measured (`mrcache_testkit::dma::race`): a release
/// and an acquire of the same memory, concurrent on purpose. Acquires that
/// begin after the release returned must get fresh registrations: window (a)
/// needs nothing more, window (b) (madvise) is closed by M3/M4 under
/// userfaultfd (the teeth: `s7_4_b_without_the_remove_window_is_stale`).
#[test]
//= spec.md#S7.5
fn s7_4_windows_measured() {
    let _g = serial();
    for monitor in [MonitorKind::Uffd, MonitorKind::Explicit] {
        if skip_unless_available(monitor) {
            return;
        }
        let rounds = std::env::var("MRCACHE_RACE_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(1500);
        let cfg = dma::RaceConfig { rounds, monitor, seed: 9, ..dma::RaceConfig::default() };
        let r = must_finish("S7.4 windows", Duration::from_secs(120), move || dma::race(&cfg)).unwrap();
        println!("S7.4 windows, {monitor:?} monitor: {}", r.render());
        assert!(r.cleanup.is_ok(), "{:?}", r.cleanup);
        assert_eq!(r.unmap_later_stale, 0, "{monitor:?}: an acquire after munmap returned got a stale registration");
        assert_eq!(r.remove_later_stale, 0, "{monitor:?}: an acquire after madvise returned got a stale registration");
        if monitor == MonitorKind::Uffd && !contention() {
            // munmap blocks until the monitor reads its event: a wide window.
            // Whether the acquiring thread runs inside it is up to the
            // scheduler: a coverage figure, asserted on a quiet machine only
            // (under contention it was 0 in 1 of 8 runs: the monitor read
            // the event before the acquirer got a CPU).
            assert!(r.unmap_window_acquires > 0, "the race reached the munmap window");
        }
    }
}

/// The variants of window (b): every advice that raises REMOVE
/// (`MADV_REMOVE` on shmem), and registrations wider than the request
/// (`chunk_pages` 4, `merge`) made on the neighbouring slot while the purge
/// runs, so that they pin pages being purged that they never asked for.
fn s7_4_b_variants() -> Vec<(&'static str, dma::RaceConfig)> {
    use mrcache::Config;
    let rounds = std::env::var("MRCACHE_RACE_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(1500);
    let base = dma::RaceConfig { rounds, monitor: MonitorKind::Uffd, seed: 11, ..dma::RaceConfig::default() };
    vec![
        ("MADV_DONTNEED", base.clone()),
        ("MADV_FREE", dma::RaceConfig { advice: libc::MADV_FREE, ..base.clone() }),
        ("MADV_REMOVE (shmem)", dma::RaceConfig { advice: libc::MADV_REMOVE, ..base.clone() }),
        (
            "MADV_DONTNEED, chunk_pages 4, neighbour",
            dma::RaceConfig { contract: Config { chunk_pages: 4, ..Config::default() }, neighbour: true, ..base.clone() },
        ),
        (
            "MADV_DONTNEED, merge, chunk_pages 4, neighbour",
            dma::RaceConfig {
                contract: Config { chunk_pages: 4, policy: OverlapPolicy::Merge, ..Config::default() },
                neighbour: true,
                ..base
            },
        ),
    ]
}

/// S7.4(b) closed for every variant: 0 stale after madvise returned.
#[test]
//= spec.md#M4
fn s7_4_b_every_advice_and_wider_pins_are_fresh() {
    let _g = serial();
    if skip_unless_available(MonitorKind::Uffd) {
        return;
    }
    for (name, cfg) in s7_4_b_variants() {
        let r = must_finish("S7.4(b) variants", Duration::from_secs(120), move || dma::race(&cfg)).unwrap();
        println!("S7.4(b) {name}: {}", r.render());
        assert!(r.cleanup.is_ok(), "{name}: {:?}", r.cleanup);
        assert_eq!(r.remove_later_stale, 0, "{name}: an acquire after madvise returned got a stale registration");
        assert_eq!(r.unmap_later_stale, 0, "{name}");
    }
}

/// The teeth of M3 (spec.md#S7.4(b)): with the fault switch that applies a
/// REMOVE as a plain event (no window), acquires made after madvise returned
/// do get stale registrations (DONTNEED on private memory, REMOVE on shmem).
#[test]
//= spec.md#M3
fn s7_4_b_without_the_remove_window_is_stale() {
    let _g = serial();
    if skip_unless_available(MonitorKind::Uffd) {
        return;
    }
    for (name, cfg) in s7_4_b_variants() {
        if name.contains("FREE") || name.contains("neighbour") {
            // MADV_FREE keeps the frames of pages written again; the
            // neighbour variants' wider registrations lost the race to the
            // zap in every measured run (0 stale in 2,000 rounds even
            // without the window), so they show no teeth.
            continue;
        }
        // The stale acquire needs an acquire to fall between the monitor's
        // read and the kernel's zap, which the scheduler decides: on a
        // loaded machine a run of 1,500 rounds has shown none (CI, load ~15).
        // So up to 8 runs, each with its own seed, until one shows it; the
        // oracle is unchanged, only the number of tries grows.
        let mut stale = 0;
        for attempt in 0..8u64 {
            let mut cfg = cfg.clone();
            cfg.faults.remove_without_window = true;
            cfg.seed += attempt * 1000;
            let r = must_finish("S7.4(b) teeth", Duration::from_secs(120), move || dma::race(&cfg)).unwrap();
            println!("S7.4(b) {name}, remove-without-window, run {}: {}", attempt + 1, r.render());
            assert!(r.cleanup.is_ok(), "{name}: {:?}", r.cleanup);
            stale += r.remove_later_stale;
            if stale > 0 {
                break;
            }
        }
        assert!(stale > 0, "{name}: without M3's window no acquire after madvise returned was stale in 8 runs");
    }
}

/// Two caches on one monitor (spec.md#S7.6, M5): every slot is cached in
/// both, with its own io_uring registrar each, and both are checked after
/// the release returned: an unmap and a madvise reach both.
fn s7_6_config() -> dma::RaceConfig {
    let rounds = std::env::var("MRCACHE_RACE_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(1500);
    dma::RaceConfig { rounds, monitor: MonitorKind::Uffd, seed: 13, second_cache: Some(Faults::default()), ..dma::RaceConfig::default() }
}

#[test]
//= spec.md#M6
//# Why P2 holds: a releasing thread is woken inside the read, after the odd store
fn s7_6_two_caches_on_one_monitor_are_fresh() {
    let _g = serial();
    if skip_unless_available(MonitorKind::Uffd) {
        return;
    }
    let cfg = s7_6_config();
    let r = must_finish("S7.6 two caches", Duration::from_secs(120), move || dma::race(&cfg)).unwrap();
    println!("S7.6 two caches: {}", r.render());
    assert!(r.cleanup.is_ok(), "{:?}", r.cleanup);
    assert_eq!(r.unmap_later_stale, 0, "an acquire after munmap returned was stale in one of the two caches");
    assert_eq!(r.remove_later_stale, 0, "an acquire after madvise returned was stale in one of the two caches");
}

#[test]
fn s7_6_an_event_applied_to_one_cache_only_is_stale() {
    // The impl's twin of the checker's event-to-one-cache mutant: the
    // second cache ignores what the monitor reads (its `monitor_off`).
    let _g = serial();
    if skip_unless_available(MonitorKind::Uffd) {
        return;
    }
    let mut cfg = s7_6_config();
    let mut deaf = Faults::default();
    deaf.monitor_off = true;
    cfg.second_cache = Some(deaf);
    let r = must_finish("S7.6 teeth", Duration::from_secs(120), move || dma::race(&cfg)).unwrap();
    println!("S7.6 teeth, second cache deaf: {}", r.render());
    assert!(r.unmap_later_stale > 0 && r.remove_later_stale > 0, "with one cache deaf to the monitor no later acquire was stale");
}
