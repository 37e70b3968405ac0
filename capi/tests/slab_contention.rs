//! The lease slab (`src/slab.rs`) driven through the C API from several
//! threads at once: acquires, releases (also of leases another thread
//! acquired), double releases, releases of stale handles and reads of
//! handles that another thread is releasing, while the slots are reused.
//! Workers run in rounds of new threads, so a round's threads exit with
//! free slots in their buckets' lists and the next round's threads (the
//! same thread tokens, reused by the C library) inherit them.
//!
//! What must hold (src/slab.rs's invariants): a read of a handle gives that
//! handle's lease (its registration's keys and address) or
//! `MRCACHE_INVALID_LEASE`, never another lease's; a released or stale
//! handle never releases again; at the end no lease is held and every
//! acquire was a hit on the buffers' first registrations.
//!
//! ci/test.sh's contention smoke and ci/full.sh's `contention` step run it
//! under ci/contention.sh (oversubscribed cores); its loom models are
//! src/slab/models.rs.

mod common;

use common::*;
use mrcache_capi::*;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

const PAGE: usize = 4096;
const BUFFERS: usize = 32;
const WORKERS: usize = 4;
const READERS: usize = 2;
const ROUNDS: usize = 16;
const OPS: usize = 20_000;
/// Released handles each worker keeps for the readers to try again.
const STALE: usize = 8;

/// What every thread shares: the cache, the buffers' expected keys, the
/// handle of each buffer's current lease (0: none) and the released handles.
struct Shared {
    cache: *mut mrcache_t,
    base: usize,
    keys: Vec<(u32, u32)>,
    board: Vec<AtomicU64>,
    stale: Vec<AtomicU64>,
    done: AtomicBool,
}

// SAFETY: the C API is thread-safe (mrcache.h); `cache` lives until the
// test destroys it after every thread is joined.
unsafe impl Sync for Shared {}
// SAFETY: as above.
unsafe impl Send for Shared {}

/// A small PRNG (xorshift64): the threads' choices, seeded per thread.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

impl Shared {
    fn buffer(&self, i: usize) -> *const c_void {
        (self.base + i * PAGE) as *const c_void
    }

    fn acquire(&self, i: usize) -> mrcache_lease_t {
        let mut l = mrcache_lease_t::default();
        // SAFETY: a live cache, a mapped buffer, a writable lease.
        let st = unsafe { mrcache_acquire(self.cache, self.buffer(i), PAGE, MRCACHE_ACCESS_LOCAL_WRITE, &mut l) };
        assert_eq!(st, mrcache_status_t::MRCACHE_OK, "acquire: {}", last_error().0);
        l
    }

    fn release(&self, h: u64) -> mrcache_status_t {
        // SAFETY: a live cache; any lease value is allowed.
        unsafe { mrcache_release(self.cache, mrcache_lease_t { opaque: h }) }
    }

    /// Reads handle `h`, which named buffer `i`'s lease when it was loaded:
    /// buffer `i`'s keys and address, or invalid (released meanwhile).
    fn check_read(&self, h: u64, i: usize) {
        let lease = mrcache_lease_t { opaque: h };
        let (mut lkey, mut rkey) = (0, 0);
        // SAFETY: a live cache, writable outputs.
        let st = unsafe { mrcache_lease_keys(self.cache, lease, &mut lkey, &mut rkey) };
        match st {
            mrcache_status_t::MRCACHE_OK => {
                assert_eq!((lkey, rkey), self.keys[i], "handle {h:#x} of buffer {i} read another lease's keys")
            }
            mrcache_status_t::MRCACHE_INVALID_LEASE => {}
            other => panic!("mrcache_lease_keys: {other:?}"),
        }
        let mut v = mrcache_view_t { id: 0, addr: std::ptr::null_mut(), len: 0, access: 0 };
        // SAFETY: a live cache, a writable output.
        let st = unsafe { mrcache_lease_view(self.cache, lease, &mut v) };
        match st {
            mrcache_status_t::MRCACHE_OK => assert_eq!(
                (v.addr as usize, v.len),
                (self.buffer(i) as usize, PAGE),
                "handle {h:#x} of buffer {i} read another lease's view"
            ),
            mrcache_status_t::MRCACHE_INVALID_LEASE => {}
            other => panic!("mrcache_lease_view: {other:?}"),
        }
    }

