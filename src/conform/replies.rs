//! The adapter's lines: events (`reg`, `dereg`, `paused`, `log`) and replies
//! to commands, each handed to the judges as it arrives.
//!
//! One exception to arrival order: a hit on a registration whose maker (an
//! acquire still in flight) is not judged yet is held back, and judged once
//! its maker is, since the maker took effect first. Deregistrations are
//! confirmed with the model after the operation that made them (a
//! continue's reply can overtake them).

use super::case::field_u64;
use super::hello::ALL_ACCESS;
use super::{stop, CaseRun, MemKind, PendingKind, PhysReg, Stop};
use mrcache_types::{Access, Op, OpError, PageSpan, Range, RegistrarFailure, Ret};
use serde_json::Value;

impl CaseRun<'_> {
    pub(super) fn handle_line(&mut self, t: &str, line: usize) -> Result<(), Stop> {
        let v: Value = serde_json::from_str(t).map_err(|e| stop("protocol", line, format!("adapter line is not JSON ({e}): `{t}`")))?;
        let o = v.as_object().ok_or_else(|| stop("protocol", line, format!("adapter line is not a JSON object: `{t}`")))?;
        let at = format!("adapter line `{t}`");
        let bad = |e: anyhow::Error| stop("protocol", line, e.to_string());
        if let Some(ev) = o.get("ev") {
            match ev.as_str() {
                Some("reg") => {
                    let id =
                        field_u64(o, "id", &at).map_err(bad)?.ok_or_else(|| stop("protocol", line, format!("{at}: reg needs `id`")))?;
                    let addr =
                        field_u64(o, "addr", &at).map_err(bad)?.ok_or_else(|| stop("protocol", line, format!("{at}: reg needs `addr`")))?;
                    let len =
                        field_u64(o, "len", &at).map_err(bad)?.ok_or_else(|| stop("protocol", line, format!("{at}: reg needs `len`")))?;
                    let access = match o.get("access") {
                        Some(Value::String(s)) => {
                            s.parse::<Access>().map_err(|e| stop("protocol", line, format!("{at}: field `access`: {e}")))?
                        }
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
                        PhysReg {
                            span: range.pages(self.page),
                            range,
                            access,
                            at: self.event_seq,
                            order: self.reg_order,
                            deregistered: false,
                            model_id: None,
                        },
                    );
                    self.during_performed(line);
                }
                Some("dereg") => {
                    let id =
                        field_u64(o, "id", &at).map_err(bad)?.ok_or_else(|| stop("protocol", line, format!("{at}: dereg needs `id`")))?;
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
        if matches!(p.kind, PendingKind::Query) {
            return self.query_answered(o, p.line);
        }
        if let PendingKind::Rss { max_growth } = p.kind {
            return self.rss_answered(o, max_growth, p.line);
        }
        // An acquire whose registrar never ran (a hit) performed none of its
        // `during_register`.
        if self.during.as_ref().is_some_and(|(s, _, _)| *s == seq) {
            self.during = None;
        }
        if o.get("during_register_failed").and_then(Value::as_bool) == Some(true) {
            let e = o.get("error").and_then(Value::as_str).unwrap_or("(no error text)");
            return Err(stop("mem-op", p.line, format!("a memory operation of during_register failed under this cache: {e}")));
        }
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
        if let PendingKind::Data { kind, lease, addr, len, byte } = p.kind {
            // Not an operation of the cache: no model step, no L1 count.
            self.snap = None;
            return self.data_reply(o, kind, lease, addr, len, byte, pl);
        }
        if !ok && o.get("unsupported").and_then(Value::as_bool) == Some(true) {
            return Err(Stop::Unsupported(
                pl,
                format!("the adapter does not support case line {pl}: {}", o.get("error").and_then(Value::as_str).unwrap_or("")),
            ));
        }
        let err_text = o.get("error").and_then(Value::as_str).unwrap_or("(no error text)").to_string();
        match p.kind.clone() {
            PendingKind::Lifecycle { create } => {
                let errno = o.get("errno").and_then(Value::as_i64).unwrap_or(0);
                if !ok && !create && errno == i64::from(libc::EBUSY) {
                    // Refused while leases are held: nothing changed.
                    self.ad.note(format!("  (case line {pl}: the cache refused the destroy: {err_text})"));
                } else if !ok {
                    return Err(stop("protocol", pl, format!("{} failed: {err_text}", if create { "create" } else { "destroy" })));
                } else if !create {
                    self.destroyed();
                }
            }
            PendingKind::Continue | PendingKind::Query | PendingKind::Rss { .. } => {
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
                    let id = field_u64(o, "reg", &at)
                        .map_err(bad)?
                        .ok_or_else(|| stop("protocol", pl, format!("{at}: an acquire reply needs `reg`")))?;
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
                // A lease of a destroyed cache: its release is a no-op.
                if !self.orphans.remove(&lease) {
                    self.judge_model(&model_op, &Ret::Done, pl);
                }
            }
            PendingKind::Mem { kind, name, len, model_ops, spans } => {
                if !ok {
                    return Err(stop("mem-op", pl, format!("{} failed under this cache: {err_text}", kind.name())));
                }
                if let Some(n) = name {
                    let addr = field_u64(o, "addr", &at)
                        .map_err(bad)?
                        .ok_or_else(|| stop("protocol", pl, format!("{at}: {} needs `addr` in its reply", kind.name())))?;
                    self.bufs.insert(n, (addr, len));
                    if kind == MemKind::Malloc {
                        self.judge_model(&Op::Alloc { addr, len }, &Ret::Done, pl);
                    }
                }
                for s in spans {
                    self.data_forget(&s);
                    self.event_seq += 1;
                    self.events.push((s, self.event_seq));
                }
                for op in &model_ops {
                    self.judge_model(op, &Ret::Done, pl);
                }
            }
            PendingKind::Data { .. } => unreachable!("judged above"),
            PendingKind::Model { model_op } => {
                if !ok {
                    return Err(stop("protocol", pl, format!("{} failed: {err_text}", model_op.name())));
                }
                if model_op == Op::Fork {
                    // A command paused (or blocked) at the fork runs on in
                    // the parent only: the child has no such thread.
                    let gone: Vec<usize> = self.pending.values().filter(|q| q.paused || q.blocked).map(|q| q.line).collect();
                    if !gone.is_empty() {
                        self.pending.retain(|_, q| !(q.paused || q.blocked));
                        self.ad.note(format!("  (the fork child has no thread of case lines {gone:?}: they never complete there)"));
                    }
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
        Ok(())
    }

    /// The cache was destroyed: the model (and the reference model) start
    /// anew, as for a cache just created; the registrations made so far are
    /// judged by the physical judge alone (a deregistration of one whose
    /// lease is still held is P3), and the leases held become orphans whose
    /// release is a no-op.
    fn destroyed(&mut self) {
        for m in self.models.iter_mut() {
            *m = mrcache_model::Model::new(m.config);
        }
        self.log.clear();
        // The destroy's own deregistrations (checked by the physical judge
        // as they came) are of the cache that is gone.
        self.deregs_buffered.clear();
        self.next_model_id = 1;
        for r in self.regs.values_mut() {
            r.model_id = None;
        }
        self.l1_since.clear();
        self.orphans.extend(self.leases.keys().copied());
        self.gaps_destroyed();
    }

    /// The first `reg` line of an acquire with `during_register`: its
    /// registrar performs the memory operations now, once the pages are
    /// pinned, so their releases come after this registration (P2) and
    /// before the acquire's reply (the model may place the acquire on
    /// either side of them).
    fn during_performed(&mut self, line: usize) {
        let Some((_, model_ops, spans)) = self.during.take() else { return };
        for s in spans {
            self.data_forget(&s);
            self.event_seq += 1;
            self.events.push((s, self.event_seq));
        }
        for op in &model_ops {
            self.judge_model(op, &Ret::Done, line);
        }
    }

    /// The answer to `rss`: a mark, or a check of the growth since the
    /// last mark (L2: what pending invalidations hold stays bounded).
    fn rss_answered(&mut self, o: &serde_json::Map<String, Value>, max_growth: Option<u64>, line: usize) -> Result<(), Stop> {
        if o.get("ok").and_then(Value::as_bool) != Some(true) {
            if o.get("unsupported").and_then(Value::as_bool) == Some(true) {
                return Err(Stop::Unsupported(line, "the adapter does not report its resident set (`rss`)".into()));
            }
            return Err(stop("protocol", line, format!("rss failed: {}", o.get("error").and_then(Value::as_str).unwrap_or(""))));
        }
        let at = "the rss reply";
        let rss = field_u64(o, "rss", at)
            .map_err(|e| stop("protocol", line, e.to_string()))?
            .ok_or_else(|| stop("protocol", line, "an rss reply needs `rss` (bytes)".into()))?;
        match (max_growth, self.rss_mark) {
            (None, _) => self.rss_mark = Some((rss, line)),
            (Some(max), Some((mark, mark_line))) => {
                let growth = rss.saturating_sub(mark);
                self.ad.note(format!("  (resident set {rss} bytes: {growth} bytes above case line {mark_line}'s)"));
                if growth > max {
                    self.record_failure(super::Finding {
                        rule: "L2".into(),
                        line,
                        detail: format!(
                            "the adapter's resident set grew by {growth} bytes ({} KiB) since case line {mark_line}, above the bound of {max} bytes: what pending invalidations hold is not bounded",
                            growth >> 10
                        ),
                    });
                }
            }
            (Some(_), None) => return Err(stop("protocol", line, "case error: rss_check without a mark".into())),
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
}
