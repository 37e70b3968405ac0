//! A userfaultfd release monitor (spec.md#S7).
//!
//! [`UffdMonitor`] owns one userfaultfd. [`UffdMonitor::watch`] registers page
//! ranges in write-protect (WP) mode; the kernel then queues an event on the fd
//! whenever the process stops mapping frames inside a watched range, and
//! [`UffdMonitor::read_pending`] turns those events into [`ReleaseEvent`]s.
//!
//! # Why WP mode, and why nothing is ever trapped
//!
//! Registering in MISSING mode would also trap the first touch of every
//! unpopulated (or DONTNEED'ed) page until someone answers it. In WP mode a
//! page is only write-protected after `UFFDIO_WRITEPROTECT` with
//! `UFFDIO_WRITEPROTECT_MODE_WP`, which this module never issues, and we do not
//! request `UFFD_FEATURE_WP_UNPOPULATED`/`WP_ASYNC`. So reads and writes of
//! watched memory run at full speed; only the non-cooperative *events* below
//! are delivered. Should a page-fault message arrive anyway (something else
//! write-protected a page), `read_pending` resolves it at once, see
//! [`UffdMonitor::read_pending`].
//!
//! # Events (measured on Linux 6.18; see the tests)
//!
//! | release                          | kernel message(s)                      | [`ReleaseEvent`]                       |
//! |----------------------------------|----------------------------------------|----------------------------------------|
//! | `munmap(a, n)`                   | `UNMAP [a, a+n)`                       | `Munmap [a, a+n)`                      |
//! | `madvise(DONTNEED / FREE)`       | `REMOVE [a, a+n)` (clipped per VMA)    | `MadviseDontneed [a, a+n)`             |
//! | `madvise(REMOVE)` (shmem)        | `REMOVE [a, a+n)`                      | `MadviseDontneed [a, a+n)`             |
//! | `mremap` that moves              | `REMAP from→to len`, then `UNMAP` src  | `MremapSource [from, from+len)`, then `Munmap [from, from+len)` |
//! | `mremap` shrink in place         | `UNMAP [a+new, a+old)`                 | `Munmap` of the tail                   |
//! | `mmap(MAP_FIXED)` over a watch   | `UNMAP` of the replaced range          | `Munmap`                               |
//! | `free()` of an mmap-served chunk | `UNMAP` of the whole chunk             | `Munmap` (wider than the watched part) |
//!
//! SysV shared memory (`shmat`) cannot be watched at all: `UFFDIO_REGISTER`
//! refuses it (EINVAL: its mappings are not shmem's to userfaultfd), so its
//! `shmdt` is never seen. memfd and `MAP_SHARED|MAP_ANONYMOUS` memory is
//! shmem and is watched like private memory.
//!
//! The kernel does not say *which* call produced a message: DONTNEED, FREE and
//! REMOVE all arrive as `UFFD_EVENT_REMOVE`, and munmap, an mremap shrink, a
//! MAP_FIXED replacement (and, by the kernel source, a brk shrink; not tested
//! here) all arrive as `UFFD_EVENT_UNMAP`. We
//! report them as [`ReleaseKind::MadviseDontneed`] and [`ReleaseKind::Munmap`]
//! respectively; the cache treats every kind the same way (the frames behind
//! the range are gone), so nothing is lost. An UNMAP range is the range the
//! caller unmapped, which may be wider than the watched pages. After a moving
//! mremap the destination stays watched (the registration moves with the VMA).
//!
//! # Blocking: who waits for whom
//!
//! A thread that releases watched memory blocks in the kernel until some thread
//! *reads* the event (not until it is applied). This is what lets the cache
//! apply an event before the releasing thread can reuse the address: the cache
//! calls [`UffdMonitor::read_pending`] under its own lock, and reads here never
//! block. Consequences for callers:
//! - no thread may release watched memory while it is the only thread that
//!   would read the events, e.g. while it holds the cache lock (reads happen
//!   under that lock) — that thread would wait for itself forever. Beware that
//!   even `free()` of a small allocation can `madvise`/`brk`-shrink heap pages
//!   that share a page with a watched buffer;
//! - a monitor thread should only `poll` ([`UffdMonitor::wait_readable`] or
//!   [`UffdMonitor::raw_fd`]) and call into the cache, never release memory.
//!
//! When the event is queued, relative to the release (tested):
//! - REMOVE (madvise) is queued *before* the pages are dropped: while it is
//!   unread the old frames are still mapped, so there is no window.
//! - UNMAP (munmap, mremap, MAP_FIXED) and REMAP are queued *after* the
//!   mapping changed and the mm lock was dropped. While the event is unread,
//!   another thread can already map new memory at the same address. So the
//!   cache must drain [`UffdMonitor::read_pending`] before every lookup, and
//!   even then a tiny window remains in the kernel (between the unmap and the
//!   queueing of its event) in which a lookup can find nothing pending for an
//!   address that was already unmapped and mapped again.
//!
//! Dropping the monitor closes the fd, which unregisters every range and wakes
//! any thread still waiting for its event to be read.
//!
//! A forked child inherits no registration (we do not request
//! `UFFD_FEATURE_EVENT_FORK`, which would also need `CAP_SYS_PTRACE`): it must
//! open its own monitor.

