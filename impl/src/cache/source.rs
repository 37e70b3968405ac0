//! The event source: what an asynchronous monitor gives the cache
//! (spec.md#S3.8, M2, M4) and the event it delivers. Plain data and a trait
//! (layer 1): the cache reads a source under its exclusive lock (events.rs),
//! so a source must never block nor free monitored memory.

use mrcache_types::Range;

/// A release event (spec.md#S2.3) with its kind: what a monitor reads, a
/// hook queues and a drain applies (one type, from the types crate).
pub use mrcache_types::ReleaseEvent;

/// What [`EventSource::watch`] did with a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watched {
    /// Watched: the registration may be cached.
    Yes,
    /// Not watched, and not an error: another userfaultfd of the process
    /// watches it, or the source no longer delivers. The acquire is served
    /// and its registration is not cached (spec.md#S7.6, A5).
    Not,
}

/// An asynchronous monitor the cache reads under its exclusive lock
/// (spec.md#S3.8, M2: "A2 and A6 also read pending events, from a monitor that serves their cache alone").
pub trait EventSource: Send + Sync + 'static {
    /// Appends every pending event without blocking. Called with the cache's
    /// exclusive lock held: it must not block and must not free monitored
    /// memory. Returns the gate mark (spec.md#M6) the events bring the cache
    /// to: `Some(2q)` once `out` holds every event of the first `q` the
    /// process's reader published (the source may wait out a read in
    /// progress, which never waits on anything); `None` for a source that
    /// does not gate hits.
    fn read_pending(&self, out: &mut Vec<ReleaseEvent>) -> Option<u64>;

    /// The gate mark (spec.md#M6) of a cache that installs this source and
    /// has applied nothing from it yet; `None`: the source does not gate.
    fn gate_start(&self) -> Option<u64> {
        None
    }

    /// Starts watching `range` before it is registered (spec.md#S7.3). Called
    /// without the cache lock, before the registrar. An error fails the
    /// acquire with [`Error::Watch`](crate::Error::Watch); [`Watched::Not`] serves it uncached
    /// (spec.md#S7.6: a range another userfaultfd watches).
    fn watch(&self, _range: Range) -> Result<Watched, String> {
        Ok(Watched::Yes)
    }

    /// Whether events still reach the cache. A source that stopped
    /// delivering (its cache detached from a shared monitor, spec.md#S7.6)
    /// returns `false`: nothing is cached from then on.
    fn delivering(&self) -> bool {
        true
    }

    /// Whether this source proves that a madvise returned (spec.md#M4): a
    /// REMOVE it delivers then opens a release window (M3) that the source
    /// closes with [`Cache::close_remove_window`](crate::Cache::close_remove_window) once proven. A source that
    /// cannot prove it returns `false`: its REMOVEs are plain events
    /// (spec.md#S7.4(b) stays open).
    fn proves_removes(&self) -> bool {
        false
    }

    /// M3 opened a window on `range` (called under the exclusive lock,
    /// after the window is open): the source owes it an M4. Must not block.
    fn remove_window_opened(&self, _range: Range) {}
}
