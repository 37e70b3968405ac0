//! The case files (conformance/README.md): a header, then JSON-line records
//! that wrap the one [`Op`] enum (`{"op":...}` plus `buf`, `thread`,
//! `pause`), memory operations (`{"mem":...}`) and `{"ctl":"continue"}`.
//!
//! Parsing is strict: an unknown header field, memory operation or control,
//! a record the runner could not send (a release event, `alloc` or `free` as
//! an op; a pause on anything but an acquire or a memory operation) or a
//! missing length, name or `buf` is an error naming the file and line, never
//! skipped. Case names are unique within a directory.

use anyhow::{anyhow, bail, Context, Result};
use mrcache_types::Op;
use serde::Serialize;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

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
    /// `count` blocks of `len` bytes allocated, touched and freed again: the
    /// allocator's own traffic (its frees may unmap or madvise), on memory
    /// the case never registers.
    Scratch,
    /// `count` cycles of `munmap` then `mmap` (fresh, touched) of
    /// `[addr, addr+len)`, with no cache call between: one release event.
    UnmapMapCycles,
}

impl MemKind {
    const ALL: [(&'static str, MemKind); 13] = [
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
        ("scratch", MemKind::Scratch),
        ("unmap_map_cycles", MemKind::UnmapMapCycles),
    ];

    /// What a `during_register` list may hold: memory operations on the
    /// arena that take no block name, and `scratch`.
    pub const DURING_REGISTER: [MemKind; 5] =
        [MemKind::Munmap, MemKind::Mmap, MemKind::MmapFixed, MemKind::MadviseDontneed, MemKind::Scratch];
    pub fn name(self) -> &'static str {
        MemKind::ALL.iter().find(|(_, k)| *k == self).map(|(n, _)| *n).unwrap_or("?")
    }
}

/// A memory operation the registrar performs inside its own call, on the
/// acquiring thread, once the registration is pinned (an acquire's
/// `during_register`): addresses relative to the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DuringOp {
    pub kind: MemKind,
    pub addr: u64,
    pub len: u64,
    /// `scratch`: how many blocks.
    pub count: u64,
}

/// An allocator a case may run its adapter under (header `preload`).
pub struct Preload {
    pub name: &'static str,
    /// The shared object `LD_PRELOAD` names.
    pub lib: &'static str,
    /// The settings that make it give memory back at once, so that its
    /// frees reach the monitor while the case runs.
    pub env: &'static [(&'static str, &'static str)],
}

/// The allocators of header `preload`.
pub const PRELOADS: [Preload; 2] = [
    Preload { name: "jemalloc", lib: "libjemalloc.so.2", env: &[("MALLOC_CONF", "dirty_decay_ms:0,muzzy_decay_ms:0")] },
    Preload {
        name: "mimalloc",
        lib: "libmimalloc.so.2",
        env: &[("MIMALLOC_PAGE_RESET", "1"), ("MIMALLOC_RESET_DELAY", "0"), ("MIMALLOC_DECOMMIT_DELAY", "0")],
    },
];

/// One record of a case.
#[derive(Clone, Debug)]
pub enum Record {
    /// An [`Op`] (acquire, release, flush, trim, fork), addresses relative to
    /// `buf`; an acquire may carry memory operations its registrar performs
    /// (`during`).
    Op { op: Op, buf: Option<String>, thread: u64, pause: bool, during: Vec<DuringOp> },
    /// A memory operation, addresses relative to `buf` (default: the arena).
    Mem {
        kind: MemKind,
        buf: Option<String>,
        name: Option<String>,
        addr: u64,
        len: u64,
        new_len: u64,
        count: u64,
        rounds: u64,
        thread: u64,
        pause: bool,
        background: bool,
    },
    /// `{"ctl": "rss_mark"}` (`max_growth` None): note the adapter's resident
    /// set; `{"ctl": "rss_check", "max_growth": B}`: it grew by at most `B`
    /// bytes since the last mark (L2).
    Rss { max_growth: Option<u64> },
    /// `{"ctl": "destroy"}` (`create` false) or `{"ctl": "create"}` on
    /// `thread`: the adapter destroys its cache, or creates it anew
    /// (capability `destroy`).
    Lifecycle { create: bool, thread: u64 },
    /// `{"ctl": "join", "thread": 1}`: wait for the thread's background
    /// memory command.
    Join { thread: u64 },
    /// Let the paused `thread` go on.
    Continue { thread: u64 },
    /// A data command: the device or the application moves bytes.
    Data(super::DataRecord),
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
    /// The arena the case needs (header `arena`, bytes; default
    /// [`MIN_ARENA`](super::MIN_ARENA)): sent in the hello, where an adapter
    /// maps at least that much or answers `unsupported`.
    pub arena: u64,
    /// The allocator the adapter runs under (header `preload`: a name of
    /// [`PRELOADS`]); `None`: its own.
    pub preload: Option<String>,
    pub path: PathBuf,
    /// (line number, record)
    pub records: Vec<(usize, Record)>,
}

