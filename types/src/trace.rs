//! The trace format (spec.md#T): JSON lines, a header then one record per event.
//!
//! Invariants kept by [`Trace::parse`]: every record's range is non-empty and
//! does not wrap; every `release` names a lease that is held at that point;
//! no `acquire` reuses a lease name that is still held. A trace that breaks
//! one of these is rejected with the file, line and field.

use crate::{LeaseId, Op, Range, Ret, PAGE_SIZE};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// The format version this crate reads and writes.
pub const FORMAT_VERSION: u32 = 1;

//= spec.md#T1
/// The first line of every trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    /// Format version; must equal [`FORMAT_VERSION`].
    pub mrcache_trace: u32,
    /// Where the trace comes from: `hand-written`, `checker`, `recorder`, ...
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default = "one")]
    pub ranks: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    #[serde(default = "page_size")]
    pub page_size: u64,
    /// The overlap policy the trace was written for, if it matters
    /// (`independent`, `merge`, `no_merge_uncache_contained`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_hint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub date: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorder: Option<String>,
    /// True when records of several threads interleave and `expect` values
    /// were observed concurrently (checker counterexamples).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub concurrent: bool,
}

fn one() -> u32 {
    1
}
fn page_size() -> u64 {
    PAGE_SIZE
}

impl Header {
    pub fn new(source: &str) -> Header {
        Header {
            mrcache_trace: FORMAT_VERSION,
            source: source.to_string(),
            description: None,
            program: None,
            program_version: None,
            command: None,
            ranks: 1,
            rank: None,
            page_size: PAGE_SIZE,
            policy_hint: None,
            date: None,
            recorder: None,
            concurrent: false,
        }
    }
}

//= spec.md#T2
/// One event: an [`Op`] plus where and when it happened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Nanoseconds since the start of the recording.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t: Option<u64>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rank: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub thread: u32,
    /// The call was made from inside the MPI library.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_mpi: bool,
    #[serde(flatten)]
    pub op: Op,
    /// The outcome the trace asserts (hand-written and checker traces).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect: Option<Ret>,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

impl Record {
    pub fn new(op: Op) -> Record {
        Record { t: None, rank: 0, thread: 0, in_mpi: false, op, expect: None }
    }
}

/// A parsed, validated trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    pub header: Header,
    pub records: Vec<Record>,
    /// The file line of `records[0]`, for messages (`records[i]` is on line
    /// `first_record_line + i` when the file has no blank lines).
    pub first_record_line: usize,
}

/// A trace that cannot be used, with the place that is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct TraceError {
    pub file: String,
    /// 1-based line number; 0 for whole-file problems.
    pub line: usize,
    pub message: String,
}

/// Fields holding numbers, checked one by one so that an error names its field.
const NUMERIC_FIELDS: [&str; 6] = ["addr", "len", "lease", "t", "rank", "thread"];

impl Trace {
    /// Parses and validates a trace. `file` is only used in error messages.
    pub fn parse(file: &str, text: &str) -> Result<Trace, TraceError> {
        let err = |line: usize, message: String| TraceError { file: file.to_string(), line, message };
        let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
        let (hl, hline) = lines.next().ok_or_else(|| err(0, "empty trace: no header line".into()))?;
        let header: Header = serde_json::from_str(hline).map_err(|e| err(hl + 1, format!("bad header: {e}")))?;
        if header.mrcache_trace != FORMAT_VERSION {
            return Err(err(
                hl + 1,
                format!(
                    "field `mrcache_trace`: format version {} is not supported (this build reads {FORMAT_VERSION})",
                    header.mrcache_trace
                ),
            ));
        }
        if !header.page_size.is_power_of_two() || header.page_size < 512 {
            return Err(err(hl + 1, format!("field `page_size`: {} is not a power of two >= 512", header.page_size)));
        }
        let mut records = Vec::new();
        let mut held: BTreeMap<LeaseId, usize> = BTreeMap::new();
        for (i, line) in lines {
            let n = i + 1;
            let record = parse_record(line).map_err(|m| err(n, m))?;
            validate(&record, n, &mut held).map_err(|m| err(n, m))?;
            records.push(record);
        }
        Ok(Trace { header, records, first_record_line: hl + 2 })
    }

