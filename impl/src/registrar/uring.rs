//! The io_uring fixed-buffer registrar: real long-term pins, and a loopback
//! "NIC" that moves data through them.
//!
//! A fixed buffer registered with `IORING_REGISTER_BUFFERS_UPDATE` pins its
//! pages with `FOLL_LONGTERM`, exactly like `ibv_reg_mr`: from then on, I/O
//! through the buffer's index goes to the *pinned frames*, not to whatever the
//! virtual address maps now. So this backend reproduces the hazard a
//! registration cache exists to handle (measured on this machine: the test
//! `stale_registration_writes_old_frames` below and the example
//! `impl/examples/stale_dma.rs` show it): after `munmap` + `mmap` at the
//! same address, [`UringRegistrar::dma_write`] through the old registration
//! lands in the OLD frames and the application never sees it.
//!
//! Invariants:
//! - The table is sparse with `slots` entries. A slot is either on the free
//!   list or owned by exactly one live [`UringHandle`]; never both. (A handle
//!   dropped without `deregister`, or given to another registrar, leaks its
//!   slot and pin until the registrar is dropped; dropping the registrar
//!   closes the ring, which unpins everything.)
//! - `register` takes a slot and fills it with one iovec (a real pin), or
//!   returns an error, gives the slot back, and pins nothing.
//! - `deregister` consumes the handle (it is not `Clone`), clears the slot
//!   (null iovec) and returns it to the free list. A cleared slot makes the
//!   kernel answer `READ_FIXED`/`WRITE_FIXED` with `EFAULT`.
//! - The ring, the free list and the scratch file live behind one `Mutex`;
//!   every I/O is submitted and reaped under it, so at most one request is in
//!   flight and no completion outlives the call that issued it.
//! - Only the process that created the registrar uses it. In a forked child
//!   `register`, `deregister` and `dma_*` fail with `EINVAL` (the ring is `MADV_DONTFORK` and its table belongs to
//!   the parent).
//! - Ranges longer than 1 GiB are refused before any syscall (the kernel's
//!   per-buffer limit), with `RegistrarFailure::Other` / `EINVAL`.
//!
//! Access rights are recorded in the handle but not enforced: io_uring lets a
//! fixed buffer be used in both directions.

use super::{Keys, Registrar, RegistrarError};
use mrcache_types::{Access, Range};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

/// Default number of slots in the sparse fixed-buffer table (the maximum).
pub const DEFAULT_SLOTS: u32 = MAX_SLOTS;
/// The kernel refuses fixed buffers longer than this (`SZ_1G` in io_uring/rsrc.c).
pub const MAX_BUFFER_LEN: u64 = 1 << 30;
/// The kernel's table limit (`IORING_MAX_REG_BUFFERS`; 16385 gives EINVAL on
/// 6.18). Also keeps every slot within the 16-bit `buf_index` of an SQE.
pub const MAX_SLOTS: u32 = 1 << 14;
/// Data moves through the scratch file in pieces of at most this size.
const DMA_CHUNK: usize = 1 << 20;
/// Bound on I/O submissions per chunk (short transfers, EINTR).
const MAX_ATTEMPTS: u32 = 64;
const RING_ENTRIES: u32 = 8;

const VERB_UPDATE: &str = "io_uring_register_buffers_update";

static NEXT_REGISTRAR_ID: AtomicU64 = AtomicU64::new(1);

/// A registration in a [`UringRegistrar`]: slot `slot` of its fixed-buffer
/// table pins `range`. Not `Clone`: [`Registrar::deregister`] consumes it, so
/// a handle is deregistered at most once and cannot be used afterwards:
///
/// ```compile_fail,E0382
/// use mrcache::registrar::{uring::UringRegistrar, Registrar};
/// use mrcache::types::{Access, Range};
/// fn stale(reg: &UringRegistrar, r: Range) {
///     let h = reg.register(r, Access::LOCAL_READ).unwrap();
///     reg.deregister(h).unwrap();
///     let _ = reg.dma_read(&h, 0, &mut [0u8; 1]); // borrow of moved value `h`
/// }
/// ```
#[derive(Debug, PartialEq, Eq)]
pub struct UringHandle {
    pub slot: u32,
    pub range: Range,
    pub access: Access,
    /// Which registrar issued it: a handle from another ring is refused.
    owner: u64,
}

