//! Replay through the real cache (`--engine impl`), judged op by op.
//!
//! Every outcome of the cache is judged by the reference model
//! (`Model::judge`, spec.md#S9), every deregistration the registrar reports
//! is checked by `Model::observe_deregister` (P3, P4, C3), and `check_quiescent`
//! runs after each op (L1). A divergence stops the replay with the trace line.
//!
//! Real memory. With the io_uring registrar or the userfaultfd monitor, the
//! trace's addresses are moved into an arena mapped here (spec.md#T4), and a
//! release event is performed for real: `mmap(MAP_FIXED)` of fresh anonymous
//! pages over its range, so the old frames are really gone. With the uffd
//! monitor the cache learns of it from the kernel (the trace's event is not
//! passed to the cache); with the explicit monitor the replayer also calls
//! `Cache::invalidate`, like an application that knows when it frees.
//!
//! Imports no other part of `replay`. The op is applied by the test kit's
//! [`Apply`].

use anyhow::{anyhow, bail, Result};
use mrcache::registrar::counting::CountingRegistrar;
use mrcache::registrar::uring::UringRegistrar;
use mrcache::registrar::Registrar;
use mrcache::{Cache, CacheConfig, Lease, MonitorThread};
use mrcache_model::{Config, Model};
use mrcache_testkit::registrar::{Call, TestRegistrar};
use mrcache_testkit::Apply;
use mrcache_types::trace::{Relocation, Trace};
use mrcache_types::{Access, LeaseId, Op, Range, Stats};
use std::collections::HashMap;
use std::sync::Arc;

/// The registrar behind the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RegistrarKind {
    /// Registers nothing, counts calls.
    Counting,
    /// io_uring fixed buffers: a real long-term pin of the pages.
    Uring,
}

/// Where release events come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MonitorKind {
    /// The replayer calls `Cache::invalidate` for each release event.
    Explicit,
    /// userfaultfd: the kernel reports the releases the replayer performs.
    Uffd,
}

/// An anonymous arena the relocated trace lives in. Unmapped on drop.
struct Arena {
    base: u64,
    len: usize,
}

impl Arena {
    fn map(len: u64) -> Result<Arena> {
        let len = usize::try_from(len.max(4096)).map_err(|_| anyhow!("arena of {len} bytes is too large"))?;
        let base = mrcache::mem::map_anon(len as u64, libc::MAP_NORESERVE)
            .map_err(|e| anyhow!("cannot map a {} MiB replay arena: {e}", len >> 20))?;
        Ok(Arena { base, len })
    }

