//! `mrcache conform`: run the conformance cases against a registration cache
//! behind an adapter process (docs/conformance-protocol.md), judged by the
//! reference model (spec.md#S9) and by the physical truth of the memory
//! operations the adapter performed.
//!
//! Two judges look at every outcome:
//! - the **physical judge** (P1-P4 from observations alone): the registration
//!   that served an acquire covers it (P1) and was registered after every
//!   release event on its pages that returned before the acquire was sent
//!   (P2); a deregistration names a registration with no lease held (P3) that
//!   was registered and not yet deregistered (P4). It needs no policy.
//! - the **model judge** ([`Model::judge`], [`Model::observe_deregister`])
//!   under the adapter's declared policy (or `--policy`): C1-C4 and P5 too.
//!   After its first objection it stops (its state no longer follows the
//!   peer); the physical judge goes on to the end of the case. A peer that
//!   declares no policy is judged by the model under `independent` and a C
//!   rule it breaks makes the case `diverges`, not `fail`.
//!
//! Deregistration timing (L1) is reported, never failed: how many operations
//! after the model's deregistration the adapter reported it.
//!
//! Cases are JSON lines (conformance/README.md): a header, then records that
//! wrap the one [`Op`] enum (`{"op":...}` plus `buf`, `thread`, `pause`), memory
//! operations (`{"mem":...}`) and `{"ctl":"continue"}`.
//!
//! The parts: `case` (the case files and their parser), `adapter_process`
//! (the adapter process the runner starts for each case), `hello` (its
//! hello reply), `session` (one case from start to verdict), `commands`
//! (the records sent as commands), `replies` (the adapter's lines), `judge`
//! (the physical and model judges, L1), `gaps` (wasted work, deferred
//! deregistration), `data` (the data commands' shadow) and `report` (the
//! results and their table). This module holds the arguments, [`run`], and
//! the state of one case run that those modules share.
//!
//! [`builtin_adapter`] is not part of the runner: it is an adapter
//! (`mrcache adapter`), run by the runner like any peer's, and imports
//! nothing from the runner (they share only docs/conformance-protocol.md).

mod adapter_process;
pub mod builtin_adapter;
mod case;
mod commands;
mod data;
mod gaps;
mod hello;
mod judge;
mod replies;
mod report;
mod session;

pub use case::{Case, DuringOp, MemKind, Preload, Record, PRELOADS};
pub use data::{DataKind, DataRecord};
pub use report::{table, CaseResult, Failure, RunReport, Verdict};

use adapter_process::AdapterProcess;
use anyhow::{bail, Result};
use judge::Entry;
use mrcache_model::{Model, OverlapPolicy};
use mrcache_types::{Access, LeaseId, Op, PageSpan, Range};
use session::run_case;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

/// The protocol version this runner speaks.
pub const PROTOCOL: u64 = 1;

/// Smallest arena an adapter may offer, and what a case gets unless its
/// header asks for more (`arena`).
pub const MIN_ARENA: u64 = 1 << 20;

/// The largest arena a case may ask for.
pub const MAX_CASE_ARENA: u64 = 1 << 30;

#[derive(clap::Args, Debug, Clone)]
pub struct ConformArgs {
    /// The adapter command line, run by `sh -c` (one fresh process per case).
    #[arg(long)]
    pub adapter: String,
    /// Directory of cases (`*.jsonl`), or one case file.
    #[arg(long, default_value = "conformance/cases")]
    pub cases: PathBuf,
    /// Judge under this overlap policy instead of the adapter's declaration
    /// (for an adapter that declares none, C-rule differences are `diverges`).
    #[arg(long)]
    pub policy: Option<OverlapPolicy>,
    /// Print the results as JSON.
    #[arg(long)]
    pub json: bool,
    /// Seconds an adapter may take to answer one command before it is hung.
    #[arg(long, default_value_t = ConformArgs::DEFAULT_TIMEOUT)]
    pub timeout: f64,
    /// Milliseconds after which a command sent while another thread is paused
    /// is recorded as `blocked` (it completes after the continue).
    #[arg(long, default_value_t = ConformArgs::DEFAULT_BLOCK_MS)]
    pub block_ms: u64,
    /// Run only the cases whose name contains this (repeatable).
    #[arg(long = "case")]
    pub only: Vec<String>,
    /// Run every case's adapter under this allocator (`jemalloc` or
    /// `mimalloc`, as a case's header `preload` does), except the cases that
    /// name their own; a case with `malloc`, `free` or brk records is then
    /// `unsupported` (the runner judges those as glibc serves them).
    #[arg(long)]
    pub preload: Option<String>,
}

