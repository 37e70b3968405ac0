//! Release windows (spec.md#S1.8, S2.9, W1–W3): a hook that runs *before*
//! the release reports it as `release_begin` … release … `release_end`.
//!
//! The oracle is the page-generation registrar of the test kit
//! (`mrcache_testkit::generations`: a handle remembers the generations it
//! pinned; `Pages::bump` is the release, its `complete` the return of the
//! releasing call): P2 says a lease granted to an acquire that began after
//! a release completed pinned that release's generation or a later one.
//!
//! - deterministic races, staged from inside the registrar (the release
//!   happens while a registration is in flight): the registration either
//!   goes stale (W1) or is served uncached (W3), and the next acquire is
//!   fresh; the same race with a plain notification *before* the release
//!   (the S1.8 hazard) hands out a stale registration, so the oracle can fail;
//! - bad arguments: E1, E2, E7 (an unmatched end changes nothing);
//! - a stress test: threads acquiring while others run begin/release/end.

use mrcache::types::{Access, ReleaseKind};
use mrcache::{Cache, CacheConfig, Config, Error, OverlapPolicy};
use mrcache_testkit::generations::{GenRegistrar, Pages};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

const P: u64 = 4096;
const RR: Access = Access::REMOTE_READ;

type Action = Box<dyn FnOnce(&Cache<GenRegistrar>) + Send>;

/// A leaked cache whose registrar runs `next` (once) inside `register`,
/// after pinning: the release raced with that registration.
struct Staged {
    cache: &'static Cache<GenRegistrar>,
    pages: Arc<Pages>,
    next: Arc<Mutex<Option<Action>>>,
}

fn staged(policy: OverlapPolicy) -> Staged {
    let pages = Arc::new(Pages::new(16, P));
    let next: Arc<Mutex<Option<Action>>> = Arc::new(Mutex::new(None));
    let cell: Arc<OnceLock<&'static Cache<GenRegistrar>>> = Arc::new(OnceLock::new());
    let mut reg = GenRegistrar::new(pages.clone());
    let (n, c) = (next.clone(), cell.clone());
    reg.on_register = Some(Box::new(move |_| {
        let action = n.lock().unwrap().take();
        if let Some(action) = action {
            action(c.get().expect("cache set"));
        }
    }));
    // Leaked: the registrar's hook refers to the cache.
    let cache: &'static Cache<GenRegistrar> = Box::leak(Box::new(Cache::new(reg, CacheConfig::explicit_with(Config::with_policy(policy)))));
    cell.set(cache).ok().unwrap();
    Staged { cache, pages, next }
}

impl Staged {
    fn stage(&self, f: impl FnOnce(&Cache<GenRegistrar>) + Send + 'static) {
        *self.next.lock().unwrap() = Some(Box::new(f));
    }
}

/// The release of `[addr, addr+len)` by a hook that runs before it, done
/// right: begin, the frames change, end, the releasing call returns.
fn paired_release(cache: &Cache<GenRegistrar>, pages: &Pages, addr: u64, len: u64) {
    cache.release_begin(addr, len).unwrap();
    let bumped = pages.bump(addr, len);
    cache.release_end(addr, len).unwrap();
    pages.complete(&bumped);
}

#[test]
//= spec.md#W3
//= spec.md#S1.8
fn a_registration_straddling_the_release_inside_a_window_is_served_not_cached() {
    for policy in OverlapPolicy::ALL {
        let s = staged(policy);
        let pages = s.pages.clone();
        s.cache.release_begin(P, P).unwrap();
        // Planned inside the window (windowed); the registrar pins the old
        // frames, then the release happens; the window is still open at A9.
        let bumped = Arc::new(Mutex::new(None));
        let b = bumped.clone();
        s.stage(move |_| *b.lock().unwrap() = Some(pages.bump(P, P)));
        let snap = s.pages.completed_snapshot(P, P);
        let first = s.cache.acquire(P, P, RR).unwrap();
        assert!(first.handle().is_fresh_for(&snap), "P2: the release overlapped the acquire");
        assert_eq!(first.handle().pinned, vec![0], "it pinned the frames the release took");
        assert_eq!(s.cache.stats().uncached, 1, "{policy:?}: served, not cached");
        s.cache.release_end(P, P).unwrap();
        s.pages.complete(&bumped.lock().unwrap().take().unwrap());
        // After the releasing call returned: a fresh registration, not the old one.
        let snap = s.pages.completed_snapshot(P, P);
        let second = s.cache.acquire(P, P, RR).unwrap();
        assert!(!second.hit() && second.handle().is_fresh_for(&snap), "{policy:?}: stale {:?}", second.handle().pinned);
        let third = s.cache.acquire(P, P, RR).unwrap();
        assert!(third.hit(), "{policy:?}: cached again after the window");
        let live = s.cache.registrar().live();
        drop(first);
        assert_eq!(s.cache.registrar().live(), live - 1, "the uncached one goes at its last release");
        assert_eq!(s.cache.open_release_windows(), 0);
    }
}

