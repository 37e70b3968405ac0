//! Memory monitors: sources of release events (spec.md#S7).
//!
//! - [`uffd`]: the userfaultfd primitive (non-blocking reads, WP mode);
//! - [`process`]: the process's one userfaultfd monitor, shared by every
//!   cache (S7.6, M1, M5, M6), whose reader never waits, and proving
//!   madvise returns (M3, M4);
//! - [`ring`]: the bounded event ring the reader publishes into (M6);
//! - [`uffd_thread`]: that primitive as one cache's own event source;
//! - [`alloc`]: `MonitoredAlloc`, a global-allocator wrapper for Rust programs;
//! - explicit calls: [`crate::Cache::invalidate`] (the synchronous hook path).

pub mod alloc;
pub mod madvise_proof;
pub mod process;
pub mod ring;
pub mod uffd;
pub mod uffd_thread;

pub use alloc::{MonitoredAlloc, ReleaseSink};
pub use process::MonitorThread;
pub use uffd_thread::UffdEvents;
