//! Running a check: strategy, progress, verdicts and the counterexample.

use crate::algo::{Action, AlgoModel};
use crate::config::CheckConfig;
use crate::engine;
use crate::props;
use crate::report;
use mrcache_types::trace::Trace;
use stateright::{Checker, Expectation, HasDiscoveries, Model, Property, UniformChooser};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How the state space is explored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Strategy {
    /// Breadth first: shortest counterexamples, exact unique-state counts.
    #[default]
    Bfs,
    Dfs,
    /// Random walks from the initial state.
    Simulation {
        seed: u64,
    },
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Strategy::Bfs => f.write_str("BFS"),
            Strategy::Dfs => f.write_str("DFS"),
            Strategy::Simulation { seed } => write!(f, "simulation, seed {seed}"),
        }
    }
}

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub strategy: Strategy,
    /// Explore no deeper than this many steps.
    pub max_depth: Option<usize>,
    /// Checker worker threads.
    pub workers: usize,
    /// Stop at the first violated `always` property.
    pub stop_at_first_failure: bool,
    pub timeout: Option<Duration>,
    /// Stop after generating this many states (default 1,000,000 for simulation).
    pub max_states: Option<usize>,
    /// How often the progress callback runs.
    pub progress_every: Duration,
    /// Which engine runs an exhaustive search ([`Engine`]).
    pub engine: Engine,
}

/// The engine of an exhaustive search.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Engine {
    /// [`crate::engine`] for a BFS run without depth or state bounds: it
    /// expands the same states and gives the same verdicts and counts with
    /// a fingerprint per state; if it finds a violation, the run is repeated
    /// with stateright's BFS, whose counterexample is a shortest one. Other
    /// runs use stateright.
    #[default]
    Fast,
    /// stateright's checkers only (BFS keeps every frontier state and its path).
    Stateright,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            strategy: Strategy::Bfs,
            max_depth: None,
            workers: 1,
            stop_at_first_failure: true,
            timeout: None,
            max_states: None,
            progress_every: Duration::from_millis(100),
            engine: Engine::Fast,
        }
    }
}

/// A progress report while the checker runs.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    pub states: usize,
    pub unique: usize,
    pub depth: usize,
    pub elapsed: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// `always`: no counterexample in a complete exploration.
    Holds,
    /// `always`: a counterexample was found.
    Violated,
    /// `sometimes`: an example was found.
    Reached,
    /// `sometimes`: no example in a complete exploration.
    NotReached,
    /// The exploration stopped early: no verdict.
    Unknown,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Status::Holds => "holds",
            Status::Violated => "VIOLATED",
            Status::Reached => "reached",
            Status::NotReached => "NOT REACHED",
            Status::Unknown => "unknown (exploration incomplete)",
        })
    }
}

#[derive(Clone, Debug)]
pub struct Verdict {
    pub name: &'static str,
    /// `P1`..`P6`, `L1`, `S9`, or `""` for reachability goals.
    pub spec_id: &'static str,
    pub always: bool,
    pub status: Status,
}

#[derive(Clone, Debug)]
pub struct Counterexample {
    pub property: &'static str,
    pub actions: Vec<Action>,
    pub detail: String,
    pub timeline: String,
    pub trace: Trace,
}

#[derive(Clone, Debug)]
pub struct Outcome {
    pub description: String,
    pub unique_states: usize,
    pub total_states: usize,
    /// stateright: the depth of the deepest state expanded; the fingerprint
    /// engine ([`Engine::Fast`]): the longest path it followed.
    pub max_depth: usize,
    pub elapsed: Duration,
    /// The whole reachable state space was explored.
    pub complete: bool,
    pub verdicts: Vec<Verdict>,
    /// The counterexample of the first violated property (in [`props::ALL`] order).
    pub counterexample: Option<Counterexample>,
    /// Every discovery (counterexamples and examples), by property.
    pub discoveries: BTreeMap<&'static str, Vec<Action>>,
}

impl Outcome {
    /// Names of the violated `always` properties.
    pub fn violated(&self) -> Vec<&'static str> {
        self.verdicts.iter().filter(|v| v.status == Status::Violated).map(|v| v.name).collect()
    }

    /// Names of the `sometimes` goals a complete run did not reach.
    pub fn unreached(&self) -> Vec<&'static str> {
        self.verdicts.iter().filter(|v| v.status == Status::NotReached).map(|v| v.name).collect()
    }

    pub fn passed(&self) -> bool {
        self.violated().is_empty()
    }
}