use mrcache_types::{Range, ReleaseEvent, ReleaseKind};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// Kernel ABI of userfaultfd (uffd/sys.rs).
mod sys;

/// The features this monitor needs. `PAGEFAULT_FLAG_WP` is how the kernel says
/// it supports `UFFDIO_REGISTER_MODE_WP` at all.
pub const REQUIRED_FEATURES: u64 =
    sys::UFFD_FEATURE_EVENT_UNMAP | sys::UFFD_FEATURE_EVENT_REMOVE | sys::UFFD_FEATURE_EVENT_REMAP | sys::UFFD_FEATURE_PAGEFAULT_FLAG_WP;

/// Names of the set bits of a userfaultfd feature mask, joined by `|`.
pub fn feature_names(mask: u64) -> String {
    let mut names = Vec::new();
    for bit in 0..64 {
        if mask & (1 << bit) != 0 {
            match sys::FEATURE_NAMES.get(bit) {
                Some(n) => names.push((*n).to_string()),
                None => names.push(format!("bit{bit}")),
            }
        }
    }
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join("|")
    }
}

fn os_err(errno: &i32) -> io::Error {
    io::Error::from_raw_os_error(*errno)
}

fn last_errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// Why a range could not be registered, in words, from the errno of
/// `UFFDIO_REGISTER` (fs/userfaultfd.c, userfaultfd_register()).
fn unwatchable_reason(errno: &i32) -> &'static str {
    match *errno {
        libc::EINVAL => {
            "the range holds a mapping userfaultfd cannot watch (SysV shared memory from shmat; a \
             file mapping, MAP_SHARED or MAP_PRIVATE, that is not shmem/tmpfs or hugetlbfs; a \
             hugetlbfs range not aligned to its huge page size; a VM_DROPPABLE mapping) or no mapping \
             at all"
        }
        libc::ENOMEM => {
            "nothing is mapped at or after the range start, or splitting mappings would exceed \
             vm.max_map_count"
        }
        libc::EPERM => "a mapping in the range can never become writable (e.g. a file opened read-only)",
        libc::EBUSY => "the range is already watched by another userfaultfd",
        _ => "unexpected error",
    }
}

/// [`UffdError::Unwatchable`]'s text after its range: the refused mapping
/// by name for EINVAL if `/proc/self/maps` shows one in the range, else the
/// errno's reasons.
fn unwatchable_text(range: &Range, errno: &i32) -> String {
    if *errno == libc::EINVAL {
        let page = crate::mem::page_size();
        let start = range.addr & !(page - 1);
        let end = range.end().checked_next_multiple_of(page).unwrap_or(u64::MAX);
        let maps = proc_self_maps();
        if let Some(named) = maps.and_then(|maps| refused_mapping(&String::from_utf8_lossy(&maps), start, end)) {
            return named;
        }
    }
    format!("{} ({})", unwatchable_reason(errno), os_err(errno))
}

