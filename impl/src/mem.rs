//! Process memory: the page size, and private anonymous mappings. The one
//! place that asks the kernel for either (the cache, the monitors, the test
//! kit, the command line and the tests all use it).

use std::io;

/// The kernel's page size (`sysconf(_SC_PAGESIZE)`), or 4096 if it will not
/// say.
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        mrcache_types::PAGE_SIZE
    }
}

/// Maps `len` bytes of private anonymous read-write memory at an address the
/// kernel chooses (plus `extra_flags`, such as `MAP_NORESERVE`), and returns
/// its address. The caller owns the mapping (unmap it, or let the process
/// end).
pub fn map_anon(len: u64, extra_flags: libc::c_int) -> io::Result<u64> {
    let len = usize::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::ENOMEM))?;
    // SAFETY: a fresh private anonymous mapping at a kernel-chosen address
    // (never MAP_FIXED): no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | (extra_flags & !libc::MAP_FIXED),
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_writable_pages() {
        let p = page_size();
        assert!(p.is_power_of_two() && p >= 4096);
        let a = map_anon(2 * p, libc::MAP_NORESERVE).unwrap();
        assert_eq!(a % p, 0);
        // SAFETY: our own fresh mapping of 2 pages.
        unsafe {
            std::ptr::write_bytes(a as *mut u8, 7, (2 * p) as usize);
            assert_eq!(libc::munmap(a as *mut libc::c_void, (2 * p) as usize), 0);
        }
    }
}
