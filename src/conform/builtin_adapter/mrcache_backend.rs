//! The mrcache backend (`mrcache adapter --policy P [--fault F]`): the real
//! cache with its userfaultfd monitor, so it learns of the releases the
//! memory commands perform from the kernel (no `invalidate` call: it is
//! judged exactly as the peers are). `--fault` turns on one of the cache's
//! fault switches ([`CacheFault`]).
//!
//! Invariant: a release command returns only after the monitor round that
//! read its event (if any) has finished (waiting up to 1 s), and a fork child has a monitor of
//! its own (spec.md#S2.6). Above [`super::protocol`] and
//! [`super::registrar`].

use super::protocol::{emit, Backend, OpResult};
use super::registrar::EmitRegistrar;
use mrcache::monitor::uffd::UffdMonitor;
use mrcache::monitor::UffdEvents;
use mrcache::{Cache, CacheConfig, Lease};
use mrcache_model::{Config, Limits, OverlapPolicy};
use mrcache_types::{Access, LeaseId};
use serde_json::json;
use std::collections::HashMap;
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
    cache: &'static Cache<EmitRegistrar>,
    leases: Mutex<HashMap<LeaseId, Lease<'static, EmitRegistrar>>>,
    busy: Arc<AtomicBool>,
}

impl Mrcache {
    pub(super) fn start(policy: OverlapPolicy, limits: Limits, fault: Option<CacheFault>, chunk_pages: u64) -> Result<Mrcache, String> {
        #[cfg_attr(not(feature = "testkit"), allow(unused_mut, reason = "fault switches need the testkit"))]
        let mut cfg = CacheConfig::new(Config { policy, limits, chunk_pages, ..Config::default() }).monitored_by(mrcache::Monitoring::Userfaultfd);
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
        let busy = Arc::new(AtomicBool::new(false));
        Mrcache::arm_monitor(cache, &busy)?;
        Ok(Mrcache { cache, leases: Mutex::new(HashMap::new()), busy })
    }

    /// Opens a userfaultfd monitor, installs it as the cache's event source
    /// and starts its thread: at the start, and again in a fork child (the
    /// parent's monitor neither follows the child nor may be read by it,
    /// spec.md#S2.6).
    fn arm_monitor(cache: &'static Cache<EmitRegistrar>, busy: &Arc<AtomicBool>) -> Result<(), String> {
        let monitor = Arc::new(UffdMonitor::open().map_err(|e| format!("userfaultfd: {e}"))?);
        if cache.set_event_source(Box::new(UffdEvents::new(monitor.clone()))).is_err() {
            return Err("the cache already has an event source".into());
        }
        let b = busy.clone();
        let (started, running) = std::sync::mpsc::sync_channel::<()>(1);
        // M1 with a `busy` flag, so a release can wait for the round its
        // event started (the releasing call returns once the event is read,
        // inside the round, before the round's deregistrations).
        std::thread::spawn(move || {
            let _ = started.send(());
            loop {
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
        Ok(())
    }
}

impl Backend for Mrcache {
    fn acquire(&self, lease: LeaseId, addr: u64, len: u64, access: Access) -> OpResult {
        let l = self.cache.acquire(addr, len, access).map_err(|e| (e.to_string(), 0))?;
        let id = *l.handle();
        let hit = l.hit();
        self.leases.lock().unwrap_or_else(|e| e.into_inner()).insert(lease, l);
        Ok(json!({"reg": id, "hit": hit}))
    }
    fn release(&self, lease: LeaseId) -> OpResult {
        let l = self.leases.lock().unwrap_or_else(|e| e.into_inner()).remove(&lease);
        match l {
            Some(l) => {
                l.release();
                Ok(json!({}))
            }
            None => Err((format!("unknown lease {lease}"), 0)),
        }
    }
    fn flush(&self) -> OpResult {
        self.cache.flush();
        Ok(json!({}))
    }
    fn trim(&self) -> OpResult {
        self.cache.trim();
        Ok(json!({}))
    }
    fn forked(&self) {
        // A monitor of the child's own (S2.6); until it runs the child's
        // cache would serve every acquire uncached.
        if let Err(e) = Mrcache::arm_monitor(self.cache, &self.busy) {
            emit(&json!({"ev": "log", "text": format!("no monitor in the fork child: {e}")}));
        }
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
