//! The userfaultfd monitor wired into a cache (spec.md#S3.8, S7.3, M1, M2).
//!
//! [`UffdEvents`] is the cache's [`EventSource`]: the cache reads it only
//! while holding its exclusive lock (M2, and A2/A6 before every slow-path
//! lookup), so an event is never read (which wakes the releasing thread)
//! without being applied in the same critical section.
//!
//! [`MonitorThread`] is M1: it polls the fd for readability *without
//! reading*, then runs one [`Cache::monitor_round`]. It never frees monitored
//! memory itself (a thread that releases watched memory blocks until someone
//! reads its event; if that someone is itself, it blocks forever).
//!
//! Invariants: the thread stops within one poll timeout of [`MonitorThread`]
//! being dropped or stopped; every loop is bounded by that stop flag or by
//! [`READ_BATCH`].

use super::madvise_proof::{self, InstallError, Seen, SendOutcome, Sent, Signal};
use super::uffd::{MonitorEvent, UffdError, UffdMonitor};
use crate::cache::{Cache, EventSource, ReleaseEvent, SharedCache};
use crate::registrar::Registrar;
use mrcache_types::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

/// Messages read per `read_pending` call of the monitor.
pub const READ_BATCH: usize = 256;

/// How long the monitor thread waits in `poll` before re-checking its stop flag.
pub const POLL_TIMEOUT_MS: i32 = 20;

/// The poll timeout while a REMOVE window awaits its proof: threads seen
/// inside a madvise are looked at again this often (those that acknowledge
/// the signal wake the poll at once).
pub const PROOF_POLL_MS: i32 = 1;

/// The cache's event source, shared with the monitor thread (which takes
/// the windows M3 opened).
struct SharedEvents(Arc<UffdEvents>);

impl EventSource for SharedEvents {
    fn read_pending(&self, out: &mut Vec<ReleaseEvent>) {
        self.0.read_pending(out)
    }
    fn watch(&self, range: Range) -> Result<(), String> {
        self.0.watch(range)
    }
    fn proves_removes(&self) -> bool {
        self.0.proves_removes()
    }
    fn remove_window_opened(&self, range: Range) {
        self.0.remove_window_opened(range)
    }
}

/// A [`UffdMonitor`] as the cache's event source.
pub struct UffdEvents {
    monitor: Arc<UffdMonitor>,
    read_errors: AtomicU64,
    /// With the madvise proof: REMOVE windows M3 opened, awaiting M4.
    proof: Option<(Signal, Mutex<Vec<Range>>)>,
}

impl UffdEvents {
    /// A source whose REMOVEs are plain events (S7.4(b) open).
    pub fn new(monitor: Arc<UffdMonitor>) -> Self {
        UffdEvents { monitor, read_errors: AtomicU64::new(0), proof: None }
    }

    /// A source whose REMOVEs open windows that a [`MonitorThread`] closes
    /// once it proved the madvise returned (spec.md#M3, M4).
    pub fn with_proof(monitor: Arc<UffdMonitor>, signal: Signal) -> Self {
        UffdEvents { monitor, read_errors: AtomicU64::new(0), proof: Some((signal, Mutex::new(Vec::new()))) }
    }

    /// `read()` calls that failed (not EAGAIN). They are retried next round.
    pub fn read_errors(&self) -> u64 {
        self.read_errors.load(Ordering::Relaxed)
    }

    /// Takes the windows opened since the last call.
    fn take_opened(&self) -> Vec<Range> {
        match &self.proof {
            Some((_, opened)) => std::mem::take(&mut *opened.lock().unwrap_or_else(PoisonError::into_inner)),
            None => Vec::new(),
        }
    }
}

