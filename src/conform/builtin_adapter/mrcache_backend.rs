//! The mrcache backend (`mrcache adapter --policy P [--fault F]`): the real
//! cache with its userfaultfd monitor, so it learns of the releases the
//! memory commands perform from the kernel (no `invalidate` call: it is
//! judged exactly as the peers are). `--fault` turns on one of the cache's
//! fault switches ([`CacheFault`]).
//!
//! Invariant: a release command returns only after the monitor round that
//! read its event (if any) has finished (waiting up to 1 s), and a fork child has a monitor of
//! its own (spec.md#S2.6). `destroy` frees the cache only while no lease is
//! held and no operation runs (else EBUSY, as `mrcache_destroy`), after its
//! monitor thread has ended; `create` makes a new one with its own monitor.
//! Above [`super::protocol`] and [`super::registrar`].

use super::protocol::{emit, Backend, OpResult};
use super::registrar::EmitRegistrar;
use mrcache::monitor::uffd::UffdMonitor;
use mrcache::monitor::UffdEvents;
use mrcache::{Cache, CacheConfig, Lease};
use mrcache_model::{Config, Limits, OverlapPolicy};
use mrcache_types::{Access, LeaseId};
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// mrcache's fault switches (`--fault`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheFault {
    /// `Faults::monitor_off`: release events are ignored.
    MonitorOff,
    /// `Faults::skip_seq_recheck`: A7 skipped.
    SkipSeqRecheck,
    /// `Faults::dereg_leased_on_invalidate`: leased entries deregistered at once.
    DeregLeasedOnInvalidate,
    /// `Faults::fork_keeps_monitor`: a fork child reads the parent's monitor.
    ForkKeepsMonitor,
}

/// mrcache with the userfaultfd monitor.
pub(super) struct Mrcache {
    /// The cache and its monitor thread; `None` after a `destroy`. Locked
    /// only to read or swap it, never across a cache operation (a fork
    /// child must find it free).
    live: Mutex<Option<Live>>,
    /// Cache operations in flight: a `destroy` waits for none.
    ops: AtomicUsize,
    leases: Mutex<HashMap<LeaseId, Lease<'static, EmitRegistrar>>>,
    busy: Arc<AtomicBool>,
    /// What `create` makes the cache from.
    params: (OverlapPolicy, Limits, Option<CacheFault>, u64),
}

/// A cache and the thread that runs its monitor rounds.
struct Live {
    /// Leaked at creation, freed by `destroy` once the monitor thread has
    /// ended and no lease is held.
    cache: &'static Cache<EmitRegistrar>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Mrcache {
    pub(super) fn start(policy: OverlapPolicy, limits: Limits, fault: Option<CacheFault>, chunk_pages: u64) -> Result<Mrcache, String> {
        let busy = Arc::new(AtomicBool::new(false));
        let live = Mrcache::make(policy, limits, fault, chunk_pages, &busy)?;
        Ok(Mrcache {
            live: Mutex::new(Some(live)),
            ops: AtomicUsize::new(0),
            leases: Mutex::new(HashMap::new()),
            busy,
            params: (policy, limits, fault, chunk_pages),
        })
    }

    fn make(
        policy: OverlapPolicy,
        limits: Limits,
        fault: Option<CacheFault>,
        chunk_pages: u64,
        busy: &Arc<AtomicBool>,
    ) -> Result<Live, String> {
        #[cfg_attr(not(feature = "testkit"), allow(unused_mut, reason = "fault switches need the testkit"))]
        let mut cfg =
            CacheConfig::new(Config { policy, limits, chunk_pages, ..Config::default() }).monitored_by(mrcache::Monitoring::Userfaultfd);
        match fault {
            #[cfg(feature = "testkit")]
            Some(CacheFault::MonitorOff) => cfg.faults.monitor_off = true,
            #[cfg(feature = "testkit")]
            Some(CacheFault::SkipSeqRecheck) => cfg.faults.skip_seq_recheck = true,
            #[cfg(feature = "testkit")]
            Some(CacheFault::ForkKeepsMonitor) => cfg.faults.fork_keeps_monitor = true,
            // SAFETY: the registrar's handles are plain ids that own nothing,
            // and the adapter never uses a lease's handle after an event.
            #[cfg(feature = "testkit")]
            Some(CacheFault::DeregLeasedOnInvalidate) => unsafe { cfg.faults.enable_dereg_leased_on_invalidate() },
            #[cfg(not(feature = "testkit"))]
            Some(f) => return Err(format!("fault switch {f:?} needs a build with the testkit feature")),
            None => {}
        }
        let cache = Cache::try_new(EmitRegistrar::new(), cfg).map_err(|e| e.to_string())?;
        let cache: &'static Cache<EmitRegistrar> = Box::leak(Box::new(cache));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = Mrcache::arm_monitor(cache, busy, &stop)?;
        Ok(Live { cache, stop, thread: Some(thread) })
    }

