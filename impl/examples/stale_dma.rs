//! A real stale DMA, and the same sequence made correct by a monitor.
//!
//! io_uring fixed buffers pin pages long-term, like `ibv_reg_mr`: they are
//! this machine's loopback NIC. The sequence, run twice:
//!
//! 1. map 64 KiB at X, acquire (miss: registered), release (stays cached);
//! 2. `munmap(X)` and map fresh pages at X: the registration still pins the
//!    *old* frames;
//! 3. acquire X again and DMA a message into it through the lease.
//!
//! Without a monitor the acquire hits the stale registration and the DMA
//! lands in the old frames: the application never sees it. With the
//! userfaultfd monitor the munmap invalidates the entry, the acquire
//! registers the new frames, and the application sees the message.
//!
//! Run: `cargo run -p mrcache --example stale_dma` (as root, or with
//! unprivileged userfaultfd). Exits 1 if either run does not behave so.

use mrcache::registrar::uring::UringRegistrar;
use mrcache::{Cache, CacheConfig, MonitorThread};
use mrcache_types::Access;
use std::sync::Arc;

const LEN: usize = 64 << 10;
const MESSAGE: &[u8] = b"RDMA payload #42";

fn map(at: Option<u64>) -> u64 {
    let (addr, fixed) = match at {
        Some(a) => (a as *mut libc::c_void, libc::MAP_FIXED),
        None => (std::ptr::null_mut(), 0),
    };
    // SAFETY: a private anonymous mapping; with MAP_FIXED it replaces only the
    // example's own buffer, on which no lease is held.
    let p = unsafe { libc::mmap(addr, LEN, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | fixed, -1, 0) };
    assert_ne!(p, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
    p as u64
}

/// Runs the sequence; returns whether the application saw the DMA'd message.
fn run(monitored: bool) -> Result<bool, Box<dyn std::error::Error>> {
    let cache = Arc::new(Cache::new(UringRegistrar::with_defaults()?, CacheConfig::explicit()));
    let _monitor = if monitored { Some(MonitorThread::start(&cache)?) } else { None };
    let x = map(None);
    drop(cache.acquire(x, LEN as u64, Access::LOCAL_WRITE)?);

    // The application frees the buffer and gets new memory at the same address.
    // SAFETY: our own mapping, no lease held. With the monitor, this returns
    // only after the monitor thread has read (and applied) the UNMAP event.
    unsafe { libc::munmap(x as *mut libc::c_void, LEN) };
    assert_eq!(map(Some(x)), x);

    let lease = cache.acquire(x, LEN as u64, Access::LOCAL_WRITE)?;
    // SAFETY: the lease covers [x, x+LEN), which the application maps; the
    // DMA writes MESSAGE.len() bytes at offset 0 of it.
    unsafe { cache.registrar().dma_write(lease.handle(), 0, MESSAGE)? };
    // SAFETY: x maps at least MESSAGE.len() readable bytes.
    let seen = unsafe { std::slice::from_raw_parts(x as *const u8, MESSAGE.len()) } == MESSAGE;
    println!(
        "{:<22} acquire after munmap+mmap: {:<4} -> DMA {}",
        if monitored { "with uffd monitor:" } else { "caching, no monitor:" },
        if lease.hit() { "hit" } else { "miss" },
        if seen { "seen by the application (correct)" } else { "LOST: it went to the old, unmapped frames (stale registration)" }
    );
    drop(lease);
    // SAFETY: our own mapping; the lease is gone.
    unsafe { libc::munmap(x as *mut libc::c_void, LEN) };
    Ok(seen)
}

fn main() -> std::process::ExitCode {
    match (run(false), run(true)) {
        (Ok(false), Ok(true)) => std::process::ExitCode::SUCCESS,
        (a, b) => {
            eprintln!("stale_dma: unexpected outcome: without monitor {a:?}, with monitor {b:?}");
            std::process::ExitCode::FAILURE
        }
    }
}
