//! The two failures once logged under CPU contention, reproduced
//! deterministically as scripted interleavings, and their causes shown.
//!
//! Both were false alarms of a test's oracle, not faults of the cache:
//!
//! 1. `four_threads_with_limits`: "stale lease R17309 [0x1a000,0x1c000)
//!    remote_read: [320, 343] vs [(26, 321)]". The oracle marked an event
//!    complete with the page's *current* generation. If a second event on the
//!    same page had changed the frames (its munmap began) but not yet run its
//!    hook, the first event's completion claimed the second one's generation,
//!    and a registration made between the two looked stale. spec.md#P2 orders
//!    an acquire only after events whose releasing call *returned*; the
//!    checker's `done_gens` records the generations each event installed. The
//!    oracle now does the same (`mrcache_testkit::generations::Pages::bump`
//!    returns them).
//! 2. `mrcache fuzz` DMA run: "after the final flush: 1 registrations live,
//!    2 io_uring slots in use, ... 20480 bytes pinned, 0 entries cached". The
//!    harness checked the registrar while the uffd monitor thread still ran. A
//!    monitor round that took an entry out of the index deregisters it after
//!    its unlock (spec.md#A11, L1: before the round ends), so a `flush` on
//!    another thread can return, with nothing cached, before that
//!    deregistration. The harness now stops the monitor before its check.
//!
//! The cache's fault switches still trip the corrected oracles
//! (`concurrent.rs`: `oracle_catches_p2_monitor_off`,
//! `oracle_catches_p4_leak_deregistration`; `dma_oracle.rs`: the teeth).
//! The minimal counterexamples are traces under `traces/regressions/oracle-*`.

use mrcache::registrar::counting::{CountingHandle, CountingRegistrar};
use mrcache::registrar::{Keys, Registrar, RegistrarError};
use mrcache::types::{Access, Range, ReleaseKind};
use mrcache::{Cache, CacheConfig, Config, ReleaseEvent};
use mrcache_testkit::generations::{GenRegistrar, Pages};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Condvar, Mutex};

const P: u64 = 4096;
const RR: Access = Access::REMOTE_READ;

/// The logged failure, step by step (page 26, two pages per chunk as in
/// `four_threads_with_limits`).
#[test]
fn stale_lease_alarm_was_the_oracle_reading_a_running_events_generation() {
    let pages = Arc::new(Pages::new(64, P));
    let config = Config { chunk_pages: 2, ..Config::default() };
    let cache = Cache::new(GenRegistrar::new(pages.clone()), CacheConfig::explicit_with(config));
    let page = 26 * P;

    // Event A on page 26: the frames change, then its hook runs.
    let a = pages.bump(page, P);
    cache.invalidate(page, P, ReleaseKind::Munmap).unwrap();
    // An acquire registers [0x1a000, 0x1c000) after A's frames changed.
    let first = cache.acquire(page, 8, RR).unwrap();
    assert!(!first.hit());
    assert_eq!(first.handle().pinned[0], a.0[0].1);
    drop(first);
    // Event B on page 26 begins: its frames change; its hook has not run.
    let b = pages.bump(page, P);
    // Event A's releasing call returns. The old oracle recorded the page's
    // generation *now*, which is B's.
    let old_completed = vec![(26usize, pages.gens[26].load(SeqCst))];
    pages.complete(&a);
    let completed = pages.completed_snapshot(page, 8);

    // The acquire that follows hits the registration made between A and B.
    let l = cache.acquire(page, 8, RR).unwrap();
    assert!(l.hit());
    // The logged shape: the pinned generation is older than the "completed" one.
    assert!(l.handle().pinned[0] < old_completed[0].1);
    assert!(!l.handle().is_fresh_for(&old_completed), "the old oracle calls it stale");
    // But P2 does not order this acquire after B (B has not returned), and
    // the registration is fresh for every event that completed: A.
    assert_eq!(completed, vec![(26, a.0[0].1)]);
    assert!(l.handle().is_fresh_for(&completed), "the corrected oracle");
    drop(l);

    // Event B's hook runs and its call returns: from now on P2 binds.
    cache.invalidate(page, P, ReleaseKind::Munmap).unwrap();
    pages.complete(&b);
    let l = cache.acquire(page, 8, RR).unwrap();
    assert!(!l.hit(), "B removed the registration");
    assert!(l.handle().is_fresh_for(&pages.completed_snapshot(page, 8)));
    assert_eq!(l.handle().pinned[0], b.0[0].1);
}

/// A counting registrar whose `deregister` can be held at a gate, to stop a
/// thread between a monitor round's unlock and its deregistrations.
#[derive(Default)]
struct GatedRegistrar {
    inner: CountingRegistrar,
    /// (gate closed, a deregistration is waiting at it)
    gate: Mutex<(bool, bool)>,
    changed: Condvar,
}

impl GatedRegistrar {
    fn close(&self) {
        self.gate.lock().unwrap().0 = true;
    }
    fn open(&self) {
        self.gate.lock().unwrap().0 = false;
        self.changed.notify_all();
    }
    fn wait_for_waiter(&self) {
        let mut g = self.gate.lock().unwrap();
        while !g.1 {
            g = self.changed.wait(g).unwrap();
        }
    }
}

impl Registrar for GatedRegistrar {
    type Handle = CountingHandle;
    fn register(&self, range: Range, access: Access) -> Result<CountingHandle, RegistrarError> {
        self.inner.register(range, access)
    }
    fn deregister(&self, handle: CountingHandle) -> Result<(), RegistrarError> {
        let mut g = self.gate.lock().unwrap();
        if g.0 {
            g.1 = true;
            self.changed.notify_all();
            while g.0 {
                g = self.changed.wait(g).unwrap();
            }
            g.1 = false;
        }
        drop(g);
        self.inner.deregister(handle)
    }
    fn keys(&self, handle: &CountingHandle) -> Keys {
        self.inner.keys(handle)
    }
    fn name(&self) -> &'static str {
        "gated"
    }
}

/// The logged leak, step by step: a monitor round (M2, as `MonitorThread`
/// runs it) removes an unleased entry and is between its unlock and its
/// deregistration when another thread flushes and checks.
#[test]
fn leak_alarm_was_a_check_beside_a_running_monitor_round() {
    let cache = Arc::new(Cache::new(GatedRegistrar::default(), CacheConfig::explicit()));
    drop(cache.acquire(0x1000, 5 * P, RR).unwrap());
    assert_eq!(cache.registrar().inner.live(), 1);
    cache.registrar().close();
    let monitor = std::thread::spawn({
        let cache = cache.clone();
        move || cache.drain_with(|evs| evs.push(ReleaseEvent::of(ReleaseKind::MadviseDontneed, Range::new(0x1000, P).unwrap())))
    });
    cache.registrar().wait_for_waiter();
    // The harness's old teardown, with the monitor thread still running.
    cache.flush();
    let s = cache.stats();
    let live = cache.registrar().inner.live();
    // The logged shape: a registration live after the final flush, its bytes
    // pinned, nothing cached.
    assert_eq!((live, s.pinned_bytes, s.cached_entries), (1, 5 * P, 0));
    // Legal (spec.md#L1): the operation that made it unfindable, the monitor
    // round, has not returned.
    assert!(!monitor.is_finished());
    cache.registrar().open();
    monitor.join().unwrap();
    // The corrected teardown: the monitor stopped, then the check.
    cache.flush();
    let s = cache.stats();
    assert_eq!((cache.registrar().inner.live(), s.pinned_bytes, s.cached_entries), (0, 0, 0));
    assert_eq!(s.registrations, s.deregistrations);
}
