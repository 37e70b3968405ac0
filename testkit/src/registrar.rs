//! [`TestRegistrar`]: wraps any registrar to observe and perturb it.
//!
//! - every call is logged ([`Call`]) with a serial number per successful
//!   registration, so a harness can map deregistrations back to the cache's
//!   registration ids and check *exactly once* (spec.md#P4);
//! - failures are injected from a script ([`TestRegistrar::fail_next`]) or at
//!   random with a seeded generator ([`TestRegistrar::with_random_faults`]):
//!   ENOMEM, EAGAIN, EFAULT, EINVAL (spec.md#S5.4);
//! - a hook ([`TestRegistrar::set_hook`]) runs inside `register`, after the
//!   inner registrar pinned the range: it raises release events from inside a
//!   cache operation (spec.md#S3.7, P6), explicitly or by really freeing memory;
//! - with [`TestRegistrar::record_pfns`], each handle remembers the frames its
//!   registration pinned (`/proc/self/pagemap`, read right after pinning and
//!   before the hook), the second oracle of the stale-DMA harness.

use mrcache::pagemap;
use mrcache::registrar::{Keys, Registrar, RegistrarError};
use mrcache_types::{Access, Range};
use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use super::rng::Rng;

/// One registrar call, as the log records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// `register(range, access)` succeeded and got `serial`.
    Register { serial: u64, range: Range, access: Access },
    /// `deregister` of the registration with `serial`.
    Deregister { serial: u64 },
    /// `register` failed with `errno`; `injected` if the test made it fail.
    Failed { range: Range, errno: i32, injected: bool },
}

/// The handle of a [`TestRegistrar`] registration.
#[derive(Debug)]
pub struct TestHandle<H> {
    /// Order of successful registrations in this registrar, from 0.
    pub serial: u64,
    pub range: Range,
    pub access: Access,
    /// The frames pinned, one per page of `range` (with `record_pfns`).
    pub pfns: Option<Vec<Option<u64>>>,
    pub inner: H,
}

/// Code run inside `register` after a successful pin; gets the range.
pub type Hook = Box<dyn Fn(Range) + Send + Sync>;

/// What [`TestRegistrar::set_observer`]'s callback is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegisterCall {
    /// A `register` call begins.
    Begin(Range),
    /// It failed (injected or not) with this errno.
    Failed(i32),
}

/// Code told of every `register` call's start and failure.
pub type Observer = Box<dyn Fn(RegisterCall) + Send + Sync>;

/// Seeded random fault injection.
#[derive(Debug)]
struct RandomFaults {
    rng: Rng,
    per_mille: u64,
    errnos: Vec<i32>,
}

/// A registrar wrapper that logs, injects failures and runs a hook. See the
/// module docs.
pub struct TestRegistrar<R: Registrar> {
    pub inner: R,
    next_serial: AtomicU64,
    logging: bool,
    record_pfns: bool,
    log: Mutex<Vec<Call>>,
    script: Mutex<VecDeque<Option<i32>>>,
    random: Mutex<Option<RandomFaults>>,
    hook: OnceLock<Hook>,
    observer: OnceLock<Observer>,
    live: Mutex<HashSet<u64>>,
    pub registered: AtomicU64,
    pub deregistered: AtomicU64,
    /// `register` calls that failed (injected or not).
    pub failed: AtomicU64,
    pub injected: AtomicU64,
    /// `deregister` of a serial that is not live: a second deregistration (P4).
    pub double_deregistrations: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<R: Registrar> TestRegistrar<R> {
    /// Logging on, no faults, no hook, no PFN capture.
    pub fn new(inner: R) -> Self {
        TestRegistrar {
            inner,
            next_serial: AtomicU64::new(0),
            logging: true,
            record_pfns: false,
            log: Mutex::new(Vec::new()),
            script: Mutex::new(VecDeque::new()),
            random: Mutex::new(None),
            hook: OnceLock::new(),
            observer: OnceLock::new(),
            live: Mutex::new(HashSet::new()),
            registered: AtomicU64::new(0),
            deregistered: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            injected: AtomicU64::new(0),
            double_deregistrations: AtomicU64::new(0),
        }
    }

    /// Turns the call log off (long runs) or on.
    pub fn logging(mut self, on: bool) -> Self {
        self.logging = on;
        self
    }

    /// Each handle remembers the PFNs it pinned.
    pub fn record_pfns(mut self, on: bool) -> Self {
        self.record_pfns = on;
        self
    }

    /// Fails `per_mille`/1000 of the `register` calls, with an errno drawn
    /// from `errnos`, deterministically from `seed`.
    pub fn with_random_faults(self, seed: u64, per_mille: u64, errnos: &[i32]) -> Self {
        *lock(&self.random) = Some(RandomFaults { rng: Rng::new(seed), per_mille, errnos: errnos.to_vec() });
        self
    }

    /// Installs the hook run inside `register` (once; later calls are ignored
    /// and return `false`).
    pub fn set_hook(&self, hook: Hook) -> bool {
        self.hook.set(hook).is_ok()
    }

    /// Installs the observer of `register` calls (once; later calls are
    /// ignored and return `false`).
    pub fn set_observer(&self, observer: Observer) -> bool {
        self.observer.set(observer).is_ok()
    }

    fn observe(&self, call: RegisterCall) {
        if let Some(o) = self.observer.get() {
            o(call);
        }
    }

    /// The next `register` calls: `Some(errno)` fails with it, `None`
    /// succeeds. Scripted entries come before random faults.
    pub fn fail_next(&self, errnos: &[Option<i32>]) {
        lock(&self.script).extend(errnos.iter().copied());
    }

    /// Drops scripted failures that were not consumed.
    pub fn clear_script(&self) -> usize {
        std::mem::take(&mut *lock(&self.script)).len()
    }

    /// The calls logged since the last call.
    pub fn take_log(&self) -> Vec<Call> {
        std::mem::take(&mut *lock(&self.log))
    }

    /// Registrations not deregistered yet.
    pub fn live(&self) -> u64 {
        lock(&self.live).len() as u64
    }

    /// Serials of the live registrations, sorted.
    pub fn live_serials(&self) -> Vec<u64> {
        let mut v: Vec<u64> = lock(&self.live).iter().copied().collect();
        v.sort_unstable();
        v
    }

    fn log(&self, call: Call) {
        if self.logging {
            lock(&self.log).push(call);
        }
    }

    fn injected_errno(&self) -> Option<i32> {
        if let Some(entry) = lock(&self.script).pop_front() {
            return entry;
        }
        let mut random = lock(&self.random);
        let r = random.as_mut()?;
        if r.errnos.is_empty() || !r.rng.chance(r.per_mille, 1000) {
            return None;
        }
        Some(*r.rng.pick(&r.errnos))
    }
}

impl<R: Registrar> Registrar for TestRegistrar<R> {
    type Handle = TestHandle<R::Handle>;

