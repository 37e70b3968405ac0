//! The userfaultfd primitive as one cache's own event source (spec.md#S3.8,
//! M2: "A2 and A6 also read pending events, from a monitor that serves
//! their cache alone").
//!
//! [`UffdEvents`] is read by the cache only while it holds its exclusive
//! lock (M2, and A2/A6 before every slow-path lookup), so an event is never
//! read (which wakes the releasing thread) without being applied in the
//! same critical section. Its REMOVEs are plain events (S7.4(b) stays open):
//! it is for drivers that pace the monitor themselves (the conformance
//! adapter). Applications use [`super::MonitorThread`], the process's one
//! monitor (S7.6), which proves madvise returns (M3, M4).

use super::uffd::{UffdError, UffdMonitor};
use crate::cache::{EventSource, ReleaseEvent, Watched};
use mrcache_types::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use super::process::READ_BATCH;

/// A [`UffdMonitor`] as one cache's event source.
pub struct UffdEvents {
    monitor: Arc<UffdMonitor>,
    read_errors: AtomicU64,
}

impl UffdEvents {
    /// A source whose REMOVEs are plain events (S7.4(b) open).
    pub fn new(monitor: Arc<UffdMonitor>) -> Self {
        UffdEvents { monitor, read_errors: AtomicU64::new(0) }
    }

    /// `read()` calls that failed (not EAGAIN). They are retried next round.
    pub fn read_errors(&self) -> u64 {
        self.read_errors.load(Ordering::Relaxed)
    }
}

impl EventSource for UffdEvents {
    fn read_pending(&self, out: &mut Vec<ReleaseEvent>) -> Option<u64> {
        // Bounded: each call reads at most READ_BATCH messages and stops when
        // the kernel has none left (EAGAIN), so the lock is held briefly.
        if self.monitor.read_pending(out, READ_BATCH).is_err() {
            self.read_errors.fetch_add(1, Ordering::Relaxed);
        }
        // Read under this cache's lock itself (M2): nothing to gate.
        None
    }

    fn watch(&self, range: Range) -> Result<Watched, String> {
        match self.monitor.watch(range) {
            Ok(()) => Ok(Watched::Yes),
            // Another userfaultfd of the process watches it (spec.md#S7.6).
            Err(UffdError::Unwatchable { errno: libc::EBUSY, .. }) => Ok(Watched::Not),
            Err(e) => Err(e.to_string()),
        }
    }
}
