//! The memory the harness owns: the arena of slots and the churners' scratch
//! reservations ([`Arena`], unmapped on drop, after the cache is gone), and
//! the raw mapping calls the churns and the race use.
//!
//! Every hole a churn opens is refilled with `MAP_FIXED_NOREPLACE`, which
//! never replaces a mapping someone else put there: a slot whose hole was
//! taken is given up, never written to.

use mrcache::mem::page_size;

/// Anonymous private pages at `addr` (`MAP_FIXED` replaces what is there;
/// `MAP_FIXED_NOREPLACE` fails if anything is). `Err(errno)`.
pub(super) fn map_at(addr: u64, len: u64, fixed: libc::c_int, prot: libc::c_int) -> Result<(), i32> {
    // SAFETY: callers pass page-aligned ranges inside mappings this harness
    // owns (arena slots, scratch areas) and hold the slot's lock, so no Rust
    // reference into them is live; MAP_FIXED_NOREPLACE never replaces anything.
    unsafe { crate::pages::map_at(addr, len, fixed, prot) }
}

pub(super) const RW_PROT: libc::c_int = libc::PROT_READ | libc::PROT_WRITE;

/// The mappings the harness owns; unmapped on drop (after the cache is gone).
pub(super) struct Arena {
    pub(super) base: u64,
    len: u64,
    pub(super) scratch: Vec<u64>,
    slot_bytes: u64,
}

impl Arena {
    pub(super) fn new(slots: u64, slot_bytes: u64, scratch: u32) -> Result<Arena, String> {
        let len = slots * slot_bytes;
        let base = mrcache::mem::map_anon(len, 0).map_err(|e| format!("arena mmap of {len} bytes: {e}"))?;
        let mut arena = Arena { base, len, scratch: Vec::new(), slot_bytes };
        for _ in 0..scratch {
            // SAFETY: as above; PROT_NONE reservations for mremap targets.
            let s = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    slot_bytes as usize,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if s == libc::MAP_FAILED {
                return Err(format!("scratch mmap: {}", std::io::Error::last_os_error()));
            }
            arena.scratch.push(s as u64);
        }
        // Touch every page.
        // SAFETY: our fresh writable mapping of `len` bytes; no reference into it exists.
        unsafe { std::ptr::write_bytes(arena.base as *mut u8, 0x5a, len as usize) };
        Ok(arena)
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: our own mappings (holes left by dead slots are harmless to munmap).
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.len as usize);
            for &s in &self.scratch {
                libc::munmap(s as *mut libc::c_void, self.slot_bytes as usize);
            }
        }
    }
}

pub(super) fn unmapped_any(addr: u64, len: u64) -> bool {
    unmapped(addr, len, page_size())
}

/// Maps fresh pages into every hole of the slot (`MAP_FIXED_NOREPLACE`,
/// page by page). `false` if a hole could not be refilled, or was taken by
/// another mapping between the check and the map (the slot is then given
/// up and never touched again).
///
/// The harness assumes no other thread of the process maps memory at a
/// kernel-chosen address while a churn has a hole open (threads are all
/// started first; tests using the harness run one at a time): a mapping
/// that slipped into a hole before the check would be taken for ours.
pub(super) fn refill_holes(slot_addr: u64, slot_bytes: u64) -> bool {
    let page = page_size();
    (0..slot_bytes / page)
        .map(|i| slot_addr + i * page)
        .all(|p| !unmapped(p, page, page) || map_at(p, page, libc::MAP_FIXED_NOREPLACE, RW_PROT).is_ok())
}

pub(super) fn unmapped(addr: u64, len: u64, page: u64) -> bool {
    let mut v = vec![0u8; (len / page) as usize];
    // SAFETY: mincore only reads page tables; `v` has one byte per page.
    unsafe { libc::mincore(addr as *mut libc::c_void, len as usize, v.as_mut_ptr()) != 0 }
}