struct State {
    ring: IoUring,
    /// Free slots; `pop` hands out the lowest-numbered free slot first.
    free: Vec<u32>,
    /// memfd the loopback NIC reads from / writes to.
    scratch: File,
    /// `user_data` of the next SQE, to match its completion.
    next_tag: u64,
}

/// Pins memory as io_uring fixed buffers in a sparse table (one slot per
/// registration). See the module docs for the invariants.
pub struct UringRegistrar {
    state: Mutex<State>,
    slots: u32,
    id: u64,
    pid: u32,
}

impl std::fmt::Debug for UringRegistrar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringRegistrar").field("slots", &self.slots).field("in_use", &self.in_use()).finish()
    }
}

fn einval(verb: &'static str, detail: impl Into<String>) -> RegistrarError {
    RegistrarError::from_errno(verb, libc::EINVAL, detail)
}

fn io_errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

impl UringRegistrar {
    /// A ring with a sparse table of `slots` fixed buffers, 1..=[`MAX_SLOTS`].
    pub fn new(slots: u32) -> Result<Self, RegistrarError> {
        if slots == 0 || slots > MAX_SLOTS {
            return Err(einval("io_uring_register_buffers_sparse", format!("{slots} slots requested; the kernel allows 1..={MAX_SLOTS}")));
        }
        let ring = IoUring::builder()
            .dontfork()
            .build(RING_ENTRIES)
            .map_err(|e| RegistrarError::from_errno("io_uring_setup", io_errno(&e), e.to_string()))?;
        ring.submitter().register_buffers_sparse(slots).map_err(|e| {
            RegistrarError::from_errno("io_uring_register_buffers_sparse", io_errno(&e), format!("sparse table of {slots} slots: {e}"))
        })?;
        // SAFETY: memfd_create gets a NUL-terminated name and plain flags; it
        // returns a new fd we own, or -1.
        let fd = unsafe { libc::memfd_create(c"mrcache-uring-dma".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return Err(RegistrarError::from_errno("memfd_create", io_errno(&e), e.to_string()));
        }
        // SAFETY: `fd` is a freshly created descriptor owned by nobody else.
        let scratch = unsafe { File::from_raw_fd(fd) };
        Ok(UringRegistrar {
            state: Mutex::new(State { ring, free: (0..slots).rev().collect(), scratch, next_tag: 1 }),
            slots,
            id: NEXT_REGISTRAR_ID.fetch_add(1, Ordering::Relaxed),
            pid: std::process::id(),
        })
    }

    /// [`UringRegistrar::new`] with [`DEFAULT_SLOTS`] slots.
    pub fn with_defaults() -> Result<Self, RegistrarError> {
        Self::new(DEFAULT_SLOTS)
    }

    /// Size of the fixed-buffer table.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Slots currently holding a registration.
    pub fn in_use(&self) -> u32 {
        self.slots - self.lock().free.len() as u32
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent across a panic (no invariant spans an
        // unwind point), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check_process(&self, verb: &'static str) -> Result<(), RegistrarError> {
        if std::process::id() != self.pid {
            return Err(einval(verb, "registrar used in a forked child; its ring belongs to the parent"));
        }
        Ok(())
    }

    fn check_owner(&self, h: &UringHandle, verb: &'static str) -> Result<(), RegistrarError> {
        if h.owner != self.id || h.slot >= self.slots {
            return Err(einval(verb, format!("slot {} is from another registrar", h.slot)));
        }
        Ok(())
    }

    /// The loopback NIC writes `bytes` into the registered memory at
    /// `handle.range.addr + offset`: the kernel copies them into the frames
    /// the registration pinned (`IORING_OP_READ_FIXED` from a scratch memfd),
    /// whatever the address maps now. A stale registration therefore writes
    /// into frames the application no longer sees.
    ///
    /// Errors (never panics) when `offset + bytes.len()` leaves the range.
    ///
    /// # Safety
    ///
    /// Like a real NIC's DMA this writes behind the compiler's back: while the
    /// frames are still mapped, no Rust reference to the target bytes may be
    /// live, and no other thread may access them concurrently.
    pub unsafe fn dma_write(&self, handle: &UringHandle, offset: u64, bytes: &[u8]) -> Result<(), RegistrarError> {
        const VERB: &str = "io_uring READ_FIXED";
        self.check_process(VERB)?;
        self.check_owner(handle, VERB)?;
        let addr = bounds(handle, offset, bytes.len(), VERB)?;
        let mut st = self.lock();
        let mut done = 0usize;
        for chunk in bytes.chunks(DMA_CHUNK) {
            st.scratch
                .write_all_at(chunk, 0)
                .map_err(|e| RegistrarError::from_errno("pwrite", io_errno(&e), format!("scratch memfd: {e}")))?;
            st.transfer(Dir::IntoBuffer, handle.slot, addr + done as u64, chunk.len())?;
            done += chunk.len();
        }
        Ok(())
    }

    /// The loopback NIC reads `out.len()` bytes of the registered memory at
    /// `handle.range.addr + offset`, from the frames the registration pinned
    /// (`IORING_OP_WRITE_FIXED` into a scratch memfd, then read back).
    ///
    /// Errors (never panics) when `offset + out.len()` leaves the range.
    pub fn dma_read(&self, handle: &UringHandle, offset: u64, out: &mut [u8]) -> Result<(), RegistrarError> {
        const VERB: &str = "io_uring WRITE_FIXED";
        self.check_process(VERB)?;
        self.check_owner(handle, VERB)?;
        let addr = bounds(handle, offset, out.len(), VERB)?;
        let mut st = self.lock();
        let mut done = 0usize;
        for chunk in out.chunks_mut(DMA_CHUNK) {
            st.transfer(Dir::FromBuffer, handle.slot, addr + done as u64, chunk.len())?;
            st.scratch
                .read_exact_at(chunk, 0)
                .map_err(|e| RegistrarError::from_errno("pread", io_errno(&e), format!("scratch memfd: {e}")))?;
            done += chunk.len();
        }
        Ok(())
    }
}

/// The absolute address of `[offset, offset+len)` inside the handle's range.
fn bounds(h: &UringHandle, offset: u64, len: usize, verb: &'static str) -> Result<u64, RegistrarError> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= h.range.len => Ok(h.range.addr + offset),
        _ => Err(RegistrarError::from_errno(
            verb,
            libc::EFAULT,
            format!("offset {offset:#x} + {len:#x} bytes leaves registration {} (slot {})", h.range, h.slot),
        )),
    }
}

#[derive(Clone, Copy)]
enum Dir {
    /// scratch file -> fixed buffer (the NIC writes memory).
    IntoBuffer,
    /// fixed buffer -> scratch file (the NIC reads memory).
    FromBuffer,
}

impl State {
    /// Moves `len` bytes (at most `DMA_CHUNK`) between scratch offset 0.. and
    /// `addr..` inside fixed buffer `slot`, looping over short transfers.
    fn transfer(&mut self, dir: Dir, slot: u32, addr: u64, len: usize) -> Result<(), RegistrarError> {
        let verb = match dir {
            Dir::IntoBuffer => "io_uring READ_FIXED",
            Dir::FromBuffer => "io_uring WRITE_FIXED",
        };
        let buf_index = u16::try_from(slot).map_err(|_| einval(verb, format!("slot {slot} exceeds u16")))?;
        let fd = types::Fd(self.scratch.as_raw_fd());
        let mut done = 0usize;
        for _ in 0..MAX_ATTEMPTS {
            if done == len {
                return Ok(());
            }
            let n = (len - done) as u32; // len <= DMA_CHUNK < u32::MAX
            let at = (addr + done as u64) as usize;
            let entry = match dir {
                Dir::IntoBuffer => opcode::ReadFixed::new(fd, at as *mut u8, n, buf_index).offset(done as u64).build(),
                Dir::FromBuffer => opcode::WriteFixed::new(fd, at as *const u8, n, buf_index).offset(done as u64).build(),
            };
            let res = self.run(entry, verb)?;
            if res < 0 {
                return Err(RegistrarError::from_errno(verb, -res, format!("slot {slot}, {n:#x} bytes at {at:#x}")));
            }
            if res == 0 {
                return Err(RegistrarError::from_errno(verb, libc::EIO, format!("no progress: slot {slot}, {n:#x} bytes at {at:#x}")));
            }
            done += res as usize;
        }
        Err(RegistrarError::from_errno(
            verb,
            libc::EIO,
            format!("{MAX_ATTEMPTS} short transfers on slot {slot}; {done:#x} of {len:#x} bytes moved"),
        ))
    }

