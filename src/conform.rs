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

use anyhow::{anyhow, bail, Context, Result};
use mrcache_model::{Config, EvictionPolicy, Limits, Model, OverlapPolicy, Property};
use mrcache_types::{Access, LeaseId, Op, OpError, PageSpan, Range, RegView, RegistrarFailure, ReleaseKind, Ret};
use serde::Serialize;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// The protocol version this runner speaks.
pub const PROTOCOL: u64 = 1;

/// Smallest arena an adapter may offer: the cases use offsets below 1 MiB.
pub const MIN_ARENA: u64 = 1 << 20;

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
    #[arg(long, default_value_t = 10.0)]
    pub timeout: f64,
    /// Milliseconds after which a command sent while another thread is paused
    /// is recorded as `blocked` (it completes after the continue).
    #[arg(long, default_value_t = 300)]
    pub block_ms: u64,
    /// Run only the cases whose name contains this (repeatable).
    #[arg(long = "case")]
    pub only: Vec<String>,
}

// ---------------------------------------------------------------------------
// Cases

/// Memory operations the adapter performs for real (docs/conformance-protocol.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemKind {
    Munmap,
    Mmap,
    MmapFixed,
    MadviseDontneed,
    MadviseFree,
    MremapMove,
    MremapShrink,
    Malloc,
    Free,
    BrkGrow,
    BrkShrink,
}

impl MemKind {
    const ALL: [(&'static str, MemKind); 11] = [
        ("munmap", MemKind::Munmap),
        ("mmap", MemKind::Mmap),
        ("mmap_fixed", MemKind::MmapFixed),
        ("madvise_dontneed", MemKind::MadviseDontneed),
        ("madvise_free", MemKind::MadviseFree),
        ("mremap_move", MemKind::MremapMove),
        ("mremap_shrink", MemKind::MremapShrink),
        ("malloc", MemKind::Malloc),
        ("free", MemKind::Free),
        ("brk_grow", MemKind::BrkGrow),
        ("brk_shrink", MemKind::BrkShrink),
    ];
    pub fn name(self) -> &'static str {
        MemKind::ALL.iter().find(|(_, k)| *k == self).map(|(n, _)| *n).unwrap_or("?")
    }
}

/// One record of a case.
#[derive(Clone, Debug)]
pub enum Record {
    /// An [`Op`] (acquire, release, flush, trim, fork), addresses relative to `buf`.
    Op { op: Op, buf: Option<String>, thread: u64, pause: bool },
    /// A memory operation, addresses relative to `buf` (default: the arena).
    Mem { kind: MemKind, buf: Option<String>, name: Option<String>, addr: u64, len: u64, new_len: u64, thread: u64, pause: bool },
    /// Let the paused `thread` go on.
    Continue { thread: u64 },
}

/// A conformance case (conformance/README.md).
#[derive(Clone, Debug)]
pub struct Case {
    pub name: String,
    pub purpose: String,
    pub spec: Vec<String>,
    pub needs: Vec<String>,
    pub max_regions: Option<u64>,
    pub max_pinned_bytes: Option<u64>,
    pub path: PathBuf,
    /// (line number, record)
    pub records: Vec<(usize, Record)>,
}

fn field_u64(obj: &Map<String, Value>, key: &str, at: &str) -> Result<Option<u64>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n.as_u64().map(Some).ok_or_else(|| anyhow!("{at}: field `{key}`: {n} is not an unsigned integer")),
        Some(Value::String(s)) => {
            let parsed = match s.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16),
                None => s.parse(),
            };
            parsed.map(Some).map_err(|_| anyhow!("{at}: field `{key}`: `{s}` is not a number"))
        }
        Some(v) => bail!("{at}: field `{key}`: expected a number or a \"0x...\" string, found {v}"),
    }
}

fn field_str(obj: &Map<String, Value>, key: &str, at: &str) -> Result<Option<String>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => bail!("{at}: field `{key}`: expected a string, found {v}"),
    }
}

fn field_bool(obj: &Map<String, Value>, key: &str, at: &str) -> Result<bool> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => bail!("{at}: field `{key}`: expected true or false, found {v}"),
    }
}

impl Case {
    pub fn load(path: &Path) -> Result<Case> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read case {}", path.display()))?;
        Case::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Case> {
        let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
        let (_, head) = lines.next().ok_or_else(|| anyhow!("{}: empty case file", path.display()))?;
        let at = format!("{}:1", path.display());
        let h: Map<String, Value> = serde_json::from_str(head).with_context(|| format!("{at}: header is not a JSON object"))?;
        match h.get("mrcache_conformance") {
            Some(v) if v.as_u64() == Some(1) => {}
            _ => bail!("{at}: the header must start with \"mrcache_conformance\": 1"),
        }
        const HEADER: [&str; 7] = ["mrcache_conformance", "name", "purpose", "spec", "needs", "max_regions", "max_pinned_bytes"];
        if let Some(k) = h.keys().find(|k| !HEADER.contains(&k.as_str())) {
            bail!("{at}: unknown header field `{k}` (expected one of {})", HEADER.join(", "));
        }
        let name = field_str(&h, "name", &at)?.ok_or_else(|| anyhow!("{at}: the header needs a `name`"))?;
        let purpose = field_str(&h, "purpose", &at)?.ok_or_else(|| anyhow!("{at}: the header needs a one-line `purpose`"))?;
        let strings = |key: &str| -> Result<Vec<String>> {
            match h.get(key) {
                None => Ok(Vec::new()),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|v| v.as_str().map(String::from).ok_or_else(|| anyhow!("{at}: `{key}` must be a list of strings")))
                    .collect(),
                Some(_) => bail!("{at}: `{key}` must be a list of strings"),
            }
        };
        let spec = strings("spec")?;
        if spec.is_empty() {
            bail!("{at}: the header must name the spec IDs the case checks (`spec`)");
        }
        let needs = strings("needs")?;
        let max_regions = field_u64(&h, "max_regions", &at)?;
        let max_pinned_bytes = field_u64(&h, "max_pinned_bytes", &at)?;
        let mut records = Vec::new();
        for (i, line) in lines {
            let n = i + 1;
            let at = format!("{}:{n}", path.display());
            let mut obj: Map<String, Value> =
                serde_json::from_str(line).with_context(|| format!("{at}: not a JSON object"))?;
            let thread = field_u64(&obj, "thread", &at)?.unwrap_or(0);
            let pause = field_bool(&obj, "pause", &at)?;
            let buf = field_str(&obj, "buf", &at)?;
            if let Some(ctl) = field_str(&obj, "ctl", &at)? {
                match ctl.as_str() {
                    "continue" => records.push((n, Record::Continue { thread })),
                    other => bail!("{at}: unknown ctl `{other}` (expected continue)"),
                }
            } else if let Some(mem) = field_str(&obj, "mem", &at)? {
                let kind = MemKind::ALL
                    .iter()
                    .find(|(s, _)| *s == mem)
                    .map(|(_, k)| *k)
                    .ok_or_else(|| {
                        anyhow!(
                            "{at}: unknown memory operation `{mem}` (expected {})",
                            MemKind::ALL.iter().map(|(s, _)| *s).collect::<Vec<_>>().join(", ")
                        )
                    })?;
                let addr = field_u64(&obj, "addr", &at)?.unwrap_or(0);
                let len = field_u64(&obj, "len", &at)?.unwrap_or(0);
                let new_len = field_u64(&obj, "new_len", &at)?.unwrap_or(0);
                let name = field_str(&obj, "name", &at)?;
                let needs_len = !matches!(kind, MemKind::Free);
                if needs_len && len == 0 {
                    bail!("{at}: field `len`: `{mem}` needs a length above 0");
                }
                if matches!(kind, MemKind::Malloc | MemKind::BrkGrow) && name.is_none() {
                    bail!("{at}: `{mem}` needs a `name` that later records use as `buf`");
                }
                if matches!(kind, MemKind::Free | MemKind::BrkShrink) && buf.is_none() {
                    bail!("{at}: `{mem}` needs the `buf` it applies to");
                }
                if kind == MemKind::MremapShrink && (new_len == 0 || new_len >= len) {
                    bail!("{at}: field `new_len`: mremap_shrink needs 0 < new_len < len");
                }
                records.push((n, Record::Mem { kind, buf, name, addr, len, new_len, thread, pause }));
            } else if obj.contains_key("op") {
                for k in ["thread", "pause", "buf"] {
                    obj.remove(k);
                }
                let op: Op = serde_json::from_value(Value::Object(obj)).with_context(|| format!("{at}: not an op"))?;
                match op {
                    Op::ReleaseEvent { .. } | Op::Alloc { .. } | Op::Free { .. } => bail!(
                        "{at}: `{}` is not a conformance record: the adapter performs real memory operations (use {{\"mem\": ...}})",
                        op.name()
                    ),
                    _ => {}
                }
                if let Some(Err(e)) = op.range() {
                    bail!("{at}: {e}");
                }
                if pause && !matches!(op, Op::Acquire { .. }) {
                    bail!("{at}: only an acquire or a memory operation can pause");
                }
                records.push((n, Record::Op { op, buf, thread, pause }));
            } else {
                bail!("{at}: a record needs `op`, `mem` or `ctl`");
            }
        }
        Ok(Case { name, purpose, spec, needs, max_regions, max_pinned_bytes, path: path.to_path_buf(), records })
    }

    /// Every `*.jsonl` under `dir` (or `dir` itself if it is a file), by name.
    pub fn load_dir(dir: &Path) -> Result<Vec<Case>> {
        if dir.is_file() {
            return Ok(vec![Case::load(dir)?]);
        }
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("cannot read the case directory {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
            .collect();
        paths.sort();
        let cases = paths.iter().map(|p| Case::load(p)).collect::<Result<Vec<_>>>()?;
        let mut names = std::collections::HashSet::new();
        for c in &cases {
            if !names.insert(c.name.clone()) {
                bail!("{}: case name `{}` is used twice", c.path.display(), c.name);
            }
        }
        Ok(cases)
    }
}

