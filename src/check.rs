//! `mrcache check` and `mrcache explore`: model-check the concurrent
//! algorithm of spec.md §A (crate `mrcache-checker`).
//!
//! `check` explores every interleaving of a small configuration (BFS by
//! default), prints progress on stderr, then a summary on stdout: unique
//! states, time, and each property's verdict. On a violation it prints the
//! counterexample's timeline, writes it as a trace (`--trace-out`, replayable
//! with `mrcache replay`), and returns exit code 1.

use anyhow::{anyhow, bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use mrcache_checker::{
    check_with_progress, swarm_with_progress, CacheFrees, CheckConfig, Engine, MonitorKind, Mutant, Outcome, Progress, RunOptions, Status,
    Strategy, SwarmMode, SwarmOptions, SwarmOutcome, SwarmProgress,
};
use mrcache_model::OverlapPolicy;
use mrcache_types::Op;
use std::path::PathBuf;
use std::time::Duration;

/// Options of `mrcache check`.
#[derive(clap::Args, Debug, Clone)]
pub struct CheckArgs {
    /// Application threads, each running a generated script.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=4))]
    pub threads: u64,
    /// Operations per thread (the first K ops of each thread's pattern).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=7))]
    pub ops: u64,
    /// Run these scripts instead of generated ones: a trace whose records
    /// (acquire, release, release_event, flush, fork) are grouped by their `thread` field.
    #[arg(long, value_name = "TRACE", conflicts_with_all = ["threads", "ops"])]
    pub scripts: Option<PathBuf>,
    /// Overlap policy: independent, merge, no-merge-uncache-contained.
    #[arg(long, value_name = "P")]
    pub policy: Option<OverlapPolicy>,
    /// Monitor: sync (hook in the releasing thread), async (userfaultfd),
    /// or a model of a peer's: kdreg2 (HPE's kernel module as libfabric
    /// uses it: generation words, an event queue, a deferred invalidation
    /// when the module's mutex is busy) or kdreg2-wait (its notifier waits
    /// for the mutex instead).
    #[arg(long, default_value = "sync", value_name = "sync|async|kdreg2|kdreg2-wait")]
    pub monitor: MonitorKind,
    /// Check a broken variant of the algorithm (a name; see --list-mutants).
    /// Options the mutant needs (monitor, policy, limits, nested frees) are turned on.
    #[arg(long, value_name = "M")]
    pub mutant: Option<Mutant>,
    /// List the mutants and the property each must violate, then exit.
    #[arg(long)]
    pub list_mutants: bool,
    /// Check every pinned configuration (the correct algorithm; the checker's
    /// tests pin their unique-state counts) and print one line each.
    #[arg(long, conflicts_with_all = ["mutant", "scripts", "simulation", "dfs", "max_depth", "swarm"])]
    pub pinned: bool,
    /// With --pinned: every family at 3 threads instead (the full tier;
    /// `mrcache_checker::pinned3_configs`), each configuration in a child
    /// process, with its unique states, time and the child's peak RSS.
    #[arg(long, requires = "pinned")]
    pub threads3: bool,
    /// With --pinned: only the configurations of this family, or the one of
    /// this name (`family policy monitor`).
    #[arg(long, value_name = "NAME", requires = "pinned")]
    pub only: Option<String>,
    /// With --pinned: print each configuration's count as a line of the
    /// pinned table (`("name", count),`), to paste after a change.
    #[arg(long, requires = "pinned")]
    pub recount: bool,
    /// With --threads3: run the selected configurations in this process
    /// (what each child does).
    #[arg(long, hide = true, requires = "threads3")]
    pub in_process: bool,
    /// Breadth-first search (the default): shortest counterexamples.
    #[arg(long, conflicts_with_all = ["dfs", "simulation"])]
    pub bfs: bool,
    /// Depth-first search.
    #[arg(long, conflicts_with = "simulation")]
    pub dfs: bool,
    /// BFS with stateright's checker only. By default a BFS without
    /// --max-depth or --max-states runs the fingerprint engine (same states,
    /// counts and verdicts, about 16 bytes a state, examples not shortest)
    /// and repeats the run with stateright's BFS only on a violation, for a
    /// shortest counterexample.
    #[arg(long, conflicts_with_all = ["dfs", "simulation", "swarm"])]
    pub stateright: bool,
    /// Random walks with this seed (stops after --max-states, default 1,000,000).
    #[arg(long, value_name = "SEED")]
    pub simulation: Option<u64>,
    /// Swarm: many small searches, each seeded, with its own depth bound
    /// (up to --max-depth, default 100) and order of choices, each stopping
    /// after --max-states distinct states (default 50,000); on every core
    /// unless --workers. Finds bugs past exhaustive reach; proves nothing.
    #[arg(long, conflicts_with_all = ["bfs", "dfs", "simulation"])]
    pub swarm: bool,
    /// Swarm: the first search's seed (the others follow it). A
    /// counterexample's seed with `--searches 1` replays it.
    #[arg(long, value_name = "SEED", default_value_t = 0, requires = "swarm")]
    pub seed: u64,
    /// Swarm: how many searches (seeds).
    #[arg(long, value_name = "N", default_value_t = 1000, requires = "swarm")]
    pub searches: u64,
    /// Swarm: random walks instead of depth-first searches.
    #[arg(long, requires = "swarm")]
    pub walk: bool,
    /// Swarm: write the summary (JSON) here, as a Slurm task does for
    /// `mrcache swarm collect`.
    #[arg(long, value_name = "FILE", requires = "swarm")]
    pub summary_json: Option<PathBuf>,
    /// Explore at most this many steps deep (the run is then incomplete).
    #[arg(long, value_name = "D")]
    pub max_depth: Option<usize>,
    /// Stop after generating this many states (swarm: per search).
    #[arg(long, value_name = "N")]
    pub max_states: Option<usize>,
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
    /// Write the counterexample as a trace (JSON lines, spec.md#T) here.
    #[arg(long, value_name = "FILE")]
    pub trace_out: Option<PathBuf>,
    /// The registrar frees this page while it registers (A5), once per run.
    #[arg(long, value_name = "PAGE")]
    pub registrar_frees: Option<u8>,
    /// Registrar failures per run (0-2): ENOMEM first (the trim of S5.4),
    /// then EINVAL (E5).
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub registrar_failures: u8,
    /// The cache frees its own memory under its lock (A9), once per run:
    /// `private` (a page of its own) or an application page number.
    #[arg(long, value_name = "private|PAGE")]
    pub cache_frees: Option<String>,
    /// Limit on findable entries (S6.4); enables the P5 check.
    #[arg(long, value_name = "N")]
    pub max_regions: Option<u64>,
    /// Limit on bytes of findable entries (pages are 4096 bytes).
    #[arg(long, value_name = "BYTES")]
    pub max_pinned_bytes: Option<u64>,
    /// A7's bound on registration attempts.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(1..))]
    pub max_retries: u8,
    /// Checker worker threads (default: available parallelism).
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,
    /// Keep exploring after the first violation (find every violated property).
    #[arg(long)]
    pub keep_going: bool,
    /// Model the per-thread lanes (spec.md LN1–LN6) under x86-TSO store buffers.
    #[arg(long)]
    pub lanes: bool,
    /// Model A0, the lock-free hit (spec.md#A0): an acquire may start with
    /// it. Only without limits (there A1 takes every hit under the lock).
    #[arg(long)]
    pub lockless: bool,
    /// With limits, an acquire may skip A1 and go straight to A2
    /// (spec.md#A1).
    #[arg(long)]
    pub skip_a1: bool,
    /// A3 and A8 skip their lookups while the index's insert counter is
    /// unchanged since the acquire's last lookup missed (spec.md#A3, A8).
    #[arg(long)]
    pub lookup_skips: bool,
    /// With --lockless: A0 reads the hit memo's slot racily, the state word
    /// (PENDING, INVALID, incarnation) of the entry memory it names, and
    /// checks the key again after its compare-exchange; A9 reuses entry
    /// memory (spec.md#A0).
    #[arg(long)]
    pub memo: bool,
    /// With limits, a use leaves the LRU stamp of an entry whose stamp is
    /// the clock's (the most recent use) as it is (spec.md#S6.3).
    #[arg(long)]
    pub restamp_skip: bool,
    /// With limits, R1's atomics (the LRU touch, the decrement, the
    /// over-limit flag's load) are steps of their own (spec.md#R1).
    #[arg(long)]
    pub release_steps: bool,
    /// A11's post-unlock drain as steps of its own (spec.md#A11): unlock,
    /// then at most 4 rounds of a queue check and a try of the lock (a
    /// failed try hands the drain to the holder). Not with --lanes.
    #[arg(long)]
    pub drain_rounds: bool,
    /// The sync hook runs before the release, as the pair release_begin /
    /// release_end (spec.md#S2.9, W1-W3). Sync monitor only.
    #[arg(long)]
    pub pair: bool,
    /// Every script release event is a madvise REMOVE, queued by userfaultfd
    /// before the frames change (spec.md#S7.4, M3, M4). Async monitor only.
    #[arg(long)]
    pub remove: bool,
    /// With --remove and one cache: M4 as the proof's own steps (spec.md#S7.5):
    /// scan the threads, signal those that may be inside the madvise, close
    /// once each acknowledged, was seen elsewhere, or exited.
    #[arg(long)]
    pub proof_steps: bool,
    /// Caches sharing one userfaultfd monitor (spec.md#S7.6, M5, M6): 1 or
    /// 2; thread `T<i>` uses cache `i mod 2`. With 2, the monitor is the
    /// process's (a reader that takes no lock, the event ring, each cache's
    /// gate, the service thread's rounds); with 1, the single-cache source
    /// of M2. Async monitor only.
    #[arg(long, default_value_t = 1)]
    pub caches: u8,
    /// With --lanes: memo slots per lane (1-4), one per key by a hash of
    /// the key (the model's hash: the first page modulo the slots).
    #[arg(long, default_value_t = 1)]
    pub lane_slots: u8,
    /// With --lanes: lane claims the threads may give back in a run (0-2),
    /// between operations, with their lane leases still out; a thread
    /// without a claim claims the first free lane at its next A1.
    #[arg(long, default_value_t = 0)]
    pub give_backs: u8,
    /// A miss's span is widened outwards to multiples of this many pages
    /// (spec.md#S6.2): 1-4.
    #[arg(long, default_value_t = 1)]
    pub chunk_pages: u8,
    /// With limits, cost-aware eviction (spec.md#S6.3, GreedyDual-Size)
    /// instead of LRU.
    #[arg(long)]
    pub cost_aware: bool,
    /// The invalidation queue's capacity (spec.md#L2): a push on a full
    /// queue collapses it into the hull of its events and its own. 0:
    /// unbounded.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub max_unreleased: u8,
}

impl CheckArgs {
    fn config(&self) -> anyhow::Result<(CheckConfig, Vec<String>)> {
        let mut cfg = CheckConfig {
            threads: self.threads as usize,
            ops: self.ops as usize,
            policy: self.policy.unwrap_or_default(),
            monitor: self.monitor,
            registrar_frees: self.registrar_frees,
            registrar_failures: self.registrar_failures,
            cache_frees: match self.cache_frees.as_deref() {
                None => None,
                Some("private") => Some(CacheFrees::Private),
                Some(p) => Some(CacheFrees::AppPage(
                    p.parse().map_err(|_| anyhow!("--cache-frees: `{p}` is neither `private` nor a page number"))?,
                )),
            },
            max_regions: self.max_regions,
            max_pinned_bytes: self.max_pinned_bytes,
            max_retries: self.max_retries,
            mutant: None,
            scripts: None,
            lanes: self.lanes,
            lockless: self.lockless,
            skip_a1: self.skip_a1,
            lookup_skips: self.lookup_skips,
            memo: self.memo,
            restamp_skip: self.restamp_skip,
            release_steps: self.release_steps,
            drain_rounds: self.drain_rounds,
            pair: self.pair,
            remove: self.remove,
            proof_steps: self.proof_steps,
            caches: self.caches,
            lane_slots: self.lane_slots,
            give_backs: self.give_backs,
            chunk_pages: self.chunk_pages,
            cost_aware: self.cost_aware,
            max_unreleased: self.max_unreleased,
        };
        if let Some(path) = &self.scripts {
            cfg.scripts = Some(load_scripts(path)?);
        }
        let mut notes = Vec::new();
        if let Some(m) = self.mutant {
            if matches!(m, Mutant::MergeDropsLeased | Mutant::StaleMergePlan) && self.policy.is_some_and(|p| p != OverlapPolicy::Merge) {
                bail!("mutant {m} exists only under --policy merge");
            }
            notes = m.adjust(&mut cfg);
            cfg.mutant = Some(m);
        }
        Ok((cfg, notes))
    }

    fn options(&self) -> RunOptions {
        let strategy = match (self.dfs, self.simulation) {
            (_, Some(seed)) => Strategy::Simulation { seed },
            (true, None) => Strategy::Dfs,
            (false, None) => Strategy::Bfs,
        };
        RunOptions {
            strategy,
            max_depth: self.max_depth,
            workers: self.workers.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)),
            stop_at_first_failure: !self.keep_going,
            timeout: self.timeout.map(Duration::from_secs),
            max_states: self.max_states,
            progress_every: Duration::from_millis(200),
            engine: if self.stateright { Engine::Stateright } else { Engine::Fast },
        }
    }
}

