//! Data commands (docs/conformance-protocol.md, *Data commands*): the
//! device writes into a lease (`dma_in`) or reads out of it (`dma_out`)
//! through the registration that serves it, the application writes
//! (`app_write`) and reads (`app_read`) the same pages. With a registrar
//! that really pins (the adapters' io_uring registrar), a stale
//! registration shows as bytes in the wrong place: the judge reports
//! **stale DMA observed** beside the P2 failure the event order gives.
//!
//! The judge keeps a *shadow* of what each byte the case wrote must hold
//! (the last `app_write` or `dma_in` over it; a release event forgets it):
//! an `app_read` or `dma_out` that reads something else is a stale
//! observation. An adapter whose registrar moves no data answers the device
//! commands `unsupported`; the case is then judged by event order alone,
//! and its result says so.
//!
//! A P2 failure found by event order does not end a case that has data
//! records after it: the records run on (the model judge stops there) so
//! that the data shows whether the stale registration really misplaces
//! bytes.

use super::case::field_u64;
use super::{CaseResult, CaseRun, Finding, PendingKind, Stop, Verdict};
use anyhow::{anyhow, bail, Result};
use mrcache_types::{LeaseId, PageSpan};
use serde::Serialize;
use serde_json::{json, Map, Value};

/// The four data commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DataKind {
    /// The device writes `byte` through the lease's registration.
    DmaIn,
    /// The device reads through the lease's registration.
    DmaOut,
    /// The application writes `byte` to its pages.
    AppWrite,
    /// The application reads its pages.
    AppRead,
}

