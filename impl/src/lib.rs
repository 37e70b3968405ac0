//! mrcache: a registration cache for RDMA memory regions (see spec.md).
//!
//! Layout: [`cache`] is the cache of spec.md §A ([`Cache`], [`Lease`]);
//! [`index`] its interval index; [`sync`] the std/loom facade;
//! [`registrar`] pins memory (counting, io_uring, verbs);
//! [`monitor`] turns process memory releases into cache invalidations;
//! `testkit` (feature `testkit`) holds the harnesses that check all of it.

pub mod cache;
pub mod error;
pub mod index;
pub mod monitor;
pub mod pagemap;
pub mod registrar;
pub mod sync;
#[cfg(all(feature = "testkit", not(loom)))]
pub mod testkit;

pub use cache::{Cache, CacheConfig, Diagnostics, EventSource, Faults, Lease, ReleaseEvent};
pub use error::Error;
pub use monitor::MonitorThread;
pub use mrcache_model::{Config, EvictionPolicy, Limits, OverlapPolicy};

pub use mrcache_types as types;
