//! Fresh anonymous pages at a fixed address: the one `mmap` the kit's
//! real-memory harnesses (the DMA oracle's arena, replay's arena) use to
//! give pages back and take new ones in their place.

/// Maps anonymous private pages with `prot` at `addr` (`fixed`:
/// `MAP_FIXED` replaces what is there; `MAP_FIXED_NOREPLACE` fails if
/// anything is; other flags, such as `MAP_NORESERVE`, may be or-ed in).
/// `Err(errno)`.
///
/// # Safety
/// `[addr, addr+len)` must be page-aligned and lie inside mappings the
/// caller owns, with no Rust reference into them live: with `MAP_FIXED`
/// their old pages are gone when this returns.
pub(crate) unsafe fn map_at(addr: u64, len: u64, fixed: libc::c_int, prot: libc::c_int) -> Result<(), i32> {
    // SAFETY: the caller's contract above.
    let p = unsafe { libc::mmap(addr as *mut libc::c_void, len as usize, prot, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | fixed, -1, 0) };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO));
    }
    if p as u64 != addr {
        // An old kernel took NOREPLACE as a hint: undo, report EEXIST.
        // SAFETY: the mapping we just got, nobody else knows of it.
        unsafe { libc::munmap(p, len as usize) };
        return Err(libc::EEXIST);
    }
    Ok(())
}