impl DataKind {
    const ALL: [(&'static str, DataKind); 4] =
        [("dma_in", DataKind::DmaIn), ("dma_out", DataKind::DmaOut), ("app_write", DataKind::AppWrite), ("app_read", DataKind::AppRead)];

    pub fn name(self) -> &'static str {
        DataKind::ALL.iter().find(|(_, k)| *k == self).map(|(n, _)| *n).unwrap_or("?")
    }

    /// Goes through a registration (needs a held lease).
    pub fn device(self) -> bool {
        matches!(self, DataKind::DmaIn | DataKind::DmaOut)
    }

    /// Writes a pattern byte.
    pub fn writes(self) -> bool {
        matches!(self, DataKind::DmaIn | DataKind::AppWrite)
    }
}

/// The longest transfer of one data command (a pipe's default capacity).
pub const MAX_DATA_LEN: u64 = 64 << 10;

/// A data record of a case: `{"data": "dma_in", "lease": 2, "addr": ..., "len": ..., "byte": "0xab"}`.
#[derive(Clone, Debug)]
pub struct DataRecord {
    pub kind: DataKind,
    pub lease: Option<LeaseId>,
    pub buf: Option<String>,
    pub addr: u64,
    pub len: u64,
    pub byte: Option<u8>,
    pub thread: u64,
}

/// Parses the fields of a `{"data": ...}` record.
pub(super) fn parse_record(obj: &Map<String, Value>, name: &str, buf: Option<String>, thread: u64, at: &str) -> Result<DataRecord> {
    let kind = DataKind::ALL.iter().find(|(s, _)| *s == name).map(|(_, k)| *k).ok_or_else(|| {
        anyhow!("{at}: unknown data command `{name}` (expected {})", DataKind::ALL.iter().map(|(s, _)| *s).collect::<Vec<_>>().join(", "))
    })?;
    for k in obj.keys() {
        if !["data", "lease", "addr", "len", "byte", "buf", "thread"].contains(&k.as_str()) {
            bail!("{at}: unknown field `{k}` in a data record (expected data, lease, addr, len, byte, buf, thread)");
        }
    }
    let lease = field_u64(obj, "lease", at)?;
    let addr = field_u64(obj, "addr", at)?.ok_or_else(|| anyhow!("{at}: `{name}` needs `addr`"))?;
    let len = field_u64(obj, "len", at)?.unwrap_or(0);
    if len == 0 || len > MAX_DATA_LEN {
        bail!("{at}: field `len`: `{name}` needs 0 < len <= {MAX_DATA_LEN}");
    }
    let byte = match field_u64(obj, "byte", at)? {
        None => None,
        Some(b) if b <= 0xff => Some(b as u8),
        Some(b) => bail!("{at}: field `byte`: {b:#x} is not a byte"),
    };
    if kind.device() && lease.is_none() {
        bail!("{at}: `{name}` needs the `lease` whose registration the device uses");
    }
    if !kind.device() && lease.is_some() {
        bail!("{at}: `{name}` is the application's: it takes no `lease`");
    }
    if kind.writes() && byte.is_none() {
        bail!("{at}: `{name}` needs the pattern `byte` it writes");
    }
    if !kind.writes() && byte.is_some() {
        bail!("{at}: `{name}` reads: it takes no `byte`");
    }
    Ok(DataRecord { kind, lease, buf, addr, len, byte, thread })
}

/// Who wrote a byte last, for the report.
#[derive(Clone, Copy, Debug)]
enum Writer {
    App { line: usize },
    Device { line: usize, reg: u64 },
}

/// The data state of one case run.
#[derive(Default)]
pub(super) struct DataState {
    /// `[start, end)` -> (byte, writer), disjoint.
    shadow: Vec<(u64, u64, u8, Writer)>,
    /// Why the adapter moves no data (its first `unsupported`).
    pub(super) unsupported: Option<String>,
    /// Data commands that read something and were compared.
    pub(super) checks: usize,
    /// The first stale observation.
    pub(super) stale: Option<String>,
    /// Its case line.
    pub(super) stale_line: usize,
    /// The first data command that failed (not `unsupported`).
    pub(super) failed: Option<String>,
    /// A P2 failure the event order showed, kept while the case runs on.
    pub(super) p2_order: Option<Finding>,
}

impl DataState {
    fn forget(&mut self, start: u64, end: u64) {
        let mut out = Vec::with_capacity(self.shadow.len() + 1);
        for &(s, e, b, w) in &self.shadow {
            if e <= start || s >= end {
                out.push((s, e, b, w));
                continue;
            }
            if s < start {
                out.push((s, start, b, w));
            }
            if e > end {
                out.push((end, e, b, w));
            }
        }
        self.shadow = out;
    }

    fn set(&mut self, start: u64, end: u64, byte: u8, w: Writer) {
        self.forget(start, end);
        self.shadow.push((start, end, byte, w));
    }

    /// The first byte in `[start, start+runs)` that differs from the shadow:
    /// (address, expected, writer, read).
    fn first_mismatch(&self, start: u64, runs: &[(u8, u64)]) -> Option<(u64, u8, Writer, u8)> {
        let mut at = start;
        for &(got, n) in runs {
            let end = at + n;
            let mut hits: Vec<&(u64, u64, u8, Writer)> = self.shadow.iter().filter(|(s, e, _, _)| *s < end && *e > at).collect();
            hits.sort_by_key(|h| h.0);
            if let Some(&&(s, _, want, w)) = hits.iter().find(|h| h.2 != got) {
                return Some((s.max(at), want, w, got));
            }
            at = end;
        }
        None
    }
}

fn describe(w: Writer) -> String {
    match w {
        Writer::App { line } => format!("the application wrote (case line {line})"),
        Writer::Device { line, reg } => format!("the device wrote through registration {reg} (case line {line})"),
    }
}

impl CaseRun<'_> {
    /// Whether a data record follows case line `line` and the adapter moves data.
    pub(super) fn data_follows(&self, line: usize) -> bool {
        self.data.unsupported.is_none() && self.case.records.iter().any(|(l, r)| *l > line && matches!(r, super::Record::Data(_)))
    }

