//! Counterexamples: a readable timeline, the violated property's details, and
//! a JSON trace in the project format (spec.md#T) that `mrcache replay` reads.

use crate::algo::{Action, AlgoModel, Rec, RecEvent};
use crate::props;
use crate::state::{reg_line, State};
use mrcache_model::Model as RefModel;
use mrcache_types::trace::{Header, Record, Trace};
use mrcache_types::{Op, Ret};
use stateright::Path;

/// One replayed step: who moved, what it did, and the state after.
#[derive(Clone, Debug)]
pub struct ReplayStep {
    pub label: String,
    pub notes: Vec<String>,
    pub events: Vec<RecEvent>,
    pub after: State,
}

/// Re-runs `actions` from the initial state, recording every step.
pub fn replay(model: &AlgoModel, actions: &[Action]) -> (State, Vec<ReplayStep>) {
    let init = model.init_state();
    let mut s = init.clone();
    let mut steps = Vec::new();
    for &a in actions {
        let label = model.label(&s, a);
        let mut rec = Rec::default();
        model.step(&mut s, a, Some(&mut rec));
        steps.push(ReplayStep { label, notes: rec.notes, events: rec.events, after: s.clone() });
    }
    (init, steps)
}

/// The actions of a stateright path.
pub fn path_actions(path: &Path<State, Action>) -> Vec<Action> {
    path.clone().into_actions()
}

/// Completed operations in the order they returned: (thread, nested, op, ret).
fn completed(steps: &[ReplayStep]) -> Vec<(u8, bool, Op, Ret)> {
    steps.iter().flat_map(|s| s.events.iter()).filter_map(|e| e.ret.map(|r| (e.thread, e.nested, e.op, r))).collect()
}

/// Why `property` fails in the last state of the replayed `steps`.
pub fn violation_detail(model: &AlgoModel, init: &State, steps: &[ReplayStep], property: &str) -> String {
    let s = steps.last().map(|s| &s.after).unwrap_or(init);
    match property {
        props::P1 | props::P2 => s
            .bad
            .iter()
            .find(|b| b.property == property)
            .map(|b| {
                // The registration is in the granted thread's cache.
                let c = model.cache_of(b.thread as usize);
                let r = &s.seen_from_cache(c).regs[b.handle as usize];
                let on = if s.others.is_empty() { format!("#{}", b.handle) } else { format!("cache {c}'s #{}", b.handle) };
                if property == props::P1 {
                    format!(
                        "T{} was granted L{} on {on} ({}), which does not cover the request with its access",
                        b.thread,
                        b.lease,
                        reg_line(b.handle, r)
                    )
                } else {
                    format!(
                        "T{} was granted L{} on {on} ({}): it pinned generation {} of page {}, but a release event \
                         that completed before the acquire was invoked had installed generation {}",
                        b.thread,
                        b.lease,
                        reg_line(b.handle, r),
                        b.pinned,
                        b.page,
                        b.needed
                    )
                }
            })
            .unwrap_or_default(),
        props::P3 | props::P4 if !s.others.is_empty() => (0..=s.others.len())
            .find_map(|c| {
                let mut v = s.seen_from_cache(c).into_owned();
                v.others.clear();
                let last = ReplayStep { label: String::new(), notes: Vec::new(), events: Vec::new(), after: v };
                let d = violation_detail(model, init, std::slice::from_ref(&last), property);
                (!d.is_empty()).then(|| format!("cache {c}: {d}"))
            })
            .unwrap_or_default(),
        props::P3 => s
            .regs
            .iter()
            .enumerate()
            .find(|(h, r)| r.deregs > 0 && (r.leases > 0 || (s.others.is_empty() && s.lease_held_on(*h as u8))))
            .map(|(h, r)| {
                // The leases the threads hold on it (lane leases are on no
                // state word; a count that lost a lease reads 0 under one).
                let held: Vec<String> = s
                    .threads
                    .iter()
                    .enumerate()
                    .flat_map(|(t, th)| {
                        th.held.iter().filter(|(_, x)| *x == h as u8).map(move |(l, _)| {
                            let lane = th.lane_leases.iter().any(|(y, _, _)| y == l);
                            format!("T{t}'s {}lease L{l}", if lane { "lane " } else { "" })
                        })
                    })
                    .collect();
                let held = if held.is_empty() { String::new() } else { format!(" ({} held)", held.join(", ")) };
                format!("registration {} was deregistered while its state word counts {} lease(s){held}", reg_line(h as u8, r), r.leases)
            })
            .unwrap_or_default(),
        props::P4 => s
            .regs
            .iter()
            .enumerate()
            .find(|(_, r)| r.deregs > 1)
            .map(|(h, r)| format!("registration {} was deregistered {} times", reg_line(h as u8, r), r.deregs))
            .unwrap_or_default(),
        props::P5 => format!(
            "no operation is in flight, the cache holds {} findable entries{} and an unleased one could be evicted",
            s.findable_count(),
            model.cfg.max_regions.map(|m| format!(" (max_regions {m})")).unwrap_or_default()
        ),
        props::P6 => model.deadlock(s).unwrap_or_default(),
        props::L1 => model.l1_failure(s).unwrap_or_default(),
        props::LINEARIZABLE => explain_linearizability(model, steps),
        _ => String::new(),
    }
}