    fn register(&self, range: Range, access: Access) -> Result<Self::Handle, RegistrarError> {
        self.observe(RegisterCall::Begin(range));
        if let Some(errno) = self.injected_errno() {
            self.failed.fetch_add(1, Ordering::Relaxed);
            self.injected.fetch_add(1, Ordering::Relaxed);
            self.log(Call::Failed { range, errno, injected: true });
            self.observe(RegisterCall::Failed(errno));
            return Err(RegistrarError::from_errno("test_register", errno, "injected failure"));
        }
        let inner = match self.inner.register(range, access) {
            Ok(h) => h,
            Err(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                self.log(Call::Failed { range, errno: e.errno, injected: false });
                self.observe(RegisterCall::Failed(e.errno));
                return Err(e);
            }
        };
        // Right after pinning: these are the frames the registration holds.
        let pfns = if self.record_pfns { pagemap::pfns(range).ok() } else { None };
        let serial = self.next_serial.fetch_add(1, Ordering::Relaxed);
        lock(&self.live).insert(serial);
        self.registered.fetch_add(1, Ordering::Relaxed);
        self.log(Call::Register { serial, range, access });
        if let Some(hook) = self.hook.get() {
            hook(range);
        }
        Ok(TestHandle { serial, range, access, pfns, inner })
    }

    fn deregister(&self, handle: Self::Handle) -> Result<(), RegistrarError> {
        if !lock(&self.live).remove(&handle.serial) {
            self.double_deregistrations.fetch_add(1, Ordering::Relaxed);
        }
        self.deregistered.fetch_add(1, Ordering::Relaxed);
        self.log(Call::Deregister { serial: handle.serial });
        self.inner.deregister(handle.inner)
    }

    fn keys(&self, handle: &Self::Handle) -> Keys {
        self.inner.keys(&handle.inner)
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }
}

impl<R: Registrar> std::fmt::Debug for TestRegistrar<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestRegistrar")
            .field("inner", &self.inner.name())
            .field("registered", &self.registered.load(Ordering::Relaxed))
            .field("deregistered", &self.deregistered.load(Ordering::Relaxed))
            .field("failed", &self.failed.load(Ordering::Relaxed))
            .finish()
    }
}

/// The errno a [`mrcache_types::RegistrarFailure`] stands for (scripts that
/// reproduce a trace's expected registrar failures).
pub fn errno_of(failure: mrcache_types::RegistrarFailure) -> i32 {
    use mrcache_types::RegistrarFailure::*;
    match failure {
        NoMemory => libc::ENOMEM,
        Again => libc::EAGAIN,
        Fault => libc::EFAULT,
        Other => libc::EINVAL,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mrcache::registrar::counting::CountingRegistrar;

    #[test]
    fn logs_injects_and_checks_exactly_once() {
        let r = TestRegistrar::new(CountingRegistrar::default());
        let range = Range::new(0x1000, 0x1000).unwrap();
        r.fail_next(&[Some(libc::ENOMEM), None]);
        assert_eq!(r.register(range, Access::LOCAL_READ).unwrap_err().errno, libc::ENOMEM);
        let h = r.register(range, Access::LOCAL_READ).unwrap();
        assert_eq!((h.serial, r.live()), (0, 1));
        r.deregister(h).unwrap();
        assert_eq!(r.live(), 0);
        let log = r.take_log();
        assert_eq!(log.len(), 3);
        assert!(matches!(log[0], Call::Failed { injected: true, .. }));
        assert_eq!(log[2], Call::Deregister { serial: 0 });

        let r = TestRegistrar::new(CountingRegistrar::default()).with_random_faults(1, 500, &[libc::EAGAIN]);
        let fails = (0..1000).filter(|_| r.register(range, Access::LOCAL_READ).is_err()).count();
        assert!((350..650).contains(&fails), "{fails}");
    }
}