/// The mapping in `[start, end)` that userfaultfd refuses (EINVAL), named
/// from `maps` (the text of `/proc/self/maps`): SysV shared memory (a
/// `shmat` segment shows as `/SYSV%08x (deleted)`) or a file mapping (its
/// path), the first in address order. Anonymous memory, shmem (memfd,
/// `MAP_SHARED|MAP_ANONYMOUS`: `/memfd:...`, `/dev/zero (deleted)`) and
/// anonymous huge pages can be watched and are skipped; `None` if nothing
/// else lies in the range. A file on tmpfs is shmem too, but shows as any
/// file does: named only if the kernel refused the range, where it is the
/// likely culprit unless a SysV segment comes after it.
pub(crate) fn refused_mapping(maps: &str, start: u64, end: u64) -> Option<String> {
    let mut file = None;
    for line in maps.lines() {
        // `start-end perms offset dev inode [path]`, the path padded with spaces.
        let mut rest = line;
        let mut fields = [""; 5];
        for f in &mut fields {
            rest = rest.trim_start();
            let at = rest.find(' ').unwrap_or(rest.len());
            *f = &rest[..at];
            rest = &rest[at..];
        }
        let path = rest.trim();
        let Some((a, b)) = fields[0].split_once('-') else { continue };
        let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else { continue };
        if b <= start || a >= end {
            continue;
        }
        let anonymous = fields[4] == "0" || path.is_empty() || path.starts_with('[');
        let shmem = path.starts_with("/memfd:") || path == "/dev/zero (deleted)" || path == "/anon_hugepage (deleted)";
        if path.starts_with("/SYSV") {
            return Some("SysV shared memory (shmat); the userfaultfd monitor cannot see its releases".to_string());
        }
        if !anonymous && !shmem && file.is_none() {
            file = Some(format!("a file mapping ({path})"));
        }
    }
    file
}

/// The text of `/proc/self/maps`, read with raw system calls: libc's
/// `open`, `read` and `close` are cancellation points, and this runs on the
/// acquiring application thread, inside the library's frames.
fn proc_self_maps() -> Option<Vec<u8>> {
    // SAFETY: openat(2) of a NUL-terminated path; returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_openat, libc::AT_FDCWD, c"/proc/self/maps".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let mut text = Vec::new();
    let mut chunk = [0u8; 4096];
    let complete = loop {
        // SAFETY: read(2) into `chunk`, which has `chunk.len()` writable bytes.
        let n = unsafe { libc::syscall(libc::SYS_read, fd, chunk.as_mut_ptr(), chunk.len()) };
        match n {
            0 => break true,
            n if n > 0 => text.extend_from_slice(&chunk[..n as usize]),
            _ if last_errno() == libc::EINTR => {}
            _ => break false,
        }
    };
    // SAFETY: closes the fd opened above, once.
    unsafe { libc::syscall(libc::SYS_close, fd) };
    complete.then_some(text)
}

