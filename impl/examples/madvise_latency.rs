//! What the madvise proof (spec.md#M3, M4, S7.5) costs: madvise(DONTNEED)
//! of a cached, watched 2-page buffer, with T threads in the process.
//!
//! Modes, same workload and same thread count:
//! - `plain`: the userfaultfd monitor with the fault switch
//!   `remove-without-window` (no window for a REMOVE: S7.4(b) open);
//! - `proof`: M3/M4 (the default).
//!
//! Per madvise it records the call's latency, and in `proof` mode the time
//! from its return until the monitor proved it and closed the window (the
//! pages are served uncached meanwhile). Between rounds the buffer is
//! acquired again (cached) and written (faulted in). The T-1 other threads
//! are idle (blocked in a condition variable, as MPI progress threads and
//! pools mostly are), or with `--busy` spin in user space (they then get the
//! proof signal).
//!
//! `cargo run --release -p mrcache --example madvise_latency -- [--rounds N] [--busy] T...`
//! Prints one line per (mode, T): p50 and p99 in µs.

use mrcache::registrar::counting::CountingRegistrar;
use mrcache::{Cache, CacheConfig, MonitorThread, Monitoring};
use mrcache_types::Access;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn run(threads: usize, rounds: usize, proof: bool, busy: bool) -> (Vec<f64>, Vec<f64>, u64) {
    let page = 4096usize;
    let len = 2 * page;
    let mut cfg = CacheConfig::default().monitored_by(Monitoring::Userfaultfd);
    cfg.faults.remove_without_window = !proof;
    let cache = Arc::new(Cache::new(CountingRegistrar::default(), cfg));
    let _monitor = MonitorThread::start(&cache).expect("userfaultfd monitor (root, or vm.unprivileged_userfaultfd=1)");
    // SAFETY: a fresh private anonymous mapping, ours until the end.
    let buf = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    } as *mut u8;
    assert!(buf as *mut libc::c_void != libc::MAP_FAILED);
    let stop = Arc::new(AtomicBool::new(false));
    let park = Arc::new((Mutex::new(false), Condvar::new()));
    let others: Vec<_> = (1..threads)
        .map(|_| {
            let (stop, park) = (stop.clone(), park.clone());
            std::thread::spawn(move || {
                if busy {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                } else {
                    let (m, cv) = &*park;
                    let mut done = m.lock().unwrap();
                    while !*done {
                        done = cv.wait(done).unwrap();
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(20));
    let (mut call, mut window) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    let mut unproven = 0;
    for _ in 0..rounds {
        // SAFETY: our mapping; nothing else references it.
        unsafe { std::ptr::write_bytes(buf, 1, len) };
        drop(cache.acquire(buf as u64, len as u64, Access::LOCAL_WRITE).expect("acquire"));
        let closed_before = cache.diagnostics().remove_windows_closed;
        let t0 = Instant::now();
        // SAFETY: as above; the mapping stays, its frames go.
        unsafe { libc::madvise(buf.cast(), len, libc::MADV_DONTNEED) };
        let t1 = Instant::now();
        call.push((t1 - t0).as_secs_f64() * 1e6);
        if proof {
            // Bounded: a window not closed within 1 s is counted, not waited for.
            let deadline = t1 + Duration::from_secs(1);
            while cache.diagnostics().remove_windows_closed == closed_before && Instant::now() < deadline {
                std::thread::yield_now();
            }
            if cache.diagnostics().remove_windows_closed == closed_before {
                unproven += 1;
            } else {
                window.push(t1.elapsed().as_secs_f64() * 1e6);
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    *park.0.lock().unwrap() = true;
    park.1.notify_all();
    for h in others {
        h.join().unwrap();
    }
    drop(_monitor);
    cache.flush();
    // The cache (and its userfaultfd) goes first: a munmap of watched memory
    // with no monitor reading would wait forever for its event to be read.
    drop(cache);
    // SAFETY: our mapping, no lease held.
    unsafe { libc::munmap(buf.cast(), len) };
    (call, window, unproven)
}

fn main() {
    let mut rounds = 2000usize;
    let mut busy = false;
    let mut counts = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => rounds = args.next().and_then(|v| v.parse().ok()).expect("--rounds N"),
            "--busy" => busy = true,
            t => counts.push(t.parse::<usize>().unwrap_or_else(|_| panic!("not a thread count: {t}"))),
        }
    }
    if counts.is_empty() {
        counts = vec![1, 4, 16, 64];
    }
    println!(
        "madvise(DONTNEED) of a cached, watched 2-page buffer, {rounds} rounds; other threads {}",
        if busy { "spinning" } else { "idle" }
    );
    println!(
        "{:>7} {:>28} {:>28} {:>32}",
        "threads", "plain: madvise p50/p99 µs", "proof: madvise p50/p99 µs", "proof: window open p50/p99 µs"
    );
    for &t in &counts {
        let (mut plain, _, _) = run(t, rounds, false, busy);
        let (mut call, mut window, unproven) = run(t, rounds, true, busy);
        let w = if window.is_empty() { (f64::NAN, f64::NAN) } else { (pct(&mut window, 0.5), pct(&mut window, 0.99)) };
        println!(
            "{:>7} {:>19.1} / {:>6.1} {:>19.1} / {:>6.1} {:>21.1} / {:>7.1}{}",
            t,
            pct(&mut plain, 0.5),
            pct(&mut plain, 0.99),
            pct(&mut call, 0.5),
            pct(&mut call, 0.99),
            w.0,
            w.1,
            if unproven > 0 { format!("  ({unproven} not proven within 1 s)") } else { String::new() }
        );
    }
}