/// Scripts from a trace: its acquire, release and release_event records,
/// grouped by `thread` (threads numbered from 0, in order).
fn load_scripts(path: &PathBuf) -> anyhow::Result<Vec<Vec<Op>>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let trace = mrcache_types::trace::Trace::parse(&path.display().to_string(), &text)?;
    let mut by_thread: std::collections::BTreeMap<u32, Vec<Op>> = Default::default();
    for r in &trace.records {
        if matches!(r.op, Op::Acquire { .. } | Op::Release { .. } | Op::ReleaseEvent { .. } | Op::Flush | Op::Fork) {
            by_thread.entry(r.thread).or_default().push(r.op);
        }
    }
    if by_thread.is_empty() {
        bail!("{}: no acquire, release, release_event, flush or fork records", path.display());
    }
    // Real addresses: renumber the pages the trace touches to 0, 1, 2, ...
    Ok(mrcache_checker::config::compact_pages(&by_thread.into_values().collect::<Vec<_>>()))
}

fn list_mutants() {
    println!("{:<34} {:<10} what", "mutant", "caught by");
    for m in Mutant::ALL {
        let ids: Vec<&str> = m.caught_by().iter().map(|p| mrcache_checker::props::spec_id(p)).collect();
        println!("{:<34} {:<10} {}", m.name(), ids.join(" or "), m.description());
    }
}

