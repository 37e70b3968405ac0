//! Regression (found by `tests/linearizability.rs`, twice, in about 10^5
//! histories, never reproduced by seed): an evicting miss's A10 second pass
//! (as it was) drained an event that was queued *after* a release its second
//! note saw had returned, then evicted on the state after that event.
//!
//! The shape (spec.md#A10): T0 misses on Y over `max_regions` 1 while T1
//! holds a lease on X, so A6 notes nothing. Inside T0's exclusive section
//! (after A6, before A10), T1 releases X (its R1 reads the over-limit flag,
//! not yet raised: no R2) and returns, then unmaps Y: a sync hook whose
//! try-lock fails, so the event is queued and the munmap returns. A10's
//! first pass ends over the limit; the second pass raised the flag, noted X
//! unleased, and drained: the munmap took Y out, the cache was within the
//! limit, and X stayed cached. But the release of X returned before the
//! munmap was invoked, and the munmap must follow T0's insert (it
//! invalidates Y): at the release, or at T0's insert, the cache held X
//! unleased over the limit, so X had to be evicted (P5). T0's next acquire
//! of X then hit an entry the contract had evicted.
//!
//! Forced deterministically here: the registrar's `keys` (called by A9
//! under the lock exclusive) lets T1 run its release and its munmap, then
//! waits for T1 to be done, or blocked: with the fix, A6's note fell short
//! (X leased), so A6 raised the flag and noted again before its drain, and
//! T1's release reads the flag and waits for the lock to run R2, which
//! evicts X before T1's munmap. The history is judged by the model, as the
//! linearizability tests do.

use mrcache::registrar::counting::CountingRegistrar;
use mrcache::registrar::{Keys, Registrar, RegistrarError};
use mrcache::types::{Access, LeaseId, Op, Range, ReleaseKind, Ret};
use mrcache::{Cache, CacheConfig, Config, Limits};
use mrcache_testkit::lin::{Event, History};
use mrcache_testkit::Apply;
use std::collections::HashMap;
use std::sync::mpsc::channel;
use std::sync::Mutex;
use std::time::Duration;

type InKeys = Box<dyn FnOnce() + Send>;

/// A counting registrar whose `keys` (A9, under the lock) runs a hook once.
#[derive(Default)]
struct KeysHook {
    inner: CountingRegistrar,
    hook: Mutex<Option<InKeys>>,
}

impl Registrar for KeysHook {
    type Handle = <CountingRegistrar as Registrar>::Handle;
    fn register(&self, range: Range, access: Access) -> Result<Self::Handle, RegistrarError> {
        self.inner.register(range, access)
    }
    fn deregister(&self, handle: Self::Handle) -> Result<(), RegistrarError> {
        self.inner.deregister(handle)
    }
    fn keys(&self, handle: &Self::Handle) -> Keys {
        let hook = self.hook.lock().unwrap().take();
        if let Some(hook) = hook {
            hook();
        }
        self.inner.keys(handle)
    }
    fn name(&self) -> &'static str {
        "keys-hook"
    }
}

fn run(lanes: bool) -> History {
    let config = Config { limits: Limits { max_regions: Some(1), ..Limits::default() }, ..Config::default() };
    let mut cc = CacheConfig::explicit_with(config);
    cc.lanes = lanes;
    let cache = Cache::new(KeysHook::default(), cc);
    let log: Mutex<Vec<Event>> = Mutex::new(Vec::new());
    let page = 4096;
    let (x, y) = (0x10_0000u64, 0x20_0000u64);
    let rw = Access::LOCAL_WRITE;
    let step = |thread: u32, op: Op, leases: &mut HashMap<LeaseId, _>| {
        log.lock().unwrap().push(Event::Invoke { thread, op });
        let ret = cache.apply(&op, leases);
        log.lock().unwrap().push(Event::Return { thread, ret });
        ret
    };
    let (ready_tx, ready_rx) = channel::<()>();
    let (go_tx, go_rx) = channel::<()>();
    let (done_tx, done_rx) = channel::<()>();
    let cache = &cache;
    std::thread::scope(|s| {
        let step = &step;
        let t1 = s.spawn(move || {
            let mut leases = HashMap::new();
            step(1, Op::Acquire { lease: 1001, addr: x, len: page, access: rw }, &mut leases);
            ready_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            step(1, Op::Release { lease: 1001 }, &mut leases);
            step(1, Op::ReleaseEvent { kind: ReleaseKind::Munmap, addr: y, len: page }, &mut leases);
            let _ = done_tx.send(());
        });
        ready_rx.recv().unwrap();
        *cache.registrar().hook.lock().unwrap() = Some(Box::new(move || {
            go_tx.send(()).unwrap();
            // T1 is done, or blocked on the lock we hold (R2).
            let _ = done_rx.recv_timeout(Duration::from_millis(300));
        }));
        let mut leases = HashMap::new();
        step(0, Op::Acquire { lease: 1, addr: y, len: page, access: rw }, &mut leases);
        t1.join().unwrap();
        step(0, Op::Acquire { lease: 2, addr: x, len: page, access: rw }, &mut leases);
    });
    cache.flush();
    let events = std::mem::take(&mut *log.lock().unwrap());
    History { seed: 0, config, events, cleanup: Ok(()) }
}

#[test]
fn a_release_before_an_event_queued_in_an_evicting_miss_is_evicted() {
    for lanes in [false, true] {
        let h = run(lanes);
        assert!(h.is_linearizable(), "lanes {lanes}: not linearizable:\n{}", h.render());
        // The release of X returned before the munmap of Y was invoked: X
        // was evicted (at the release or at Y's insert), so X misses.
        let last = h.events.last().unwrap();
        assert!(
            matches!(last, Event::Return { ret: Ret::Granted { hit: false, .. }, .. }),
            "lanes {lanes}: X hit after its eviction:\n{}",
            h.render()
        );
    }
}