// ---------------------------------------------------------------------------
// Results

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Pass,
    Fail,
    /// The peer declares no S6.1 policy and its overlap/eviction behaviour
    /// differs from the model's (reported, not failed).
    Diverges,
    Unsupported,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "fail",
            Verdict::Diverges => "diverges",
            Verdict::Unsupported => "unsupported",
        })
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct CaseResult {
    pub case: String,
    pub verdict: Verdict,
    /// The property or C-rule (P1..P6, C1..C4), or `hang`, `crash`, `abort`,
    /// `protocol`, `mem-op`.
    pub rule: String,
    /// The case line where it happened.
    pub line: usize,
    pub detail: String,
    /// What the model said after a divergence it did not fail (for the table).
    pub divergence: Option<String>,
    /// Deregistration timing against L1.
    pub l1: String,
    pub transcript: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub adapter: String,
    pub name: String,
    pub version: String,
    pub declared_policy: Option<String>,
    pub judged_under: String,
    pub results: Vec<CaseResult>,
}

impl RunReport {
    pub fn failed(&self) -> usize {
        self.results.iter().filter(|r| r.verdict == Verdict::Fail).count()
    }
}

// ---------------------------------------------------------------------------
// The adapter process

enum Line {
    Text(String),
    Eof,
}

struct Adapter {
    child: Child,
    stdin: Option<ChildStdin>,
    rx: Receiver<Line>,
    stderr: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    transcript: Vec<String>,
}

const TRANSCRIPT_KEEP: usize = 24;

impl Adapter {
    fn spawn(cmd: &str) -> Result<Adapter> {
        use std::os::unix::process::CommandExt;
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!("exec {cmd}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot start the adapter `{cmd}`"))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            loop {
                let mut s = String::new();
                match r.read_line(&mut s) {
                    Ok(0) | Err(_) => {
                        let _ = tx.send(Line::Eof);
                        return;
                    }
                    Ok(_) => {
                        if tx.send(Line::Text(s.trim_end().to_string())).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let errs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let errs2 = errs.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(stderr).lines() {
                let Ok(l) = l else { return };
                let mut v = errs2.lock().unwrap_or_else(|e| e.into_inner());
                v.push(l);
                if v.len() > 8 {
                    v.remove(0);
                }
            }
        });
        Ok(Adapter { child, stdin, rx, stderr: errs, transcript: Vec::new() })
    }

    fn note(&mut self, s: String) {
        self.transcript.push(s);
        if self.transcript.len() > TRANSCRIPT_KEEP {
            self.transcript.remove(0);
        }
    }

    fn send(&mut self, v: &Value, line: usize) -> Result<(), String> {
        let s = v.to_string();
        self.note(format!("> {s}    (case line {line})"));
        let stdin = self.stdin.as_mut().ok_or("the adapter's stdin is closed")?;
        stdin
            .write_all(s.as_bytes())
            .and_then(|()| stdin.write_all(b"\n"))
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("cannot write to the adapter: {e}"))
    }

    /// Kills the adapter's whole process group.
    fn kill(&mut self) {
        let pid = self.child.id() as i32;
        // SAFETY: signals our own child's process group (spawned with process_group(0)).
        unsafe { libc::kill(-pid, libc::SIGKILL) };
        let _ = self.child.wait();
    }

    /// After EOF: how the adapter ended (waits up to 2 s, then kills).
    fn exit_status(&mut self) -> String {
        use std::os::unix::process::ExitStatusExt;
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match self.child.try_wait() {
                Ok(Some(st)) => {
                    return match (st.code(), st.signal()) {
                        (Some(c), _) => format!("exited with status {c}"),
                        (_, Some(s)) => format!("killed by signal {s} ({})", signal_name(s)),
                        _ => "ended".into(),
                    };
                }
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                _ => {
                    self.kill();
                    return "closed its stdout and did not exit within 2 s (killed)".into();
                }
            }
        }
    }

    fn stderr_tail(&self) -> Vec<String> {
        self.stderr.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn signal_name(s: i32) -> &'static str {
    match s {
        libc::SIGABRT => "SIGABRT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGKILL => "SIGKILL",
        libc::SIGBUS => "SIGBUS",
        libc::SIGTERM => "SIGTERM",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        _ => "signal",
    }
}

