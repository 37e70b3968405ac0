//! `mrcache replay`: run traces through an engine and report the stats.
//!
//! A trace record's `expect` is an assertion: the engine's outcome must be
//! the expected one, or at least one the model's judge allows under the
//! configured policy (spec.md#S9). The policy comes from the command line, or
//! else from the trace header's `policy_hint`; expectations are checked only
//! when the policy in force is the one the trace was written for.

use anyhow::{Context, Result};
use mrcache_model::{Config, EvictionPolicy, Limits, Model, OverlapPolicy};
use mrcache_types::trace::Trace;
use mrcache_types::Stats;
use serde::Serialize;
use std::path::Path;

pub use crate::replay_impl::{MonitorKind, RegistrarKind};

/// Which implementation runs the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    /// The reference model.
    Model,
    /// The real cache, every outcome judged by the model.
    Impl,
}

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
}

/// The result of replaying one trace.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub trace: String,
    pub engine: Engine,
    pub policy: OverlapPolicy,
    pub records: usize,
    /// Records whose `expect` was checked.
    pub expectations_checked: usize,
    pub stats: Stats,
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
            limits: Limits {
                max_regions: self.max_regions,
                max_pinned_bytes: self.max_pinned_bytes,
                ..Config::default().limits
            },
        })
    }
}

/// Reads a trace; `.gz` files are decompressed.
pub fn load(path: &Path) -> Result<Trace> {
    let text = crate::record::read_text(path)?;
    Ok(Trace::parse(&path.display().to_string(), &text)?)
}

/// Replays one trace through the model.
pub fn replay_model(name: &str, trace: &Trace, config: Config, check_expect: bool) -> Result<Report> {
    let mut model = Model::new(config);
    let mut checked = 0;
    for (i, rec) in trace.records.iter().enumerate() {
        let line = trace.first_record_line + i;
        match (check_expect, rec.expect) {
            (true, Some(want)) => {
                checked += 1;
                let mut canonical = model.clone();
                let got = canonical.step(&rec.op);
                if got == want {
                    model = canonical;
                } else {
                    // The trace may assert another outcome the contract allows.
                    model.judge(&rec.op, &want).map_err(|v| {
                        anyhow::anyhow!(
                            "{name}:{line}: `{}`: the trace expects `{want}`, the model gives `{got}`, and the judge rejects the expectation: {v}",
                            rec.op
                        )
                    })?;
                }
            }
            // A record asserting failure tests error handling; the trace's
            // lease bookkeeping (T3) assumes it failed, so follow that.
            (false, Some(want @ mrcache_types::Ret::Failed { .. })) => {
                if model.judge(&rec.op, &want).is_err() {
                    model.step(&rec.op);
                }
            }
            _ => {
                model.step(&rec.op);
            }
        }
        model.take_effects();
    }
    Ok(Report {
        trace: name.to_string(),
        engine: Engine::Model,
        policy: config.policy,
        records: trace.records.len(),
        expectations_checked: checked,
        stats: model.stats(),
    })
}

pub fn run(args: &ReplayArgs) -> Result<Vec<Report>> {
    let mut reports = Vec::new();
    for path in &args.traces {
        let trace = load(path)?;
        let config = args.config_for(&trace)?;
        // Expectations hold for the configuration the trace was written for:
        // its policy hint and the defaults for everything else.
        let written_for = Config {
            policy: config.policy,
            page_size: trace.header.page_size,
            ..Config::default()
        };
        let hint_matches = match &trace.header.policy_hint {
            None => true,
            Some(h) => h.parse::<OverlapPolicy>().ok() == Some(config.policy),
        } && config == written_for;
        let name = path.display().to_string();
        let report = match args.engine {
            Engine::Model => replay_model(&name, &trace, config, hint_matches)?,
            Engine::Impl => {
                let stats = crate::replay_impl::replay(&trace, &name, config, args.registrar, args.monitor)?;
                Report {
                    trace: name.clone(),
                    engine: Engine::Impl,
                    policy: config.policy,
                    records: trace.records.len(),
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
        format!("{name} ({:?}, {})", r.engine, r.policy.name()).to_lowercase()
    };
    let w = reports.iter().map(|r| label(r).len()).max().unwrap_or(0).max(22);
    let _ = writeln!(
        out,
        "{:<w$} {:>7} {:>9} {:>8} {:>8} {:>6} {:>8} {:>10} {:>10} {:>6} {:>6} {:>6} {:>6} {:>6}",
        "trace (engine, policy)", "records", "acquires", "hits", "misses", "hit%", "regs", "reg bytes", "peak pin", "inval", "leased", "defer", "merged", "evict"
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

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1}G", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1}M", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1}K", b as f64 / 1024.0),
        b => b.to_string(),
    }
}
