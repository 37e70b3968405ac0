//! The monitor hang scenarios of capi/tests/c/hang/, through the Rust API:
//! a release (munmap, madvise DONTNEED, a heap trim) of watched memory
//! blocks in the kernel until the userfaultfd monitor has read its event, so
//! a monitor whose reading thread also allocates, takes cache locks or runs
//! the registrar's callbacks can wait for itself.
//!
//! Each test runs its scenario in a forked child (a process group of its
//! own) under a watchdog: the parent waits with a deadline
//! (`MRCACHE_HANG_TIMEOUT` seconds, default 60); on a hang it prints every
//! thread's comm, wchan, syscall and kernel stack from /proc, kills the
//! child's group and fails with "HANG: ...". A child that dies of a signal
//! fails with the signal named. A child that cannot start the userfaultfd
//! monitor exits 77: the test is skipped with a message, unless
//! `MRCACHE_REQUIRE_UFFD=1`.
//!
//! The parent never touches the library (only the children do), so the
//! test harness's other threads hold none of its locks at a fork.

use mrcache::registrar::{Keys, Registrar, RegistrarError};
use mrcache::types::{Access, Range};
use mrcache::{Cache, CacheConfig, MonitorThread, Monitoring};
use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PAGE: u64 = 4096;
const RW: Access = Access::LOCAL_WRITE;
const SKIP: i32 = 77;

// ---- the watchdog -------------------------------------------------------

fn timeout() -> Duration {
    let s = std::env::var("MRCACHE_HANG_TIMEOUT").ok().and_then(|v| v.parse().ok()).unwrap_or(60);
    Duration::from_secs(s)
}

/// Writes to stderr without std's lock (a fork child of a threaded parent).
fn say(msg: &str) {
    // SAFETY: writes our own buffer to fd 2.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
}

/// pid, ppid, pgrp of every process (the fields after the last ')' of stat).
fn processes() -> Vec<(i32, i32, i32)> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else { return out };
    for e in dir.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some(rest) = stat.rsplit_once(") ").map(|(_, r)| r.to_string()) else { continue };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() > 2 {
            out.push((pid, f[1].parse().unwrap_or(0), f[2].parse().unwrap_or(0)));
        }
    }
    out
}

/// Every thread of every process in group `pgid`: where it waits.
fn diagnose(pgid: i32) -> String {
    let read = |p: String| std::fs::read_to_string(p).unwrap_or_default().trim_end().to_string();
    let mut report = String::new();
    let mut waits: Vec<String> = Vec::new();
    for (pid, ppid, _) in processes().into_iter().filter(|&(_, _, g)| g == pgid) {
        report += &format!("---- process {pid} (parent {ppid}) {}\n", read(format!("/proc/{pid}/comm")));
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { continue };
        for t in tasks.flatten() {
            let tid = t.file_name().to_string_lossy().to_string();
            let base = format!("/proc/{pid}/task/{tid}");
            let wchan = read(format!("{base}/wchan"));
            report +=
                &format!("  thread {tid} ({}) wchan {wchan} syscall {}\n", read(format!("{base}/comm")), read(format!("{base}/syscall")));
            for line in read(format!("{base}/stack")).lines() {
                report += &format!("      {line}\n");
            }
            waits.push(if wchan.is_empty() || wchan == "0" { "running".into() } else { wchan });
        }
    }
    waits.sort();
    let mut summary: Vec<String> = Vec::new();
    for w in &waits {
        match summary.last_mut() {
            Some(s) if s.starts_with(&format!("{w} x")) => {
                let n: usize = s.rsplit('x').next().unwrap().parse().unwrap();
                *s = format!("{w} x{}", n + 1);
            }
            _ => summary.push(format!("{w} x1")),
        }
    }
    format!("{report}waiting in: {}", summary.join(", "))
}