/// Runs `mrcache check`. Returns the exit code: 0 if every property holds
/// (or the run was incomplete without a violation), 1 on a violation.
pub fn run(args: CheckArgs) -> anyhow::Result<i32> {
    if args.list_mutants {
        list_mutants();
        return Ok(0);
    }
    if args.pinned {
        return run_pinned(&args);
    }
    let (cfg, notes) = args.config()?;
    for n in &notes {
        eprintln!("mrcache check: mutant {} needs {n}", cfg.mutant.map(|m| m.name()).unwrap_or_default());
    }
    // A swarm-only mutant runs in the swarm unless a search is named.
    let strategy_named = args.bfs || args.dfs || args.simulation.is_some();
    if args.swarm || (cfg.mutant.is_some_and(|m| m.swarm_only()) && !strategy_named) {
        if !args.swarm {
            eprintln!(
                "mrcache check: mutant {} runs in the swarm (--swarm): its configuration is past exhaustive reach (--bfs to try)",
                cfg.mutant.map(|m| m.name()).unwrap_or_default()
            );
        }
        return run_swarm(&args, &cfg);
    }
    let opts = args.options();
    eprintln!("mrcache check: {} ({}, {} worker(s))", cfg.describe(), opts.strategy, opts.workers);
    let bar = ProgressBar::new_spinner();
    bar.set_style(ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}").expect("valid template"));
    bar.enable_steady_tick(Duration::from_millis(120));
    let outcome = check_with_progress(&cfg, &opts, |p: &Progress| {
        let rate = p.states as f64 / p.elapsed.as_secs_f64().max(1e-3);
        bar.set_message(format!("{} states ({} unique), {:.0} states/s, depth {}", p.states, p.unique, rate, p.depth));
    })
    .map_err(|e| anyhow!(e))?;
    bar.finish_and_clear();
    print!("{}", summary(&outcome));
    if let Some(c) = &outcome.counterexample {
        write_counterexample(c, args.trace_out.as_ref())?;
    }
    Ok(if outcome.passed() { 0 } else { 1 })
}

