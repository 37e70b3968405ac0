//! mrcache: a registration cache for RDMA memory regions (the contract:
//! [`spec`], the repository's spec.md).
//!
//! An RDMA NIC reads and writes only *registered* memory, and registering
//! (`ibv_reg_mr`) costs tens of microseconds, so a library registers a buffer
//! once and reuses the registration: [`Cache::acquire`] returns a [`Lease`]
//! on a registration covering the buffer (a hit, or a miss that registers
//! through the cache's [`registrar::Registrar`]); dropping the lease gives it
//! back. The cache must learn when the program frees or unmaps memory it
//! holds a registration of, or a later hit hands the NIC pages the buffer no
//! longer has: that is the monitor's job. A cache is built with a choice of
//! [`Monitoring`], and refused without one: a userfaultfd monitor
//! ([`MonitorThread::start`]: munmap, madvise, mremap and `free` that returns
//! memory are seen by themselves), [`Cache::invalidate`] called on every
//! release, [`Cache::release_begin`] / [`Cache::release_end`] from your own
//! memory hooks, or `Unmonitored`, which says what it costs.
//!
//! ```
//! use mrcache::registrar::counting::CountingRegistrar;
//! use mrcache::types::Access;
//! use mrcache::{Cache, CacheConfig, MonitorThread, Monitoring};
//! use std::sync::Arc;
//!
//! # fn main() -> Result<(), mrcache::Error> {
//! // The registrar pins memory: `registrar::verbs` (ibv_reg_mr on a
//! // protection domain) or `registrar::uring` in a real program; one that
//! // only counts here.
//! let config = CacheConfig::default().monitored_by(Monitoring::Userfaultfd);
//! let cache = Arc::new(Cache::new(CountingRegistrar::default(), config));
//! // Releases invalidate by themselves once the monitor runs (where
//! // userfaultfd is unavailable, this example falls back to `invalidate`).
//! let monitor = MonitorThread::start(&cache).ok();
//!
//! let buf = vec![0u8; 64 << 10];
//! {
//!     // A borrowed lease: lives within the cache's borrow.
//!     let lease = cache.acquire_slice(&buf, Access::LOCAL_WRITE)?;
//!     let keys = lease.keys(); // lkey / rkey for the work request
//!     let _ = keys;
//!     assert!(!lease.hit()); // the first acquire registers
//! } // dropped: released
//! assert!(cache.acquire_slice(&buf, Access::LOCAL_WRITE)?.hit());
//!
//! // Without a monitor, say that the memory is gone before reusing it:
//! if monitor.is_none() {
//!     cache.invalidate(buf.as_ptr() as u64, buf.len() as u64, mrcache::types::ReleaseKind::Munmap)?;
//! }
//! drop(buf);
//! # Ok(())
//! # }
//! ```
//!
//! Without a choice, construction fails and says what to choose:
//!
//! ```
//! use mrcache::registrar::counting::CountingRegistrar;
//! use mrcache::{Cache, CacheConfig};
//!
//! let refused = Cache::try_new(CountingRegistrar::default(), CacheConfig::default());
//! assert!(refused.unwrap_err().to_string().contains("no monitor chosen"));
//! ```
//!
//! For a request object released at completion, on any thread, use a
//! [`SharedCache`] and its [`OwnedLease`]s (an example is on
//! [`SharedCache`]).
//!
//! Layout: [`cache`] is the cache of spec.md §A ([`Cache`], [`Lease`]);
//! [`registrar`] pins memory ([`registrar::counting::CountingRegistrar`]
//! pins nothing and counts, for tests and examples; [`registrar::uring`];
//! `registrar::verbs`, feature `verbs`); [`monitor`] turns process memory
//! releases into cache invalidations ([`MonitorThread`]); [`types`] is the
//! vocabulary shared with the reference model ([`types::Access`], the flags
//! of an acquire; [`types::ReleaseKind`]; [`types::Stats`]).
//! The modules `index` (its interval index), `hit_memo` (the memo of its
//! answers), `sync` (the std/loom facade), `pagemap` and `mem` are public
//! for the project's own tests, benches and tools, and hidden from these
//! docs: they are not part of the API. The harnesses that check all of it
//! are a crate of their own, the test kit (`mrcache-testkit`, testkit/);
//! this crate holds only the fault switches they turn on (`Faults`, feature
//! `faults`, test builds only).
//! A production build (`cargo build --release -p mrcache`, no features)
//! depends on neither the reference model nor stateright and has no fault
//! switches (tests/production.rs shows it).

/// `$config.faults.$switch` in a test build (`cfg(test)` or feature
/// `faults`); `false` in a production build, which has no fault switches.
macro_rules! fault {
    ($config:expr, $switch:ident) => {{
        #[cfg(any(test, feature = "faults"))]
        let on = $config.faults.$switch;
        #[cfg(not(any(test, feature = "faults")))]
        let on = false;
        on
    }};
}

pub mod cache;
pub mod error;
mod fork_safe;
#[doc(hidden)]
pub mod hit_memo;
#[doc(hidden)]
pub mod index;
#[doc(hidden)]
pub mod mem;
pub mod monitor;
#[doc(hidden)]
pub mod pagemap;
pub mod registrar;
pub mod spec;
#[doc(hidden)]
pub mod sync;
#[doc(hidden)]
pub mod thread_token;

#[cfg(any(test, feature = "faults"))]
pub use cache::Faults;
pub use cache::{Cache, CacheConfig, Diagnostics, EventSource, Lease, Monitoring, OwnedLease, ReleaseEvent, SharedCache};
pub use error::Error;
pub use monitor::MonitorThread;
pub use mrcache_types::config::{Config, EvictionPolicy, Limits, OverlapPolicy};

/// The vocabulary shared with the reference model: [`types::Access`] (the
/// access flags of an acquire), [`types::ReleaseKind`], [`types::Stats`],
/// [`types::Range`]. Inlined, so that `cargo doc --no-deps` documents it.
#[doc(inline)]
pub use mrcache_types as types;