/// Checks `cfg` without progress reports.
pub fn check(cfg: &CheckConfig, opts: &RunOptions) -> Result<Outcome, String> {
    check_with_progress(cfg, opts, |_| {})
}

/// Checks `cfg`, calling `progress` regularly while the checker runs.
pub fn check_with_progress(cfg: &CheckConfig, opts: &RunOptions, progress: impl FnMut(&Progress)) -> Result<Outcome, String> {
    let model = AlgoModel::new(cfg.clone())?;
    let mut progress = progress;
    if opts.engine == Engine::Fast
        && opts.strategy == Strategy::Bfs
        && opts.max_depth.is_none()
        && opts.max_states.is_none()
        && model.properties().iter().all(|p| p.expectation != Expectation::Eventually)
    {
        let started = Instant::now();
        if let Some(out) = fast(cfg, &model, opts, &mut progress) {
            return Ok(out);
        }
        // A violation: stateright's BFS finds its shortest counterexample,
        // within what is left of the time allowed.
        let rest = RunOptions { timeout: opts.timeout.map(|t| t.saturating_sub(started.elapsed())), ..opts.clone() };
        return check_with_progress(cfg, &RunOptions { engine: Engine::Stateright, ..rest }, progress);
    }
    let mut b = model.clone().checker().threads(opts.workers.max(1));
    if opts.stop_at_first_failure {
        b = b.finish_when(HasDiscoveries::AnyFailures);
    }
    if let Some(d) = opts.max_depth {
        b = b.target_max_depth(d);
    }
    if let Some(t) = opts.timeout {
        b = b.timeout(t);
    }
    let max_states = match opts.strategy {
        Strategy::Simulation { .. } => opts.max_states.or(Some(1_000_000)),
        _ => opts.max_states,
    };
    if let Some(n) = max_states {
        b = b.target_state_count(n);
    }
    let start = Instant::now();
    let (unique, total, depth, found) = match opts.strategy {
        Strategy::Bfs => drive(b.spawn_bfs(), start, opts.progress_every, progress),
        Strategy::Dfs => drive(b.spawn_dfs(), start, opts.progress_every, progress),
        Strategy::Simulation { seed } => drive(b.spawn_simulation(seed, UniformChooser), start, opts.progress_every, progress),
    };
    let elapsed = start.elapsed();
    let exhaustive = !matches!(opts.strategy, Strategy::Simulation { .. });
    let truncated = opts.max_depth.is_some_and(|d| depth + 1 >= d)
        || max_states.is_some_and(|n| total >= n)
        || opts.timeout.is_some_and(|t| elapsed >= t);
    let properties = model.properties();
    let any_failure = properties.iter().any(|p| p.expectation == Expectation::Always && found.contains_key(p.name));
    let complete = exhaustive && !truncated && !(opts.stop_at_first_failure && any_failure);
    let verdicts = verdicts_of(&properties, &found, complete);
    let counterexample = first_violated(&verdicts).map(|name| counterexample_of(&model, name, found[name].clone()));
    Ok(Outcome {
        description: cfg.describe(),
        unique_states: unique,
        total_states: total,
        max_depth: depth,
        elapsed,
        complete,
        verdicts,
        counterexample,
        discoveries: found,
    })
}

/// Each property's verdict, from the discoveries of a run that was
/// `complete` or not.
fn verdicts_of(properties: &[Property<AlgoModel>], found: &Found, complete: bool) -> Vec<Verdict> {
    properties
        .iter()
        .map(|p| {
            let always = p.expectation != Expectation::Sometimes;
            let status = match (always, found.contains_key(p.name), complete) {
                (true, true, _) => Status::Violated,
                (false, true, _) => Status::Reached,
                (true, false, true) => Status::Holds,
                (false, false, true) => Status::NotReached,
                (_, false, false) => Status::Unknown,
            };
            Verdict { name: p.name, spec_id: props::spec_id(p.name), always, status }
        })
        .collect()
}

/// The first violated property in [`props::ALL`] order (the one whose
/// counterexample a run reports).
fn first_violated(verdicts: &[Verdict]) -> Option<&'static str> {
    props::ALL.iter().copied().find(|name| verdicts.iter().any(|v| v.name == *name && v.status == Status::Violated))
}