#[test]
//= spec.md#W3
fn a_windowed_registration_whose_window_closed_is_retried() {
    let s = staged(OverlapPolicy::Independent);
    let pages = s.pages.clone();
    s.cache.release_begin(P, P).unwrap();
    // Planned inside the window; the release and the end happen while the
    // registrar runs: at A7 no window is open, so it can be neither served
    // uncached (the acquire would take effect after the window) nor cached
    // (it pinned the old frames): it is retried.
    s.stage(move |c| {
        let bumped = pages.bump(P, P);
        c.release_end(P, P).unwrap();
        pages.complete(&bumped);
    });
    let lease = s.cache.acquire(P, P, RR).unwrap();
    assert_eq!(lease.handle().pinned, vec![1], "the retry pinned the new frames");
    assert_eq!((s.cache.diagnostics().stale_retries, s.cache.stats().uncached), (1, 0));
    assert!(s.cache.acquire(P, P, RR).unwrap().hit(), "the retry is cached");
}

#[test]
//= spec.md#W1
fn a_registration_in_flight_at_begin_goes_stale_and_is_retried() {
    let s = staged(OverlapPolicy::Independent);
    let pages = s.pages.clone();
    // Planned before the window: begin's event (drained at once: the lock
    // is free while the registrar runs) marks it stale; A7 retries after
    // the release, and the retry is cached.
    s.stage(move |c| paired_release(c, &pages, P, P));
    let lease = s.cache.acquire(P, P, RR).unwrap();
    assert_eq!(lease.handle().pinned, vec![1], "the retry pinned the new frames");
    assert_eq!(s.cache.diagnostics().stale_retries, 1);
    let again = s.cache.acquire(P, P, RR).unwrap();
    assert!(again.hit() && again.handle().pinned == vec![1]);
}

/// The control: the same race as above with a plain notification *before*
/// the release (`invalidate` from a pre-release hook, what S1.8 forbids)
/// caches the registration that pinned the old frames, and the oracle sees
/// the next acquire get it. This is the checker's `notify-before-release`.
#[test]
//= spec.md#S1.8
fn a_plain_notification_before_the_release_hands_out_stale_frames() {
    let s = staged(OverlapPolicy::Independent);
    let pages = s.pages.clone();
    s.cache.invalidate(P, P, ReleaseKind::Munmap).unwrap();
    s.stage(move |_| {
        let bumped = pages.bump(P, P);
        pages.complete(&bumped);
    });
    let first = s.cache.acquire(P, P, RR).unwrap();
    drop(first);
    let snap = s.pages.completed_snapshot(P, P);
    let second = s.cache.acquire(P, P, RR).unwrap();
    assert!(second.hit() && !second.handle().is_fresh_for(&snap), "the hazard W1-W3 close");
}