    /// The model's P2 objection: with data records to come and no failure
    /// yet, kept like [`Self::p2_by_order`] while the case runs on. Returns
    /// whether it was kept.
    pub(super) fn model_p2_runs_on(&mut self, f: &Finding) -> bool {
        if self.failure.is_some() || self.data.p2_order.is_some() || !self.data_follows(f.line) {
            return false;
        }
        self.ad.note(format!("  (case line {}: P2 by the model; the case runs on to check the data)", f.line));
        self.data.p2_order = Some(f.clone());
        true
    }

    /// The command for a data record (addresses made absolute).
    pub(super) fn data_command(&mut self, d: &DataRecord, seq: u64, line: usize) -> Result<(Value, PendingKind), Stop> {
        let abs = self.resolve(d.buf.as_deref(), d.addr, d.len, line)?;
        let mut cmd = json!({"seq": seq, "cmd": d.kind.name(), "thread": d.thread, "addr": format!("{abs:#x}"), "len": d.len});
        if let Some(l) = d.lease {
            cmd["lease"] = json!(l);
        }
        if let Some(b) = d.byte {
            cmd["byte"] = json!(b);
        }
        Ok((cmd, PendingKind::Data { kind: d.kind, lease: d.lease, addr: abs, len: d.len, byte: d.byte }))
    }

    /// A release event: the shadow no longer knows those pages.
    pub(super) fn data_forget(&mut self, span: &PageSpan) {
        let (s, e) = (span.first.saturating_mul(self.page), span.end.saturating_mul(self.page));
        self.data.forget(s, e);
    }

