//! `mrcache report`: sweeps of recorded traces through the model, a check of
//! one configuration through the real cache, the registration time saved,
//! and SVG charts (`--plot DIR`, see [`crate::plot`]).
//!
//! For each trace:
//! - every overlap policy at every registration threshold (no limits, LRU);
//!   the runs at the sweep threshold also sample pinned bytes, hits and
//!   misses every few records (the time series of the charts);
//! - every overlap policy × eviction policy × `max_pinned_bytes` limit at the
//!   sweep threshold (`--threshold`, else `replay::threshold_for`);
//! - one configuration (merge, 16 MiB, LRU, sweep threshold) through the
//!   cache with the counting registrar, every outcome judged by the model:
//!   its stats must equal the model's, or the report fails;
//! - registration time with the cache against without it (every acquire
//!   registers and its release deregisters), from a [`CostModel`].
//!
//! Invariants: the model never sees a skipped record (threshold); every run
//! of a trace replays the same records; the report fails rather than print
//! figures of a run that diverged.

use crate::cost::{self, CostModel};
use crate::replay::{self, human};
use anyhow::{anyhow, Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use mrcache_model::{Config, EvictionPolicy, Limits, Model, OverlapPolicy};
use mrcache_types::trace::Trace;
use mrcache_types::{Op, Range, Stats};
use serde::Serialize;
use std::io::IsTerminal;
use std::path::PathBuf;

/// Where the registration cost comes from.
#[derive(Clone, Debug)]
pub enum CostSpec {
    /// Measure the io_uring registrar here.
    Measure,
    /// No time figures.
    None,
    Given(CostModel),
}

fn parse_cost_spec(s: &str) -> Result<CostSpec, String> {
    match s {
        "measure" => Ok(CostSpec::Measure),
        "none" => Ok(CostSpec::None),
        _ => cost::parse(s).map(CostSpec::Given).map_err(|e| e.to_string()),
    }
}

#[derive(Clone, Debug, clap::Args)]
pub struct ReportArgs {
    /// Trace files (JSON lines, `.gz` accepted), e.g. traces/real/*/rank-0.jsonl.gz.
    #[arg(required = true)]
    pub traces: Vec<PathBuf>,
    /// Write SVG charts into this directory.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Print the whole report as JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Fewer thresholds and limits, the first 20 000 records of each trace,
    /// a shorter cost measurement.
    #[arg(long)]
    pub quick: bool,
    /// No progress bar (it is also hidden when stderr is not a terminal).
    #[arg(long)]
    pub quiet: bool,
    /// Registration threshold of the policy and limit sweeps (bytes, k/m/g);
    /// default: 8k for recorded traces, 0 for others.
    #[arg(long, value_parser = |s: &str| replay::parse_bytes(s).map_err(|e| e.to_string()))]
    pub threshold: Option<u64>,
    /// Registration cost: `measure` (io_uring on this machine), `none`, or
    /// `A_NS,B_NS_PER_PAGE[,C_NS,D_NS_PER_PAGE]` (register, then deregister).
    #[arg(long, default_value = "measure", value_parser = parse_cost_spec)]
    pub cost_model: CostSpec,
    /// Replay only the first N records of each trace.
    #[arg(long)]
    pub records: Option<usize>,
}

/// Thresholds swept (bytes).
pub const THRESHOLDS: [u64; 6] = [0, 4 << 10, 8 << 10, 16 << 10, 64 << 10, 256 << 10];
const QUICK_THRESHOLDS: [u64; 3] = [0, 8 << 10, 64 << 10];
/// Byte limits swept; `None` is unlimited.
pub const LIMITS: [Option<u64>; 6] = [None, Some(256 << 20), Some(64 << 20), Some(16 << 20), Some(4 << 20), Some(1 << 20)];
const QUICK_LIMITS: [Option<u64>; 3] = [None, Some(16 << 20), Some(1 << 20)];
const EVICTIONS: [EvictionPolicy; 2] = [EvictionPolicy::Lru, EvictionPolicy::CostAware];
const QUICK_RECORDS: usize = 20_000;
/// Points per time series (about).
const SERIES_POINTS: usize = 400;

/// One model run's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    pub policy: OverlapPolicy,
    pub eviction: EvictionPolicy,
    pub max_pinned_bytes: Option<u64>,
    pub threshold: u64,
    pub hit_rate: f64,
    pub stats: Stats,
}

