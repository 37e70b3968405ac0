//! Swarm verification: many small searches instead of one exhaustive one.
//!
//! Each *search* is seeded. Its seed alone fixes what it does: its depth
//! bound (drawn between a quarter of [`SwarmOptions::max_depth`] and all of
//! it) and its order of choices (the enabled actions of every state it
//! expands, shuffled by its own generator). A search is either a bounded
//! depth-first search with its own visited set ([`SwarmMode::Dfs`]) or a
//! series of random walks from the initial state ([`SwarmMode::Walk`]); both
//! stop after [`SwarmOptions::states_per_search`] distinct states. Every
//! state a search reaches is judged by the model's properties, as the
//! exhaustive checker judges it.
//!
//! A swarm runs the seeds `first_seed .. first_seed + searches` on
//! [`SwarmOptions::workers`] threads, each search on one thread, so a search
//! is the same whatever the number of workers, and a seed that found a
//! counterexample finds it again alone (`searches` 1): that is how a
//! counterexample is replayed, and how a Slurm task's seed range is split.
//!
//! Everything is bounded: a search's stack by its depth bound, its visited
//! set by `states_per_search`, the swarm's coverage set (the distinct states
//! of all its searches, by fingerprint) by `coverage_cap`, the searches by
//! `searches` and the optional timeout.

use crate::algo::{Action, AlgoModel};
use crate::config::CheckConfig;
use crate::run::{counterexample_of, Counterexample};
use serde::{Deserialize, Serialize};
use stateright::{Expectation, Model, Property};
use std::collections::{BTreeMap, BTreeSet, HashSet};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How one search explores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SwarmMode {
    /// A depth-first search bounded in depth and states, in a random order.
    #[default]
    Dfs,
    /// Random walks from the initial state, each to the depth bound or a
    /// state without moves.
    Walk,
}

impl std::fmt::Display for SwarmMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SwarmMode::Dfs => "dfs",
            SwarmMode::Walk => "walk",
        })
    }
}

/// A swarm's parameters. A search is fixed by its seed and by `mode`,
/// `max_depth` and `states_per_search`.
#[derive(Clone, Debug)]
pub struct SwarmOptions {
    pub mode: SwarmMode,
    /// The first search's seed; the others follow it.
    pub first_seed: u64,
    /// How many searches (seeds).
    pub searches: u64,
    /// The deepest depth bound a search may draw.
    pub max_depth: usize,
    /// Distinct states after which a search stops.
    pub states_per_search: usize,
    /// The most fingerprints the swarm keeps to count distinct states.
    pub coverage_cap: usize,
    pub workers: usize,
    pub timeout: Option<Duration>,
    /// Stop every search once one found a violation.
    pub stop_at_first_failure: bool,
}

impl Default for SwarmOptions {
    fn default() -> Self {
        SwarmOptions {
            mode: SwarmMode::Dfs,
            first_seed: 0,
            searches: 64,
            max_depth: 100,
            states_per_search: 50_000,
            coverage_cap: 4_000_000,
            workers: 1,
            timeout: None,
            stop_at_first_failure: true,
        }
    }
}

/// A violation one search found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwarmViolation {
    /// The seed whose search finds it again.
    pub seed: u64,
    pub property: String,
    /// Steps of the counterexample.
    pub steps: usize,
}

/// What a swarm did: the machine-readable summary (a Slurm task writes it,
/// `mrcache swarm collect` merges them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SwarmSummary {
    pub config: String,
    pub mode: SwarmMode,
    pub first_seed: u64,
    pub searches_requested: u64,
    /// Searches that ran to their own bound (not cut by a stop or a timeout).
    pub searches_finished: u64,
    pub max_depth_bound: usize,
    pub states_per_search: usize,
    /// States the searches reached, each counted once per search.
    pub states: u64,
    /// Distinct states over all searches (by fingerprint; a lower bound
    /// once `coverage_capped`).
    pub distinct_states: u64,
    pub coverage_capped: bool,
    /// The deepest state any search reached.
    pub max_depth: usize,
    pub elapsed_secs: f64,
    /// The `sometimes` goals some search reached.
    pub reached: Vec<String>,
    /// Every violation found, by seed.
    pub violations: Vec<SwarmViolation>,
}

/// A swarm's result: the summary, and the counterexample of the lowest seed
/// that found one.
#[derive(Clone, Debug)]
pub struct SwarmOutcome {
    pub summary: SwarmSummary,
    pub counterexample: Option<(u64, Counterexample)>,
}

/// Progress while a swarm runs.
#[derive(Clone, Copy, Debug)]
pub struct SwarmProgress {
    pub searches_done: u64,
    pub states: u64,
    pub max_depth: usize,
    /// Some search has found a violation.
    pub failed: bool,
    pub elapsed: Duration,
}

