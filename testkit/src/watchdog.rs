//! No test may hang: run a body on its own thread and give up after a bound.
//!
//! A deadlock then fails the test with a message instead of stalling CI.
//! The stuck thread is left behind (it cannot be killed); the test process
//! exits when the harness finishes.

use std::sync::mpsc;
use std::time::Duration;

/// Runs `f` on a new thread; `Err` if it does not finish within `limit`
/// (a deadlock), or with the panic message if it panicked.
pub fn run_with_timeout<T: Send + 'static>(what: &str, limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::Builder::new()
        .name(format!("watchdog: {what}"))
        .spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            let _ = tx.send(r);
        })
        .map_err(|e| format!("{what}: cannot spawn: {e}"))?;
    match rx.recv_timeout(limit) {
        Ok(Ok(v)) => {
            let _ = handle.join();
            Ok(v)
        }
        Ok(Err(panic)) => {
            let _ = handle.join();
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            Err(format!("{what}: panicked: {msg}"))
        }
        Err(_) => Err(format!("{what}: no result after {limit:?}: deadlock (P6) or hang")),
    }
}

/// Whether the tests run in `ci/stress.sh contention` (`MRCACHE_CONTENTION`
/// set): the cores are oversubscribed on purpose. Rate and time assertions
/// are measured on a quiet machine, so they are skipped then; the safety
/// properties are checked as always, and a hang still fails (see
/// [`must_finish`]).
pub fn contention() -> bool {
    std::env::var_os("MRCACHE_CONTENTION").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Deadlines of [`must_finish`] are ten times longer under [`contention`]:
/// a test there may get a fraction of a core for minutes, and what it checks
/// is that nothing hangs, not how fast it runs.
pub const CONTENTION_DEADLINE_FACTOR: u32 = 10;

/// [`run_with_timeout`], panicking on timeout or panic (for tests).
pub fn must_finish<T: Send + 'static>(what: &str, limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let limit = if contention() { limit * CONTENTION_DEADLINE_FACTOR } else { limit };
    match run_with_timeout(what, limit, f) {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_out_and_reports_panics() {
        assert_eq!(run_with_timeout("quick", Duration::from_secs(5), || 7).unwrap(), 7);
        let e = run_with_timeout("stuck", Duration::from_millis(50), || std::thread::sleep(Duration::from_secs(2)));
        assert!(e.unwrap_err().contains("deadlock"));
        let e = run_with_timeout("boom", Duration::from_secs(5), || panic!("kaput"));
        assert!(e.unwrap_err().contains("kaput"));
    }
}
