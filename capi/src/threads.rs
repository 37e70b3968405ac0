//! Each thread's own state in one cache, found by thread token
//! ([`crate::thread_token`]) instead of a thread-local lookup, which in this
//! shared library is a call to `__tls_get_addr`: the thread's free lease
//! slots ([`crate::slab`]) and its depth inside the cache's registrar
//! callbacks ([`crate::registrar`]).
//!
//! Invariants:
//! - a bucket belongs to the first thread whose token hashes to it (one
//!   compare-exchange) and is never given back. A later thread with the same
//!   token (tokens are reused only after their thread exited) inherits it;
//!   a thread whose bucket another token holds has none for its whole life
//!   ([`ThreadBuckets::mine`] is `None` at every call) and takes the shared
//!   paths: the slab's lock-free list, the registrar's counted thread-local
//!   marks.
//! - a bucket's `mark` is its owner's token with the owner's callback depth
//!   in the low six bits (tokens are thread control block addresses,
//!   aligned far beyond 64 bytes): a thread outside every callback finds its
//!   own token there and takes its bucket with the one load and compare it
//!   needs anyway; inside one (depth 1 to [`MAX_DEPTH`]) it finds the token
//!   plus its depth. Only the owner writes the mark after the claim (plain
//!   load and store), and other threads only compare it with their own
//!   token, which never matches whatever the depth.
//! - only the owner reads or writes `len`, `scope` and `slots` (relaxed atomics, for
//!   `Sync`): a thread asks only about itself, so no ordering with any
//!   other thread is needed. An inheriting thread reads what its exited
//!   predecessor wrote, ordered by that exit and its own creation. `len`,
//!   `slots` and `mark` go through [`crate::sync`], so the loom models of
//!   `slab::models` check that order (a thread's exit) and the claim (two
//!   threads whose tokens share a bucket); they hand each thread its
//!   bucket, or its token ([`ThreadBuckets::mine_as`]), since loom's
//!   threads share one thread token.
//! - the depth is 0 while the owner is outside every registrar callback of
//!   this cache: each callback adds one for its duration (its guard's drop
//!   takes it back, also when unwinding). A thread cannot end inside a
//!   callback in its own process (an unwind out of a C entry point aborts
//!   it, and `pthread_exit` or `longjmp` out of one is undefined behaviour
//!   across Rust frames), so an inheriting thread finds 0 there. A fork is
//!   the exception: a fork child starts with the forking thread alone, and
//!   a new thread of the child can reuse a vanished thread's token (glibc
//!   gives it the vanished thread's stack). So a bucket also records the
//!   fork generation of its owner's outermost callback (`entered_in`), and
//!   a depth from an older generation counts only for the thread that
//!   forked ([`mrcache_impl::cache::forking_thread`]); for any other it is
//!   a vanished thread's, and is cleared.

use crate::sync::{self, LoomMutant};
use crate::thread_token::{bucket, thread_token};
use mrcache_impl::cache::{fork_generation, forking_thread};
use std::sync::atomic::{AtomicU32, Ordering};

/// Free slots a thread keeps for itself, per cache (the bucket's last
/// word holds `len` and the callback scope; loom: two, so that a model
/// reaches the spill to the shared list).
#[cfg(not(loom))]
pub(crate) const LOCAL_FREE_MAX: usize = 29;
#[cfg(loom)]
pub(crate) const LOCAL_FREE_MAX: usize = 2;
/// Threads per cache that get a bucket (others take the shared paths).
pub(crate) const BUCKETS: usize = 32;

/// Callback nesting a bucket's mark can count; deeper callbacks of the
/// same cache take the thread-local marks.
pub(crate) const MAX_DEPTH: usize = 63;