/// A sample of a run: after record `index` (time `t_s` when recorded).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Point {
    pub index: usize,
    pub t_s: Option<f64>,
    pub pinned_bytes: u64,
    pub hits: u64,
    pub misses: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Series {
    pub policy: OverlapPolicy,
    pub points: Vec<Point>,
}

/// Registration time of one policy's run against no cache.
#[derive(Clone, Debug, Serialize)]
pub struct Saving {
    pub policy: OverlapPolicy,
    pub acquires: u64,
    pub registrations: u64,
    pub cached_ms: f64,
    pub uncached_ms: f64,
    pub saved_ms: f64,
    /// Saved time over the recorded run time, when the trace has times.
    pub saved_of_runtime: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ImplCheck {
    pub config: String,
    pub model: Stats,
    pub cache: Stats,
}

#[derive(Clone, Debug, Serialize)]
pub struct TraceReport {
    pub trace: String,
    /// Short name for tables and file names: `<run>/rank-<r>` or the file stem.
    pub label: String,
    pub program: Option<String>,
    pub records: usize,
    pub runtime_s: Option<f64>,
    pub sweep_threshold: u64,
    /// Every policy at every threshold, no limits, LRU.
    pub thresholds: Vec<Run>,
    /// Every policy × eviction × byte limit at the sweep threshold.
    pub limits: Vec<Run>,
    /// Per policy, at the sweep threshold, no limits.
    pub series: Vec<Series>,
    pub savings: Vec<Saving>,
    pub impl_check: ImplCheck,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub default_threshold: u64,
    pub cost_model: Option<CostModel>,
    pub cost_samples: Vec<cost::Sample>,
    /// Why there is no cost model, if there is none.
    pub cost_note: Option<String>,
    pub traces: Vec<TraceReport>,
}

fn hit_rate(s: &Stats) -> f64 {
    if s.acquires == 0 {
        0.0
    } else {
        100.0 * s.hits as f64 / s.acquires as f64
    }
}

/// `DIR/rank-N.jsonl.gz` → `DIR/rank-N`; else the file name without extensions.
pub fn label(path: &std::path::Path) -> String {
    let file = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let stem = file.split('.').next().unwrap_or(&file).to_string();
    match path.parent().and_then(|p| p.file_name()) {
        Some(dir) if stem.starts_with("rank-") => format!("{}/{stem}", dir.to_string_lossy()),
        _ => stem,
    }
}

fn config(trace: &Trace, policy: OverlapPolicy, eviction: EvictionPolicy, max_pinned_bytes: Option<u64>) -> Config {
    Config {
        policy,
        page_size: trace.header.page_size,
        eviction,
        limits: Limits { max_pinned_bytes, ..Config::default().limits },
        ..Config::default()
    }
}

/// Runs the whole report.
pub fn run(args: &ReportArgs) -> Result<Report> {
    // Before the work: a directory that cannot be made fails now, not after.
    if let Some(dir) = &args.plot {
        crate::plot::prepare_dir(dir)?;
    }
    let (cost_model, cost_samples, cost_note) = match &args.cost_model {
        CostSpec::Given(m) => (Some(m.clone()), Vec::new(), None),
        CostSpec::None => (None, Vec::new(), Some("--cost-model none".to_string())),
        CostSpec::Measure => match cost::measure(args.quick) {
            Ok((m, s)) => (Some(m), s, None),
            Err(e) => (None, Vec::new(), Some(format!("no time figures: {e:#}; give --cost-model A,B to set one"))),
        },
    };
    let thresholds: &[u64] = if args.quick { &QUICK_THRESHOLDS } else { &THRESHOLDS };
    let limits: &[Option<u64>] = if args.quick { &QUICK_LIMITS } else { &LIMITS };
    let cap = args.records.or(args.quick.then_some(QUICK_RECORDS));

    let mut traces = Vec::new();
    for path in &args.traces {
        let mut t = replay::load(path)?;
        if let Some(n) = cap {
            trim(&mut t, n);
        }
        traces.push((path, t));
    }
    // Progress in records replayed: per trace, one run per (policy,
    // threshold) and per (policy, eviction, limit), and the cache run.
    let threshold_runs = |t: &Trace| {
        let sweep = replay::threshold_for(args.threshold, t);
        thresholds.len() + usize::from(!thresholds.contains(&sweep))
    };
    let total: usize = traces
        .iter()
        .map(|(_, t)| t.records.len() * (OverlapPolicy::ALL.len() * (threshold_runs(t) + limits.len() * EVICTIONS.len()) + 1))
        .sum();
    let bar = ProgressBar::with_draw_target(
        Some(total as u64),
        if args.quiet || !std::io::stderr().is_terminal() { ProgressDrawTarget::hidden() } else { ProgressDrawTarget::stderr() },
    );
    bar.set_style(
        ProgressStyle::with_template("{msg:40!} [{bar:30}] {human_pos}/{human_len} records ({eta})")
            .map_err(|e| anyhow!("progress bar template: {e}"))?
            .progress_chars("=> "),
    );

    let mut reports = Vec::new();
    for (path, trace) in &traces {
        let r = trace_report(path, trace, thresholds, limits, args.threshold, cost_model.as_ref(), &bar)
            .with_context(|| format!("report of {}", path.display()))?;
        reports.push(r);
    }
    bar.finish_and_clear();
    Ok(Report { default_threshold: replay::DEFAULT_THRESHOLD, cost_model, cost_samples, cost_note, traces: reports })
}

/// Bumps the progress bar every this many records.
const PROGRESS_STEP: usize = 4096;

/// One replay's share of the progress bar, in records.
struct Records<'b> {
    bar: &'b ProgressBar,
    done: usize,
}

