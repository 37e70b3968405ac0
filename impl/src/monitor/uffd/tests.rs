//! Real memory, real kernel. Every release of watched memory runs in its
//! own thread (it blocks until its event is read); the test thread reads.
//! Every wait is bounded; on a failed assertion the monitor is dropped
//! while unwinding, which wakes any thread still blocked.

use super::*;
use std::ptr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(5);

fn page() -> u64 {
    crate::mem::page_size()
}

fn range(addr: u64, len: u64) -> Range {
    Range::new(addr, len).unwrap()
}

fn ev(kind: ReleaseKind, addr: u64, len: u64) -> ReleaseEvent {
    ReleaseEvent::of(kind, range(addr, len))
}

/// Maps `pages` anonymous pages (`flags`: `MAP_PRIVATE` or `MAP_SHARED`,
/// with `MAP_ANONYMOUS`); touches them if `touch`.
fn map_anon_with(pages: u64, flags: libc::c_int, touch: bool) -> u64 {
    let len = pages * page();
    let a = if flags & libc::MAP_SHARED != 0 {
        // SAFETY: a fresh shared anonymous mapping at a kernel-chosen address.
        let p = unsafe { libc::mmap(ptr::null_mut(), len as usize, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
        assert_ne!(p, libc::MAP_FAILED, "mmap: {}", io::Error::last_os_error());
        p as u64
    } else {
        crate::mem::map_anon(len, flags & !(libc::MAP_PRIVATE | libc::MAP_ANONYMOUS)).unwrap()
    };
    if touch {
        // SAFETY: `a` is a fresh writable mapping of `len` bytes.
        unsafe { ptr::write_bytes(a as *mut u8, 0xab, len as usize) };
    }
    a
}

fn map_anon(pages: u64) -> u64 {
    map_anon_with(pages, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, true)
}

/// A monitor, and the page size.
fn monitor() -> (UffdMonitor, u64) {
    (UffdMonitor::open().unwrap(), page())
}

/// A monitor that watches `pages` fresh, touched pages at `a`: `(monitor, a,
/// page size)`.
fn watched(pages: u64) -> (UffdMonitor, u64, u64) {
    let (mon, p) = monitor();
    let a = map_anon(pages);
    mon.watch(range(a, pages * p)).unwrap();
    (mon, a, p)
}

/// munmap from the test thread: only for memory no monitor watches.
///
/// Tests run as threads of one process, so a hole one test unmaps can be
/// mapped by another at once (`mmap` fills holes top-down): no test unmaps a
/// range across a hole it made, or it would unmap the other test's memory
/// (seen once in CI: `read_pending_reads_at_most_max` read an 8-page munmap
/// of another test that had taken one of its regions with it).
fn unmap_unwatched(addr: u64, len: u64) {
    // SAFETY: the tests only unmap mappings they created and no longer use.
    let rc = unsafe { libc::munmap(addr as *mut libc::c_void, len as usize) };
    assert_eq!(rc, 0, "munmap: {}", io::Error::last_os_error());
}

struct Releaser {
    handle: thread::JoinHandle<i64>,
    done: Arc<AtomicBool>,
}

/// Runs `f` (a release; returns the syscall's result) in a new thread.
fn release_in_thread(f: impl FnOnce() -> i64 + Send + 'static) -> Releaser {
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let handle = thread::spawn(move || {
        let r = f();
        d.store(true, Ordering::SeqCst);
        r
    });
    Releaser { handle, done }
}

/// Reads events until the releasing thread has finished (it cannot finish
/// before all its events are read), then joins it. Returns its result and
/// every event read. Panics after TIMEOUT.
fn finish(mon: &UffdMonitor, rel: Releaser) -> (i64, Vec<ReleaseEvent>) {
    let deadline = Instant::now() + TIMEOUT;
    let mut events = Vec::new();
    while !rel.done.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "releasing thread still blocked after {TIMEOUT:?}; read {events:?}");
        if mon.wait_readable(10).unwrap() {
            mon.read_pending(&mut events, 64).unwrap();
        }
    }
    let r = rel.handle.join().unwrap();
    // Nothing is left: the thread waited for each of its events to be read.
    assert_eq!(mon.read_pending(&mut events, 64).unwrap(), 0, "{events:?}");
    (r, events)
}

/// Runs a release in a thread while reading; returns the events.
fn release(mon: &UffdMonitor, f: impl FnOnce() -> i64 + Send + 'static) -> Vec<ReleaseEvent> {
    let (rc, events) = finish(mon, release_in_thread(f));
    assert_eq!(rc, 0, "release call failed");
    events
}