#[test]
//= spec.md#E7
//= spec.md#W2
fn bad_arguments_and_unmatched_ends() {
    let s = staged(OverlapPolicy::Independent);
    let c = s.cache;
    assert!(matches!(c.release_begin(P, 0), Err(Error::EmptyRange { .. })));
    assert!(matches!(c.release_end(u64::MAX - P, 2 * P), Err(Error::WrappingRange { .. })));
    let e = c.release_end(P, P).unwrap_err();
    assert!(matches!(e, Error::UnmatchedReleaseEnd { .. }) && e.code() == "E7" && e.to_string().starts_with("E7"), "{e}");
    assert_eq!(c.open_release_windows(), 0);
    // Nested and equal windows: each end closes one; a window on other
    // pages does not close one on these.
    c.release_begin(P, 2 * P).unwrap();
    c.release_begin(P, 2 * P).unwrap();
    assert!(matches!(c.release_end(P, P), Err(Error::UnmatchedReleaseEnd { .. })));
    c.release_end(P + 100, P).unwrap(); // the same pages [1, 3)
    let lease = c.acquire(2 * P, P, RR).unwrap();
    assert_eq!(c.stats().uncached, 1, "one window is still open");
    drop(lease);
    c.release_end(P, 2 * P).unwrap();
    assert_eq!(c.open_release_windows(), 0);
    let cached = c.acquire(2 * P, P, RR).unwrap();
    assert!(c.acquire(2 * P, P, RR).unwrap().hit());
    drop(cached);
    let st = c.stats();
    assert_eq!((st.errors, st.release_events), (4, 3), "E1, E2 and two E7 counted; one release event per begin");
}

/// Threads acquire overlapping ranges while others release pages through
/// the pair; every grant is checked against P2, and at the end nothing
/// stale is findable, nothing leaks and no window stays open.
#[test]
//= spec.md#W1
//= spec.md#W2
//= spec.md#W3
fn concurrent_acquires_never_get_frames_a_completed_release_took() {
    for policy in OverlapPolicy::ALL {
        let pages = Arc::new(Pages::new(16, P));
        let cache = Cache::new(GenRegistrar::new(pages.clone()), CacheConfig::explicit_with(Config::with_policy(policy)));
        let stop = AtomicBool::new(false);
        std::thread::scope(|sc| {
            for t in 0..2u64 {
                let (cache, pages, stop) = (&cache, &pages, &stop);
                sc.spawn(move || {
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t;
                    while !stop.load(Ordering::Relaxed) {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let (addr, len) = ((x % 6) * P, (1 + (x >> 8) % 2) * P);
                        // A window held open a while, as around a real
                        // munmap: acquires inside it miss (W1 took the
                        // entries out) and are served uncached (W3).
                        cache.release_begin(addr, len).unwrap();
                        std::thread::sleep(std::time::Duration::from_micros(50));
                        let bumped = pages.bump(addr, len);
                        cache.release_end(addr, len).unwrap();
                        pages.complete(&bumped);
                    }
                });
            }
            let workers: Vec<_> = (0..2u64)
                .map(|t| {
                    let (cache, pages) = (&cache, &pages);
                    sc.spawn(move || {
                        let mut x = 0x2545_f491_4f6c_dd1du64 ^ (t + 1);
                        let mut held = Vec::new();
                        // At least 4000 acquires and 100 ms: long enough
                        // for many windows (a window is open ~all the time).
                        let until = std::time::Instant::now() + std::time::Duration::from_millis(100);
                        let mut n = 0;
                        while n < 4000 || std::time::Instant::now() < until {
                            n += 1;
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let (addr, len) = ((x % 6) * P, (1 + (x >> 8) % 3) * P);
                            let snap = pages.completed_snapshot(addr, len);
                            match cache.acquire(addr, len, RR) {
                                Ok(l) => {
                                    assert!(l.handle().is_fresh_for(&snap), "{policy:?}: stale {:?} vs {snap:?}", l.handle().pinned);
                                    held.push(l);
                                }
                                Err(e) => assert_eq!(e.code(), "E6", "{e}"),
                            }
                            if held.len() > 3 {
                                drop(held.swap_remove((x >> 16) as usize % held.len()));
                            }
                        }
                    })
                })
                .collect();
            // Stop the releasers before propagating a worker's panic (else
            // the scope would wait for them forever).
            let results: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
            stop.store(true, Ordering::Relaxed);
            for r in results {
                if let Err(p) = r {
                    std::panic::resume_unwind(p);
                }
            }
        });
        assert_eq!(cache.open_release_windows(), 0);
        // Every findable entry is fresh now that every release completed.
        for p in 0..8 {
            let snap = pages.completed_snapshot(p * P, P);
            let l = cache.acquire(p * P, P, RR).unwrap();
            assert!(l.handle().is_fresh_for(&snap), "{policy:?}: page {p} stale after the releases");
        }
        cache.flush();
        assert_eq!(cache.registrar().live(), 0, "{policy:?}: leak");
        assert!(cache.stats().uncached > 0, "{policy:?}: no window ever served uncached");
    }
}
