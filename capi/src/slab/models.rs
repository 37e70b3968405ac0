//! Loom models of the lease slab (`RUSTFLAGS="--cfg loom"`, ci/full.sh's
//! `loom` step); without `--cfg loom` each model runs once on real threads,
//! as a plain test.
//!
//! 1. the free list (`free_list_pop_against_pop_pop_push`): a pop preempted
//!    between reading the top's link and its compare-exchange, while another
//!    thread pops that top and the next slot and pushes the top back (ABA):
//!    no slot is handed out while another thread holds it;
//! 2. a read racing a release and a reuse (`read_and_release_race_a_reuse`):
//!    a handle's read returns that handle's lease or `INVALID_LEASE`, never
//!    another lease's keys or view; of two releases of one handle exactly
//!    one releases, and a stale handle never releases the slot's next lease;
//! 3. the per-thread lists across a thread's exit
//!    (`local_list_inherited_across_exit`): a thread releases its leases into
//!    its bucket's list and exits; the thread that inherits the bucket takes
//!    those slots (no fresh slot: nothing strands in an exited thread's
//!    list) while a third thread uses the exited thread's stale handles and
//!    the shared list: the stale handles stay dead.
//!
//! 4. cache ids (`cache_ids_of_caches_made_at_once`): two caches made at
//!    once take their ids from one word (`take_cache_id`, the code
//!    `mrcache_create` runs, on a loom word instead of its `static`): the
//!    ids differ, and so do the tags of their slabs' handles, so a handle
//!    of one cache is refused by the other;
//! 5. thread buckets (`bucket_claimed_by_one_of_two_threads`): two running
//!    threads whose tokens hash to one bucket (`ThreadBuckets::mine_as`,
//!    each given its token) claim it at once: exactly one owns it, finds
//!    itself inside its callback while its depth mark says so (the
//!    registrar's re-entry check, `MRCACHE_BUSY`) and idle after, and the
//!    other has no bucket and is never found inside; a later thread with
//!    the owner's token inherits the bucket at depth 0.
//!
//! Every model takes the mutant to run with; `catches_slab_*` show each
//! [`SlabMutant`] caught by the model named for it (the races only under
//! loom; the two that break a model without any race also as plain tests).
//!
//! A model's lease is a [`Token`]: its keys and view are functions of its
//! number, and its drop is counted, so a lease released twice, or never, or
//! another lease returned for a handle, shows.

use super::{mrcache_lease_t, Held, LeaseSlab, SlabMutant};
use crate::sync::LoomMutant;
use crate::take_cache_id;
use crate::thread_token::bucket;
use crate::threads::{Mine, ThreadBucket, ThreadBuckets, BUCKETS, MAX_DEPTH};
use mrcache_impl::registrar::Keys;
use mrcache_impl::sync::{model, thread, Arc};
use mrcache_types::{Access, RegView};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// A stand-in lease: lease `n`, whose drop counts in `drops[n]`.
struct Token {
    n: u32,
    drops: std::sync::Arc<[AtomicUsize; 8]>,
}

fn keys_of(n: u32) -> Keys {
    Keys { lkey: n, rkey: 1000 + n }
}

fn view_of(n: u32) -> RegView {
    RegView { id: u64::from(n), addr: u64::from(n) << 12, len: 4096, access: Access::LOCAL_WRITE }
}

impl Held for Token {
    fn keys(&self) -> Keys {
        keys_of(self.n)
    }
    fn view(&self) -> RegView {
        view_of(self.n)
    }
}

impl Drop for Token {
    fn drop(&mut self) {
        self.drops[self.n as usize].fetch_add(1, Ordering::SeqCst);
    }
}

/// Drop counts of leases 0..8 (plain atomics: an oracle, not modelled).
fn drops() -> std::sync::Arc<[AtomicUsize; 8]> {
    std::sync::Arc::new(std::array::from_fn(|_| AtomicUsize::new(0)))
}

fn token(n: u32, drops: &std::sync::Arc<[AtomicUsize; 8]>) -> Token {
    Token { n, drops: drops.clone() }
}