/// One thread's state in one cache. Four cache lines (256 bytes), owned by
/// one thread: no other thread writes them after the claim.
#[repr(align(64))]
pub(crate) struct ThreadBucket {
    /// The owner's token, plus its depth inside this cache's registrar
    /// callbacks, however nested (a callback of this cache may call another
    /// cache whose callback calls this one); 0 before the claim.
    mark: sync::AtomicUsize,
    /// The fork generation (its low 32 bits) when the owner entered its
    /// outermost callback of this cache now running.
    entered_in: AtomicU32,
    /// Free lease slots in `slots[..len]`.
    len: sync::AtomicU32,
    /// The owner's callback scope in this cache (`registrar`'s
    /// `begin_scope`: a miss that restores the thread's cancelability once,
    /// when it ends, instead of after each callback). Owner only.
    scope: AtomicU32,
    /// `generation << 32 | index`: a free slot and its next generation
    /// (taking a slot then reads one word of this thread's line instead of
    /// the slot's state word, which its release just wrote).
    slots: [sync::AtomicU64; LOCAL_FREE_MAX],
}

#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<ThreadBucket>() == 256, "a bucket is four cache lines");

impl ThreadBucket {
    /// An unclaimed bucket with an empty free list.
    pub(crate) fn new() -> ThreadBucket {
        ThreadBucket {
            mark: sync::AtomicUsize::new(0),
            entered_in: AtomicU32::new(0),
            len: sync::AtomicU32::new(0),
            scope: AtomicU32::new(0),
            slots: std::array::from_fn(|_| sync::AtomicU64::new(0)),
        }
    }

    /// A free lease slot from the owner's list, and its next generation
    /// (owner only).
    #[inline(always)]
    pub(crate) fn pop_free_slot(&self) -> Option<(u32, u32)> {
        let n = self.len.load(Ordering::Relaxed) as usize;
        if n == 0 || n > LOCAL_FREE_MAX {
            return None;
        }
        self.len.store(n as u32 - 1, Ordering::Relaxed);
        let v = self.slots[n - 1].load(Ordering::Relaxed);
        Some((v as u32, (v >> 32) as u32))
    }

    /// Keeps a freed lease slot in the owner's list if there is room; else
    /// `false` (owner only).
    #[inline(always)]
    pub(crate) fn push_free_slot(&self, index: u32, generation: u32) -> bool {
        let n = self.len.load(Ordering::Relaxed) as usize;
        if n >= LOCAL_FREE_MAX {
            return false;
        }
        self.slots[n].store(u64::from(generation) << 32 | u64::from(index), Ordering::Relaxed);
        self.len.store(n as u32 + 1, Ordering::Relaxed);
        true
    }

    /// The owner's callback scope bits (owner only).
    #[inline(always)]
    pub(crate) fn scope(&self) -> u32 {
        self.scope.load(Ordering::Relaxed)
    }

    /// Sets the owner's callback scope bits (owner only).
    #[inline(always)]
    pub(crate) fn set_scope(&self, bits: u32) {
        self.scope.store(bits, Ordering::Relaxed);
    }

    /// The owner's depth inside callbacks of this cache.
    pub(crate) fn depth(&self) -> usize {
        self.mark.load(Ordering::Relaxed) & MAX_DEPTH
    }

    /// One more callback entered (owner only; the depth is below
    /// [`MAX_DEPTH`]).
    pub(crate) fn enter_callback(&self) {
        let mark = self.mark.load(Ordering::Relaxed);
        debug_assert!(mark & MAX_DEPTH < MAX_DEPTH, "callback depth overflows the mark");
        if mark & MAX_DEPTH == 0 {
            self.entered_in.store(fork_generation() as u32, Ordering::Relaxed);
        }
        self.mark.store(mark + 1, Ordering::Relaxed);
    }

    /// The innermost callback left (owner only).
    pub(crate) fn leave_callback(&self) {
        let mark = self.mark.load(Ordering::Relaxed);
        debug_assert!(mark & MAX_DEPTH > 0, "left a callback never entered");
        if mark & MAX_DEPTH > 0 {
            self.mark.store(mark - 1, Ordering::Relaxed);
        }
    }

