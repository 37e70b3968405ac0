//! One userfaultfd monitor per process (spec.md#S7.6, M5): caches with
//! different registrars share a buffer, a release reaches every one of
//! them, a detached cache caches nothing, the last detach closes the fd, and
//! a range another userfaultfd watches is served uncached.
//!
//! The tests of this binary run one at a time ([`serial`]): they count the
//! caches attached to the process's monitor.

use mrcache::monitor::uffd::UffdMonitor;
use mrcache::registrar::counting::CountingRegistrar;
use mrcache::registrar::uring::UringRegistrar;
use mrcache::types::{Access, Range};
use mrcache::{Cache, CacheConfig, MonitorThread, Monitoring};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

const PAGE: u64 = 4096;

fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn config() -> CacheConfig {
    CacheConfig::default().monitored_by(Monitoring::Userfaultfd)
}

fn map(len: u64) -> u64 {
    // SAFETY: a fresh private anonymous mapping.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len as usize, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    };
    assert_ne!(p, libc::MAP_FAILED);
    // Touch every page: the io_uring registrar pins what is there.
    // SAFETY: our mapping, `len` bytes.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), 1, len as usize) };
    p as u64
}

/// Runs `f` (a munmap or madvise of watched memory) on another thread and
/// fails if it does not return: a release nobody reads blocks forever.
fn returns_within(what: &str, f: impl FnOnce() -> i32 + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(rc) => assert_eq!(rc, 0, "{what} failed"),
        Err(_) => panic!("{what} did not return within 10 s: its event is never read"),
    }
}

fn uffd_available() -> bool {
    match UffdMonitor::open() {
        Ok(_) => true,
        Err(e) => {
            eprintln!("skipped: userfaultfd unavailable ({e})");
            false
        }
    }
}

#[test]
//= spec.md#S7.6
//# Every cache of a process that uses the
//# userfaultfd monitor, whatever its registrar, shares one userfaultfd and one
//# monitor
fn two_caches_with_different_registrars_share_a_buffer_and_an_unmap_reaches_both() {
    let _g = serial();
    if !uffd_available() {
        return;
    }
    let counting = Arc::new(Cache::new(CountingRegistrar::default(), config()));
    let uring = Arc::new(Cache::new(UringRegistrar::new(16).expect("io_uring"), config()));
    let m1 = MonitorThread::start(&counting).expect("monitor");
    let m2 = MonitorThread::start(&uring).expect("a second cache attaches to the same monitor");
    assert_eq!(m1.attached(), 2);
    let a = map(8 * PAGE);
    for round in 0..2 {
        let l1 = counting.acquire(a, 8 * PAGE, Access::LOCAL_WRITE).expect("first cache");
        let l2 = uring.acquire(a, 8 * PAGE, Access::LOCAL_WRITE).expect("second cache, same buffer");
        assert_eq!((l1.hit(), l2.hit()), (round == 1, round == 1), "round {round}");
    }
    assert_eq!(counting.stats().cached_entries, 1);
    assert_eq!(uring.stats().cached_entries, 1);
    let addr = a + 4 * PAGE;
    // SAFETY: our mapping, no lease held.
    returns_within("munmap", move || unsafe { libc::munmap(addr as *mut _, (4 * PAGE) as usize) });
    // Both applied the event before the munmap returned (stats() waits out
    // a round in progress).
    assert_eq!(counting.stats().invalidations, 1, "{:?}", counting.stats());
    assert_eq!(uring.stats().invalidations, 1, "{:?}", uring.stats());
    assert!(!counting.acquire(a, PAGE, Access::LOCAL_WRITE).unwrap().hit());
    assert!(!uring.acquire(a, PAGE, Access::LOCAL_WRITE).unwrap().hit());
    // One monitor: both handles see the same attachments. (Its round count
    // moves after a round unlocks, so it is not compared here.)
    assert_eq!((m1.attached(), m2.attached()), (2, 2));
    drop((m1, m2));
    // SAFETY: the rest of our mapping.
    unsafe { libc::munmap(a as *mut _, (4 * PAGE) as usize) };
    drop(uring);
    let counting = Arc::into_inner(counting).expect("the monitor let go of the cache");
    drop(counting);
}