fn munmap_in(mon: &UffdMonitor, addr: u64, len: u64) -> Vec<ReleaseEvent> {
    // SAFETY: the tests only unmap mappings they created and no longer use.
    release(mon, move || unsafe { libc::munmap(addr as *mut libc::c_void, len as usize) } as i64)
}

fn madvise_in(mon: &UffdMonitor, addr: u64, len: u64, advice: libc::c_int) -> Vec<ReleaseEvent> {
    // SAFETY: the tests only discard pages of mappings they own and do not
    // hold references into.
    release(mon, move || unsafe { libc::madvise(addr as *mut libc::c_void, len as usize, advice) } as i64)
}

#[test]
fn monitor_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<UffdMonitor>();
}

#[test]
fn open_enables_the_release_events() {
    let mon = UffdMonitor::open().unwrap();
    assert_eq!(mon.available_features() & REQUIRED_FEATURES, REQUIRED_FEATURES);
    eprintln!("offered features: {}", feature_names(mon.available_features()));
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert!(!mon.is_user_mode_only(), "root should not need UFFD_USER_MODE_ONLY");
    }
    assert!(!mon.wait_readable(0).unwrap());
    let mut out = Vec::new();
    assert_eq!(mon.read_pending(&mut out, 16).unwrap(), 0);
    assert_eq!(mon.read_pending(&mut out, 0).unwrap(), 0);
    assert!(out.is_empty());
}

