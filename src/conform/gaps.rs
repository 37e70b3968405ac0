//! The protocol gaps closed in the runner (arena, data checks, deferred
//! deregistration, reporting after a failure), kept apart from the judges they
//! extend:
//!
//! - every failure of a case is recorded and the physical judge (P1–P4) goes
//!   on to the end of the case after a C-rule or property failure
//!   ([`CaseRun::record_failure`]);
//! - a case asks for its arena (header `arena`, sent as `config.arena_len`
//!   in the hello); an adapter maps that much or answers the hello with
//!   `unsupported` ([`hello_unsupported`], [`arena_too_small`]);
//! - a cache that widens registrations to chunks declares `chunk_size` in
//!   its hello and the model widens its misses alike ([`hello_chunk_size`]);
//! - deferred deregistration: an adapter with the `query` capability is
//!   asked, whenever no command is in flight, for the registrations it holds
//!   and their bytes; the answer must match its `reg`/`dereg` events, and
//!   what it holds beyond the model (deregistrations it still owes) must stay
//!   within the `l1_bound` its hello declares, as must the number of
//!   operations by which a deregistration comes late (`L1`);
//! - wasted work: the registrations the adapter made beyond those the model
//!   makes for the same case ([`CaseRun::efficiency`]), reported, not failed.

use super::case::field_u64;
use super::hello::Hello;
use super::{Case, CaseResult, CaseRun, Finding, PendingKind, Stop};
use mrcache_model::{Config, Model};
use mrcache_types::Op;
use serde_json::{json, Map, Value};

/// The bound on deferred deregistration an adapter declares in its hello
/// (`l1_bound`); `None`: unbounded (reported, not judged).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct L1Bound {
    /// Operations by which a deregistration may come after the model's.
    pub(super) ops: Option<u64>,
    /// Registrations it may hold beyond the model's (owed deregistrations).
    pub(super) registrations: Option<u64>,
    /// Their bytes.
    pub(super) bytes: Option<u64>,
}

/// What the gap checks keep for one case.
pub(super) struct GapState {
    /// The model alone under the judged policy (wasted work).
    reference: Option<Model>,
    /// Whether to send `query` (the `query` capability, until `unsupported`).
    query: bool,
    bound: L1Bound,
    /// Whether the model runs under the policy the adapter declared (else
    /// what it holds says nothing of what the adapter owes).
    own_policy: bool,
    /// Registrations reported before the last fork (a fork child forgot them).
    forgotten_below: u64,
    /// Registrations the reference model made before the cache was last
    /// destroyed.
    required_before: u64,
}

impl GapState {
    pub(super) fn new(config: Config, hello: &Hello) -> GapState {
        GapState {
            own_policy: hello.policy == Some(config.policy),
            reference: Some(Model::new(config)),
            query: hello.caps.iter().any(|c| c == "query"),
            bound: hello.l1_bound,
            forgotten_below: 0,
            required_before: 0,
        }
    }
}