    /// A worker of one round: it owns the buffers `i` with
    /// `i % WORKERS == w`, takes and releases their leases (also those the
    /// previous round's worker left held), and exits leaving some held.
    fn work(&self, w: usize, seed: u64) {
        let mut x = seed;
        let mine: Vec<usize> = (0..BUFFERS).filter(|i| i % WORKERS == w).collect();
        for op in 0..OPS {
            let i = mine[next(&mut x) as usize % mine.len()];
            let h = self.board[i].load(Ordering::Acquire);
            if h == 0 {
                let l = self.acquire(i);
                self.board[i].store(l.opaque, Ordering::Release);
                self.check_read(l.opaque, i);
            } else {
                self.check_read(h, i);
                self.board[i].store(0, Ordering::Release);
                assert_eq!(self.release(h), mrcache_status_t::MRCACHE_OK, "release of a held lease");
                assert_eq!(self.release(h), mrcache_status_t::MRCACHE_INVALID_LEASE, "a second release of {h:#x}");
                self.stale[w * STALE + op % STALE].store(h, Ordering::Release);
            }
        }
    }

    /// A reader: reads handles as they are published and released, and
    /// releases handles known to be released already.
    fn read(&self, seed: u64) {
        let mut x = seed;
        while !self.done.load(Ordering::Acquire) {
            let i = next(&mut x) as usize % BUFFERS;
            let h = self.board[i].load(Ordering::Acquire);
            if h != 0 {
                self.check_read(h, i);
            }
            let s = self.stale[next(&mut x) as usize % self.stale.len()].load(Ordering::Acquire);
            if s != 0 {
                assert_eq!(self.release(s), mrcache_status_t::MRCACHE_INVALID_LEASE, "a stale handle {s:#x} released");
            }
        }
    }
}

#[test]
fn slab_under_racing_acquire_release_read_and_thread_exits() {
    let counting = Box::new(Counting::default());
    let cache = create(&counting, mrcache_monitor_t::MRCACHE_MONITOR_NONE);
    let base = map(BUFFERS * PAGE) as usize;
    let mut shared = Shared {
        cache,
        base,
        keys: Vec::new(),
        board: (0..BUFFERS).map(|_| AtomicU64::new(0)).collect(),
        stale: (0..WORKERS * STALE).map(|_| AtomicU64::new(0)).collect(),
        done: AtomicBool::new(false),
    };
    // Each buffer's registration and its keys, before any race.
    for i in 0..BUFFERS {
        let l = shared.acquire(i);
        let (mut lkey, mut rkey) = (0, 0);
        // SAFETY: a live cache, writable outputs.
        assert_eq!(unsafe { mrcache_lease_keys(cache, l, &mut lkey, &mut rkey) }, mrcache_status_t::MRCACHE_OK);
        shared.keys.push((lkey, rkey));
        assert_eq!(shared.release(l.opaque), mrcache_status_t::MRCACHE_OK);
    }
    let shared = Arc::new(shared);
    let readers: Vec<_> = (0..READERS)
        .map(|r| {
            let s = shared.clone();
            std::thread::spawn(move || s.read(0x9e37_79b9_7f4a_7c15 ^ r as u64))
        })
        .collect();
    let mut failed = None;
    for round in 0..ROUNDS {
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let s = shared.clone();
                std::thread::spawn(move || s.work(w, ((round * WORKERS + w) as u64).wrapping_mul(0x2545_f491_4f6c_dd1d) | 1))
            })
            .collect();
        for t in workers {
            if let Err(e) = t.join() {
                failed.get_or_insert(e);
            }
        }
        if failed.is_some() {
            break;
        }
    }
    shared.done.store(true, Ordering::Release);
    for t in readers {
        if let Err(e) = t.join() {
            failed.get_or_insert(e);
        }
    }
    if let Some(e) = failed {
        std::panic::resume_unwind(e);
    }
    for (i, b) in shared.board.iter().enumerate() {
        let h = b.swap(0, Ordering::AcqRel);
        if h != 0 {
            shared.check_read(h, i);
            assert_eq!(shared.release(h), mrcache_status_t::MRCACHE_OK, "buffer {i}'s last lease");
        }
    }
    let s = stats(cache);
    assert_eq!(s.leases_held, 0, "leases held after every one was released");
    assert_eq!(s.registrations, BUFFERS as u64, "an acquire missed: a lease's registration went away");
    // SAFETY: every thread is joined; the cache is not used after this.
    assert_eq!(unsafe { mrcache_destroy(cache) }, mrcache_status_t::MRCACHE_OK, "{}", last_error().0);
}