#[test]
fn an_unsupported_feature_is_reported_by_name() {
    let (fd, umo) = match userfaultfd(0) {
        Ok(fd) => (fd, false),
        Err(_) => (userfaultfd(sys::UFFD_USER_MODE_ONLY).unwrap(), true), // unprivileged
    };
    let bogus = 1u64 << 40;
    match UffdMonitor::from_fd(fd, umo, REQUIRED_FEATURES | bogus) {
        Err(e @ UffdError::MissingFeatures { missing, available }) => {
            assert_eq!(missing, bogus);
            assert_eq!(available & REQUIRED_FEATURES, REQUIRED_FEATURES);
            assert!(e.to_string().contains("bit40"), "{e}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn errors_name_the_problem() {
    let e = UffdError::MissingFeatures { missing: REQUIRED_FEATURES, available: 1 << 1 };
    let s = e.to_string();
    assert!(s.contains("EVENT_UNMAP") && s.contains("EVENT_REMOVE") && s.contains("EVENT_FORK"), "{s}");
    let e = UffdError::Unwatchable { range: range(0x1000, 0x1000), errno: libc::EBUSY };
    assert!(e.to_string().contains("another userfaultfd"), "{e}");
}

#[test]
//= spec.md#S1.7
//= spec.md#S7.1
fn munmap_emits_unmap_of_the_unmapped_range() {
    let (mon, a, p) = watched(8);
    let events = munmap_in(&mon, a + 2 * p, 3 * p);
    assert_eq!(events, [ev(ReleaseKind::Munmap, a + 2 * p, 3 * p)]);
    // The rest piece by piece: an munmap across the hole could unmap a
    // mapping another test thread has made in it since (see `unmap_unwatched`).
    assert_eq!(munmap_in(&mon, a, 2 * p), [ev(ReleaseKind::Munmap, a, 2 * p)]);
    assert_eq!(munmap_in(&mon, a + 5 * p, 3 * p), [ev(ReleaseKind::Munmap, a + 5 * p, 3 * p)]);
    // An munmap wider than the watch reports the whole unmapped range.
    let b = map_anon(8);
    mon.watch(range(b + 2 * p, 3 * p)).unwrap();
    assert_eq!(munmap_in(&mon, b, 8 * p), [ev(ReleaseKind::Munmap, b, 8 * p)]);
}

#[test]
fn watch_rounds_outwards_to_pages() {
    let (mon, p) = monitor();
    let a = map_anon(3);
    mon.watch(range(a + p + 100, 10)).unwrap(); // page 1 only
    assert_eq!(munmap_in(&mon, a, p), []);
    assert_eq!(munmap_in(&mon, a + 2 * p, p), []);
    assert_eq!(munmap_in(&mon, a + p, p), [ev(ReleaseKind::Munmap, a + p, p)]);
}

#[test]
fn madvise_dontneed_emits_remove() {
    let (mon, a, p) = watched(8);
    let events = madvise_in(&mon, a + p, 2 * p, libc::MADV_DONTNEED);
    assert_eq!(events, [ev(ReleaseKind::MadviseDontneed, a + p, 2 * p)]);
    // Touching the discarded pages is not trapped in WP mode (it would be
    // in MISSING mode): read and write them from this, the reading, thread.
    // SAFETY: `a + p` is mapped, writable and ours.
    unsafe {
        assert_eq!(ptr::read_volatile((a + p) as *const u8), 0);
        ptr::write_volatile((a + p) as *mut u8, 7);
    }
    assert_eq!(mon.stats(), UffdStats::default());
    // Still watched afterwards.
    assert_eq!(munmap_in(&mon, a, 8 * p), [ev(ReleaseKind::Munmap, a, 8 * p)]);
}

#[test]
fn madvise_free_emits_remove() {
    let (mon, a, p) = watched(8);
    let events = madvise_in(&mon, a + 4 * p, 4 * p, libc::MADV_FREE);
    assert_eq!(events, [ev(ReleaseKind::MadviseDontneed, a + 4 * p, 4 * p)]);
    drop(mon);
    unmap_unwatched(a, 8 * p);
}

#[test]
fn mremap_move_emits_remap_then_unmap_and_the_watch_moves() {
    let (mon, p) = monitor();
    // 12 pages, the first 8 watched: the unwatched tail sits right after
    // the watched VMA, so growing it in place is impossible and it moves.
    let a = map_anon(12);
    mon.watch(range(a, 8 * p)).unwrap();
    let rel = release_in_thread(move || {
        // SAFETY: moves a mapping this test owns; nothing points into it.
        let r = unsafe { libc::mremap(a as *mut libc::c_void, (8 * p) as usize, (16 * p) as usize, libc::MREMAP_MAYMOVE) };
        if r == libc::MAP_FAILED {
            -1
        } else {
            r as i64
        }
    });
    let (b, events) = finish(&mon, rel);
    assert!(b > 0 && b as u64 != a, "mremap did not move: {b:#x}");
    let b = b as u64;
    assert_eq!(events, [ev(ReleaseKind::MremapSource, a, 8 * p), ev(ReleaseKind::Munmap, a, 8 * p)], "moved to {b:#x}");
    // The destination, including the grown part, is watched now.
    assert_eq!(munmap_in(&mon, b, 16 * p), [ev(ReleaseKind::Munmap, b, 16 * p)]);
    drop(mon);
    unmap_unwatched(a + 8 * p, 4 * p);
}

#[test]
fn mremap_shrink_emits_unmap_of_the_tail() {
    let (mon, a, p) = watched(8);
    let rel = release_in_thread(move || {
        // SAFETY: shrinks a mapping this test owns; nothing points into the tail.
        let r = unsafe { libc::mremap(a as *mut libc::c_void, (8 * p) as usize, (3 * p) as usize, 0) };
        r as i64
    });
    let (r, events) = finish(&mon, rel);
    assert_eq!(r as u64, a, "shrinking stays in place");
    assert_eq!(events, [ev(ReleaseKind::Munmap, a + 3 * p, 5 * p)]);
    assert_eq!(munmap_in(&mon, a, 3 * p), [ev(ReleaseKind::Munmap, a, 3 * p)]);
}

#[test]
fn map_fixed_over_a_watch_emits_unmap_and_the_new_mapping_is_unwatched() {
    let (mon, a, p) = watched(8);
    let rel = release_in_thread(move || {
        // SAFETY: replaces pages of a mapping this test owns; nothing points into them.
        let r = unsafe {
            libc::mmap(
                (a + 2 * p) as *mut libc::c_void,
                (3 * p) as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        r as i64
    });
    let (r, events) = finish(&mon, rel);
    assert_eq!(r as u64, a + 2 * p);
    assert_eq!(events, [ev(ReleaseKind::Munmap, a + 2 * p, 3 * p)]);
    assert_eq!(munmap_in(&mon, a + 2 * p, 3 * p), [], "the replacement is not watched");
    // Around the hole, not across it (`unmap_unwatched`).
    assert_eq!(munmap_in(&mon, a, 2 * p), [ev(ReleaseKind::Munmap, a, 2 * p)]);
    assert_eq!(munmap_in(&mon, a + 5 * p, 3 * p), [ev(ReleaseKind::Munmap, a + 5 * p, 3 * p)]);
}

#[test]
fn the_releasing_thread_blocks_until_the_event_is_read() {
    let (mon, a, p) = watched(4);
    // SAFETY: unmaps a mapping this test owns.
    let rel = release_in_thread(move || unsafe { libc::munmap(a as *mut libc::c_void, (4 * p) as usize) } as i64);
    thread::sleep(Duration::from_millis(100));
    assert!(!rel.done.load(Ordering::SeqCst), "munmap returned before its event was read");
    // The releaser may not have reached munmap yet on a loaded machine.
    assert!(mon.wait_readable(10_000).unwrap());
    // Polling does not consume the event.
    thread::sleep(Duration::from_millis(20));
    assert!(!rel.done.load(Ordering::SeqCst));
    let mut events = Vec::new();
    assert_eq!(mon.read_pending(&mut events, 16).unwrap(), 1);
    assert_eq!(events, [ev(ReleaseKind::Munmap, a, 4 * p)]);
    let (rc, more) = finish(&mon, rel);
    assert_eq!((rc, more), (0, vec![]));
}

#[test]
fn dropping_the_monitor_wakes_a_blocked_releaser() {
    let (mon, a, p) = watched(2);
    // SAFETY: unmaps a mapping this test owns.
    let rel = release_in_thread(move || unsafe { libc::munmap(a as *mut libc::c_void, (2 * p) as usize) } as i64);
    thread::sleep(Duration::from_millis(50));
    assert!(!rel.done.load(Ordering::SeqCst));
    drop(mon);
    let deadline = Instant::now() + TIMEOUT;
    while !rel.done.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "closing the fd did not wake the releasing thread");
        thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(rel.handle.join().unwrap(), 0);
}

/// Writes every page of `[a, a+len)` in another thread; asserts it ends
/// promptly without any fault having to be answered.
fn assert_writes_not_trapped(mon: &UffdMonitor, a: u64, len: u64) {
    let rel = release_in_thread(move || {
        // SAFETY: `[a, a+len)` is a writable mapping this test owns.
        unsafe { ptr::write_bytes(a as *mut u8, 0x5a, len as usize) };
        0
    });
    let deadline = Instant::now() + Duration::from_secs(2);
    while !rel.done.load(Ordering::SeqCst) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    let blocked = !rel.done.load(Ordering::SeqCst);
    // Unblock the writer in any case (resolves faults), then judge.
    let (_, events) = finish(mon, rel);
    assert!(!blocked, "a write to a watched page blocked");
    assert_eq!(events, []);
    assert_eq!(mon.stats(), UffdStats::default());
}

#[test]
fn writes_to_watched_pages_are_not_trapped() {
    let (mon, p) = monitor();
    let touched = map_anon(4);
    let fresh = map_anon_with(4, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, false);
    mon.watch(range(touched, 4 * p)).unwrap();
    mon.watch(range(fresh, 4 * p)).unwrap();
    assert_writes_not_trapped(&mon, touched, 4 * p);
    assert_writes_not_trapped(&mon, fresh, 4 * p);
    drop(mon);
    unmap_unwatched(touched, 4 * p);
    unmap_unwatched(fresh, 4 * p);
}

#[test]
fn remove_comes_before_the_pages_go_unmap_after_the_mapping_is_gone() {
    let (mon, a, p) = watched(3);
    // DONTNEED: the REMOVE is queued before the pages are dropped.
    // SAFETY: discards a page of a mapping this test owns.
    let rel = release_in_thread(move || unsafe { libc::madvise(a as *mut libc::c_void, p as usize, libc::MADV_DONTNEED) } as i64);
    assert!(mon.wait_readable(TIMEOUT.as_millis() as i32).unwrap());
    // SAFETY: `a` is mapped and readable.
    assert_eq!(unsafe { ptr::read_volatile(a as *const u8) }, 0xab, "page dropped before its REMOVE was read");
    let (rc, events) = finish(&mon, rel);
    assert_eq!((rc, events), (0, vec![ev(ReleaseKind::MadviseDontneed, a, p)]));
    // SAFETY: as above.
    assert_eq!(unsafe { ptr::read_volatile(a as *const u8) }, 0);

    // munmap: the UNMAP is queued after the mapping is gone, and the
    // address can be mapped again before anybody has read the event.
    let mid = a + p;
    // SAFETY: unmaps a page of a mapping this test owns.
    let rel = release_in_thread(move || unsafe { libc::munmap(mid as *mut libc::c_void, p as usize) } as i64);
    assert!(mon.wait_readable(TIMEOUT.as_millis() as i32).unwrap());
    let mut vec = [0u8; 1];
    // SAFETY: `vec` has room for the one page asked about.
    let rc = unsafe { libc::mincore(mid as *mut libc::c_void, p as usize, vec.as_mut_ptr()) };
    assert_eq!((rc, last_errno()), (-1, libc::ENOMEM), "still mapped while the UNMAP is pending");
    // SAFETY: maps a fresh page into the (one-page) hole just made; fails rather than replace.
    let again = unsafe {
        libc::mmap(
            mid as *mut libc::c_void,
            p as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    assert_eq!(again as u64, mid, "re-mapping the address while its UNMAP is unread");
    let (rc, events) = finish(&mon, rel);
    assert_eq!((rc, events), (0, vec![ev(ReleaseKind::Munmap, mid, p)]));
    drop(mon);
    unmap_unwatched(a, 3 * p);
}

#[test]
fn a_forked_child_is_not_watched() {
    let (mon, a, p) = watched(2);
    // SAFETY: the child only calls the async-signal-safe munmap and _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: in the child: unmaps its copy of the mapping and exits.
        unsafe {
            let rc = libc::munmap(a as *mut libc::c_void, (2 * p) as usize);
            libc::_exit(if rc == 0 { 0 } else { 1 });
        }
    }
    let deadline = Instant::now() + TIMEOUT;
    let mut events = Vec::new();
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child; `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        assert!(Instant::now() < deadline, "child still running");
        // Were the child watched, reading would let it go on.
        if mon.wait_readable(10).unwrap() {
            mon.read_pending(&mut events, 64).unwrap();
        }
    }
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
    assert_eq!(events, []);
    assert_eq!(munmap_in(&mon, a, 2 * p), [ev(ReleaseKind::Munmap, a, 2 * p)], "the parent still is");
}

#[test]
fn a_write_protect_fault_is_answered_by_read_pending() {
    const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0; // linux/userfaultfd.h
    let (mon, a, p) = watched(2);
    // Something other than the monitor write-protects page 0.
    let mut wp = sys::UffdioWriteprotect { range: sys::UffdioRange { start: a, len: p }, mode: UFFDIO_WRITEPROTECT_MODE_WP };
    // SAFETY: `wp` is a valid `struct uffdio_writeprotect` for the call.
    let rc = unsafe { libc::ioctl(mon.raw_fd(), sys::UFFDIO_WRITEPROTECT as _, &mut wp as *mut sys::UffdioWriteprotect) };
    assert_eq!(rc, 0, "UFFDIO_WRITEPROTECT: {}", io::Error::last_os_error());
    let rel = release_in_thread(move || {
        // SAFETY: `a` is a writable page this test owns.
        unsafe { ptr::write_volatile(a as *mut u8, 1) };
        0
    });
    thread::sleep(Duration::from_millis(50));
    assert!(!rel.done.load(Ordering::SeqCst), "the write should wait for the fault to be answered");
    let (_, events) = finish(&mon, rel);
    assert_eq!(events, []);
    assert_eq!(mon.stats(), UffdStats { faults_resolved: 1, ..UffdStats::default() });
    // SAFETY: `a` is readable and ours.
    assert_eq!(unsafe { ptr::read_volatile(a as *const u8) }, 1);
    drop(mon);
    unmap_unwatched(a, 2 * p);
}

#[test]
fn free_of_an_mmap_served_malloc_chunk_emits_unmap_of_the_whole_chunk() {
    let (mon, p) = monitor();
    // 64 MiB is above glibc's largest dynamic mmap threshold (32 MiB), so
    // malloc serves it with its own mmap whatever happened before.
    let size: u64 = 64 << 20;
    // SAFETY: plain malloc; freed below exactly once.
    let m = unsafe { libc::malloc(size as usize) } as u64;
    assert_ne!(m, 0);
    // glibc's chunk header: size field just before the user pointer, bit 1 = IS_MMAPPED.
    // SAFETY: the 8 bytes before a glibc malloc pointer are its chunk's size field.
    let size_field = unsafe { ptr::read((m - 8) as *const u64) };
    assert_ne!(size_field & 2, 0, "chunk not mmap-served");
    let interior = range(m.next_multiple_of(p) + (1 << 20), 1 << 20);
    mon.watch(interior).unwrap();
    let events = release(&mon, move || {
        // SAFETY: `m` came from malloc above and is not used after this.
        unsafe { libc::free(m as *mut libc::c_void) };
        0
    });
    assert_eq!(events.len(), 1, "{events:?}");
    let e = events[0];
    assert_eq!(e.kind, Some(ReleaseKind::Munmap));
    assert!(e.range.contains(&range(m, size)), "{} does not cover the chunk [{m:#x}+{size:#x})", e.range);
    assert!(e.range.contains(&interior));
    assert_eq!(e.range.addr % p, 0);
    eprintln!("free({m:#x}) of {size:#x} bytes -> {:?} {}", e.kind, e.range);
}

/// Maps 4 pages of an unlinked file in the temp dir with `flags`.
fn map_tmpfile(flags: libc::c_int) -> (u64, bool) {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = std::env::temp_dir();
    let f = std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_TMPFILE).open(&dir).unwrap();
    f.set_len(4 * page()).unwrap();
    // SAFETY: `statfs` is plain old data, written by fstatfs.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and a valid out-pointer.
    assert_eq!(unsafe { libc::fstatfs(f.as_raw_fd(), &mut st) }, 0);
    let on_tmpfs = st.f_type == libc::TMPFS_MAGIC;
    // SAFETY: maps the file we just sized; the mapping keeps its own reference.
    let a = unsafe { libc::mmap(ptr::null_mut(), (4 * page()) as usize, libc::PROT_READ | libc::PROT_WRITE, flags, f.as_raw_fd(), 0) };
    assert_ne!(a, libc::MAP_FAILED);
    (a as u64, on_tmpfs)
}

#[test]
fn file_mappings_on_a_disk_filesystem_are_unwatchable() {
    let (mon, p) = monitor();
    for (name, flags) in [("MAP_SHARED", libc::MAP_SHARED), ("MAP_PRIVATE", libc::MAP_PRIVATE)] {
        let (a, on_tmpfs) = map_tmpfile(flags);
        let r = mon.watch(range(a, 4 * p));
        eprintln!("{name} file mapping (tmpfs: {on_tmpfs}): {r:?}");
        if on_tmpfs {
            // tmpfs is shmem: watchable.
            assert_eq!(r, Ok(()));
            mon.unwatch(range(a, 4 * p)).unwrap();
        } else {
            let e = r.unwrap_err();
            assert_eq!(e, UffdError::Unwatchable { range: range(a, 4 * p), errno: libc::EINVAL });
            assert!(e.to_string().contains("a file mapping (/"), "names the file: {e}");
        }
        unmap_unwatched(a, 4 * p);
    }
}

#[test]
fn shmem_is_watchable_and_madv_remove_emits_remove() {
    let (mon, p) = monitor();
    let a = map_anon_with(4, libc::MAP_SHARED | libc::MAP_ANONYMOUS, true);
    mon.watch(range(a, 4 * p)).unwrap();
    let events = madvise_in(&mon, a + p, p, libc::MADV_REMOVE);
    assert_eq!(events, [ev(ReleaseKind::MadviseDontneed, a + p, p)]);
    let events = madvise_in(&mon, a + 2 * p, p, libc::MADV_DONTNEED);
    assert_eq!(events, [ev(ReleaseKind::MadviseDontneed, a + 2 * p, p)]);
    assert_writes_not_trapped(&mon, a, 4 * p);
    assert_eq!(munmap_in(&mon, a, 4 * p), [ev(ReleaseKind::Munmap, a, 4 * p)]);
}

/// Attaches a fresh SysV segment of `pages` pages, already marked for
/// removal (it goes with its last detach); `None` where SysV IPC is not
/// available (a sandbox without it).
fn shmat_pages(pages: u64) -> Option<u64> {
    // SAFETY: shmget/shmat/shmctl on a private segment of our own; shmat
    // maps it at a kernel-chosen address.
    unsafe {
        let id = libc::shmget(libc::IPC_PRIVATE, (pages * page()) as usize, libc::IPC_CREAT | 0o600);
        if id < 0 {
            eprintln!("shmget: {}: SysV test skipped", io::Error::last_os_error());
            return None;
        }
        let a = libc::shmat(id, ptr::null(), 0);
        libc::shmctl(id, libc::IPC_RMID, ptr::null_mut());
        if a as isize == -1 {
            eprintln!("shmat: {}: SysV test skipped", io::Error::last_os_error());
            return None;
        }
        Some(a as u64)
    }
}

/// SysV shared memory is refused (EINVAL: its mappings are not shmem's to
/// userfaultfd), with a message that names it; memfd memory (shmem) is
/// watched, and its munmap is seen.
#[test]
//= spec.md#S7.1
fn sysv_shared_memory_is_refused_and_memfd_is_watched() {
    let (mon, p) = monitor();
    if let Some(a) = shmat_pages(4) {
        // SAFETY: the attached segment is 4 writable pages.
        unsafe { ptr::write_bytes(a as *mut u8, 1, (4 * p) as usize) };
        let e = mon.watch(range(a + 10, p)).unwrap_err();
        assert_eq!(e, UffdError::Unwatchable { range: range(a + 10, p), errno: libc::EINVAL });
        let text = e.to_string();
        assert!(text.contains("SysV shared memory (shmat)") && text.contains("cannot see its releases"), "{text}");
        assert!(text.starts_with(&format!("cannot watch {}: ", range(a + 10, p))), "{text}");
        // SAFETY: detaches the segment attached above, unwatched.
        assert_eq!(unsafe { libc::shmdt(a as *const libc::c_void) }, 0);
    }
    // SAFETY: memfd_create with a NUL-terminated name; the fd is ours.
    let fd = unsafe { libc::memfd_create(c"mrcache-uffd-test".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
    // SAFETY: sizes our memfd, then maps it shared at a kernel-chosen address.
    let a = unsafe {
        assert_eq!(libc::ftruncate(fd, (4 * p) as libc::off_t), 0);
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let a = libc::mmap(ptr::null_mut(), (4 * p) as usize, prot, libc::MAP_SHARED, fd, 0);
        libc::close(fd);
        assert_ne!(a, libc::MAP_FAILED);
        ptr::write_bytes(a as *mut u8, 1, (4 * p) as usize);
        a as u64
    };
    assert_eq!(mon.watch(range(a, 4 * p)), Ok(()));
    assert_writes_not_trapped(&mon, a, 4 * p);
    assert_eq!(munmap_in(&mon, a, 4 * p), [ev(ReleaseKind::Munmap, a, 4 * p)]);
}

/// The refused mapping is found by its line of /proc/self/maps.
#[test]
fn the_refused_mapping_is_named_from_the_maps() {
    let maps = "\
00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/dbus-daemon
7f0000000000-7f0000004000 rw-p 00000000 00:00 0
7f0000004000-7f0000008000 rw-s 00000000 00:01 2056                       /memfd:buf (deleted)
7f0000008000-7f000000c000 rw-s 00000000 00:01 5                          /dev/zero (deleted)
7f000000c000-7f0000010000 rw-s 00000000 00:01 32789                      /SYSV00000000 (deleted)
7f0000010000-7f0000014000 rw-s 00000000 08:02 99                         /data/my file
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                          [stack]
";
    let sysv = refused_mapping(maps, 0x7f0000000000, 0x7f0000010000).unwrap();
    assert!(sysv.starts_with("SysV shared memory (shmat)"), "{sysv}");
    // The SysV segment is named also after a file mapping in the range.
    assert_eq!(
        refused_mapping(maps, 0x400000, 0x7f000000d000).as_deref(),
        Some("SysV shared memory (shmat); the userfaultfd monitor cannot see its releases")
    );
    assert_eq!(refused_mapping(maps, 0x7f0000010000, 0x7f0000011000).as_deref(), Some("a file mapping (/data/my file)"));
    assert_eq!(refused_mapping(maps, 0x400000, 0x401000).as_deref(), Some("a file mapping (/usr/bin/dbus-daemon)"));
    // Anonymous, memfd, shared anonymous memory and the stack: nothing to name.
    assert_eq!(refused_mapping(maps, 0x7f0000000000, 0x7f000000c000), None);
    assert_eq!(refused_mapping(maps, 0x7ffc00000000, 0x7ffc00001000), None);
    assert_eq!(refused_mapping(maps, 0x1000, 0x2000), None);
}

#[test]
fn unmapped_and_impossible_ranges_are_unwatchable() {
    let (mon, p) = monitor();
    let a = map_anon(4);
    unmap_unwatched(a, 4 * p);
    match mon.watch(range(a, 4 * p)) {
        Err(UffdError::Unwatchable { errno, .. }) => {
            assert!(errno == libc::EINVAL || errno == libc::ENOMEM, "errno {errno}")
        }
        other => panic!("watching an unmapped range: {other:?}"),
    }
    // Beyond the user half of the address space (a Range stops at 2^63).
    let beyond = range((1 << 63) - 2 * p, p);
    assert!(matches!(mon.watch(beyond), Err(UffdError::Unwatchable { .. })));
    // Unwatching what is gone is fine.
    mon.unwatch(range(a, 4 * p)).unwrap();
    mon.unwatch(beyond).unwrap();
}

#[test]
fn a_hole_inside_a_watched_range_is_skipped() {
    let (mon, p) = monitor();
    let a = map_anon(6);
    unmap_unwatched(a + 2 * p, 2 * p);
    let r = mon.watch(range(a, 6 * p));
    eprintln!("watch over a hole: {r:?}");
    assert_eq!(r, Ok(()));
    assert_eq!(munmap_in(&mon, a, 2 * p), [ev(ReleaseKind::Munmap, a, 2 * p)]);
    assert_eq!(munmap_in(&mon, a + 4 * p, 2 * p), [ev(ReleaseKind::Munmap, a + 4 * p, 2 * p)]);
}

#[test]
fn watching_again_is_a_no_op() {
    let (mon, p) = monitor();
    let a = map_anon(8);
    mon.watch(range(a, 4 * p)).unwrap();
    mon.watch(range(a, 4 * p)).unwrap();
    mon.watch(range(a + 2 * p, 6 * p)).unwrap(); // partly watched already
                                                 // One munmap, one event, even across the two watches.
    assert_eq!(munmap_in(&mon, a, 8 * p), [ev(ReleaseKind::Munmap, a, 8 * p)]);
}

#[test]
fn another_userfaultfd_is_refused_with_ebusy() {
    let p = page();
    let first = UffdMonitor::open().unwrap();
    let second = UffdMonitor::open().unwrap();
    let a = map_anon(4);
    first.watch(range(a, 4 * p)).unwrap();
    assert_eq!(second.watch(range(a + p, p)), Err(UffdError::Unwatchable { range: range(a + p, p), errno: libc::EBUSY }));
    drop(first); // closing unregisters
    second.watch(range(a + p, p)).unwrap();
    assert_eq!(munmap_in(&second, a, 4 * p), [ev(ReleaseKind::Munmap, a, 4 * p)]);
}

#[test]
fn unwatch_stops_the_events() {
    let (mon, a, p) = watched(8);
    mon.unwatch(range(a + 2 * p, 2 * p)).unwrap();
    assert_eq!(munmap_in(&mon, a + 2 * p, 2 * p), []);
    assert_eq!(madvise_in(&mon, a, 2 * p, libc::MADV_DONTNEED), [ev(ReleaseKind::MadviseDontneed, a, 2 * p)]);
    // Unwatching a range that is partly gone still works for the rest
    // (unmapped around the hole, not across it: `unmap_unwatched`).
    mon.unwatch(range(a, 8 * p)).unwrap();
    assert_eq!(munmap_in(&mon, a, 2 * p), []);
    assert_eq!(munmap_in(&mon, a + 4 * p, 4 * p), []);
}

#[test]
fn read_pending_reads_at_most_max() {
    let (mon, p) = monitor();
    let regions: Vec<u64> = (0..3).map(|_| map_anon(2)).collect();
    for &a in &regions {
        mon.watch(range(a, 2 * p)).unwrap();
    }
    let rels: Vec<Releaser> = regions
        .iter()
        .map(|&a| {
            // SAFETY: unmaps a mapping this test owns.
            release_in_thread(move || unsafe { libc::munmap(a as *mut libc::c_void, (2 * p) as usize) } as i64)
        })
        .collect();
    // Let all three block with their event queued.
    thread::sleep(Duration::from_millis(100));
    let mut events = Vec::new();
    let deadline = Instant::now() + TIMEOUT;
    while events.len() < 3 && Instant::now() < deadline {
        if mon.wait_readable(10).unwrap() {
            let n = mon.read_pending(&mut events, 1).unwrap();
            assert!(n <= 1);
        }
    }
    for rel in rels {
        let (rc, more) = finish(&mon, rel);
        assert_eq!((rc, more), (0, vec![]));
    }
    events.sort();
    let mut want: Vec<_> = regions.iter().map(|&a| ev(ReleaseKind::Munmap, a, 2 * p)).collect();
    want.sort();
    assert_eq!(events, want);
}

#[test]
fn a_user_mode_only_fd_gets_the_same_events() {
    let p = page();
    let mon = UffdMonitor::open_user_mode_only().unwrap();
    assert!(mon.is_user_mode_only());
    let a = map_anon(4);
    mon.watch(range(a, 4 * p)).unwrap();
    assert_eq!(madvise_in(&mon, a, p, libc::MADV_DONTNEED), [ev(ReleaseKind::MadviseDontneed, a, p)]);
    assert_eq!(munmap_in(&mon, a, 4 * p), [ev(ReleaseKind::Munmap, a, 4 * p)]);
}
