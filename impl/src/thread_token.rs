//! A running thread's identity without a thread-local lookup.
//!
//! In a shared library (`libmrcache.so`) every `thread_local!` access is a
//! call to `__tls_get_addr` and a check of the slot's initialisation state
//! (callgrind: about 50 instructions of the C API's 476 per hit, 2026-12-05).
//! The hit path keys three per-thread things by this token instead: this
//! thread's lane ([`crate::cache`]'s lanes), its stripe of the hit counters,
//! and, in the C API, its lease slab free list. On x86_64 Linux the thread
//! pointer itself, `%fs:0`, names the thread. Under loom there is no token
//! (loom's threads share one OS thread), and callers take their
//! thread-local path.
//!
//! Invariants a user may rely on:
//! - while a thread runs, its token is non-zero and no other running thread
//!   has the same one;
//! - a token is reused only by a thread that starts after the previous
//!   holder has exited (glibc and musl place the thread control block in
//!   the thread's stack, and reuse a stack only once the kernel has cleared
//!   the exited thread's tid), so state keyed by a token passes from a dead
//!   thread to its successor, never to a thread running beside it;
//! - `0` means "no token" (other targets): callers then use their shared
//!   path.
//!
//! The second invariant is the C library's: it holds for threads made by
//! `pthread_create` (including ones given their own stack, which POSIX lets
//! the caller reuse only after the thread has exited). A thread made with a
//! raw `clone` whose TLS block is recycled while another thread still uses
//! it would break it; such a thread cannot call into libc safely either.

/// This thread's token, or 0 where there is none.
#[cfg(all(target_arch = "x86_64", target_os = "linux", not(loom)))]
#[inline(always)]
pub fn thread_token() -> usize {
    let tp: usize;
    // SAFETY: on x86_64 Linux (glibc, musl) `%fs:0` holds the thread control
    // block's pointer to itself (the ABI's TLS variant II): always mapped
    // and readable by its thread, and never 0 once the thread runs Rust.
    unsafe { std::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags, pure)) };
    tp
}

/// This thread's token, or 0 where there is none.
#[cfg(not(all(target_arch = "x86_64", target_os = "linux", not(loom))))]
#[inline(always)]
pub fn thread_token() -> usize {
    0
}

/// A bucket in `0..buckets` (a power of two) for `token`: Fibonacci hashing
/// of the bits above the cache line (thread control blocks are aligned and
/// often a stack size apart, so the low bits say little).
#[inline(always)]
pub fn bucket(token: usize, buckets: usize) -> usize {
    debug_assert!(buckets.is_power_of_two() && buckets > 1);
    ((token >> 6).wrapping_mul(0x9E37_79B9_7F4A_7C15_u64 as usize) >> (usize::BITS - buckets.trailing_zeros())) & (buckets - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_threads_have_distinct_tokens() {
        let me = thread_token();
        let others: Vec<usize> = (0..8).map(|_| std::thread::spawn(thread_token)).map(|t| t.join().unwrap()).collect();
        if thread_token() != 0 {
            assert_ne!(me, 0);
            assert!(others.iter().all(|&t| t != 0 && t != me), "a joined thread's token is not the main thread's");
            assert_eq!(thread_token(), me, "stable within a thread");
        }
        // Threads alive at once: all distinct.
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
        // All spawned before any is joined: each waits for the others.
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let b = barrier.clone();
                std::thread::spawn(move || {
                    let t = thread_token();
                    b.wait();
                    t
                })
            })
            .collect();
        let alive: Vec<usize> = handles.into_iter().map(|t| t.join().unwrap()).collect();
        let mut sorted = alive.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if me != 0 {
            assert_eq!(sorted.len(), alive.len(), "tokens of threads running at once: {alive:x?}");
        }
        for t in alive {
            assert!(bucket(t, 64) < 64);
        }
    }
}
