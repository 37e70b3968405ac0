//! The cache's configuration: the contract's policy plus implementation
//! parameters and the test-only fault switches.

use crate::error::Error;
use mrcache_types::config::{Config, OverlapPolicy};
use serde::{Deserialize, Serialize};

/// Default bound on attempts of one miss (spec.md#S3.7).
pub const DEFAULT_MAX_RETRIES: u32 = 4;

/// Default memo slots per lane ([`crate::CacheConfig::lane_slots`]).
#[cfg(not(loom))]
pub const LANE_SLOTS: u32 = 1024;
#[cfg(loom)]
pub const LANE_SLOTS: u32 = 2;
/// Default bound on the invalidation queue (spec.md#L2).
pub const DEFAULT_MAX_UNRELEASED: u64 = mrcache_types::config::Limits::DEFAULT_MAX_UNRELEASED;

/// Fault switches that mirror the checker's mutants: each breaks one rule of
/// the algorithm on purpose, so that tests can show their oracle catches it.
/// Runtime flags, all off by default. Only in test builds (`cfg(test)` or
/// feature `faults`): a production build has none.
#[cfg(any(test, feature = "faults"))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Faults {
    /// A7 skipped: a registration invalidated while the registrar ran is
    /// inserted anyway (breaks P2).
    pub skip_seq_recheck: bool,
    /// Release events are ignored (explicit `invalidate`, queued events and
    /// events read from the monitor): the monitor is off (breaks P2).
    pub monitor_off: bool,
    /// The owner of a cached registration's deregistration (A-H: the
    /// operation that took it out of the lookup unleased, or its last
    /// release) frees the entry without deregistering (breaks P4, "every
    /// successful registration is deregistered exactly once"). What the
    /// tests' final "nothing registered" checks must catch.
    pub leak_deregistration: bool,
    /// F1's detach skipped: a forked child keeps reading the parent's
    /// monitor, which sees none of the child's releases (breaks P2 in the
    /// child; conformance case fork-child-unmap).
    pub fork_keeps_monitor: bool,
    /// A6/R2 read a memoized entry's lease count for the note without
    /// revoking its lane slots first: a lane lease goes unseen and A10
    /// evicts a leased entry (mirrors the checker's `note-skips-revoke`).
    pub note_skips_revoke: bool,
    /// A6/R2's note that falls short of the excess neither raises the
    /// over-limit flag nor notes again; A10 raises the flag when its pass
    /// ends over: a release after the note that read the flag before it was
    /// raised is neither evicted nor runs R2, and the cache stays over its
    /// limit (mirrors the checker's `over-limit-flag-late`; P5).
    pub over_limit_flag_late: bool,
    /// spec.md#M3 off: a REMOVE read from userfaultfd is applied as a plain
    /// event and opens no window (S7.4(b) open
    /// again). Mirrors the checker's `remove-without-window`.
    pub remove_without_window: bool,
    /// A use of a cached entry takes no new LRU stamp (only its creation
    /// stamps it), as if every use found its entry already the latest:
    /// eviction then follows creation order instead of S6.3's least recent
    /// use (the skip in `Cache::touch` taken too eagerly). Mirrors the
    /// checker's `lru-skips-restamp`.
    pub lru_skips_restamp: bool,
    /// A release event deregisters leased entries at once (breaks P3). See
    /// [`Faults::enable_dereg_leased_on_invalidate`].
    pub(super) dereg_leased_on_invalidate: bool,
}

#[cfg(any(test, feature = "faults"))]
impl Faults {
    /// Makes release events deregister leased entries immediately (P3 mutant).
    /// The last release then frees the entry without deregistering it again.
    ///
    /// # Safety
    ///
    /// After such an early deregistration [`Lease::handle`](crate::Lease::handle) returns a reference
    /// to a handle the registrar has already consumed: the caller must not use
    /// a lease's `handle()` after a release event overlapped it, unless the
    /// registrar's handle owns no resources its `deregister` frees (true of
    /// [`crate::registrar::counting::CountingRegistrar`]).
    pub unsafe fn enable_dereg_leased_on_invalidate(&mut self) {
        self.dereg_leased_on_invalidate = true;
    }

    pub fn dereg_leased_on_invalidate(&self) -> bool {
        self.dereg_leased_on_invalidate
    }
}