fn write_counterexample(c: &mrcache_checker::Counterexample, trace_out: Option<&PathBuf>) -> anyhow::Result<()> {
    println!();
    print!("{}", c.timeline);
    match trace_out {
        Some(path) => {
            std::fs::write(path, c.trace.to_jsonl()).with_context(|| format!("writing {}", path.display()))?;
            println!("counterexample trace written to {} (mrcache replay reads it)", path.display());
        }
        None => println!("(--trace-out FILE writes this counterexample as a trace)"),
    }
    Ok(())
}

impl CheckArgs {
    /// The swarm's options from the command line.
    pub fn swarm_options(&self) -> SwarmOptions {
        let d = SwarmOptions::default();
        SwarmOptions {
            mode: if self.walk { SwarmMode::Walk } else { SwarmMode::Dfs },
            first_seed: self.seed,
            searches: self.searches,
            max_depth: self.max_depth.unwrap_or(d.max_depth),
            states_per_search: self.max_states.unwrap_or(d.states_per_search),
            workers: self.workers.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)),
            timeout: self.timeout.map(Duration::from_secs),
            stop_at_first_failure: !self.keep_going,
            ..d
        }
    }
}

/// `--swarm`: many seeded, bounded searches; a summary, and the
/// counterexample of the lowest seed that found one, with the options that
/// replay it.
fn run_swarm(args: &CheckArgs, cfg: &CheckConfig) -> anyhow::Result<i32> {
    let opts = args.swarm_options();
    eprintln!(
        "mrcache check: {} (swarm: {} {} searches from seed {}, depth bound up to {}, {} states each; {} worker(s))",
        cfg.describe(),
        opts.searches,
        opts.mode,
        opts.first_seed,
        opts.max_depth,
        opts.states_per_search,
        opts.workers
    );
    let bar = ProgressBar::new_spinner();
    bar.set_style(ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}").expect("valid template"));
    bar.enable_steady_tick(Duration::from_millis(120));
    let outcome = swarm_with_progress(cfg, &opts, |p: &SwarmProgress| {
        bar.set_message(format!(
            "{} searches, {} states, {:.0} states/s, depth {}",
            p.searches_done,
            p.states,
            p.states as f64 / p.elapsed.as_secs_f64().max(1e-3),
            p.max_depth
        ));
    })
    .map_err(|e| anyhow!(e))?;
    bar.finish_and_clear();
    print!("{}", swarm_summary(&outcome, &opts));
    if let Some(path) = &args.summary_json {
        let json = serde_json::to_string_pretty(&outcome.summary).expect("the summary serialises");
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some((_, c)) = &outcome.counterexample {
        write_counterexample(c, args.trace_out.as_ref())?;
    }
    Ok(if outcome.summary.violations.is_empty() { 0 } else { 1 })
}

/// The swarm's summary for a person.
pub fn swarm_summary(o: &SwarmOutcome, opts: &SwarmOptions) -> String {
    let s = &o.summary;
    let mut out = format!("config: {}\n", s.config);
    out += &format!(
        "swarm: {} of {} searches finished (seeds {}..{}, {}, depth bound up to {}, {} states each), {:.2} s\n",
        s.searches_finished,
        s.searches_requested,
        s.first_seed,
        s.first_seed.wrapping_add(s.searches_requested),
        s.mode,
        s.max_depth_bound,
        s.states_per_search,
        s.elapsed_secs
    );
    out += &format!(
        "covered: {} states ({}{} distinct), max depth {}\n",
        s.states,
        if s.coverage_capped { "at least " } else { "" },
        s.distinct_states,
        s.max_depth
    );
    if !s.reached.is_empty() {
        out += &format!("goals reached: {}\n", s.reached.join(", "));
    }
    if s.violations.is_empty() {
        out += "result: no violation found (a swarm proves nothing: the exhaustive check does)\n";
    } else {
        for v in &s.violations {
            out += &format!("  VIOLATED {} in {} steps, seed {}\n", v.property, v.steps, v.seed);
        }
        let seed = s.violations[0].seed;
        out += &format!(
            "result: VIOLATED; replay: the same options with --swarm --seed {seed} --searches 1 --max-depth {} --max-states {}{}\n",
            s.max_depth_bound,
            s.states_per_search,
            if opts.mode == SwarmMode::Walk { " --walk" } else { "" }
        );
    }
    out
}

/// `--pinned`: every pinned configuration, one line each; exit 1 if one
/// violates a property, misses a goal, or explores another number of states.
fn run_pinned(args: &CheckArgs) -> anyhow::Result<i32> {
    if args.threads3 && !args.in_process {
        return run_pinned3(args);
    }
    let opts = RunOptions { stop_at_first_failure: false, ..args.options() };
    let all = if args.threads3 { mrcache_checker::pinned3_configs() } else { mrcache_checker::pinned_configs() };
    let selected = select(all, args.only.as_deref())?;
    let mut failed = 0;
    let mut recount = Vec::new();
    let start = std::time::Instant::now();
    for p in &selected {
        let o = check_with_progress(&p.cfg, &opts, |_| {}).map_err(|e| anyhow!(e))?;
        let problems = mrcache_checker::pinned::problems(p, &o);
        if args.in_process {
            // One line for the parent (`run_pinned3`): name, unique states,
            // seconds, this process's peak RSS in KiB, the problems.
            println!("{}\t{}\t{:.3}\t{}\t{}", p.name, o.unique_states, o.elapsed.as_secs_f64(), peak_rss_kib(), problems.join("; "));
        } else {
            println!(
                "{:<52} {:>9} states {:>9.2?}  {}",
                p.name,
                o.unique_states,
                o.elapsed,
                if problems.is_empty() { "ok".to_string() } else { problems.join("; ") }
            );
        }
        recount.push(format!("    (\"{}\", {}),", p.name, o.unique_states));
        failed += usize::from(!problems.is_empty());
    }
    if !args.in_process {
        println!("{} pinned configurations, {failed} failed, {:.2?}", selected.len(), start.elapsed());
    }
    if args.recount {
        println!("{}", recount.join("\n"));
    }
    Ok(if failed == 0 { 0 } else { 1 })
}

/// The configurations of `all` named by `only` (a family or a whole name), or all.
fn select(all: Vec<mrcache_checker::Pinned>, only: Option<&str>) -> anyhow::Result<Vec<mrcache_checker::Pinned>> {
    let Some(only) = only else { return Ok(all) };
    let out: Vec<_> = all.into_iter().filter(|p| p.name == only || p.name.split(' ').next() == Some(only)).collect();
    if out.is_empty() {
        bail!("no pinned configuration or family named `{only}`");
    }
    Ok(out)
}

/// This process's peak resident set size in KiB (`getrusage`; 0 if it fails).
fn peak_rss_kib() -> i64 {
    // SAFETY: `getrusage` writes only into the struct it is given, which is
    // a plain C struct for which all-zero bytes are a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF and a valid pointer to a live `rusage`.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0;
    }
    usage.ru_maxrss
}

