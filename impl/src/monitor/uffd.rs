//! A userfaultfd release monitor (spec.md#S7).
//!
//! [`UffdMonitor`] owns one userfaultfd. [`UffdMonitor::watch`] registers page
//! ranges in write-protect (WP) mode; the kernel then queues an event on the fd
//! whenever the process stops mapping frames inside a watched range, and
//! [`UffdMonitor::read_pending`] turns those events into [`MonitorEvent`]s.
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
//! | release                          | kernel message(s)                      | [`MonitorEvent`]                       |
//! |----------------------------------|----------------------------------------|----------------------------------------|
//! | `munmap(a, n)`                   | `UNMAP [a, a+n)`                       | `Munmap [a, a+n)`                      |
//! | `madvise(DONTNEED / FREE)`       | `REMOVE [a, a+n)` (clipped per VMA)    | `MadviseDontneed [a, a+n)`             |
//! | `madvise(REMOVE)` (shmem)        | `REMOVE [a, a+n)`                      | `MadviseDontneed [a, a+n)`             |
//! | `mremap` that moves              | `REMAP from→to len`, then `UNMAP` src  | `MremapSource [from, from+len)`, then `Munmap [from, from+len)` |
//! | `mremap` shrink in place         | `UNMAP [a+new, a+old)`                 | `Munmap` of the tail                   |
//! | `mmap(MAP_FIXED)` over a watch   | `UNMAP` of the replaced range          | `Munmap`                               |
//! | `free()` of an mmap-served chunk | `UNMAP` of the whole chunk             | `Munmap` (wider than the watched part) |
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

