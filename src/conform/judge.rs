//! The judges of one case.
//!
//! The physical judge (P1-P4) checks each acquire reply against the
//! registration that served it and the release events that returned before
//! the acquire was sent, and each deregistration against the leases held;
//! it needs no policy and goes on to the end of the case.
//!
//! The model judge follows the peer with one or more [`Model`] states: an
//! operation that overlapped others may take effect anywhere in its
//! interval, and every placement the model accepts is kept (at most 64).
//! It stops at its first objection: a C rule of a peer that declared no
//! policy is a divergence, anything else a failure, unless a release still
//! in flight makes the placement unknowable (a note, no verdict).
//!
//! Deregistration timing (L1) is counted in operations and reported, never
//! failed.

use super::{stop, CaseRun, Finding, Pending, PendingKind, PhysReg, Stop};
use mrcache_model::{Model, Property};
use mrcache_types::{Access, LeaseId, Op, PageSpan, RegView, Ret};

/// A step the models followed.
#[derive(Clone, Debug)]
pub(super) enum Entry {
    Judge(Op, Ret),
    Dereg(u64),
}

fn replay_entry(m: &mut Model, e: &Entry) -> bool {
    match e {
        Entry::Judge(op, ret) => m.judge(op, ret).is_ok(),
        Entry::Dereg(id) => m.observe_deregister(*id).is_ok(),
    }
}

impl CaseRun<'_> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn acquired(
        &mut self,
        id: u64,
        lease: LeaseId,
        span: PageSpan,
        access: Access,
        model_op: &Op,
        p: &Pending,
        pl: usize,
    ) -> Result<(), Stop> {
        let Some(reg) = self.regs.get(&id).cloned() else {
            return Err(stop("protocol", pl, format!("the acquire reply names registration {id}, which no reg event reported")));
        };
        // P3, P1, P2: recorded; the case goes on (the lease is still held).
        if let Some((rule, detail)) = self.physical_acquire_check(id, &reg, span, access, p) {
            self.record_failure(Finding { rule: rule.into(), line: pl, detail });
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

    /// P3 (served by a deregistered registration), P1 and P2 of an acquire
    /// served by `reg`.
    fn physical_acquire_check(
        &self,
        id: u64,
        reg: &PhysReg,
        span: PageSpan,
        access: Access,
        p: &Pending,
    ) -> Option<(&'static str, String)> {
        if reg.deregistered {
            return Some(("P3", format!("acquire served by registration {id} {}, already deregistered", reg.range)));
        }
        // P1
        if !reg.span.contains(&span) || !reg.access.suffices_for(access) {
            return Some((
                "P1",
                format!(
                    "registration {id} {} {} does not cover the request {} with {access}",
                    reg.range,
                    reg.access,
                    span.bytes(self.page)
                ),
            ));
        }
        // P2
        if let Some((ev, _)) = self.events.iter().find(|(s, q)| *q > reg.at && *q <= p.events_at && s.overlaps(&span)) {
            let what = if ev.end == u64::MAX {
                "a fork (the child maps copies)".to_string()
            } else {
                format!("a release of {}", ev.bytes(self.page))
            };
            return Some((
                "P2",
                format!(
                    "acquire served by registration {id} {}, registered before {what} that returned before the acquire began: stale frames",
                    reg.range
                ),
            ));
        }
        None
    }

    pub(super) fn dereg(&mut self, id: u64, line: usize) -> Result<(), Stop> {
        let Some(reg) = self.regs.get(&id).cloned() else {
            self.record_failure(Finding {
                rule: "P4".into(),
                line,
                detail: format!("deregistration of registration {id}, which was never registered"),
            });
            return Ok(());
        };
        if reg.deregistered {
            self.record_failure(Finding {
                rule: "P4".into(),
                line,
                detail: format!("registration {id} {} deregistered a second time", reg.range),
            });
            return Ok(());
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
            self.record_failure(Finding {
                rule: "P3".into(),
                line,
                detail: format!("registration {id} {} deregistered while {} lease(s) on it are held", reg.range, held - releasing),
            });
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
    pub(super) fn judge_model(&mut self, op: &Op, ret: &Ret, line: usize) -> bool {
        self.step_reference(op);
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
        if prop == Property::P2 && self.model_p2_runs_on(&f) {
            return;
        }
        if c_rule && !self.declared {
            self.divergence = Some(f);
        } else if !self.failed_at(line) {
            // (The physical judge's failure on this line is the finding; the
            // model's objection there is its consequence.)
            self.record_failure(f);
        }
    }

    /// A model failure is recorded, not a stop: the physical judge goes on.
    pub(super) fn note_divergence_or_fail(&mut self, _line: usize, _extra: String) -> Result<(), Stop> {
        Ok(())
    }

    /// Confirms buffered deregistrations with the model (P3, P4, C3) and times them (L1).
    pub(super) fn feed_deregs(&mut self) {
        // A destroy in flight: its deregistrations are of the cache it ends
        // (dropped at its reply; fed after it if the cache refused), even
        // if another thread's reply comes first.
        if self.pending.values().any(|p| matches!(p.kind, PendingKind::Lifecycle { create: false })) {
            return;
        }
        for (m, line) in std::mem::take(&mut self.deregs_buffered) {
            if let Some((since_op, since_line)) = self.l1_since.remove(&m) {
                let lag = self.ops_done.saturating_sub(since_op);
                self.l1_judge_lag(m, lag, since_line, line);
                if lag > 0 && self.l1_worst.as_ref().is_none_or(|(w, _)| lag > *w) {
                    self.l1_worst =
                        Some((lag, format!("R{m}: due at case line {since_line}, deregistered {lag} op(s) later (case line {line})")));
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

    pub(super) fn track_l1(&mut self, line: usize) {
        let Some(model) = self.models.first() else { return };
        for v in model.pending_deregistrations() {
            self.l1_since.entry(v.id).or_insert((self.ops_done, line));
        }
    }

    pub(super) fn l1_summary(&self) -> String {
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
