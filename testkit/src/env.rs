//! The sequential differential harness: `Environment { cache, model }`.
//!
//! Every [`Op`] goes to the cache ([`Apply::apply`]); its outcome is judged by
//! the reference model ([`Model::judge`], which follows it when the contract
//! allows it). After every op the environment also compares, exactly:
//!
//! - the registrations the cache made (from the [`TestRegistrar`] log: range,
//!   access, and the id the lease reports) with the model's `Register`
//!   effects;
//! - every deregistration the registrar saw, through
//!   [`Model::observe_deregister`] (P3, P4, C3), and that no handle is
//!   deregistered twice; registrations made and dropped without an id (A7)
//!   must be deregistered within the same op;
//! - [`Model::check_quiescent`]: everything the model deregistered was
//!   deregistered by the cache before the op returned (L1, sequential form);
//! - the [`Stats`] of both, field by field, and the findable entries (ids);
//! - with `strict`, the outcome equals the model's canonical one
//!   ([`Model::step`]) unless a registrar failure was injected in the op.
//!
//! [`Environment::finish`] releases every lease, flushes, and verifies both
//! directions: the model holds no registration and no lease, the cache pins
//! nothing and caches nothing, and every registration the registrar made was
//! deregistered exactly once except those a fork forgot (which the model
//! counts in `forgotten`).
//!
//! # What the judge lets the cache choose (spec.md#S9), and why
//!
//! | divergence | allowed because |
//! |---|---|
//! | which covering findable entry serves a hit | S2.1: any covering entry is correct (P1, P2); the cache takes the lowest id, so `strict` runs see none |
//! | `pressure = true` on a miss | S5.4: the registrar failed with ENOMEM/EAGAIN first; only the registrar knows |
//! | E5 on a miss, with `pressure` saying whether the eviction + retry happened | S5.4: registrar failures are the environment's, not the cache's |
//! | E6 on a miss | only with [`Model::concurrent`] (S9): needs a release event during every one of `max_retries` attempts ([`Environment::concurrent_model`]) |
//! | deregistration timing | S2.7: not in `Ret`; sequentially bounded by L1 (`check_quiescent` after each op) |
//! | registrations without an id (A7, A8) | S1.3: never cached, never returned; deregistered in the same op (checked) |
//! | a release event raised inside `register` | linearized *before* the acquire during which it was raised: A6 applies it before A7 decides, so the acquire's outcome is the one of "event, then acquire". If the acquire had already made a pressure eviction (S5.4), entries it evicted that the event covers are `pressure_evictions` in the cache and `invalidations` in the model: that difference in the counters is allowed, nothing else |
//! | handles forgotten by a fork | S2.6: never deregistered (the parent owns them); counted in `forgotten` |
//!
//! Everything else must match exactly.
//!
//! # One environment, model memory or real memory
//!
//! The same judge serves the fuzzers and tests (`mrcache fuzz`,
//! impl/tests) and the replay of traces (`mrcache replay --engine impl`).
//! What replay needs is an explicit option here, each with its reason:
//!
//! | option | what changes | why |
//! |---|---|---|
//! | any [`Registrar`], e.g. io_uring, wrapped in the logging [`TestRegistrar`] | nothing in the judge | deregistrations are matched to ids by the registrar's serials, whatever pins the pages |
//! | [`Environment::real_memory`] ([`RealMemory`], spec.md#T4) | each op is relocated into an arena before it reaches the cache; outcomes and registered ranges are moved back before judging; a `release_event` is performed for real (`mmap(MAP_FIXED)` of fresh pages), then passed to the cache with [`Cache::invalidate`] under [`Monitoring::Explicit`] and not at all under [`Monitoring::Userfaultfd`], where the kernel reports it | the model and the records keep the trace's coordinates, so a divergence names the trace's addresses; relocation keeps page and chunk alignment, so nothing else differs |
//! | a cache monitored by userfaultfd ([`Monitoring::Userfaultfd`], its `MonitorThread` started by the caller) | [`Model::check_quiescent`], the stats and the findable entries are not compared after each op; outcomes, registrations and every deregistration ([`Model::observe_deregister`]) still are | the monitor thread applies an event inside its round, but performs the round's deregistrations (and counts them) after its unlock, possibly after the op that raised the event returned: L1 holds only eventually there, and the counters are read mid-round |
//! | [`Environment::keep_records`]`(false)` | no [`Record`] is kept | a recorded trace has millions of records; replay reports the trace's own line instead of a record |
//! | [`Environment::finish_with`]`(`[`Ending::AsRecorded`]`)` | leases still held are dropped unjudged; no flush, no check of either direction | a trace ends where the recording stopped: its end state (entries cached, registrations pinned) is the result replay reports, and the model's replay of the same trace ([`Model::step`] alone) is not flushed either; the caller reads the stats once its monitor thread is joined |
//!
//! [`Environment::finish`] is [`Ending::Drain`]: every lease released
//! through the judge, a flush, both directions verified.