// ---------------------------------------------------------------------------
// Judging one case

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
    Acquire { lease: LeaseId, span: PageSpan, access: Access, model_op: Op },
    Release { lease: LeaseId, model_op: Op },
    Mem { kind: MemKind, name: Option<String>, len: u64, model_ops: Vec<Op>, spans: Vec<PageSpan> },
    Model { model_op: Op },
    Continue,
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

/// A step the models followed.
#[derive(Clone, Debug)]
enum Entry {
    Judge(Op, Ret),
    Dereg(u64),
}

fn replay_entry(m: &mut Model, e: &Entry) -> bool {
    match e {
        Entry::Judge(op, ret) => m.judge(op, ret).is_ok(),
        Entry::Dereg(id) => m.observe_deregister(*id).is_ok(),
    }
}

struct Hello {
    name: String,
    version: String,
    policy: Option<OverlapPolicy>,
    page_size: u64,
    caps: Vec<String>,
    /// The access sets the peer can register, smallest first; a request is
    /// judged as the smallest class that suffices (`access_field: false`: one
    /// class, every right).
    access_classes: Option<Vec<Access>>,
    arena: Range,
    limits: Limits,
    eviction: EvictionPolicy,
}

struct CaseRun<'a> {
    case: &'a Case,
    args: &'a ConformArgs,
    ad: Adapter,
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
    failure: Option<Finding>,
}

const ALL_ACCESS: Access = Access::LOCAL_WRITE.union(Access::REMOTE_READ).union(Access::REMOTE_WRITE).union(Access::REMOTE_ATOMIC);

fn parse_hello(v: &Value, at: &str) -> Result<Hello, String> {
    let o = v.as_object().ok_or_else(|| format!("{at}: the hello reply is not an object"))?;
    let s = |k: &str| o.get(k).and_then(Value::as_str).map(String::from);
    if o.get("ok") != Some(&Value::Bool(true)) {
        return Err(format!("{at}: hello failed: {}", s("error").unwrap_or_else(|| v.to_string())));
    }
    match o.get("protocol").and_then(Value::as_u64) {
        Some(PROTOCOL) => {}
        other => return Err(format!("{at}: field `protocol`: the runner speaks {PROTOCOL}, the adapter {other:?}")),
    }
    let name = s("name").ok_or_else(|| format!("{at}: the hello reply needs `name`"))?;
    let version = s("version").unwrap_or_else(|| "?".into());
    let policy = match o.get("policy") {
        None | Some(Value::Null) => None,
        Some(Value::String(p)) => Some(p.parse::<OverlapPolicy>().map_err(|e| format!("{at}: field `policy`: {e}"))?),
        Some(x) => return Err(format!("{at}: field `policy`: expected a string or null, found {x}")),
    };
    let page_size = o.get("page_size").and_then(Value::as_u64).unwrap_or(4096);
    let caps = o
        .get("caps")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|c| c.as_str().map(String::from)).collect())
        .unwrap_or_default();
    let access_field = o.get("access_field").and_then(Value::as_bool).unwrap_or(true);
    let mut access_classes = match o.get("access_classes") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => Some(
            a.iter()
                .map(|c| {
                    c.as_str()
                        .ok_or_else(|| format!("{at}: field `access_classes`: expected strings"))
                        .and_then(|s| s.parse::<Access>().map_err(|e| format!("{at}: field `access_classes`: {e}")))
                })
                .collect::<Result<Vec<Access>, String>>()?,
        ),
        Some(x) => return Err(format!("{at}: field `access_classes`: expected a list, found {x}")),
    };
    if !access_field {
        access_classes = Some(vec![ALL_ACCESS]);
    }
    if let Some(c) = access_classes.as_mut() {
        c.sort_by_key(|a| (a.bits().count_ones(), a.bits()));
    }
    let arena = o.get("arena").and_then(Value::as_object).ok_or_else(|| format!("{at}: the hello reply needs `arena` {{addr, len}}"))?;
    let addr = field_u64(arena, "addr", at).map_err(|e| e.to_string())?.ok_or_else(|| format!("{at}: arena.addr missing"))?;
    let len = field_u64(arena, "len", at).map_err(|e| e.to_string())?.ok_or_else(|| format!("{at}: arena.len missing"))?;
    if len < MIN_ARENA || addr % page_size != 0 {
        return Err(format!("{at}: field `arena`: needs a page-aligned arena of at least {MIN_ARENA} bytes, got {addr:#x}+{len:#x}"));
    }
    let arena = Range::new(addr, len).map_err(|e| format!("{at}: field `arena`: {e}"))?;
    let lim = o.get("limits").and_then(Value::as_object).cloned().unwrap_or_default();
    let limits = Limits {
        max_regions: field_u64(&lim, "max_regions", at).map_err(|e| e.to_string())?,
        max_pinned_bytes: field_u64(&lim, "max_pinned_bytes", at).map_err(|e| e.to_string())?,
        max_unreleased: Some(Limits::DEFAULT_MAX_UNRELEASED),
    };
    let eviction = match s("eviction") {
        None => EvictionPolicy::Lru,
        Some(e) => e.parse().map_err(|e| format!("{at}: field `eviction`: {e}"))?,
    };
    Ok(Hello { name, version, policy, page_size, caps, access_classes, arena, limits, eviction })
}

/// Runs every case; the adapter's identity comes from the first hello.
pub fn run(args: &ConformArgs) -> Result<RunReport> {
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
        results: Vec::new(),
    };
    for case in &cases {
        let (res, hello) = run_case(case, args);
        if let Some(h) = hello {
            if report.name.is_empty() {
                report.name = h.name.clone();
                report.version = h.version.clone();
                report.declared_policy = h.policy.map(|p| p.name().to_string());
                report.judged_under = args.policy.or(h.policy).unwrap_or(OverlapPolicy::Independent).name().to_string();
            }
        }
        res.into_iter().for_each(|r| report.results.push(r));
    }
    Ok(report)
}

fn result(case: &Case, verdict: Verdict, rule: &str, line: usize, detail: String) -> CaseResult {
    CaseResult {
        case: case.name.clone(),
        verdict,
        rule: rule.into(),
        line,
        detail,
        divergence: None,
        l1: String::new(),
        transcript: Vec::new(),
    }
}