use mrcache_types::{Range, ReleaseKind};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// Kernel ABI of userfaultfd, transcribed from `include/uapi/linux/userfaultfd.h`
/// (libc 0.2 does not define it).
mod sys {
    // ---- ioctl number encoding: include/uapi/asm-generic/ioctl.h ----
    // (powerpc, mips and sparc use 13 size bits and different direction bits:
    // arch/*/include/uapi/asm/ioctl.h.)
    #[cfg(any(
        target_arch = "powerpc",
        target_arch = "powerpc64",
        target_arch = "mips",
        target_arch = "mips32r6",
        target_arch = "mips64",
        target_arch = "mips64r6",
        target_arch = "sparc",
        target_arch = "sparc64"
    ))]
    mod dir {
        pub const READ: u64 = 2;
        pub const WRITE: u64 = 4;
        pub const SIZEBITS: u64 = 13;
    }
    #[cfg(not(any(
        target_arch = "powerpc",
        target_arch = "powerpc64",
        target_arch = "mips",
        target_arch = "mips32r6",
        target_arch = "mips64",
        target_arch = "mips64r6",
        target_arch = "sparc",
        target_arch = "sparc64"
    )))]
    mod dir {
        /// `_IOC_READ`
        pub const READ: u64 = 2;
        /// `_IOC_WRITE`
        pub const WRITE: u64 = 1;
        /// `_IOC_SIZEBITS`
        pub const SIZEBITS: u64 = 14;
    }

    /// `_IOC(dir, type, nr, size)`: nr in bits 0-7, type 8-15, size from 16.
    const fn ioc(d: u64, nr: u64, size: usize) -> u64 {
        (d << (16 + dir::SIZEBITS)) | ((size as u64) << 16) | (UFFDIO << 8) | nr
    }
    const fn iowr(nr: u64, size: usize) -> u64 {
        ioc(dir::READ | dir::WRITE, nr, size)
    }
    const fn ior(nr: u64, size: usize) -> u64 {
        ioc(dir::READ, nr, size)
    }

    /// `#define UFFDIO 0xAA`
    const UFFDIO: u64 = 0xAA;
    /// `#define UFFD_API ((__u64)0xAA)`
    pub const UFFD_API: u64 = 0xAA;
    /// `#define UFFD_USER_MODE_ONLY 1` (flag of the userfaultfd() syscall)
    pub const UFFD_USER_MODE_ONLY: libc::c_int = 1;

    // `#define _UFFDIO_REGISTER (0x00)` etc.
    const _UFFDIO_REGISTER: u64 = 0x00;
    const _UFFDIO_UNREGISTER: u64 = 0x01;
    const _UFFDIO_WAKE: u64 = 0x02;
    const _UFFDIO_WRITEPROTECT: u64 = 0x06;
    const _UFFDIO_API: u64 = 0x3F;

    /// `_IOWR(UFFDIO, _UFFDIO_API, struct uffdio_api)`
    pub const UFFDIO_API: u64 = iowr(_UFFDIO_API, std::mem::size_of::<UffdioApi>());
    /// `_IOWR(UFFDIO, _UFFDIO_REGISTER, struct uffdio_register)`
    pub const UFFDIO_REGISTER: u64 = iowr(_UFFDIO_REGISTER, std::mem::size_of::<UffdioRegister>());
    /// `_IOR(UFFDIO, _UFFDIO_UNREGISTER, struct uffdio_range)`
    pub const UFFDIO_UNREGISTER: u64 = ior(_UFFDIO_UNREGISTER, std::mem::size_of::<UffdioRange>());
    /// `_IOR(UFFDIO, _UFFDIO_WAKE, struct uffdio_range)`
    pub const UFFDIO_WAKE: u64 = ior(_UFFDIO_WAKE, std::mem::size_of::<UffdioRange>());
    /// `_IOWR(UFFDIO, _UFFDIO_WRITEPROTECT, struct uffdio_writeprotect)`
    pub const UFFDIO_WRITEPROTECT: u64 = iowr(_UFFDIO_WRITEPROTECT, std::mem::size_of::<UffdioWriteprotect>());

    // The values the C header produces on x86-64 (checked with gcc).
    #[cfg(target_arch = "x86_64")]
    const _: () = {
        assert!(UFFDIO_API == 0xc018_aa3f);
        assert!(UFFDIO_REGISTER == 0xc020_aa00);
        assert!(UFFDIO_UNREGISTER == 0x8010_aa01);
        assert!(UFFDIO_WAKE == 0x8010_aa02);
        assert!(UFFDIO_WRITEPROTECT == 0xc018_aa06);
    };

    // `uffd_msg.event` values.
    pub const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
    pub const UFFD_EVENT_REMAP: u8 = 0x14;
    pub const UFFD_EVENT_REMOVE: u8 = 0x15;
    pub const UFFD_EVENT_UNMAP: u8 = 0x16;

    /// `#define UFFD_PAGEFAULT_FLAG_WP (1<<1)`: the fault is a write-protect fault.
    pub const UFFD_PAGEFAULT_FLAG_WP: u64 = 1 << 1;

    // `uffdio_api.features` bits.
    pub const UFFD_FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
    pub const UFFD_FEATURE_EVENT_REMAP: u64 = 1 << 2;
    pub const UFFD_FEATURE_EVENT_REMOVE: u64 = 1 << 3;
    pub const UFFD_FEATURE_EVENT_UNMAP: u64 = 1 << 6;

    /// Names of the feature bits, for error messages (bit i = 1 << i).
    pub const FEATURE_NAMES: [&str; 17] = [
        "PAGEFAULT_FLAG_WP",
        "EVENT_FORK",
        "EVENT_REMAP",
        "EVENT_REMOVE",
        "MISSING_HUGETLBFS",
        "MISSING_SHMEM",
        "EVENT_UNMAP",
        "SIGBUS",
        "THREAD_ID",
        "MINOR_HUGETLBFS",
        "MINOR_SHMEM",
        "EXACT_ADDRESS",
        "WP_HUGETLBFS_SHMEM",
        "WP_UNPOPULATED",
        "POISON",
        "WP_ASYNC",
        "MOVE",
    ];

    /// `#define UFFDIO_REGISTER_MODE_WP ((__u64)1<<1)`
    pub const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;

    /// `struct uffdio_api { __u64 api; __u64 features; __u64 ioctls; }`
    #[repr(C)]
    #[derive(Default)]
    pub struct UffdioApi {
        pub api: u64,
        pub features: u64,
        pub ioctls: u64,
    }

    /// `struct uffdio_range { __u64 start; __u64 len; }`
    #[repr(C)]
    #[derive(Default)]
    pub struct UffdioRange {
        pub start: u64,
        pub len: u64,
    }

    /// `struct uffdio_register { struct uffdio_range range; __u64 mode; __u64 ioctls; }`
    #[repr(C)]
    #[derive(Default)]
    pub struct UffdioRegister {
        pub range: UffdioRange,
        pub mode: u64,
        pub ioctls: u64,
    }

    /// `struct uffdio_writeprotect { struct uffdio_range range; __u64 mode; }`
    /// (mode 0 = clear write protection and wake the faulting thread.)
    #[repr(C)]
    #[derive(Default)]
    pub struct UffdioWriteprotect {
        pub range: UffdioRange,
        pub mode: u64,
    }

    /// `struct uffd_msg` (32 bytes, `__packed`, every field naturally aligned):
    /// `__u8 event; __u8 reserved1; __u16 reserved2; __u32 reserved3;` then a
    /// union at offset 8 whose members we read as three `__u64`:
    /// - pagefault: `flags`, `address`, `feat.ptid` (low 32 bits);
    /// - remap: `from`, `to`, `len`;
    /// - remove / unmap: `start`, `end`.
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    pub struct UffdMsg {
        pub event: u8,
        pub reserved: [u8; 7],
        pub arg: [u64; 3],
    }

    const _: () = {
        assert!(std::mem::size_of::<UffdMsg>() == 32);
        assert!(std::mem::size_of::<UffdioApi>() == 24);
        assert!(std::mem::size_of::<UffdioRange>() == 16);
        assert!(std::mem::size_of::<UffdioRegister>() == 32);
        assert!(std::mem::size_of::<UffdioWriteprotect>() == 24);
    };
}