fn slab(mutant: Option<SlabMutant>) -> LeaseSlab<Token> {
    match mutant {
        Some(m) => LeaseSlab::with_mutant(7, m),
        None => LeaseSlab::new(7),
    }
}

/// The read oracle: a read of lease `n`'s handle is that lease or invalid.
fn check_read(slab: &LeaseSlab<Token>, h: mrcache_lease_t, n: u32) {
    if let Ok((keys, view)) = slab.read(h) {
        assert!(keys == keys_of(n) && view == view_of(n), "a read of lease {n}'s handle returned {keys:?} {view}");
    }
}

/// Inserts `t` (a model never runs out of slots).
fn put(slab: &LeaseSlab<Token>, mine: Option<&ThreadBucket>, t: Token) -> mrcache_lease_t {
    match slab.insert(mine, t) {
        Ok(h) => h,
        Err(_) => panic!("no slot for a lease"),
    }
}

/// A thread's result; its panic, as it was, if it panicked (a plain run's
/// `unwrap` would hide the message that names what broke).
fn joined<T>(t: thread::JoinHandle<T>) -> T {
    t.join().unwrap_or_else(|e| std::panic::resume_unwind(e))
}

// ---------------------------------------------------------------------------
// 1. The free list: ABA on the tag

/// Pops a slot and marks it held: a slot handed out while held panics.
fn take(slab: &LeaseSlab<Token>, held: &[AtomicBool; 3]) -> Option<u32> {
    let i = slab.pop_free()?;
    assert!(!held[i as usize].swap(true, Ordering::SeqCst), "slot {i} handed out while another thread holds it");
    Some(i)
}

fn give_back(slab: &LeaseSlab<Token>, held: &[AtomicBool; 3], i: u32) {
    held[i as usize].store(false, Ordering::SeqCst);
    slab.push_free(i, slab.slot(i).expect("a made slot"));
}

pub(super) fn free_list_pop_against_pop_pop_push(mutant: Option<SlabMutant>) {
    model(move || {
        let slab = Arc::new(slab(mutant));
        let held = std::sync::Arc::new([AtomicBool::new(false), AtomicBool::new(false), AtomicBool::new(false)]);
        // Three slots (two chunks) on the free list: 0 on top, then 1, 2.
        for _ in 0..3 {
            assert!(slab.fresh_slot().is_ok());
        }
        for i in [2, 1, 0] {
            slab.push_free(i, slab.slot(i).unwrap());
        }
        let single = {
            let (slab, held) = (slab.clone(), held.clone());
            thread::spawn(move || take(&slab, &held))
        };
        let aba = {
            let (slab, held) = (slab.clone(), held.clone());
            thread::spawn(move || {
                let a = take(&slab, &held).unwrap();
                let b = take(&slab, &held);
                give_back(&slab, &held, a);
                b
            })
        };
        let one = joined(single);
        let b = joined(aba);
        // The rest of the list: every slot not held, each once.
        let mut rest = Vec::new();
        while let Some(i) = take(&slab, &held) {
            rest.push(i);
        }
        assert_eq!(one.iter().chain(&b).count() + rest.len(), 3, "a slot lost from the free list");
    });
}

#[test]
fn free_list_pop_against_a_pop_pop_push() {
    free_list_pop_against_pop_pop_push(None);
}

// ---------------------------------------------------------------------------
// 2. A read and a second release racing a release and a reuse