impl<'b> Records<'b> {
    fn new(bar: &'b ProgressBar) -> Self {
        Records { bar, done: 0 }
    }

    /// Record `i` was replayed: bumps the bar every [`PROGRESS_STEP`] records.
    fn at(&mut self, i: usize) {
        if i - self.done >= PROGRESS_STEP {
            self.bar.inc((i - self.done) as u64);
            self.done = i;
        }
    }

    /// The replay of `total` records ended.
    fn finish(self, total: usize) {
        self.bar.inc((total - self.done) as u64);
    }
}

fn model_run(
    name: &str,
    trace: &Trace,
    cfg: Config,
    threshold: u64,
    bar: &ProgressBar,
    mut sample: Option<&mut Vec<Point>>,
) -> Result<Run> {
    let mask = replay::skip_mask(trace, threshold);
    let every = (trace.records.len() / SERIES_POINTS).max(1);
    let mut progress = Records::new(bar);
    let mut next_sample = 0usize;
    let mut observe = |i: usize, m: &Model| {
        if let Some(points) = sample.as_deref_mut() {
            if i >= next_sample || i + 1 == trace.records.len() {
                next_sample = i + every;
                let s = m.stats();
                let t_s = trace.records[i].t.map(|t| t as f64 / 1e9);
                points.push(Point { index: i, t_s, pinned_bytes: s.pinned_bytes, hits: s.hits, misses: s.misses });
            }
        }
        progress.at(i);
    };
    let report = replay::replay_model_with(name, trace, cfg, false, mask.as_deref(), &mut observe)?;
    progress.finish(trace.records.len());
    Ok(Run {
        policy: cfg.policy,
        eviction: cfg.eviction,
        max_pinned_bytes: cfg.limits.max_pinned_bytes,
        threshold,
        hit_rate: hit_rate(&report.stats),
        stats: report.stats,
    })
}