/// How a cache learns that memory it may hold a registration of was released
/// (spec.md#S3, S7). A cache is only as fresh as this: a buffer freed and
/// reused without the cache learning of it hits a registration of the old
/// pages. [`Cache::try_new`](super::Cache::try_new) refuses
/// [`Monitoring::Unchosen`], the default, so that no cache is unmonitored
/// by accident.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Monitoring {
    /// Not chosen yet: refused at construction.
    #[default]
    Unchosen,
    /// A userfaultfd monitor: start a [`crate::MonitorThread`] on the cache.
    /// munmap, madvise, mremap, MAP_FIXED-over and brk shrink are seen by
    /// themselves (spec.md#S7.3, and its limits in S7.4).
    Userfaultfd,
    /// The program calls [`Cache::invalidate`](super::Cache::invalidate)
    /// after every release of memory the cache may hold.
    Explicit,
    /// The program's memory hooks call
    /// [`Cache::release_begin`](super::Cache::release_begin) before and
    /// [`Cache::release_end`](super::Cache::release_end) after each release
    /// (spec.md#S2.9).
    ReleaseHooks,
    /// Nothing tells the cache of releases. Costs freshness: a buffer freed
    /// and reused at the same address is served the old registration, and
    /// the NIC reads and writes pages the program no longer maps (P2 does not
    /// hold). Only for memory that is never released while the cache lives.
    Unmonitored,
}

impl Monitoring {
    /// The choices, for error messages.
    const CHOICES: &'static str = "set CacheConfig::monitoring to Monitoring::Userfaultfd (and start a \
        MonitorThread), Explicit (call Cache::invalidate on every release), ReleaseHooks \
        (release_begin/release_end around every release) or Unmonitored (no release is ever seen: a \
        buffer freed and reused hits a stale registration)";
}

/// The configuration of a [`Cache`](super::Cache): the contract's declared policy
/// ([`Config`]: overlap policy, page size, chunking, eviction, limits) plus
/// implementation parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CacheConfig {
    /// What the model is configured with (spec.md#S6).
    pub contract: Config,
    /// Attempts of one miss before E6 (spec.md#S3.7, A7). At least 1.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// Per-thread lanes (spec.md#LN1): repeated hits without a lock or an
    /// atomic read-modify-write. On by default; off, every hit is an A1 hit
    /// (one shared lock and a state-word lease) and no lane memory is used.
    #[serde(default = "default_lanes")]
    pub lanes: bool,
    /// Memo slots per lane: a power of two in [2, 65536]; 56 bytes each, per
    /// thread and cache. Raise it for threads that reuse more buffers.
    #[serde(default = "default_lane_slots")]
    pub lane_slots: u32,
    /// How the cache learns of releases: must be chosen ([`Monitoring`]).
    #[serde(default)]
    pub monitoring: Monitoring,
    /// Test-only fault switches (never serialised).
    #[serde(skip)]
    #[cfg(any(test, feature = "faults"))]
    pub faults: Faults,
}

fn default_max_retries() -> u32 {
    DEFAULT_MAX_RETRIES
}

fn default_lanes() -> bool {
    true
}

fn default_lane_slots() -> u32 {
    LANE_SLOTS
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig::new(Config::default())
    }
}

impl CacheConfig {
    pub fn new(contract: Config) -> Self {
        CacheConfig {
            contract,
            max_retries: DEFAULT_MAX_RETRIES,
            lanes: true,
            lane_slots: LANE_SLOTS,
            monitoring: Monitoring::Unchosen,
            #[cfg(any(test, feature = "faults"))]
            faults: Faults::default(),
        }
    }

    /// The same configuration, with `monitoring` chosen.
    pub fn monitored_by(self, monitoring: Monitoring) -> Self {
        CacheConfig { monitoring, ..self }
    }

    /// The default configuration for a program that calls
    /// [`Cache::invalidate`](super::Cache::invalidate) on every release
    /// ([`Monitoring::Explicit`]).
    pub fn explicit() -> Self {
        CacheConfig::explicit_with(Config::default())
    }

    /// `contract`, for a program that calls `invalidate` on every release.
    pub fn explicit_with(contract: Config) -> Self {
        CacheConfig::new(contract).monitored_by(Monitoring::Explicit)
    }

    pub fn with_policy(policy: OverlapPolicy) -> Self {
        CacheConfig::new(Config::with_policy(policy))
    }

    /// The model's [`Config::validate`] (spec.md#S6.2: page size a power of two
    /// in [512, 2^20], `chunk_pages ≥ 1`, `chunk_pages · page_size ≤ 2^62`) and
    /// `max_retries ≥ 1`.
    pub fn validate(&self) -> Result<(), Error> {
        if self.monitoring == Monitoring::Unchosen {
            return Err(Error::InvalidConfig { reason: format!("no monitor chosen: {}", Monitoring::CHOICES) });
        }
        self.contract.validate().map_err(|reason| Error::InvalidConfig { reason })?;
        if self.max_retries == 0 {
            return Err(Error::InvalidConfig { reason: "max_retries must be at least 1".into() });
        }
        if !self.lane_slots.is_power_of_two() || !(2..=1 << 16).contains(&self.lane_slots) {
            return Err(Error::InvalidConfig { reason: format!("lane_slots {} is not a power of two in [2, 65536]", self.lane_slots) });
        }
        Ok(())
    }
}
