//! Real memory for tests: private anonymous mappings at addresses the
//! kernel chooses, never touching memory anyone else owns.

/// Maps `len` bytes of private anonymous read-write memory and returns its
/// address. Panics with the errno on failure (a test set-up error). The
/// caller owns the mapping (unmap it, or let the process end).
pub fn map_anon(len: u64) -> u64 {
    // SAFETY: a fresh private anonymous mapping at a kernel-chosen address;
    // no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap of {len} bytes: {}", std::io::Error::last_os_error());
    p as u64
}
