//! `mrcache replay`: run traces through an engine and report the stats.
//!
//! A trace record's `expect` is an assertion: the engine's outcome must be
//! the expected one, or at least one the model's judge allows under the
//! configured policy (spec.md#S9). The policy comes from the command line, or
//! else from the trace header's `policy_hint`; expectations are checked only
//! when the policy in force is the one the trace was written for.
//!
//! Registration threshold. A transport sends small messages eagerly through
//! its own pre-registered copy buffers and registers the user's buffer only
//! on the rendezvous path, above some size. `--threshold BYTES` models that:
//! an acquire whose `len` is below it is skipped, and so is the release of
//! the lease it named (see [`skip_mask`]). Default: [`DEFAULT_THRESHOLD`] for
//! recorded traces (header `source: recorder`), which record every buffer
//! whatever its size; 0 (register everything) for every other trace, whose
//! `expect` values were written for the cache seeing every acquire.
//! docs/replay-report.md says where the default comes from.
//!
//! The parts: [`model`] replays through the reference model, [`cache`]
//! through the real cache (judged op by op by the model), and `report`
//! holds the plain data of a replay's result ([`Report`], [`Engine`]) that
//! both build on. This module holds the arguments, the threshold, loading
//! a trace, [`run`] (which dispatches to an engine) and the table; no part
//! imports it.

pub mod cache;
pub mod model;
mod report;

use anyhow::{Context, Result};
use mrcache_model::{Config, EvictionPolicy, Limits, OverlapPolicy};
use mrcache_types::trace::Trace;
use std::path::Path;

pub use cache::{MonitorKind, RegistrarKind};
pub use model::{replay_model, replay_model_with};
pub use report::{Engine, Report};

/// Options shared by every replayed trace.
#[derive(Clone, Debug, clap::Args)]
pub struct ReplayArgs {
    /// Trace files (JSON lines).
    #[arg(required = true)]
    pub traces: Vec<std::path::PathBuf>,
    /// Overlap policy; default: the trace's policy_hint, else independent.
    #[arg(long)]
    pub policy: Option<OverlapPolicy>,
    #[arg(long, default_value = "model")]
    pub engine: Engine,
    /// The impl engine's registrar.
    #[arg(long, default_value = "counting")]
    pub registrar: RegistrarKind,
    /// The impl engine's monitor.
    #[arg(long, default_value = "explicit")]
    pub monitor: MonitorKind,
    /// Eviction policy: lru or cost-aware.
    #[arg(long, default_value = "lru")]
    pub eviction: EvictionPolicy,
    /// Registrations are widened to multiples of this many pages.
    #[arg(long, default_value_t = 1)]
    pub chunk_pages: u64,
    #[arg(long)]
    pub max_regions: Option<u64>,
    #[arg(long)]
    pub max_pinned_bytes: Option<u64>,
    /// Print machine-readable stats.
    #[arg(long)]
    pub json: bool,
    /// Acquires shorter than this (bytes; suffixes k, m, g = KiB, MiB, GiB)
    /// are eager sends, never registered: skipped with their releases.
    /// Default: 8k for recorded traces, 0 (register everything) otherwise.
    #[arg(long, value_parser = parse_bytes_arg)]
    pub threshold: Option<u64>,
}

/// The default registration threshold for recorded traces: UCX's rendezvous
/// threshold on InfiniBand as its Python bindings pin it (8 KiB), just below
/// Open MPI openib's 12 KiB eager limit (docs/replay-report.md, "Threshold").
pub const DEFAULT_THRESHOLD: u64 = 8 << 10;

/// The threshold in force for `trace`: `explicit`, else [`DEFAULT_THRESHOLD`]
/// for recorded traces and 0 for the rest (hand-written and checker traces
/// assert outcomes for a cache that sees every acquire).
pub fn threshold_for(explicit: Option<u64>, trace: &Trace) -> u64 {
    explicit.unwrap_or(if trace.header.source == "recorder" { DEFAULT_THRESHOLD } else { 0 })
}

/// Parses a byte count: `8192`, `8k`, `64K`, `64KiB`, `1m`, `2g` (binary units).
pub fn parse_bytes(s: &str) -> Result<u64> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        other => anyhow::bail!("invalid byte count `{s}`: unknown unit `{other}` (expected a number with an optional k, m or g suffix)"),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| anyhow::anyhow!("invalid byte count `{s}`: expected a number with an optional k, m or g suffix, like 8k"))?;
    n.checked_mul(1u64 << shift).ok_or_else(|| anyhow::anyhow!("byte count `{s}` overflows 64 bits"))
}

fn parse_bytes_arg(s: &str) -> Result<u64, String> {
    parse_bytes(s).map_err(|e| e.to_string())
}

/// Which records a replay at `threshold` skips: acquires with `len <
/// threshold` and the releases of the leases they named. Lease names are
/// reused after release, so the set holds only the currently skipped ones.
/// An acquire of a name that is already held (E3) is never skipped: its
/// error is the trace's business, and its release belongs to the holder.
/// `None` when nothing is skipped (threshold 0).
pub fn skip_mask(trace: &Trace, threshold: u64) -> Option<Vec<bool>> {
    if threshold == 0 {
        return None;
    }
    let mut skipped = std::collections::HashSet::new();
    let mut held = std::collections::HashSet::new();
    let mask = trace
        .records
        .iter()
        .map(|rec| match rec.op {
            mrcache_types::Op::Acquire { lease, len, .. } => {
                if len < threshold && !held.contains(&lease) && skipped.insert(lease) {
                    true
                } else {
                    held.insert(lease);
                    false
                }
            }
            mrcache_types::Op::Release { lease } => {
                held.remove(&lease);
                skipped.remove(&lease)
            }
            _ => false,
        })
        .collect();
    Some(mask)
}