/// splitmix64: a small generator whose whole state is the seed.
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // Mixed once, so seeds 0, 1, 2 ... start far apart.
        let mut r = Rng(seed ^ 0x6a09_e667_f3bc_c909);
        r.next();
        r
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0).
    fn below(&mut self, n: usize) -> usize {
        ((self.next() as u128 * n as u128) >> 64) as usize
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

/// The depth bound the search of `seed` draws.
pub fn depth_bound(seed: u64, max_depth: usize) -> usize {
    let max = max_depth.max(1);
    let lo = (max / 4).max(1);
    lo + Rng::new(seed).below(max - lo + 1)
}

fn fingerprint(s: &crate::state::State) -> u64 {
    crate::engine::fingerprint(s)
}

/// Random walks in a row that find no new state, after which a search in
/// [`SwarmMode::Walk`] ends.
const STALE_WALKS: u32 = 64;

/// One search's result.
struct Search {
    states: u64,
    max_depth: usize,
    finished: bool,
    visited: HashSet<u64>,
    reached: BTreeSet<&'static str>,
    violation: Option<(&'static str, Vec<Action>)>,
}

/// Judges `s`: the first `always` property it violates; the `sometimes`
/// goals it reaches go into `reached`.
fn judge(
    model: &AlgoModel,
    props: &[Property<AlgoModel>],
    s: &crate::state::State,
    reached: &mut BTreeSet<&'static str>,
) -> Option<&'static str> {
    let mut bad = None;
    for p in props {
        match p.expectation {
            Expectation::Always if bad.is_none() && !(p.condition)(model, s) => bad = Some(p.name),
            Expectation::Sometimes if !reached.contains(p.name) && (p.condition)(model, s) => {
                reached.insert(p.name);
            }
            _ => {}
        }
    }
    bad
}

/// Runs the search of `seed`. `stop` ends it early (then `finished` is false).
fn search(model: &AlgoModel, props: &[Property<AlgoModel>], opts: &SwarmOptions, seed: u64, stop: &dyn Fn() -> bool) -> Search {
    let mut rng = Rng::new(seed);
    let bound = depth_bound(seed, opts.max_depth);
    rng.next(); // the draw of the bound
    let cap = opts.states_per_search.max(1);
    let mut out = Search {
        states: 0,
        max_depth: 0,
        finished: true,
        visited: HashSet::with_capacity(cap.min(1 << 16)),
        reached: BTreeSet::new(),
        violation: None,
    };
    let mut acts = Vec::new();
    let mut inits = model.init_states();
    rng.shuffle(&mut inits);
    match opts.mode {
        SwarmMode::Dfs => {
            // The stack: a state, its untried actions (shuffled, taken from
            // the end) and the action that led to it. At most `bound` + 1 deep.
            struct Frame {
                state: crate::state::State,
                untried: Vec<Action>,
                via: Option<Action>,
            }
            for init in inits {
                if !out.visited.insert(fingerprint(&init)) {
                    continue;
                }
                out.states += 1;
                if let Some(p) = judge(model, props, &init, &mut out.reached) {
                    out.violation = Some((p, Vec::new()));
                    return out;
                }
                let mut stack = Vec::with_capacity(bound + 1);
                let mut untried = Vec::new();
                model.actions(&init, &mut untried);
                rng.shuffle(&mut untried);
                stack.push(Frame { state: init, untried, via: None });
                while let Some(top) = stack.last_mut() {
                    if out.states.is_multiple_of(1024) && stop() {
                        out.finished = false;
                        return out;
                    }
                    let Some(a) = top.untried.pop() else {
                        stack.pop();
                        continue;
                    };
                    let Some(next) = model.next_state(&top.state, a) else { continue };
                    if !out.visited.insert(fingerprint(&next)) {
                        continue;
                    }
                    out.states += 1;
                    let depth = stack.len();
                    out.max_depth = out.max_depth.max(depth);
                    if let Some(p) = judge(model, props, &next, &mut out.reached) {
                        let mut path: Vec<Action> = stack.iter().filter_map(|f| f.via).collect();
                        path.push(a);
                        out.violation = Some((p, path));
                        return out;
                    }
                    if out.visited.len() >= cap {
                        return out;
                    }
                    if depth < bound {
                        let mut untried = Vec::new();
                        model.actions(&next, &mut untried);
                        rng.shuffle(&mut untried);
                        stack.push(Frame { state: next, untried, via: Some(a) });
                    }
                }
            }
        }
        SwarmMode::Walk => {
            // Walks until `cap` distinct states, or STALE_WALKS walks in a
            // row that found nothing new (a small state space walked out).
            let mut stale_walks = 0;
            let mut path = Vec::with_capacity(bound);
            while out.visited.len() < cap && stale_walks < STALE_WALKS && !inits.is_empty() {
                if stop() {
                    out.finished = false;
                    return out;
                }
                let mut s = inits[rng.below(inits.len())].clone();
                path.clear();
                let mut new = false;
                loop {
                    if out.visited.insert(fingerprint(&s)) {
                        new = true;
                        out.states += 1;
                        out.max_depth = out.max_depth.max(path.len());
                        if let Some(p) = judge(model, props, &s, &mut out.reached) {
                            out.violation = Some((p, path.clone()));
                            return out;
                        }
                        if out.visited.len() >= cap {
                            break;
                        }
                    }
                    if path.len() >= bound {
                        break;
                    }
                    acts.clear();
                    model.actions(&s, &mut acts);
                    if acts.is_empty() {
                        break;
                    }
                    let a = acts[rng.below(acts.len())];
                    let Some(n) = model.next_state(&s, a) else { break };
                    s = n;
                    path.push(a);
                }
                stale_walks = if new { 0 } else { stale_walks + 1 };
            }
        }
    }
    out
}

/// Runs a swarm on `cfg` without progress reports.
pub fn swarm(cfg: &CheckConfig, opts: &SwarmOptions) -> Result<SwarmOutcome, String> {
    swarm_with_progress(cfg, opts, |_| {})
}

/// Runs a swarm on `cfg`, calling `progress` about every 200 ms.
pub fn swarm_with_progress(
    cfg: &CheckConfig,
    opts: &SwarmOptions,
    mut progress: impl FnMut(&SwarmProgress),
) -> Result<SwarmOutcome, String> {
    let model = AlgoModel::new(cfg.clone())?;
    let props = model.properties();
    let start = Instant::now();
    let next_seed = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let states = AtomicU64::new(0);
    let depth = AtomicU64::new(0);
    #[derive(Default)]
    struct Merged {
        finished: u64,
        coverage: HashSet<u64>,
        capped: bool,
        reached: BTreeSet<&'static str>,
        violations: BTreeMap<u64, (&'static str, Vec<Action>)>,
    }
    let merged = Mutex::new(Merged::default());
    let out_of_time = || opts.timeout.is_some_and(|t| start.elapsed() >= t);
    let stop = || out_of_time() || (opts.stop_at_first_failure && failed.load(Ordering::Relaxed));
    let workers = opts.workers.max(1).min(opts.searches.max(1) as usize);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| loop {
                    let i = next_seed.fetch_add(1, Ordering::Relaxed);
                    if i >= opts.searches || stop() {
                        break;
                    }
                    let seed = opts.first_seed.wrapping_add(i);
                    let r = search(&model, &props, opts, seed, &stop);
                    states.fetch_add(r.states, Ordering::Relaxed);
                    depth.fetch_max(r.max_depth as u64, Ordering::Relaxed);
                    let mut m = merged.lock().expect("no worker panics holding the lock");
                    m.finished += u64::from(r.finished);
                    for fp in &r.visited {
                        if m.coverage.len() >= opts.coverage_cap {
                            m.capped = true;
                            break;
                        }
                        m.coverage.insert(*fp);
                    }
                    m.reached.extend(r.reached.iter().copied());
                    if let Some(v) = r.violation {
                        m.violations.insert(seed, v);
                        failed.store(true, Ordering::Relaxed);
                    }
                    drop(m);
                    done.fetch_add(1, Ordering::Relaxed);
                })
            })
            .collect();
        let report = || SwarmProgress {
            searches_done: done.load(Ordering::Relaxed),
            states: states.load(Ordering::Relaxed),
            max_depth: depth.load(Ordering::Relaxed) as usize,
            failed: failed.load(Ordering::Relaxed),
            elapsed: start.elapsed(),
        };
        let mut last = Instant::now();
        while !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(5));
            if last.elapsed() >= Duration::from_millis(200) {
                progress(&report());
                last = Instant::now();
            }
        }
        progress(&report());
    });
    let m = merged.into_inner().expect("no worker panicked");
    let counterexample =
        m.violations.iter().next().map(|(&seed, (name, actions))| (seed, counterexample_of(&model, name, actions.clone())));
    let summary = SwarmSummary {
        config: cfg.describe(),
        mode: opts.mode,
        first_seed: opts.first_seed,
        searches_requested: opts.searches,
        searches_finished: m.finished,
        max_depth_bound: opts.max_depth,
        states_per_search: opts.states_per_search,
        states: states.into_inner(),
        distinct_states: m.coverage.len() as u64,
        coverage_capped: m.capped,
        max_depth: depth.into_inner() as usize,
        elapsed_secs: start.elapsed().as_secs_f64(),
        reached: m.reached.iter().map(|s| s.to_string()).collect(),
        violations: m.violations.iter().map(|(&seed, (p, a))| SwarmViolation { seed, property: p.to_string(), steps: a.len() }).collect(),
    };
    Ok(SwarmOutcome { summary, counterexample })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_fix_the_bound_and_the_generator() {
        assert_eq!(depth_bound(7, 100), depth_bound(7, 100));
        for seed in 0..200 {
            let d = depth_bound(seed, 100);
            assert!((25..=100).contains(&d), "{d}");
        }
        let (mut a, mut b) = (Rng::new(3), Rng::new(3));
        assert!((0..100).all(|_| a.next() == b.next()));
        assert_ne!(Rng::new(0).next(), Rng::new(1).next());
        let mut r = Rng::new(9);
        assert!((0..1000).all(|_| r.below(5) < 5));
    }
}
