//! Driving the adapter: each case record becomes one command (addresses made
//! absolute from its `buf`; the op the model judges and the release events a
//! memory operation implies are kept in its [`Pending`]), then the adapter's
//! lines are read until the command is answered, paused, or (while another
//! thread is paused) `blocked` after `--block-ms`.
//!
//! A thread has at most one operation in flight; a `continue` resumes the
//! paused thread and waits for its operation and whatever it blocked; no
//! thread may still be paused when the case ends.

use super::adapter_process::Line;
use super::case::DuringOp;
use super::hello::ALL_ACCESS;
use super::{stop, CaseRun, MemKind, Pending, PendingKind, Record, Stop};
use mrcache_types::{Op, Range, ReleaseKind};
use serde_json::{json, Value};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

/// How many `--timeout`s a `scratch` or `unmap_map_cycles` command (which may
/// run for seconds) may take before it is hung.
const LONG_TIMEOUTS: u32 = 4;

impl CaseRun<'_> {
    pub(super) fn run(&mut self) -> Result<(), Stop> {
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
                Record::Op { op, buf, thread, pause, during } => {
                    let (cmd_seq, mut cmd, kind) = self.op_command(op, buf.as_deref(), *thread, *pause, line)?;
                    if !during.is_empty() {
                        self.during_register(&mut cmd, cmd_seq, during, line)?;
                    }
                    self.send_and_track(&cmd, line, *thread, kind, *pause)?;
                    self.wait_for(cmd_seq, line, *pause)?;
                }
                Record::Rss { max_growth } => {
                    let seq = self.next_seq();
                    let cmd = json!({"seq": seq, "cmd": "rss", "thread": 0});
                    self.send_and_track(&cmd, line, 0, PendingKind::Rss { max_growth: *max_growth }, false)?;
                    self.wait_for(seq, line, false)?;
                }
                Record::Data(d) => {
                    if let Some(why) = &self.data.unsupported {
                        self.ad.note(format!("  (case line {line}: {} skipped: {why})", d.kind.name()));
                        continue;
                    }
                    let seq = self.next_seq();
                    let (cmd, kind) = self.data_command(d, seq, line)?;
                    self.send_and_track(&cmd, line, d.thread, kind, false)?;
                    self.wait_for(seq, line, false)?;
                }
                Record::Lifecycle { create, thread } => {
                    let seq = self.next_seq();
                    let cmd = json!({"seq": seq, "cmd": if *create { "create" } else { "destroy" }, "thread": thread});
                    self.send_and_track(&cmd, line, *thread, PendingKind::Lifecycle { create: *create }, false)?;
                    self.wait_for(seq, line, false)?;
                }
                Record::Join { thread } => {
                    let seqs: Vec<u64> = self.pending.iter().filter(|(_, p)| p.thread == *thread).map(|(s, _)| *s).collect();
                    for s in seqs {
                        self.wait_for(s, line, false)?;
                    }
                }
                Record::Mem { kind, buf, name, addr, len, new_len, count, rounds, thread, pause, background } => {
                    let (cmd_seq, mut cmd, pk) =
                        self.mem_command(*kind, buf.as_deref(), name.clone(), *addr, *len, *new_len, *thread, *pause, line)?;
                    if matches!(kind, MemKind::Scratch | MemKind::UnmapMapCycles) {
                        cmd["count"] = json!(count);
                    }
                    if *kind == MemKind::Scratch && *rounds > 1 {
                        cmd["rounds"] = json!(rounds);
                    }
                    self.send_and_track(&cmd, line, *thread, pk, *pause)?;
                    if !*background {
                        self.wait_for(cmd_seq, line, *pause)?;
                    }
                }
            }
            self.query_if_quiet(line)?;
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

    pub(super) fn resolve(&self, buf: Option<&str>, off: u64, len: u64, line: usize) -> Result<u64, Stop> {
        let name = buf.unwrap_or("arena");
        let (base, size) = *self.bufs.get(name).ok_or_else(|| stop("protocol", line, format!("case error: unknown buf `{name}`")))?;
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
            Op::Flush | Op::Trim | Op::Fork => {
                (seq, json!({"seq": seq, "cmd": op.name(), "thread": thread}), PendingKind::Model { model_op: *op })
            }
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
            MemKind::Malloc | MemKind::BrkGrow | MemKind::Scratch => {
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
                    MemKind::Munmap | MemKind::UnmapMapCycles => model_ops.push(ev(ReleaseKind::Munmap, abs, len)),
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
        let spans = self.event_spans(&model_ops);
        Ok((seq, cmd, PendingKind::Mem { kind, name, len, model_ops, spans }))
    }

    /// The pages each release event of `ops` covers.
    fn event_spans(&self, ops: &[Op]) -> Vec<mrcache_types::PageSpan> {
        ops.iter()
            .filter_map(|o| match *o {
                Op::ReleaseEvent { addr, len, .. } => Range::new(addr, len).ok().map(|r| r.pages(self.page)),
                _ => None,
            })
            .collect()
    }

    /// Adds an acquire's `during_register` to its command (absolute
    /// addresses) and keeps the release events its operations imply: they
    /// take effect at the acquire's first registration (the registrar runs
    /// them once the pages are pinned), or never if the acquire hits.
    fn during_register(&mut self, cmd: &mut Value, seq: u64, during: &[DuringOp], line: usize) -> Result<(), Stop> {
        let ev = |k: ReleaseKind, a: u64, l: u64| Op::ReleaseEvent { kind: k, addr: a, len: l };
        let mut list = Vec::new();
        let mut model_ops = Vec::new();
        for d in during {
            if d.kind == MemKind::Scratch {
                list.push(json!({"mem": "scratch", "len": d.len, "count": d.count}));
                continue;
            }
            let abs = self.resolve(None, d.addr, d.len, line)?;
            list.push(json!({"mem": d.kind.name(), "addr": format!("{abs:#x}"), "len": d.len}));
            match d.kind {
                MemKind::Munmap => model_ops.push(ev(ReleaseKind::Munmap, abs, d.len)),
                MemKind::MmapFixed => model_ops.push(ev(ReleaseKind::MapFixedOver, abs, d.len)),
                MemKind::MadviseDontneed => model_ops.push(ev(ReleaseKind::MadviseDontneed, abs, d.len)),
                _ => {}
            }
        }
        cmd["during_register"] = json!(list);
        let spans = self.event_spans(&model_ops);
        self.during = Some((seq, model_ops, spans));
        Ok(())
    }

    pub(super) fn send_and_track(&mut self, cmd: &Value, line: usize, thread: u64, kind: PendingKind, pause: bool) -> Result<(), Stop> {
        let seq = cmd["seq"].as_u64().unwrap_or(0);
        if let Some(p) = self.pending.values().find(|p| p.thread == thread && !matches!(p.kind, PendingKind::Continue)) {
            if p.blocked && !matches!(kind, PendingKind::Continue) {
                // Blocking is allowed (a lock held across the registrar),
                // but this case cannot go on: its next command needs the
                // blocked thread before the continue that frees it.
                let why = if matches!(p.kind, PendingKind::Model { model_op: Op::Fork }) {
                    format!(
                        "the fork of case line {} waits for the paused operation to end (a fork handler of the cache takes a lock that operation holds, so no child inherits it held); this case cannot go on",
                        p.line
                    )
                } else {
                    format!("thread {thread} is blocked at case line {} until a later continue; this case cannot go on under a cache that blocks there", p.line)
                };
                return Err(Stop::Unsupported(line, why));
            }
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
    pub(super) fn wait_for(&mut self, seq: u64, line: usize, pause: bool) -> Result<(), Stop> {
        let full = Duration::from_secs_f64(self.args.timeout.max(0.1));
        let start = Instant::now();
        loop {
            let Some(p) = self.pending.get(&seq) else { return Ok(()) };
            if pause && p.paused {
                return Ok(());
            }
            let blockable = self.pending.iter().any(|(s, q)| *s != seq && q.paused);
            // A long memory command (many cycles or blocks: seconds on a
            // loaded machine) gets four timeouts before it counts as blocked
            // or hung.
            let long = matches!(p.kind, PendingKind::Mem { kind: MemKind::Scratch | MemKind::UnmapMapCycles, .. });
            let limit = match (blockable, long) {
                (_, true) => full * LONG_TIMEOUTS,
                (true, false) => Duration::from_millis(self.args.block_ms),
                (false, false) => full,
            };
            let left = limit.saturating_sub(start.elapsed());
            match self.ad.rx.recv_timeout(left) {
                Ok(Line::Text(t)) => {
                    self.ad.note(format!("< {t}"));
                    self.handle_line(&t, line)?;
                }
                Ok(Line::TooLong) => {
                    let how = self.ad.end_after_too_long();
                    return Err(stop(
                        "protocol",
                        line,
                        format!("the adapter wrote a line longer than {} bytes, {how}", super::adapter_process::MAX_LINE),
                    ));
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
                    return Err(stop("hang", line, format!("no answer within {:.1} s", limit.as_secs_f64())));
                }
                Err(RecvTimeoutError::Disconnected) => return Err(stop("crash", line, "the adapter's stdout closed".into())),
            }
        }
    }
}
