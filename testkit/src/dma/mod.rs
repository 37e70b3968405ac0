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
//!
//! # Layout
//!
//! `arena` (the mappings and the hole refill), `churn` (the churners and
//! the churn inside `register`), `worker` (the acquires and the oracles),
//! `run` ([`run`]: set-up, threads, the final check) and `race`
//! ([`race`]). This module holds the parameters, the report, and the state
//! a run's threads share.
//!
//! [`MonitorThread`]: mrcache::monitor::MonitorThread

mod arena;
mod churn;
mod race;
mod run;
mod worker;

pub use churn::Churn;
pub use race::{race, RaceConfig, RaceReport};
pub use run::{available, run};

use super::registrar::TestRegistrar;
use mrcache::cache::Diagnostics;
use mrcache::registrar::uring::UringRegistrar;
use mrcache::{Cache, Faults};
use mrcache_model::OverlapPolicy;
use mrcache_types::{Access, Stats};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Which monitor tells the cache about releases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MonitorKind {
    /// userfaultfd, read by a monitor thread and by the cache's slow paths.
    Uffd,
    /// The churners call `Cache::invalidate` after every release.
    Explicit,
}

impl MonitorKind {
    /// The cache's [`mrcache::Monitoring`] for this monitor.
    pub fn monitoring(self) -> mrcache::Monitoring {
        match self {
            MonitorKind::Uffd => mrcache::Monitoring::Userfaultfd,
            MonitorKind::Explicit => mrcache::Monitoring::Explicit,
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

// ---------------------------------------------------------------------------
// The state a run's threads share

/// One slot, behind its lock: a worker holds it from before its acquire
/// until after its lease is released, a churner while it churns.
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

/// What the threads of one run share.
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
