//! Loom models of the three races of spec.md §A:
//!
//! 1. the lease refcount / deregistration handoff (A-H): invalidation vs the
//!    last release → exactly one deregistration (P3, P4);
//! 2. the invalidation queue (H1, H2, S3.9): a hook's push + try-lock against
//!    a lock holder → no event is lost before the next lookup;
//! 3. the sequence retry (S3.7, A4–A9): a release event while the registrar
//!    runs → the stale registration is never returned or cached (P2);
//! 4. lanes (LN1–LN6): a lane hit or a lane release against a revoke → the
//!    registration stays registered while leased (P3) and is deregistered
//!    exactly once (P4). Loom has no membarrier: under `--cfg loom` the lane's
//!    plain store/load pair is a sequentially consistent swap/read, which is
//!    what the light + heavy barrier pair guarantees (spec.md#LN6); the
//!    store-buffer reasoning itself is checked by the checker's TSO model;
//! 5. release windows (W1–W3): a hook before the release (`release_begin`,
//!    the frames change, `release_end`) against an acquire → no registration
//!    that pinned the old frames is cached (P2 for the next acquire), and
//!    no window stays open;
//! 6. the hit memo (A1): a hit through the memo against a removal → the
//!    removed entry is never handed out once its removal returned;
//! 7. the lock-free hit (A0): its compare-exchange against a removal and
//!    the reuse of the entry's memory for another key (the pool's
//!    reincarnation store) → never an entry of another key, never a
//!    removed one after its removal returned, every registration
//!    deregistered once.
//!
//! With `--cfg loom` each `model` explores the interleavings (run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p mrcache --test loom --release`);
//! without it, `model` runs the closure once on real threads, so these are
//! plain tests too. Models 1 and 2 use the standalone types the cache is built
//! from ([`EntryState`], [`InvalidationQueue`] and the cache's lock type);
//! models 1 and 3 also run the whole [`Cache`].

use mrcache::cache::{EntryState, Invalidated, InvalidationQueue, Released};
use mrcache::registrar::counting::CountingRegistrar;
use mrcache::registrar::{Keys, Registrar, RegistrarError};
use mrcache::sync::{model, model_with_preemptions, thread, Arc, AtomicBool, AtomicU64, AtomicUsize, Ordering, RwLock};
use mrcache::types::{Access, Range, ReleaseEvent, ReleaseKind};
use mrcache::{Cache, CacheConfig};

const P: u64 = 4096;
const RR: Access = Access::REMOTE_READ;

// ---------------------------------------------------------------------------
// 1. A-H handoff

fn owned_by_release(r: Released) -> usize {
    usize::from(matches!(r, Released::Owner { .. }))
}

#[test]
fn handoff_invalidate_vs_last_release() {
    model(|| {
        let state = Arc::new(EntryState::new(1));
        let owners = Arc::new(AtomicUsize::new(0));
        let t = {
            let (state, owners) = (state.clone(), owners.clone());
            thread::spawn(move || {
                owners.fetch_add(owned_by_release(state.release()), Ordering::SeqCst);
            })
        };
        if state.invalidate(0) == Invalidated::Owner {
            owners.fetch_add(1, Ordering::SeqCst);
        }
        t.join().unwrap();
        assert_eq!(owners.load(Ordering::SeqCst), 1, "exactly one deregistration");
        assert_eq!(state.leases(), 0);
        assert!(state.is_invalid());
    });
}

#[test]
fn handoff_two_leases_and_an_invalidation() {
    model(|| {
        let state = Arc::new(EntryState::new(2));
        let owners = Arc::new(AtomicUsize::new(0));
        let releasers: Vec<_> = (0..2)
            .map(|_| {
                let (state, owners) = (state.clone(), owners.clone());
                thread::spawn(move || {
                    owners.fetch_add(owned_by_release(state.release()), Ordering::SeqCst);
                })
            })
            .collect();
        if state.invalidate(0) == Invalidated::Owner {
            owners.fetch_add(1, Ordering::SeqCst);
        }
        for t in releasers {
            t.join().unwrap();
        }
        assert_eq!(owners.load(Ordering::SeqCst), 1);
    });
}