fn trace_report(
    path: &std::path::Path,
    trace: &Trace,
    thresholds: &[u64],
    limits: &[Option<u64>],
    explicit_threshold: Option<u64>,
    cost_model: Option<&CostModel>,
    bar: &ProgressBar,
) -> Result<TraceReport> {
    let name = path.display().to_string();
    let label = label(path);
    let sweep = replay::threshold_for(explicit_threshold, trace);
    let mut ts: Vec<u64> = thresholds.to_vec();
    if !ts.contains(&sweep) {
        ts.push(sweep);
        ts.sort_unstable();
    }

    let mut threshold_runs = Vec::new();
    let mut series = Vec::new();
    for policy in OverlapPolicy::ALL {
        for &thr in &ts {
            bar.set_message(format!("{label} {} >= {}", policy.name(), human(thr)));
            let mut points = Vec::new();
            let sample = (thr == sweep).then_some(&mut points);
            threshold_runs.push(model_run(&name, trace, config(trace, policy, EvictionPolicy::Lru, None), thr, bar, sample)?);
            if thr == sweep {
                series.push(Series { policy, points });
            }
        }
    }
    let mut limit_runs = Vec::new();
    for policy in OverlapPolicy::ALL {
        for eviction in EVICTIONS {
            for &limit in limits {
                let lim = limit.map_or("unlimited".to_string(), human);
                bar.set_message(format!("{label} {} {} {lim}", policy.name(), eviction_name(eviction)));
                limit_runs.push(model_run(&name, trace, config(trace, policy, eviction, limit), sweep, bar, None)?);
            }
        }
    }

    // The cache, judged op by op, on a configuration that merges and evicts.
    let check_cfg = config(trace, OverlapPolicy::Merge, EvictionPolicy::Lru, Some(16 << 20));
    bar.set_message(format!("{label} cache (merge, 16 MiB)"));
    let mask = replay::skip_mask(trace, sweep);
    let mut progress = Records::new(bar);
    let cache = replay::cache::replay_masked(
        trace,
        &name,
        check_cfg,
        replay::cache::RegistrarKind::Counting,
        replay::cache::MonitorKind::Explicit,
        mask.as_deref(),
        &mut |i| progress.at(i),
    )?;
    progress.finish(trace.records.len());
    let model = replay::replay_model_with(&name, trace, check_cfg, false, mask.as_deref(), &mut |_, _| {})?.stats;
    if cache != model {
        anyhow::bail!(
            "{name}: the cache's stats differ from the model's (merge, 16 MiB, LRU, threshold {sweep}):\n  model: {model:?}\n  cache: {cache:?}"
        );
    }
    let impl_check = ImplCheck { config: format!("merge, max_pinned_bytes 16 MiB, LRU, threshold {}", human(sweep)), model, cache };

    // Without a cache every kept acquire registers its pages and its release
    // deregisters them.
    let (acquires, acquire_pages) = acquire_pages(trace, mask.as_deref());
    let runtime_s = trace.records.last().and_then(|r| r.t).map(|t| t as f64 / 1e9);
    let savings = match cost_model {
        None => Vec::new(),
        Some(cm) => threshold_runs
            .iter()
            .filter(|r| r.threshold == sweep)
            .map(|r| {
                let s = &r.stats;
                let page = trace.header.page_size;
                let reg_pages = s.bytes_registered / page;
                let dereg_pages = s.bytes_registered.saturating_sub(s.pinned_bytes) / page;
                let cached = cm.register_ns(s.registrations, reg_pages) + cm.deregister_ns(s.deregistrations, dereg_pages);
                let uncached = cm.register_ns(acquires, acquire_pages) + cm.deregister_ns(acquires, acquire_pages);
                let saved_ms = (uncached - cached) / 1e6;
                Saving {
                    policy: r.policy,
                    acquires,
                    registrations: s.registrations,
                    cached_ms: cached / 1e6,
                    uncached_ms: uncached / 1e6,
                    saved_ms,
                    saved_of_runtime: runtime_s.filter(|&rt| rt > 0.0).map(|rt| saved_ms / 1e3 / rt),
                }
            })
            .collect(),
    };
    Ok(TraceReport {
        trace: name,
        label,
        program: trace.header.program.clone(),
        records: trace.records.len(),
        runtime_s,
        sweep_threshold: sweep,
        thresholds: threshold_runs,
        limits: limit_runs,
        series,
        savings,
        impl_check,
    })
}