impl ReplayArgs {
    pub fn config_for(&self, trace: &Trace) -> Result<Config> {
        let policy = match (self.policy, &trace.header.policy_hint) {
            (Some(p), _) => p,
            (None, Some(hint)) => hint.parse().map_err(anyhow::Error::msg).context("header field `policy_hint`")?,
            (None, None) => OverlapPolicy::Independent,
        };
        Ok(Config {
            policy,
            page_size: trace.header.page_size,
            chunk_pages: self.chunk_pages.max(1),
            eviction: self.eviction,
            limits: Limits { max_regions: self.max_regions, max_pinned_bytes: self.max_pinned_bytes, ..Config::default().limits },
        })
    }
}

/// Reads a trace; `.gz` files are decompressed.
pub fn load(path: &Path) -> Result<Trace> {
    let text = crate::record::read_text(path)?;
    Ok(Trace::parse(&path.display().to_string(), &text)?)
}

pub fn run(args: &ReplayArgs) -> Result<Vec<Report>> {
    // The model has no monitor and no registrar: say so rather than ignore
    // the flags.
    if args.engine == Engine::Model {
        if args.monitor != MonitorKind::Explicit {
            anyhow::bail!("--monitor applies to --engine impl only (the model engine has no monitor); add --engine impl");
        }
        if args.registrar != RegistrarKind::Counting {
            anyhow::bail!("--registrar applies to --engine impl only (the model engine has no registrar); add --engine impl");
        }
    }
    let mut reports = Vec::new();
    for path in &args.traces {
        let trace = load(path)?;
        let config = args.config_for(&trace)?;
        // Expectations hold for the configuration the trace was written for:
        // its policy hint and the defaults for everything else.
        let written_for = Config { policy: config.policy, page_size: trace.header.page_size, ..Config::default() };
        let hint_matches = match &trace.header.policy_hint {
            None => true,
            Some(h) => h.parse::<OverlapPolicy>().ok() == Some(config.policy),
        } && config == written_for;
        let threshold = threshold_for(args.threshold, &trace);
        let mask = skip_mask(&trace, threshold);
        let skipped = mask.as_ref().map_or(0, |m| m.iter().filter(|&&s| s).count());
        // Skipping records changes what the trace's expectations describe.
        let check_expect = hint_matches && skipped == 0;
        let name = path.display().to_string();
        let report = match args.engine {
            Engine::Model => {
                Report { threshold, ..replay_model_with(&name, &trace, config, check_expect, mask.as_deref(), &mut |_, _| {})? }
            }
            Engine::Impl => {
                let stats = cache::replay_masked(&trace, &name, config, args.registrar, args.monitor, mask.as_deref(), &mut |_| {})?;
                Report {
                    trace: name.clone(),
                    engine: Engine::Impl,
                    policy: config.policy,
                    records: trace.records.len(),
                    threshold,
                    skipped,
                    expectations_checked: 0,
                    stats,
                }
            }
        };
        reports.push(report);
    }
    Ok(reports)
}

/// The stats as a table, one row per trace.
pub fn table(reports: &[Report]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let label = |r: &Report| {
        // Recorded traces are DIR/rank-N.jsonl.gz: the directory names the run.
        let path = std::path::Path::new(&r.trace);
        let name = match (path.parent().and_then(|p| p.file_name()), path.file_name()) {
            (Some(dir), Some(file)) if file.to_string_lossy().starts_with("rank-") => {
                format!("{}/{}", dir.to_string_lossy(), file.to_string_lossy())
            }
            (_, Some(file)) => file.to_string_lossy().into_owned(),
            _ => r.trace.clone(),
        };
        let thr = if r.threshold == 0 { String::new() } else { format!(", >= {}", human(r.threshold)) };
        format!("{name} ({:?}, {}{thr})", r.engine, r.policy.name()).to_lowercase()
    };
    let w = reports.iter().map(|r| label(r).len()).max().unwrap_or(0).max(22);
    let _ = writeln!(
        out,
        "{:<w$} {:>7} {:>9} {:>8} {:>8} {:>6} {:>8} {:>10} {:>10} {:>6} {:>6} {:>6} {:>6} {:>6}",
        "trace (engine, policy)",
        "records",
        "acquires",
        "hits",
        "misses",
        "hit%",
        "regs",
        "reg bytes",
        "peak pin",
        "inval",
        "leased",
        "defer",
        "merged",
        "evict"
    );
    for r in reports {
        let s = &r.stats;
        let hit_rate = if s.acquires == 0 { 0.0 } else { 100.0 * s.hits as f64 / s.acquires as f64 };
        let _ = writeln!(
            out,
            "{:<w$} {:>7} {:>9} {:>8} {:>8} {:>6.1} {:>8} {:>10} {:>10} {:>6} {:>6} {:>6} {:>6} {:>6}",
            label(r),
            r.records,
            s.acquires,
            s.hits,
            s.misses,
            hit_rate,
            s.registrations,
            human(s.bytes_registered),
            human(s.peak_pinned_bytes),
            s.invalidations,
            s.leased_invalidations,
            s.deferred_deregistrations,
            s.merges + s.uncached,
            s.evictions
        );
    }
    out
}

/// Bytes in binary units: 512, 8.0K, 1.5M, 2.0G.
pub fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1}G", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1}M", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1}K", b as f64 / 1024.0),
        b => b.to_string(),
    }
}