#[test]
//= spec.md#S7.6
//# A REMOVE opens a window (M3) in every attached cache that
//# applies it; the one prover (M4) closes each.
fn a_madvise_opens_a_window_in_every_cache_and_one_proof_closes_them() {
    let _g = serial();
    if !uffd_available() {
        return;
    }
    let c1 = Arc::new(Cache::new(CountingRegistrar::default(), config()));
    let c2 = Arc::new(Cache::new(CountingRegistrar::default(), config()));
    let m1 = MonitorThread::start(&c1).unwrap();
    let m2 = MonitorThread::start(&c2).unwrap();
    let a = map(4 * PAGE);
    drop(c1.acquire(a, 4 * PAGE, Access::LOCAL_WRITE).unwrap());
    drop(c2.acquire(a, 4 * PAGE, Access::LOCAL_WRITE).unwrap());
    // SAFETY: our mapping, no lease held.
    returns_within("madvise", move || unsafe { libc::madvise(a as *mut _, (4 * PAGE) as usize, libc::MADV_DONTNEED) });
    for c in [&c1, &c2] {
        assert_eq!(c.stats().invalidations, 1);
        assert_eq!(c.diagnostics().remove_windows, 1);
    }
    // M4: closed once the madvise is proven returned (it has: the proof
    // sees this thread elsewhere). Bounded wait for the monitor thread.
    let deadline = Instant::now() + Duration::from_secs(5);
    while (c1.diagnostics().remove_windows_closed, c2.diagnostics().remove_windows_closed) != (1, 1) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(c1.diagnostics().remove_windows_closed, 1);
    assert_eq!(c2.diagnostics().remove_windows_closed, 1);
    // Cached again once the windows closed.
    drop(c1.acquire(a, 4 * PAGE, Access::LOCAL_WRITE).unwrap());
    assert!(c1.acquire(a, 4 * PAGE, Access::LOCAL_WRITE).unwrap().hit());
    drop((m1, m2));
    // SAFETY: our mapping.
    unsafe { libc::munmap(a as *mut _, (4 * PAGE) as usize) };
}

#[test]
//= spec.md#S7.6
//# A cache that detaches while it lives takes every entry out of
//# its lookup (as a flush: unleased ones are deregistered, leased ones at
//# their last release) and caches nothing from then on
fn a_detached_cache_is_flushed_and_caches_nothing_while_the_other_keeps_the_monitor() {
    let _g = serial();
    if !uffd_available() {
        return;
    }
    let c1 = Arc::new(Cache::new(CountingRegistrar::default(), config()));
    let c2 = Arc::new(Cache::new(CountingRegistrar::default(), config()));
    let m1 = MonitorThread::start(&c1).unwrap();
    let m2 = MonitorThread::start(&c2).unwrap();
    let a = map(4 * PAGE);
    drop(c2.acquire(a, 4 * PAGE, Access::LOCAL_WRITE).unwrap());
    let leased = c1.acquire(a, 4 * PAGE, Access::LOCAL_WRITE).unwrap();
    drop(m1);
    assert_eq!(m2.attached(), 1);
    assert_eq!(c1.stats().cached_entries, 0, "detaching flushes");
    assert_eq!(c1.registrar().live(), 1, "the leased registration lives until its release");
    drop(leased);
    assert_eq!(c1.registrar().live(), 0, "deregistered at its last release");
    for _ in 0..2 {
        let l = c1.acquire(a, 4 * PAGE, Access::LOCAL_WRITE).expect("a detached cache still serves");
        assert!(!l.hit(), "a detached cache caches nothing");
    }
    assert_eq!(c1.diagnostics().unwatched_uncached, 2);
    assert_eq!(c1.stats().uncached, 2);
    assert!(c2.acquire(a, 4 * PAGE, Access::LOCAL_WRITE).unwrap().hit(), "the other cache keeps its entries");
    // SAFETY: our mapping, no lease held.
    returns_within("munmap", move || unsafe { libc::munmap(a as *mut _, (4 * PAGE) as usize) });
    assert_eq!(c2.stats().invalidations, 1);
    assert_eq!(c1.stats().invalidations, 0, "nothing reaches a detached cache");
    drop(m2);
}

