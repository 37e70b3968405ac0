//! A cache cannot be built unmonitored by accident: the
//! default `Monitoring::Unchosen` is refused with the choices named, and
//! every explicit choice, `Unmonitored` included, is accepted.

use mrcache::registrar::counting::CountingRegistrar;
use mrcache::{Cache, CacheConfig, Monitoring, SharedCache};

#[test]
fn an_unchosen_monitor_is_refused_naming_the_choices() {
    let err = Cache::try_new(CountingRegistrar::default(), CacheConfig::default()).map(|_| ()).expect_err("refused");
    let msg = err.to_string();
    for want in ["no monitor chosen", "Userfaultfd", "Explicit", "ReleaseHooks", "Unmonitored", "stale registration"] {
        assert!(msg.contains(want), "`{want}` missing from: {msg}");
    }
    let panicked = std::panic::catch_unwind(|| SharedCache::new(CountingRegistrar::default(), CacheConfig::default()));
    assert!(panicked.is_err(), "SharedCache::new refuses it too");
}

#[test]
fn every_explicit_choice_is_accepted() {
    for m in [Monitoring::Userfaultfd, Monitoring::Explicit, Monitoring::ReleaseHooks, Monitoring::Unmonitored] {
        let cache = Cache::try_new(CountingRegistrar::default(), CacheConfig::default().monitored_by(m)).expect("accepted");
        assert_eq!(cache.config().monitoring, m);
    }
    assert_eq!(CacheConfig::explicit().monitoring, Monitoring::Explicit);
}
