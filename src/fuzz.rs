//! `mrcache fuzz`: long randomized runs of the three test layers against the
//! real cache, with progress and a summary.
//!
//! Time is shared round-robin between the layers (`--layers`), each running
//! at least one case however short the run:
//! - `seq`: swarm cases (`mrcache_testkit::gen::OpGen`) under every configuration,
//!   the registrar failing 1 call in 20 at random (ENOMEM, EAGAIN, EFAULT,
//!   EINVAL), release events raised inside `register`; each op judged by the
//!   model (`mrcache_testkit::Environment`). A failing case is written as a trace to
//!   `--save` (default `traces/regressions/`), replayable with
//!   `mrcache replay` and by `cargo test` (impl/tests/traces.rs);
//! - `lin`: short concurrent histories (2–4 threads) checked for
//!   linearizability against the model (`mrcache_testkit::lin`);
//! - `dma`: the stale-DMA oracle on real memory (`mrcache_testkit::dma`): io_uring
//!   registrar, userfaultfd or explicit monitor, churning threads.
//!
//! Everything derives from `--seed`: case `i` of a layer uses a seed mixed
//! from it, so the same seed replays the same cases (how many fit in
//! `--seconds` depends on the machine). `--mutant` runs a deliberately
//! broken cache, to watch every layer catch it.
//!
//! Exit status: 0 when no violation was found, 1 otherwise.
//!
//! The `dma` layer churns holes into the memory it watches: nothing else in
//! the process may create threads or map memory at kernel-chosen addresses
//! while it runs (the layers run one after another, so the fuzzer is safe;
//! do not call [`fuzz`] with `dma` from a multi-threaded test binary).

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use mrcache::registrar::counting::CountingRegistrar;
use mrcache::{Cache, CacheConfig, Faults, OverlapPolicy};
use mrcache_testkit::dma::{self, DmaConfig, MonitorKind};
use mrcache_testkit::gen::OpGen;
use mrcache_testkit::lin::{run_history, HistoryConfig};
use mrcache_testkit::rng::{mix, Rng};
use mrcache_testkit::{configs, Environment, TestRegistrar};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A test layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    /// Sequential differential against the model's judge.
    Seq,
    /// Concurrent histories, linearizability.
    Lin,
    /// Real memory, the stale-DMA oracle.
    Dma,
}

/// The monitor of the `dma` layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Monitor {
    Uffd,
    Explicit,
}

/// A deliberately broken cache (`mrcache::Faults`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mutant {
    /// Release events are ignored.
    MonitorOff,
    /// A registration invalidated while the registrar ran is cached anyway.
    SkipSeqRecheck,
    /// Entries leave the cache without being deregistered (P4).
    LeakDeregistration,
}

#[derive(Clone, Debug, clap::Args)]
pub struct FuzzArgs {
    /// How long to run, in seconds (at least 1).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub seconds: u64,
    /// Seed of every case (default: from the clock). Printed in the summary.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Layers to run, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "seq,lin,dma")]
    pub layers: Vec<Layer>,
    /// Monitor of the dma layer.
    #[arg(long, value_enum, default_value = "uffd")]
    pub monitor: Monitor,
    /// Directory for the traces of failing sequential cases.
    #[arg(long, default_value = "traces/regressions")]
    pub save: PathBuf,
    /// Run a deliberately broken cache instead of the real one.
    #[arg(long, value_enum)]
    pub mutant: Option<Mutant>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Totals of one layer.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LayerSummary {
    /// Cases (seq), histories (lin) or runs (dma).
    pub cases: u64,
    pub ops: u64,
    pub violations: u64,
    /// First violation, in words.
    pub first_violation: Option<String>,
    pub seconds: f64,
}

/// What a fuzz run found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub seed: u64,
    pub seconds: f64,
    pub mutant: Option<String>,
    pub seq: LayerSummary,
    pub lin: LayerSummary,
    pub dma: LayerSummary,
    /// Stale DMAs (the DMA oracle's violations), PFN mismatches, acquires on
    /// churned memory, churns.
    pub stale_dmas: u64,
    pub pfn_mismatches: u64,
    pub pfn_checked: u64,
    pub churned_acquires: u64,
    pub churns: u64,
    /// Where the failing sequential cases were written.
    pub traces: Vec<String>,
    /// Layers that could not run here (no io_uring / userfaultfd), and why.
    pub skipped: Vec<String>,
}