/// What went wrong, one variant per failing call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UffdError {
    /// The `userfaultfd()` syscall failed (also after retrying with
    /// `UFFD_USER_MODE_ONLY` when the first attempt gave EPERM).
    #[error(
        "userfaultfd() failed: {} (ENOSYS: running under valgrind, which does not implement \
         userfaultfd, or a kernel without CONFIG_USERFAULTFD; EPERM: blocked by seccomp, or \
         vm.unprivileged_userfaultfd=0 without CAP_SYS_PTRACE)",
        os_err(.errno)
    )]
    Open { errno: i32 },
    /// The `UFFDIO_API` handshake failed for a reason other than missing features.
    #[error("UFFDIO_API handshake failed: {}", os_err(.errno))]
    Api { errno: i32 },
    /// The kernel lacks features the monitor needs.
    #[error(
        "userfaultfd lacks required features {} (kernel offers {})",
        feature_names(*.missing),
        feature_names(*.available)
    )]
    MissingFeatures { missing: u64, available: u64 },
    /// `UFFDIO_REGISTER` failed for a reason that is not about the range.
    #[error("UFFDIO_REGISTER of {range} failed: {}", os_err(.errno))]
    Register { range: Range, errno: i32 },
    /// The range (page-aligned outwards) cannot be watched. For EINVAL
    /// the message names the mapping the kernel refused (SysV shared
    /// memory, a file mapping) when `/proc/self/maps` shows one: it is read
    /// when the message is made (see `refused_mapping`).
    #[error("cannot watch {range}: {}", unwatchable_text(.range, .errno))]
    Unwatchable { range: Range, errno: i32 },
    /// `UFFDIO_UNREGISTER` failed for a reason other than the range being gone.
    #[error("UFFDIO_UNREGISTER of {range} failed: {}", os_err(.errno))]
    Unregister { range: Range, errno: i32 },
    /// `read()` of the userfaultfd failed (other than EAGAIN).
    #[error("read() of the userfaultfd failed: {}", os_err(.errno))]
    Read { errno: i32 },
    /// `poll()` of the userfaultfd failed (POLLERR/POLLNVAL are reported as EIO/EBADF).
    #[error("poll() of the userfaultfd failed: {}", os_err(.errno))]
    Poll { errno: i32 },
    /// The cache already has an event source; one monitor per cache.
    #[error("the cache already has an event source (one monitor per cache)")]
    AlreadyMonitored,
    /// The monitor thread could not be started.
    #[error("cannot start the monitor thread: {}", os_err(.errno))]
    Thread { errno: i32 },
    /// The madvise proof (spec.md#S7.5) has no signal: the configured one is
    /// taken by the application, or invalid.
    #[error(
        "the userfaultfd monitor cannot prove madvise returned: signal {signal} {} (spec.md S7.5; \
         choose a free real-time signal with MRCACHE_PROOF_SIGNAL)",
        if *.taken { "already has a handler or is ignored in this process" } else { "is not a usable real-time signal" }
    )]
    ProofSignal { signal: i32, taken: bool },
}

/// Counters of messages that were not release events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UffdStats {
    /// Page-fault messages answered (WP cleared or thread woken).
    pub faults_resolved: u64,
    /// Page-fault messages whose UFFDIO_WRITEPROTECT and UFFDIO_WAKE both failed.
    pub faults_unresolved: u64,
    /// Messages of an unexpected type (e.g. FORK), dropped.
    pub ignored_messages: u64,
}

/// A userfaultfd watching ranges in WP mode for release events. See the
/// module documentation. `Send + Sync`; all methods take `&self`.
#[derive(Debug)]
//= spec.md#S7.4
pub struct UffdMonitor {
    /// Closed on drop (OwnedFd), which unregisters every watched range and
    /// wakes threads waiting for their event to be read.
    fd: OwnedFd,
    page_size: u64,
    available_features: u64,
    user_mode_only: bool,
    faults_resolved: AtomicU64,
    faults_unresolved: AtomicU64,
    ignored_messages: AtomicU64,
}

/// Messages read per `read()` call.
const BATCH: usize = 16;

/// Messages one [`UffdMonitor::read_into`] reads at most.
pub const READ_MESSAGES: usize = 256;

/// Room for one [`UffdMonitor::read_into`]: plain memory the caller owns
/// (the process monitor's reader keeps one on its stack for its life).
pub struct MessageBuffer([sys::UffdMsg; READ_MESSAGES]);

impl Default for MessageBuffer {
    fn default() -> Self {
        MessageBuffer([sys::UffdMsg::default(); READ_MESSAGES])
    }
}
const MSG_SIZE: usize = std::mem::size_of::<sys::UffdMsg>();

fn userfaultfd(extra_flags: libc::c_int) -> Result<OwnedFd, i32> {
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK | extra_flags;
    // SAFETY: userfaultfd(2) takes one int flags argument and returns a new fd
    // or -1; it touches no memory of ours.
    let rc = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if rc < 0 {
        return Err(last_errno());
    }
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as RawFd) })
}

