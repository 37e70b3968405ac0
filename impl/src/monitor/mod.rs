//! Memory monitors: sources of release events (spec.md#S7).
//!
//! - [`uffd`]: the userfaultfd primitive (non-blocking reads, WP mode);
//! - [`process`]: the process's one userfaultfd monitor, shared by every
//!   cache (S7.6, M1, M2, M5) and proving madvise returns (M3, M4);
//! - [`uffd_thread`]: that primitive as one cache's own event source;
//! - `fork_close`: the hub's fds, which a fork child closes at once;
//! - [`alloc`]: `MonitoredAlloc`, a global-allocator wrapper for Rust programs;
//! - explicit calls: [`crate::Cache::invalidate`] (the synchronous hook path).

pub mod alloc;
mod fork_close;
pub mod madvise_proof;
pub mod process;
pub mod uffd;
pub mod uffd_thread;

pub use alloc::{MonitoredAlloc, ReleaseSink};
pub use process::MonitorThread;
pub use uffd_thread::UffdEvents;
