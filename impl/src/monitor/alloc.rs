//! `MonitoredAlloc`: a global-allocator wrapper that reports deallocations
//! to the caches subscribed to it (spec.md#S7.1, S7.2).
//!
//! Rust programs get exact release events without hooking libc: every
//! `dealloc`/`realloc` that gives a block back is reported *after* the inner
//! allocator took it back and before the call returns, as a synchronous hook
//! (spec.md#S1.8, H1, H2): a registration that began before the report is
//! marked stale by it, and acquires after the call returns miss. It is
//! conservative: a freed heap block may keep its frames, but the cache cannot
//! know, so registrations overlapping it leave the lookup.
//!
//! Invariants: reporting never waits for a cache lock (H2's try-lock), so a
//! deallocation inside a cache operation, even on the thread that holds the
//! cache lock, cannot deadlock (P6); a cheap lock-free filter
//! ([`crate::Cache::may_hold`]) skips frees that no registration can overlap;
//! at most [`MAX_SINKS`] caches subscribe, and subscriptions are permanent.

use crate::cache::Cache;
use crate::registrar::Registrar;
use mrcache_types::ReleaseKind;
use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Caches one allocator can report to.
pub const MAX_SINKS: usize = 8;

/// Something that wants to hear of deallocations: a cache.
pub trait ReleaseSink: Send + Sync {
    /// `[addr, addr+len)` is being given back. Must not block on a lock that
    /// a thread inside an allocation may hold.
    fn on_dealloc(&self, addr: u64, len: u64);
}

impl<R: Registrar> ReleaseSink for Cache<R> {
    fn on_dealloc(&self, addr: u64, len: u64) {
        if self.may_hold(addr, len) {
            // A bad range cannot come from a live Layout; nothing to report.
            let _ = self.invalidate(addr, len, ReleaseKind::Dealloc);
        }
    }
}

/// Wraps a [`GlobalAlloc`] and reports deallocations to subscribed caches.
///
/// ```ignore
/// #[global_allocator]
/// static ALLOC: MonitoredAlloc<std::alloc::System> = MonitoredAlloc::new(std::alloc::System);
/// let cache: &'static Cache<_> = Box::leak(Box::new(Cache::new(registrar, config)));
/// ALLOC.subscribe(cache).unwrap();
/// ```
pub struct MonitoredAlloc<A: GlobalAlloc> {
    inner: A,
    sinks: [OnceLock<&'static dyn ReleaseSink>; MAX_SINKS],
    claimed: AtomicUsize,
}

/// [`MonitoredAlloc::subscribe`] found every slot taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("MonitoredAlloc already reports to {MAX_SINKS} caches")]
pub struct TooManySinks;

impl<A: GlobalAlloc> MonitoredAlloc<A> {
    pub const fn new(inner: A) -> Self {
        MonitoredAlloc { inner, sinks: [const { OnceLock::new() }; MAX_SINKS], claimed: AtomicUsize::new(0) }
    }

    /// Reports every later deallocation to `sink`, forever.
    pub fn subscribe(&self, sink: &'static dyn ReleaseSink) -> Result<(), TooManySinks> {
        let i = self.claimed.fetch_add(1, Ordering::AcqRel);
        match self.sinks.get(i) {
            Some(slot) => {
                let _ = slot.set(sink);
                Ok(())
            }
            None => Err(TooManySinks),
        }
    }

    fn report(&self, ptr: *mut u8, len: usize) {
        // Bounded by MAX_SINKS; a slot claimed but not yet set is skipped
        // (its subscription has not completed, so it is not yet owed events).
        for slot in &self.sinks[..self.claimed.load(Ordering::Acquire).min(MAX_SINKS)] {
            if let Some(sink) = slot.get() {
                sink.on_dealloc(ptr as u64, len.max(1) as u64);
            }
        }
    }
}

// SAFETY: every method forwards to `inner` with the caller's own arguments,
// so `inner`'s guarantees carry over; reporting only reads the pointer value.
unsafe impl<A: GlobalAlloc> GlobalAlloc for MonitoredAlloc<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        unsafe { self.inner.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        unsafe { self.inner.alloc_zeroed(layout) }
    }

    //= spec.md#S1.8
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged; the caller upholds `dealloc`'s contract.
        unsafe { self.inner.dealloc(ptr, layout) };
        // After the release, before the call returns (spec.md#S1.8): a
        // registration that began before this report is marked stale by it.
        self.report(ptr, layout.size());
    }

    // `realloc` keeps the default: alloc, copy, then `dealloc` (which reports).
}