pub(super) fn field_u64(obj: &Map<String, Value>, key: &str, at: &str) -> Result<Option<u64>> {
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

/// The ops a case may use: every [`Op`] but the three the adapter performs
/// as real memory operations instead (`{"mem": ...}` records).
const CASE_OPS: [&str; 7] = ["acquire", "release", "release_begin", "release_end", "flush", "trim", "fork"];

/// The [`Op`]s a case may not use: the adapter performs them as real memory
/// operations.
const MEMORY_OPS: [&str; 3] = ["release_event", "alloc", "free"];

/// An op that does not parse: an unknown name lists the ops a case may use
/// (serde's own list would offer `release_event`, `alloc` and `free`, which
/// cases reject); any other error is serde's, at the line.
fn unknown_op(e: serde_json::Error, at: &str) -> anyhow::Error {
    let msg = e.to_string();
    match msg.strip_prefix("unknown variant `").and_then(|r| r.split_once('`')) {
        Some((name, _)) => {
            anyhow!("{at}: unknown op `{name}` (expected one of {}; a memory operation is a {{\"mem\": ...}} record)", CASE_OPS.join(", "))
        }
        None => anyhow!("{at}: not an op: {msg}"),
    }
}

/// Mistakes in a case that would otherwise reach the adapter and be blamed
/// on it: a release of a lease no earlier acquire took, or taken
/// and released already; a `buf` no earlier record named; an address
/// outside the first `arena` bytes of the arena (what the case's header asks
/// for, [`MIN_ARENA`](super::MIN_ARENA) by default: all an adapter must
/// offer); a `continue` of a thread with nothing paused, or a pause on a
/// thread already paused.
fn check_records(records: &[(usize, Record)], path: &Path, arena: u64, needs: &[String]) -> Result<()> {
    use std::collections::{HashMap, HashSet};
    let mut held: HashSet<u64> = HashSet::new();
    let mut released: HashSet<u64> = HashSet::new();
    let mut bufs: HashSet<&str> = HashSet::new();
    let mut paused: HashMap<u64, usize> = HashMap::new();
    let in_arena = |addr: u64, len: u64| addr.checked_add(len).is_some_and(|end| end <= arena);
    let mut marked = false;
    let mut background: HashMap<u64, usize> = HashMap::new();
    for (n, r) in records {
        let at = format!("{}:{n}", path.display());
        let (buf, thread, pause) = match r {
            Record::Op { buf, thread, pause, .. } | Record::Mem { buf, thread, pause, .. } => (buf, *thread, *pause),
            Record::Lifecycle { .. } => {
                if !needs.iter().any(|n| n == "destroy") {
                    bail!("{at}: `destroy`/`create` need the capability: list \"destroy\" in the header's `needs`");
                }
                continue;
            }
            Record::Join { thread } => {
                if background.remove(thread).is_none() {
                    bail!("{at}: `join` of thread {thread}, which runs no background command");
                }
                continue;
            }
            Record::Rss { max_growth } => {
                if max_growth.is_some() && !marked {
                    bail!("{at}: `rss_check` without an earlier `rss_mark`");
                }
                marked |= max_growth.is_none();
                continue;
            }
            Record::Continue { thread } => {
                if paused.remove(thread).is_none() {
                    bail!("{at}: `continue` of thread {thread}, which nothing paused");
                }
                continue;
            }
            Record::Data(d) => {
                check_data_record(d, &held, &bufs, &at, arena)?;
                continue;
            }
        };
        if let Some(b) = buf {
            if !bufs.contains(b.as_str()) {
                let mut known: Vec<&str> = bufs.iter().copied().collect();
                known.sort_unstable();
                bail!(
                    "{at}: field `buf`: unknown buf `{b}` (no earlier record names it{})",
                    if known.is_empty() { String::new() } else { format!("; named so far: {}", known.join(", ")) }
                );
            }
        }
        if let Some(b) = background.get(&thread) {
            bail!("{at}: thread {thread} still runs the background command of line {b} (a `join` first)");
        }
        if let Record::Mem { background: true, .. } = r {
            background.insert(thread, *n);
        }
        if pause {
            if let Some(p) = paused.insert(thread, *n) {
                bail!("{at}: thread {thread} pauses again while paused at line {p} (a `continue` first)");
            }
        }
        match r {
            Record::Op { op, during, .. } => {
                if !during.is_empty() {
                    if pause {
                        bail!("{at}: an acquire with `during_register` cannot pause (its registrar runs the memory operations there)");
                    }
                    if let Some((t, l)) = paused.iter().find(|(t, _)| **t != thread) {
                        bail!("{at}: `during_register` while thread {t} is paused at line {l} (the runner places the operations at this acquire's first registration)");
                    }
                    for d in during {
                        if d.kind != MemKind::Scratch && !in_arena(d.addr, d.len) {
                            bail!(
                                "{at}: during_register: [{:#x}, {:#x}) lies outside the arena's first {arena:#x} bytes",
                                d.addr,
                                d.addr.saturating_add(d.len)
                            );
                        }
                    }
                }
                if *op == Op::Fork {
                    if !paused.is_empty() && !needs.iter().any(|n| n == "fork_paused") {
                        bail!("{at}: a fork while a thread is paused needs the capability: list \"fork_paused\" in the header's `needs`");
                    }
                    // The paused threads do not exist in the fork child.
                    paused.clear();
                }
                match *op {
                    Op::Acquire { lease, .. } => {
                        let fresh = !released.contains(&lease) && held.insert(lease);
                        if !fresh {
                            bail!("{at}: lease {lease} is taken twice (lease ids are unique within a case)");
                        }
                    }
                    Op::Release { lease } => {
                        if !held.remove(&lease) {
                            let why = if released.contains(&lease) { "released already" } else { "taken by no earlier acquire" };
                            bail!("{at}: release of lease {}, {why}", lease);
                        }
                        released.insert(lease);
                    }
                    _ => {}
                }
                if let (None, Some(Ok(range))) = (buf, op.range()) {
                    if !in_arena(range.addr, range.len) {
                        bail!(
                            "{at}: [{:#x}, {:#x}) lies outside the arena's first {arena:#x} bytes, all an adapter must offer{}",
                            range.addr,
                            range.addr.saturating_add(range.len),
                            arena_hint(arena)
                        );
                    }
                }
            }
            Record::Mem { kind, buf, name, addr, len, .. } => {
                if buf.is_none() && *kind != MemKind::Scratch && !in_arena(*addr, *len) {
                    bail!(
                        "{at}: [{addr:#x}, {:#x}) lies outside the arena's first {arena:#x} bytes, all an adapter must offer{}",
                        addr.saturating_add(*len),
                        arena_hint(arena)
                    );
                }
                if let Some(nm) = name {
                    bufs.insert(nm.as_str());
                }
            }
            Record::Continue { .. } | Record::Data(_) | Record::Rss { .. } | Record::Lifecycle { .. } | Record::Join { .. } => {}
        }
    }
    Ok(())
}

/// An acquire's `during_register`: a list of `{"mem": ..., "addr": ...,
/// "len": ..., "count": ...}` objects, each of [`MemKind::DURING_REGISTER`].
fn parse_during(v: &Value, at: &str) -> Result<Vec<DuringOp>> {
    let Value::Array(items) = v else { bail!("{at}: field `during_register`: expected a list of memory operations") };
    if items.is_empty() {
        bail!("{at}: field `during_register`: an empty list (leave the field out)");
    }
    let mut out = Vec::new();
    for item in items {
        let Value::Object(o) = item else { bail!("{at}: during_register: {item} is not a JSON object") };
        for k in o.keys() {
            if !["mem", "addr", "len", "count"].contains(&k.as_str()) {
                bail!("{at}: during_register: unknown field `{k}` (expected mem, addr, len, count)");
            }
        }
        let mem = field_str(o, "mem", at)?.ok_or_else(|| anyhow!("{at}: during_register: each operation needs `mem`"))?;
        let kind = MemKind::DURING_REGISTER.iter().copied().find(|k| k.name() == mem).ok_or_else(|| {
            anyhow!(
                "{at}: during_register: `{mem}` cannot run in a registrar (expected {})",
                MemKind::DURING_REGISTER.iter().map(|k| k.name()).collect::<Vec<_>>().join(", ")
            )
        })?;
        let addr = field_u64(o, "addr", at)?.unwrap_or(0);
        let len = field_u64(o, "len", at)?.unwrap_or(0);
        let count = field_u64(o, "count", at)?.unwrap_or(1);
        if len == 0 || count == 0 {
            bail!("{at}: during_register: `{mem}` needs `len` (and a `count`, if any) above 0");
        }
        if count != 1 && kind != MemKind::Scratch {
            bail!("{at}: during_register: only `scratch` takes a `count`");
        }
        out.push(DuringOp { kind, addr, len, count });
    }
    Ok(out)
}

/// How a case gets more arena than the default.
fn arena_hint(arena: u64) -> &'static str {
    if arena == super::MIN_ARENA {
        " (a case that needs more sets `arena` in its header)"
    } else {
        " (the header's `arena`)"
    }
}