impl Summary {
    pub fn violations(&self) -> u64 {
        self.seq.violations + self.lin.violations + self.dma.violations
    }

    fn line(&self) -> String {
        format!(
            "seq {} ops / lin {} histories / dma {} acquires · violations {} · stale DMAs {}",
            self.seq.ops,
            self.lin.cases,
            self.dma.ops,
            self.violations(),
            self.stale_dmas
        )
    }

    /// The human-readable summary.
    pub fn render(&self, args: &FuzzArgs) -> String {
        let mut s = String::new();
        let row = |name: &str, l: &LayerSummary, unit: &str| {
            format!("  {name:<4} {:>10} {unit:<11} {:>12} ops {:>9} violations  {:>7.1} s\n", l.cases, l.ops, l.violations, l.seconds)
        };
        s += &format!(
            "mrcache fuzz: {:.1} s, seed {}{}\n",
            self.seconds,
            self.seed,
            match &self.mutant {
                Some(m) => format!(", MUTANT {m}"),
                None => String::new(),
            }
        );
        s += &row("seq", &self.seq, "cases");
        s += &row("lin", &self.lin, "histories");
        s += &row("dma", &self.dma, "runs");
        s += &format!(
            "  stale DMAs: {} · PFN mismatches: {} of {} checked · acquires on churned memory: {} · churns: {}\n",
            self.stale_dmas, self.pfn_mismatches, self.pfn_checked, self.churned_acquires, self.churns
        );
        for (name, l) in [("seq", &self.seq), ("lin", &self.lin), ("dma", &self.dma)] {
            if let Some(v) = &l.first_violation {
                s += &format!("  first {name} violation: {v}\n");
            }
        }
        for t in &self.traces {
            s += &format!("  failing case written to {t}\n");
        }
        if self.seq.violations > self.traces.len() as u64 {
            s += &format!("  ({} more failing cases not written)\n", self.seq.violations - self.traces.len() as u64);
        }
        for k in &self.skipped {
            s += &format!("  skipped: {k}\n");
        }
        s += &format!(
            "  violations: {} · reproduce: mrcache fuzz --seed {} --seconds {}{}{}\n",
            self.violations(),
            self.seed,
            args.seconds,
            if args.layers.len() < 3 {
                format!(" --layers {}", args.layers.iter().map(|l| format!("{l:?}").to_lowercase()).collect::<Vec<_>>().join(","))
            } else {
                String::new()
            },
            match args.mutant {
                Some(Mutant::MonitorOff) => " --mutant monitor-off",
                Some(Mutant::SkipSeqRecheck) => " --mutant skip-seq-recheck",
                Some(Mutant::LeakDeregistration) => " --mutant leak-deregistration",
                None => "",
            }
        );
        s
    }
}

fn faults_of(m: Option<Mutant>) -> Faults {
    let mut f = Faults::default();
    match m {
        Some(Mutant::MonitorOff) => f.monitor_off = true,
        Some(Mutant::SkipSeqRecheck) => f.skip_seq_recheck = true,
        Some(Mutant::LeakDeregistration) => f.leak_deregistration = true,
        None => {}
    }
    f
}