// A divergence is the rare, final outcome of a run; keeping it unboxed keeps
// its fields easy to match on in tests.
#![allow(clippy::result_large_err)]

mod real;

pub use real::RealMemory;

use mrcache::registrar::Registrar;
use mrcache::{Cache, Lease, Monitoring};
use mrcache_model::{Config, Effect, EvictionPolicy, Limits, Model, OverlapPolicy};
use mrcache_types::trace::{Header, Record, Trace};
use mrcache_types::{LeaseId, Op, OpError, RegView, ReleaseKind, Ret, Stats};
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, Weak};

use super::registrar::{errno_of, Call, TestRegistrar};
use crate::Apply;

/// The first disagreement between the cache and the contract.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Divergence {
    /// Index of the op in the environment's records.
    pub index: usize,
    pub op: Op,
    pub observed: Ret,
    /// The model's canonical outcome for the op.
    pub canonical: Ret,
    /// The rule broken, in words (starts with the property when the judge
    /// named one: `P2 ...`).
    pub message: String,
    /// Which check failed.
    pub check: Check,
}

/// Which check of the environment a [`Divergence`] comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// [`Model::judge`] rejected the outcome (`message` is the judge's).
    Outcome,
    /// The outcome is allowed but not the one asked for: `strict`'s
    /// canonical outcome, or a replayed trace's `expect`.
    Expectation,
    /// Registrations, deregistrations ([`Model::observe_deregister`]),
    /// quiescence ([`Model::check_quiescent`]), stats or findable entries
    /// after an op, or the end state ([`Environment::finish`]).
    Effects,
    /// The environment could not perform the op on real memory (an address
    /// outside the relocation plan, a failed remap): not the cache's doing.
    Harness,
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "op #{} `{}`: observed `{}`, contract's canonical `{}`: {}",
            self.index, self.op, self.observed, self.canonical, self.message
        )
    }
}

impl std::error::Error for Divergence {}

/// What [`Environment::finish`] verified.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub ops: usize,
    pub stats: Stats,
    /// Registrations made without an id and deregistered at once (A7, A8).
    pub discarded: u64,
    /// Registrar failures injected.
    pub injected_failures: u64,
}

/// How [`Environment::finish_with`] ends a run (module docs, "One
/// environment").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// Release every lease through the judge, flush, verify both directions.
    Drain,
    /// Drop the leases still held, unjudged, and check nothing more: the end
    /// of a replayed trace.
    AsRecorded,
}

/// A release event a hook raises from inside the next `register` call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HookEvent {
    /// First page of the event, counted from the registered range's first
    /// page, modulo its page count.
    pub page_offset: u64,
    /// Length in pages (at least 1).
    pub pages: u64,
    pub kind: ReleaseKind,
}

/// Events armed for the next registrations and events raised so far.
#[derive(Debug, Default)]
pub struct HookState {
    armed: VecDeque<HookEvent>,
    raised: Vec<(Op, Ret)>,
}

