//! Release events raised from inside cache operations (spec.md#P6, S3.7,
//! S7.2): by the registrar while it registers (the lock is not held: the hook
//! gets the lock, marks the in-flight record stale, and the acquire retries),
//! and by a thread that holds the exclusive lock (the hook must not block: the
//! event is queued and drained by the next holder). Also the fault switches,
//! each shown to break what it should.

use mrcache::types::{Access, OpError, Range, ReleaseKind};
use mrcache::{Cache, CacheConfig, Config, EventSource, Faults, ReleaseEvent};
use mrcache_testkit::generations::{GenRegistrar, Pages};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock, Weak};

const P: u64 = 4096;
const RR: Access = Access::REMOTE_READ;

type GenCache = Cache<GenRegistrar>;

/// A cache whose registrar raises a release event over `event(range)` from
/// inside `register`, the first `times` times it is called.
fn reentrant_cache(config: CacheConfig, times: u32, event: fn(Range) -> (u64, u64)) -> (Arc<GenCache>, Arc<Pages>) {
    reentrant_cache_after(config, 0, times, event)
}

/// Same, but the first `skip` calls raise nothing.
fn reentrant_cache_after(config: CacheConfig, skip: u32, times: u32, event: fn(Range) -> (u64, u64)) -> (Arc<GenCache>, Arc<Pages>) {
    let pages = Arc::new(Pages::new(64, P));
    let slot: Arc<OnceLock<Weak<GenCache>>> = Arc::new(OnceLock::new());
    let left = Arc::new(AtomicU32::new(times));
    let skip = AtomicU32::new(skip);
    let mut reg = GenRegistrar::new(pages.clone());
    {
        let slot = slot.clone();
        let pages = pages.clone();
        reg.on_register = Some(Box::new(move |range| {
            if skip.load(Ordering::SeqCst) > 0 {
                skip.fetch_sub(1, Ordering::SeqCst);
                return;
            }
            if left.load(Ordering::SeqCst) == 0 {
                return;
            }
            left.fetch_sub(1, Ordering::SeqCst);
            let (addr, len) = event(range);
            let bumped = pages.bump(addr, len);
            if let Some(cache) = slot.get().and_then(Weak::upgrade) {
                // Same thread, inside `acquire`: must neither deadlock nor panic.
                cache.invalidate(addr, len, ReleaseKind::Munmap).unwrap();
            }
            pages.complete(&bumped);
        }));
    }
    let cache = Arc::new(Cache::new(reg, config));
    slot.set(Arc::downgrade(&cache)).unwrap();
    (cache, pages)
}

fn same(r: Range) -> (u64, u64) {
    (r.addr, r.len)
}

#[test]
fn invalidation_inside_register_makes_the_acquire_retry() {
    let (cache, pages) = reentrant_cache(CacheConfig::explicit(), 1, same);
    let snap = pages.completed_snapshot(0, P);
    let lease = cache.acquire(0, P, RR).unwrap();
    assert!(!lease.hit());
    assert_eq!(lease.view().id, 1, "the stale registration got no id");
    // The event completed during the acquire; the returned registration was
    // made after it (the retry), so it pinned the new frames.
    assert!(lease.handle().is_fresh_for(&pages.completed_snapshot(0, P)));
    assert!(lease.handle().is_fresh_for(&snap));
    let s = cache.stats();
    assert_eq!((s.registrations, s.misses, s.release_events, s.errors), (1, 1, 1, 0));
    let d = cache.diagnostics();
    assert_eq!((d.stale_retries, d.discarded_registrations), (1, 1));
    assert_eq!(cache.registrar().registered.load(Ordering::SeqCst), 2);
    assert_eq!(cache.registrar().live(), 1);
    drop(lease);
    cache.flush();
    assert_eq!(cache.registrar().live(), 0);
}