impl ConformArgs {
    /// `--timeout`'s default (seconds).
    pub const DEFAULT_TIMEOUT: f64 = 10.0;
    /// `--block-ms`'s default.
    pub const DEFAULT_BLOCK_MS: u64 = 300;

    /// What `mrcache conform --adapter ADAPTER --cases CASES` runs: every
    /// other option at its default.
    pub fn new(adapter: impl Into<String>, cases: impl Into<PathBuf>) -> ConformArgs {
        ConformArgs {
            adapter: adapter.into(),
            cases: cases.into(),
            policy: None,
            json: false,
            timeout: ConformArgs::DEFAULT_TIMEOUT,
            block_ms: ConformArgs::DEFAULT_BLOCK_MS,
            only: Vec::new(),
            preload: None,
        }
    }
}

/// The adapter ended before its first hello: `mrcache conform` reports it
/// once, with its own exit status ([`AdapterDidNotStart::EXIT_STATUS`]),
/// instead of a crash in every case.
#[derive(Debug)]
pub struct AdapterDidNotStart {
    pub message: String,
}

impl AdapterDidNotStart {
    /// `mrcache conform`'s exit status for it (1: a case failed; 2: an
    /// error in the cases or the arguments).
    pub const EXIT_STATUS: u8 = 3;

    fn new(adapter: &str, first: &CaseResult) -> Self {
        let stderr: Vec<&str> = first.transcript.iter().filter_map(|l| l.strip_prefix("stderr: ")).collect();
        let mut message = format!("the adapter did not start: `{adapter}`: {}", first.detail.trim_start_matches("the adapter "));
        if !stderr.is_empty() {
            message.push_str(&format!("; its stderr: {}", stderr.join(" | ")));
        }
        if first.detail.contains("status 127") {
            message.push_str(
                "; status 127 is the shell's `command not found`: check the command; for mrcache's own \
                 adapter give its full path (e.g. target/release/mrcache adapter) or put mrcache on PATH \
                 (`cargo install --path .`)",
            );
        }
        AdapterDidNotStart { message }
    }
}

impl std::fmt::Display for AdapterDidNotStart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for AdapterDidNotStart {}

/// Runs every case; the adapter's identity comes from the first hello.
pub fn run(args: &ConformArgs) -> Result<RunReport> {
    if let Some(p) = &args.preload {
        if !PRELOADS.iter().any(|x| x.name == p) {
            bail!("--preload {p}: expected one of {}", PRELOADS.iter().map(|x| x.name).collect::<Vec<_>>().join(", "));
        }
    }
    let mut cases = Case::load_dir(&args.cases)?;
    if !args.only.is_empty() {
        cases.retain(|c| args.only.iter().any(|o| c.name.contains(o.as_str())));
        if cases.is_empty() {
            bail!("no case in {} matches {:?}", args.cases.display(), args.only);
        }
    }
    let mut report = RunReport {
        adapter: args.adapter.clone(),
        name: String::new(),
        version: String::new(),
        declared_policy: None,
        judged_under: String::new(),
        registrar: String::new(),
        results: Vec::new(),
    };
    for case in &cases {
        let (res, hello) = run_case(case, args);
        // An adapter that ends before its first hello did not start (a
        // wrong path, a missing library, `mrcache` not on PATH): one error,
        // not a crash in every case.
        if hello.is_none() && report.name.is_empty() {
            if let Some(r) = res.as_ref().filter(|r| r.rule == "crash" && r.line <= 1) {
                return Err(AdapterDidNotStart::new(&args.adapter, r).into());
            }
        }
        if let Some(h) = hello {
            if report.name.is_empty() {
                report.name = h.name.clone();
                report.version = h.version.clone();
                report.declared_policy = h.policy.map(|p| p.name().to_string());
                report.judged_under = args.policy.or(h.policy).unwrap_or(OverlapPolicy::Independent).name().to_string();
                report.registrar = h.registrar.clone().unwrap_or_else(|| "not declared".into());
            }
        }
        res.into_iter().for_each(|r| report.results.push(r));
    }
    Ok(report)
}

// ---------------------------------------------------------------------------
// The state of one case run, shared by the modules that drive and judge it

/// A finding that ends (fail) or marks (diverges) a case.
#[derive(Clone, Debug)]
struct Finding {
    rule: String,
    line: usize,
    detail: String,
}