#[test]
//= spec.md#S7.6
//# the last detach leaves them idle (blocked in
//# `poll`), and ranges once watched stay watched
fn after_the_last_detach_watched_memory_can_be_released_while_the_caches_live() {
    let _g = serial();
    if !uffd_available() {
        return;
    }
    let c1 = Arc::new(Cache::new(CountingRegistrar::default(), config()));
    let c2 = Arc::new(Cache::new(CountingRegistrar::default(), config()));
    let m1 = MonitorThread::start(&c1).unwrap();
    let m2 = MonitorThread::start(&c2).unwrap();
    let a = map(4 * PAGE);
    drop(c1.acquire(a, 2 * PAGE, Access::LOCAL_WRITE).unwrap());
    drop(c2.acquire(a + 2 * PAGE, 2 * PAGE, Access::LOCAL_WRITE).unwrap());
    drop(m1);
    drop(m2);
    // Nobody reads the fd any more: had it stayed open, these would block
    // forever in the kernel, waiting for their events to be read.
    // SAFETY: our mapping, no lease held.
    returns_within("madvise", move || unsafe { libc::madvise(a as *mut _, (4 * PAGE) as usize, libc::MADV_DONTNEED) });
    // SAFETY: as above.
    returns_within("munmap", move || unsafe { libc::munmap(a as *mut _, (4 * PAGE) as usize) });
    // A new monitor starts afresh.
    let m = MonitorThread::start(&Arc::new(Cache::new(CountingRegistrar::default(), config()))).unwrap();
    assert_eq!(m.attached(), 1);
}

#[test]
//= spec.md#S7.6
//# If the kernel refuses to watch a range because
//# another userfaultfd in the process watches it (EBUSY), the acquire is
//# served, uncached
fn a_range_a_foreign_userfaultfd_watches_is_served_uncached() {
    let _g = serial();
    if !uffd_available() {
        return;
    }
    let foreign = UffdMonitor::open().unwrap();
    let cache = Arc::new(Cache::new(CountingRegistrar::default(), config()));
    let m = MonitorThread::start(&cache).unwrap();
    let a = map(4 * PAGE);
    foreign.watch(Range::new(a, 4 * PAGE).unwrap()).expect("the foreign userfaultfd watches it first");
    for _ in 0..2 {
        let l = cache.acquire(a, 4 * PAGE, Access::LOCAL_WRITE).expect("served, not an error");
        assert!(!l.hit(), "never cached unwatched");
    }
    assert_eq!(cache.diagnostics().unwatched_uncached, 2);
    assert_eq!(cache.stats().uncached, 2);
    assert_eq!(cache.stats().cached_entries, 0);
    // The foreign fd goes; the range can be watched, and cached, again.
    drop(foreign);
    drop(cache.acquire(a, 4 * PAGE, Access::LOCAL_WRITE).unwrap());
    assert!(cache.acquire(a, 4 * PAGE, Access::LOCAL_WRITE).unwrap().hit());
    drop(m);
    // SAFETY: our mapping, no lease held.
    unsafe { libc::munmap(a as *mut _, (4 * PAGE) as usize) };
}