/// Keeps the first `n` records and releases the leases still held after
/// them, as the end of a run does: both engines then see every lease given
/// back (the cache's replayer drops held leases at the end, the model
/// would not count those releases).
pub fn trim(trace: &mut Trace, n: usize) {
    if trace.records.len() <= n {
        return;
    }
    trace.records.truncate(n);
    let mut held = Vec::new();
    for rec in &trace.records {
        match rec.op {
            // Errors (E3) leave the holder in place: keep one entry per name.
            Op::Acquire { lease, .. } if !held.contains(&lease) => held.push(lease),
            Op::Release { lease } => held.retain(|&l| l != lease),
            _ => {}
        }
    }
    if let Some(last) = trace.records.last().cloned() {
        for lease in held {
            trace.records.push(mrcache_types::trace::Record { op: Op::Release { lease }, expect: None, ..last.clone() });
        }
    }
}

/// (valid acquires kept, their pages in all).
fn acquire_pages(trace: &Trace, skip: Option<&[bool]>) -> (u64, u64) {
    let page = trace.header.page_size;
    let mut n = 0;
    let mut pages = 0;
    for (i, rec) in trace.records.iter().enumerate() {
        if skip.is_some_and(|m| m[i]) {
            continue;
        }
        if let Op::Acquire { addr, len, .. } = rec.op {
            if let Ok(r) = Range::new(addr, len) {
                n += 1;
                pages += r.pages(page).count();
            }
        }
    }
    (n, pages)
}

pub fn eviction_name(e: EvictionPolicy) -> &'static str {
    match e {
        EvictionPolicy::Lru => "lru",
        EvictionPolicy::CostAware => "cost-aware",
    }
}

fn limit_name(l: Option<u64>) -> String {
    l.map_or("unlimited".into(), human)
}

