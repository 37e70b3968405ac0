//! Memory monitors: sources of release events (spec.md#S7).
//!
//! - [`uffd`]: the userfaultfd primitive (non-blocking reads, WP mode);
//! - [`uffd_thread`]: that primitive as a cache's event source, plus the
//!   monitor thread (M1/M2);
//! - [`alloc`]: `MonitoredAlloc`, a global-allocator wrapper for Rust programs;
//! - explicit calls: [`crate::Cache::invalidate`] (the synchronous hook path).

pub mod alloc;
pub mod madvise_proof;
pub mod uffd;
pub mod uffd_thread;

pub use alloc::{MonitoredAlloc, ReleaseSink};
pub use uffd_thread::{MonitorThread, UffdEvents};