    /// Replaces `[addr, addr+len)` (page-rounded) by fresh pages: the frames
    /// that backed it are released, as the recorded release event did.
    fn release(&self, addr: u64, len: u64) -> Result<()> {
        let r = Range::new(addr, len)?;
        let p = r.pages(4096);
        let (start, bytes) = (p.first * 4096, p.count() * 4096);
        if start < self.base || start + bytes > self.base + self.len as u64 {
            bail!("release event {r} falls outside the replay arena");
        }
        // SAFETY: the range lies inside our own arena (checked above); no
        // Rust object lives there, and leases on it only hold registrations.
        let q = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                bytes as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if q == libc::MAP_FAILED {
            bail!("cannot remap {r} in the arena: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: our own mapping; every lease on it was dropped before.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// Replays `trace` through a cache with `registrar` and `monitor`, judging
/// every outcome. Returns the cache's stats.
pub fn replay(trace: &Trace, name: &str, config: Config, registrar: RegistrarKind, monitor: MonitorKind) -> Result<Stats> {
    replay_masked(trace, name, config, registrar, monitor, None, &mut |_| {})
}

/// [`replay`], skipping the records `skip` marks (a registration threshold,
/// `crate::replay::skip_mask`) and calling `progress(i)` after record `i`.
pub fn replay_masked(
    trace: &Trace,
    name: &str,
    config: Config,
    registrar: RegistrarKind,
    monitor: MonitorKind,
    skip: Option<&[bool]>,
    progress: &mut dyn FnMut(usize),
) -> Result<Stats> {
    let cache_config = CacheConfig::explicit_with(config);
    let run_with = Run { trace, name, config, cache_config, registrar, monitor, skip };
    match registrar {
        RegistrarKind::Counting => run(run_with, CountingRegistrar::default(), progress),
        RegistrarKind::Uring => {
            let uring = UringRegistrar::with_defaults().map_err(|e| anyhow!("io_uring registrar: {e}"))?;
            run(run_with, uring, progress)
        }
    }
}

/// What one replay runs.
struct Run<'a> {
    trace: &'a Trace,
    name: &'a str,
    config: Config,
    cache_config: CacheConfig,
    registrar: RegistrarKind,
    monitor: MonitorKind,
    skip: Option<&'a [bool]>,
}

fn run<R: Registrar>(run: Run<'_>, inner: R, progress: &mut dyn FnMut(usize)) -> Result<Stats> {
    let Run { trace, name, config, cache_config, registrar, monitor, skip } = run;
    let real_memory = registrar == RegistrarKind::Uring || monitor == MonitorKind::Uffd;
    let (arena, relocation) = if real_memory {
        let plan = Relocation::plan(trace.ops(), trace.header.page_size);
        (Some(Arena::map(plan.arena_len)?), Some(plan))
    } else {
        (None, None)
    };
    let monitoring = match monitor {
        MonitorKind::Uffd => mrcache::Monitoring::Userfaultfd,
        MonitorKind::Explicit => mrcache::Monitoring::Explicit,
    };
    let cache_config = cache_config.monitored_by(monitoring);
    // The kit's logging registrar: deregistrations are mapped back to the
    // registration ids the model gave, so the judge can check each one (P3,
    // P4, C3). Ids are recovered from the registered range and access.
    let cache = Arc::new(Cache::try_new(TestRegistrar::new(inner), cache_config)?);
    let monitor_thread = match monitor {
        MonitorKind::Uffd => Some(MonitorThread::start(&cache).map_err(|e| anyhow!("userfaultfd monitor: {e}"))?),
        MonitorKind::Explicit => None,
    };
    let mut model = Model::new(config);
    let mut leases: HashMap<LeaseId, Lease<'_, TestRegistrar<R>>> = HashMap::new();
    // Live registrations by the registrar's serial.
    let mut registered: HashMap<u64, (Range, Access)> = HashMap::new();
    // Registration ids by (range, access) of live registrations, for the judge.
    let mut ids: HashMap<(Range, Access), Vec<u64>> = HashMap::new();
    for (i, rec) in trace.records.iter().enumerate() {
        if skip.is_some_and(|m| m[i]) {
            continue;
        }
        let line = trace.first_record_line + i;
        let op = match (&relocation, &arena) {
            (Some(plan), Some(a)) => plan
                .relocate(&rec.op, a.base)
                .ok_or_else(|| anyhow!("{name}:{line}: `{}` cannot be relocated", rec.op))?,
            _ => rec.op,
        };
        let ret = match (op, monitor, &arena) {
            (Op::ReleaseEvent { addr, len, .. }, MonitorKind::Uffd, Some(a)) => {
                // The kernel reports it; the munmap part of MAP_FIXED returns
                // only after the monitor has read (and applied) the event.
                a.release(addr, len).map_err(|e| anyhow!("{name}:{line}: {e}"))?;
                mrcache_types::Ret::Done
            }
            (Op::ReleaseEvent { addr, len, .. }, MonitorKind::Explicit, Some(a)) => {
                a.release(addr, len).map_err(|e| anyhow!("{name}:{line}: {e}"))?;
                cache.apply(&op, &mut leases)
            }
            _ => cache.apply(&op, &mut leases),
        };
        // Judge in the trace's own coordinates.
        let judged = unrelocate(&ret, &relocation, arena.as_ref().map(|a| a.base));
        model.judge(&rec.op, &judged).map_err(|v| anyhow!("{name}:{line}: `{}` -> `{judged}`: {v}", rec.op))?;
        for e in model.take_effects() {
            if let mrcache_model::Effect::Register { view } = e {
                let r = Range::new(view.addr, view.len).expect("model views are valid ranges");
                ids.entry((r, view.access)).or_default().push(view.id);
            }
        }
        for call in cache.registrar().take_log() {
            let (range, access) = match call {
                Call::Register { serial, range, access } => {
                    registered.insert(serial, (range, access));
                    continue;
                }
                Call::Deregister { serial } => registered
                    .remove(&serial)
                    .ok_or_else(|| anyhow!("{name}:{line}: registrar serial {serial} deregistered, never registered"))?,
                Call::Failed { .. } => continue,
            };
            let r = match (&relocation, &arena) {
                (Some(plan), Some(a)) => unrelocate_range(range, plan, a.base),
                _ => range,
            };
            let id = ids.get_mut(&(r, access)).and_then(|v| (!v.is_empty()).then(|| v.remove(0)));
            let id = id.ok_or_else(|| anyhow!("{name}:{line}: the cache deregistered {r} {access}, which the model never registered"))?;
            model.observe_deregister(id).map_err(|v| anyhow!("{name}:{line}: {v}"))?;
        }
        if monitor == MonitorKind::Explicit {
            model.check_quiescent().map_err(|v| anyhow!("{name}:{line}: {v}"))?;
        }
        progress(i);
    }
    drop(leases);
    // The monitor round that applied the last event may still be performing
    // its deregistrations (after its unlock): join it before reading stats.
    drop(monitor_thread);
    Ok(cache.stats())
}

fn unrelocate(ret: &mrcache_types::Ret, plan: &Option<Relocation>, base: Option<u64>) -> mrcache_types::Ret {
    match (*ret, plan, base) {
        (mrcache_types::Ret::Granted { mut reg, hit, pressure }, Some(plan), Some(base)) => {
            reg.addr = unrelocate_range(Range { addr: reg.addr, len: reg.len }, plan, base).addr;
            mrcache_types::Ret::Granted { reg, hit, pressure }
        }
        (other, _, _) => other,
    }
}

fn unrelocate_range(r: Range, plan: &Relocation, base: u64) -> Range {
    Range { addr: r.addr.checked_sub(base).and_then(|o| plan.original(o)).unwrap_or(r.addr), len: r.len }
}