//= spec.md#A7 type=test
//= spec.md#A8 type=test
/// A7 runs A8's test first: a registration that went stale while another
/// thread inserted an entry covering its request returns that entry as a
/// hit. Inside the first registrar call, the request's range is released
/// (the record goes stale) and another thread then acquires it (a miss,
/// planned after the release: cached). With `max_retries` 1 a stale test
/// first would give up (E6). The checker pins the model's side
/// (`a7_tests_a8_before_the_stale_record`).
#[test]
fn a_stale_registration_beside_a_covering_entry_is_a_hit() {
    let pages = Arc::new(Pages::new(64, P));
    let slot: Arc<OnceLock<Weak<GenCache>>> = Arc::new(OnceLock::new());
    let first = Arc::new(AtomicU32::new(1));
    let mut reg = GenRegistrar::new(pages.clone());
    {
        let (slot, pages) = (slot.clone(), pages.clone());
        reg.on_register = Some(Box::new(move |range| {
            if first.swap(0, Ordering::SeqCst) == 0 {
                return;
            }
            let cache = slot.get().and_then(Weak::upgrade).expect("the cache is set");
            let bumped = pages.bump(range.addr, range.len);
            cache.invalidate(range.addr, range.len, ReleaseKind::Munmap).unwrap();
            pages.complete(&bumped);
            let other = cache.clone();
            let inner = std::thread::spawn(move || other.acquire(range.addr, range.len, RR).map(|l| (l.hit(), l.view().id)));
            assert_eq!(inner.join().unwrap().unwrap(), (false, 1), "the other thread's acquire misses and caches R1");
        }));
    }
    let cache = Arc::new(Cache::new(reg, CacheConfig { max_retries: 1, ..CacheConfig::explicit() }));
    slot.set(Arc::downgrade(&cache)).unwrap();
    let lease = cache.acquire(0, P, RR).unwrap();
    assert!(lease.hit(), "A8's test comes first: the covering entry is a hit");
    assert_eq!(lease.view().id, 1);
    assert!(lease.handle().is_fresh_for(&pages.completed_snapshot(0, P)));
    let d = cache.diagnostics();
    assert_eq!((d.stale_retries, d.discarded_registrations), (0, 1), "no retry; the stale registration dropped");
    assert_eq!(cache.registrar().registered.load(Ordering::SeqCst), 2);
    drop(lease);
    cache.flush();
    assert_eq!(cache.registrar().live(), 0);
}

#[test]
fn invalidated_on_every_attempt_is_e6() {
    let (cache, _) = reentrant_cache(CacheConfig::explicit(), u32::MAX, same);
    let e = cache.acquire(0, 2 * P, RR).unwrap_err();
    assert_eq!(e.op_error(), OpError::RetriesExhausted);
    assert!(e.to_string().contains("E6") && e.to_string().contains('4'), "{e}");
    assert_eq!(cache.registrar().registered.load(Ordering::SeqCst), 4, "max_retries attempts");
    assert_eq!(cache.registrar().live(), 0, "every stale registration deregistered");
    let s = cache.stats();
    assert_eq!((s.registrations, s.misses, s.errors, s.cached_entries, s.pinned_bytes), (0, 0, 1, 0, 0));
}

#[test]
fn max_retries_is_configurable() {
    let config = CacheConfig { max_retries: 2, ..CacheConfig::explicit() };
    let (cache, _) = reentrant_cache(config, u32::MAX, same);
    assert!(cache.acquire(0, P, RR).is_err());
    assert_eq!(cache.registrar().registered.load(Ordering::SeqCst), 2);
}

#[test]
fn unrelated_event_inside_register_invalidates_others_not_the_new_one() {
    // The second registration raises an event over the first one's page: the
    // cached entry goes, the registration in flight is not stale.
    let (cache, pages) = reentrant_cache_after(CacheConfig::explicit(), 1, 1, |_| (32 * P, P));
    drop(cache.acquire(32 * P, P, RR).unwrap());
    assert_eq!(cache.stats().cached_entries, 1);
    let l = cache.acquire(0, P, RR).unwrap();
    assert!(!l.hit());
    assert!(l.handle().is_fresh_for(&pages.completed_snapshot(0, P)));
    let s = cache.stats();
    assert_eq!((s.invalidations, s.deregistrations, s.cached_entries, s.registrations), (1, 1, 1, 2));
    assert_eq!(cache.diagnostics().stale_retries, 0);
    assert_eq!(cache.registrar().live(), 1);
    let again = cache.acquire(32 * P, P, RR).unwrap();
    assert!(!again.hit(), "the invalidated entry is gone");
    assert!(again.handle().is_fresh_for(&pages.completed_snapshot(32 * P, P)));
}

