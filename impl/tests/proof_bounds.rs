//! The madvise proof's bounds (spec.md#S7.5): a thread that never runs the
//! proof signal's handler (it blocks the signal) keeps the windows it may be
//! inside open, but holds one signal, however many windows wait on it; once
//! it is seen elsewhere or exits, every window closes. Its own test binary:
//! it counts the process's outstanding signals.
//!
//! Before the prover kept one signal per thread, each window sent its own:
//! such a thread took one of the 1,024 signal slots per window it was seen
//! running in, and every pass looked at each of those sends again, so the
//! monitor slowed as the run went on and, with the slots gone, could prove
//! nothing more (50,000 rounds of `s7_4_windows_measured` never finished;
//! the thread was an io_uring worker of the registrar).

use mrcache::monitor::madvise_proof::signals_outstanding;
use mrcache::registrar::counting::CountingRegistrar;
use mrcache::types::Access;
use mrcache::{Cache, CacheConfig, MonitorThread, Monitoring};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PAGE: u64 = 4096;
/// More windows than the prover has signal slots (1,024).
const WINDOWS: u64 = 1_500;

fn open_windows<R: mrcache::registrar::Registrar>(cache: &Cache<R>) -> u64 {
    let d = cache.diagnostics();
    d.remove_windows - d.remove_windows_closed
}

#[test]
//= spec.md#S7.5
fn a_thread_that_blocks_the_signal_holds_one_signal_however_many_windows() {
    let cache = Arc::new(Cache::new(CountingRegistrar::default(), CacheConfig::default().monitored_by(Monitoring::Userfaultfd)));
    let _monitor = MonitorThread::start(&cache).expect("userfaultfd available (root here)");
    let slots = 64;
    let base = mrcache::mem::map_anon(slots * PAGE, 0).unwrap();
    let stop = AtomicBool::new(false);
    let spinning = AtomicBool::new(false);
    std::thread::scope(|s| {
        // Stops the spinner however this thread leaves the scope (a failed
        // assertion included), so the scope's join cannot wait forever.
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Release);
            }
        }
        let stopper = StopOnDrop(&stop);
        let spinner = s.spawn(|| {
            // SAFETY: a full set, then this thread's mask: every signal blocked.
            unsafe {
                let mut all: libc::sigset_t = std::mem::zeroed();
                libc::sigfillset(&mut all);
                assert_eq!(libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut()), 0);
            }
            spinning.store(true, Ordering::Release);
            // In user mode, running: inside any madvise, as far as the prover can tell.
            while !stop.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
        });
        while !spinning.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        let mut most_outstanding = 0;
        for i in 0..WINDOWS {
            let addr = base + (i % slots) * PAGE;
            drop(cache.acquire(addr, PAGE, Access::LOCAL_WRITE).unwrap());
            // SAFETY: a page of our own mapping; no reference into it.
            assert_eq!(unsafe { libc::madvise(addr as *mut libc::c_void, PAGE as usize, libc::MADV_DONTNEED) }, 0);
            most_outstanding = most_outstanding.max(signals_outstanding());
        }
        // The spinner blocks the signal and never leaves user mode: no
        // window it may be inside can close (the safe answer), and it holds
        // one signal (with this thread's and a few others', a handful).
        assert!(open_windows(&*cache) > 0, "{:?}", cache.diagnostics());
        assert!(most_outstanding <= 8, "{most_outstanding} proof signals outstanding at once");
        drop(stopper);
        spinner.join().unwrap();
    });
    // Exited: every window closes, and its signal is forgotten.
    let deadline = Instant::now() + Duration::from_secs(10);
    while (open_windows(&*cache), signals_outstanding()) != (0, 0) {
        assert!(
            Instant::now() < deadline,
            "{} windows open, {} signals outstanding 10 s after the thread exited",
            open_windows(&*cache),
            signals_outstanding()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(cache.diagnostics().remove_windows, WINDOWS, "one window per madvise");
    // SAFETY: our mapping, no lease held.
    unsafe { libc::munmap(base as *mut libc::c_void, (slots * PAGE) as usize) };
}