/// Unique states up to which a violation the fingerprint engine found is
/// searched again with stateright's BFS, for a shortest counterexample.
/// That BFS keeps every state whole (about 600 bytes and more each, 5.65
/// GiB for 10.5 M states): past this many the engine's own path is given
/// instead, so that a violation found late does not end in a search that
/// fills the machine's memory.
pub const SHORTEST_RERUN_MAX_STATES: usize = 1_000_000;

/// Runs [`crate::engine`]; `None` if it found a violation within
/// [`SHORTEST_RERUN_MAX_STATES`] (the caller then runs stateright's BFS for
/// a shortest counterexample).
fn fast(cfg: &CheckConfig, model: &AlgoModel, opts: &RunOptions, progress: &mut impl FnMut(&Progress)) -> Option<Outcome> {
    let start = Instant::now();
    let counters = engine::Counters::default();
    let limits = engine::Limits { workers: opts.workers.max(1), timeout: opts.timeout };
    let found = engine::explore(model, limits, &counters, opts.progress_every, |unique| {
        progress(&Progress {
            states: counters.generated.load(Ordering::Relaxed),
            unique,
            depth: counters.max_depth.load(Ordering::Relaxed),
            elapsed: start.elapsed(),
        })
    });
    let properties = model.properties();
    let violated = properties.iter().any(|p| p.expectation == Expectation::Always && found.discoveries.contains_key(p.name));
    if violated && found.unique <= SHORTEST_RERUN_MAX_STATES {
        return None;
    }
    let verdicts = verdicts_of(&properties, &found.discoveries, found.complete);
    // Past the bound, the engine's own path is the counterexample (replayed
    // step by step like any other), marked as not a shortest one.
    let counterexample = first_violated(&verdicts).map(|name| {
            let mut c = counterexample_of(model, name, found.discoveries[name].clone());
            let note = format!(
                "(the fingerprint engine's path, {} steps, not a shortest one: it had explored {} states, past the {} up to which stateright's BFS is re-run for the shortest, whose whole states would fill memory; `--stateright` runs that BFS anyway, `--dfs` a depth-first one)",
                c.actions.len(),
                found.unique,
                SHORTEST_RERUN_MAX_STATES
            );
            c.detail = format!("{}\n{note}", c.detail);
            c.timeline.push_str(&note);
            c.timeline.push('\n');
            c
        });
    Some(Outcome {
        description: cfg.describe(),
        unique_states: found.unique,
        total_states: found.generated,
        max_depth: found.max_depth,
        elapsed: start.elapsed(),
        complete: found.complete,
        verdicts,
        counterexample,
        discoveries: found.discoveries,
    })
}

/// The counterexample `actions` make of `property`: its detail, timeline
/// and trace.
pub(crate) fn counterexample_of(model: &AlgoModel, property: &'static str, actions: Vec<Action>) -> Counterexample {
    let (init, steps) = report::replay(model, &actions);
    Counterexample {
        property,
        detail: report::violation_detail(model, &init, &steps, property),
        timeline: report::timeline(model, &actions, property),
        trace: report::counterexample_trace_of(model, &actions, property),
        actions,
    }
}

type Found = BTreeMap<&'static str, Vec<Action>>;

fn drive<C: Checker<AlgoModel>>(
    mut checker: C,
    start: Instant,
    every: Duration,
    mut progress: impl FnMut(&Progress),
) -> (usize, usize, usize, Found) {
    let handles = checker.handles();
    let report =
        |c: &C| Progress { states: c.state_count(), unique: c.unique_state_count(), depth: c.max_depth(), elapsed: start.elapsed() };
    progress(&report(&checker));
    let mut last = Instant::now();
    while !handles.iter().all(|h| h.is_finished()) {
        std::thread::sleep(Duration::from_millis(2));
        if last.elapsed() >= every {
            progress(&report(&checker));
            last = Instant::now();
        }
    }
    for h in handles {
        h.join().expect("checker thread panicked");
    }
    progress(&report(&checker));
    let found = checker.discoveries().into_iter().map(|(name, path)| (name, path.into_actions())).collect();
    (checker.unique_state_count(), checker.state_count(), checker.max_depth(), found)
}

/// Serves stateright's Explorer for `cfg` on `addr` (blocks). Checks first
/// that the address can be bound, because stateright panics if it cannot.
pub fn explore(cfg: &CheckConfig, addr: std::net::SocketAddr) -> Result<(), String> {
    let model = AlgoModel::new(cfg.clone())?;
    std::net::TcpListener::bind(addr).map_err(|e| format!("cannot serve the Explorer on {addr}: {e}"))?;
    let _ = model.checker().serve(addr);
    Ok(())
}
