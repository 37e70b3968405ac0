//! The commands that act on memory, performed for real: the memory commands
//! (`malloc`, `mmap`, `munmap`, `madvise_*`, `mremap_*`, `free`, `brk_*`:
//! real syscalls inside the adapter's arena or blocks it allocated) and the
//! data commands (`app_write` and `app_read` through the CPU, `dma_in` and
//! `dma_out` through the io_uring pin of the lease's registration).
//!
//! Invariant: a command that releases memory runs the backend's
//! [`Backend::before_release`] hook, then its pause point, then the
//! syscall, then [`Backend::after_release`] only if the syscall succeeded.
//! Above [`super::protocol`] and [`super::registrar`]; no backend is
//! named here.

use super::protocol::{get_u64, os_err, pause_point, Backend, OpResult, PAGE, UNSUPPORTED};
use super::registrar::{LEASE_REGS, PINS};
use serde_json::{json, Map, Value};

/// Writes a pattern over freshly mapped memory, so its pages are present.
pub(super) fn touch(addr: u64, len: u64) {
    // SAFETY: the caller just mapped [addr, addr+len) read-write.
    unsafe { std::ptr::write_bytes(addr as *mut u8, 0x5a, len as usize) };
}

/// Maps fresh anonymous pages at exactly `addr` (with `flags`).
fn map_fresh(addr: u64, len: u64, flags: i32) -> Result<(), (String, i32)> {
    // SAFETY: maps anonymous memory at an address the case names inside the
    // adapter's own arena (the runner checks the bounds); no Rust object lives there.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(os_err("mmap"));
    }
    if p as u64 != addr {
        // SAFETY: the mapping we just made elsewhere.
        unsafe { libc::munmap(p, len as usize) };
        return Err((format!("mmap placed the pages at {p:p}, not {addr:#x}"), 0));
    }
    touch(addr, len);
    Ok(())
}