/// No order of the history satisfies the model; judging the operations in the
/// order they returned names the first rule that order breaks.
pub fn explain_linearizability(model: &AlgoModel, steps: &[ReplayStep]) -> String {
    let mut reference = RefModel::new(model.cfg.model_config()).concurrent().trims_logged();
    for (t, nested, op, ret) in completed(steps) {
        if let Err(v) = reference.judge(&op, &ret) {
            let who = if nested { format!("T{t} (nested)") } else { crate::state::actor_name(t) };
            return format!("no linearization exists; in return order, {who} `{op}` -> `{ret}`: {v}");
        }
    }
    "no linearization exists (the history in return order is accepted; the violation needs the real-time order)".into()
}

/// A readable timeline of a counterexample path.
pub fn timeline(model: &AlgoModel, actions: &[Action], property: &str) -> String {
    let (init, steps) = replay(model, actions);
    let mut out = String::new();
    out += &format!("counterexample to `{property}`\n");
    out += &format!("config: {}\n", model.cfg.describe());
    for (t, script) in model.scripts.iter().enumerate() {
        let ops: Vec<String> = script.iter().map(|(op, _)| op.to_string()).collect();
        out += &format!("script T{t}: {}\n", ops.join("; "));
    }
    out += &format!("initial: {}", init.summary());
    for (i, st) in steps.iter().enumerate() {
        out += &format!("step {:>3}  {}\n", i + 1, st.label);
        for n in &st.notes {
            out += &format!("           {n}\n");
        }
        for line in st.after.summary().lines() {
            out += &format!("           | {line}\n");
        }
    }
    let id = props::spec_id(property);
    out += &format!(
        "VIOLATED: {property}{}\n  {}\n",
        if id.is_empty() { String::new() } else { format!(" (spec.md#{id})") },
        violation_detail(model, &init, &steps, property)
    );
    out
}

/// The counterexample as a trace: one record per operation, in the order the
/// operations returned (`t` is the step at which each returned; `expect` the
/// observed outcome); operations still in flight at the violation come last,
/// without `expect`. Release events raised inside a cache operation (by the
/// registrar or the cache itself) carry the raising thread and `in_mpi: true`.
pub fn counterexample_trace_of(model: &AlgoModel, actions: &[Action], property: &str) -> Trace {
    let (_, steps) = replay(model, actions);
    let mut header = Header::new("checker");
    header.concurrent = true;
    let id = props::spec_id(property);
    header.description = Some(format!(
        "model-checker counterexample: `{property}`{} is violated; {}",
        if id.is_empty() { String::new() } else { format!(" (spec.md#{id})") },
        model.cfg.describe()
    ));
    let mut limits = String::new();
    if let Some(m) = model.cfg.max_regions {
        limits += &format!(" --max-regions {m}");
    }
    if let Some(m) = model.cfg.max_pinned_bytes {
        limits += &format!(" --max-pinned-bytes {m}");
    }
    if !limits.is_empty() {
        // The header has no field for limits: say how to replay.
        let d = header.description.take().unwrap_or_default();
        header.description = Some(format!("{d}; replay with{limits}"));
    }
    header.policy_hint = Some(model.cfg.policy.name().replace('-', "_"));
    header.program = Some("mrcache-checker".into());
    let mut records = Vec::new();
    let mut open: Vec<(u8, bool, Op)> = Vec::new();
    for (i, st) in steps.iter().enumerate() {
        for e in &st.events {
            match e.ret {
                None => open.push((e.thread, e.nested, e.op)),
                Some(ret) => {
                    if let Some(k) = open.iter().position(|(t, n, _)| *t == e.thread && *n == e.nested) {
                        open.remove(k);
                    }
                    records.push(Record {
                        t: Some(i as u64 + 1),
                        rank: 0,
                        thread: e.thread as u32,
                        in_mpi: e.nested,
                        op: e.op,
                        expect: Some(ret),
                    });
                }
            }
        }
    }
    for (thread, nested, op) in open {
        records.push(Record { t: None, rank: 0, thread: thread as u32, in_mpi: nested, op, expect: None });
    }
    let mut text = serde_json::to_string(&header).expect("header serialises");
    for r in &records {
        text.push('\n');
        text += &serde_json::to_string(r).expect("record serialises");
    }
    Trace::parse("checker counterexample", &text).unwrap_or_else(|e| panic!("the checker wrote an invalid trace: {e}\n{text}"))
}

/// [`counterexample_trace_of`] for a stateright path.
pub fn counterexample_trace(model: &AlgoModel, path: &Path<State, Action>, property: &str) -> Trace {
    counterexample_trace_of(model, &path_actions(path), property)
}
