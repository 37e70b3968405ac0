//! Scratch tool: explains why the model rejects a rendered history
//! (`History::render`, as in a linearizability failure message).
//!
//! `MRCACHE_LIN_EXPLAIN=/path/to/failure.txt cargo test -p mrcache --test
//! lin_explain -- --nocapture` parses the history and searches every
//! linearization with the model's judge (a depth-first search memoized on
//! the model's state), then prints how far the deepest orders got, the
//! judge's objections there, and the model's state before each objection.

use mrcache::types::{Access, Op, OpError, RegView, ReleaseKind, Ret};
use mrcache::{Config, EvictionPolicy, Limits, OverlapPolicy};
use mrcache_model::Model;
use std::collections::HashSet;

#[derive(Clone, Copy, Debug)]
enum Ev {
    Invoke { thread: u32, op: Op },
    Return { thread: u32, ret: Ret },
}

fn hex(s: &str) -> u64 {
    u64::from_str_radix(s.trim().trim_start_matches("0x"), 16).unwrap_or_else(|_| panic!("hex {s}"))
}

fn addr_len(s: &str) -> (u64, u64) {
    let (a, l) = s.split_once('+').expect("addr+len");
    (hex(a), hex(l))
}

fn parse_op(s: &str) -> Op {
    let w: Vec<&str> = s.split_whitespace().collect();
    match w[0] {
        "acquire" => {
            let (addr, len) = addr_len(w[2]);
            Op::Acquire { lease: w[1][1..].parse().unwrap(), addr, len, access: w[3].parse::<Access>().unwrap() }
        }
        "release" => Op::Release { lease: w[1][1..].parse().unwrap() },
        "trim" => Op::Trim,
        "flush" => Op::Flush,
        "alloc" => {
            let (addr, len) = addr_len(w[1]);
            Op::Alloc { addr, len }
        }
        kind => {
            let kind = ReleaseKind::ALL.into_iter().find(|k| format!("{k:?}") == kind).unwrap_or_else(|| panic!("op {s}"));
            let (addr, len) = addr_len(w[1]);
            Op::ReleaseEvent { kind, addr, len }
        }
    }
}

fn parse_ret(s: &str) -> Ret {
    let s = s.trim();
    if s == "done" {
        return Ret::Done;
    }
    if let Some(e) = s.strip_prefix("error: ") {
        let error = if e.starts_with("E1") {
            OpError::EmptyRange
        } else if e.starts_with("E4") {
            OpError::UnknownLease { lease: e.split_whitespace().nth(2).unwrap()[1..].parse().unwrap() }
        } else if e.starts_with("E6") {
            OpError::RetriesExhausted
        } else {
            panic!("error {e}")
        };
        return Ret::Failed { error };
    }
    let pressure = s.contains("(after pressure eviction)");
    let w: Vec<&str> = s.split_whitespace().collect();
    let hit = w[0] == "hit";
    let id = w[1][1..].parse().unwrap();
    let (a, b) = w[2].trim_start_matches('[').trim_end_matches(')').split_once(',').unwrap();
    let (addr, end) = (hex(a), hex(b));
    Ret::Granted { reg: RegView { id, addr, len: end - addr, access: w[3].parse().unwrap() }, hit, pressure }
}

fn parse(text: &str) -> (Config, Vec<Ev>) {
    let mut config = None;
    let mut evs = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("seed ") {
            // seed 0x.., merge / CostAware / chunk 2 / max_regions Some(3) / max_pinned_bytes Some(24576)
            let desc = rest.split_once(", ").unwrap().1;
            let parts: Vec<&str> = desc.split(" / ").map(str::trim).collect();
            let policy: OverlapPolicy = parts[0].parse().unwrap();
            let eviction = if parts[1] == "CostAware" { EvictionPolicy::CostAware } else { EvictionPolicy::Lru };
            let num = |p: &str| -> Option<u64> { p.split_once("Some(").map(|(_, n)| n.trim_end_matches(')').parse().unwrap()) };
            let chunk_pages = parts[2].trim_start_matches("chunk ").parse().unwrap();
            config = Some(Config {
                policy,
                eviction,
                chunk_pages,
                limits: Limits { max_regions: num(parts[3]), max_pinned_bytes: num(parts[4]), max_unreleased: Some(4) },
                ..Config::default()
            });
            continue;
        }
        let Some(rest) = t.strip_prefix('T') else { continue };
        let (th, rest) = rest.split_once(' ').unwrap();
        let thread: u32 = th.parse().unwrap();
        if let Some(op) = rest.strip_prefix("invoke ") {
            evs.push(Ev::Invoke { thread, op: parse_op(op) });
        } else if let Some(ret) = rest.strip_prefix("return ") {
            evs.push(Ev::Return { thread, ret: parse_ret(ret) });
        }
    }
    (config.expect("no header"), evs)
}