/// The features this monitor needs. `PAGEFAULT_FLAG_WP` is how the kernel says
/// it supports `UFFDIO_REGISTER_MODE_WP` at all.
pub const REQUIRED_FEATURES: u64 = sys::UFFD_FEATURE_EVENT_UNMAP
    | sys::UFFD_FEATURE_EVENT_REMOVE
    | sys::UFFD_FEATURE_EVENT_REMAP
    | sys::UFFD_FEATURE_PAGEFAULT_FLAG_WP;

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
            "the range holds a mapping userfaultfd cannot watch (a file mapping, MAP_SHARED or \
             MAP_PRIVATE, that is not shmem/tmpfs or hugetlbfs; a hugetlbfs range not aligned to its \
             huge page size; a VM_DROPPABLE mapping) or no mapping at all"
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

/// What went wrong, one variant per failing call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UffdError {
    /// The `userfaultfd()` syscall failed (also after retrying with
    /// `UFFD_USER_MODE_ONLY` when the first attempt gave EPERM).
    #[error(
        "userfaultfd() failed: {} (ENOSYS: kernel without CONFIG_USERFAULTFD; EPERM: blocked by \
         seccomp, or vm.unprivileged_userfaultfd=0 without CAP_SYS_PTRACE)",
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
    /// The range (page-aligned outwards) cannot be watched.
    #[error("cannot watch {range}: {} ({})", unwatchable_reason(.errno), os_err(.errno))]
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
}

