//! A registration whose callback never returns (spec.md#S7.8): the registrar
//! adapter runs the `on_abandon` of `register_abandonable` before the
//! callback's jump skips the cache's frames. A jump cannot be made from Rust, so the test's
//! registrar abandons, then panics (the panic stands for "never returns":
//! the cache's frames above it do no more work); the control panics without
//! abandoning. The in-flight record is gone only when abandoned, and the
//! cache goes on: the range registers afresh.

use mrcache::registrar::counting::CountingRegistrar;
use mrcache::registrar::{Keys, Registrar, RegistrarError};
use mrcache::{Cache, CacheConfig};
use mrcache_types::{Access, Range};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, Ordering};

/// Counts like `CountingRegistrar`; its first `escapes` registrations
/// abandon (if `abandons`) and panic.
struct Escaping {
    inner: CountingRegistrar,
    escapes: AtomicU32,
    abandons: bool,
}

impl Registrar for Escaping {
    type Handle = <CountingRegistrar as Registrar>::Handle;

    fn register(&self, range: Range, access: Access) -> Result<Self::Handle, RegistrarError> {
        self.inner.register(range, access)
    }

    fn register_abandonable(&self, range: Range, access: Access, on_abandon: &mut dyn FnMut()) -> Result<Self::Handle, RegistrarError> {
        if self.escapes.load(Ordering::SeqCst) > 0 {
            self.escapes.fetch_sub(1, Ordering::SeqCst);
            if self.abandons {
                on_abandon();
            }
            panic!("the callback left by a jump");
        }
        self.inner.register(range, access)
    }

    fn deregister(&self, handle: Self::Handle) -> Result<(), RegistrarError> {
        self.inner.deregister(handle)
    }

    fn keys(&self, handle: &Self::Handle) -> Keys {
        self.inner.keys(handle)
    }

    fn name(&self) -> &'static str {
        "escaping"
    }
}

fn in_flight_after_escape(abandons: bool) -> Option<u64> {
    let reg = Escaping { inner: CountingRegistrar::default(), escapes: AtomicU32::new(1), abandons };
    let cache = Cache::new(reg, CacheConfig::explicit());
    let escaped = catch_unwind(AssertUnwindSafe(|| cache.acquire(0x10000, 4096, Access::LOCAL_WRITE).map(drop)));
    assert!(escaped.is_err(), "the registrar escaped");
    let left = cache.diagnostics().registrations_in_flight;
    // Nothing else is stuck: the next acquire registers and caches.
    cache.acquire(0x10000, 4096, Access::LOCAL_WRITE).map(drop).expect("a second acquire registers");
    assert_eq!(cache.stats().cached_entries, 1);
    left
}

//= spec.md#S7.8
//# the library repairs the thread before the jump
#[test]
fn an_abandoned_registration_leaves_no_record_in_flight() {
    assert_eq!(in_flight_after_escape(true), Some(0));
}

/// The control: without the abandon, the record stays (so the test above
/// can fail).
#[test]
fn without_the_abandon_the_record_stays() {
    assert_eq!(in_flight_after_escape(false), Some(1));
}