/// `UFFDIO_API` on a fresh fd. Returns the features the kernel offers.
fn api_handshake(fd: &OwnedFd, features: u64) -> Result<u64, i32> {
    let mut api = sys::UffdioApi { api: sys::UFFD_API, features, ioctls: 0 };
    // SAFETY: UFFDIO_API reads and writes one `struct uffdio_api`, which `api`
    // is (repr(C), same layout), valid and exclusively borrowed for the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), sys::UFFDIO_API as _, &mut api as *mut sys::UffdioApi) };
    if rc != 0 {
        return Err(last_errno());
    }
    Ok(api.features)
}

impl UffdMonitor {
    /// Opens a userfaultfd (`O_CLOEXEC | O_NONBLOCK`; with `UFFD_USER_MODE_ONLY`
    /// if the plain call is refused with EPERM, as for unprivileged users when
    /// vm.unprivileged_userfaultfd=0) and enables [`REQUIRED_FEATURES`].
    pub fn open() -> Result<Self, UffdError> {
        match userfaultfd(0) {
            Ok(fd) => Self::from_fd(fd, false, REQUIRED_FEATURES),
            Err(libc::EPERM) => {
                let fd = userfaultfd(sys::UFFD_USER_MODE_ONLY).map_err(|errno| UffdError::Open { errno })?;
                Self::from_fd(fd, true, REQUIRED_FEATURES)
            }
            Err(errno) => Err(UffdError::Open { errno }),
        }
    }

    /// Like [`open`](Self::open) but always with `UFFD_USER_MODE_ONLY`. Such a
    /// fd gets the same release events (only faults raised from kernel mode
    /// are excluded, and we want no faults at all).
    pub fn open_user_mode_only() -> Result<Self, UffdError> {
        let fd = userfaultfd(sys::UFFD_USER_MODE_ONLY).map_err(|errno| UffdError::Open { errno })?;
        Self::from_fd(fd, true, REQUIRED_FEATURES)
    }

    /// Handshake on `fd`, enabling `required` (always [`REQUIRED_FEATURES`]
    /// outside tests).
    fn from_fd(fd: OwnedFd, user_mode_only: bool, required: u64) -> Result<Self, UffdError> {
        let available_features = match api_handshake(&fd, required) {
            Ok(features) => features,
            Err(libc::EINVAL) => {
                // Either the API version or some feature is unsupported. The
                // handshake can be done once per fd, so ask a second fd what
                // the kernel offers.
                let flags = if user_mode_only { sys::UFFD_USER_MODE_ONLY } else { 0 };
                let available = userfaultfd(flags).ok().and_then(|probe| api_handshake(&probe, 0).ok());
                return Err(match available {
                    Some(available) if required & !available != 0 => {
                        UffdError::MissingFeatures { missing: required & !available, available }
                    }
                    _ => UffdError::Api { errno: libc::EINVAL },
                });
            }
            Err(errno) => return Err(UffdError::Api { errno }),
        };
        // The kernel echoes every feature it offers; it rejects requests for
        // features it lacks, so this only guards against odd kernels.
        let missing = required & !available_features;
        if missing != 0 {
            return Err(UffdError::MissingFeatures { missing, available: available_features });
        }
        Ok(UffdMonitor {
            fd,
            page_size: crate::mem::page_size(),
            available_features,
            user_mode_only,
            faults_resolved: AtomicU64::new(0),
            faults_unresolved: AtomicU64::new(0),
            ignored_messages: AtomicU64::new(0),
        })
    }

    /// The features the kernel offers (a superset of those enabled, which are
    /// [`REQUIRED_FEATURES`]).
    pub fn available_features(&self) -> u64 {
        self.available_features
    }