/// One sequential case; `Err((message, trace))` on a divergence.
fn seq_case(seed: u64, faults: Faults) -> Result<u64, Box<(String, mrcache::types::trace::Trace)>> {
    let all = configs();
    let config = all[(seed % all.len() as u64) as usize];
    let mut cc = CacheConfig::explicit_with(config);
    cc.faults = faults;
    let errnos = [libc::ENOMEM, libc::EAGAIN, libc::EFAULT, libc::EINVAL];
    let reg = TestRegistrar::new(CountingRegistrar::default()).with_random_faults(mix(seed ^ 0xfa17), 50, &errnos);
    let cache = Arc::new(Cache::new(reg, cc));
    let mut env = Environment::new(&cache, config).with_event_hook(&cache);
    let mut gen = OpGen::new(seed, config.page_size);
    let steps = 50 + Rng::new(seed).below(250);
    let describe = |d: &mrcache_testkit::Divergence| {
        format!(
            "found by `mrcache fuzz` (case seed {seed:#x}, faults {faults:?}): {d}. Configuration: {}.",
            mrcache_testkit::env::describe(&config)
        )
    };
    for _ in 0..steps {
        let step = gen.next_step();
        if let Some(h) = step.hook {
            env.arm(h);
        }
        let r = env.step(&step.op);
        if let Err(d) = r {
            return Err(Box::new((d.to_string(), env.to_trace("fuzz", describe(&d)))));
        }
    }
    let records = env.records().to_vec();
    match env.finish() {
        Ok(s) => Ok(s.ops as u64),
        Err(d) => Err(Box::new((d.to_string(), mrcache_testkit::env::trace_of(&records, &config, "fuzz", describe(&d))))),
    }
}

/// Failing sequential cases written per run, at most.
const MAX_TRACES: usize = 20;

/// Runs `mrcache fuzz`. Returns the exit status (0: no violation).
pub fn run(args: &FuzzArgs) -> Result<i32> {
    let summary = fuzz(args)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary).context("summary to JSON")?);
    } else {
        print!("{}", summary.render(args));
    }
    Ok(i32::from(summary.violations() > 0))
}