#[test]
fn caches_attach_and_detach_while_others_serve_and_release() {
    // Attaches, detaches, rounds and acquires from four threads; every
    // release returns (no round waits on a lock forever) and every cache
    // ends with nothing registered.
    let _g = serial();
    if !uffd_available() {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let handles: Vec<_> = (0..4u64)
        .map(|t| {
            std::thread::spawn(move || {
                for round in 0..40u64 {
                    let cache = Arc::new(Cache::new(CountingRegistrar::default(), config()));
                    let m = MonitorThread::start(&cache).unwrap();
                    let a = map(4 * PAGE);
                    for i in 0..8u64 {
                        let off = (i % 4) * PAGE;
                        drop(cache.acquire(a + off, PAGE, Access::LOCAL_WRITE).unwrap());
                    }
                    if (t + round) % 2 == 0 {
                        // SAFETY: our mapping, no lease held.
                        assert_eq!(unsafe { libc::madvise(a as *mut _, PAGE as usize, libc::MADV_DONTNEED) }, 0);
                    }
                    // SAFETY: our mapping, no lease held.
                    assert_eq!(unsafe { libc::munmap(a as *mut _, (4 * PAGE) as usize) }, 0);
                    assert_eq!(cache.stats().cached_entries, 0, "thread {t} round {round}: the unmap reached this cache");
                    drop(m);
                    assert_eq!(cache.registrar().live(), 0);
                    assert!(Instant::now() < deadline, "too slow: a round is stuck");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a thread failed");
    }
}

/// The private anonymous read-write mappings of the process, as ranges.
fn anonymous_rw_mappings() -> Vec<(u64, u64)> {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    maps.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (span, perms, _offset, _dev, inode) = (fields.next()?, fields.next()?, fields.next()?, fields.next()?, fields.next()?);
            let named = fields.next().is_some();
            let (start, end) = span.split_once('-')?;
            let (start, end) = (u64::from_str_radix(start, 16).ok()?, u64::from_str_radix(end, 16).ok()?);
            (perms == "rw-p" && inode == "0" && !named).then_some((start, end))
        })
        .collect()
}

#[test]
//= spec.md#S7.6
//# It never exits, so
//# no exit of it releases memory (its stacks) that a widened registration
//# (S6.2) may watch.
fn the_last_detach_returns_even_when_the_monitors_own_stacks_are_watched() {
    // A registration may cover pages the caller never asked for (S6.2's
    // chunk_pages widens a span over the neighbouring mapping), and so may
    // its watch: in a dma_oracle run, a chunk-widened registration covered
    // the monitor thread's signal stack. A thread's exit releases its own
    // memory (Rust's std unmaps the signal stack, glibc madvises the unused
    // stack), and a release of watched memory waits until the event is
    // read, here by the exiting thread itself: the detach hung (about 1 run
    // in 100 of dma_oracle's S7.4(b) variants). Here the monitor thread's
    // stack (and the other mappings its start added) are watched on
    // purpose, through a cache's acquires.
    let _g = serial();
    if !uffd_available() {
        return;
    }
    let before = anonymous_rw_mappings();
    let cache = Arc::new(Cache::new(CountingRegistrar::default(), config()));
    let m = MonitorThread::start(&cache).unwrap();
    // The thread's stack: the mapping that holds its stack pointer, which
    // /proc/self/task/TID/syscall shows while it waits in poll (bounded
    // retries: between two polls it shows "running").
    let tid = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| t.ok())
        .find(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "mrcache-uffd"))
        .expect("the monitor thread runs")
        .file_name();
    let sp = (0..1000)
        .find_map(|_| {
            let line = std::fs::read_to_string(format!("/proc/self/task/{}/syscall", tid.to_string_lossy())).ok()?;
            let fields: Vec<&str> = line.split_whitespace().collect();
            let sp = (fields.len() == 9).then(|| u64::from_str_radix(fields[7].trim_start_matches("0x"), 16).ok()).flatten();
            if sp.is_none() {
                std::thread::sleep(Duration::from_millis(1));
            }
            sp
        })
        .expect("the monitor thread's stack pointer, from /proc/self/task/TID/syscall");
    let stack = *anonymous_rw_mappings().iter().find(|&&(start, end)| start <= sp && sp < end).expect("its stack mapping");
    // Its signal stack, which /proc does not name: the other mappings its
    // start added (when glibc reused a cached stack or placed the signal
    // stack beside an older mapping, none). glibc's heaps for a new arena
    // (64 MiB-aligned) are left out: the monitor's own frees may trim them
    // while it runs, which this test does not address.
    let arena_align = 64 << 20;
    let mut new: Vec<(u64, u64)> =
        anonymous_rw_mappings().into_iter().filter(|m| !before.contains(m) && m.0 % arena_align != 0 && *m != stack).collect();
    new.push(stack);
    for &(start, end) in &new {
        drop(cache.acquire(start, end - start, Access::LOCAL_WRITE).unwrap());
    }
    assert_eq!(cache.stats().cached_entries, new.len() as u64, "each of the thread's mappings is cached, so watched");
    // Had the monitor thread exited at the last detach, it would have
    // waited for itself to read its own exit's release (the bug this
    // guards); the reader never exits now, and the detach returns.
    returns_within("the last detach", move || {
        drop(m);
        0
    });
}

#[test]
//= spec.md#S7.6
//# The child
//# keeps a copy of the parent's fd; that never makes the parent wait, since
//# the parent's reader never stops.
fn a_fork_child_does_not_keep_the_parents_monitor_watching() {
    // A child that does not exec keeps the fds it inherited, and a
    // userfaultfd's context lives until its last fd is closed: had the
    // child kept the parent's, the parent's last detach would close the
    // parent's fd but leave every range watched, and this munmap would wait
    // forever for a reader that is gone.
    let _g = serial();
    if !uffd_available() {
        return;
    }
    let cache = Arc::new(Cache::new(CountingRegistrar::default(), config()));
    let m = MonitorThread::start(&cache).unwrap();
    let a = map(4 * PAGE);
    drop(cache.acquire(a, 4 * PAGE, Access::LOCAL_WRITE).unwrap());
    let mut pipe = [0i32; 2];
    // SAFETY: two ints for pipe(2) to fill.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    // SAFETY: the child only calls close, read and _exit (async-signal-safe)
    // in a copy of this multi-threaded process.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let mut byte = 0u8;
        // SAFETY: the child's copies of the pipe's fds; it waits until the
        // parent closes the write end, then leaves.
        unsafe {
            libc::close(pipe[1]);
            libc::read(pipe[0], (&mut byte as *mut u8).cast(), 1);
            libc::_exit(0);
        }
    }
    // SAFETY: the parent's read end, not used again.
    unsafe { libc::close(pipe[0]) };
    drop(m); // the last detach: the parent's fd closes
    let released = std::panic::catch_unwind(|| {
        // SAFETY: our mapping, no lease held.
        returns_within("munmap while a fork child lives", move || unsafe { libc::munmap(a as *mut _, (4 * PAGE) as usize) });
    });
    // The child goes (which would also end the wait of a munmap that hung).
    // SAFETY: our write end; then we reap our own child.
    unsafe { libc::close(pipe[1]) };
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    if let Err(panic) = released {
        std::panic::resume_unwind(panic);
    }
}