    /// Judges a data command's reply.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn data_reply(
        &mut self,
        o: &Map<String, Value>,
        kind: DataKind,
        lease: Option<LeaseId>,
        addr: u64,
        len: u64,
        byte: Option<u8>,
        pl: usize,
    ) -> Result<(), Stop> {
        let ok = o.get("ok").and_then(Value::as_bool) == Some(true);
        let err_text = o.get("error").and_then(Value::as_str).unwrap_or("(no error text)");
        if !ok {
            if o.get("unsupported").and_then(Value::as_bool) == Some(true) {
                self.data.unsupported.get_or_insert_with(|| format!("{} at case line {pl}: {err_text}", kind.name()));
                return Ok(());
            }
            let what = format!("{} at case line {pl} failed: {err_text}", kind.name());
            self.data.failed.get_or_insert(what.clone());
            if self.data.p2_order.is_some() {
                return Ok(());
            }
            return Err(super::stop("data", pl, what));
        }
        let reg = lease.and_then(|l| self.leases.get(&l).copied()).unwrap_or(0);
        match kind {
            DataKind::AppWrite => self.data.set(addr, addr + len, byte.unwrap_or(0), Writer::App { line: pl }),
            DataKind::DmaIn => self.data.set(addr, addr + len, byte.unwrap_or(0), Writer::Device { line: pl, reg }),
            DataKind::AppRead | DataKind::DmaOut => {
                let at = format!("the reply to {} at case line {pl}", kind.name());
                let runs = parse_runs(o, &at).map_err(|e| super::stop("protocol", pl, e))?;
                let total: u64 = runs.iter().map(|r| r.1).sum();
                let truncated = o.get("truncated").and_then(Value::as_bool) == Some(true);
                if total != len && !truncated {
                    return Err(super::stop("protocol", pl, format!("{at}: `runs` cover {total} bytes, the command asked for {len}")));
                }
                self.data.checks += 1;
                if let Some((a, want, w, got)) = self.data.first_mismatch(addr, &runs) {
                    let who = match kind {
                        DataKind::AppRead => "the application reads".to_string(),
                        _ => format!("the device reads through registration {reg}"),
                    };
                    let what = match (kind, w) {
                        (DataKind::AppRead, Writer::Device { .. }) => "the application does not see what the device wrote",
                        (DataKind::DmaOut, Writer::App { .. }) => "the device does not see what the application wrote",
                        _ => "the bytes differ from the last write",
                    };
                    let detail = format!("{what}: {} {want:#04x} at {a:#x}, {who} {got:#04x} there (case line {pl})", describe(w));
                    self.ad.note(format!("  (case line {pl}: stale DMA observed: {detail})"));
                    if self.data.stale.is_none() {
                        self.data.stale = Some(detail);
                        self.data.stale_line = pl;
                    }
                }
                // What was read is what the memory holds now.
                let mut at_addr = addr;
                for (b, n) in runs {
                    self.data.set(at_addr, at_addr + n, b, Writer::App { line: pl });
                    at_addr += n;
                }
            }
        }
        Ok(())
    }

    /// Folds the data findings into the case's result: a P2 failure by event
    /// order says whether stale data was observed; stale data the event
    /// order missed is a P2 failure of its own.
    pub(super) fn data_finish(&self, r: &mut CaseResult) {
        let has_data = self.case.records.iter().any(|(_, r)| matches!(r, super::Record::Data(_)));
        r.data = match (&self.data.stale, &self.data.unsupported, &self.data.failed) {
            (Some(s), _, _) => format!("stale DMA observed: {s}"),
            (None, Some(u), _) => format!("order only: the adapter moves no data ({u})"),
            (None, None, Some(f)) => format!("order only: a data command failed ({f})"),
            (None, None, None) if !has_data => String::new(),
            (None, None, None) if self.data.checks == 0 => "order only: no data check ran".into(),
            (None, None, None) => "data right".into(),
        };
        if let Some(f) = &self.data.p2_order {
            // The first failure of the case: later ones came from running on.
            r.verdict = Verdict::Fail;
            r.rule = f.rule.clone();
            r.line = f.line;
            r.detail = f.detail.clone();
        } else if self.data.stale.is_some() && r.verdict != Verdict::Fail {
            r.verdict = Verdict::Fail;
            r.rule = "P2".into();
            r.line = self.data.stale_line;
            r.detail = "the event order showed no P2 failure".into();
        }
        if r.verdict == Verdict::Fail && r.rule == "P2" {
            r.detail = match &self.data.stale {
                Some(_) => format!("{}; event order: {}", r.data, r.detail),
                None if r.data.is_empty() => format!("{} (order only; the case checks no data)", r.detail),
                None => format!("{} ({})", r.detail, r.data),
            };
        }
    }
}

fn parse_runs(o: &Map<String, Value>, at: &str) -> Result<Vec<(u8, u64)>, String> {
    let bad = || format!("{at}: needs `runs`: [[byte, count], ...]");
    let a = o.get("runs").and_then(Value::as_array).ok_or_else(bad)?;
    a.iter()
        .map(|r| {
            let p = r.as_array().filter(|p| p.len() == 2).ok_or_else(bad)?;
            let b = p[0].as_u64().filter(|b| *b <= 0xff).ok_or_else(bad)?;
            let n = p[1].as_u64().filter(|n| *n > 0).ok_or_else(bad)?;
            Ok((b as u8, n))
        })
        .collect()
}

impl CaseResult {
    /// The verdict as CONFORMANCE.md's table writes it: `pass`, `fail RULE`,
    /// and for a P2 failure whether stale data was observed
    /// (`fail P2, stale DMA observed`) or not (`fail P2 (order only; data
    /// right)`, `fail P2 (order only; no data)`).
    pub fn cell(&self) -> String {
        match self.verdict {
            Verdict::Fail if self.rule == "P2" => {
                if self.data.starts_with("stale DMA observed") {
                    "fail P2, stale DMA observed".into()
                } else if self.data == "data right" {
                    "fail P2 (order only; data right)".into()
                } else {
                    "fail P2 (order only; no data)".into()
                }
            }
            Verdict::Fail => format!("fail {}", self.rule),
            v => v.to_string(),
        }
    }
}
