//! Kernel ABI of userfaultfd, transcribed from `include/uapi/linux/userfaultfd.h`
//! (libc 0.2 does not define it).

// ---- ioctl number encoding: include/uapi/asm-generic/ioctl.h ----
// (powerpc, mips and sparc use 13 size bits and different direction bits:
// arch/*/include/uapi/asm/ioctl.h.)
/// The architectures whose `_IOC` layout differs from asm-generic's.
const OTHER_IOC: bool = cfg!(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips32r6",
    target_arch = "mips64",
    target_arch = "mips64r6",
    target_arch = "sparc",
    target_arch = "sparc64"
));
mod dir {
    use super::OTHER_IOC;
    /// `_IOC_READ`
    pub const READ: u64 = 2;
    /// `_IOC_WRITE`
    pub const WRITE: u64 = if OTHER_IOC { 4 } else { 1 };
    /// `_IOC_SIZEBITS`
    pub const SIZEBITS: u64 = if OTHER_IOC { 13 } else { 14 };
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