    /// Submits one SQE and waits for its completion; returns `cqe.res`.
    fn run(&mut self, entry: squeue::Entry, verb: &'static str) -> Result<i32, RegistrarError> {
        let tag = self.next_tag;
        self.next_tag = self.next_tag.wrapping_add(1);
        let entry = entry.user_data(tag);
        // SAFETY: the SQE names no Rust-owned buffer. Its fd is the scratch
        // memfd, owned by `self` (and referenced by the kernel for the
        // request's lifetime anyway); its address is resolved by the kernel
        // through the fixed-buffer table to pinned frames and range-checked
        // there (EFAULT when out of the buffer or the slot is empty).
        unsafe { self.ring.submission().push(&entry) }
            .map_err(|_| RegistrarError::from_errno(verb, libc::EAGAIN, "submission queue full"))?;
        for _ in 0..MAX_ATTEMPTS {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(RegistrarError::from_errno("io_uring_enter", io_errno(&e), e.to_string())),
            }
            // Completions of earlier requests abandoned by an error are skipped.
            let found = self.ring.completion().map(|c: cqueue::Entry| (c.user_data(), c.result())).find(|&(t, _)| t == tag);
            if let Some((_, res)) = found {
                return Ok(res);
            }
        }
        Err(RegistrarError::from_errno("io_uring_enter", libc::EIO, "no completion after repeated waits"))
    }
}