/// Runs `scenario` in a forked child under the watchdog.
fn in_child(name: &str, scenario: impl FnOnce() -> i32) {
    // SAFETY: the child runs the scenario and leaves by _exit, never
    // returning into the test harness; the parent only waits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: a process group of its own: the watchdog kills the tree.
        unsafe { libc::setpgid(0, 0) };
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(scenario)).unwrap_or(99);
        // SAFETY: leaves the child at once.
        unsafe { libc::_exit(code) };
    }
    // SAFETY: as in the child (whichever runs first).
    unsafe { libc::setpgid(pid, pid) };
    let limit = timeout();
    let start = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            // Leftovers of the child's group (hung grandchildren): killed.
            // SAFETY: the group is the child's.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            if libc::WIFSIGNALED(status) {
                panic!("ABORT: {name}: the scenario's process was killed by signal {}", libc::WTERMSIG(status));
            }
            match libc::WEXITSTATUS(status) {
                0 => return,
                SKIP if std::env::var("MRCACHE_REQUIRE_UFFD").as_deref() != Ok("1") => {
                    eprintln!("{name}: skipped: the userfaultfd monitor is unavailable");
                    return;
                }
                code => panic!("{name}: the scenario failed with exit code {code} (see its messages above)"),
            }
        }
        if start.elapsed() > limit {
            let report = diagnose(pid);
            // SAFETY: the child's group.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            // SAFETY: reaps our child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            panic!("HANG: {name} after {} s\n{report}", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---- a registrar that allocates and frees -------------------------------

/// A registration's record, allocated by `register`, freed by `deregister`.
struct Rec {
    range: Range,
    owner: usize,
    key: u32,
}

type Hook = Box<dyn Fn(&Rec) + Send + Sync>;

#[derive(Default)]
struct Counts {
    reg: AtomicU64,
    dereg: AtomicU64,
}

/// The usual registrar pattern: a record allocated in `register` (the
/// handle) and freed in `deregister`, with a hook that acts in
/// `deregister` (before the record is freed).
struct AllocRegistrar {
    counts: Arc<Counts>,
    next: AtomicU32,
    on_dereg: Option<Hook>,
}

thread_local! {
    /// The owner the thread's next registration records.
    static NEXT_OWNER: Cell<usize> = const { Cell::new(0) };
}

impl AllocRegistrar {
    fn new(counts: &Arc<Counts>, on_dereg: Option<Hook>) -> Self {
        AllocRegistrar { counts: Arc::clone(counts), next: AtomicU32::new(1), on_dereg }
    }
}

/// The handle: the record, on the heap.
struct RecBox(Box<Rec>);

impl Registrar for AllocRegistrar {
    type Handle = RecBox;

    fn register(&self, range: Range, _access: Access) -> Result<RecBox, RegistrarError> {
        let rec = Box::new(Rec { range, owner: NEXT_OWNER.get(), key: self.next.fetch_add(1, Ordering::Relaxed) });
        self.counts.reg.fetch_add(1, Ordering::SeqCst);
        Ok(RecBox(rec))
    }

    fn deregister(&self, handle: RecBox) -> Result<(), RegistrarError> {
        if let Some(hook) = &self.on_dereg {
            hook(&handle.0);
        }
        drop(handle);
        self.counts.dereg.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn keys(&self, h: &RecBox) -> Keys {
        Keys { lkey: h.0.key, rkey: h.0.key | 0x10000 }
    }

    fn name(&self) -> &'static str {
        "alloc"
    }
}

type Monitored = (Arc<Cache<AllocRegistrar>>, MonitorThread);

/// A cache with the userfaultfd monitor, or the child's SKIP exit code.
fn monitored(counts: &Arc<Counts>, on_dereg: Option<Hook>) -> Result<Monitored, i32> {
    let cache = Arc::new(Cache::new(AllocRegistrar::new(counts, on_dereg), CacheConfig::default().monitored_by(Monitoring::Userfaultfd)));
    match MonitorThread::start(&cache) {
        Ok(m) => Ok((cache, m)),
        Err(e) => {
            say(&format!("userfaultfd monitor unavailable: {e}\n"));
            Err(SKIP)
        }
    }
}

macro_rules! monitored {
    ($counts:expr, $hook:expr) => {
        match monitored($counts, $hook) {
            Ok(m) => m,
            Err(code) => return code,
        }
    };
}

/// Drops the monitor, then the cache (its flush deregisters what is cached).
fn stop((cache, monitor): Monitored) {
    drop(monitor);
    drop(cache);
}

fn balanced(what: &str, c: &Counts) -> bool {
    let (r, d) = (c.reg.load(Ordering::SeqCst), c.dereg.load(Ordering::SeqCst));
    if r != d {
        say(&format!("{what}: {r} registrations, {d} deregistrations\n"));
    }
    r == d
}

fn wait_deregs(c: &Counts, n: u64) {
    while c.dereg.load(Ordering::SeqCst) < n {
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn map(len: u64) -> u64 {
    // SAFETY: a fresh private anonymous mapping.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len as usize, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: our mapping, `len` bytes.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), 1, len as usize) };
    p as u64
}

fn unmap(addr: u64, len: u64) -> bool {
    // SAFETY: the caller's own mapping (the tests unmap only what they mapped).
    unsafe { libc::munmap(addr as *mut _, len as usize) == 0 }
}

fn touch(cache: &Cache<AllocRegistrar>, addr: u64, len: u64) -> bool {
    match cache.acquire(addr, len, RW) {
        Ok(_) => true,
        Err(e) => {
            say(&format!("acquire of [{addr:#x}, +{len:#x}) failed: {e}\n"));
            false
        }
    }
}

// ---- the scenarios ------------------------------------------------------

/// heap_traffic.c: threads allocate 1-120 KiB (glibc malloc below its mmap
/// threshold: heap and arenas, whose frees trim watched pages), acquire
/// (every third twice), release, free; the registrar allocates and frees.
#[test]
fn heap_traffic_with_an_allocating_registrar() {
    in_child("heap_traffic", || {
        let counts = Arc::new(Counts::default());
        let (cache, monitor) = monitored!(&counts, None);
        let errors = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let cache = Arc::clone(&cache);
                let errors = Arc::clone(&errors);
                std::thread::spawn(move || {
                    let mut seed = t * 2654435761 + 1;
                    let mut keep: Vec<Option<Vec<u8>>> = (0..8).map(|_| None).collect();
                    for i in 0..2000u64 {
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        let len = 1024 + ((seed >> 33) % (119 * 1024)) as usize;
                        let buf = vec![i as u8; len];
                        let (a, l) = (buf.as_ptr() as u64, len as u64);
                        match cache.acquire(a, l, RW) {
                            Ok(lease) => {
                                if i % 3 == 0 && cache.acquire(a, l, RW).is_err() {
                                    errors.fetch_add(1, Ordering::Relaxed);
                                }
                                drop(lease);
                            }
                            Err(e) => {
                                say(&format!("acquire failed: {e}\n"));
                                errors.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        keep[(seed >> 40) as usize % 8] = Some(buf);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let hits = cache.stats().hits;
        stop((cache, monitor));
        let ok = errors.load(Ordering::Relaxed) == 0 && hits > 0 && balanced("heap_traffic", &counts);
        if ok {
            0
        } else {
            1
        }
    });
}

/// callback_unmaps.c, part 1: the monitor deregisters a registration whose
/// first page was unmapped, and `deregister` munmaps the rest of its range.
#[test]
fn dereg_munmaps_its_registered_memory() {
    in_child("dereg_munmaps", || {
        let counts = Arc::new(Counts::default());
        let hook: Hook = Box::new(|rec: &Rec| {
            if rec.owner == 1 {
                unmap(rec.range.addr + PAGE, rec.range.len - PAGE);
            }
        });
        let m = monitored!(&counts, Some(hook));
        for _ in 0..50 {
            let a = map(8 * PAGE);
            let before = counts.dereg.load(Ordering::SeqCst);
            NEXT_OWNER.set(1);
            let ok = touch(&m.0, a, 8 * PAGE);
            NEXT_OWNER.set(0);
            if !ok || !unmap(a, PAGE) {
                return 2;
            }
            wait_deregs(&counts, before + 1);
        }
        stop(m);
        if balanced("dereg_munmaps", &counts) {
            0
        } else {
            1
        }
    });
}

/// callback_unmaps.c, part 3: `deregister` frees (drops) the registered
/// buffer, a 256 KiB Vec that glibc serves by mmap (its free munmaps);
/// the monitor's deregistration comes from a madvise(DONTNEED) of a page.
#[test]
fn dereg_frees_its_registered_buffer() {
    in_child("dereg_frees", || {
        let counts = Arc::new(Counts::default());
        // The buffer with a claim: a cache may register one acquire twice
        // (A7 retries a registration a closing window or an event made
        // stale, and deregisters the first), so only a deregistration after
        // the acquire returned (ACQUIRED) frees it, once.
        const ACQUIRING: u8 = 0;
        const ACQUIRED: u8 = 1;
        struct Owned {
            state: AtomicU8,
            _buf: Vec<u8>,
        }
        let hook: Hook = Box::new(|rec: &Rec| {
            if rec.owner == 0 {
                return;
            }
            // SAFETY: the Owned leaked for this acquire, alive until the one
            // deregistration that claims it below frees it.
            let owned = unsafe { &*(rec.owner as *const Owned) };
            if owned.state.compare_exchange(ACQUIRED, 2, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                // SAFETY: claimed once (above); nothing refers to it after.
                drop(unsafe { Box::from_raw(rec.owner as *mut Owned) });
            }
        });
        let m = monitored!(&counts, Some(hook));
        for i in 0..50u64 {
            let buf = vec![1u8; 256 * 1024 + (i as usize % 7) * 4096];
            let (a, l) = (buf.as_ptr() as u64, buf.len() as u64);
            let owned = Box::into_raw(Box::new(Owned { state: AtomicU8::new(ACQUIRING), _buf: buf }));
            let before = counts.dereg.load(Ordering::SeqCst);
            NEXT_OWNER.set(owned as usize);
            let ok = touch(&m.0, a, l);
            NEXT_OWNER.set(0);
            if !ok {
                return 2;
            }
            // SAFETY: alive: only a claim after this store frees it.
            let claimable = unsafe { &(*owned).state };
            claimable.store(ACQUIRED, Ordering::SeqCst);
            if counts.dereg.load(Ordering::SeqCst) != before {
                continue; // deregistered meanwhile (served uncached, or an A7 retry's first registration)
            }
            let inner = (a + 2 * PAGE) & !(PAGE - 1);
            // SAFETY: a page inside the buffer (its content is not read
            // again). The madvise waits until the monitor reads its REMOVE;
            // the service thread may then deregister (free, munmap) the
            // buffer before the madvise resumes, which then finds the range
            // gone (ENOMEM).
            if unsafe { libc::madvise(inner as *mut _, PAGE as usize, libc::MADV_DONTNEED) } != 0
                && std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOMEM)
            {
                return 3;
            }
            wait_deregs(&counts, before + 1);
        }
        stop(m);
        if balanced("dereg_frees", &counts) {
            0
        } else {
            1
        }
    });
}

static ACTION: AtomicU8 = AtomicU8::new(0);
static DONE: AtomicU8 = AtomicU8::new(0);
static OTHER: Mutex<Option<Monitored>> = Mutex::new(None);
const DROP_OTHER: u8 = 1;
const CREATE_OTHER: u8 = 2;

/// callback_other_cache.c (a) and (b): A's `deregister`, run by the monitor
/// after an unmap of A's registered memory, drops another monitored cache
/// (and its monitor handle), or creates one.
fn other_cache_scenario(action: u8) -> i32 {
    let counts_a = Arc::new(Counts::default());
    let counts_other = Arc::new(Counts::default());
    let co = Arc::clone(&counts_other);
    let hook: Hook = Box::new(move |_rec: &Rec| {
        match ACTION.swap(0, Ordering::SeqCst) {
            DROP_OTHER => {
                if let Some(m) = OTHER.lock().unwrap().take() {
                    stop(m);
                }
            }
            CREATE_OTHER => {
                if let Ok(m) = monitored(&co, None) {
                    *OTHER.lock().unwrap() = Some(m);
                }
            }
            _ => return,
        }
        DONE.store(1, Ordering::SeqCst);
    });
    let a = monitored!(&counts_a, Some(hook));
    for _ in 0..20 {
        if action == DROP_OTHER {
            let other = monitored!(&counts_other, None);
            let b = map(2 * PAGE);
            touch(&other.0, b, 2 * PAGE);
            *OTHER.lock().unwrap() = Some(other);
        }
        let buf = map(4 * PAGE);
        touch(&a.0, buf, 4 * PAGE);
        DONE.store(0, Ordering::SeqCst);
        ACTION.store(action, Ordering::SeqCst);
        unmap(buf, PAGE);
        while DONE.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
        unmap(buf + PAGE, 3 * PAGE);
        if action == CREATE_OTHER {
            let Some(other) = OTHER.lock().unwrap().take() else { return 2 };
            let c = map(4 * PAGE);
            let before = counts_other.dereg.load(Ordering::SeqCst);
            touch(&other.0, c, 4 * PAGE);
            unmap(c, PAGE);
            wait_deregs(&counts_other, before + 1);
            stop(other);
            unmap(c + PAGE, 3 * PAGE);
        }
    }
    stop(a);
    if balanced("A", &counts_a) && balanced("the other caches", &counts_other) {
        0
    } else {
        1
    }
}

#[test]
fn dereg_drops_another_monitored_cache() {
    in_child("dereg_drops_another_cache", || other_cache_scenario(DROP_OTHER));
}

#[test]
fn dereg_creates_a_monitored_cache() {
    in_child("dereg_creates_a_cache", || other_cache_scenario(CREATE_OTHER));
}

/// fork_during_create.c: threads create, use and drop monitored caches while
/// the main thread forks; each fork child (under alarm(5): a hung child dies
/// of SIGALRM and is reported) creates a monitored cache of its own, acquires,
/// munmaps registered memory, waits for the deregistration and drops it.
#[test]
fn a_fork_child_creates_its_own_monitored_cache() {
    in_child("fork_child_cache", || {
        let stop_flag = Arc::new(AtomicU8::new(0));
        let counts = Arc::new(Counts::default());
        // The monitor is there at all (else skip before forking).
        stop(monitored!(&counts, None));
        let churn: Vec<_> = (0..2)
            .map(|_| {
                let stop_flag = Arc::clone(&stop_flag);
                let counts = Arc::clone(&counts);
                std::thread::spawn(move || {
                    while stop_flag.load(Ordering::SeqCst) == 0 {
                        let Ok(m) = monitored(&counts, None) else { return };
                        let a = map(4 * PAGE);
                        touch(&m.0, a, 4 * PAGE);
                        unmap(a, PAGE);
                        touch(&m.0, a + PAGE, 3 * PAGE);
                        stop(m);
                        unmap(a + PAGE, 3 * PAGE);
                    }
                })
            })
            .collect();
        let mut bad = 0;
        for i in 0..20 {
            // SAFETY: the child uses the library (fork-safe, as the C API
            // promises) and leaves by _exit.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: a deadline for the child.
                unsafe { libc::alarm(5) };
                let counts = Arc::new(Counts::default());
                let Ok(m) = monitored(&counts, None) else {
                    // SAFETY: leaves the child.
                    unsafe { libc::_exit(SKIP) }
                };
                let a = map(4 * PAGE);
                touch(&m.0, a, 4 * PAGE);
                unmap(a, PAGE);
                wait_deregs(&counts, 1);
                stop(m);
                let code = if balanced("the fork child's cache", &counts) { 0 } else { 1 };
                // SAFETY: leaves the child.
                unsafe { libc::_exit(code) };
            }
            let mut status = 0;
            // SAFETY: our own child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            if libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGALRM {
                say(&format!("fork {i}: the child HUNG (killed by its alarm after 5 s)\n"));
                bad += 1;
            } else if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
                say(&format!("fork {i}: the child failed (status {status:#x})\n"));
                bad += 1;
            }
            if bad >= 2 {
                break;
            }
        }
        stop_flag.store(1, Ordering::SeqCst);
        for t in churn {
            t.join().unwrap();
        }
        if bad == 0 && balanced("the parent's caches", &counts) {
            0
        } else {
            1
        }
    });
}