fn run_case(case: &Case, args: &ConformArgs) -> (Option<CaseResult>, Option<Hello>) {
    let mut ad = match Adapter::spawn(&args.adapter) {
        Ok(a) => a,
        Err(e) => return (Some(result(case, Verdict::Fail, "crash", 0, format!("{e:#}"))), None),
    };
    let hello_cmd = json!({
        "seq": 0, "cmd": "hello", "protocol": PROTOCOL, "case": case.name,
        "config": {"max_regions": case.max_regions, "max_pinned_bytes": case.max_pinned_bytes},
    });
    let timeout = Duration::from_secs_f64(args.timeout.max(0.1));
    let hello = (|| -> Result<Hello, (String, String)> {
        ad.send(&hello_cmd, 1).map_err(|e| ("crash".into(), e))?;
        let deadline = Instant::now() + timeout;
        loop {
            match ad.rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(Line::Text(t)) => {
                    ad.note(format!("< {t}"));
                    let v: Value = serde_json::from_str(&t)
                        .map_err(|e| ("protocol".into(), format!("adapter line is not JSON ({e}): `{t}`")))?;
                    if v.get("ev").is_some() {
                        continue;
                    }
                    return parse_hello(&v, "hello").map_err(|e| ("protocol".into(), e));
                }
                Ok(Line::Eof) => return Err(("crash".into(), format!("the adapter {} before its hello", ad.exit_status()))),
                Err(_) => return Err(("hang".into(), format!("no hello within {:.1} s", args.timeout))),
            }
        }
    })();
    let hello = match hello {
        Ok(h) => h,
        Err((rule, detail)) => {
            let mut r = result(case, Verdict::Fail, &rule, 1, detail);
            r.transcript = ad.transcript.clone();
            r.transcript.extend(ad.stderr_tail().into_iter().map(|l| format!("stderr: {l}")));
            ad.kill();
            return (Some(r), None);
        }
    };
    // Capabilities the case needs.
    let mut needs = case.needs.clone();
    if case.max_regions.is_some() || case.max_pinned_bytes.is_some() {
        needs.push("limits".into());
    }
    if let Some(n) = needs.iter().find(|n| !hello.caps.contains(n)) {
        let _ = ad.send(&json!({"seq": 1, "cmd": "end"}), 0);
        ad.kill();
        return (Some(result(case, Verdict::Unsupported, "-", 1, format!("the adapter lacks the `{n}` capability"))), Some(hello));
    }
    if (case.max_regions.is_some() && hello.limits.max_regions != case.max_regions)
        || (case.max_pinned_bytes.is_some() && hello.limits.max_pinned_bytes != case.max_pinned_bytes)
    {
        ad.kill();
        return (
            Some(result(case, Verdict::Fail, "protocol", 1, format!(
                "the case asks for max_regions {:?} max_pinned_bytes {:?}; the adapter declared {:?} {:?}",
                case.max_regions, case.max_pinned_bytes, hello.limits.max_regions, hello.limits.max_pinned_bytes
            ))),
            Some(hello),
        );
    }
    let policy = args.policy.or(hello.policy);
    let config = Config {
        policy: policy.unwrap_or(OverlapPolicy::Independent),
        page_size: hello.page_size,
        chunk_pages: 1,
        eviction: hello.eviction,
        limits: hello.limits,
    };
    if let Err(e) = config.validate() {
        ad.kill();
        return (Some(result(case, Verdict::Fail, "protocol", 1, format!("hello: {e}"))), Some(hello));
    }
    let mut bufs = HashMap::new();
    bufs.insert("arena".to_string(), (hello.arena.addr, hello.arena.len));
    let mut run = CaseRun {
        case,
        args,
        ad,
        seq: 0,
        pending: BTreeMap::new(),
        page: hello.page_size,
        access_classes: hello.access_classes.clone(),
        bufs,
        models: vec![Model::new(config)],
        log: Vec::new(),
        // C rules bind only a peer that declared a policy itself; `--policy`
        // picks what the model compares an undeclared peer with.
        declared: hello.policy.is_some(),
        next_model_id: 1,
        divergence: None,
        events: Vec::new(),
        event_seq: 0,
        regs: HashMap::new(),
        reg_order: 0,
        leases: HashMap::new(),
        lease_count: HashMap::new(),
        deregs_buffered: Vec::new(),
        snap: None,
        note: None,
        deferred: Vec::new(),
        ops_done: 0,
        l1_since: HashMap::new(),
        l1_worst: None,
        failure: None,
    };
    let outcome = run.run();
    let mut r = match outcome {
        Ok(()) => match (&run.failure, &run.divergence) {
            (Some(f), _) => result(case, Verdict::Fail, &f.rule, f.line, f.detail.clone()),
            (None, Some(d)) => result(case, Verdict::Diverges, &d.rule, d.line, d.detail.clone()),
            (None, None) => result(case, Verdict::Pass, "-", 0, String::new()),
        },
        Err(Stop::Unsupported(line, why)) => result(case, Verdict::Unsupported, "-", line, why),
        Err(Stop::Fail(f)) => result(case, Verdict::Fail, &f.rule, f.line, f.detail),
    };
    if r.verdict == Verdict::Fail || r.verdict == Verdict::Diverges {
        r.transcript = run.ad.transcript.clone();
        r.transcript.extend(run.ad.stderr_tail().into_iter().map(|l| format!("stderr: {l}")));
    }
    if r.verdict == Verdict::Fail {
        if let Some(d) = &run.divergence {
            r.divergence = Some(format!("line {}: {} {}", d.line, d.rule, d.detail));
        }
    }
    r.l1 = run.l1_summary();
    if let Some(n) = &run.note {
        r.divergence = Some(n.clone());
    }
    run.ad.kill();
    (Some(r), Some(hello))
}

enum Stop {
    Fail(Finding),
    Unsupported(usize, String),
}

fn stop(rule: &str, line: usize, detail: String) -> Stop {
    Stop::Fail(Finding { rule: rule.into(), line, detail })
}