impl Registrar for UringRegistrar {
    type Handle = UringHandle;

    fn register(&self, range: Range, access: Access) -> Result<UringHandle, RegistrarError> {
        self.check_process(VERB_UPDATE)?;
        if range.len == 0 {
            return Err(einval(VERB_UPDATE, format!("empty range at {:#x}", range.addr)));
        }
        if range.len > MAX_BUFFER_LEN {
            return Err(einval(
                VERB_UPDATE,
                format!("range {:#x}+{:#x} exceeds the 1 GiB limit of one fixed buffer", range.addr, range.len),
            ));
        }
        if range.addr.checked_add(range.len).is_none() {
            return Err(einval(VERB_UPDATE, format!("range {:#x}+{:#x} wraps", range.addr, range.len)));
        }
        let mut st = self.lock();
        let Some(slot) = st.free.pop() else {
            return Err(RegistrarError::from_errno(VERB_UPDATE, libc::ENOMEM, format!("all {} slots in use", self.slots)));
        };
        let iov = libc::iovec { iov_base: range.addr as usize as *mut libc::c_void, iov_len: range.len as usize };
        // SAFETY: `iov` outlives the call. The kernel pins the frames behind
        // [addr, addr+len) now (or fails and pins nothing) and afterwards only
        // touches those pinned frames, never the virtual range, so unmapping
        // the range cannot make the kernel access freed memory. Writes into
        // the frames happen only through `dma_write`, whose contract covers
        // aliasing.
        let r = unsafe { st.ring.submitter().register_buffers_update(slot, &[iov], None) };
        match r {
            Ok(()) => Ok(UringHandle { slot, range, access, owner: self.id }),
            Err(e) => {
                st.free.push(slot);
                Err(RegistrarError::from_errno(VERB_UPDATE, io_errno(&e), format!("slot {slot}, {range}: {e}")))
            }
        }
    }

    /// Clears the slot. The slot returns to the free list even if clearing
    /// fails: the next registration in it replaces (and unpins) the old one.
    fn deregister(&self, handle: UringHandle) -> Result<(), RegistrarError> {
        self.check_process(VERB_UPDATE)?;
        self.check_owner(&handle, VERB_UPDATE)?;
        let mut st = self.lock();
        let iov = libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 };
        // SAFETY: a null, zero-length iovec empties the slot of a sparse table;
        // it refers to no memory.
        let r = unsafe { st.ring.submitter().register_buffers_update(handle.slot, &[iov], None) };
        st.free.push(handle.slot);
        r.map_err(|e| RegistrarError::from_errno(VERB_UPDATE, io_errno(&e), format!("clearing slot {}: {e}", handle.slot)))
    }

    fn keys(&self, handle: &UringHandle) -> Keys {
        Keys { lkey: handle.slot, rkey: handle.slot }
    }

    fn name(&self) -> &'static str {
        "uring"
    }
}