#[test]
fn handoff_through_the_cache() {
    // A lease dropped on one thread while another invalidates its range: the
    // registrar sees exactly one deregistration, never while leased.
    model(|| {
        let cache = Arc::new(Cache::new(CountingRegistrar::default(), CacheConfig::explicit()));
        let lease = cache.acquire(0, P, RR).unwrap();
        let view = lease.view();
        drop(lease);
        let holder = {
            let cache = cache.clone();
            thread::spawn(move || {
                let l = cache.acquire(0, P, RR).unwrap();
                // Either a hit on `view` or (after the invalidation) a fresh miss.
                assert!(l.hit() == (l.view() == view));
                drop(l);
            })
        };
        cache.invalidate(0, P, ReleaseKind::Munmap).unwrap();
        holder.join().unwrap();
        all_deregistered_once(&cache);
        let s = cache.stats();
        assert_eq!(s.registrations, s.deregistrations);
    });
}

// ---------------------------------------------------------------------------
// 2. The invalidation queue against a lock holder

/// What the cache lock protects, reduced to the events applied so far.
struct Sim {
    lock: RwLock<Vec<ReleaseEvent>>,
    queue: InvalidationQueue,
}

/// A munmap of page `page`.
fn ev(page: u64) -> ReleaseEvent {
    ReleaseEvent::of(ReleaseKind::Munmap, Range { addr: page * P, len: P })
}

fn covered(applied: &[ReleaseEvent], page: u64) -> bool {
    applied.iter().any(|s| s.range.contains(&ev(page).range))
}

impl Sim {
    fn new(capacity: usize) -> Arc<Sim> {
        Arc::new(Sim { lock: RwLock::new(Vec::new()), queue: InvalidationQueue::with_capacity(capacity) })
    }
    fn drain(&self, applied: &mut Vec<ReleaseEvent>) {
        self.queue.take_all(applied);
    }
    /// H1 + H2.
    fn hook(&self, page: u64) {
        self.queue.push(ev(page));
        if let Ok(mut g) = self.lock.try_write() {
            self.drain(&mut g);
        }
    }
    /// A2-style slow path: lock exclusive, drain.
    fn slow_path(&self) {
        let mut g = self.lock.write().unwrap();
        self.drain(&mut g);
    }
    /// A1 then A2/A3: the events a lookup sees as applied.
    fn lookup(&self) -> Vec<ReleaseEvent> {
        if self.queue.is_empty() {
            return self.lock.read().unwrap().clone();
        }
        let mut g = self.lock.write().unwrap();
        self.drain(&mut g);
        g.clone()
    }
}

#[test]
fn queued_event_is_never_missed() {
    model(|| {
        let sim = Sim::new(8);
        let hook_done = Arc::new(AtomicBool::new(false));
        let hooker = {
            let (sim, done) = (sim.clone(), hook_done.clone());
            thread::spawn(move || {
                sim.hook(7);
                done.store(true, Ordering::Release);
            })
        };
        let holder = {
            let sim = sim.clone();
            thread::spawn(move || sim.slow_path())
        };
        // A lookup that begins after the hook returned must see the event.
        if hook_done.load(Ordering::Acquire) {
            assert!(covered(&sim.lookup(), 7), "event lost before the next lookup");
        }
        hooker.join().unwrap();
        holder.join().unwrap();
        assert!(covered(&sim.lookup(), 7));
        assert!(sim.queue.is_empty());
    });
}

#[test]
fn two_hooks_and_a_reader() {
    model(|| {
        let sim = Sim::new(8);
        let hooks: Vec<_> = [1u64, 2]
            .into_iter()
            .map(|page| {
                let sim = sim.clone();
                thread::spawn(move || sim.hook(page))
            })
            .collect();
        // A fast-path reader holding the lock shared makes the hooks' try-lock fail.
        let _ = sim.lookup();
        for h in hooks {
            h.join().unwrap();
        }
        let seen = sim.lookup();
        assert!(covered(&seen, 1) && covered(&seen, 2), "{seen:?}");
    });
}

#[test]
fn full_queue_collapses_into_a_hull_without_losing_events() {
    // Capacity 1 (spec.md#L2): the second push replaces the queue by a hull.
    model(|| {
        let sim = Sim::new(1);
        let done = Arc::new(AtomicUsize::new(0));
        let hooks: Vec<_> = [3u64, 9]
            .into_iter()
            .map(|page| {
                let (sim, done) = (sim.clone(), done.clone());
                thread::spawn(move || {
                    sim.hook(page);
                    done.fetch_add(1, Ordering::Release);
                })
            })
            .collect();
        if done.load(Ordering::Acquire) == 2 {
            let seen = sim.lookup();
            assert!(covered(&seen, 3) && covered(&seen, 9), "{seen:?}");
        }
        for h in hooks {
            h.join().unwrap();
        }
        let seen = sim.lookup();
        assert!(covered(&seen, 3) && covered(&seen, 9), "{seen:?}");
        assert!(sim.queue.len() <= 1);
    });
}