/// A registrar whose deregistration does what the header allows a callback
/// to do: it frees a record it allocated at registration, unmaps the memory
/// it registered, and drops another monitored cache (detaching it). With
/// the monitor this runs on the service thread.
struct Unmapping {
    other: Mutex<Option<(Arc<Cache<CountingRegistrar>>, MonitorThread)>>,
    deregistered: std::sync::atomic::AtomicU64,
}

impl mrcache::registrar::Registrar for Unmapping {
    type Handle = (Range, Box<[u64; 8]>);
    fn register(&self, range: Range, _access: Access) -> Result<Self::Handle, mrcache::registrar::RegistrarError> {
        Ok((range, Box::new([range.addr; 8])))
    }
    fn deregister(&self, (range, record): Self::Handle) -> Result<(), mrcache::registrar::RegistrarError> {
        drop(record);
        // SAFETY: the mapping this registration was made of (the test owns
        // it and holds no lease on it); unmapping watched memory waits until
        // the monitor's reader reads the event.
        unsafe { libc::munmap(range.addr as *mut _, range.len as usize) };
        drop(self.other.lock().unwrap().take());
        self.deregistered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
    fn keys(&self, _handle: &Self::Handle) -> mrcache::registrar::Keys {
        mrcache::registrar::Keys { lkey: 1, rkey: 1 }
    }
    fn name(&self) -> &'static str {
        "unmapping"
    }
}

#[test]
//= spec.md#M5
//# It never reads the fd, so no releasing thread waits for it: it may allocate, take locks and run the registrar's callbacks
fn a_deregistration_on_the_service_thread_may_unmap_and_drop_another_cache() {
    let _g = serial();
    if !uffd_available() {
        return;
    }
    let other = Arc::new(Cache::new(CountingRegistrar::default(), config()));
    let other_monitor = MonitorThread::start(&other).unwrap();
    let b = map(2 * PAGE);
    drop(other.acquire(b, 2 * PAGE, Access::LOCAL_WRITE).unwrap());
    let registrar = Unmapping { other: Mutex::new(Some((other, other_monitor))), deregistered: Default::default() };
    let cache = Arc::new(Cache::new(registrar, config()));
    let m = MonitorThread::start(&cache).unwrap();
    let a = map(4 * PAGE);
    drop(cache.acquire(a, 4 * PAGE, Access::LOCAL_WRITE).unwrap());
    // The first page goes: the entry is invalidated and, unleased, handed
    // to a deregistration, which unmaps the rest (watched: its own event)
    // and detaches the other cache. Under the old monitor, which ran it on
    // the thread that reads the fd, this waited for itself.
    // SAFETY: our mapping, no lease held.
    returns_within("munmap of a watched page", move || unsafe { libc::munmap(a as *mut _, PAGE as usize) });
    let deadline = Instant::now() + Duration::from_secs(10);
    while cache.registrar().deregistered.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the deregistration did not finish: the monitor hangs");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(cache.registrar().other.lock().unwrap().is_none(), "the other cache was dropped inside the callback");
    assert_eq!(m.attached(), 1, "only this cache is attached now");
    returns_within("the detach", move || {
        drop(m);
        0
    });
    // SAFETY: our mapping.
    unsafe { libc::munmap(b as *mut _, (2 * PAGE) as usize) };
}

