//! Fork detection and the forgetting of a forked child (spec.md#F1, S2.6).

use super::Cache;
use super::generation::Shared;
use super::stats::add;
use super::EventSource;
use crate::registrar::Registrar;
use crate::sync::{plain, Ordering};
use std::sync::Once;

static FORKS: plain::AtomicU64 = plain::AtomicU64::new(0);
static INSTALL: Once = Once::new();

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
    FORKS.fetch_add(1, Ordering::Relaxed);
}

pub(super) fn install() {
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
/// [`generation`] once it returns. `None` when there is no wipe word.
fn wipe_check() -> Option<()> {
    let w = WIPED_IN_CHILD.load(Ordering::Acquire);
    if w.is_null() {
        return None;
    }
    // SAFETY: set once by `install` to a page that is never unmapped.
    let w = unsafe { &*w };
    // Bounded: leaves once the word is ARMED, which the one thread that
    // moved it from 0 to REARMING stores right after counting the fork.
    loop {
        match w.load(Ordering::Acquire) {
            ARMED => return Some(()),
            0 => {
                // Exactly one thread counts the fork (a second count would
                // make the caches forget their fresh generations).
                if w.compare_exchange(0, REARMING, Ordering::AcqRel, Ordering::Acquire).is_ok() {
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
pub fn generation() -> u64 {
    FORKS.load(Ordering::Relaxed)
}

impl<R: Registrar> Cache<R> {
    //= spec.md#F1
    /// The current generation, after the fork check every operation starts
    /// with (fork generation only: two relaxed loads).
    #[inline]
    pub(super) fn shared(&self) -> &Shared<R> {
        if generation() != self.forks_seen.load(Ordering::Acquire) {
            self.after_fork();
        }
        // SAFETY: never null; generations are freed only in `Drop`.
        unsafe { &*self.shared.load(Ordering::Acquire) }
    }

    //= spec.md#F1
    /// [`Self::shared`] plus a check that also sees forks the atfork handler
    /// missed, for paths that take the exclusive lock (a child must not
    /// touch a lock a vanished thread holds): the wipe-on-fork word (one
    /// load), or the pid (a system call) where the kernel has no
    /// `MADV_WIPEONFORK`.
    pub(super) fn shared_slow(&self) -> &Shared<R> {
        if wipe_check().is_none() && std::process::id() != self.pid.load(Ordering::Acquire) {
            self.after_fork();
        }
        self.shared()
    }

    #[cold]
    pub(super) fn after_fork(&self) {
        self.with_forget_flag(|| {
            let gen = generation();
            let pid = std::process::id();
            if gen != self.forks_seen.load(Ordering::Acquire) || pid != self.pid.load(Ordering::Acquire) {
                #[cfg(any(test, feature = "faults"))]
                let keep_monitor = self.config.faults.fork_keeps_monitor;
                #[cfg(not(any(test, feature = "faults")))]
                let keep_monitor = false;
                let _leaked = self.forget_generation(keep_monitor);
                self.pid.store(pid, Ordering::Release);
                self.forks_seen.store(gen, Ordering::Release);
            }
        });
    }

    pub(super) fn with_forget_flag(&self, f: impl FnOnce()) {
        while self.forgetting.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::hint::spin_loop();
            std::thread::yield_now();
        }
        f();
        self.forgetting.store(false, Ordering::Release);
    }

    //= spec.md#S2.6
    /// Installs a fresh generation and leaks the old one: its entries are
    /// forgotten without registrar calls; its leases release as no-ops. In a
    /// real child (`keep_monitor` false) the old generation's monitor stays
    /// with it: a userfaultfd context watches the memory of the process that
    /// opened it, so reading it would see none of the child's releases and
    /// would take the parent's events; the fresh generation then caches
    /// nothing until a monitor is installed in it, if the old one read one
    /// (F1). A replayed fork (same process) keeps reading the same monitor.
    pub(super) fn forget_generation(&self, keep_monitor: bool) -> usize {
        // SAFETY: never null; generations are freed only in `Drop`.
        let current = unsafe { &*self.shared.load(Ordering::Acquire) };
        let mut fresh = Box::new(Shared::<R>::new(self.queue_capacity, self.config.lane_slots, false));
        if keep_monitor {
            let current: *const Shared<R> = current;
            // SAFETY: `current` becomes an old generation, which is not
            // freed while the cache lives (a replayed fork's are freed in
            // `Drop`, newest first, so after the generation reading this
            // one's source; a generation's source is only read through the
            // cache).
            let current: &'static Shared<R> = unsafe { &*current };
            fresh.monitor_required = current.monitor_required;
            if let Some(src) = current.source.get() {
                let _ = fresh.source.set(Box::new(KeptMonitor(&**src)));
            }
        } else {
            fresh.monitor_required = current.monitor_required || current.source.get().is_some();
        }
        fresh.older = plain::AtomicPtr::new((current as *const Shared<R>).cast_mut());
        let old_ptr = self.shared.swap(Box::into_raw(fresh), Ordering::AcqRel);
        // SAFETY: never null; leaked from here on (freed only by `Drop`, and
        // only if a replayed fork replaced it).
        let old = unsafe { &*old_ptr };
        add(&self.counters.forgotten, old.live_regs.load(Ordering::Acquire));
        let (h, r) = old.lanes.installed().map(|l| l.counts()).fold((0, 0), |(a, b), (h, r)| (a + h, b + r));
        add(&self.counters.lane_hits_forgotten, h);
        add(&self.counters.lane_releases_forgotten, r);
        old_ptr as usize
    }

    /// Replays `Op::Fork` (spec.md#S2.6): forgets every registration without
    /// calling the registrar, as a forked child does at its first operation.
    /// Leases held now release as no-ops. The forgotten handles are leaked.
    /// The process is the same, so the cache keeps reading its monitor.
    pub fn simulate_fork(&self) {
        let _ = self.shared();
        self.with_forget_flag(|| {
            let old = self.forget_generation(true);
            self.replayed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(old);
        });
    }
}

/// An old generation's monitor, read by the next one: after a replayed fork
/// (same process), or in a real child under the F1 fault switch (the
/// behaviour before F1 detached it).
struct KeptMonitor(&'static dyn EventSource);

impl EventSource for KeptMonitor {
    fn read_pending(&self, out: &mut Vec<super::ReleaseEvent>) {
        self.0.read_pending(out)
    }
    fn watch(&self, range: mrcache_types::Range) -> Result<super::Watched, String> {
        self.0.watch(range)
    }
    fn delivering(&self) -> bool {
        self.0.delivering()
    }
    fn proves_removes(&self) -> bool {
        self.0.proves_removes()
    }
    fn remove_window_opened(&self, range: mrcache_types::Range) {
        self.0.remove_window_opened(range)
    }
}