#[cfg(test)]
impl UringRegistrar {
    /// Raw READ_FIXED on a slot, without handle or bounds checks: lets tests
    /// ask the kernel what a slot holds after its handle is gone.
    fn raw_write_slot(&self, slot: u32, addr: u64, bytes: &[u8]) -> Result<(), RegistrarError> {
        let mut st = self.lock();
        st.scratch.write_all_at(bytes, 0).expect("scratch write");
        st.transfer(Dir::IntoBuffer, slot, addr, bytes.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pagemap;
    use mrcache_types::RegistrarFailure;
    use std::time::Instant;

    /// VmPin is process-wide: the tests of this module that pin run one at a
    /// time, and VmPin checks retry in case another module's test pins too.
    static PIN_LOCK: Mutex<()> = Mutex::new(());

    fn serial() -> MutexGuard<'static, ()> {
        PIN_LOCK.lock().unwrap_or_else(|p| p.into_inner())
    }

    const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_READ).union(Access::REMOTE_WRITE);

    /// An anonymous private mapping, unmapped on drop.
    struct Anon {
        addr: u64,
        len: u64,
    }

    impl Anon {
        fn new(len: u64) -> Anon {
            Anon { addr: crate::mem::map_anon(len, 0).unwrap(), len }
        }
        fn range(&self) -> Range {
            Range::new(self.addr, self.len).unwrap()
        }
        fn fill(&self, b: u8) {
            // SAFETY: the mapping is ours, writable and `len` bytes long.
            unsafe { std::ptr::write_bytes(self.addr as *mut u8, b, self.len as usize) }
        }
        fn read(&self, off: u64, len: usize) -> Vec<u8> {
            let mut v = vec![0u8; len];
            // SAFETY: `off + len <= self.len` in every caller; the mapping is readable.
            unsafe { std::ptr::copy_nonoverlapping((self.addr + off) as *const u8, v.as_mut_ptr(), len) };
            v
        }
        /// munmap, then map fresh zero pages at the same address and touch them.
        fn remap_fresh(&self) {
            // MAP_FIXED over our own mapping replaces its pages in one call
            // (the old ones are released as by munmap). A munmap first would
            // leave a hole that another test thread's mmap could take, and
            // the MAP_FIXED would then silently replace that thread's memory.
            // SAFETY: MAP_FIXED over our own mapping of `len` bytes; nothing
            // borrows it.
            let p = unsafe {
                libc::mmap(
                    self.addr as *mut libc::c_void,
                    self.len as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            assert_eq!(p as u64, self.addr);
            self.fill(0);
        }
    }

    impl Drop for Anon {
        fn drop(&mut self) {
            // SAFETY: unmapping our own mapping.
            unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len as usize) };
        }
    }

    /// Checks that `attempt` (which returns the VmPin change it caused, in
    /// KiB) sees `expected`; retried, since pins taken at the same time by
    /// tests of other modules count too.
    fn pin_delta(expected: i64, what: &str, mut attempt: impl FnMut() -> i64) {
        let seen: Vec<i64> = (0..5).map(|_| attempt()).collect();
        assert!(seen.contains(&expected), "{what}: VmPin moved by {seen:?} KiB, expected {expected}");
    }

    fn vm_pin() -> i64 {
        vm_pin_kib() as i64
    }