/// A registrar whose deregistration waits until `open` is set: it holds
/// the service thread inside a callback.
struct Holding {
    open: Arc<std::sync::atomic::AtomicBool>,
    entered: Arc<std::sync::atomic::AtomicBool>,
}

impl mrcache::registrar::Registrar for Holding {
    type Handle = ();
    fn register(&self, _range: Range, _access: Access) -> Result<(), mrcache::registrar::RegistrarError> {
        Ok(())
    }
    fn deregister(&self, _handle: ()) -> Result<(), mrcache::registrar::RegistrarError> {
        self.entered.store(true, std::sync::atomic::Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.open.load(std::sync::atomic::Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }
    fn keys(&self, _handle: &()) -> mrcache::registrar::Keys {
        mrcache::registrar::Keys { lkey: 1, rkey: 1 }
    }
    fn name(&self) -> &'static str {
        "holding"
    }
}

#[test]
//= spec.md#M6
//# A cache whose cursor the reader lapped applies a REMOVE of the whole address space instead
fn a_cache_the_reader_laps_drops_everything_and_caches_again_once_proven() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let _g = serial();
    if !uffd_available() {
        return;
    }
    // A: its deregistration holds the service thread (a callback that
    // blocks), so the rounds stop; B attaches after A and is not drained
    // while the service is held; C makes the events (its own acquires
    // drain only C).
    let (open, entered) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let a = Arc::new(Cache::new(Holding { open: open.clone(), entered: entered.clone() }, config()));
    let ma = MonitorThread::start(&a).unwrap();
    let b = Arc::new(Cache::new(CountingRegistrar::default(), config()));
    let mb = MonitorThread::start(&b).unwrap();
    let c = Arc::new(Cache::new(CountingRegistrar::default(), config()));
    let mc = MonitorThread::start(&c).unwrap();
    let kept = map(PAGE);
    drop(b.acquire(kept, PAGE, Access::LOCAL_WRITE).unwrap());
    assert!(b.acquire(kept, PAGE, Access::LOCAL_WRITE).unwrap().hit());
    let held = map(PAGE);
    drop(a.acquire(held, PAGE, Access::LOCAL_WRITE).unwrap());
    // SAFETY: our mapping, no lease held: its deregistration (on the
    // service thread) blocks until `open`.
    returns_within("munmap of A's page", move || unsafe { libc::munmap(held as *mut _, PAGE as usize) });
    let deadline = Instant::now() + Duration::from_secs(10);
    while !entered.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the service thread never ran A's deregistration");
        std::thread::sleep(Duration::from_millis(1));
    }
    // More events than the ring holds, each a munmap of C's watched page:
    // every one returns (the reader waits on nothing), with the service
    // thread held.
    let events = mrcache::monitor::ring::RING_EVENTS + 64;
    let before = mb.laps();
    for _ in 0..events {
        let p = map(PAGE);
        drop(c.acquire(p, PAGE, Access::LOCAL_WRITE).unwrap());
        // SAFETY: our mapping, no lease held.
        assert_eq!(unsafe { libc::munmap(p as *mut _, PAGE as usize) }, 0);
    }
    // B applies the lost events as one REMOVE of everything: its entry
    // goes, and its pages are served uncached until M4 proves the window.
    let again = b.acquire(kept, PAGE, Access::LOCAL_WRITE).unwrap();
    assert!(!again.hit(), "the lapped cache still hit an entry it could not know was fresh");
    drop(again);
    assert!(mb.laps() > before, "B was lapped");
    assert_eq!(b.stats().cached_entries, 0, "{:?}", b.stats());
    let d = b.diagnostics();
    assert!(d.remove_windows > d.remove_windows_closed, "a window over everything is open: {d:?}");
    // The service resumes, proves the window and B caches again.
    open.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        drop(b.acquire(kept, PAGE, Access::LOCAL_WRITE).unwrap());
        if b.acquire(kept, PAGE, Access::LOCAL_WRITE).unwrap().hit() {
            break;
        }
        assert!(Instant::now() < deadline, "B never cached again: {:?}", b.diagnostics());
        std::thread::sleep(Duration::from_millis(5));
    }
    drop((mc, mb, ma));
    // SAFETY: our mapping.
    unsafe { libc::munmap(kept as *mut _, PAGE as usize) };
}