pub(super) fn read_and_release_race_a_reuse(mutant: Option<SlabMutant>) {
    model(move || {
        let drops = drops();
        let slab = Arc::new(slab(mutant));
        let h1 = put(&slab, None, token(1, &drops));
        let reader = {
            let slab = slab.clone();
            thread::spawn(move || {
                check_read(&slab, h1, 1);
                slab.release(None, h1)
            })
        };
        let reuser = {
            let (slab, drops) = (slab.clone(), drops.clone());
            thread::spawn(move || {
                let released = slab.release(None, h1);
                let h2 = put(&slab, None, token(2, &drops));
                check_read(&slab, h2, 2);
                (released, h2)
            })
        };
        let by_reader = joined(reader);
        let (by_reuser, h2) = joined(reuser);
        assert!(by_reader != by_reuser, "two releases of one handle: {by_reader} and {by_reuser}");
        assert_eq!(drops[1].load(Ordering::SeqCst), 1, "lease 1 released once");
        assert_eq!(drops[2].load(Ordering::SeqCst), 0, "a stale handle released the slot's next lease");
        assert!(slab.read(h1).is_err(), "a released handle reads");
        assert!(!slab.release(None, h1), "a released handle releases again");
        check_read(&slab, h2, 2);
        assert!(slab.read(h2).is_ok(), "a held lease does not read");
        assert!(slab.release(None, h2));
        assert_eq!(drops[2].load(Ordering::SeqCst), 1);
        assert_eq!(slab.held(), 0);
    });
}

#[test]
fn read_and_release_race_a_release_and_reuse() {
    read_and_release_race_a_reuse(None);
}

// ---------------------------------------------------------------------------
// 3. The per-thread lists across a thread's exit

pub(super) fn local_list_inherited_across_exit(mutant: Option<SlabMutant>) {
    model(move || {
        let drops = drops();
        let slab = Arc::new(slab(mutant));
        let bucket = Arc::new(ThreadBucket::new());
        // The first owner of the bucket: two leases, released into its list.
        let first = {
            let (slab, bucket, drops) = (slab.clone(), bucket.clone(), drops.clone());
            thread::spawn(move || {
                let h1 = put(&slab, Some(&bucket), token(1, &drops));
                let h2 = put(&slab, Some(&bucket), token(2, &drops));
                assert!(slab.release(Some(&bucket), h1));
                assert!(slab.release(Some(&bucket), h2));
                (h1, h2)
            })
        };
        // It exits; a later thread with its token inherits the bucket.
        let (h1, h2) = joined(first);
        let heir = {
            let (slab, bucket, drops) = (slab.clone(), bucket.clone(), drops.clone());
            thread::spawn(move || {
                let h3 = put(&slab, Some(&bucket), token(3, &drops));
                let h4 = put(&slab, Some(&bucket), token(4, &drops));
                check_read(&slab, h3, 3);
                (h3, h4)
            })
        };
        // Another thread, on the shared paths, with the exited thread's handles.
        let other = {
            let (slab, drops) = (slab.clone(), drops.clone());
            thread::spawn(move || {
                check_read(&slab, h1, 1);
                assert!(!slab.release(None, h2), "an exited thread's released handle releases again");
                put(&slab, None, token(5, &drops))
            })
        };
        let (h3, h4) = joined(heir);
        let h5 = joined(other);
        assert_eq!(slab.slots_made(), 3, "the heir did not reuse the exited thread's free slots");
        for (h, n) in [(h3, 3), (h4, 4), (h5, 5)] {
            check_read(&slab, h, n);
            assert!(slab.read(h).is_ok(), "lease {n} does not read");
        }
        assert!(slab.read(h1).is_err() && slab.read(h2).is_err(), "a stale handle reads");
        for (n, d) in drops.iter().enumerate().take(6).skip(1) {
            assert_eq!(d.load(Ordering::SeqCst), usize::from(n <= 2), "lease {n}'s drops");
        }
        for h in [h3, h4, h5] {
            assert!(slab.release(None, h));
        }
        assert_eq!(slab.held(), 0);
    });
}

#[test]
fn local_list_inherited_across_a_thread_exit() {
    local_list_inherited_across_exit(None);
}

// ---------------------------------------------------------------------------
// 4. Cache ids, the source of the handles' tags