    /// [`ThreadBuckets::mine`] for a bucket whose mark is the caller's token
    /// with a depth: the caller is inside a callback, unless the depth was
    /// left by a thread of an ancestor process that the caller replaced
    /// (module docs: a fork).
    #[cold]
    #[inline(never)]
    fn marked(&self, me: usize) -> Mine<'_> {
        let now = fork_generation() as u32;
        if self.entered_in.load(Ordering::Relaxed) == now {
            return Mine::InCallback(self);
        }
        if me == forking_thread() {
            // The thread that forked, still inside the callbacks it was in.
            self.entered_in.store(now, Ordering::Relaxed);
            return Mine::InCallback(self);
        }
        // A vanished thread's depth: this thread has entered none.
        self.mark.store(me, Ordering::Relaxed);
        Mine::Idle(self)
    }
}

/// The calling thread's bucket, as [`ThreadBuckets::mine`] finds it.
pub(crate) enum Mine<'a> {
    /// Its own, and it is outside every callback of this cache.
    Idle(&'a ThreadBucket),
    /// Its own, and it is inside a callback of this cache.
    InCallback(&'a ThreadBucket),
    /// It has none: another thread holds its bucket, or it has no token.
    None,
}

/// The buckets of one cache (a fixed-size array: a bucket number needs no
/// bounds check).
pub(crate) struct ThreadBuckets {
    buckets: Box<[ThreadBucket; BUCKETS]>,
    /// The breakage these buckets run with (loom builds only).
    #[cfg(loom)]
    mutant: Option<LoomMutant>,
}

impl ThreadBuckets {
    pub(crate) fn new() -> ThreadBuckets {
        ThreadBuckets {
            buckets: Box::new(std::array::from_fn(|_| ThreadBucket::new())),
            #[cfg(loom)]
            mutant: None,
        }
    }

    /// Buckets that run with the breakage `m`.
    #[cfg(loom)]
    pub(crate) fn with_mutant(m: LoomMutant) -> ThreadBuckets {
        ThreadBuckets { mutant: Some(m), ..ThreadBuckets::new() }
    }

    /// Claims the free bucket `b` for `me`: whether it now owns it.
    #[inline(always)]
    fn claim(&self, b: &ThreadBucket, me: usize) -> bool {
        if sync::broken(self.mutant(), LoomMutant::BucketClaimWithoutCas) {
            b.mark.store(me, Ordering::Relaxed);
            return true;
        }
        b.mark.compare_exchange(0, me, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }

    /// The breakage these buckets run with (none in the library).
    #[inline(always)]
    fn mutant(&self) -> Option<LoomMutant> {
        #[cfg(loom)]
        return self.mutant;
        #[cfg(not(loom))]
        None
    }

    /// The calling thread's bucket, claiming it on first use. The usual
    /// answer, [`Mine::Idle`], costs one load and one compare.
    #[inline(always)]
    pub(crate) fn mine(&self) -> Mine<'_> {
        let me = thread_token() & !MAX_DEPTH;
        if me == 0 {
            return Mine::None;
        }
        self.mine_as(me)
    }

    /// [`ThreadBuckets::mine`] for the thread whose token is `me` (non-zero,
    /// its low six bits clear): the library passes the caller's, the loom
    /// models their threads' (loom's threads share one OS thread and so one
    /// real token).
    #[inline(always)]
    pub(crate) fn mine_as(&self, me: usize) -> Mine<'_> {
        let b = &self.buckets[bucket(me, BUCKETS)];
        // Relaxed: a thread reads its own claim and marks (or a
        // predecessor's, which exited before it began: ordered by the
        // thread's creation).
        let mark = b.mark.load(Ordering::Relaxed);
        if mark == me {
            return Mine::Idle(b);
        }
        if mark & !MAX_DEPTH == me {
            return b.marked(me);
        }
        if mark == 0 && self.claim(b, me) {
            return Mine::Idle(b);
        }
        Mine::None
    }
}
