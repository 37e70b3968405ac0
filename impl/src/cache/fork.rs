//! Fork detection and the forgetting of a forked child (spec.md#F1, S2.6).

use super::Cache;
use super::generation::Shared;
use super::stats::add;
#[cfg(any(test, feature = "testkit"))]
use super::EventSource;
use crate::registrar::Registrar;
use crate::sync::{plain, Ordering};
use std::sync::Once;

static FORKS: plain::AtomicU64 = plain::AtomicU64::new(0);
static INSTALL: Once = Once::new();

/// Runs in the child after fork(): one atomic increment, no lock, no
/// allocation (async-signal-safe). The forgetting happens at the start of
/// the child's next cache operation (spec.md#S2.6, F1).
extern "C" fn child() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

pub(super) fn install() {
    INSTALL.call_once(|| {
        // SAFETY: registers a handler that only touches a static atomic.
        // A failure (ENOMEM) leaves the pid comparison of slow paths.
        unsafe {
            libc::pthread_atfork(None, None, Some(child));
        }
    });
}

#[inline]
pub(super) fn generation() -> u64 {
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
    /// [`Self::shared`] plus the pid comparison, for paths that take the
    /// exclusive lock (a child must not touch a lock a vanished thread holds).
    pub(super) fn shared_slow(&self) -> &Shared<R> {
        if std::process::id() != self.pid.load(Ordering::Acquire) {
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
                self.forget_generation();
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
    /// forgotten without registrar calls; its leases release as no-ops. The
    /// old generation's monitor stays with it: in a real child it watches
    /// the parent's memory (a userfaultfd context follows the mm that opened
    /// it), so reading it would see none of the child's releases and would
    /// take the parent's events. The fresh generation caches nothing until a
    /// monitor is installed in it, if the old one read one (F1).
    pub(super) fn forget_generation(&self) {
        // SAFETY: never null; generations are freed only in `Drop`.
        let current = unsafe { &*self.shared.load(Ordering::Acquire) };
        let monitor_required = current.monitor_required || current.source.get().is_some();
        let fresh = Box::new(Shared::<R>::new(self.queue_capacity, self.config.lane_slots, monitor_required));
        #[cfg(any(test, feature = "testkit"))]
        let fresh = self.fork_keeps_monitor(fresh, current);
        let old = self.shared.swap(Box::into_raw(fresh), Ordering::AcqRel);
        // SAFETY: never null; deliberately leaked from here on (never freed).
        let old = unsafe { &*old };
        add(&self.counters.forgotten, old.live_regs.load(Ordering::Acquire));
        let (h, r) = old.lanes.installed().map(|l| l.counts()).fold((0, 0), |(a, b), (h, r)| (a + h, b + r));
        add(&self.counters.lane_hits_forgotten, h);
        add(&self.counters.lane_releases_forgotten, r);
    }

    /// The fault switch `fork_keeps_monitor`: the child's generation reads
    /// the parent's monitor (the behaviour before F1 detached it).
    #[cfg(any(test, feature = "testkit"))]
    fn fork_keeps_monitor(&self, mut fresh: Box<Shared<R>>, current: &Shared<R>) -> Box<Shared<R>> {
        if !self.config.faults.fork_keeps_monitor {
            return fresh;
        }
        fresh.monitor_required = false;
        let current: *const Shared<R> = current;
        // SAFETY: `current` becomes an old generation, which is never freed
        // while the cache lives (only the last one is, in `Drop`, and a
        // generation's source is only read through the cache).
        let current: &'static Shared<R> = unsafe { &*current };
        if let Some(src) = current.source.get() {
            let _ = fresh.source.set(Box::new(ParentMonitor(&**src)));
        }
        fresh
    }

    /// Replays `Op::Fork` (spec.md#S2.6): forgets every registration without
    /// calling the registrar, as a forked child does at its first operation.
    /// Leases held now release as no-ops. The forgotten handles are leaked.
    pub fn simulate_fork(&self) {
        let _ = self.shared();
        self.with_forget_flag(|| self.forget_generation());
    }
}

/// The parent's monitor, read by a child (fault switch `fork_keeps_monitor`).
#[cfg(any(test, feature = "testkit"))]
struct ParentMonitor(&'static dyn EventSource);

#[cfg(any(test, feature = "testkit"))]
impl EventSource for ParentMonitor {
    fn read_pending(&self, out: &mut Vec<super::ReleaseEvent>) {
        self.0.read_pending(out)
    }
    fn watch(&self, range: mrcache_types::Range) -> Result<(), String> {
        self.0.watch(range)
    }
}