impl CaseRun<'_> {
    fn run(&mut self) -> Result<(), Stop> {
        let records = self.case.records.clone();
        for (line, rec) in &records {
            let line = *line;
            match rec {
                Record::Continue { thread } => {
                    if !self.pending.values().any(|p| p.thread == *thread && p.paused) {
                        if self.pending.values().any(|p| p.thread == *thread) {
                            return Err(stop("protocol", line, format!("thread {thread} neither paused nor finished its operation")));
                        }
                        // Its operation completed without reaching the pause
                        // point (a hit registers nothing): nothing to resume.
                        self.ad.note(format!("  (case line {line}: thread {thread} did not pause; its operation completed)"));
                        continue;
                    }
                    let seq = self.next_seq();
                    let cmd = json!({"seq": seq, "cmd": "continue", "thread": thread});
                    self.send_and_track(&cmd, line, *thread, PendingKind::Continue, false)?;
                    self.wait_for(seq, line, false)?;
                    for p in self.pending.values_mut() {
                        if p.thread == *thread {
                            p.paused = false;
                        }
                    }
                    // The continued thread's operation, and whatever it blocked.
                    let targets: Vec<u64> = self
                        .pending
                        .iter()
                        .filter(|(_, p)| p.thread == *thread || (p.blocked && !self.any_paused()))
                        .map(|(s, _)| *s)
                        .collect();
                    for s in targets {
                        if self.pending.contains_key(&s) {
                            self.wait_for(s, line, false)?;
                        }
                    }
                }
                Record::Op { op, buf, thread, pause } => {
                    let (cmd_seq, cmd, kind) = self.op_command(op, buf.as_deref(), *thread, *pause, line)?;
                    self.send_and_track(&cmd, line, *thread, kind, *pause)?;
                    self.wait_for(cmd_seq, line, *pause)?;
                }
                Record::Mem { kind, buf, name, addr, len, new_len, thread, pause } => {
                    let (cmd_seq, cmd, pk) = self.mem_command(*kind, buf.as_deref(), name.clone(), *addr, *len, *new_len, *thread, *pause, line)?;
                    self.send_and_track(&cmd, line, *thread, pk, *pause)?;
                    self.wait_for(cmd_seq, line, *pause)?;
                }
            }
            if self.failure.is_some() {
                return Ok(());
            }
        }
        // Everything outstanding must finish.
        let last = records.last().map(|(l, _)| *l).unwrap_or(1);
        let outstanding: Vec<u64> = self.pending.keys().copied().collect();
        for s in outstanding {
            if self.pending.get(&s).is_some_and(|p| p.paused) {
                return Err(stop("protocol", last, format!("case error: thread {} is still paused at the end", self.pending[&s].thread)));
            }
            self.wait_for(s, last, false)?;
        }
        let seq = self.next_seq();
        self.send_and_track(&json!({"seq": seq, "cmd": "end"}), last, 0, PendingKind::Continue, false)?;
        self.wait_for(seq, last, false)?;
        self.feed_deregs();
        Ok(())
    }

    fn any_paused(&self) -> bool {
        self.pending.values().any(|p| p.paused)
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn resolve(&self, buf: Option<&str>, off: u64, len: u64, line: usize) -> Result<u64, Stop> {
        let name = buf.unwrap_or("arena");
        let (base, size) = *self
            .bufs
            .get(name)
            .ok_or_else(|| stop("protocol", line, format!("case error: unknown buf `{name}`")))?;
        if off.checked_add(len).is_none_or(|e| e > size) {
            return Err(stop("protocol", line, format!("case error: {off:#x}+{len:#x} falls outside `{name}` ({size:#x} bytes)")));
        }
        Ok(base + off)
    }

    fn op_command(&mut self, op: &Op, buf: Option<&str>, thread: u64, pause: bool, line: usize) -> Result<(u64, Value, PendingKind), Stop> {
        let seq = self.next_seq();
        Ok(match *op {
            Op::Acquire { lease, addr, len, access } => {
                let abs = self.resolve(buf, addr, len, line)?;
                let range = Range::new(abs, len).map_err(|e| stop("protocol", line, format!("case error: {e}")))?;
                let model_access = match &self.access_classes {
                    None => access,
                    Some(c) => c.iter().copied().find(|k| k.suffices_for(access)).unwrap_or(ALL_ACCESS),
                };
                let model_op = Op::Acquire { lease, addr: abs, len, access: model_access };
                let cmd = json!({"seq": seq, "cmd": "acquire", "thread": thread, "lease": lease,
                    "addr": format!("{abs:#x}"), "len": len, "access": access.to_string(), "pause": pause});
                (seq, cmd, PendingKind::Acquire { lease, span: range.pages(self.page), access: model_access, model_op })
            }
            Op::Release { lease } => (
                seq,
                json!({"seq": seq, "cmd": "release", "thread": thread, "lease": lease}),
                PendingKind::Release { lease, model_op: *op },
            ),
            Op::Flush | Op::Trim | Op::Fork => (
                seq,
                json!({"seq": seq, "cmd": op.name(), "thread": thread}),
                PendingKind::Model { model_op: *op },
            ),
            _ => return Err(stop("protocol", line, format!("case error: `{}` cannot be sent", op.name()))),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn mem_command(
        &mut self,
        kind: MemKind,
        buf: Option<&str>,
        name: Option<String>,
        addr: u64,
        len: u64,
        new_len: u64,
        thread: u64,
        pause: bool,
        line: usize,
    ) -> Result<(u64, Value, PendingKind), Stop> {
        let seq = self.next_seq();
        let mut cmd = json!({"seq": seq, "cmd": kind.name(), "thread": thread, "pause": pause});
        let mut model_ops = Vec::new();
        let ev = |k: ReleaseKind, a: u64, l: u64| Op::ReleaseEvent { kind: k, addr: a, len: l };
        match kind {
            MemKind::Malloc | MemKind::BrkGrow => {
                cmd["len"] = json!(len);
            }
            MemKind::Free => {
                let b = buf.unwrap_or_default();
                let (base, size) = *self.bufs.get(b).ok_or_else(|| stop("protocol", line, format!("case error: unknown buf `{b}`")))?;
                cmd["addr"] = json!(format!("{base:#x}"));
                // glibc's mmap-served chunk: a 16-byte header before the block.
                model_ops.push(Op::Free { addr: base, len: size });
                model_ops.push(ev(ReleaseKind::Munmap, base.saturating_sub(16), size + 16));
            }
            MemKind::BrkShrink => {
                let b = buf.unwrap_or_default();
                let (base, size) = *self.bufs.get(b).ok_or_else(|| stop("protocol", line, format!("case error: unknown buf `{b}`")))?;
                if len > size {
                    return Err(stop("protocol", line, format!("case error: brk_shrink by {len} bytes of a {size}-byte area")));
                }
                cmd["len"] = json!(len);
                model_ops.push(ev(ReleaseKind::BrkShrink, base + size - len, len));
                self.bufs.insert(b.to_string(), (base, size - len));
            }
            _ => {
                let abs = self.resolve(buf, addr, len, line)?;
                cmd["addr"] = json!(format!("{abs:#x}"));
                cmd["len"] = json!(len);
                match kind {
                    MemKind::Munmap => model_ops.push(ev(ReleaseKind::Munmap, abs, len)),
                    MemKind::Mmap => {}
                    MemKind::MmapFixed => model_ops.push(ev(ReleaseKind::MapFixedOver, abs, len)),
                    MemKind::MadviseDontneed => model_ops.push(ev(ReleaseKind::MadviseDontneed, abs, len)),
                    MemKind::MadviseFree => model_ops.push(ev(ReleaseKind::MadviseFree, abs, len)),
                    MemKind::MremapMove => model_ops.push(ev(ReleaseKind::MremapSource, abs, len)),
                    MemKind::MremapShrink => {
                        cmd["new_len"] = json!(new_len);
                        model_ops.push(ev(ReleaseKind::MremapSource, abs + new_len, len - new_len));
                    }
                    _ => unreachable!("handled above"),
                }
            }
        }
        let spans = model_ops
            .iter()
            .filter_map(|o| match *o {
                Op::ReleaseEvent { addr, len, .. } => Range::new(addr, len).ok().map(|r| r.pages(self.page)),
                _ => None,
            })
            .collect();
        Ok((seq, cmd, PendingKind::Mem { kind, name, len, model_ops, spans }))
    }

    fn send_and_track(&mut self, cmd: &Value, line: usize, thread: u64, kind: PendingKind, pause: bool) -> Result<(), Stop> {
        let seq = cmd["seq"].as_u64().unwrap_or(0);
        if let Some(p) = self.pending.values().find(|p| p.thread == thread && !matches!(p.kind, PendingKind::Continue)) {
            if !matches!(kind, PendingKind::Continue) {
                return Err(stop("protocol", line, format!("case error: thread {thread} is still busy with case line {}", p.line)));
            }
        }
        self.pending.insert(
            seq,
            Pending {
                line,
                thread,
                kind,
                events_at: self.event_seq,
                regs_at: self.reg_order,
                paused: false,
                blocked: false,
                snap: (self.models.clone(), self.log.len()),
            },
        );
        let _ = pause;
        self.ad.send(cmd, line).map_err(|e| stop("crash", line, e))
    }

    /// Reads adapter lines until `seq` is answered (or, with `pause`, paused),
    /// or, while another thread is paused, until `block_ms` (then `blocked`).
    fn wait_for(&mut self, seq: u64, line: usize, pause: bool) -> Result<(), Stop> {
        let full = Duration::from_secs_f64(self.args.timeout.max(0.1));
        let start = Instant::now();
        loop {
            let Some(p) = self.pending.get(&seq) else { return Ok(()) };
            if pause && p.paused {
                return Ok(());
            }
            let blockable = self.pending.iter().any(|(s, q)| *s != seq && q.paused);
            let limit = if blockable { Duration::from_millis(self.args.block_ms) } else { full };
            let left = limit.saturating_sub(start.elapsed());
            match self.ad.rx.recv_timeout(left) {
                Ok(Line::Text(t)) => {
                    self.ad.note(format!("< {t}"));
                    self.handle_line(&t, line)?;
                    if self.failure.is_some() {
                        return Ok(());
                    }
                }
                Ok(Line::Eof) => {
                    let how = self.ad.exit_status();
                    let (rule, what) = match &self.pending.get(&seq).map(|p| p.kind.clone()) {
                        Some(PendingKind::Mem { kind, .. }) => ("abort", format!("during {}", kind.name())),
                        Some(PendingKind::Acquire { .. }) => ("crash", "during acquire".into()),
                        Some(PendingKind::Release { .. }) => ("crash", "during release".into()),
                        _ => ("crash", "".into()),
                    };
                    let tail = self.ad.stderr_tail();
                    return Err(stop(
                        rule,
                        line,
                        format!("the adapter {how} {what}{}", tail.last().map(|l| format!(": {l}")).unwrap_or_default()),
                    ));
                }
                Err(RecvTimeoutError::Timeout) => {
                    if blockable {
                        if let Some(p) = self.pending.get_mut(&seq) {
                            p.blocked = true;
                            self.ad.note(format!("  (case line {line}: blocked after {} ms)", self.args.block_ms));
                        }
                        return Ok(());
                    }
                    return Err(stop("hang", line, format!("no answer within {:.1} s", self.args.timeout)));
                }
                Err(RecvTimeoutError::Disconnected) => return Err(stop("crash", line, "the adapter's stdout closed".into())),
            }
        }
    }

    fn handle_line(&mut self, t: &str, line: usize) -> Result<(), Stop> {
        let v: Value = serde_json::from_str(t).map_err(|e| stop("protocol", line, format!("adapter line is not JSON ({e}): `{t}`")))?;
        let o = v.as_object().ok_or_else(|| stop("protocol", line, format!("adapter line is not a JSON object: `{t}`")))?;
        let at = format!("adapter line `{t}`");
        let bad = |e: anyhow::Error| stop("protocol", line, e.to_string());
        if let Some(ev) = o.get("ev") {
            match ev.as_str() {
                Some("reg") => {
                    let id = field_u64(o, "id", &at).map_err(bad)?.ok_or_else(|| stop("protocol", line, format!("{at}: reg needs `id`")))?;
                    let addr = field_u64(o, "addr", &at).map_err(bad)?.ok_or_else(|| stop("protocol", line, format!("{at}: reg needs `addr`")))?;
                    let len = field_u64(o, "len", &at).map_err(bad)?.ok_or_else(|| stop("protocol", line, format!("{at}: reg needs `len`")))?;
                    let access = match o.get("access") {
                        Some(Value::String(s)) => s.parse::<Access>().map_err(|e| stop("protocol", line, format!("{at}: field `access`: {e}")))?,
                        None if self.access_classes.as_ref().is_some_and(|c| c.len() == 1) => ALL_ACCESS,
                        _ => return Err(stop("protocol", line, format!("{at}: reg needs `access`"))),
                    };
                    let range = Range::new(addr, len).map_err(|e| stop("protocol", line, format!("{at}: {e}")))?;
                    if self.regs.contains_key(&id) {
                        return Err(stop("protocol", line, format!("{at}: registration id {id} reported twice (ids must be unique)")));
                    }
                    self.reg_order += 1;
                    self.regs.insert(
                        id,
                        PhysReg { span: range.pages(self.page), range, access, at: self.event_seq, order: self.reg_order, deregistered: false, model_id: None },
                    );
                }
                Some("dereg") => {
                    let id = field_u64(o, "id", &at).map_err(bad)?.ok_or_else(|| stop("protocol", line, format!("{at}: dereg needs `id`")))?;
                    self.dereg(id, line)?;
                }
                Some("paused") => {
                    let th = field_u64(o, "thread", &at).map_err(bad)?.unwrap_or(0);
                    match self.pending.values_mut().find(|p| p.thread == th && !matches!(p.kind, PendingKind::Continue)) {
                        Some(p) => p.paused = true,
                        None => return Err(stop("protocol", line, format!("{at}: thread {th} paused with nothing in flight"))),
                    }
                }
                Some("log") => {}
                _ => return Err(stop("protocol", line, format!("{at}: unknown event (expected reg, dereg, paused or log)"))),
            }
            return Ok(());
        }
        let seq = field_u64(o, "seq", &at)
            .map_err(bad)?
            .ok_or_else(|| stop("protocol", line, format!("{at}: a reply needs `seq` (or an event `ev`)")))?;
        let Some(p) = self.pending.remove(&seq) else {
            return Err(stop("protocol", line, format!("{at}: no command with seq {seq} is outstanding")));
        };
        // A hit on a registration another acquire, still in flight, made:
        // that acquire takes effect first; judge this one after it.
        if let (PendingKind::Acquire { .. }, Some(Value::Bool(true))) = (&p.kind, o.get("ok")) {
            if let Ok(Some(id)) = field_u64(o, "reg", &at) {
                let maker_in_flight = self.regs.get(&id).is_some_and(|r| {
                    r.model_id.is_none()
                        && r.order <= p.regs_at
                        && self.pending.values().any(|q| matches!(q.kind, PendingKind::Acquire { .. }) && q.regs_at < r.order)
                });
                if maker_in_flight {
                    self.pending.insert(seq, p);
                    self.deferred.push((seq, t.to_string()));
                    return Ok(());
                }
            }
        }
        let ok = match o.get("ok") {
            Some(Value::Bool(b)) => *b,
            _ => return Err(stop("protocol", line, format!("{at}: a reply needs `ok`: true or false"))),
        };
        let pl = p.line;
        // Others completed while it was in flight: it may take effect anywhere since.
        self.snap = (p.snap.1 < self.log.len()).then(|| p.snap.clone());
        if !ok && o.get("unsupported").and_then(Value::as_bool) == Some(true) {
            return Err(Stop::Unsupported(pl, format!("the adapter does not support case line {pl}: {}", o.get("error").and_then(Value::as_str).unwrap_or(""))));
        }
        let err_text = o.get("error").and_then(Value::as_str).unwrap_or("(no error text)").to_string();
        match p.kind.clone() {
            PendingKind::Continue => {
                if !ok {
                    return Err(stop("protocol", pl, format!("continue/end failed: {err_text}")));
                }
            }
            PendingKind::Acquire { lease, span, access, model_op } => {
                if !ok {
                    let errno = o.get("errno").and_then(Value::as_i64).unwrap_or(0);
                    let failure = match errno as i32 {
                        libc::ENOMEM => RegistrarFailure::NoMemory,
                        libc::EAGAIN => RegistrarFailure::Again,
                        libc::EFAULT => RegistrarFailure::Fault,
                        _ => RegistrarFailure::Other,
                    };
                    self.judge_model(&model_op, &Ret::Failed { error: OpError::Registrar { failure, pressure: false } }, pl);
                    self.note_divergence_or_fail(pl, format!("acquire failed: {err_text}"))?;
                } else {
                    let id = field_u64(o, "reg", &at).map_err(bad)?.ok_or_else(|| stop("protocol", pl, format!("{at}: an acquire reply needs `reg`")))?;
                    self.acquired(id, lease, span, access, &model_op, &p, pl)?;
                }
            }
            PendingKind::Release { lease, model_op } => {
                if !ok {
                    return Err(stop("protocol", pl, format!("release failed: {err_text}")));
                }
                if let Some(id) = self.leases.remove(&lease) {
                    if let Some(c) = self.lease_count.get_mut(&id) {
                        *c = c.saturating_sub(1);
                    }
                }
                self.judge_model(&model_op, &Ret::Done, pl);
            }
            PendingKind::Mem { kind, name, len, model_ops, spans } => {
                if !ok {
                    return Err(stop("mem-op", pl, format!("{} failed under this cache: {err_text}", kind.name())));
                }
                if let Some(n) = name {
                    let addr = field_u64(o, "addr", &at).map_err(bad)?.ok_or_else(|| stop("protocol", pl, format!("{at}: {} needs `addr` in its reply", kind.name())))?;
                    self.bufs.insert(n, (addr, len));
                    if kind == MemKind::Malloc {
                        self.judge_model(&Op::Alloc { addr, len }, &Ret::Done, pl);
                    }
                }
                for s in spans {
                    self.event_seq += 1;
                    self.events.push((s, self.event_seq));
                }
                for op in &model_ops {
                    self.judge_model(op, &Ret::Done, pl);
                }
            }
            PendingKind::Model { model_op } => {
                if !ok {
                    return Err(stop("protocol", pl, format!("{} failed: {err_text}", model_op.name())));
                }
                if model_op == Op::Fork {
                    // Deregistrations reported before the fork's reply came
                    // before the fork (a peer may purge its cache then).
                    self.feed_deregs();
                    // A fork child maps copies: every earlier registration
                    // pinned the parent's frames.
                    self.event_seq += 1;
                    self.events.push((PageSpan { first: 0, end: u64::MAX }, self.event_seq));
                }
                self.judge_model(&model_op, &Ret::Done, pl);
            }
        }
        self.snap = None;
        self.ops_done += 1;
        self.resume_deferred(line)?;
        // A continue's reply can overtake the deregistrations of the
        // operation it resumed: those are confirmed after that operation.
        if !matches!(p.kind, PendingKind::Continue) {
            self.feed_deregs();
        }
        self.track_l1(pl);
        if let Some(f) = &self.failure {
            return Err(Stop::Fail(f.clone()));
        }
        Ok(())
    }

    /// Judges the held-back replies whose registration's maker is judged now.
    fn resume_deferred(&mut self, line: usize) -> Result<(), Stop> {
        let ready: Vec<(u64, String)> = {
            let pending = &self.pending;
            let regs = &self.regs;
            let (ready, wait): (Vec<_>, Vec<_>) = std::mem::take(&mut self.deferred).into_iter().partition(|(seq, text)| {
                let id = serde_json::from_str::<Value>(text).ok().and_then(|v| v.get("reg").and_then(Value::as_u64));
                let made = id.and_then(|id| regs.get(&id)).is_none_or(|r| r.model_id.is_some());
                let others = pending.iter().any(|(s, q)| s != seq && matches!(q.kind, PendingKind::Acquire { .. }));
                made || !others
            });
            self.deferred = wait;
            ready
        };
        for (_, text) in ready {
            // It is still pending: handled now as if it arrived now.
            self.handle_line(&text, line)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn acquired(&mut self, id: u64, lease: LeaseId, span: PageSpan, access: Access, model_op: &Op, p: &Pending, pl: usize) -> Result<(), Stop> {
        let Some(reg) = self.regs.get(&id).cloned() else {
            return Err(stop("protocol", pl, format!("the acquire reply names registration {id}, which no reg event reported")));
        };
        if reg.deregistered {
            return Err(stop("P3", pl, format!("acquire served by registration {id} {}, already deregistered", reg.range)));
        }
        // P1
        if !reg.span.contains(&span) || !reg.access.suffices_for(access) {
            return Err(stop(
                "P1",
                pl,
                format!("registration {id} {} {} does not cover the request {} with {access}", reg.range, reg.access, span.bytes(self.page)),
            ));
        }
        // P2
        if let Some((ev, _)) = self.events.iter().find(|(s, q)| *q > reg.at && *q <= p.events_at && s.overlaps(&span)) {
            let what = if ev.end == u64::MAX { "a fork (the child maps copies)".to_string() } else { format!("a release of {}", ev.bytes(self.page)) };
            return Err(stop("P2", pl, format!("acquire served by registration {id} {}, registered before {what} that returned before the acquire began: stale frames", reg.range)));
        }
        // A miss is served by a registration reported while the acquire was
        // in flight that no other acquire took first (one that another
        // thread's miss inserted meanwhile serves it as a hit: A8).
        let hit = reg.order <= p.regs_at || reg.model_id.is_some();
        self.leases.insert(lease, id);
        *self.lease_count.entry(id).or_default() += 1;
        let model_id = match (hit, reg.model_id) {
            (_, Some(m)) => m,
            (true, None) => u64::MAX,
            (false, None) => self.next_model_id,
        };
        let view = RegView { id: model_id, addr: reg.range.addr, len: reg.range.len, access: reg.access };
        let accepted = self.judge_model(model_op, &Ret::Granted { reg: view, hit, pressure: false }, pl);
        if accepted && !hit && reg.model_id.is_none() {
            self.next_model_id += 1;
            if let Some(r) = self.regs.get_mut(&id) {
                r.model_id = Some(model_id);
            }
        }
        self.note_divergence_or_fail(pl, String::new())
    }

    fn dereg(&mut self, id: u64, line: usize) -> Result<(), Stop> {
        let Some(reg) = self.regs.get(&id).cloned() else {
            return Err(stop("P4", line, format!("deregistration of registration {id}, which was never registered")));
        };
        if reg.deregistered {
            return Err(stop("P4", line, format!("registration {id} {} deregistered a second time", reg.range)));
        }
        // Leases on it, minus those whose release is in flight (a peer may
        // deregister inside the release of its last lease).
        let held = self.lease_count.get(&id).copied().unwrap_or(0);
        let releasing = self
            .pending
            .values()
            .filter(|q| matches!(q.kind, PendingKind::Release { lease, .. } if self.leases.get(&lease) == Some(&id)))
            .count() as u32;
        if held > releasing {
            return Err(stop("P3", line, format!("registration {id} {} deregistered while {} lease(s) on it are held", reg.range, held - releasing)));
        }
        if let Some(r) = self.regs.get_mut(&id) {
            r.deregistered = true;
        }
        if let Some(m) = reg.model_id {
            self.deregs_buffered.push((m, line));
        }
        Ok(())
    }

    /// Judges with the models while they still follow the peer. Returns
    /// whether one accepted. The operation takes effect at the end of the
    /// history, or, if others completed while it was in flight (`snap`), at
    /// any point since it was sent: every such placement the model accepts
    /// is kept.
    fn judge_model(&mut self, op: &Op, ret: &Ret, line: usize) -> bool {
        if self.models.is_empty() {
            return false;
        }
        let mut first_err = None;
        let mut next: Vec<Model> = Vec::new();
        for m in &self.models {
            let mut m = m.clone();
            match m.judge(op, ret) {
                Ok(()) => next.push(m),
                Err(v) => {
                    first_err.get_or_insert(v);
                }
            }
        }
        if let Some((snap, at)) = self.snap.clone() {
            for k in at..self.log.len() {
                'model: for m in &snap {
                    let mut m = m.clone();
                    for e in &self.log[at..k] {
                        if !replay_entry(&mut m, e) {
                            continue 'model;
                        }
                    }
                    if m.judge(op, ret).is_err() {
                        continue;
                    }
                    for e in &self.log[k..] {
                        if !replay_entry(&mut m, e) {
                            continue 'model;
                        }
                    }
                    if !next.contains(&m) {
                        next.push(m);
                    }
                }
            }
        }
        if next.is_empty() {
            let v = first_err.expect("a model rejected");
            self.model_objects(v.property, format!("{op} -> {ret}: {}", v.detail), line);
            return false;
        }
        next.truncate(64);
        self.models = next;
        self.log.push(Entry::Judge(*op, *ret));
        true
    }

    fn model_objects(&mut self, prop: Property, detail: String, line: usize) {
        self.models.clear();
        let f = Finding { rule: format!("{prop:?}"), line, detail };
        // A release still in flight (paused after the peer's hook) may already
        // have taken effect for the peer: the sequential model cannot place
        // it, so it stops without a verdict; the physical judge goes on.
        if let Some(p) = self.pending.values().find(|p| matches!(p.kind, PendingKind::Mem { .. }) && (p.paused || p.blocked)) {
            self.note = Some(format!(
                "the model stopped at case line {line} ({} {}), with the release of case line {} in flight",
                f.rule, f.detail, p.line
            ));
            return;
        }
        let c_rule = matches!(prop, Property::C1 | Property::C2 | Property::C3 | Property::C4);
        if c_rule && !self.declared {
            self.divergence = Some(f);
        } else if self.failure.is_none() {
            self.failure = Some(f);
        }
    }

    fn note_divergence_or_fail(&mut self, _line: usize, _extra: String) -> Result<(), Stop> {
        match &self.failure {
            Some(f) => Err(Stop::Fail(f.clone())),
            None => Ok(()),
        }
    }

    /// Confirms buffered deregistrations with the model (P3, P4, C3) and times them (L1).
    fn feed_deregs(&mut self) {
        for (m, line) in std::mem::take(&mut self.deregs_buffered) {
            if let Some((since_op, since_line)) = self.l1_since.remove(&m) {
                let lag = self.ops_done.saturating_sub(since_op);
                if lag > 0 && self.l1_worst.as_ref().is_none_or(|(w, _)| lag > *w) {
                    self.l1_worst = Some((
                        lag,
                        format!("R{m}: due at case line {since_line}, deregistered {lag} op(s) later (case line {line})"),
                    ));
                }
            }
            if !self.models.is_empty() {
                let mut err = None;
                self.models.retain_mut(|model| match model.observe_deregister(m) {
                    Ok(()) => true,
                    Err(v) => {
                        err.get_or_insert(v);
                        false
                    }
                });
                match err {
                    Some(v) if self.models.is_empty() => self.model_objects(v.property, v.detail, line),
                    _ => self.log.push(Entry::Dereg(m)),
                }
            }
        }
    }

    fn track_l1(&mut self, line: usize) {
        let Some(model) = self.models.first() else { return };
        for v in model.pending_deregistrations() {
            self.l1_since.entry(v.id).or_insert((self.ops_done, line));
        }
    }

    fn l1_summary(&self) -> String {
        let late_end: Vec<String> = {
            let mut v: Vec<(u64, usize)> = self.l1_since.iter().map(|(m, (_, l))| (*m, *l)).collect();
            v.sort();
            v.iter().map(|(m, l)| format!("R{m} (due at line {l})")).collect()
        };
        let mut parts = Vec::new();
        if let Some((_, w)) = &self.l1_worst {
            parts.push(w.clone());
        }
        if !late_end.is_empty() && !self.models.is_empty() {
            parts.push(format!("never deregistered before the end: {}", late_end.join(", ")));
        }
        if parts.is_empty() {
            "on time".into()
        } else {
            parts.join("; ")
        }
    }
}

// ---------------------------------------------------------------------------
// Output

pub fn table(r: &RunReport) -> String {
    let mut s = format!(
        "adapter: {} {} ({}); declared policy: {}; judged under: {}\n",
        r.name,
        r.version,
        r.adapter,
        r.declared_policy.as_deref().unwrap_or("none"),
        r.judged_under
    );
    let w = r.results.iter().map(|x| x.case.len()).max().unwrap_or(4).max(4);
    s += &format!("{:<w$}  {:<11}  {:<8}  {:>4}  detail\n", "case", "verdict", "rule", "line");
    for x in &r.results {
        let mut d = x.detail.clone();
        if d.len() > 160 {
            d.truncate(160);
            d += "...";
        }
        s += &format!("{:<w$}  {:<11}  {:<8}  {:>4}  {}\n", x.case, x.verdict.to_string(), x.rule, x.line, d);
    }
    let count = |v: Verdict| r.results.iter().filter(|x| x.verdict == v).count();
    s += &format!(
        "{} cases: {} pass, {} fail, {} diverge, {} unsupported\n",
        r.results.len(),
        count(Verdict::Pass),
        count(Verdict::Fail),
        count(Verdict::Diverges),
        count(Verdict::Unsupported)
    );
    let late: Vec<&CaseResult> = r.results.iter().filter(|x| x.l1 != "on time" && !x.l1.is_empty()).collect();
    if !late.is_empty() {
        s += "\nderegistration timing (L1, reported, not failed):\n";
        for x in late {
            s += &format!("  {}: {}\n", x.case, x.l1);
        }
    }
    for x in r.results.iter().filter(|x| matches!(x.verdict, Verdict::Fail | Verdict::Diverges)) {
        s += &format!("\n--- {} ({} {} at case line {}): {}\n", x.case, x.verdict, x.rule, x.line, x.detail);
        if let Some(d) = &x.divergence {
            s += &format!("    (the model had diverged first: {d})\n");
        }
        for t in &x.transcript {
            s += &format!("    {t}\n");
        }
    }
    s
}