// ---------------------------------------------------------------------------
// 3. The sequence retry: register vs invalidate

/// A registrar over one page whose frames have a generation (a loom atomic):
/// the handle records the generation it pinned.
#[derive(Default)]
struct GenReg {
    gen: AtomicU64,
    live: std::sync::atomic::AtomicI64,
}

impl Registrar for GenReg {
    type Handle = u64;
    fn register(&self, _range: Range, _access: Access) -> Result<u64, RegistrarError> {
        self.live.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(self.gen.load(Ordering::SeqCst))
    }
    fn deregister(&self, _h: u64) -> Result<(), RegistrarError> {
        self.live.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
    fn keys(&self, h: &u64) -> Keys {
        Keys { lkey: *h as u32, rkey: *h as u32 }
    }
    fn name(&self) -> &'static str {
        "gen"
    }
}

fn sequence_retry(config: CacheConfig) {
    model(move || {
        let cache = Arc::new(Cache::new(GenReg::default(), config));
        let releaser = {
            let cache = cache.clone();
            thread::spawn(move || {
                // The frames change, then the hook runs (S1.8).
                cache.registrar().gen.fetch_add(1, Ordering::SeqCst);
                cache.invalidate(0, P, ReleaseKind::Munmap).unwrap();
            })
        };
        // Concurrent with the event: either order is allowed for this one.
        match cache.acquire(0, P, RR) {
            Ok(l) => drop(l),
            Err(e) => assert_eq!(e.code(), "E6"),
        }
        releaser.join().unwrap();
        // The event happened before this acquire began: it must be fresh (P2).
        let now = cache.registrar().gen.load(Ordering::SeqCst);
        let l = cache.acquire(0, P, RR).unwrap();
        assert_eq!(*l.handle(), now, "stale registration returned (hit: {})", l.hit());
        drop(l);
        cache.flush();
        assert_eq!(cache.registrar().live.load(std::sync::atomic::Ordering::SeqCst), 0);
    });
}

#[test]
fn stale_in_flight_registration_is_never_cached() {
    sequence_retry(CacheConfig::explicit());
}

#[test]
fn stale_in_flight_registration_is_never_cached_merge() {
    sequence_retry(CacheConfig::explicit_with(mrcache::Config::with_policy(mrcache::OverlapPolicy::Merge)));
}

/// The mutant that skips A7 is caught: loom finds the interleaving in which
/// the registration pinned the old frames and is cached anyway.
#[cfg(loom)]
#[test]
#[should_panic(expected = "stale registration returned")]
fn loom_catches_skip_seq_recheck() {
    let mut config = CacheConfig::explicit();
    config.faults.skip_seq_recheck = true;
    sequence_retry(config);
}

// ---------------------------------------------------------------------------
// 4. Lanes against revokes

/// Miss, A1 hit (memoizes): this thread's next acquire of the range is a lane hit.
fn warm_lane(cache: &Cache<CountingRegistrar>) -> mrcache::types::RegView {
    let view = cache.acquire(0, P, RR).unwrap().view();
    drop(cache.acquire(0, P, RR).unwrap());
    view
}