    /// VmPin of this process, in KiB (io_uring accounts fixed buffers there).
    fn vm_pin_kib() -> u64 {
        let s = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = s.lines().find(|l| l.starts_with("VmPin:")).expect("VmPin in /proc/self/status");
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    //= spec.md#S1.9
    fn register_deregister_round_trip_pins_and_unpins() {
        let _g = serial();
        let reg = UringRegistrar::new(4).unwrap();
        let m = Anon::new(64 << 10);
        m.fill(1);
        pin_delta(64, "register pins", || {
            let before = vm_pin();
            let h = reg.register(m.range(), RW).unwrap();
            let d = vm_pin() - before;
            reg.deregister(h).unwrap();
            d
        });
        pin_delta(-64, "deregister unpins", || {
            let h = reg.register(m.range(), RW).unwrap();
            let before = vm_pin();
            reg.deregister(h).unwrap();
            vm_pin() - before
        });
        let h = reg.register(m.range(), RW).unwrap();
        assert_eq!(h.range, m.range());
        assert_eq!(h.access, RW);
        assert_eq!(reg.keys(&h), Keys { lkey: h.slot, rkey: h.slot });
        assert_eq!(reg.in_use(), 1);
        assert_eq!(reg.name(), "uring");
        reg.deregister(h).unwrap();
        assert_eq!(reg.in_use(), 0);
    }

    #[test]
    fn slots_are_reused() {
        let _g = serial();
        let reg = UringRegistrar::new(8).unwrap();
        let m = Anon::new(16 << 10);
        let a = reg.register(m.range(), Access::LOCAL_READ).unwrap();
        let b = reg.register(m.range(), Access::LOCAL_READ).unwrap();
        assert_eq!((a.slot, b.slot), (0, 1));
        reg.deregister(a).unwrap();
        let c = reg.register(m.range(), Access::LOCAL_READ).unwrap();
        assert_eq!(c.slot, 0, "the freed slot is handed out again");
        reg.deregister(b).unwrap();
        reg.deregister(c).unwrap();
        assert_eq!(reg.in_use(), 0);
    }

    #[test]
    fn full_table_is_reported() {
        let _g = serial();
        let reg = UringRegistrar::new(2).unwrap();
        let m = Anon::new(8 << 10);
        let a = reg.register(m.range(), RW).unwrap();
        let b = reg.register(m.range(), RW).unwrap();
        let e = reg.register(m.range(), RW).unwrap_err();
        assert_eq!((e.failure, e.errno), (RegistrarFailure::NoMemory, libc::ENOMEM));
        assert!(e.detail.contains("all 2 slots in use"), "{e}");
        reg.deregister(a).unwrap();
        let c = reg.register(m.range(), RW).unwrap();
        reg.deregister(b).unwrap();
        reg.deregister(c).unwrap();
    }

    #[test]
    fn bad_sizes_are_refused() {
        let _g = serial();
        assert_eq!(UringRegistrar::new(0).unwrap_err().errno, libc::EINVAL);
        assert_eq!(UringRegistrar::new(MAX_SLOTS + 1).unwrap_err().errno, libc::EINVAL);
        assert_eq!(UringRegistrar::with_defaults().unwrap().slots(), 16384);
        let reg = UringRegistrar::new(1).unwrap();
        let bad = Range { addr: 0x1000, len: 0 };
        assert_eq!(reg.register(bad, RW).unwrap_err().errno, libc::EINVAL);
        let wraps = Range { addr: u64::MAX - 0xfff, len: 0x2000 };
        assert_eq!(reg.register(wraps, RW).unwrap_err().failure, RegistrarFailure::Other);
        assert_eq!(reg.in_use(), 0);
    }

    #[test]
    fn over_one_gib_is_refused_without_pinning() {
        let _g = serial();
        let reg = UringRegistrar::new(1).unwrap();
        // Reserve (not touch) 1 GiB + 1 page: the refusal must come before any pin.
        let m = Anon::new(MAX_BUFFER_LEN + 4096);
        pin_delta(0, "refused register pins nothing", || {
            let before = vm_pin();
            let e = reg.register(m.range(), RW).unwrap_err();
            assert_eq!((e.failure, e.errno), (RegistrarFailure::Other, libc::EINVAL));
            assert!(e.detail.contains("1 GiB"), "{e}");
            vm_pin() - before
        });
        assert_eq!(reg.in_use(), 0, "the slot went back to the free list");
        // Exactly 1 GiB is within the limit (not registered here: it would
        // pin 1 GiB); a small one still gets slot 0.
        let small = Range::new(m.addr, 4096).unwrap();
        let h = reg.register(small, RW).unwrap();
        assert_eq!(h.slot, 0);
        reg.deregister(h).unwrap();
    }

    #[test]
    fn unmapped_range_fails_with_fault() {
        let _g = serial();
        let reg = UringRegistrar::new(1).unwrap();
        // Pages the kernel cannot pin: mapped PROT_NONE, so the range stays
        // ours. (A range unmapped by this test could be mapped again by
        // another test thread before the registration, which then succeeds:
        // seen once in a full `cargo test`.)
        let m = Anon::new(8192);
        // SAFETY: our own mapping; nothing borrows it.
        assert_eq!(unsafe { libc::mprotect(m.addr as *mut libc::c_void, 8192, libc::PROT_NONE) }, 0);
        let r = m.range();
        let e = reg.register(r, RW).unwrap_err();
        assert_eq!(e.failure, RegistrarFailure::Fault, "{e}");
        assert_eq!(e.verb, VERB_UPDATE);
        assert_eq!(reg.in_use(), 0);
    }

    #[test]
    fn dma_on_fresh_registration_is_visible() {
        let _g = serial();
        let reg = UringRegistrar::new(2).unwrap();
        let m = Anon::new(64 << 10);
        m.fill(0x11);
        let h = reg.register(m.range(), RW).unwrap();
        // SAFETY: no Rust reference into the mapping is live.
        unsafe { reg.dma_write(&h, 100, b"hello NIC") }.unwrap();
        assert_eq!(m.read(100, 9), b"hello NIC");
        assert_eq!(m.read(99, 1), [0x11]);
        let mut out = [0u8; 11];
        reg.dma_read(&h, 99, &mut out).unwrap();
        assert_eq!(&out, b"\x11hello NIC\x11");

        // A transfer spanning several scratch chunks.
        let big = Anon::new(3 << 20);
        let hb = reg.register(big.range(), RW).unwrap();
        let pattern: Vec<u8> = (0..(3usize << 20) - 8).map(|i| (i * 7 % 251) as u8).collect();
        // SAFETY: no Rust reference into the mapping is live.
        unsafe { reg.dma_write(&hb, 8, &pattern) }.unwrap();
        assert!(big.read(8, pattern.len()) == pattern);
        let mut back = vec![0u8; pattern.len()];
        reg.dma_read(&hb, 8, &mut back).unwrap();
        assert!(back == pattern);
        reg.deregister(hb).unwrap();

        // Out of bounds: an error, not a panic, and nothing written.
        for (off, len) in [(65536 - 4, 5usize), (65536, 1), (u64::MAX, 2)] {
            // SAFETY: the call is refused before any write.
            let e = unsafe { reg.dma_write(&h, off, &vec![0xee; len]) }.unwrap_err();
            assert_eq!(e.failure, RegistrarFailure::Fault, "{e}");
            assert!(reg.dma_read(&h, off, &mut vec![0; len]).is_err());
        }
        assert_eq!(m.read(65536 - 4, 4), [0x11; 4]);
        // Empty transfers at the end are fine.
        reg.dma_read(&h, 65536, &mut []).unwrap();
        reg.deregister(h).unwrap();
    }

    /// The hazard a registration cache must handle: the registration outlives
    /// the mapping, and the NIC writes into frames the program no longer sees.
    #[test]
    fn stale_registration_writes_old_frames() {
        let _g = serial();
        let reg = UringRegistrar::new(4).unwrap();
        let m = Anon::new(64 << 10);
        m.fill(0xaa);
        let pfn_before = pagemap::pfns(m.range()).unwrap();
        let h = reg.register(m.range(), RW).unwrap();

        m.remap_fresh(); // munmap + mmap(MAP_FIXED) at the same address, touched.
        if pagemap::pfns_available() {
            let pfn_after = pagemap::pfns(m.range()).unwrap();
            assert!(pfn_before.iter().all(Option::is_some) && pfn_after.iter().all(Option::is_some));
            assert!(pfn_before.iter().zip(&pfn_after).all(|(a, b)| a != b), "new frames behind the address");
        } else {
            eprintln!("pagemap PFNs unavailable (not root?): frame check skipped");
        }

        // SAFETY: the target frames are no longer mapped anywhere in the process.
        unsafe { reg.dma_write(&h, 0, b"stale data") }.expect("the kernel accepts DMA through a stale slot");
        assert_eq!(m.read(0, 10), [0u8; 10], "the application does not see the NIC's write");
        let mut out = [0u8; 12];
        reg.dma_read(&h, 0, &mut out).unwrap();
        assert_eq!(&out, b"stale data\xaa\xaa", "the old frames got it (and still hold the old contents)");

        let (slot, addr) = (h.slot, h.range.addr);
        reg.deregister(h).unwrap();
        // `h` is consumed: no dma_* call can name it any more. Underneath, the
        // kernel slot is really empty:
        let e = reg.raw_write_slot(slot, addr, b"x").unwrap_err();
        assert_eq!((e.failure, e.errno), (RegistrarFailure::Fault, libc::EFAULT), "{e}");
    }

    /// Writable MAP_SHARED mappings of a disk file cannot be pinned long-term.
    #[test]
    fn shared_writable_file_mapping_fails_with_fault() {
        let _g = serial();
        let mut statfs: libc::statfs = {
            // SAFETY: statfs is plain old data; all-zero is a valid value.
            unsafe { std::mem::zeroed() }
        };
        let dir = [std::env::temp_dir(), std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))].into_iter().find(|d| {
            let c = std::ffi::CString::new(d.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: valid C string and a valid out-pointer.
            unsafe { libc::statfs(c.as_ptr(), &mut statfs) == 0 && statfs.f_type != libc::TMPFS_MAGIC }
        });
        let Some(dir) = dir else {
            eprintln!("no disk-backed directory found: shared-file-mapping check skipped");
            return;
        };
        let path = dir.join(format!("mrcache-uring-test-{}", std::process::id()));
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        file.set_len(64 << 10).unwrap();
        let map = |flags| {
            // SAFETY: mapping 64 KiB of our own file at a kernel-chosen address.
            let p = unsafe { libc::mmap(std::ptr::null_mut(), 64 << 10, libc::PROT_READ | libc::PROT_WRITE, flags, file.as_raw_fd(), 0) };
            assert_ne!(p, libc::MAP_FAILED);
            // SAFETY: the fresh mapping is 64 KiB and writable.
            unsafe { std::ptr::write_bytes(p as *mut u8, 1, 64 << 10) };
            Anon { addr: p as u64, len: 64 << 10 }
        };
        let reg = UringRegistrar::new(2).unwrap();
        let shared = map(libc::MAP_SHARED);
        let e = reg.register(shared.range(), RW).unwrap_err();
        assert_eq!((e.failure, e.errno), (RegistrarFailure::Fault, libc::EFAULT), "{e}");
        assert_eq!(reg.in_use(), 0);
        let private = map(libc::MAP_PRIVATE);
        let h = reg.register(private.range(), RW).expect("MAP_PRIVATE copies are pinnable");
        reg.deregister(h).unwrap();
    }