    /// The cache, for one operation: counted in `ops` until the guard
    /// drops (a `destroy` meanwhile is refused).
    fn cache(&self) -> Result<(&'static Cache<EmitRegistrar>, OpGuard<'_>), (String, i32)> {
        let guard = OpGuard(&self.ops);
        self.ops.fetch_add(1, Ordering::SeqCst);
        match &*self.live.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(l) => Ok((l.cache, guard)),
            None => Err(("the cache is destroyed".into(), libc::EINVAL)),
        }
    }

    /// Opens a userfaultfd monitor, installs it as the cache's event source
    /// and starts its thread: at the start, and again in a fork child (the
    /// parent's monitor neither follows the child nor may be read by it,
    /// spec.md#S2.6).
    fn arm_monitor(
        cache: &'static Cache<EmitRegistrar>,
        busy: &Arc<AtomicBool>,
        stop: &Arc<AtomicBool>,
    ) -> Result<std::thread::JoinHandle<()>, String> {
        let monitor = Arc::new(UffdMonitor::open().map_err(|e| format!("userfaultfd: {e}"))?);
        if cache.set_event_source(Box::new(UffdEvents::new(monitor.clone()))).is_err() {
            return Err("the cache already has an event source".into());
        }
        let b = busy.clone();
        let stop = stop.clone();
        let (started, running) = std::sync::mpsc::sync_channel::<()>(1);
        // M1 with a `busy` flag, so a release can wait for the round its
        // event started (the releasing call returns once the event is read,
        // inside the round, before the round's deregistrations).
        let thread = std::thread::spawn(move || {
            let _ = started.send(());
            while !stop.load(Ordering::SeqCst) {
                match monitor.wait_readable(20) {
                    Ok(true) => {
                        b.store(true, Ordering::SeqCst);
                        cache.monitor_round();
                        b.store(false, Ordering::SeqCst);
                    }
                    Ok(false) => {}
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        // Wait until the thread runs: its start maps its signal stack, which
        // must not land in a hole a case's munmap leaves for its MAP_FIXED.
        let _ = running.recv();
        Ok(thread)
    }
}

/// One cache operation in flight (`Mrcache::ops`).
struct OpGuard<'a>(&'a AtomicUsize);

impl Drop for OpGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Backend for Mrcache {
    fn acquire(&self, lease: LeaseId, addr: u64, len: u64, access: Access) -> OpResult {
        let (cache, _op) = self.cache()?;
        let l = cache.acquire(addr, len, access).map_err(|e| (e.to_string(), 0))?;
        let id = *l.handle();
        let hit = l.hit();
        self.leases.lock().unwrap_or_else(|e| e.into_inner()).insert(lease, l);
        Ok(json!({"reg": id, "hit": hit}))
    }
    fn release(&self, lease: LeaseId) -> OpResult {
        let l = self.leases.lock().unwrap_or_else(|e| e.into_inner()).remove(&lease);
        match l {
            Some(l) => {
                let _op = OpGuard(&self.ops);
                self.ops.fetch_add(1, Ordering::SeqCst);
                l.release();
                Ok(json!({}))
            }
            None => Err((format!("unknown lease {lease}"), 0)),
        }
    }
    fn flush(&self) -> OpResult {
        self.cache()?.0.flush();
        Ok(json!({}))
    }
    fn trim(&self) -> OpResult {
        self.cache()?.0.trim();
        Ok(json!({}))
    }
    fn forked(&self) {
        // A monitor of the child's own (S2.6); until it runs the child's
        // cache would serve every acquire uncached.
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let Some(l) = live.as_mut() else { return };
        // The parent's monitor thread does not exist here: never joined.
        std::mem::forget(l.thread.take());
        l.stop = Arc::new(AtomicBool::new(false));
        match Mrcache::arm_monitor(l.cache, &self.busy, &l.stop) {
            Ok(t) => l.thread = Some(t),
            Err(e) => emit(&json!({"ev": "log", "text": format!("no monitor in the fork child: {e}")})),
        }
    }
    fn destroy(&self) -> OpResult {
        // As mrcache_destroy: refused while a lease is held (a lease
        // borrows the cache).
        let leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        if !leases.is_empty() {
            return Err((format!("{} lease(s) are held", leases.len()), libc::EBUSY));
        }
        let mut l = {
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            let Some(l) = live.take() else { return Ok(json!({})) };
            // An operation that took the cache before it was taken out is
            // counted by now: refuse, and put the cache back.
            if self.ops.load(Ordering::SeqCst) > 0 {
                *live = Some(l);
                return Err(("a cache operation is in flight".into(), libc::EBUSY));
            }
            l
        };
        l.stop.store(true, Ordering::SeqCst);
        if let Some(t) = l.thread.take() {
            let _ = t.join();
        }
        // SAFETY: leaked by `make` from a Box; the monitor thread has ended,
        // no lease is held (checked under the leases lock, still held), no
        // operation was in flight when `live` stopped naming it (and none
        // can start on it since), so nothing refers to it any more.
        drop(unsafe { Box::from_raw(l.cache as *const Cache<EmitRegistrar> as *mut Cache<EmitRegistrar>) });
        Ok(json!({}))
    }
    fn create(&self) -> OpResult {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if live.is_none() {
            let (p, l, f, c) = self.params;
            *live = Some(Mrcache::make(p, l, f, c, &self.busy).map_err(|e| (e, libc::EIO))?);
        }
        Ok(json!({}))
    }
    fn after_release(&self, _addr: u64, _len: u64) {
        // The round that read our event (if any) is still running: wait.
        for _ in 0..20_000 {
            if !self.busy.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}