/// The header's `arena`: a multiple of 64 KiB (any page size up to that
/// divides it) in [`MIN_ARENA`](super::MIN_ARENA), [`MAX_CASE_ARENA`](super::MAX_CASE_ARENA)].
fn header_arena(h: &Map<String, Value>, at: &str) -> Result<u64> {
    let Some(a) = field_u64(h, "arena", at)? else { return Ok(super::MIN_ARENA) };
    if !(super::MIN_ARENA..=super::MAX_CASE_ARENA).contains(&a) || a % (64 << 10) != 0 {
        bail!(
            "{at}: field `arena`: {a:#x} bytes; expected a multiple of 64 KiB from {:#x} (the default) to {:#x}",
            super::MIN_ARENA,
            super::MAX_CASE_ARENA
        );
    }
    Ok(a)
}

/// A data record's lease must be held and its bytes in the arena (or a named `buf`).
fn check_data_record(
    d: &super::DataRecord,
    held: &std::collections::HashSet<u64>,
    bufs: &std::collections::HashSet<&str>,
    at: &str,
    arena: u64,
) -> Result<()> {
    if let Some(l) = d.lease {
        if !held.contains(&l) {
            bail!("{at}: `{}` through lease {l}, which is not held here", d.kind.name());
        }
    }
    match &d.buf {
        Some(b) if !bufs.contains(b.as_str()) => bail!("{at}: field `buf`: unknown buf `{b}` (no earlier record names it)"),
        Some(_) => {}
        None if d.addr.checked_add(d.len).is_none_or(|e| e > arena) => {
            bail!("{at}: [{:#x}, +{:#x}) lies outside the arena's {:#x} bytes{}", d.addr, d.len, arena, arena_hint(arena))
        }
        None => {}
    }
    Ok(())
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
        const HEADER: [&str; 9] =
            ["mrcache_conformance", "name", "purpose", "spec", "needs", "max_regions", "max_pinned_bytes", "arena", "preload"];
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
        let arena = header_arena(&h, &at)?;
        let preload = field_str(&h, "preload", &at)?;
        if let Some(p) = &preload {
            if !PRELOADS.iter().any(|x| x.name == p) {
                bail!(
                    "{at}: field `preload`: unknown allocator `{p}` (expected {})",
                    PRELOADS.iter().map(|x| x.name).collect::<Vec<_>>().join(", ")
                );
            }
        }
        let mut records = Vec::new();
        for (i, line) in lines {
            let n = i + 1;
            let at = format!("{}:{n}", path.display());
            let mut obj: Map<String, Value> = serde_json::from_str(line).with_context(|| format!("{at}: not a JSON object"))?;
            let thread = field_u64(&obj, "thread", &at)?.unwrap_or(0);
            let pause = field_bool(&obj, "pause", &at)?;
            let buf = field_str(&obj, "buf", &at)?;
            if let Some(ctl) = field_str(&obj, "ctl", &at)? {
                match ctl.as_str() {
                    "continue" => records.push((n, Record::Continue { thread })),
                    "rss_mark" => records.push((n, Record::Rss { max_growth: None })),
                    "rss_check" => {
                        let m =
                            field_u64(&obj, "max_growth", &at)?.ok_or_else(|| anyhow!("{at}: `rss_check` needs `max_growth` (bytes)"))?;
                        records.push((n, Record::Rss { max_growth: Some(m) }));
                    }
                    "destroy" => records.push((n, Record::Lifecycle { create: false, thread })),
                    "create" => records.push((n, Record::Lifecycle { create: true, thread })),
                    "join" => records.push((n, Record::Join { thread })),
                    other => bail!("{at}: unknown ctl `{other}` (expected continue, rss_mark, rss_check, destroy, create, join)"),
                }
            } else if let Some(mem) = field_str(&obj, "mem", &at)? {
                let kind = MemKind::ALL.iter().find(|(s, _)| *s == mem).map(|(_, k)| *k).ok_or_else(|| {
                    anyhow!(
                        "{at}: unknown memory operation `{mem}` (expected {})",
                        MemKind::ALL.iter().map(|(s, _)| *s).collect::<Vec<_>>().join(", ")
                    )
                })?;
                let addr = field_u64(&obj, "addr", &at)?.unwrap_or(0);
                let len = field_u64(&obj, "len", &at)?.unwrap_or(0);
                let new_len = field_u64(&obj, "new_len", &at)?.unwrap_or(0);
                let name = field_str(&obj, "name", &at)?;
                let count = field_u64(&obj, "count", &at)?.unwrap_or(1);
                if count == 0 {
                    bail!("{at}: field `count`: at least 1");
                }
                if count != 1 && !matches!(kind, MemKind::Scratch | MemKind::UnmapMapCycles) {
                    bail!("{at}: field `count`: only `scratch` and `unmap_map_cycles` take one");
                }
                if preload.is_some() && matches!(kind, MemKind::Malloc | MemKind::Free | MemKind::BrkGrow | MemKind::BrkShrink) {
                    bail!("{at}: `{mem}` in a case with `preload`: the runner judges `free` and the brk records as glibc serves them");
                }
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
                let background = field_bool(&obj, "background", &at)?;
                let rounds = field_u64(&obj, "rounds", &at)?.unwrap_or(1);
                if rounds == 0 || (rounds != 1 && kind != MemKind::Scratch) {
                    bail!("{at}: field `rounds`: at least 1, and only `scratch` takes one");
                }
                if background && (pause || !matches!(kind, MemKind::Scratch | MemKind::UnmapMapCycles)) {
                    bail!("{at}: only `scratch` and `unmap_map_cycles` run in the `background`, and without a pause");
                }
                if kind == MemKind::Scratch && (buf.is_some() || pause) {
                    bail!("{at}: `scratch` takes no `buf` and cannot pause (its blocks are the allocator's)");
                }
                records.push((n, Record::Mem { kind, buf, name, addr, len, new_len, count, rounds, thread, pause, background }));
            } else if let Some(name) = field_str(&obj, "data", &at)? {
                records.push((n, Record::Data(super::data::parse_record(&obj, &name, buf, thread, &at)?)));
            } else if obj.contains_key("op") {
                let during = match obj.remove("during_register") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(v) => parse_during(&v, &at)?,
                };
                for k in ["thread", "pause", "buf"] {
                    obj.remove(k);
                }
                // Named before serde parses it: a memory op with a field
                // missing would otherwise be told to add the field.
                if let Some(name) = obj.get("op").and_then(Value::as_str).filter(|n| MEMORY_OPS.contains(n)) {
                    bail!("{at}: `{name}` is not a conformance record: the adapter performs real memory operations (use {{\"mem\": ...}})");
                }
                let op: Op = serde_json::from_value(Value::Object(obj)).map_err(|e| unknown_op(e, &at))?;
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
                if !during.is_empty() && !matches!(op, Op::Acquire { .. }) {
                    bail!("{at}: only an acquire has a registrar that can run `during_register`");
                }
                if !during.is_empty() && !needs.iter().any(|n| n == "during_register") {
                    bail!("{at}: `during_register` needs the capability: list \"during_register\" in the header's `needs`");
                }
                if !during.is_empty() && buf.is_some() {
                    bail!("{at}: an acquire with `during_register` addresses the arena (no `buf`)");
                }
                records.push((n, Record::Op { op, buf, thread, pause, during }));
            } else {
                bail!("{at}: a record needs `op`, `mem`, `data` or `ctl`");
            }
        }
        check_records(&records, path, arena, &needs)?;
        Ok(Case { name, purpose, spec, needs, max_regions, max_pinned_bytes, arena, preload, path: path.to_path_buf(), records })
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