/// `--pinned --threads3`: every family at 3 threads, each configuration in a
/// child process of its own (peak RSS only grows within a process, so the
/// child's is that configuration's: the checker's tables plus the binary's
/// few MiB); the families without a 3-thread form, with the reason; exit 1
/// if a configuration has a problem (`mrcache_checker::pinned::problems`).
fn run_pinned3(args: &CheckArgs) -> anyhow::Result<i32> {
    let exe = std::env::current_exe().context("finding this executable")?;
    let workers = args.options().workers;
    let selected = select(mrcache_checker::pinned3_configs(), args.only.as_deref())?;
    for (fam, why) in mrcache_checker::pinned::NO_THREE_THREADS {
        if !matches!(args.only.as_deref(), Some(o) if o != *fam) {
            println!("{fam:<52} not here: {why}");
        }
    }
    println!("{:<52} {:<22} {:>11} {:>9} {:>9}", "configuration (3 threads)", "form", "states", "time", "peak RSS");
    let (mut failed, mut recount) = (0, Vec::new());
    let start = std::time::Instant::now();
    for p in &selected {
        let out = std::process::Command::new(&exe)
            .args(["check", "--pinned", "--threads3", "--in-process", "--only", &p.name, "--workers", &workers.to_string()])
            .stderr(std::process::Stdio::inherit())
            .output()
            .with_context(|| format!("running {}", exe.display()))?;
        let line = String::from_utf8_lossy(&out.stdout);
        let fields: Vec<&str> = line.trim_end_matches(['\n', '\r']).splitn(5, '\t').collect();
        let form = match &p.cfg.scripts {
            Some(s) => format!("{} scripted threads", s.iter().filter(|t| !t.is_empty()).count()),
            None => format!("{} x {} ops", p.cfg.threads, p.cfg.ops),
        };
        let [_, unique, secs, kib, problems] = fields[..] else {
            println!("{:<52} {form:<22} FAILED: the child exited with {} and printed {line:?}", p.name, out.status);
            failed += 1;
            continue;
        };
        let kib: f64 = kib.parse().unwrap_or(0.0);
        println!(
            "{:<52} {form:<22} {unique:>11} {:>8}s {:>6.0} MiB  {}",
            p.name,
            secs.parse::<f64>().map(|s| format!("{s:.1}")).unwrap_or_default(),
            kib / 1024.0,
            if problems.is_empty() && out.status.success() { "ok" } else { problems }
        );
        recount.push(format!("    (\"{}\", {unique}),", p.name));
        failed += usize::from(!problems.is_empty() || !out.status.success());
    }
    println!("{} configurations at 3 threads, {failed} failed, {:.2?} ({workers} worker(s) each)", selected.len(), start.elapsed());
    if args.recount {
        println!("{}", recount.join("\n"));
    }
    Ok(if failed == 0 { 0 } else { 1 })
}