    /// Writes the trace as JSON lines.
    pub fn to_jsonl(&self) -> String {
        let mut out = serde_json::to_string(&self.header).expect("header serialises");
        out.push('\n');
        for r in &self.records {
            out.push_str(&serde_json::to_string(r).expect("record serialises"));
            out.push('\n');
        }
        out
    }

    pub fn ops(&self) -> impl Iterator<Item = &Op> {
        self.records.iter().map(|r| &r.op)
    }
}

fn parse_record(line: &str) -> Result<Record, String> {
    let value: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    let obj = value.as_object().ok_or("a record must be a JSON object")?;
    let Some(op) = obj.get("op") else {
        return Err("missing field `op`".into());
    };
    if !op.is_string() {
        return Err(format!("field `op`: expected a string, found {op}"));
    }
    for field in NUMERIC_FIELDS {
        if let Some(v) = obj.get(field) {
            crate::hex_u64::deserialize(v).map_err(|e| format!("field `{field}`: {e}"))?;
        }
    }
    serde_json::from_value(value.clone()).map_err(|e| format!("op `{}`: {e}", op.as_str().unwrap_or("?")))
}

//= spec.md#T3
fn validate(r: &Record, line: usize, held: &mut BTreeMap<LeaseId, usize>) -> Result<(), String> {
    // A record that asserts failure tests error handling: it holds nothing.
    if matches!(r.expect, Some(Ret::Failed { .. })) {
        return Ok(());
    }
    match (r.op, r.op.range()) {
        // malloc(0)/free of a zero-size block: recorded, harmless (S2.4).
        (Op::Alloc { len: 0, .. } | Op::Free { len: 0, .. }, _) => {}
        (_, Some(Err(e))) => return Err(format!("{}: {e}", r.op.name())),
        _ => {}
    }
    match r.op {
        Op::Acquire { lease, .. } => {
            if let Some(prev) = held.insert(lease, line) {
                return Err(format!("acquire: lease L{lease} is already held (acquired on line {prev})"));
            }
        }
        Op::Release { lease } if held.remove(&lease).is_none() => {
            return Err(format!("release: lease L{lease} is not held at this point (unknown lease)"));
        }
        _ => {}
    }
    Ok(())
}

//= spec.md#T4
/// Maps a trace's recorded addresses into an arena of this process, keeping
/// everything the cache can observe: page offsets, overlaps, and alignment up
/// to [`Relocation::ALIGN`].
///
/// Rule: the page spans the trace touches are grouped into clusters (spans
/// closer than [`Relocation::CLUSTER_GAP`] join one cluster). Each cluster
/// keeps its internal layout and is placed in the arena at an offset congruent
/// to its original start modulo `ALIGN`, at least `CLUSTER_GAP` after the
/// previous cluster. Addresses below `mmap_min_addr` (such as 0x1000) need no
/// special case: only their offsets matter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relocation {
    /// (original start, original end, arena offset of start), sorted by start.
    clusters: Vec<(u64, u64, u64)>,
    /// Bytes the arena must span.
    pub arena_len: u64,
}

impl Relocation {
    pub const ALIGN: u64 = 2 << 20;
    pub const CLUSTER_GAP: u64 = 4 << 20;

