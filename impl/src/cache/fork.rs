//! The cache's fork check and the forgetting of a forked child (spec.md#F1,
//! S2.6), over the fork detection of [`super::os`] (layer 3: it installs
//! generations).

use super::counters::add;
use super::generation::Generation;
use super::os::{fork_generation, wipe_check};
use super::source::{EventSource, ReleaseEvent, Watched};
use super::Cache;
use crate::registrar::Registrar;
use crate::sync::{plain, Ordering};

impl<R: Registrar> Cache<R> {
    //= spec.md#F1
    /// The current generation, after the fork check every operation starts
    /// with (fork generation only: two relaxed loads).
    #[inline]
    pub(super) fn shared(&self) -> &Generation<R> {
        if fork_generation() != self.forks_seen.load(Ordering::Acquire) {
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
    pub(super) fn shared_slow(&self) -> &Generation<R> {
        if wipe_check().is_none() && std::process::id() != self.pid.load(Ordering::Acquire) {
            self.after_fork();
        }
        self.shared()
    }

    #[cold]
    pub(super) fn after_fork(&self) {
        self.with_forget_flag(|| {
            let gen = fork_generation();
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
        let mut fresh = Box::new(Generation::<R>::new(self.queue_capacity, self.config.lane_slots, false));
        if keep_monitor {
            let current: *const Generation<R> = current;
            // SAFETY: `current` becomes an old generation, which is not
            // freed while the cache lives (a replayed fork's are freed in
            // `Drop`, newest first, so after the generation reading this
            // one's source; a generation's source is only read through the
            // cache).
            let current: &'static Generation<R> = unsafe { &*current };
            fresh.monitor_required = current.monitor_required;
            if let Some(src) = current.source.get() {
                let _ = fresh.install_source(Box::new(KeptMonitor(&**src)));
            }
        } else {
            fresh.monitor_required = current.monitor_required || current.source.get().is_some();
        }
        fresh.older = plain::AtomicPtr::new((current as *const Generation<R>).cast_mut());
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
    fn read_pending(&self, out: &mut Vec<ReleaseEvent>) -> Option<u64> {
        self.0.read_pending(out)
    }
    fn gate_start(&self) -> Option<u64> {
        self.0.gate_start()
    }
    fn watch(&self, range: mrcache_types::Range) -> Result<Watched, String> {
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