/// The report as text tables.
pub fn tables(r: &Report) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let w = r.traces.iter().map(|t| t.label.len()).max().unwrap_or(0).max(10);
    let _ = writeln!(out, "== registration cost");
    match (&r.cost_model, &r.cost_note) {
        (Some(m), _) => {
            let _ = writeln!(out, "{}", m.describe());
            for s in &r.cost_samples {
                let _ = writeln!(
                    out,
                    "  {:>6} pages ({:>6}): register {:>9.1} us, deregister {:>8.1} us (median of {})",
                    s.pages,
                    human(s.pages * 4096),
                    s.register_median_ns / 1e3,
                    s.deregister_median_ns / 1e3,
                    s.reps
                );
            }
        }
        (None, Some(note)) => {
            let _ = writeln!(out, "{note}");
        }
        (None, None) => {}
    }

    let _ = writeln!(out, "\n== hit rate per overlap policy (sweep threshold, no limits, LRU): hit% (misses)");
    let _ = write!(out, "{:<w$} {:>9} {:>9}", "trace", "threshold", "acquires");
    for p in OverlapPolicy::ALL {
        let _ = write!(out, " {:>28}", p.name());
    }
    let _ = writeln!(out);
    for t in &r.traces {
        let at = |p: OverlapPolicy| t.thresholds.iter().find(|x| x.policy == p && x.threshold == t.sweep_threshold);
        let acq = at(OverlapPolicy::Independent).map_or(0, |x| x.stats.acquires);
        let _ = write!(out, "{:<w$} {:>9} {:>9}", t.label, human(t.sweep_threshold), acq);
        for p in OverlapPolicy::ALL {
            let cell = at(p).map_or("-".into(), |x| format!("{:.2}% ({})", x.hit_rate, x.stats.misses));
            let _ = write!(out, " {cell:>28}");
        }
        let _ = writeln!(out);
    }

    let _ = writeln!(out, "\n== hit rate against the registration threshold (no limits, LRU): hit% / acquires");
    let ts: Vec<u64> = {
        let mut v: Vec<u64> = r.traces.iter().flat_map(|t| t.thresholds.iter().map(|x| x.threshold)).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let _ = write!(out, "{:<w$} {:<27}", "trace", "policy");
    for th in &ts {
        let _ = write!(out, " {:>15}", format!(">= {}", human(*th)));
    }
    let _ = writeln!(out);
    for t in &r.traces {
        for p in OverlapPolicy::ALL {
            let _ = write!(out, "{:<w$} {:<27}", t.label, p.name());
            for th in &ts {
                let cell = t
                    .thresholds
                    .iter()
                    .find(|x| x.policy == p && x.threshold == *th)
                    .map_or("-".into(), |x| format!("{:.2}/{}", x.hit_rate, x.stats.acquires));
                let _ = write!(out, " {cell:>15}");
            }
            let _ = writeln!(out);
        }
    }

    let _ = writeln!(out, "\n== hit rate against max_pinned_bytes (sweep threshold): hit% (evictions)");
    let ls: Vec<Option<u64>> = {
        let mut v: Vec<Option<u64>> = Vec::new();
        for t in &r.traces {
            for x in &t.limits {
                if !v.contains(&x.max_pinned_bytes) {
                    v.push(x.max_pinned_bytes);
                }
            }
        }
        v
    };
    let _ = write!(out, "{:<w$} {:<27} {:<10}", "trace", "policy", "eviction");
    for l in &ls {
        let _ = write!(out, " {:>15}", limit_name(*l));
    }
    let _ = writeln!(out);
    for t in &r.traces {
        for p in OverlapPolicy::ALL {
            for e in EVICTIONS {
                let _ = write!(out, "{:<w$} {:<27} {:<10}", t.label, p.name(), eviction_name(e));
                for l in &ls {
                    let cell = t
                        .limits
                        .iter()
                        .find(|x| x.policy == p && x.eviction == e && x.max_pinned_bytes == *l)
                        .map_or("-".into(), |x| format!("{:.2} ({})", x.hit_rate, x.stats.evictions));
                    let _ = write!(out, " {cell:>15}");
                }
                let _ = writeln!(out);
            }
        }
    }

    if r.cost_model.is_some() {
        let _ =
            writeln!(out, "\n== registration time, with the cache against without (every acquire registers, every release deregisters)");
        let _ = writeln!(
            out,
            "{:<w$} {:<27} {:>9} {:>7} {:>11} {:>12} {:>11} {:>9}",
            "trace", "policy", "acquires", "regs", "cached ms", "uncached ms", "saved ms", "of run"
        );
        for t in &r.traces {
            for s in &t.savings {
                let of_run = s.saved_of_runtime.map_or("-".into(), |f| format!("{:.2}%", 100.0 * f));
                let _ = writeln!(
                    out,
                    "{:<w$} {:<27} {:>9} {:>7} {:>11.2} {:>12.2} {:>11.2} {:>9}",
                    t.label,
                    s.policy.name(),
                    s.acquires,
                    s.registrations,
                    s.cached_ms,
                    s.uncached_ms,
                    s.saved_ms,
                    of_run
                );
            }
        }
    }

    let _ = writeln!(out, "\n== the cache against the model (counting registrar, every outcome judged)");
    for t in &r.traces {
        let _ = writeln!(
            out,
            "{:<w$} {}: stats equal ({} acquires, {} hits, {} registrations, {} evictions)",
            t.label,
            t.impl_check.config,
            t.impl_check.cache.acquires,
            t.impl_check.cache.hits,
            t.impl_check.cache.registrations,
            t.impl_check.cache.evictions
        );
    }
    out
}