/// The end-of-run summary: sizes, time, and every property's verdict.
fn summary(o: &Outcome) -> String {
    let mut out = format!("config: {}\n", o.description);
    out += &format!(
        "explored: {} unique states ({} generated), max depth {}, {:.2?}{}\n",
        o.unique_states,
        o.total_states,
        o.max_depth,
        o.elapsed,
        if o.complete { ", complete" } else { ", INCOMPLETE (stopped early: verdicts below are partial)" }
    );
    for v in &o.verdicts {
        let id = if v.spec_id.is_empty() { String::new() } else { format!("spec.md#{}", v.spec_id) };
        out += &format!("  {:<12} {:<32} {}\n", id, v.status.to_string(), v.name);
    }
    let unreached: Vec<&str> = o.unreached();
    if !unreached.is_empty() {
        out += &format!("warning: {} reachability goal(s) not reached: this configuration does not exercise them\n", unreached.len());
    }
    let violated = o.violated();
    out += &if violated.is_empty() {
        if o.verdicts.iter().any(|v| v.status == Status::Unknown) {
            "result: no violation found (exploration incomplete)\n".to_string()
        } else {
            "result: every property holds\n".to_string()
        }
    } else {
        format!("result: {} propert{} VIOLATED\n", violated.len(), if violated.len() == 1 { "y" } else { "ies" })
    };
    out
}

/// Runs `mrcache explore`: stateright's Explorer for the default
/// configuration (2 threads x 3 ops, independent, sync) on 127.0.0.1:`port`.
/// Blocks while serving.
pub fn explore(port: u16) -> anyhow::Result<()> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    // stateright panics when it cannot bind: check first, with a clear error.
    std::net::TcpListener::bind(addr).map_err(|e| anyhow!("cannot serve the Explorer on {addr}: {e} (is the port in use? try --port)"))?;
    let cfg = CheckConfig::default();
    eprintln!("mrcache explore: {} on http://{addr}/", cfg.describe());
    mrcache_checker::explore(&cfg, addr).map_err(|e| anyhow!(e))
}