fn all_deregistered_once(cache: &Cache<CountingRegistrar>) {
    cache.flush();
    let r = cache.registrar();
    assert_eq!(r.live(), 0);
    assert_eq!(r.registered.load(std::sync::atomic::Ordering::SeqCst), r.deregistered.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(cache.diagnostics().pinned_slots, 0, "every pin returned");
}

#[test]
fn lane_hit_vs_invalidation() {
    model(|| {
        let cache = Arc::new(Cache::new(CountingRegistrar::default(), CacheConfig::explicit()));
        let view = warm_lane(&cache);
        let invalidator = {
            let cache = cache.clone();
            thread::spawn(move || cache.invalidate(0, P, ReleaseKind::Munmap).unwrap())
        };
        let lane_hits = cache.diagnostics().lane_hits;
        let l = cache.acquire(0, P, RR).unwrap();
        if cache.diagnostics().lane_hits > lane_hits {
            // LN1 won: the revoke pinned the slot, so nothing is deregistered yet.
            assert!(l.hit());
            assert_eq!(cache.registrar().deregistered.load(std::sync::atomic::Ordering::SeqCst), 0, "P3");
            assert_eq!(l.view(), view);
        }
        drop(l);
        invalidator.join().unwrap();
        all_deregistered_once(&cache);
    });
}

#[test]
fn lane_release_on_another_thread_vs_invalidation() {
    model(|| {
        let cache = Arc::new(Cache::new(CountingRegistrar::default(), CacheConfig::explicit()));
        warm_lane(&cache);
        let l = cache.acquire(0, P, RR).unwrap();
        assert_eq!(cache.diagnostics().lane_hits, 1);
        // SAFETY: the lease borrows the cache `cache` points to, which this
        // thread keeps alive until after the join.
        let l: mrcache::Lease<'static, CountingRegistrar> = unsafe { std::mem::transmute(l) };
        let releaser = thread::spawn(move || drop(l));
        cache.invalidate(0, P, ReleaseKind::Munmap).unwrap();
        releaser.join().unwrap();
        all_deregistered_once(&cache);
    });
}

/// A lane hit on A against another thread's miss on B over `max_regions` 1,
/// whose note (A6) revokes A's slot before it reads A's lease count: either
/// the lane hit came first (the revoke pins it, the note sees A leased and
/// A stays cached under the lease) or the note did (the lane hit finds its
/// slot revoked and takes A1, behind the lock). A lane lease never goes
/// unseen: A is never evicted while this thread holds it on its lane.
fn lane_hit_vs_evicting_note(config: CacheConfig) {
    model(move || {
        let mut config = config;
        config.contract.limits.max_regions = Some(1);
        let cache = Arc::new(Cache::new(CountingRegistrar::default(), config));
        warm_lane(&cache);
        let evictor = {
            let cache = cache.clone();
            thread::spawn(move || drop(cache.acquire(16 * P, P, RR).unwrap()))
        };
        let l = cache.acquire(0, P, RR).unwrap();
        evictor.join().unwrap();
        // Read after the join (the evictor's lane is then fully made): its
        // miss is no lane hit, so a lane hit counted is this thread's.
        if cache.diagnostics().lane_hits == 1 {
            assert!(cache.acquire(0, P, RR).unwrap().hit(), "an entry leased on a lane was evicted");
        }
        drop(l);
        all_deregistered_once(&cache);
    });
}

#[test]
fn lane_hit_vs_an_evicting_note() {
    lane_hit_vs_evicting_note(CacheConfig::explicit());
}

/// The note without its revoke (the checker's `note-skips-revoke`) is
/// caught: loom finds the lane hit the note does not see.
#[cfg(loom)]
#[test]
#[should_panic(expected = "an entry leased on a lane was evicted")]
fn loom_catches_a_note_that_skips_the_revoke() {
    let mut config = CacheConfig::explicit();
    config.faults.note_skips_revoke = true;
    lane_hit_vs_evicting_note(config);
}

/// A release of the only other entry against a miss over `max_regions` 1
/// whose first note sees it leased (so the note falls short): either A6's
/// second note (after the flag is raised) sees the release and A10 evicts,
/// or the release sees the flag and runs R2. Either way, once both are
/// done, the cache is within its limit but for leased entries (P5): the
/// flag is raised only when a note falls short (spec.md#A6).
fn release_vs_second_pass(config: CacheConfig) {
    model(move || {
        let mut config = config;
        config.contract.limits.max_regions = Some(1);
        let cache = Arc::new(Cache::new(CountingRegistrar::default(), config));
        let held = cache.acquire(0, P, RR).unwrap();
        // SAFETY: the lease borrows the cache `cache` points to, which this
        // thread keeps alive until after the join.
        let held: mrcache::Lease<'static, CountingRegistrar> = unsafe { std::mem::transmute(held) };
        let releaser = thread::spawn(move || drop(held));
        // Kept: its own release would run R2 and hide a missed eviction.
        let b = cache.acquire(16 * P, P, RR).unwrap();
        releaser.join().unwrap();
        let st = cache.stats();
        assert!(st.cached_entries <= 1, "over the limit with an unleased entry (P5): {st:?}");
        drop(b);
        all_deregistered_once(&cache);
    });
}

#[test]
fn a_release_against_the_second_pass_keeps_the_limit() {
    release_vs_second_pass(CacheConfig::explicit());
}

/// The flag only at A10, without A6's second note (the checker's
/// `over-limit-flag-late`) is caught: loom finds the release the first note
/// saw leased and that read the flag before it was raised.
#[cfg(loom)]
#[test]
#[should_panic(expected = "over the limit with an unleased entry")]
fn loom_catches_the_flag_without_the_second_note() {
    let mut config = CacheConfig::explicit();
    config.faults.over_limit_flag_late = true;
    release_vs_second_pass(config);
}

// ---------------------------------------------------------------------------
// 5. Release windows: a hook before the release, as the W1/W2 pair

//= spec.md#W1
//= spec.md#W2
//= spec.md#W3
fn release_window(config: CacheConfig) {
    model(move || {
        let cache = Arc::new(Cache::new(GenReg::default(), config));
        let releaser = {
            let cache = cache.clone();
            thread::spawn(move || {
                cache.release_begin(0, P).unwrap();
                // The release: the frames change between begin and end.
                cache.registrar().gen.fetch_add(1, Ordering::SeqCst);
                cache.release_end(0, P).unwrap();
            })
        };
        // Concurrent with the release: either frames may serve this one.
        match cache.acquire(0, P, RR) {
            Ok(l) => drop(l),
            Err(e) => assert_eq!(e.code(), "E6"),
        }
        releaser.join().unwrap();
        assert_eq!(cache.open_release_windows(), 0);
        // The release completed before this acquire began: fresh (P2).
        let now = cache.registrar().gen.load(Ordering::SeqCst);
        let l = cache.acquire(0, P, RR).unwrap();
        assert_eq!(*l.handle(), now, "stale registration returned (hit: {})", l.hit());
        drop(l);
        cache.flush();
        assert_eq!(cache.registrar().live.load(std::sync::atomic::Ordering::SeqCst), 0);
    });
}

#[test]
fn release_window_never_caches_the_old_frames() {
    release_window(CacheConfig::explicit());
}

#[test]
fn release_window_never_caches_the_old_frames_merge() {
    release_window(CacheConfig::explicit_with(mrcache::Config::with_policy(mrcache::OverlapPolicy::Merge)));
}

// ---------------------------------------------------------------------------
// 6. The hit memo against a removal

/// Lanes off, so A1's repeated hits go through the hit memo: one thread
/// hits (the memo answers, or the index and then the memo is written) while
/// another invalidates the entry, which a lease keeps alive. Once the
/// invalidation returned, the memo must not answer with the removed entry
/// (its version moved), and every registration is deregistered once.
#[test]
fn memo_hit_vs_invalidation() {
    model(|| {
        let config = CacheConfig { lanes: false, ..CacheConfig::explicit() };
        let cache = Arc::new(Cache::new(CountingRegistrar::default(), config));
        // Held throughout: the removed entry stays alive, so a stale memo
        // answer would be a live entry the assertion below sees, not a use
        // after free.
        let held = cache.acquire(0, P, RR).unwrap();
        let old = held.view();
        // An A1 hit: memoizes the entry.
        assert!(cache.acquire(0, P, RR).unwrap().hit());
        let invalidator = {
            let cache = cache.clone();
            thread::spawn(move || cache.invalidate(0, P, ReleaseKind::Munmap).unwrap())
        };
        drop(cache.acquire(0, P, RR).unwrap());
        invalidator.join().unwrap();
        let after = cache.acquire(0, P, RR).unwrap().view();
        assert_ne!(after.id, old.id, "the memo answered with a removed entry");
        drop(held);
        all_deregistered_once(&cache);
    });
}

// ---------------------------------------------------------------------------
// 7. A0 against a removal and the reuse of the entry's memory

//= spec.md#A0 type=test
/// Lanes off and no limits, so the repeated acquire of A is A0's (the memo
/// names A after an A1 hit). Another thread invalidates A and makes B, a
/// miss whose entry may take A's memory (blocks of two under loom, and the
/// pool reuses freed memory first): A0's read of the memo, its look at the
/// state word and the key, and its compare-exchange interleave with A's
/// INVALID, its free and B's reincarnation store.
#[test]
fn lockless_hit_vs_removal_and_reuse() {
    model(|| {
        let config = CacheConfig { lanes: false, ..CacheConfig::explicit() };
        let cache = Arc::new(Cache::new(CountingRegistrar::default(), config));
        let a = cache.acquire(0, P, RR).unwrap().view();
        // An A1 hit: the memo now names A.
        assert!(cache.acquire(0, P, RR).unwrap().hit());
        let other = {
            let cache = cache.clone();
            thread::spawn(move || {
                cache.invalidate(0, P, ReleaseKind::Munmap).unwrap();
                cache.acquire(8 * P, P, RR).unwrap().view()
            })
        };
        let got = cache.acquire(0, P, RR).unwrap();
        let v = got.view();
        assert_eq!((v.addr, v.len), (0, P), "A0 answered with an entry of another key");
        drop(got);
        let b = other.join().unwrap();
        assert_ne!(v.id, b.id);
        let after = cache.acquire(0, P, RR).unwrap().view();
        assert_ne!(after.id, a.id, "a removed entry answered after its removal returned");
        all_deregistered_once(&cache);
    });
}

//= spec.md#A5 type=test
//= spec.md#S2.8 type=test
/// A0 against the trim (S2.8; without limits the trim is the one step that
/// reads lease counts, and A0 leases under its lock): a lease taken while
/// the trim runs keeps its entry, so while it is held the next acquire of
/// the same key hits the same registration. A trim that read the count and
/// then ORed INVALID took a lease A0 took in between out of the index.
#[test]
fn lockless_hit_vs_trim() {
    model(|| {
        let config = CacheConfig { lanes: false, ..CacheConfig::explicit() };
        let cache = Arc::new(Cache::new(CountingRegistrar::default(), config));
        drop(cache.acquire(0, P, RR).unwrap());
        // An A1 hit: the memo now names the entry, for A0.
        assert!(cache.acquire(0, P, RR).unwrap().hit());
        let trimmer = {
            let cache = cache.clone();
            thread::spawn(move || cache.trim())
        };
        let held = cache.acquire(0, P, RR).unwrap();
        trimmer.join().unwrap();
        let again = cache.acquire(0, P, RR).unwrap();
        assert_eq!(again.view().id, held.view().id, "the trim took a leased entry out");
        drop((held, again));
        all_deregistered_once(&cache);
    });
}

//= spec.md#A0 type=test
//= spec.md#A9 type=test
/// A0 against an entry A9 makes and at once takes out (PENDING): the memo
/// names A's memory; A is invalidated (its memory freed, first in the
/// pool's free list) and a release window on A's pages opens; another
/// thread's miss on A, inside the window, gets that memory for its entry,
/// which A9 inserts and takes out at once (W3: served, never cached). A0's
/// look at the memory may fall between the insert and the removal: the
/// entry has A's key and no INVALID yet, and only PENDING keeps A0 from
/// handing another thread that registration, planned inside the window.
#[test]
fn lockless_hit_vs_an_entry_never_published() {
    model(|| {
        let config = CacheConfig { lanes: false, ..CacheConfig::explicit() };
        let cache = Arc::new(Cache::new(CountingRegistrar::default(), config));
        drop(cache.acquire(0, P, RR).unwrap());
        // An A1 hit: the memo now names A's memory.
        assert!(cache.acquire(0, P, RR).unwrap().hit());
        cache.invalidate(0, P, ReleaseKind::Munmap).unwrap();
        cache.release_begin(0, P).unwrap();
        let windowed = {
            let cache = cache.clone();
            thread::spawn(move || cache.acquire(0, P, RR).unwrap().view().id)
        };
        let mine = cache.acquire(0, P, RR).unwrap().view().id;
        let theirs = windowed.join().unwrap();
        assert_ne!(mine, theirs, "A0 handed out a registration made inside a release window");
        cache.release_end(0, P).unwrap();
        all_deregistered_once(&cache);
    });
}

//= spec.md#A0 type=test
/// A0's draining check: a thread's miss on B holds the lock exclusive and
/// drains (it takes the queued events, then applies them); another thread
/// unmaps A (its hook queues the event and, the lock busy, returns), then
/// acquires A. The event may be off the queue and not applied yet: only the
/// draining count keeps A0 from handing out A after its unmap returned.
/// (Four preemptions: with the bound of the other models, 2, or 3, loom
/// does not reach the window, and the model passes without the check.)
#[test]
fn lockless_hit_vs_a_drain_in_progress() {
    model_with_preemptions(4, || {
        let config = CacheConfig { lanes: false, ..CacheConfig::explicit() };
        let cache = Arc::new(Cache::new(CountingRegistrar::default(), config));
        let a = cache.acquire(0, P, RR).unwrap().view().id;
        // An A1 hit: the memo now names A.
        assert!(cache.acquire(0, P, RR).unwrap().hit());
        let miss = {
            let cache = cache.clone();
            thread::spawn(move || drop(cache.acquire(8 * P, P, RR).unwrap()))
        };
        cache.invalidate(0, P, ReleaseKind::Munmap).unwrap();
        let again = cache.acquire(0, P, RR).unwrap().view().id;
        assert_ne!(again, a, "A0 handed out an entry whose unmap had returned");
        miss.join().unwrap();
        all_deregistered_once(&cache);
    });
}

// ---------------------------------------------------------------------------
// 8. The hit counters' slots (spec.md#S8)

/// The counters' model: loom's threads share one OS thread and so one real
/// thread token, so each thread here is given one (`bump_each_as`).
#[cfg(loom)]
mod counters {
    use super::*;
    use mrcache::cache::hot_counters::{CounterMutant, Hot, HotCounters, TOKEN_SLOTS};
    use mrcache::thread_token::bucket;

    /// Two tokens, aligned as thread control blocks are, that hash to the
    /// same slot.
    fn two_tokens_of_one_slot() -> (usize, usize) {
        let a = 1 << 12;
        let slot = bucket(a, TOKEN_SLOTS);
        let b = (2usize..).map(|i| i << 12).find(|&t| bucket(t, TOKEN_SLOTS) == slot).expect("a second token");
        (a, b)
    }

    /// Threads `a` and `b` run at once with tokens of one slot: one owns it
    /// (plain load + store bumps), the other takes the overflow
    /// (`fetch_add`). The main thread sums meanwhile: its snapshots never go
    /// down and never exceed the bumps made. Then `a` exits and a thread
    /// with its token (the token reused, as a thread control block is)
    /// inherits `a`'s slot or overflow. Once all are joined the sum is
    /// exact: no bump lost.
    pub(super) fn two_tokens_one_slot_and_an_heir(mutant: Option<CounterMutant>) {
        model(move || {
            let (a, b) = two_tokens_of_one_slot();
            let c = Arc::new(match mutant {
                Some(m) => HotCounters::<AtomicU64>::with_mutant(TOKEN_SLOTS, m),
                None => HotCounters::<AtomicU64>::with_slots(TOKEN_SLOTS),
            });
            let first = {
                let c = c.clone();
                thread::spawn(move || {
                    c.bump_each_as(a, &[Hot::Acquires]);
                    c.bump_each_as(a, &[Hot::Acquires]);
                })
            };
            let other = {
                let c = c.clone();
                thread::spawn(move || c.bump_each_as(b, &[Hot::Acquires]))
            };
            let s1 = c.sum(Hot::Acquires);
            let s2 = c.sum(Hot::Acquires);
            assert!(s1 <= s2 && s2 <= 3, "snapshots {s1} then {s2} of 3 bumps");
            first.join().unwrap();
            let heir = {
                let c = c.clone();
                thread::spawn(move || c.bump_each_as(a, &[Hot::Acquires]))
            };
            other.join().unwrap();
            heir.join().unwrap();
            assert_eq!(c.sum(Hot::Acquires), 4, "a count lost");
        });
    }

    #[test]
    fn counters_two_tokens_one_slot_and_an_heir() {
        two_tokens_one_slot_and_an_heir(None);
    }

    /// Loom finds both threads past the slot's free owner, both owning it,
    /// and one plain bump overwriting the other's.
    #[test]
    #[should_panic(expected = "a count lost")]
    fn catches_counter_claim_without_cas() {
        two_tokens_one_slot_and_an_heir(Some(CounterMutant::ClaimWithoutCas));
    }

    /// The names are those of `mrcache_types::mutants::LOOM_MUTANTS`.
    #[test]
    fn counter_mutants_are_listed() {
        for m in CounterMutant::ALL {
            assert!(mrcache::types::mutants::LOOM_MUTANTS.contains(&m.name()), "{}", m.name());
        }
    }
}