    #[test]
    fn foreign_handles_are_refused() {
        let _g = serial();
        let a = UringRegistrar::new(2).unwrap();
        let b = UringRegistrar::new(2).unwrap();
        let m = Anon::new(4096);
        let h = a.register(m.range(), RW).unwrap();
        assert!(b.dma_read(&h, 0, &mut [0u8; 1]).is_err());
        assert!(b.deregister(h).is_err());
        assert_eq!(a.in_use(), 1, "a's slot stays taken: its handle was consumed by the wrong registrar");
    }

    #[test]
    fn concurrent_register_deregister() {
        let _g = serial();
        let reg = UringRegistrar::new(64).unwrap();
        let m = Anon::new(256 << 10);
        m.fill(3);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (reg, m) = (&reg, &m);
                s.spawn(move || {
                    for i in 0..200u64 {
                        let r = Range::new(m.addr + ((t * 16 + i % 16) << 12), 4096).unwrap();
                        let h = reg.register(r, RW).unwrap();
                        let mut b = [0u8; 1];
                        reg.dma_read(&h, 0, &mut b).unwrap();
                        assert_eq!(b, [3]);
                        reg.deregister(h).unwrap();
                    }
                });
            }
        });
        assert_eq!(reg.in_use(), 0);
    }

    /// Not an assertion: prints the cost of register + deregister (run with
    /// `--nocapture`).
    #[test]
    fn register_cost_report() {
        let _g = serial();
        let reg = UringRegistrar::new(1).unwrap();
        for len in [4u64 << 10, 64 << 10, 1 << 20] {
            let m = Anon::new(len);
            m.fill(1);
            let mut t: Vec<u128> = (0..51)
                .map(|_| {
                    let start = Instant::now();
                    let h = reg.register(m.range(), RW).unwrap();
                    reg.deregister(h).unwrap();
                    start.elapsed().as_nanos()
                })
                .collect();
            t.sort_unstable();
            eprintln!("uring register+deregister {:>5} KiB: median {:.1} us", len >> 10, t[25] as f64 / 1000.0);
        }
    }
}