/// The sequential differential harness. See the module docs.
pub struct Environment<'c, R: Registrar> {
    pub cache: &'c Cache<TestRegistrar<R>>,
    pub model: Model,
    leases: HashMap<LeaseId, Lease<'c, TestRegistrar<R>>>,
    /// Registrar serial → cache registration id.
    ids: HashMap<u64, u64>,
    deregistered: HashSet<u64>,
    hook: Option<Arc<Mutex<HookState>>>,
    strict: bool,
    /// Trace addresses → arena addresses (module docs, "One environment").
    real: Option<&'c RealMemory>,
    /// Every deregistration happens inside the op that caused it: false
    /// under a userfaultfd monitor (module docs, "One environment").
    sequential: bool,
    keep_records: bool,
    /// Ops judged so far (records are optional).
    steps: usize,
    records: Vec<Record>,
    discarded: u64,
    /// Entries the cache counted as pressure evictions that the model, which
    /// orders an event raised inside `register` before the whole acquire,
    /// counted as invalidations (see the divergence table).
    moved_to_pressure: u64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<'c, R: Registrar> Environment<'c, R> {
    /// A fresh environment: `cache` must be new (nothing registered yet) and
    /// configured with `config`, its registrar logging.
    pub fn new(cache: &'c Cache<TestRegistrar<R>>, config: Config) -> Self {
        assert_eq!(cache.config().contract, config, "the model must be configured as the cache");
        Environment {
            cache,
            model: Model::new(config),
            leases: HashMap::new(),
            ids: HashMap::new(),
            deregistered: HashSet::new(),
            hook: None,
            strict: false,
            real: None,
            sequential: cache.config().monitoring != Monitoring::Userfaultfd,
            keep_records: true,
            steps: 0,
            records: Vec::new(),
            discarded: 0,
            moved_to_pressure: 0,
        }
    }

    /// Also require the canonical outcome (except after an injected failure).
    pub fn strict(mut self, on: bool) -> Self {
        self.strict = on;
        self
    }

    /// Runs the ops on real memory: relocated into `mem`'s arena, release
    /// events performed there (module docs, "One environment"). `mem` must
    /// be planned for the ops that will be stepped.
    pub fn real_memory(mut self, mem: &'c RealMemory) -> Self {
        self.real = Some(mem);
        self
    }

    /// Keep a [`Record`] of every op (on by default; [`Self::records`] and
    /// [`Self::to_trace`] need them).
    pub fn keep_records(mut self, on: bool) -> Self {
        self.keep_records = on;
        self
    }

    /// Judge with [`Model::concurrent`] (E6 allowed on misses).
    pub fn concurrent_model(mut self) -> Self {
        self.model = self.model.concurrent();
        self
    }

    /// Installs a registrar hook that raises the events armed with
    /// [`Environment::arm`] from inside `register` (explicit invalidations on
    /// the registering thread, spec.md#S3.7). One armed event costs an
    /// acquire at most one retry; arm `max_retries` events in one op to get
    /// E6, and judge with [`Environment::concurrent_model`] then.
    pub fn with_event_hook(mut self, cache: &Arc<Cache<TestRegistrar<R>>>) -> Self {
        assert!(std::ptr::eq(&**cache, self.cache), "the hook must raise events on the environment's cache");
        let state = Arc::new(Mutex::new(HookState::default()));
        let weak: Weak<Cache<TestRegistrar<R>>> = Arc::downgrade(cache);
        let st = state.clone();
        let page_size = self.model.config.page_size;
        let installed = cache.registrar().set_hook(Box::new(move |range| {
            let Some(ev) = lock(&st).armed.pop_front() else { return };
            let span = range.pages(page_size);
            let first = span.first + ev.page_offset % span.count();
            let op = Op::ReleaseEvent { kind: ev.kind, addr: first * page_size, len: ev.pages.max(1) * page_size };
            let Some(cache) = weak.upgrade() else { return };
            let Op::ReleaseEvent { kind, addr, len } = op else { unreachable!() };
            let ret = match cache.invalidate(addr, len, kind) {
                Ok(()) => Ret::Done,
                Err(e) => Ret::Failed { error: e.op_error() },
            };
            lock(&st).raised.push((op, ret));
        }));
        assert!(installed, "the registrar already has a hook");
        self.hook = Some(state);
        self
    }

    /// Arms `ev` for the next `register` call of the next op (events armed
    /// but not raised during that op are dropped).
    pub fn arm(&mut self, ev: HookEvent) {
        if let Some(h) = &self.hook {
            lock(h).armed.push_back(ev);
        }
    }

    /// Leases held now.
    pub fn held(&self) -> Vec<LeaseId> {
        let mut v: Vec<LeaseId> = self.leases.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// The records so far (each op with the outcome it got, as `expect`;
    /// the failing op, if any, with the canonical outcome).
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// Ops judged so far (events raised inside `register` included).
    pub fn steps(&self) -> usize {
        self.steps
    }

    fn push_record(&mut self, rec: Record) {
        self.steps += 1;
        if self.keep_records {
            self.records.push(rec);
        }
    }

    fn set_last_expect(&mut self, ret: Ret) {
        if let Some(last) = self.records.last_mut().filter(|_| self.keep_records) {
            last.expect = Some(ret);
        }
    }

    fn diverge(&self, op: &Op, observed: Ret, canonical: Ret, message: String) -> Divergence {
        Divergence { index: self.steps.saturating_sub(1), op: *op, observed, canonical, message, check: Check::Effects }
    }

    /// Applies `op` to the cache: on real memory, relocated, and a release
    /// event performed there first (module docs). Answers the outcome as the
    /// cache gave it and in the op's coordinates.
    fn apply(&mut self, op: &Op) -> Result<(Ret, Ret), Divergence> {
        let Some(mem) = self.real else {
            let ret = self.cache.apply(op, &mut self.leases);
            return Ok((ret, ret));
        };
        let harness = |env: &Self, message: String| Divergence {
            index: env.steps,
            op: *op,
            observed: Ret::Done,
            canonical: Ret::Done,
            message,
            check: Check::Harness,
        };
        let Some(moved) = mem.relocate(op) else {
            return Err(harness(self, format!("`{op}` cannot be relocated")));
        };
        let raw = match moved {
            Op::ReleaseEvent { addr, len, .. } => {
                mem.release(addr, len).map_err(|e| harness(self, e))?;
                if self.sequential {
                    self.cache.apply(&moved, &mut self.leases)
                } else {
                    // The kernel reported it: the munmap part of MAP_FIXED
                    // returns only once the monitor has read the event.
                    Ret::Done
                }
            }
            _ => self.cache.apply(&moved, &mut self.leases),
        };
        Ok((raw, mem.original_ret(raw)))
    }

    /// Applies `op` to both and checks everything listed in the module docs.
    pub fn step(&mut self, op: &Op) -> Result<Ret, Divergence> {
        let (raw, ret) = self.apply(op)?;
        // Events raised inside the registrar: judged first (see module docs).
        let raised = match &self.hook {
            Some(h) => {
                let mut st = lock(h);
                st.armed.clear();
                std::mem::take(&mut st.raised)
            }
            None => Vec::new(),
        };
        let raised_any = !raised.is_empty();
        for (ev, ev_ret) in raised {
            let canonical = self.model.clone().step(&ev);
            self.push_record(Record { expect: Some(canonical), ..Record::new(ev) });
            if let Err(v) = self.model.judge(&ev, &ev_ret) {
                let message = format!("{v} (event raised inside register)");
                return Err(Divergence { check: Check::Outcome, ..self.diverge(&ev, ev_ret, canonical, message) });
            }
        }
        // The record's expectation: the outcome the cache gave once the judge
        // accepted it (a replay must reproduce it; an injected E5 is scripted
        // again from it), else the contract's canonical outcome.
        let canonical_before = self.strict.then(|| self.model.clone().step(op));
        self.push_record(Record { expect: Some(ret), ..Record::new(*op) });
        if let Err(v) = self.model.judge(op, &ret) {
            // The judge left the model unchanged.
            let canonical = canonical_before.unwrap_or_else(|| self.model.clone().step(op));
            self.set_last_expect(canonical);
            return Err(Divergence { check: Check::Outcome, ..self.diverge(op, ret, canonical, v.to_string()) });
        }
        let canonical = canonical_before.unwrap_or(ret);
        let log = self.cache.registrar().take_log();
        let injected = log.iter().any(|c| matches!(c, Call::Failed { .. }));
        if self.strict && !injected && ret != canonical {
            self.set_last_expect(canonical);
            let message = "strict: not the canonical outcome".to_string();
            return Err(Divergence { check: Check::Expectation, ..self.diverge(op, ret, canonical, message) });
        }
        self.check_effects(op, (raw, ret), canonical, &log)?;
        if !self.sequential {
            // Deregistrations may still be under way in the monitor thread.
            return Ok(ret);
        }
        let fail = |env: &Self, msg: String| Err(env.diverge(op, ret, canonical, msg));
        if let Err(v) = self.model.check_quiescent() {
            return fail(self, v.to_string());
        }
        let (mut cs, ms) = (self.cache.stats(), self.model.stats());
        let pressure_injected =
            log.iter().any(|c| matches!(c, Call::Failed { errno, injected: true, .. } if *errno == libc::ENOMEM || *errno == libc::EAGAIN));
        if raised_any && pressure_injected {
            // The cache evicted (pressure) before the event; the model, event
            // first, invalidated the same entries: only the counters differ.
            let moved = cs.pressure_evictions.checked_sub(ms.pressure_evictions);
            if moved.is_some_and(|m| m >= self.moved_to_pressure && ms.invalidations.checked_sub(cs.invalidations) == Some(m)) {
                self.moved_to_pressure = moved.unwrap_or(0);
            }
        }
        cs.pressure_evictions -= self.moved_to_pressure.min(cs.pressure_evictions);
        cs.invalidations += self.moved_to_pressure;
        if cs != ms {
            return fail(
                self,
                format!(
                    "stats differ{}:\n  cache {cs:?}\n  model {ms:?}",
                    if self.moved_to_pressure > 0 {
                        format!(" ({} pressure evictions counted as invalidations)", self.moved_to_pressure)
                    } else {
                        String::new()
                    }
                ),
            );
        }
        let cached: Vec<u64> = self.cache.cached_views().iter().map(|v| v.id).collect();
        let mcached: Vec<u64> = self.model.registrations().filter(|r| r.findable).map(|r| r.id).collect();
        if cached != mcached {
            return fail(self, format!("findable entries differ: cache {cached:?}, model {mcached:?}"));
        }
        Ok(ret)
    }

    /// Registrations and deregistrations of one op against the model's
    /// effects. `raw` is the outcome as the cache gave it (in the arena on
    /// real memory), `ret` in the op's coordinates.
    fn check_effects(&mut self, op: &Op, (raw, ret): (Ret, Ret), canonical: Ret, log: &[Call]) -> Result<(), Divergence> {
        let fail = |env: &Self, msg: String| Err(env.diverge(op, ret, canonical, msg));
        let model_regs: Vec<RegView> = self
            .model
            .take_effects()
            .into_iter()
            .filter_map(|e| match e {
                Effect::Register { view } => Some(view),
                _ => None,
            })
            .collect();
        // The registration a miss made is the one its lease holds.
        let mut cache_regs = Vec::new();
        if let (Op::Acquire { lease, .. }, Ret::Granted { reg, hit: false, .. }, Ret::Granted { reg: moved, .. }) = (op, raw, ret) {
            let Some(l) = self.leases.get(lease) else {
                return fail(self, "granted lease not held by the harness".into());
            };
            let h = l.handle();
            if (h.range.addr, h.range.len, h.access) != (reg.addr, reg.len, reg.access) || l.view() != reg {
                return fail(self, format!("lease reports {reg} but its handle registered {} {}", h.range, h.access));
            }
            self.ids.insert(h.serial, reg.id);
            cache_regs.push(moved);
        }
        if cache_regs != model_regs {
            return fail(self, format!("registrations differ: cache {cache_regs:?}, model {model_regs:?}"));
        }
        let mut made_here: HashSet<u64> = HashSet::new();
        for call in log {
            match *call {
                Call::Register { serial, .. } => {
                    if !self.ids.contains_key(&serial) {
                        made_here.insert(serial);
                    }
                }
                Call::Deregister { serial } => {
                    if !self.deregistered.insert(serial) {
                        return fail(self, format!("P4: registrar serial {serial} deregistered twice"));
                    }
                    if let Some(&id) = self.ids.get(&serial) {
                        if let Err(v) = self.model.observe_deregister(id) {
                            return fail(self, v.to_string());
                        }
                    } else if made_here.remove(&serial) {
                        self.discarded += 1;
                    } else {
                        return fail(self, format!("registrar serial {serial} deregistered but never seen registered"));
                    }
                }
                Call::Failed { .. } => {}
            }
        }
        if let Some(s) = made_here.iter().next() {
            return fail(self, format!("L1: registrar serial {s} was registered in this op, never cached, still registered"));
        }
        Ok(())
    }

    /// Releases every lease, flushes, and verifies both directions (module
    /// docs): [`Self::finish_with`]`(`[`Ending::Drain`]`)`.
    pub fn finish(self) -> Result<Summary, Divergence> {
        self.finish_with(Ending::Drain)
    }

    /// Ends the run as `ending` says (module docs, "One environment").
    /// [`Ending::AsRecorded`] never fails; its summary's stats are the
    /// cache's at once (read them again once a monitor thread is joined).
    pub fn finish_with(mut self, ending: Ending) -> Result<Summary, Divergence> {
        if ending == Ending::AsRecorded {
            self.leases.clear();
            return Ok(Summary {
                ops: self.steps,
                stats: self.cache.stats(),
                discarded: self.discarded,
                injected_failures: self.cache.registrar().injected.load(std::sync::atomic::Ordering::Relaxed),
            });
        }
        for lease in self.held() {
            self.step(&Op::Release { lease })?;
        }
        self.step(&Op::Flush)?;
        let op = Op::Flush;
        let fail = |env: &Self, msg: String| Err(env.diverge(&op, Ret::Done, Ret::Done, format!("at the end: {msg}")));
        let (cs, ms) = (self.cache.stats(), self.model.stats());
        if self.model.leases_held() != 0 || self.model.registrations().count() != 0 {
            return fail(&self, "the model still holds leases or registrations".into());
        }
        if !self.model.pending_deregistrations().is_empty() {
            return fail(&self, "deregistrations the model expects were not observed".into());
        }
        if cs.pinned_bytes != 0 || cs.cached_entries != 0 {
            return fail(&self, format!("the cache still pins {} bytes in {} entries", cs.pinned_bytes, cs.cached_entries));
        }
        let reg = self.cache.registrar();
        // Every registration deregistered exactly once, but those forgotten
        // by a fork (never deregistered: the parent's).
        if reg.live() != ms.forgotten {
            return fail(&self, format!("{} registrations live, {} forgotten by forks", reg.live(), ms.forgotten));
        }
        let doubles = reg.double_deregistrations.load(std::sync::atomic::Ordering::Relaxed);
        if doubles != 0 {
            return fail(&self, format!("P4: {doubles} double deregistrations"));
        }
        if self.cache.diagnostics().dereg_failures != 0 {
            return fail(&self, "deregistrations failed".into());
        }
        Ok(Summary {
            ops: self.steps,
            stats: cs,
            discarded: self.discarded,
            injected_failures: reg.injected.load(std::sync::atomic::Ordering::Relaxed),
        })
    }

    /// The records as a trace (spec.md#T) that `replay_trace` and
    /// `mrcache replay` read: header `source`, the configuration in
    /// `policy_hint` and `command`, each record with its `expect`.
    pub fn to_trace(&self, source: &str, description: impl Into<String>) -> Trace {
        trace_of(&self.records, &self.model.config, source, description.into())
    }
}

/// Builds a trace from records (see [`Environment::to_trace`]).
pub fn trace_of(records: &[Record], config: &Config, source: &str, description: String) -> Trace {
    let mut header = Header::new(source);
    header.description = Some(description);
    header.policy_hint = Some(config.policy.name().to_string());
    header.command = Some(super::replay_command(config));
    header.page_size = config.page_size;
    Trace { header, records: records.to_vec(), first_record_line: 2 }
}

/// The configuration a trace was written for: its `command` (as written by
/// [`super::replay_command`]) if it has one, else its `policy_hint` and the
/// defaults.
pub fn config_from_trace(trace: &Trace) -> Result<Config, String> {
    let mut config = Config { page_size: trace.header.page_size, ..Config::default() };
    if let Some(hint) = &trace.header.policy_hint {
        config.policy = hint.parse::<OverlapPolicy>()?;
    }
    if let Some(cmd) = &trace.header.command {
        if cmd.starts_with("mrcache replay") {
            config_from_command(cmd, &mut config)?;
        }
    }
    config.validate()?;
    Ok(config)
}

/// Applies the options of a `mrcache replay ...` command line to `config`.
pub fn config_from_command(cmd: &str, config: &mut Config) -> Result<(), String> {
    let words: Vec<&str> = cmd.split_whitespace().collect();
    let mut i = 0;
    while i < words.len() {
        let value = words.get(i + 1).copied().unwrap_or("");
        let num = || value.parse::<u64>().map_err(|_| format!("`{}` needs a number, got `{value}`", words[i]));
        match words[i] {
            "--policy" => config.policy = value.parse()?,
            "--eviction" => config.eviction = value.parse::<EvictionPolicy>()?,
            "--chunk-pages" => config.chunk_pages = num()?,
            "--max-regions" => config.limits.max_regions = Some(num()?),
            "--max-pinned-bytes" => config.limits.max_pinned_bytes = Some(num()?),
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    Ok(())
}

/// How [`replay_trace`] treats the trace's `expect`s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expectations {
    /// Ignore them (but still follow failures the trace asserts).
    Ignore,
    /// The cache's outcome must equal each `expect`.
    Exact,
}

/// Replays a trace through a fresh cache with `registrar` under `config`.
///
/// With [`Expectations::Exact`] the cache's outcome must equal each
/// `expect`, unless the expected outcome is an alternative the judge allows
/// and the cache gave the canonical one.
/// Registrar failures the trace expects are reproduced: an `expect` of E5
/// scripts the registrar to fail with that errno (after an ENOMEM if
/// `pressure`), a grant with `pressure` scripts one ENOMEM. A `concurrent`
/// trace (checker counterexamples) is judged with [`Model::concurrent`] and
/// its expectations are not required (they were observed under another
/// interleaving).
pub fn replay_trace<R: Registrar>(registrar: R, trace: &Trace, config: Config, expectations: Expectations) -> Result<Summary, Divergence> {
    replay_trace_with(registrar, trace, config, expectations, mrcache::Faults::default())
}

/// [`replay_trace`] with fault switches (to show a trace catches a mutant).
pub fn replay_trace_with<R: Registrar>(
    registrar: R,
    trace: &Trace,
    config: Config,
    expectations: Expectations,
    faults: mrcache::Faults,
) -> Result<Summary, Divergence> {
    let mut cc = mrcache::CacheConfig::explicit_with(config);
    cc.faults = faults;
    let cache = Cache::new(TestRegistrar::new(registrar), cc);
    let mut env = Environment::new(&cache, config);
    if trace.header.concurrent {
        env = env.concurrent_model();
    }
    let exact = expectations == Expectations::Exact && !trace.header.concurrent;
    for rec in &trace.records {
        let script: &[Option<i32>] = match rec.expect {
            Some(Ret::Failed { error: OpError::Registrar { failure, pressure: false } }) => &[Some(errno_of(failure))],
            Some(Ret::Failed { error: OpError::Registrar { failure, pressure: true } }) => &[Some(libc::ENOMEM), Some(errno_of(failure))],
            Some(Ret::Granted { pressure: true, .. }) => &[Some(libc::ENOMEM)],
            _ => &[],
        };
        cache.registrar().fail_next(script);
        let before = (exact && rec.expect.is_some()).then(|| env.model.clone());
        let got = env.step(&rec.op)?;
        cache.registrar().clear_script();
        if let (Some(before), Some(want)) = (before, rec.expect) {
            // The trace may expect an outcome the contract allows without
            // preferring it; the cache may then give the canonical one.
            if got != want {
                let canonical = before.clone().step(&rec.op);
                let alternative = before.clone().judge(&rec.op, &want).is_ok();
                if alternative && got == canonical {
                    continue;
                }
                return Err(Divergence {
                    check: Check::Expectation,
                    index: env.steps() - 1,
                    op: rec.op,
                    observed: got,
                    canonical,
                    message: format!(
                        "the trace expects `{want}`{}",
                        if alternative { "" } else { ", which the judge rejects: the trace is wrong" }
                    ),
                });
            }
        }
    }
    env.finish()
}

/// Limits used by [`super::configs`], for descriptions.
pub fn describe(config: &Config) -> String {
    let Limits { max_regions, max_pinned_bytes, .. } = config.limits;
    format!(
        "{} / {:?} / chunk {} / max_regions {:?} / max_pinned_bytes {:?}",
        config.policy.name(),
        config.eviction,
        config.chunk_pages,
        max_regions,
        max_pinned_bytes
    )
}