pub(super) fn cache_ids_of_caches_made_at_once(mutant: Option<LoomMutant>) {
    model(move || {
        let drops = drops();
        // The library's `NEXT_CACHE_ID`, as a word loom explores.
        let next = Arc::new(crate::sync::AtomicU64::new(1));
        let create = |n: u32| {
            let (next, drops) = (next.clone(), drops.clone());
            thread::spawn(move || {
                let id = take_cache_id(&*next, mutant);
                let slab = LeaseSlab::new(id);
                let h = put(&slab, None, token(n, &drops));
                (id, slab, h)
            })
        };
        let (a, b) = (create(1), create(2));
        let (id_a, slab_a, h_a) = joined(a);
        let (id_b, slab_b, h_b) = joined(b);
        assert_ne!(id_a, id_b, "two caches made at once got one id");
        assert!(slab_b.read(h_a).is_err() && slab_a.read(h_b).is_err(), "a handle of one cache reads in the other");
        assert!(!slab_b.release(None, h_a), "a handle of one cache releases in the other");
        assert!(slab_a.release(None, h_a) && slab_b.release(None, h_b));
        assert_eq!(take_cache_id(&*next, None), 3, "an id lost");
    });
}

#[test]
fn cache_ids_of_two_caches_made_at_once() {
    cache_ids_of_caches_made_at_once(None);
}

// ---------------------------------------------------------------------------
// 5. Thread buckets: the claim and the callback-depth mark

fn buckets(mutant: Option<LoomMutant>) -> ThreadBuckets {
    #[cfg(loom)]
    if let Some(m) = mutant {
        return ThreadBuckets::with_mutant(m);
    }
    assert!(mutant.is_none(), "the buckets' mutants are loom builds' only");
    ThreadBuckets::new()
}

/// Two tokens, aligned as thread control blocks are (so their low six
/// bits, the depth's, are clear), that hash to the same bucket.
fn two_tokens_of_one_bucket() -> (usize, usize) {
    let a = 1 << 12;
    let b = (2usize..).map(|i| i << 12).find(|&t| bucket(t, BUCKETS) == bucket(a, BUCKETS)).expect("a second token");
    assert!(a & MAX_DEPTH == 0 && b & MAX_DEPTH == 0);
    (a, b)
}

/// The thread with token `me`: claims its bucket or finds none; if it
/// owns it, enters a callback, is found inside, leaves, is found idle.
/// Whether it owned the bucket.
fn claim_and_enter(buckets: &ThreadBuckets, me: usize) -> bool {
    match buckets.mine_as(me) {
        Mine::Idle(b) => {
            assert_eq!(b.depth(), 0, "a claimed bucket is at depth {}", b.depth());
            b.enter_callback();
            assert!(matches!(buckets.mine_as(me), Mine::InCallback(_)), "the owner inside its callback is not found inside");
            b.leave_callback();
            assert!(matches!(buckets.mine_as(me), Mine::Idle(_)), "the owner out of its callback is not idle");
            true
        }
        Mine::InCallback(_) => panic!("a thread found inside a callback it never entered"),
        Mine::None => {
            assert!(matches!(buckets.mine_as(me), Mine::None), "a thread without a bucket found one");
            false
        }
    }
}

pub(super) fn bucket_claimed_by_one_of_two(mutant: Option<LoomMutant>) {
    model(move || {
        let buckets = Arc::new(buckets(mutant));
        let (a, b) = two_tokens_of_one_bucket();
        let spawn = |me: usize| {
            let buckets = buckets.clone();
            thread::spawn(move || claim_and_enter(&buckets, me))
        };
        let (ta, tb) = (spawn(a), spawn(b));
        let (owns_a, owns_b) = (joined(ta), joined(tb));
        assert!(!(owns_a && owns_b), "two threads own one bucket");
        assert!(owns_a || owns_b, "neither thread owns the free bucket");
        // The owner exited: a thread with its token inherits the bucket.
        let owner = if owns_a { a } else { b };
        let heir = {
            let buckets = buckets.clone();
            thread::spawn(move || matches!(buckets.mine_as(owner), Mine::Idle(b) if b.depth() == 0))
        };
        assert!(joined(heir), "the owner's token does not find its bucket idle after the owner exited");
    });
}