    /// Whether the fd was opened with `UFFD_USER_MODE_ONLY`.
    pub fn is_user_mode_only(&self) -> bool {
        self.user_mode_only
    }

    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// The fd, for `poll`/`epoll` in a monitor thread. Readable (POLLIN) when
    /// a message is pending. Do not read from it directly; do not close it.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    pub fn stats(&self) -> UffdStats {
        UffdStats {
            faults_resolved: self.faults_resolved.load(Ordering::Relaxed),
            faults_unresolved: self.faults_unresolved.load(Ordering::Relaxed),
            ignored_messages: self.ignored_messages.load(Ordering::Relaxed),
        }
    }

    /// `range` widened outwards to whole pages, as a `uffdio_range`.
    fn page_range(&self, range: Range) -> Option<sys::UffdioRange> {
        let mask = self.page_size - 1;
        let start = range.addr & !mask;
        let end = range.end().checked_next_multiple_of(self.page_size)?;
        Some(sys::UffdioRange { start, len: end - start })
    }

    /// Watches the pages of `range` (widened outwards to page boundaries) in
    /// WP mode.
    ///
    /// - Watching pages that are already (partly) watched by this monitor
    ///   succeeds: the kernel treats it as a no-op for those pages. Watches are
    ///   not counted: one [`unwatch`](Self::unwatch) ends them all.
    /// - Unmapped holes *inside* the range are skipped silently by the kernel
    ///   (pages mapped there later are not watched); a range with no mapping at
    ///   all fails.
    /// - Ranges that cannot be watched give [`UffdError::Unwatchable`] with the
    ///   errno (EINVAL: SysV shared memory from `shmat`, whose mappings are not
    ///   shmem's to userfaultfd, or a file mapping that is not shmem/hugetlbfs,
    ///   e.g. a MAP_SHARED or MAP_PRIVATE ext4 file, or nothing mapped; ENOMEM: nothing
    ///   mapped at or after the start, or vm.max_map_count reached; EPERM: not
    ///   writable-capable; EBUSY: watched by another userfaultfd). The whole
    ///   call fails then: the kernel registers nothing.
    /// - Each watch may split a VMA in up to three: watching many small ranges
    ///   consumes VMAs (adjacent watched ranges merge again).
    pub fn watch(&self, range: Range) -> Result<(), UffdError> {
        let Some(r) = self.page_range(range) else {
            return Err(UffdError::Unwatchable { range, errno: libc::EINVAL });
        };
        let mut reg = sys::UffdioRegister { range: r, mode: sys::UFFDIO_REGISTER_MODE_WP, ioctls: 0 };
        // SAFETY: UFFDIO_REGISTER reads and writes one `struct uffdio_register`,
        // which `reg` is (repr(C)), valid and exclusively borrowed. It changes
        // VMA flags only; no memory we reference is affected.
        let rc = unsafe { libc::ioctl(self.raw_fd(), sys::UFFDIO_REGISTER as _, &mut reg as *mut sys::UffdioRegister) };
        if rc == 0 {
            return Ok(());
        }
        match last_errno() {
            errno @ (libc::EINVAL | libc::ENOMEM | libc::EPERM | libc::EBUSY) => Err(UffdError::Unwatchable { range, errno }),
            errno => Err(UffdError::Register { range, errno }),
        }
    }

    /// Stops watching the pages of `range` (widened outwards to page
    /// boundaries), whoever watched them.
    ///
    /// Ranges that are already gone are fine: EINVAL (no mapping in the range,
    /// or a mapping that was never watchable), ENOMEM (nothing mapped at or
    /// after the start) and ENOENT are treated as success. Caveat: if the
    /// range now also holds an unwatchable mapping (say a file mapped into a
    /// hole), the kernel refuses the whole call with EINVAL and the watched
    /// parts stay watched; that costs spurious events later, never a missed one.
    pub fn unwatch(&self, range: Range) -> Result<(), UffdError> {
        let Some(mut r) = self.page_range(range) else {
            return Ok(());
        };
        // SAFETY: UFFDIO_UNREGISTER reads one `struct uffdio_range`, which `r`
        // is (repr(C)), valid for the call. It only changes VMA flags.
        let rc = unsafe { libc::ioctl(self.raw_fd(), sys::UFFDIO_UNREGISTER as _, &mut r as *mut sys::UffdioRange) };
        if rc == 0 {
            return Ok(());
        }
        match last_errno() {
            libc::EINVAL | libc::ENOMEM | libc::ENOENT => Ok(()),
            errno => Err(UffdError::Unregister { range, errno }),
        }
    }

    /// Waits up to `timeout_ms` (-1: forever, 0: just check) for a message.
    /// Reads nothing, so releasing threads stay blocked until
    /// [`read_pending`](Self::read_pending). `Ok(false)` on timeout or when a
    /// signal interrupted the wait.
    pub fn wait_readable(&self, timeout_ms: i32) -> Result<bool, UffdError> {
        self.wait_readable_or(-1, timeout_ms)
    }

    /// [`Self::wait_readable`], also returning early (with `Ok(false)`) when
    /// `other` is readable (a negative `other` is ignored by poll).
    pub fn wait_readable_or(&self, other: RawFd, timeout_ms: i32) -> Result<bool, UffdError> {
        let mut pfds = [
            libc::pollfd { fd: self.raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: other, events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: `pfds` is two valid pollfds and we pass nfds = 2.
        let rc = unsafe { libc::poll(pfds.as_mut_ptr(), 2, timeout_ms) };
        let pfd = pfds[0];
        if rc < 0 {
            return match last_errno() {
                libc::EINTR => Ok(false),
                errno => Err(UffdError::Poll { errno }),
            };
        }
        if rc == 0 {
            return Ok(false);
        }
        if pfd.revents & libc::POLLIN != 0 {
            return Ok(true);
        }
        if pfd.revents & libc::POLLNVAL != 0 {
            return Err(UffdError::Poll { errno: libc::EBADF });
        }
        if pfd.revents & (libc::POLLERR | libc::POLLHUP) != 0 {
            return Err(UffdError::Poll { errno: libc::EIO });
        }
        Ok(false)
    }

    /// Reads up to `max` pending messages without blocking and appends the
    /// release events among them to `out`. Returns how many events were
    /// appended; `Ok(0)` when nothing is pending (EAGAIN) or `max` is 0.
    ///
    /// Each message read lets the thread that caused it continue (for a
    /// moving mremap the thread then raises the UNMAP of the source, so that
    /// one arrives on a later call).
    ///
    /// Page-fault messages are not events. In WP mode they only occur if some
    /// page was write-protected with `UFFDIO_WRITEPROTECT` (we never do). The
    /// faulting thread is blocked until answered, so we answer at once: clear
    /// WP on that page with `UFFDIO_WRITEPROTECT` (mode 0, which also wakes
    /// it), or, if that fails or the fault is not a WP fault, `UFFDIO_WAKE`.
    /// They count towards `max` and show in [`stats`](Self::stats). Other
    /// message types (FORK, never requested) are dropped and counted.
    ///
    /// An error is returned only when the first `read()` fails; a later
    /// failure ends the call with the events already appended.
    pub fn read_pending(&self, out: &mut Vec<ReleaseEvent>, max: usize) -> Result<usize, UffdError> {
        let mut buf = [sys::UffdMsg::default(); BATCH];
        let mut read_msgs = 0usize;
        let mut appended = 0usize;
        while read_msgs < max {
            let want = (max - read_msgs).min(BATCH);
            // SAFETY: `buf` is BATCH >= `want` plain-old-data messages, so
            // `want * MSG_SIZE` bytes are writable; the kernel writes whole
            // `struct uffd_msg`s of MSG_SIZE bytes.
            let n = unsafe { libc::read(self.raw_fd(), buf.as_mut_ptr().cast(), want * MSG_SIZE) };
            if n < 0 {
                match last_errno() {
                    // Nothing (more) pending; or a signal: the caller polls again.
                    libc::EAGAIN | libc::EINTR => break,
                    errno if read_msgs == 0 => return Err(UffdError::Read { errno }),
                    _ => break,
                }
            }
            let got = n as usize / MSG_SIZE;
            if got == 0 {
                break;
            }
            for msg in &buf[..got] {
                if let Some(ev) = self.convert(msg) {
                    out.push(ev);
                    appended += 1;
                }
            }
            read_msgs += got;
            if got < want {
                break; // the kernel returned all it had
            }
        }
        Ok(appended)
    }

    /// One non-blocking `read()` of up to `buf.len()` messages into `buf`,
    /// calling `each` with every release event among them. Allocates nothing
    /// and takes no lock: the process monitor's reader uses it (spec.md#M1,
    /// M6). Page faults are answered as in [`Self::read_pending`]. Returns
    /// the messages read: 0 when nothing is pending (EAGAIN) or a signal
    /// interrupted the call.
    pub fn read_into(&self, buf: &mut MessageBuffer, mut each: impl FnMut(ReleaseEvent)) -> Result<usize, UffdError> {
        // SAFETY: `buf.0` is READ_MESSAGES plain-old-data messages, so
        // `READ_MESSAGES * MSG_SIZE` bytes are writable; the kernel writes
        // whole `struct uffd_msg`s of MSG_SIZE bytes.
        let n = unsafe { libc::read(self.raw_fd(), buf.0.as_mut_ptr().cast(), READ_MESSAGES * MSG_SIZE) };
        if n < 0 {
            return match last_errno() {
                libc::EAGAIN | libc::EINTR => Ok(0),
                errno => Err(UffdError::Read { errno }),
            };
        }
        let got = n as usize / MSG_SIZE;
        for msg in &buf.0[..got] {
            if let Some(ev) = self.convert(msg) {
                each(ev);
            }
        }
        Ok(got)
    }

    //= spec.md#S7.1
    fn convert(&self, msg: &sys::UffdMsg) -> Option<ReleaseEvent> {
        let [a0, a1, a2] = msg.arg;
        let span = |start: u64, end: u64| (end > start).then(|| Range { addr: start, len: end - start });
        match msg.event {
            sys::UFFD_EVENT_UNMAP => span(a0, a1).map(|range| ReleaseEvent::of(ReleaseKind::Munmap, range)),
            // DONTNEED, FREE and REMOVE are indistinguishable here.
            sys::UFFD_EVENT_REMOVE => span(a0, a1).map(|range| ReleaseEvent::of(ReleaseKind::MadviseDontneed, range)),
            // from = a0, to = a1, len = a2: the old range no longer maps those frames.
            sys::UFFD_EVENT_REMAP => span(a0, a0.checked_add(a2)?).map(|range| ReleaseEvent::of(ReleaseKind::MremapSource, range)),
            sys::UFFD_EVENT_PAGEFAULT => {
                self.resolve_fault(a0, a1);
                None
            }
            // UFFD_EVENT_FORK (0x13) is never requested; anything else is unknown.
            _ => {
                self.ignored_messages.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Lets the thread blocked on a fault at `address` go on (see read_pending).
    fn resolve_fault(&self, flags: u64, address: u64) {
        let page = sys::UffdioRange { start: address & !(self.page_size - 1), len: self.page_size };
        if flags & sys::UFFD_PAGEFAULT_FLAG_WP != 0 {
            let mut wp = sys::UffdioWriteprotect { range: sys::UffdioRange { start: page.start, len: page.len }, mode: 0 };
            // SAFETY: UFFDIO_WRITEPROTECT reads and writes one `struct
            // uffdio_writeprotect`, which `wp` is (repr(C)). Mode 0 removes
            // write protection from one page of the faulting process's own
            // mapping and wakes the waiter: it never touches memory we use.
            let rc = unsafe { libc::ioctl(self.raw_fd(), sys::UFFDIO_WRITEPROTECT as _, &mut wp as *mut sys::UffdioWriteprotect) };
            if rc == 0 {
                self.faults_resolved.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        let mut wake = page;
        // SAFETY: UFFDIO_WAKE reads one `struct uffdio_range`, which `wake` is.
        let rc = unsafe { libc::ioctl(self.raw_fd(), sys::UFFDIO_WAKE as _, &mut wake as *mut sys::UffdioRange) };
        if rc == 0 {
            self.faults_resolved.fetch_add(1, Ordering::Relaxed);
        } else {
            self.faults_unresolved.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests;