impl CaseRun<'_> {
    /// Steps the reference model (wasted work) with an operation the judges
    /// see, in the order they see them.
    pub(super) fn step_reference(&mut self, op: &Op) {
        if let Some(m) = self.gaps.reference.as_mut() {
            // A registration the adapter made in the child of a fork is not
            // one it wasted: the model forgets at the fork too.
            m.step(op);
        }
        if *op == Op::Fork {
            self.gaps.forgotten_below = self.reg_order;
        }
    }

    /// The cache was destroyed: the reference model starts anew too; what
    /// it made before is kept in the count of registrations it required.
    pub(super) fn gaps_destroyed(&mut self) {
        if let Some(m) = self.gaps.reference.as_mut() {
            self.gaps.required_before += m.stats().registrations;
            *m = Model::new(m.config);
        }
    }

    /// Fills in the efficiency columns of a case's result.
    pub(super) fn efficiency(&self, r: &mut CaseResult) {
        r.registrations = self.reg_order;
        r.required = self.gaps.required_before + self.gaps.reference.as_ref().map_or(0, |m| m.stats().registrations);
        r.extra = r.registrations.saturating_sub(r.required);
    }

    /// `L1` against the declared bound: a deregistration `lag` operations
    /// after the model's.
    pub(super) fn l1_judge_lag(&mut self, m: u64, lag: usize, since_line: usize, line: usize) {
        if let Some(k) = self.gaps.bound.ops.filter(|k| lag as u64 > *k && self.gaps.own_policy) {
            self.record_failure(Finding {
                rule: "L1".into(),
                line,
                detail: format!(
                    "R{m}: due at case line {since_line}, deregistered {lag} operation(s) later; the hello's l1_bound.ops is {k}"
                ),
            });
        }
    }

    /// `L1` at the end of the case: a deregistration still owed, longer than
    /// the declared bound.
    pub(super) fn l1_judge_end(&mut self) {
        let Some(k) = self.gaps.bound.ops else { return };
        if self.models.is_empty() || !self.gaps.own_policy {
            return;
        }
        let mut owed: Vec<(u64, usize, usize)> = self.l1_since.iter().map(|(m, (op, l))| (*m, *op, *l)).collect();
        owed.sort();
        for (m, since_op, since_line) in owed {
            let lag = self.ops_done.saturating_sub(since_op);
            if lag as u64 > k {
                self.record_failure(Finding {
                    rule: "L1".into(),
                    line: since_line,
                    detail: format!(
                        "R{m}: due at case line {since_line}, never deregistered in the {lag} operation(s) to the end; the hello's l1_bound.ops is {k}"
                    ),
                });
            }
        }
    }

    /// Sends `query` when no command is in flight (and the adapter has the
    /// capability) and waits for its answer.
    pub(super) fn query_if_quiet(&mut self, line: usize) -> Result<(), Stop> {
        if !self.gaps.query || !self.pending.is_empty() {
            return Ok(());
        }
        self.seq += 1;
        let seq = self.seq;
        let cmd = json!({"seq": seq, "cmd": "query", "thread": 0});
        self.send_and_track(&cmd, line, 0, PendingKind::Query, false)?;
        self.wait_for(seq, line, false)
    }

    /// The answer to `query`: `registrations` and `pinned_bytes` must match
    /// the adapter's own `reg`/`dereg` events (since its last fork), and
    /// what it holds beyond the model must be within `l1_bound`.
    pub(super) fn query_answered(&mut self, o: &Map<String, Value>, line: usize) -> Result<(), Stop> {
        let at = format!("case line {line}: the reply to `query`");
        if o.get("ok") != Some(&Value::Bool(true)) {
            if o.get("unsupported").and_then(Value::as_bool) == Some(true) {
                self.gaps.query = false;
                self.ad.note(format!("  (case line {line}: `query` unsupported; not asked again)"));
                return Ok(());
            }
            let e = o.get("error").and_then(Value::as_str).unwrap_or("(no error text)");
            return Err(super::stop("protocol", line, format!("{at} failed: {e}")));
        }
        let get = |k: &str| -> Result<u64, Stop> {
            field_u64(o, k, &at)
                .map_err(|e| super::stop("protocol", line, e.to_string()))?
                .ok_or_else(|| super::stop("protocol", line, format!("{at} needs `{k}`")))
        };
        let (regs, bytes) = (get("registrations")?, get("pinned_bytes")?);
        let live: Vec<u64> =
            self.regs.values().filter(|r| !r.deregistered && r.order > self.gaps.forgotten_below).map(|r| r.range.len).collect();
        let (ev_regs, ev_bytes) = (live.len() as u64, live.iter().sum::<u64>());
        if (regs, bytes) != (ev_regs, ev_bytes) {
            self.record_failure(Finding {
                rule: "protocol".into(),
                line,
                detail: format!(
                    "{at}: it holds {regs} registration(s) of {bytes} bytes; its reg/dereg events say {ev_regs} of {ev_bytes} bytes"
                ),
            });
            return Ok(());
        }
        let Some(model) = self.models.first().filter(|_| self.gaps.own_policy) else { return Ok(()) };
        let (m_regs, m_bytes) = model.registrations().fold((0u64, 0u64), |(n, b), r| (n + 1, b + model.view(r).len));
        let (over_regs, over_bytes) = (regs.saturating_sub(m_regs), bytes.saturating_sub(m_bytes));
        let b = self.gaps.bound;
        let too_many = b.registrations.is_some_and(|k| over_regs > k);
        let too_big = b.bytes.is_some_and(|k| over_bytes > k);
        if too_many || too_big {
            self.record_failure(Finding {
                rule: "L1".into(),
                line,
                detail: format!(
                    "after case line {line} the adapter holds {regs} registration(s) of {bytes} bytes, the model {m_regs} of {m_bytes}: \
                     {over_regs} ({over_bytes} bytes) owed, beyond the hello's l1_bound (registrations {}, bytes {})",
                    b.registrations.map_or("unbounded".into(), |k| k.to_string()),
                    b.bytes.map_or("unbounded".into(), |k| k.to_string())
                ),
            });
        }
        Ok(())
    }

    /// Records a failure and lets the case go on. The first one is the
    /// case's verdict; a later one at the same line and rule is the same
    /// finding seen twice and is dropped. The transcript is kept as it was
    /// at the first failure.
    pub(super) fn record_failure(&mut self, f: Finding) {
        if self.failures.iter().any(|g| g.line == f.line && g.rule == f.rule) {
            return;
        }
        if self.failure.is_none() {
            self.failure = Some(f.clone());
            self.failure_transcript = Some(self.ad.transcript.clone());
        }
        self.failures.push(f);
    }

    /// Whether the physical judge already failed something on this case line
    /// (the model's objection there is a consequence, not a new finding).
    pub(super) fn failed_at(&self, line: usize) -> bool {
        self.failures.iter().any(|g| g.line == line)
    }
}

