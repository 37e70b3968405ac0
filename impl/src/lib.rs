//! mrcache: a registration cache for RDMA memory regions (see spec.md).
//!
//! Layout: [`cache`] is the cache of spec.md §A ([`Cache`], [`Lease`]);
//! [`index`] its interval index and [`hit_memo`] the memo of its answers; [`sync`] the std/loom facade;
//! [`registrar`] pins memory (counting, io_uring, verbs);
//! [`monitor`] turns process memory releases into cache invalidations;
//! `testkit` (feature `testkit`) holds the harnesses that check all of it.
//! A production build (`cargo build --release -p mrcache`, no features)
//! depends on neither the reference model nor stateright and has no fault
//! switches (`Faults`, test builds only; tests/production.rs shows it).

/// `$config.faults.$switch` in a test build (`cfg(test)` or feature
/// `testkit`); `false` in a production build, which has no fault switches.
macro_rules! fault {
    ($config:expr, $switch:ident) => {{
        #[cfg(any(test, feature = "testkit"))]
        let on = $config.faults.$switch;
        #[cfg(not(any(test, feature = "testkit")))]
        let on = false;
        on
    }};
}

pub mod cache;
pub mod error;
pub mod hit_memo;
pub mod index;
pub mod mem;
pub mod monitor;
pub mod pagemap;
pub mod registrar;
pub mod sync;
#[cfg(all(feature = "testkit", not(loom)))]
pub mod testkit;

#[cfg(any(test, feature = "testkit"))]
pub use cache::Faults;
pub use cache::{Cache, CacheConfig, Diagnostics, EventSource, Lease, OwnedLease, ReleaseEvent, SharedCache};
pub use error::Error;
pub use monitor::MonitorThread;
pub use mrcache_types::config::{Config, EvictionPolicy, Limits, OverlapPolicy};

pub use mrcache_types as types;
