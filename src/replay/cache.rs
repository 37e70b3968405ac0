//! Replay through the real cache (`--engine impl`), judged op by op by the
//! test kit's [`Environment`]: the one judge of the cache against the model
//! (`Model::judge`, spec.md#S9; every deregistration through
//! `Model::observe_deregister`, P3, P4, C3; L1, stats and findable entries
//! after each op where deregistrations are synchronous). A divergence stops
//! the replay with the trace line. This module only chooses the registrar
//! and the monitor, skips records, and words the divergence.
//!
//! Real memory. With the io_uring registrar or the userfaultfd monitor, the
//! trace's addresses are moved into an arena ([`RealMemory`], spec.md#T4),
//! and a release event is performed for real: `mmap(MAP_FIXED)` of fresh
//! anonymous pages over its range, so the old frames are really gone. With
//! the uffd monitor the cache learns of it from the kernel (the trace's event
//! is not passed to the cache); with the explicit monitor the environment
//! also calls `Cache::invalidate`, like an application that knows when it
//! frees. The replay ends as recorded ([`Ending::AsRecorded`]): no flush, so
//! the stats are the trace's end state.
//!
//! Imports no other part of `replay`.

use anyhow::{anyhow, Result};
use mrcache::registrar::counting::CountingRegistrar;
use mrcache::registrar::uring::UringRegistrar;
use mrcache::registrar::Registrar;
use mrcache::{Cache, CacheConfig, MonitorThread};
use mrcache_model::Config;
use mrcache_testkit::registrar::TestRegistrar;
use mrcache_testkit::{Check, Ending, Environment, RealMemory};
use mrcache_types::trace::Trace;
use mrcache_types::Stats;
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
    // Declared before the cache: unmapped after it.
    let arena = match real_memory {
        true => Some(RealMemory::map(trace.ops(), trace.header.page_size).map_err(|e| anyhow!(e))?),
        false => None,
    };
    let monitoring = match monitor {
        MonitorKind::Uffd => mrcache::Monitoring::Userfaultfd,
        MonitorKind::Explicit => mrcache::Monitoring::Explicit,
    };
    let cache_config = cache_config.monitored_by(monitoring);
    // The kit's logging registrar: the environment maps each deregistration
    // back to the registration id the model gave (P3, P4, C3).
    let cache = Arc::new(Cache::try_new(TestRegistrar::new(inner), cache_config)?);
    let monitor_thread = match monitor {
        MonitorKind::Uffd => Some(MonitorThread::start(&cache).map_err(|e| anyhow!("userfaultfd monitor: {e}"))?),
        MonitorKind::Explicit => None,
    };
    let mut env = Environment::new(&cache, config).keep_records(false);
    if let Some(arena) = &arena {
        env = env.real_memory(arena);
    }
    for (i, rec) in trace.records.iter().enumerate() {
        if skip.is_some_and(|m| m[i]) {
            continue;
        }
        if let Err(d) = env.step(&rec.op) {
            let line = trace.first_record_line + i;
            return Err(match d.check {
                Check::Outcome => anyhow!("{name}:{line}: `{}` -> `{}`: {}", d.op, d.observed, d.message),
                _ => anyhow!("{name}:{line}: {}", d.message),
            });
        }
        progress(i);
    }
    env.finish_with(Ending::AsRecorded).map_err(|d| anyhow!("{name}: {d}"))?;
    // The monitor round that applied the last event may still be performing
    // its deregistrations (after its unlock): join it before reading stats.
    drop(monitor_thread);
    Ok(cache.stats())
}
