//! The madvise proof's signal belongs to the application if it handles it
//! (spec.md#S7.5): the userfaultfd monitor then refuses to start, naming the
//! signal and the variable that chooses another. Its own test binary: the
//! proof signal is installed once per process.

use mrcache::monitor::uffd::UffdError;
use mrcache::registrar::counting::CountingRegistrar;
use mrcache::{Cache, CacheConfig, MonitorThread, Monitoring};
use std::sync::Arc;

extern "C" fn application_handler(_: libc::c_int) {}

#[test]
//= spec.md#S7.5
fn a_signal_the_application_handles_is_refused_by_name() {
    let number = libc::SIGRTMAX() - 2;
    // SAFETY: a plain handler for a real-time signal nobody sends here.
    let old = unsafe { libc::signal(number, application_handler as *const () as libc::sighandler_t) };
    assert_ne!(old, libc::SIG_ERR);
    let cache = Arc::new(Cache::new(CountingRegistrar::default(), CacheConfig::default().monitored_by(Monitoring::Userfaultfd)));
    let err = MonitorThread::start(&cache).err().expect("the monitor must refuse a signal the application handles");
    assert_eq!(err, UffdError::ProofSignal { signal: number, taken: true });
    let msg = err.to_string();
    assert!(msg.contains(&number.to_string()) && msg.contains("MRCACHE_PROOF_SIGNAL"), "{msg}");
    // The application's handler is still there.
    // SAFETY: an all-zero sigaction is a valid value to read into.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: reads the current action only.
    let rc = unsafe { libc::sigaction(number, std::ptr::null(), &mut act) };
    assert_eq!(rc, 0);
    assert_eq!(act.sa_sigaction, application_handler as *const () as usize);
}