/// The fuzz loop (see the module docs).
pub fn fuzz(args: &FuzzArgs) -> Result<Summary> {
    anyhow::ensure!(!args.layers.is_empty(), "--layers names no layer");
    let seed = args.seed.unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        mix(t.as_nanos() as u64) >> 16
    });
    let faults = faults_of(args.mutant);
    let mut sum = Summary { seed, mutant: args.mutant.map(|m| format!("{m:?}")), ..Summary::default() };
    let monitor = match args.monitor {
        Monitor::Uffd => MonitorKind::Uffd,
        Monitor::Explicit => MonitorKind::Explicit,
    };
    let mut layers = args.layers.clone();
    layers.dedup();
    if layers.contains(&Layer::Dma) {
        if let Err(e) = dma::available(monitor) {
            sum.skipped.push(format!("dma layer: {e}"));
            layers.retain(|l| *l != Layer::Dma);
        }
    }
    let total = Duration::from_secs(args.seconds);
    let start = Instant::now();
    let bar = if args.quiet || args.json {
        ProgressBar::hidden()
    } else {
        let b = ProgressBar::new(total.as_secs());
        b.set_style(ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} s  {msg}").expect("valid template"));
        b.enable_steady_tick(Duration::from_millis(200));
        b
    };
    // Round-robin slices of about 1 s per layer (the last slice is cut to
    // the deadline).
    let slice = Duration::from_millis(1000);
    let (mut seq_i, mut lin_i, mut dma_i) = (0u64, 0u64, 0u64);
    let lin_cfgs = mrcache_testkit::lin::configs();
    let root = Rng::new(seed);
    // The first pass gives every layer at least one case, even past the
    // deadline: on a loaded machine one slow case of the first layer could
    // otherwise use all of a short run, and a layer asked for would not run.
    let mut first_pass = true;
    'outer: while first_pass || start.elapsed() < total {
        for &layer in &layers {
            let left = total.saturating_sub(start.elapsed());
            if left.is_zero() && !first_pass {
                break 'outer;
            }
            let until = Instant::now() + slice.min(left);
            let mut once = first_pass;
            let t0 = Instant::now();
            match layer {
                Layer::Seq => {
                    while std::mem::take(&mut once) || Instant::now() < until {
                        let s = root.split(1).split(seq_i).next_u64();
                        seq_i += 1;
                        sum.seq.cases += 1;
                        match seq_case(s, faults) {
                            Ok(ops) => sum.seq.ops += ops,
                            Err(failed) => {
                                let (msg, trace) = *failed;
                                sum.seq.violations += 1;
                                sum.seq.ops += trace.records.len() as u64;
                                sum.seq.first_violation.get_or_insert(msg);
                                if sum.traces.len() < MAX_TRACES {
                                    let path = args.save.join(format!("fuzz-{s:016x}.jsonl"));
                                    std::fs::create_dir_all(&args.save)
                                        .and_then(|_| std::fs::write(&path, trace.to_jsonl()))
                                        .with_context(|| format!("writing {}", path.display()))?;
                                    sum.traces.push(path.display().to_string());
                                }
                            }
                        }
                    }
                    sum.seq.seconds += t0.elapsed().as_secs_f64();
                }
                Layer::Lin => {
                    while std::mem::take(&mut once) || Instant::now() < until {
                        let s = root.split(2).split(lin_i).next_u64();
                        let mut r = Rng::new(s);
                        lin_i += 1;
                        let threads = 2 + r.below(3) as u32;
                        let hc = HistoryConfig {
                            faults,
                            threads,
                            ops_per_thread: if threads == 4 { 3 } else { 4 },
                            raise_in_register: if r.chance(1, 2) { 400 } else { 0 },
                            // Every errno, ENOMEM/EAGAIN's trims included (S5.4).
                            registrar_faults: if r.chance(1, 3) { 150 } else { 0 },
                            ..HistoryConfig::new(*r.pick(&lin_cfgs))
                        };
                        let h = run_history(&hc, s);
                        sum.lin.cases += 1;
                        sum.lin.ops += h.ops() as u64;
                        let bad = if !h.is_linearizable() {
                            Some(format!("not linearizable:\n{}", h.render()))
                        } else {
                            h.cleanup.as_ref().err().map(|e| format!("{e}\n{}", h.render()))
                        };
                        if let Some(msg) = bad {
                            sum.lin.violations += 1;
                            sum.lin.first_violation.get_or_insert(msg);
                        }
                    }
                    sum.lin.seconds += t0.elapsed().as_secs_f64();
                }
                Layer::Dma => {
                    let s = root.split(3).split(dma_i).next_u64();
                    dma_i += 1;
                    let cfg = DmaConfig {
                        seed: s,
                        ops: u64::MAX,
                        // At least a short run on the first pass (above).
                        time_limit: Some(until.saturating_duration_since(Instant::now()).max(if once {
                            Duration::from_millis(200)
                        } else {
                            Duration::ZERO
                        })),
                        monitor,
                        faults,
                        policy: if dma_i % 2 == 0 { OverlapPolicy::Merge } else { OverlapPolicy::Independent },
                        churn_in_register: if dma_i % 3 == 0 || args.mutant == Some(Mutant::SkipSeqRecheck) { 250 } else { 0 },
                        ..DmaConfig::default()
                    };
                    let progress = AtomicU64::new(0);
                    let r = dma::run(&cfg, Some(&progress)).map_err(anyhow::Error::msg).context("dma layer")?;
                    sum.dma.cases += 1;
                    sum.dma.ops += r.ops;
                    sum.dma.violations += r.violations();
                    sum.stale_dmas += r.stale_dmas;
                    sum.pfn_mismatches += r.pfn_mismatches;
                    sum.pfn_checked += r.pfn_checked;
                    sum.churned_acquires += r.churned_acquires;
                    sum.churns += r.churns_total() + r.register_churns;
                    if r.violations() > 0 && sum.dma.first_violation.is_none() {
                        sum.dma.first_violation = Some(format!(
                            "run seed {s:#x}: {}{}",
                            r.render(),
                            r.first_stale.as_ref().map(|x| format!("; first stale DMA: {x}")).unwrap_or_default()
                        ));
                    }
                    if let Some(why) = &r.pfn_skipped {
                        let msg = format!("PFN oracle: {why}");
                        if !sum.skipped.contains(&msg) {
                            sum.skipped.push(msg);
                        }
                    }
                    sum.dma.seconds += t0.elapsed().as_secs_f64();
                    let _ = progress.load(Ordering::Relaxed);
                }
            }
            sum.seconds = start.elapsed().as_secs_f64();
            bar.set_position(start.elapsed().as_secs().min(total.as_secs()));
            bar.set_message(sum.line());
        }
        first_pass = false;
    }
    sum.seconds = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutants_are_the_caches_fault_switches() {
        use clap::ValueEnum;
        for m in Mutant::value_variants() {
            let name = m.to_possible_value().unwrap().get_name().to_string();
            let switch = mrcache::types::mutants::fault_switch(&name).unwrap_or_else(|| panic!("{name}: no such fault switch"));
            assert!(format!("{:?}", faults_of(Some(*m))).contains(&format!("{}: true", switch.field)));
        }
    }

    // The dma layer is left to impl/tests/dma_oracle.rs and ci/stress.sh: it
    // churns holes into memory, and the other tests of this binary create
    // threads (stacks, signal stacks) at any time, which could land in them.
    fn args(seconds: u64, mutant: Option<Mutant>, save: PathBuf) -> FuzzArgs {
        FuzzArgs {
            seconds,
            seed: Some(42),
            layers: vec![Layer::Seq, Layer::Lin],
            monitor: Monitor::Uffd,
            save,
            mutant,
            quiet: true,
            json: false,
        }
    }

    #[test]
    fn the_real_cache_survives_a_short_run() {
        let dir = std::env::temp_dir().join(format!("mrcache-fuzz-test-{}", std::process::id()));
        let a = args(2, None, dir.clone());
        let s = fuzz(&a).unwrap();
        eprint!("{}", s.render(&a));
        assert_eq!(s.violations(), 0, "{}", s.render(&a));
        assert!(s.seq.cases > 0 && s.lin.cases > 0);
        assert!(s.render(&a).contains("--seed 42"));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn every_layer_catches_a_mutant() {
        let dir = std::env::temp_dir().join(format!("mrcache-fuzz-mutant-{}", std::process::id()));
        // 6 s: a 1-s slice per layer per round; under load a slice may be short.
        let a = args(6, Some(Mutant::MonitorOff), dir.clone());
        let s = fuzz(&a).unwrap();
        eprint!("{}", s.render(&a));
        assert!(s.seq.violations > 0 && s.lin.violations > 0, "{}", s.render(&a));
        assert!(!s.traces.is_empty() && std::path::Path::new(&s.traces[0]).exists());
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[cfg(test)]
mod long {
    use super::*;

    /// `mrcache fuzz` from the test harness, all layers (run alone: the dma
    /// layer needs the process to itself):
    /// `MRCACHE_FUZZ_SECONDS=60 cargo test -p mrcache-cli --lib fuzz::long -- --ignored --nocapture`
    #[test]
    #[ignore = "long; the same as `mrcache fuzz`"]
    fn long_run() {
        let var = |k: &str| std::env::var(k).ok().and_then(|v| v.parse().ok());
        let a = FuzzArgs {
            seconds: var("MRCACHE_FUZZ_SECONDS").unwrap_or(60),
            seed: Some(var("MRCACHE_FUZZ_SEED").unwrap_or(1)),
            layers: vec![Layer::Seq, Layer::Lin, Layer::Dma],
            monitor: Monitor::Uffd,
            save: std::env::temp_dir().join("mrcache-fuzz-long"),
            mutant: None,
            quiet: true,
            json: false,
        };
        let s = fuzz(&a).unwrap();
        print!("{}", s.render(&a));
        assert_eq!(s.violations(), 0);
    }
}
