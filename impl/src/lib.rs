//! mrcache: a registration cache for RDMA memory regions (see spec.md).
//!
//! Layout: [`registrar`] pins memory (counting, io_uring, verbs);
//! [`monitor`] turns process memory releases into cache invalidations.

pub mod monitor;
pub mod pagemap;
pub mod registrar;

pub use mrcache_types as types;