/// Performs a memory command; returns its reply fields.
pub(super) fn memory_op(b: &dyn Backend, cmd: &str, c: &Map<String, Value>) -> OpResult {
    // SAFETY (all blocks below): the addresses are in the adapter's arena or
    // blocks it allocated for the case; no Rust object lives in them.
    unsafe {
        match cmd {
            "malloc" => {
                let len = get_u64(c, "len")?;
                let p = libc::malloc(len as usize);
                if p.is_null() {
                    return Err(os_err("malloc"));
                }
                touch(p as u64, len);
                Ok(json!({"addr": format!("{:#x}", p as u64)}))
            }
            "brk_grow" => {
                let len = get_u64(c, "len")?;
                let cur = libc::sbrk(0) as u64;
                let top = cur.div_ceil(PAGE) * PAGE;
                if libc::sbrk((top - cur + len) as isize) as isize == -1 {
                    return Err(os_err("sbrk"));
                }
                touch(top, len);
                Ok(json!({"addr": format!("{top:#x}")}))
            }
            "mmap" => {
                let (a, l) = (get_u64(c, "addr")?, get_u64(c, "len")?);
                map_fresh(a, l, libc::MAP_FIXED_NOREPLACE).map(|()| json!({}))
            }
            "scratch" => {
                // The allocator's own traffic: its frees may unmap or madvise
                // (each seen by the backend's hooks as a release).
                let (len, count, rounds) = (get_u64(c, "len")?, get_u64(c, "count").unwrap_or(1), get_u64(c, "rounds").unwrap_or(1));
                for _ in 0..rounds {
                    let mut blocks = Vec::new();
                    for _ in 0..count {
                        let p = libc::malloc(len as usize);
                        if p.is_null() {
                            break;
                        }
                        touch(p as u64, len);
                        blocks.push(p);
                    }
                    let got = blocks.len() as u64;
                    for p in blocks {
                        let (a, l) = ((p as u64).saturating_sub(16), libc::malloc_usable_size(p) as u64 + 16);
                        b.before_release(a, l);
                        libc::free(p);
                        b.after_release(a, l);
                    }
                    if got < count {
                        return Err(os_err("malloc"));
                    }
                }
                Ok(json!({}))
            }
            "unmap_map_cycles" => {
                let (a, l, count) = (get_u64(c, "addr")?, get_u64(c, "len")?, get_u64(c, "count").unwrap_or(1));
                for _ in 0..count {
                    b.before_release(a, l);
                    if libc::munmap(a as *mut libc::c_void, l as usize) != 0 {
                        return Err(os_err("munmap"));
                    }
                    b.after_release(a, l);
                    map_fresh(a, l, libc::MAP_FIXED_NOREPLACE)?;
                }
                Ok(json!({}))
            }
            _ => {
                // A release: the peer's own hooks run inside the syscall.
                let addr = if cmd == "brk_shrink" { 0 } else { get_u64(c, "addr")? };
                let len = if cmd == "free" { 0 } else { get_u64(c, "len")? };
                let (ev_addr, ev_len) = match cmd {
                    "mremap_shrink" => {
                        let n = get_u64(c, "new_len")?;
                        (addr + n, len.saturating_sub(n))
                    }
                    "brk_shrink" => {
                        let cur = libc::sbrk(0) as u64;
                        (cur - len, len)
                    }
                    "free" => (addr.saturating_sub(16), libc::malloc_usable_size(addr as *mut libc::c_void) as u64 + 16),
                    _ => (addr, len),
                };
                b.before_release(ev_addr, ev_len.max(1));
                pause_point();
                let r = match cmd {
                    "munmap" => libc::munmap(addr as *mut libc::c_void, len as usize),
                    "mmap_fixed" => {
                        return map_fresh(addr, len, libc::MAP_FIXED).map(|()| {
                            b.after_release(ev_addr, ev_len);
                            json!({})
                        })
                    }
                    "madvise_dontneed" => libc::madvise(addr as *mut libc::c_void, len as usize, libc::MADV_DONTNEED),
                    "madvise_free" => libc::madvise(addr as *mut libc::c_void, len as usize, libc::MADV_FREE),
                    "mremap_move" => {
                        let t =
                            libc::mmap(std::ptr::null_mut(), len as usize, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
                        if t == libc::MAP_FAILED {
                            return Err(os_err("mmap (mremap target)"));
                        }
                        let p = libc::mremap(
                            addr as *mut libc::c_void,
                            len as usize,
                            len as usize,
                            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                            t,
                        );
                        if p == libc::MAP_FAILED {
                            -1
                        } else if p != t {
                            return Err((format!("mremap(MREMAP_FIXED) put the pages at {p:p}, not at the target {t:p}"), libc::EFAULT));
                        } else {
                            0
                        }
                    }
                    "mremap_shrink" => {
                        let p = libc::mremap(addr as *mut libc::c_void, len as usize, (len - ev_len) as usize, 0);
                        if p == libc::MAP_FAILED {
                            -1
                        } else {
                            0
                        }
                    }
                    "free" => {
                        libc::free(addr as *mut libc::c_void);
                        0
                    }
                    "brk_shrink" => {
                        if libc::sbrk(-(len as isize)) as isize == -1 {
                            -1
                        } else {
                            0
                        }
                    }
                    other => return Err((format!("unknown command `{other}`"), 0)),
                };
                if r != 0 {
                    return Err(os_err(cmd));
                }
                b.after_release(ev_addr, ev_len);
                Ok(json!({}))
            }
        }
    }
}

/// Run-length `[[byte, count], ...]` of `bytes`.
fn runs(bytes: &[u8]) -> Value {
    let mut out: Vec<(u8, u64)> = Vec::new();
    for &b in bytes {
        match out.last_mut() {
            Some((x, n)) if *x == b => *n += 1,
            _ => out.push((b, 1)),
        }
    }
    json!(out.iter().map(|(b, n)| json!([b, n])).collect::<Vec<_>>())
}

/// The data commands (docs/conformance-protocol.md, *Data commands*).
pub(super) fn data_op(cmd: &str, c: &Map<String, Value>) -> OpResult {
    let (addr, len) = (get_u64(c, "addr")?, get_u64(c, "len")?);
    if len == 0 || len > 1 << 20 {
        return Err((format!("{cmd}: length {len} out of range (1 ..= 1 MiB)"), libc::EINVAL));
    }
    let byte = || -> Result<u8, (String, i32)> {
        u8::try_from(get_u64(c, "byte")?).map_err(|_| (format!("{cmd}: `byte` is not a byte"), libc::EINVAL))
    };
    match cmd {
        "app_write" => {
            let b = byte()?;
            // SAFETY: the runner names bytes of the adapter's arena or of a
            // block it allocated for the case; no Rust object lives there.
            unsafe { std::ptr::write_bytes(addr as *mut u8, b, len as usize) };
            return Ok(json!({}));
        }
        "app_read" => {
            // SAFETY: as for app_write; the bytes are copied out at once.
            let v = unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) }.to_vec();
            return Ok(json!({"runs": runs(&v)}));
        }
        _ => {}
    }
    let Some(pins) = PINS.get() else {
        return Err(("the counting registrar pins nothing: no device can move data (run with --registrar io_uring)".into(), UNSUPPORTED));
    };
    let lease = get_u64(c, "lease")?;
    let id = LEASE_REGS.lock().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(|m| m.get(&lease).copied());
    let Some(id) = id else { return Err((format!("{cmd}: lease {lease} is not held"), libc::EINVAL)) };
    let handles = pins.handles.lock().unwrap_or_else(|e| e.into_inner());
    let Some(h) = handles.get(&id) else {
        return Err((
            format!("{cmd}: registration {id} (lease {lease}) holds no pin of this process's io_uring registrar (deregistered, or made before a fork)"),
            libc::EINVAL,
        ));
    };
    if addr < h.range.addr || addr + len > h.range.addr + h.range.len {
        return Err((format!("{cmd}: [{addr:#x}, {:#x}) lies outside registration {id} {}", addr + len, h.range), libc::EFAULT));
    }
    let off = addr - h.range.addr;
    let ring = pins.ring();
    if cmd == "dma_in" {
        let data = vec![byte()?; len as usize];
        // SAFETY: the device writes into pinned frames of the case's memory:
        // no Rust reference points into the arena or the case's blocks, and
        // the runner sends no other command touching them meanwhile.
        unsafe { ring.dma_write(h, off, &data) }.map_err(|e| (format!("dma_in through registration {id}: {e}"), e.errno))?;
        Ok(json!({}))
    } else {
        let mut out = vec![0u8; len as usize];
        ring.dma_read(h, off, &mut out).map_err(|e| (format!("dma_out through registration {id}: {e}"), e.errno))?;
        Ok(json!({"runs": runs(&out)}))
    }
}