/// A registration the adapter reported.
#[derive(Clone, Debug)]
struct PhysReg {
    span: PageSpan,
    range: Range,
    access: Access,
    /// Release events completed before its `reg` line arrived.
    at: u64,
    /// Arrival order among reg lines.
    order: u64,
    deregistered: bool,
    model_id: Option<u64>,
}

#[derive(Clone, Debug)]
enum PendingKind {
    Acquire {
        lease: LeaseId,
        span: PageSpan,
        access: Access,
        model_op: Op,
    },
    Release {
        lease: LeaseId,
        model_op: Op,
    },
    Mem {
        kind: MemKind,
        name: Option<String>,
        len: u64,
        model_ops: Vec<Op>,
        spans: Vec<PageSpan>,
    },
    Model {
        model_op: Op,
    },
    Data {
        kind: DataKind,
        lease: Option<LeaseId>,
        addr: u64,
        len: u64,
        byte: Option<u8>,
    },
    Continue,
    /// A `query` of pinned bytes and live registrations (gaps.rs).
    Query,
    /// An `rss` (a mark, or a check against `max_growth` bytes).
    Rss {
        max_growth: Option<u64>,
    },
    /// A `destroy` (`create` false) or `create` of the adapter's cache.
    Lifecycle {
        create: bool,
    },
}

#[derive(Clone, Debug)]
struct Pending {
    line: usize,
    thread: u64,
    kind: PendingKind,
    /// Release events completed when it was sent (P2).
    events_at: u64,
    /// Reg lines seen when it was sent (hit or miss).
    regs_at: u64,
    paused: bool,
    blocked: bool,
    /// The models and the log length when it was sent.
    snap: (Vec<Model>, usize),
}

/// One case in progress: the adapter, the commands in flight, and what
/// each judge has seen so far.
struct CaseRun<'a> {
    case: &'a Case,
    args: &'a ConformArgs,
    ad: AdapterProcess,
    seq: u64,
    pending: BTreeMap<u64, Pending>,
    page: u64,
    access_classes: Option<Vec<Access>>,
    bufs: HashMap<String, (u64, u64)>,
    // model judge
    /// The model states that follow the peer: one, or several while an
    /// operation that overlapped others may take effect at any point of its
    /// interval (a paused acquire, an unmap paused in its hook). Empty once
    /// the model objected.
    models: Vec<Model>,
    /// What the models followed, for re-linearizing an overlapping operation.
    log: Vec<Entry>,
    declared: bool,
    next_model_id: u64,
    divergence: Option<Finding>,
    // physical judge
    events: Vec<(PageSpan, u64)>,
    event_seq: u64,
    regs: HashMap<u64, PhysReg>,
    reg_order: u64,
    leases: HashMap<LeaseId, u64>,
    lease_count: HashMap<u64, u32>,
    deregs_buffered: Vec<(u64, usize)>,
    /// Why the model stopped without a verdict.
    note: Option<String>,
    /// Replies held back until the acquire that made their registration is judged.
    deferred: Vec<(u64, String)>,
    /// While judging a reply: the models and log length when its command was sent.
    snap: Option<(Vec<Model>, usize)>,
    // L1
    ops_done: usize,
    l1_since: HashMap<u64, (usize, usize)>,
    l1_worst: Option<(usize, String)>,
    /// The first failure (the case's verdict and rule).
    failure: Option<Finding>,
    /// Every failure, in the order found (the first is `failure`): the
    /// physical judge goes on after a C rule or P1–P4 failure.
    failures: Vec<Finding>,
    /// The transcript when the first failure was found.
    failure_transcript: Option<Vec<String>>,
    /// Wasted work and deferred deregistration.
    gaps: gaps::GapState,
    /// The data commands' shadow and findings (`data`).
    data: data::DataState,
    /// An acquire's `during_register` not yet performed: its seq, the
    /// release events (model ops) and their spans, applied at its first
    /// `reg` line.
    during: Option<(u64, Vec<Op>, Vec<PageSpan>)>,
    /// The adapter's resident set at the last `rss_mark`, and its line.
    rss_mark: Option<(u64, usize)>,
    /// Leases held when the cache was destroyed: their release is a no-op
    /// the model does not judge.
    orphans: std::collections::HashSet<LeaseId>,
}

/// Why a case ended before its last record.
enum Stop {
    Fail(Finding),
    Unsupported(usize, String),
}

fn stop(rule: &str, line: usize, detail: String) -> Stop {
    Stop::Fail(Finding { rule: rule.into(), line, detail })
}