/// A hello answered `{"ok": false, "unsupported": true}`: the adapter cannot
/// run this case (say, it cannot map the arena the case asks for).
pub(super) fn hello_unsupported(v: &Value) -> Option<String> {
    let o = v.as_object()?;
    if o.get("ok") != Some(&Value::Bool(false)) || o.get("unsupported").and_then(Value::as_bool) != Some(true) {
        return None;
    }
    let why = o.get("error").and_then(Value::as_str).unwrap_or("(no reason given)");
    Some(format!("the adapter does not support this case: {why}"))
}

/// The case asked for more arena than the adapter offers (it should have
/// answered `unsupported`).
pub(super) fn arena_too_small(case: &Case, hello: &Hello) -> Option<String> {
    (hello.arena.len < case.arena).then(|| {
        format!(
            "hello: field `arena`: the case asks for an arena of {:#x} bytes (config.arena_len) and the adapter offers {:#x}: \
             map at least that much or answer the hello with `\"unsupported\": true`",
            case.arena, hello.arena.len
        )
    })
}

/// The hello's `chunk_size`: absent or null, one page; else a power of two
/// that is a multiple of `page_size`, at most 2^30.
pub(super) fn hello_chunk_size(o: &Map<String, Value>, page_size: u64, at: &str) -> Result<u64, String> {
    let c = match o.get("chunk_size") {
        None | Some(Value::Null) => return Ok(page_size),
        Some(Value::Number(n)) => n.as_u64().ok_or_else(|| format!("{at}: field `chunk_size`: {n} is not an unsigned integer"))?,
        Some(x) => return Err(format!("{at}: field `chunk_size`: expected a number of bytes, found {x}")),
    };
    if !c.is_power_of_two() || c < page_size || c > 1 << 30 {
        return Err(format!("{at}: field `chunk_size`: {c} must be a power of two from page_size ({page_size}) to 2^30"));
    }
    Ok(c)
}

/// The hello's `l1_bound`: absent or null, unbounded; else an object with
/// `ops`, `registrations`, `bytes` (each a number, or null: unbounded).
pub(super) fn hello_l1_bound(o: &Map<String, Value>, at: &str) -> Result<L1Bound, String> {
    match o.get("l1_bound") {
        None | Some(Value::Null) => Ok(L1Bound::default()),
        Some(Value::Object(b)) => {
            if let Some(k) = b.keys().find(|k| !["ops", "registrations", "bytes"].contains(&k.as_str())) {
                return Err(format!("{at}: field `l1_bound`: unknown field `{k}` (expected ops, registrations, bytes)"));
            }
            let f = |k: &str| field_u64(b, k, &format!("{at}: field `l1_bound`")).map_err(|e| e.to_string());
            Ok(L1Bound { ops: f("ops")?, registrations: f("registrations")?, bytes: f("bytes")? })
        }
        Some(x) => Err(format!("{at}: field `l1_bound`: expected an object {{ops, registrations, bytes}}, found {x}")),
    }
}