#[derive(Clone, Debug)]
struct OpRec {
    thread: u32,
    op: Op,
    ret: Option<Ret>,
    ret_pos: Option<usize>,
    inv_pos: usize,
}

struct Search {
    ops: Vec<OpRec>,
    /// Event index -> op index.
    ev_op: Vec<usize>,
    visited: HashSet<(usize, u64, Model)>,
    deepest: usize,
    /// At the deepest position: (path, op, objection, model before).
    objections: Vec<(Vec<usize>, usize, String, String)>,
    found: Option<Vec<usize>>,
}

impl Search {
    fn dfs(&mut self, pos: usize, done: u64, model: Model, path: &mut Vec<usize>) {
        if self.found.is_some() || !self.visited.insert((pos, done, model.clone())) {
            return;
        }
        if pos == self.ev_op.len() {
            self.found = Some(path.clone());
            return;
        }
        let o = self.ev_op[pos];
        let is_return = self.ops[o].ret_pos == Some(pos);
        // Advance past this event if allowed.
        if !is_return || done & (1 << o) != 0 {
            self.dfs(pos + 1, done, model.clone(), path);
        }
        // Or linearize some op invoked before `pos`, not done, with a return.
        for i in 0..self.ops.len() {
            let r = &self.ops[i];
            if r.inv_pos >= pos || done & (1 << i) != 0 {
                continue;
            }
            let Some(ret) = r.ret else { continue }; // pending: never linearized
            let mut m = model.clone();
            match m.judge(&r.op, &ret) {
                Ok(()) => {
                    path.push(i);
                    self.dfs(pos, done | (1 << i), m, path);
                    path.pop();
                }
                Err(v) => {
                    if pos > self.deepest {
                        self.deepest = pos;
                        self.objections.clear();
                    }
                    if pos == self.deepest && self.objections.len() < 40 {
                        self.objections.push((path.clone(), i, format!("{:?}: {}", v.property, v.detail), describe(&model)));
                    }
                }
            }
        }
    }
}

fn describe(m: &Model) -> String {
    let mut s = String::new();
    for r in m.registrations() {
        s += &format!(
            "    R{} pages [{},{}) {} findable={} leases={} prio={} last_use={}\n",
            r.id, r.span.first, r.span.end, r.access, r.findable, r.leases, r.priority, r.last_use
        );
    }
    s
}

#[test]
fn explain() {
    let Ok(path) = std::env::var("MRCACHE_LIN_EXPLAIN") else {
        eprintln!("set MRCACHE_LIN_EXPLAIN to a rendered history");
        return;
    };
    let text = std::fs::read_to_string(&path).unwrap();
    let (config, evs) = parse(&text);
    let mut ops: Vec<OpRec> = Vec::new();
    let mut ev_op = Vec::new();
    let mut open: std::collections::HashMap<u32, usize> = Default::default();
    for (pos, e) in evs.iter().enumerate() {
        match *e {
            Ev::Invoke { thread, op } => {
                open.insert(thread, ops.len());
                ev_op.push(ops.len());
                ops.push(OpRec { thread, op, ret: None, ret_pos: None, inv_pos: pos });
            }
            Ev::Return { thread, ret } => {
                let i = open.remove(&thread).expect("return without invoke");
                ops[i].ret = Some(ret);
                ops[i].ret_pos = Some(pos);
                ev_op.push(i);
            }
        }
    }
    let mut s = Search { ops, ev_op, visited: HashSet::new(), deepest: 0, objections: Vec::new(), found: None };
    let model = Model::new(config).concurrent().trims_logged();
    s.dfs(0, 0, model, &mut Vec::new());
    let name = |s: &Search, i: usize| {
        format!("T{} {} -> {}", s.ops[i].thread, s.ops[i].op, s.ops[i].ret.map_or("pending".into(), |r| r.to_string()))
    };
    if let Some(p) = &s.found {
        eprintln!("LINEARIZABLE:");
        for &i in p {
            eprintln!("  {}", name(&s, i));
        }
        return;
    }
    let deepest = s.deepest;
    eprintln!("not linearizable; deepest event reached: {} ({:?})", deepest, evs[deepest]);
    for (p, i, why, m) in &s.objections {
        eprintln!("--- order:");
        for &j in p {
            eprintln!("  {}", name(&s, j));
        }
        eprintln!("  REJECTED {}\n    {}\n  model before:\n{}", name(&s, *i), why, m);
    }
}