    pub fn plan<'a>(ops: impl IntoIterator<Item = &'a Op>, page_size: u64) -> Relocation {
        let mut spans: Vec<(u64, u64)> = ops
            .into_iter()
            .filter_map(|op| op.range().and_then(Result::ok))
            .map(|r: Range| {
                let p = r.pages(page_size);
                (p.first * page_size, p.end.saturating_mul(page_size))
            })
            .collect();
        spans.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (s, e) in spans {
            match merged.last_mut() {
                Some(last) if s <= last.1.saturating_add(Self::CLUSTER_GAP) => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        let mut clusters = Vec::with_capacity(merged.len());
        let mut next = 0u64;
        for (s, e) in merged {
            let residue = s % Self::ALIGN;
            let mut off = next / Self::ALIGN * Self::ALIGN + residue;
            if off < next {
                off += Self::ALIGN;
            }
            clusters.push((s, e, off));
            next = off + (e - s) + Self::CLUSTER_GAP;
        }
        Relocation { clusters, arena_len: next }
    }

    /// The arena offset of a recorded address, if the plan covers it.
    pub fn offset(&self, addr: u64) -> Option<u64> {
        let i = self.clusters.partition_point(|c| c.0 <= addr).checked_sub(1)?;
        let (s, e, off) = self.clusters[i];
        (addr < e).then(|| off + (addr - s))
    }

    /// The recorded address of an arena offset: the inverse of [`Self::offset`],
    /// extended linearly around each cluster so that a registration widened by
    /// chunk alignment (at most `ALIGN` beyond its cluster) maps back too.
    pub fn original(&self, offset: u64) -> Option<u64> {
        let i = self.clusters.partition_point(|c| c.2 <= offset.saturating_add(Self::ALIGN)).checked_sub(1)?;
        let (s, _, off) = self.clusters[i];
        if offset >= off {
            s.checked_add(offset - off)
        } else {
            s.checked_sub(off - offset)
        }
    }

    /// Rewrites an op's addresses as `base + offset`.
    pub fn relocate(&self, op: &Op, base: u64) -> Option<Op> {
        let mut op = *op;
        match &mut op {
            Op::Acquire { addr, .. }
            | Op::ReleaseEvent { addr, .. }
            | Op::ReleaseBegin { addr, .. }
            | Op::ReleaseEnd { addr, .. }
            | Op::Alloc { addr, .. }
            | Op::Free { addr, .. } => *addr = base + self.offset(*addr)?,
            Op::Release { .. } | Op::Flush | Op::Trim | Op::Fork => {}
        }
        Some(op)
    }
}

impl fmt::Display for Relocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} cluster(s), arena {} KiB", self.clusters.len(), self.arena_len >> 10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Access;

    const HEADER: &str = r#"{"mrcache_trace":1,"source":"test"}"#;

    fn parse(body: &str) -> Result<Trace, TraceError> {
        Trace::parse("t.jsonl", &format!("{HEADER}\n{body}"))
    }

    #[test]
    //= spec.md#T1
    //= spec.md#T2
    fn parses_and_round_trips() {
        let t = parse(
            r#"{"op":"acquire","lease":1,"addr":"0x1000","len":"0x3000","access":"remote_read"}
{"op":"release_event","kind":"munmap","addr":"0x3000","len":4096,"t":5}
{"op":"release","lease":1,"expect":{"ret":"done"}}"#,
        )
        .unwrap();
        assert_eq!(t.records.len(), 3);
        assert_eq!(t.records[1].t, Some(5));
        let again = Trace::parse("again", &t.to_jsonl()).unwrap();
        assert_eq!(again, t);
    }

    #[test]
    //= spec.md#S2.9
    fn release_windows_parse_and_round_trip() {
        let t = parse(
            r#"{"op":"release_begin","addr":"0x3000","len":4096}
{"op":"release_end","addr":"0x3000","len":"0x1000","expect":{"ret":"failed","error":{"error":"unmatched_release_end"}}}"#,
        )
        .unwrap();
        assert_eq!(t.records[0].op, Op::ReleaseBegin { addr: 0x3000, len: 4096 });
        assert_eq!(t.records[1].op, Op::ReleaseEnd { addr: 0x3000, len: 4096 });
        assert_eq!(t.records[1].expect, Some(Ret::Failed { error: crate::OpError::UnmatchedReleaseEnd }));
        assert_eq!(Trace::parse("again", &t.to_jsonl()).unwrap(), t);
        assert!(parse(r#"{"op":"release_begin","addr":"0x3000","len":0}"#).is_err(), "E1 without expect is rejected (T3)");
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let e = parse(r#"{"op":"acquire","lease":1,"addr":"0xzz","len":1,"access":"remote_read"}"#).unwrap_err();
        assert_eq!((e.file.as_str(), e.line), ("t.jsonl", 2));
        assert!(e.message.contains("field `addr`"), "{e}");
        let e = parse(r#"{"op":"acquire","lease":1,"addr":"0x1000","access":"remote_read"}"#).unwrap_err();
        assert!(e.message.contains("missing field `len`"), "{e}");
        let e = parse(r#"{"op":"acquire","lease":1,"addr":1,"len":1,"access":"remote_red"}"#).unwrap_err();
        assert!(e.message.contains("remote_red"), "{e}");
        let e = parse(r#"{"op":"teleport"}"#).unwrap_err();
        assert!(e.message.contains("teleport"), "{e}");
        let e = parse("{oops").unwrap_err();
        assert!(e.message.contains("not JSON"), "{e}");
        let e = Trace::parse("h", r#"{"mrcache_trace":9,"source":"x"}"#).unwrap_err();
        assert!(e.to_string().starts_with("h:1: field `mrcache_trace`"), "{e}");
    }

    #[test]
    //= spec.md#T3
    fn rejects_wrapping_range_and_unknown_lease() {
        let e = parse(r#"{"op":"acquire","lease":1,"addr":"0xfffffffffffff000","len":"0x2000","access":"remote_read"}"#).unwrap_err();
        assert!(e.message.contains("wraps"), "{e}");
        let e = parse(r#"{"op":"release","lease":7}"#).unwrap_err();
        assert!(e.message.contains("L7 is not held"), "{e}");
        let e = parse(
            r#"{"op":"acquire","lease":1,"addr":1,"len":1,"access":"rw"}
{"op":"acquire","lease":1,"addr":1,"len":1,"access":"rw"}"#,
        )
        .unwrap_err();
        assert!(e.message.contains("already held (acquired on line 2)"), "{e}");
    }

    #[test]
    //= spec.md#T4
    fn relocation_keeps_offsets_overlaps_and_alignment() {
        let a = Access::REMOTE_READ;
        let ops = [
            Op::Acquire { lease: 1, addr: 0x1000, len: 0x3000, access: a },
            Op::ReleaseEvent { kind: crate::ReleaseKind::Munmap, addr: 0x3000, len: 0x1000 },
            Op::Acquire { lease: 2, addr: 0x7f00_0000_1234, len: 100, access: a },
        ];
        let r = Relocation::plan(&ops, 4096);
        let base = 0x10_0000_0000u64;
        let o1 = r.offset(0x1000).unwrap();
        assert_eq!(r.offset(0x3000).unwrap() - o1, 0x2000);
        let o2 = r.offset(0x7f00_0000_1234).unwrap();
        assert_eq!(o2 % Relocation::ALIGN, 0x7f00_0000_1234 % Relocation::ALIGN);
        assert!(o2 >= o1 + Relocation::CLUSTER_GAP);
        assert!(r.arena_len < 64 << 20, "{r}");
        assert_eq!(r.offset(0x5000), None);
        assert_eq!(r.original(o1), Some(0x1000));
        assert_eq!(r.original(o2), Some(0x7f00_0000_1234));
        assert_eq!(r.original(o1 - 0x1000), Some(0), "alignment below a cluster maps back");
        let moved = r.relocate(&ops[0], base).unwrap();
        assert_eq!(moved, Op::Acquire { lease: 1, addr: base + o1, len: 0x3000, access: a });
    }
}