#[test]
fn hook_while_holding_the_lock_does_not_block() {
    let pages = Arc::new(Pages::new(64, P));
    let cache = Cache::new(GenRegistrar::new(pages.clone()), CacheConfig::explicit());
    drop(cache.acquire(0, 2 * P, RR).unwrap());
    drop(cache.acquire(8 * P, P, RR).unwrap());
    // Inside the monitor round the exclusive lock is held: an explicit
    // invalidation from this thread (e.g. a free inside the lock) is queued.
    cache.drain_with(|events| {
        cache.invalidate(0, P, ReleaseKind::MadviseDontneed).unwrap();
        events.push(ReleaseEvent::of(ReleaseKind::Munmap, Range::new(8 * P, P).unwrap()));
    });
    let s = cache.stats();
    assert_eq!(s.release_events, 2);
    // The monitor's event was applied in the round; the queued one was drained
    // before the round's unlock (or is drained by the next holder).
    assert_eq!(s.invalidations + cache.diagnostics().queued_events, 2);
    let l = cache.acquire(0, P, RR).unwrap();
    assert!(!l.hit(), "a queued event is never missed by the next lookup");
    assert_eq!(cache.stats().invalidations, 2);
    assert_eq!(cache.diagnostics().queued_events, 0);
    drop(l);
    cache.flush();
    assert_eq!(cache.registrar().live(), 0);
}

/// An event source that counts its reads.
struct CountedSource {
    reads: Arc<AtomicU32>,
    pending: std::sync::Mutex<Vec<ReleaseEvent>>,
}

impl EventSource for CountedSource {
    fn read_pending(&self, out: &mut Vec<ReleaseEvent>) -> Option<u64> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        out.append(&mut self.pending.lock().unwrap());
        None
    }
}

#[test]
fn a_monitor_round_reads_its_source_once() {
    let pages = Arc::new(Pages::new(64, P));
    let cache = Cache::new(GenRegistrar::new(pages.clone()), CacheConfig::explicit());
    drop(cache.acquire(0, P, RR).unwrap());
    let reads = Arc::new(AtomicU32::new(0));
    let ev = ReleaseEvent::of(ReleaseKind::Munmap, Range::new(0, P).unwrap());
    let source = CountedSource { reads: reads.clone(), pending: std::sync::Mutex::new(vec![ev]) };
    assert!(cache.set_event_source(Box::new(source)).is_ok());
    assert!(cache.monitor_round());
    // The round's drain reads the source; the round itself reads nothing
    // more (it used to read the fd once more, before its drain).
    assert_eq!(reads.load(Ordering::SeqCst), 1);
    let s = cache.stats();
    assert_eq!((s.release_events, s.invalidations), (1, 1));
    cache.flush();
    assert_eq!(cache.registrar().live(), 0);
}

#[test]
//= spec.md#L2
fn full_queue_collapses_into_a_hull() {
    // max_unreleased = 2 (spec.md#L2): a hook that finds the queue full
    // replaces it by one event covering the hull; it never waits.
    let config = CacheConfig::explicit_with(Config {
        limits: mrcache::Limits { max_unreleased: Some(2), ..Default::default() },
        ..Config::default()
    });
    let pages = Arc::new(Pages::new(64, P));
    let cache = Cache::new(GenRegistrar::new(pages), config);
    for page in [0, 1, 2, 4, 6] {
        drop(cache.acquire(page * P, P, RR).unwrap());
    }
    assert_eq!(cache.stats().cached_entries, 5);
    assert_eq!(cache.diagnostics().queue_capacity, 2);
    cache.drain_with(|_| {
        // Holding the lock: every invalidation is queued, none waits.
        for (i, page) in [0u64, 2, 4].into_iter().enumerate() {
            cache.invalidate(page * P, P, ReleaseKind::Munmap).unwrap();
            assert_eq!(cache.diagnostics().queued_events, [1, 2, 1][i]);
        }
    });
    // The hull [0, 5) also removed the entry on page 1 (conservative).
    let left: Vec<u64> = cache.cached_views().iter().map(|v| v.addr / P).collect();
    assert_eq!(left, vec![6]);
    assert_eq!(cache.stats().release_events, 3);
    cache.invalidate(6 * P, P, ReleaseKind::Munmap).unwrap();
    assert_eq!(cache.stats().cached_entries, 0);
    assert_eq!(cache.registrar().live(), 0);
}