#[test]
fn bucket_claimed_by_one_of_two_threads() {
    bucket_claimed_by_one_of_two(None);
}

// ---------------------------------------------------------------------------
// The mutants, each caught by its model

/// Runs `model` with mutant `m` and requires it to fail with one of
/// `expected` (a model failing for another reason proves nothing).
fn caught(m: SlabMutant, model: fn(Option<SlabMutant>), expected: &[&str]) {
    fails_with(m.name(), || model(Some(m)), expected);
}

/// Requires `run` (mutant `name`'s model) to panic with one of `expected`.
fn fails_with(name: &str, run: impl FnOnce() + std::panic::UnwindSafe, expected: &[&str]) {
    let err = std::panic::catch_unwind(run).expect_err(name);
    let msg = err.downcast_ref::<String>().map(String::as_str).or_else(|| err.downcast_ref::<&str>().copied()).unwrap_or("");
    assert!(expected.iter().any(|e| msg.contains(e)), "mutant {name} failed otherwise: {msg}");
}

/// Loom finds the pop preempted across the other thread's pop, pop, push.
#[cfg(loom)]
#[test]
fn catches_slab_tag_not_incremented() {
    caught(SlabMutant::TagNotIncremented, free_list_pop_against_pop_pop_push, &["handed out while another thread holds it"]);
}

/// Loom finds the read preempted after its first state load while the
/// slot is released and reused.
#[cfg(loom)]
#[test]
fn catches_slab_no_seqlock_recheck() {
    caught(SlabMutant::NoSeqlockRecheck, read_and_release_race_a_reuse, &["a read of lease 1's handle returned"]);
}

/// Caught in every interleaving: the stale handle's release after the
/// reuse releases lease 2.
#[test]
fn catches_slab_no_generation_check() {
    caught(
        SlabMutant::NoGenerationCheck,
        read_and_release_race_a_reuse,
        &["a stale handle released", "two releases of one handle", "a read of lease", "a released handle"],
    );
}

/// Caught in every interleaving: the heir takes a slot whose state is past
/// the generation the list kept (the slab's own debug check), or revives
/// the exited thread's handle.
#[test]
fn catches_slab_local_list_keeps_generation() {
    caught(
        SlabMutant::LocalListKeepsGeneration,
        local_list_inherited_across_exit,
        &["a free slot's state", "an exited thread's released handle", "a stale handle reads", "a read of lease"],
    );
}

/// The names are those of `mrcache_types::mutants::SLAB_MUTANTS`, in order.
#[test]
fn mutant_names_are_listed() {
    let names: Vec<&str> = SlabMutant::ALL.iter().map(|m| m.name()).collect();
    assert_eq!(names, mrcache_types::mutants::SLAB_MUTANTS);
}

/// Runs `model` with mutant `m` and requires it to fail with one of
/// `expected`.
#[cfg(loom)]
fn caught_loom(m: LoomMutant, model: fn(Option<LoomMutant>), expected: &[&str]) {
    fails_with(m.name(), || model(Some(m)), expected);
}

/// Loom finds both creations past the load before either stores.
#[cfg(loom)]
#[test]
fn catches_cache_id_not_atomic() {
    caught_loom(LoomMutant::CacheIdNotAtomic, cache_ids_of_caches_made_at_once, &["two caches made at once got one id"]);
}

/// Loom finds both threads past the free mark's load before either stores.
#[cfg(loom)]
#[test]
fn catches_bucket_claim_without_cas() {
    caught_loom(
        LoomMutant::BucketClaimWithoutCas,
        bucket_claimed_by_one_of_two,
        &["two threads own one bucket", "the owner inside its callback", "the owner out of its callback", "a claimed bucket is at depth"],
    );
}

/// The names are in `mrcache_types::mutants::LOOM_MUTANTS`.
#[test]
fn loom_mutant_names_are_listed() {
    for m in LoomMutant::ALL {
        assert!(mrcache_types::mutants::LOOM_MUTANTS.contains(&m.name()), "{}", m.name());
    }
}
