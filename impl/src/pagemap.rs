//! Which physical frames back a range: a reader of `/proc/self/pagemap`.
//!
//! Used by tests and diagnostics to show that after `munmap` + `mmap` at the
//! same address the frames changed (so a registration made before points at
//! frames the program no longer maps).
//!
//! Invariants:
//! - [`pfns`] returns one entry per page of `range.pages(page size)`, in
//!   address order: `Some(pfn)` when the page is present in RAM, `None`
//!   otherwise (never touched, swapped out, or not mapped).
//! - Without `CAP_SYS_ADMIN` the kernel hides frame numbers and present pages
//!   read as `Some(0)`; [`pfns_available`] says whether PFNs are real.
//! - Bad input (empty, wrapping or huge ranges) is an error, never a panic.

use mrcache_types::Range;
use std::fs::File;
use std::os::unix::fs::FileExt;

const PAGEMAP: &str = "/proc/self/pagemap";
const PRESENT: u64 = 1 << 63;
const PFN_MASK: u64 = (1 << 55) - 1;
/// Largest range [`pfns`] accepts, in pages (16 GiB of 4 KiB pages).
pub const MAX_PAGES: u64 = 1 << 22;
/// Entries read per `pread`.
const BATCH: usize = 4096;

/// Why the frames of a range could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PagemapError {
    #[error("range {addr:#x}+{len:#x} is empty or wraps")]
    BadRange { addr: u64, len: u64 },
    #[error("range of {pages} pages is larger than the {max} pages pfns() reads")]
    TooLarge { pages: u64, max: u64 },
    #[error("cannot open {PAGEMAP}: {0}")]
    Open(#[source] std::io::Error),
    #[error("reading {PAGEMAP} at page {vpn:#x}: {source}")]
    Read { vpn: u64, source: std::io::Error },
}

use crate::mem::page_size;

/// The frame behind each page of `range`: `Some(pfn)` if present, else `None`.
pub fn pfns(range: Range) -> Result<Vec<Option<u64>>, PagemapError> {
    if range.len == 0 || range.addr.checked_add(range.len).is_none() {
        return Err(PagemapError::BadRange { addr: range.addr, len: range.len });
    }
    let span = range.pages(page_size());
    if span.count() > MAX_PAGES {
        return Err(PagemapError::TooLarge { pages: span.count(), max: MAX_PAGES });
    }
    let file = File::open(PAGEMAP).map_err(PagemapError::Open)?;
    let mut out = Vec::with_capacity(span.count() as usize);
    let mut buf = vec![0u8; BATCH * 8];
    let mut vpn = span.first;
    while vpn < span.end {
        let n = (span.end - vpn).min(BATCH as u64) as usize;
        let bytes = &mut buf[..n * 8];
        // vpn < 2^52 here, so vpn * 8 cannot overflow.
        file.read_exact_at(bytes, vpn * 8).map_err(|source| PagemapError::Read { vpn, source })?;
        out.extend(bytes.chunks_exact(8).map(|e| {
            let entry = u64::from_ne_bytes(e.try_into().expect("chunks_exact(8)"));
            (entry & PRESENT != 0).then_some(entry & PFN_MASK)
        }));
        vpn += n as u64;
    }
    Ok(out)
}

/// True when this process can see real frame numbers (root / CAP_SYS_ADMIN).
pub fn pfns_available() -> bool {
    let probe = std::hint::black_box([1u8; 64]); // on the stack: present.
    let addr = probe.as_ptr() as u64;
    matches!(pfns(Range { addr, len: 1 }).as_deref(), Ok([Some(pfn)]) if *pfn != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mmap(addr: u64, len: usize, flags: i32, fd: i32) -> u64 {
        // SAFETY: anonymous or memfd mapping; with MAP_FIXED only over our own
        // mapping (see callers).
        let p = unsafe { libc::mmap(addr as *mut libc::c_void, len, libc::PROT_READ | libc::PROT_WRITE, flags, fd, 0) };
        assert_ne!(p, libc::MAP_FAILED);
        p as u64
    }

    fn touch(addr: u64) {
        // SAFETY: `addr` is the start of a writable mapping we own.
        unsafe { std::ptr::write_volatile(addr as *mut u8, 1) }
    }

    #[test]
    fn bad_ranges_are_errors() {
        assert!(matches!(pfns(Range { addr: 0x1000, len: 0 }), Err(PagemapError::BadRange { .. })));
        assert!(matches!(pfns(Range { addr: u64::MAX, len: 2 }), Err(PagemapError::BadRange { .. })));
        assert!(matches!(pfns(Range { addr: 0, len: 1 << 40 }), Err(PagemapError::TooLarge { .. })));
    }

    #[test]
    fn untouched_pages_are_absent() {
        let a = mmap(0, 8192, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1);
        touch(a + 4096);
        let v = pfns(Range::new(a, 8192).unwrap()).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[0], None);
        assert!(v[1].is_some());
        // SAFETY: our mapping.
        unsafe { libc::munmap(a as *mut libc::c_void, 8192) };
    }

    /// munmap + mmap at the same address gives new frames. The old frame is
    /// kept alive by a second mapping of the same memfd page, so the kernel
    /// cannot hand it straight back.
    #[test]
    fn remap_changes_the_frame() {
        if !pfns_available() {
            eprintln!("pagemap PFNs read as 0 (need root / CAP_SYS_ADMIN): test skipped");
            return;
        }
        let ps = page_size() as usize;
        // SAFETY: NUL-terminated name, plain flags.
        let fd = unsafe { libc::memfd_create(c"pagemap-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: our fd.
        assert_eq!(unsafe { libc::ftruncate(fd, ps as libc::off_t) }, 0);
        let a = mmap(0, ps, libc::MAP_SHARED, fd);
        let b = mmap(0, ps, libc::MAP_SHARED, fd);
        touch(a);
        touch(b);
        let one = |x| pfns(Range::new(x, 1).unwrap()).unwrap()[0];
        let old = one(a).expect("touched page is present");
        assert_eq!(one(b), Some(old), "two mappings of one memfd page share the frame");

        // SAFETY: unmapping our own page at `a`, then mapping a fresh one there.
        assert_eq!(unsafe { libc::munmap(a as *mut libc::c_void, ps) }, 0);
        assert_eq!(mmap(a, ps, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED, -1), a);
        touch(a);
        let new = one(a).expect("touched page is present");
        assert_ne!(new, old, "same address, different frame");
        assert_eq!(one(b), Some(old));
        // SAFETY: our mappings and fd.
        unsafe {
            libc::munmap(a as *mut libc::c_void, ps);
            libc::munmap(b as *mut libc::c_void, ps);
            libc::close(fd);
        }
    }
}