// -- fault switches ----------------------------------------------------------

#[test]
fn skip_seq_recheck_returns_a_stale_registration() {
    let mut config = CacheConfig::explicit();
    config.faults.skip_seq_recheck = true;
    let (cache, pages) = reentrant_cache(config, 1, same);
    let lease = cache.acquire(0, P, RR).unwrap();
    // The event completed before the acquire returned, and the only
    // registration pinned the frames from before it.
    assert!(!lease.handle().is_fresh_for(&pages.completed_snapshot(0, P)), "the mutant must be visible");
    drop(lease);
    // Later acquires (which begin after the event) hit the stale entry: P2.
    let later = cache.acquire(0, P, RR).unwrap();
    assert!(later.hit());
    assert!(!later.handle().is_fresh_for(&pages.completed_snapshot(0, P)));
}

#[test]
fn monitor_off_misses_release_events() {
    let mut config = CacheConfig::explicit();
    config.faults.monitor_off = true;
    let pages = Arc::new(Pages::new(64, P));
    let cache = Cache::new(GenRegistrar::new(pages.clone()), config);
    drop(cache.acquire(0, P, RR).unwrap());
    let bumped = pages.bump(0, P);
    cache.invalidate(0, P, ReleaseKind::Munmap).unwrap();
    pages.complete(&bumped);
    let l = cache.acquire(0, P, RR).unwrap();
    assert!(l.hit() && !l.handle().is_fresh_for(&pages.completed_snapshot(0, P)));
}

#[test]
fn dereg_leased_on_invalidate_deregisters_under_a_lease() {
    let mut faults = Faults::default();
    // SAFETY: GenHandle owns only plain data; `handle()` stays readable.
    unsafe { faults.enable_dereg_leased_on_invalidate() };
    let config = CacheConfig { faults, ..CacheConfig::explicit() };
    let pages = Arc::new(Pages::new(64, P));
    let cache = Cache::new(GenRegistrar::new(pages), config);
    let lease = cache.acquire(0, P, RR).unwrap();
    cache.invalidate(0, P, ReleaseKind::Munmap).unwrap();
    assert_eq!(cache.registrar().live(), 0, "deregistered while leased: P3 broken, as intended");
    assert_eq!(cache.diagnostics().early_deregistrations, 1);
    drop(lease); // must not deregister a second time
    assert_eq!(cache.registrar().deregistered.load(Ordering::SeqCst), 1);
    let s = cache.stats();
    assert_eq!((s.deregistrations, s.pinned_bytes), (1, 0));
}

#[test]
fn faults_off_by_default_and_leased_invalidation_defers() {
    let pages = Arc::new(Pages::new(64, P));
    let cache = Cache::new(GenRegistrar::new(pages), CacheConfig::explicit());
    let lease = cache.acquire(0, P, RR).unwrap();
    cache.invalidate(0, P, ReleaseKind::Munmap).unwrap();
    assert_eq!(cache.registrar().live(), 1, "P3: a leased registration stays registered");
    let s = cache.stats();
    assert_eq!((s.leased_invalidations, s.deferred_deregistrations, s.cached_entries), (1, 1, 0));
    drop(lease);
    assert_eq!(cache.registrar().live(), 0, "deregistered at the last release (R1)");
}