/// A release the kernel reported: the process stopped mapping the frames of
/// `range` (spec.md#S2.3). `range` is page aligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MonitorEvent {
    pub kind: ReleaseKind,
    pub range: Range,
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
        // SAFETY: sysconf has no memory-safety preconditions.
        let ps = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let page_size = if ps > 0 { ps as u64 } else { mrcache_types::PAGE_SIZE };
        Ok(UffdMonitor {
            fd,
            page_size,
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
    ///   errno (EINVAL: a file mapping that is not shmem/hugetlbfs, e.g. a
    ///   MAP_SHARED or MAP_PRIVATE ext4 file, or nothing mapped; ENOMEM: nothing
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
            errno @ (libc::EINVAL | libc::ENOMEM | libc::EPERM | libc::EBUSY) => {
                Err(UffdError::Unwatchable { range, errno })
            }
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
        let mut pfd = libc::pollfd { fd: self.raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: `pfd` is one valid pollfd and we pass nfds = 1.
        let rc = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
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
    pub fn read_pending(&self, out: &mut Vec<MonitorEvent>, max: usize) -> Result<usize, UffdError> {
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

    fn convert(&self, msg: &sys::UffdMsg) -> Option<MonitorEvent> {
        let [a0, a1, a2] = msg.arg;
        let span = |start: u64, end: u64| (end > start).then(|| Range { addr: start, len: end - start });
        match msg.event {
            sys::UFFD_EVENT_UNMAP => span(a0, a1).map(|range| MonitorEvent { kind: ReleaseKind::Munmap, range }),
            // DONTNEED, FREE and REMOVE are indistinguishable here.
            sys::UFFD_EVENT_REMOVE => {
                span(a0, a1).map(|range| MonitorEvent { kind: ReleaseKind::MadviseDontneed, range })
            }
            // from = a0, to = a1, len = a2: the old range no longer maps those frames.
            sys::UFFD_EVENT_REMAP => {
                span(a0, a0.checked_add(a2)?).map(|range| MonitorEvent { kind: ReleaseKind::MremapSource, range })
            }
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
            let mut wp =
                sys::UffdioWriteprotect { range: sys::UffdioRange { start: page.start, len: page.len }, mode: 0 };
            // SAFETY: UFFDIO_WRITEPROTECT reads and writes one `struct
            // uffdio_writeprotect`, which `wp` is (repr(C)). Mode 0 removes
            // write protection from one page of the faulting process's own
            // mapping and wakes the waiter: it never touches memory we use.
            let rc = unsafe {
                libc::ioctl(self.raw_fd(), sys::UFFDIO_WRITEPROTECT as _, &mut wp as *mut sys::UffdioWriteprotect)
            };
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
mod tests {
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
        // SAFETY: sysconf has no memory-safety preconditions.
        unsafe { libc::sysconf(libc::_SC_PAGESIZE) as u64 }
    }

    fn range(addr: u64, len: u64) -> Range {
        Range::new(addr, len).unwrap()
    }

    fn ev(kind: ReleaseKind, addr: u64, len: u64) -> MonitorEvent {
        MonitorEvent { kind, range: range(addr, len) }
    }

    /// Maps `pages` private anonymous pages; touches them if `touch`.
    fn map_anon_with(pages: u64, flags: libc::c_int, touch: bool) -> u64 {
        let len = (pages * page()) as usize;
        // SAFETY: a fresh anonymous mapping at an address of the kernel's choice.
        let p = unsafe { libc::mmap(ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
        assert_ne!(p, libc::MAP_FAILED, "mmap: {}", io::Error::last_os_error());
        if touch {
            // SAFETY: `p` is a fresh writable mapping of `len` bytes.
            unsafe { ptr::write_bytes(p.cast::<u8>(), 0xab, len) };
        }
        p as u64
    }

    fn map_anon(pages: u64) -> u64 {
        map_anon_with(pages, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, true)
    }

    /// munmap from the test thread: only for memory no monitor watches.
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
    fn finish(mon: &UffdMonitor, rel: Releaser) -> (i64, Vec<MonitorEvent>) {
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
    fn release(mon: &UffdMonitor, f: impl FnOnce() -> i64 + Send + 'static) -> Vec<MonitorEvent> {
        let (rc, events) = finish(mon, release_in_thread(f));
        assert_eq!(rc, 0, "release call failed");
        events
    }

    fn munmap_in(mon: &UffdMonitor, addr: u64, len: u64) -> Vec<MonitorEvent> {
        // SAFETY: the tests only unmap mappings they created and no longer use.
        release(mon, move || unsafe { libc::munmap(addr as *mut libc::c_void, len as usize) } as i64)
    }

    fn madvise_in(mon: &UffdMonitor, addr: u64, len: u64, advice: libc::c_int) -> Vec<MonitorEvent> {
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
    fn munmap_emits_unmap_of_the_unmapped_range() {
        let p = page();
        let mon = UffdMonitor::open().unwrap();
        let a = map_anon(8);
        mon.watch(range(a, 8 * p)).unwrap();
        let events = munmap_in(&mon, a + 2 * p, 3 * p);
        assert_eq!(events, [ev(ReleaseKind::Munmap, a + 2 * p, 3 * p)]);
        // An munmap wider than the watch reports the whole unmapped range.
        let events = munmap_in(&mon, a, 8 * p);
        assert_eq!(events, [ev(ReleaseKind::Munmap, a, 8 * p)]);
    }

    #[test]
    fn watch_rounds_outwards_to_pages() {
        let p = page();
        let mon = UffdMonitor::open().unwrap();
        let a = map_anon(3);
        mon.watch(range(a + p + 100, 10)).unwrap(); // page 1 only
        assert_eq!(munmap_in(&mon, a, p), []);
        assert_eq!(munmap_in(&mon, a + 2 * p, p), []);
        assert_eq!(munmap_in(&mon, a + p, p), [ev(ReleaseKind::Munmap, a + p, p)]);
    }

    #[test]
    fn madvise_dontneed_emits_remove() {
        let p = page();
        let mon = UffdMonitor::open().unwrap();
        let a = map_anon(8);
        mon.watch(range(a, 8 * p)).unwrap();
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
        let p = page();
        let mon = UffdMonitor::open().unwrap();
        let a = map_anon(8);
        mon.watch(range(a, 8 * p)).unwrap();
        let events = madvise_in(&mon, a + 4 * p, 4 * p, libc::MADV_FREE);
        assert_eq!(events, [ev(ReleaseKind::MadviseDontneed, a + 4 * p, 4 * p)]);
        drop(mon);
        unmap_unwatched(a, 8 * p);
    }

    #[test]
    fn mremap_move_emits_remap_then_unmap_and_the_watch_moves() {
        let p = page();
        let mon = UffdMonitor::open().unwrap();
        // 12 pages, the first 8 watched: the unwatched tail sits right after
        // the watched VMA, so growing it in place is impossible and it moves.
        let a = map_anon(12);
        mon.watch(range(a, 8 * p)).unwrap();
        let rel = release_in_thread(move || {
            // SAFETY: moves a mapping this test owns; nothing points into it.
            let r = unsafe {
                libc::mremap(a as *mut libc::c_void, (8 * p) as usize, (16 * p) as usize, libc::MREMAP_MAYMOVE)
            };
            if r == libc::MAP_FAILED {
                -1
            } else {
                r as i64
            }
        });
        let (b, events) = finish(&mon, rel);
        assert!(b > 0 && b as u64 != a, "mremap did not move: {b:#x}");
        let b = b as u64;
        assert_eq!(
            events,
            [ev(ReleaseKind::MremapSource, a, 8 * p), ev(ReleaseKind::Munmap, a, 8 * p)],
            "moved to {b:#x}"
        );
        // The destination, including the grown part, is watched now.
        assert_eq!(munmap_in(&mon, b, 16 * p), [ev(ReleaseKind::Munmap, b, 16 * p)]);
        drop(mon);
        unmap_unwatched(a + 8 * p, 4 * p);
    }

    #[test]
    fn mremap_shrink_emits_unmap_of_the_tail() {
        let p = page();
        let mon = UffdMonitor::open().unwrap();
        let a = map_anon(8);
        mon.watch(range(a, 8 * p)).unwrap();
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
        let p = page();
        let mon = UffdMonitor::open().unwrap();
        let a = map_anon(8);
        mon.watch(range(a, 8 * p)).unwrap();
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
        assert_eq!(munmap_in(&mon, a, 8 * p), [ev(ReleaseKind::Munmap, a, 8 * p)]);
    }

    #[test]
    fn the_releasing_thread_blocks_until_the_event_is_read() {
        let p = page();
        let mon = UffdMonitor::open().unwrap();
        let a = map_anon(4);
        mon.watch(range(a, 4 * p)).unwrap();
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
        let p = page();
        let mon = UffdMonitor::open().unwrap();
        let a = map_anon(2);
        mon.watch(range(a, 2 * p)).unwrap();
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
        let p = page();
        let mon = UffdMonitor::open().unwrap();
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
        let p = page();
        let mon = UffdMonitor::open().unwrap();
        let a = map_anon(3);
        mon.watch(range(a, 3 * p)).unwrap();
        // DONTNEED: the REMOVE is queued before the pages are dropped.
        // SAFETY: discards a page of a mapping this test owns.
        let rel =
            release_in_thread(
                move || unsafe { libc::madvise(a as *mut libc::c_void, p as usize, libc::MADV_DONTNEED) } as i64,
            );
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
        let p = page();
        let mon = UffdMonitor::open().unwrap();
        let a = map_anon(2);
        mon.watch(range(a, 2 * p)).unwrap();
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
        let p = page();
        let mon = UffdMonitor::open().unwrap();
        let a = map_anon(2);
        mon.watch(range(a, 2 * p)).unwrap();
        // Something other than the monitor write-protects page 0.
        let mut wp =
            sys::UffdioWriteprotect { range: sys::UffdioRange { start: a, len: p }, mode: UFFDIO_WRITEPROTECT_MODE_WP };
        // SAFETY: `wp` is a valid `struct uffdio_writeprotect` for the call.
        let rc = unsafe {
            libc::ioctl(mon.raw_fd(), sys::UFFDIO_WRITEPROTECT as _, &mut wp as *mut sys::UffdioWriteprotect)
        };
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
        let p = page();
        let mon = UffdMonitor::open().unwrap();
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
        assert_eq!(e.kind, ReleaseKind::Munmap);
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
        let a = unsafe {
            libc::mmap(
                ptr::null_mut(),
                (4 * page()) as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(a, libc::MAP_FAILED);
        (a as u64, on_tmpfs)
    }

    #[test]
    fn file_mappings_on_a_disk_filesystem_are_unwatchable() {
        let p = page();
        let mon = UffdMonitor::open().unwrap();
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
                assert!(e.to_string().contains("file mapping"), "{e}");
            }
            unmap_unwatched(a, 4 * p);
        }
    }

    #[test]
    fn shmem_is_watchable_and_madv_remove_emits_remove() {
        let p = page();
        let mon = UffdMonitor::open().unwrap();
        let a = map_anon_with(4, libc::MAP_SHARED | libc::MAP_ANONYMOUS, true);
        mon.watch(range(a, 4 * p)).unwrap();
        let events = madvise_in(&mon, a + p, p, libc::MADV_REMOVE);
        assert_eq!(events, [ev(ReleaseKind::MadviseDontneed, a + p, p)]);
        let events = madvise_in(&mon, a + 2 * p, p, libc::MADV_DONTNEED);
        assert_eq!(events, [ev(ReleaseKind::MadviseDontneed, a + 2 * p, p)]);
        assert_writes_not_trapped(&mon, a, 4 * p);
        assert_eq!(munmap_in(&mon, a, 4 * p), [ev(ReleaseKind::Munmap, a, 4 * p)]);
    }

    #[test]
    fn unmapped_and_impossible_ranges_are_unwatchable() {
        let p = page();
        let mon = UffdMonitor::open().unwrap();
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
        let p = page();
        let mon = UffdMonitor::open().unwrap();
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
        let p = page();
        let mon = UffdMonitor::open().unwrap();
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
        assert_eq!(
            second.watch(range(a + p, p)),
            Err(UffdError::Unwatchable { range: range(a + p, p), errno: libc::EBUSY })
        );
        drop(first); // closing unregisters
        second.watch(range(a + p, p)).unwrap();
        assert_eq!(munmap_in(&second, a, 4 * p), [ev(ReleaseKind::Munmap, a, 4 * p)]);
    }

    #[test]
    fn unwatch_stops_the_events() {
        let p = page();
        let mon = UffdMonitor::open().unwrap();
        let a = map_anon(8);
        mon.watch(range(a, 8 * p)).unwrap();
        mon.unwatch(range(a + 2 * p, 2 * p)).unwrap();
        assert_eq!(munmap_in(&mon, a + 2 * p, 2 * p), []);
        assert_eq!(madvise_in(&mon, a, 2 * p, libc::MADV_DONTNEED), [ev(ReleaseKind::MadviseDontneed, a, 2 * p)]);
        // Unwatching a range that is partly gone still works for the rest.
        mon.unwatch(range(a, 8 * p)).unwrap();
        assert_eq!(munmap_in(&mon, a, 8 * p), []);
    }

    #[test]
    fn read_pending_reads_at_most_max() {
        let p = page();
        let mon = UffdMonitor::open().unwrap();
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
}