impl EventSource for UffdEvents {
    fn read_pending(&self, out: &mut Vec<ReleaseEvent>) {
        let mut events: Vec<MonitorEvent> = Vec::new();
        // Bounded: each call reads at most READ_BATCH messages and stops when
        // the kernel has none left (EAGAIN), so the lock is held briefly.
        match self.monitor.read_pending(&mut events, READ_BATCH) {
            Ok(_) => {}
            Err(_) => {
                self.read_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        out.extend(events.into_iter().map(|e| ReleaseEvent { kind: e.kind, range: e.range }));
    }

    fn watch(&self, range: Range) -> Result<(), String> {
        self.monitor.watch(range).map_err(|e| e.to_string())
    }

    fn proves_removes(&self) -> bool {
        self.proof.is_some()
    }

    fn remove_window_opened(&self, range: Range) {
        if let Some((signal, opened)) = &self.proof {
            opened.lock().unwrap_or_else(PoisonError::into_inner).push(range);
            // Wakes the monitor thread if another thread read the event (A2, A6).
            signal.wake();
        }
    }
}

/// One REMOVE window awaiting its proof (spec.md#M4, S7.5).
struct Unproven {
    range: Range,
    /// Threads that may still be inside the madvise, with the signal sent
    /// to each (None: not sent yet).
    waiting: Vec<(i32, Option<Sent>)>,
    /// The thread list could not be read: nothing can be proven.
    unknown: bool,
}

/// The monitor thread's half of M4: scans threads for each new window,
/// signals those that may be inside the madvise, and closes a window once
/// none may be.
struct Prover {
    signal: Signal,
    me: i32,
    unproven: Vec<Unproven>,
    /// Sends whose thread was since seen elsewhere: their signal is still
    /// pending, so their slot stays taken until acknowledged (or exit).
    lingering: Vec<(i32, Sent)>,
}

impl Prover {
    fn new(signal: Signal) -> Self {
        Prover { signal, me: madvise_proof::gettid(), unproven: Vec::new(), lingering: Vec::new() }
    }

    /// Starts proving each window in `opened`.
    fn begin(&mut self, opened: Vec<Range>) {
        for range in opened {
            let mut w = Unproven { range, waiting: Vec::new(), unknown: false };
            match madvise_proof::threads(self.me) {
                None => w.unknown = true,
                Some(tids) => {
                    for tid in tids {
                        match madvise_proof::look(tid, range) {
                            Seen::Elsewhere | Seen::Exited => {}
                            Seen::Inside | Seen::Unknown => w.waiting.push((tid, None)),
                        }
                    }
                }
            }
            self.unproven.push(w);
        }
    }

    /// One pass over the windows: sends, checks, closes. Returns whether
    /// any window is still unproven.
    fn advance<R: Registrar>(&mut self, cache: &Cache<R>) -> bool {
        let signal = self.signal;
        self.lingering.retain(|&(tid, sent)| {
            if signal.acknowledged(sent) {
                return false;
            }
            if madvise_proof::look(tid, Range { addr: 0, len: 1 }) == Seen::Exited {
                signal.forget_exited(sent);
                return false;
            }
            true
        });
        let mut lingering = Vec::new();
        self.unproven.retain_mut(|w| {
            w.waiting.retain_mut(|(tid, sent)| {
                if let Some(s) = *sent {
                    if signal.acknowledged(s) {
                        return false; // its handler ran after the send
                    }
                }
                match madvise_proof::look(*tid, w.range) {
                    Seen::Exited => {
                        if let Some(s) = *sent {
                            signal.forget_exited(s);
                        }
                        false
                    }
                    Seen::Elsewhere => {
                        if let Some(s) = *sent {
                            lingering.push((*tid, s));
                        }
                        false
                    }
                    Seen::Inside => {
                        if sent.is_none() {
                            match signal.send(*tid) {
                                SendOutcome::Sent(s) => *sent = Some(s),
                                SendOutcome::Gone => return false,
                                SendOutcome::Later => {}
                            }
                        }
                        true
                    }
                    Seen::Unknown => true,
                }
            });
            if w.waiting.is_empty() && !w.unknown {
                //= spec.md#M4
                //# A window not proven stays open: it costs caching on its pages, never freshness.
                cache.close_remove_window(w.range);
                return false;
            }
            true
        });
        self.lingering.extend(lingering);
        !self.unproven.is_empty()
    }
}

/// The monitor thread of one cache. Dropping it stops and joins the thread.
//= spec.md#S7.3
pub struct MonitorThread {
    /// The process that started the thread: a fork child has a copy of
    /// this handle but not the thread.
    pid: u32,
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicU64>,
    handle: Option<JoinHandle<()>>,
}

impl MonitorThread {
    /// Opens a userfaultfd monitor, installs it as `cache`'s event source and
    /// starts the monitor thread. Fails if the cache already has a source or
    /// userfaultfd is unavailable. In a fork child, call it again: the
    /// parent's monitor does not follow the child, and the child's cache
    /// caches nothing until it has its own (spec.md#S2.6).
    pub fn start<R: Registrar>(cache: &Arc<Cache<R>>) -> Result<MonitorThread, UffdError> {
        Self::start_with(Arc::clone(cache))
    }

    /// [`Self::start`] for a [`SharedCache`]: the thread keeps a handle
    /// (never a bare `Arc`, whose drop would skip the handle's check for
    /// owned leases still out).
    pub fn start_shared<R: Registrar + 'static>(cache: &SharedCache<R>) -> Result<MonitorThread, UffdError> {
        Self::start_with(cache.clone())
    }

    fn start_with<R: Registrar, C>(cache: C) -> Result<MonitorThread, UffdError>
    where
        C: std::ops::Deref<Target = Cache<R>> + Send + 'static,
    {
        let signal = Signal::install().map_err(|e| match e {
            InstallError::Taken(signal) => UffdError::ProofSignal { signal, taken: true },
            InstallError::NotRealtime(signal) => UffdError::ProofSignal { signal, taken: false },
            InstallError::Os(errno) => UffdError::Thread { errno },
        })?;
        let monitor = Arc::new(UffdMonitor::open()?);
        let events = Arc::new(UffdEvents::with_proof(monitor.clone(), signal));
        if cache.set_event_source(Box::new(SharedEvents(events.clone()))).is_err() {
            return Err(UffdError::AlreadyMonitored);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicU64::new(0));
        let (stop2, rounds2) = (stop.clone(), rounds.clone());
        let (started, running) = std::sync::mpsc::sync_channel::<()>(1);
        let handle = std::thread::Builder::new()
            .name("mrcache-uffd".into())
            .spawn(move || {
                let mut prover = Prover::new(signal);
                let _ = started.send(());
                let mut unproven = false;
                while !stop2.load(Ordering::Acquire) {
                    // Short waits while a window awaits its proof: an
                    // acknowledgement also wakes the poll (the eventfd).
                    let timeout = if unproven { PROOF_POLL_MS } else { POLL_TIMEOUT_MS };
                    //= spec.md#M1
                    //# uffd monitor thread: poll until the fd is readable, without reading.
                    match monitor.wait_readable_or(signal.wake_fd(), timeout) {
                        //= spec.md#M2
                        //# take the lock exclusive; read every pending event non-blockingly
                        Ok(true) => {
                            cache.monitor_round();
                            rounds2.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(false) => {}
                        // EINTR and the like: poll again after the timeout.
                        Err(_) => std::thread::sleep(std::time::Duration::from_millis(POLL_TIMEOUT_MS as u64)),
                    }
                    signal.clear_wake();
                    prover.begin(events.take_opened());
                    unproven = prover.advance(&*cache);
                }
            })
            .map_err(|e| UffdError::Thread { errno: e.raw_os_error().unwrap_or(libc::EAGAIN) })?;
        // Return only once the thread runs: its start maps memory (its stack
        // and signal stack), which must not land in a hole the application
        // makes later between an unmap and a MAP_FIXED of the same address.
        // It also makes "started" mean "monitoring". A closed channel means
        // the thread died before it ran; the join below reports nothing more.
        let _ = running.recv();
        Ok(MonitorThread { pid: std::process::id(), stop, rounds, handle: Some(handle) })
    }

    /// Monitor rounds run so far.
    pub fn rounds(&self) -> u64 {
        self.rounds.load(Ordering::Relaxed)
    }
}

impl Drop for MonitorThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            if std::process::id() == self.pid {
                let _ = h.join();
            } else {
                // In a fork child the thread does not exist: joining (or
                // detaching) it would act on a thread of another process.
                // The handle is leaked.
                std::mem::forget(h);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registrar::counting::CountingRegistrar;
    use crate::CacheConfig;
    use mrcache_types::Access;

    fn map(len: usize) -> u64 {
        crate::mem::map_anon(len as u64, 0).unwrap()
    }

    #[test]
    //= spec.md#S7.3
    fn munmap_invalidates_through_the_monitor_thread() {
        let cache = Arc::new(Cache::new(CountingRegistrar::default(), CacheConfig::explicit()));
        let _monitor = MonitorThread::start(&cache).expect("userfaultfd available (root or user-mode-only)");
        let a = map(8 << 12);
        {
            let lease = cache.acquire(a, 8 << 12, Access::LOCAL_WRITE).unwrap();
            assert!(!lease.hit());
        }
        assert!(cache.acquire(a, 4096, Access::LOCAL_WRITE).unwrap().hit());
        // The munmap returns only once the monitor has read (and so applied) it.
        // SAFETY: `a` is our mapping, no lease is held.
        assert_eq!(unsafe { libc::munmap((a + (4 << 12)) as *mut _, 4 << 12) }, 0);
        // The kernel wakes the releasing thread inside the monitor's read(),
        // possibly before the apply ends; stats() waits for the monitor's
        // critical section, and so does the acquire (S3.8).
        assert_eq!(cache.stats().invalidations, 1);
        assert!(!cache.acquire(a, 4096, Access::LOCAL_WRITE).unwrap().hit());
        // L1: the monitor round deregisters after its unlock; wait for it (bounded).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while cache.stats().deregistrations < 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(cache.stats().deregistrations, 1, "{:?}", cache.stats());
        // SAFETY: the rest of our mapping.
        unsafe { libc::munmap(a as *mut _, 4 << 12) };
    }

    #[test]
    //= spec.md#S2.6
    fn a_replayed_fork_keeps_reading_the_monitor() {
        // Op::Fork replayed in the same process: the monitor still watches
        // this process's memory. Were it detached, the munmap below would
        // wait forever for a read that the monitor thread no longer does.
        let cache = Arc::new(Cache::new(CountingRegistrar::default(), CacheConfig::explicit()));
        let _monitor = MonitorThread::start(&cache).unwrap();
        let a = map(4 << 12);
        drop(cache.acquire(a, 4 << 12, Access::LOCAL_WRITE).unwrap());
        cache.simulate_fork();
        drop(cache.acquire(a, 4 << 12, Access::LOCAL_WRITE).unwrap());
        assert!(cache.acquire(a, 4096, Access::LOCAL_WRITE).unwrap().hit(), "cached after the replayed fork");
        // SAFETY: `a` is our mapping, no lease is held.
        assert_eq!(unsafe { libc::munmap(a as *mut _, 4 << 12) }, 0);
        let a2 = map(4 << 12);
        if a2 == a {
            assert!(!cache.acquire(a, 4096, Access::LOCAL_WRITE).unwrap().hit());
        }
        // SAFETY: our mapping.
        unsafe { libc::munmap(a2 as *mut _, 4 << 12) };
    }

    #[test]
    fn unwatchable_memory_is_refused_clearly() {
        let cache = Arc::new(Cache::new(CountingRegistrar::default(), CacheConfig::explicit()));
        let _monitor = MonitorThread::start(&cache).unwrap();
        let path = std::env::temp_dir().join(format!("mrcache-uffd-{}", std::process::id()));
        let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        f.set_len(4096).unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared mapping of our own file.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, f.as_raw_fd(), 0)
        };
        assert_ne!(p, libc::MAP_FAILED);
        let err = cache.acquire(p as u64, 4096, Access::LOCAL_WRITE).unwrap_err();
        assert_eq!(err.code(), "E5");
        assert!(err.to_string().contains("cannot watch"), "{err}");
        assert_eq!(cache.stats().cached_entries, 0);
        // SAFETY: our mapping.
        unsafe { libc::munmap(p, 4096) };
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_second_source_is_refused() {
        let cache = Arc::new(Cache::new(CountingRegistrar::default(), CacheConfig::explicit()));
        let _m = MonitorThread::start(&cache).unwrap();
        assert!(matches!(MonitorThread::start(&cache), Err(UffdError::AlreadyMonitored)));
    }
}
