//! The system calls under the cache's algorithms (layer 2): `membarrier`
//! (the lanes' heavy barrier, spec.md#LN5) and fork detection (`pthread_atfork`
//! and a `MADV_WIPEONFORK` page, spec.md#F1, S2.6). Nothing here knows the
//! cache: [`crate::cache::lanes`] picks its barrier with [`membarrier`], and
//! the cache's fork check (`fork.rs`) compares [`fork_generation`].

use crate::sync::{plain, Ordering};

// ---------------------------------------------------------------------------
// membarrier

/// `membarrier(2)`: the commands the lanes use (none under loom, which has
/// no membarrier).
pub(crate) mod membarrier {
    #[cfg(not(loom))]
    pub const CMD_QUERY: libc::c_long = 0;
    #[cfg(not(loom))]
    pub const CMD_GLOBAL: libc::c_long = 1;
    #[cfg(not(loom))]
    pub const CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    #[cfg(not(loom))]
    pub const CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

    /// `membarrier(cmd, 0, 0)`: its result, or -1.
    #[cfg(not(loom))]
    pub fn membarrier(cmd: libc::c_long) -> libc::c_long {
        // SAFETY: membarrier takes (cmd, flags, cpu_id) integers and touches
        // no memory.
        unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) }
    }

    /// Registers the process for private expedited membarrier; whether it
    /// can use it.
    #[cfg(not(loom))]
    pub fn register() -> bool {
        let supported = membarrier(CMD_QUERY);
        supported >= 0 && supported & CMD_PRIVATE_EXPEDITED != 0 && membarrier(CMD_REGISTER_PRIVATE_EXPEDITED) == 0
    }

    #[cfg(loom)]
    pub fn register() -> bool {
        false
    }
}

// ---------------------------------------------------------------------------
// Fork detection

static FORKS: plain::AtomicU64 = plain::AtomicU64::new(0);
/// The thread token ([`crate::thread_token`]) of the thread that made this
/// process by its last fork, the one thread the child started with; 0 when
/// unknown (a fork the atfork handler did not see) or none.
static FORKED_BY: plain::AtomicUsize = plain::AtomicUsize::new(0);
/// Fork-safe: a child whose parent's thread was inside it runs it again
/// (registering the handler twice only counts a fork twice).
static INSTALL: crate::fork_safe::ForkSafeOnce = crate::fork_safe::ForkSafeOnce::new();

/// A word on a page mapped with `MADV_WIPEONFORK` (Linux 4.14): [`ARMED`] in
/// this process, 0 in a child however it was made (fork(), or a raw
/// `clone`/`SYS_fork` that runs no atfork handler). Null when the kernel
/// refused the advice: slow paths then compare the pid (a system call).
/// Written once, in `install`; the page is never unmapped.
static WIPED_IN_CHILD: plain::AtomicPtr<plain::AtomicU64> = plain::AtomicPtr::new(std::ptr::null_mut());
const ARMED: u64 = 0x6d72_6361_6368_6521;
/// A thread of a child that found the word wiped is counting the fork.
const REARMING: u64 = 1;

/// Runs in the child after fork(): re-arms the wipe word (so the slow
/// paths' check does not count this fork again) and counts the fork. Two
/// stores and one atomic increment, no lock, no allocation
/// (async-signal-safe); the child has one thread here. The forgetting
/// happens at the start of the child's next cache operation (spec.md#S2.6, F1).
extern "C" fn child() {
    let w = WIPED_IN_CHILD.load(Ordering::Relaxed);
    if !w.is_null() {
        // SAFETY: set once by `install` to a page that is never unmapped.
        unsafe { &*w }.store(ARMED, Ordering::Relaxed);
    }
    FORKED_BY.store(crate::thread_token::thread_token(), Ordering::Relaxed);
    FORKS.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn install() {
    INSTALL.call_once(|| {
        // SAFETY: registers a handler that only touches static atomics and
        // the page below. A failure (ENOMEM) leaves the slow paths' check.
        unsafe {
            libc::pthread_atfork(None, None, Some(child));
        }
        let page = 4096;
        // SAFETY: a fresh private anonymous page, ours alone.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), page, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        if p == libc::MAP_FAILED {
            return;
        }
        // SAFETY: advice on the page just mapped.
        if unsafe { libc::madvise(p, page, libc::MADV_WIPEONFORK) } != 0 {
            // SAFETY: unmaps the page just mapped, which nothing refers to.
            unsafe { libc::munmap(p, page) };
            return;
        }
        let w = p.cast::<plain::AtomicU64>();
        // SAFETY: page-aligned, zeroed memory: a valid AtomicU64; published
        // below and never unmapped.
        unsafe { &*w }.store(ARMED, Ordering::Relaxed);
        WIPED_IN_CHILD.store(w, Ordering::Release);
    });
}

/// The slow paths' fork check without a system call: whether this process
/// is a child the atfork handler did not see (a raw clone), counted in
/// [`fork_generation`] once it returns. `None` when there is no wipe word.
/// Inlined up to the usual answer (the word ARMED: no fork unseen): every
/// miss asks, and the call cost more than the answer.
#[inline(always)]
pub(crate) fn wipe_check() -> Option<()> {
    let w = WIPED_IN_CHILD.load(Ordering::Acquire);
    if w.is_null() {
        return None;
    }
    // SAFETY: set once by `install` to a page that is never unmapped.
    let w = unsafe { &*w };
    if w.load(Ordering::Acquire) == ARMED {
        return Some(());
    }
    count_unseen_fork(w)
}

/// [`wipe_check`] when the wipe word is not ARMED: a child the atfork
/// handler did not see (0), or another thread counting its fork.
#[cold]
#[inline(never)]
fn count_unseen_fork(w: &plain::AtomicU64) -> Option<()> {
    // Bounded: leaves once the word is ARMED, which the one thread that
    // moved it from 0 to REARMING stores right after counting the fork.
    loop {
        match w.load(Ordering::Acquire) {
            ARMED => return Some(()),
            0 => {
                // Exactly one thread counts the fork (a second count would
                // make the caches forget their fresh generations).
                if w.compare_exchange(0, REARMING, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    FORKED_BY.store(0, Ordering::Relaxed);
                    FORKS.fetch_add(1, Ordering::Release);
                    w.store(ARMED, Ordering::Release);
                    return Some(());
                }
            }
            _ => std::thread::yield_now(),
        }
    }
}

/// The process's fork generation: how many forks this process is removed
/// from the one that loaded the library (a child's is its parent's + 1).
/// A lease taken under an older one is void here (spec.md#S2.6).
#[inline]
pub fn fork_generation() -> u64 {
    FORKS.load(Ordering::Relaxed)
}

/// The thread token of the thread that forked this process (the only
/// thread a child starts with), 0 if unknown: per-thread state keyed by
/// token that a child inherits belongs to that thread, or to none (a new
/// thread of the child may reuse a vanished thread's token: glibc hands it
/// the vanished thread's stack).
#[inline]
pub fn forking_thread() -> usize {
    FORKED_BY.load(Ordering::Relaxed)
}
