//! The §A algorithm, step by step, as a stateright [`Model`].
//!
//! Each action is one step of one actor (an application thread or the uffd
//! monitor); a step is atomic, so its granularity decides which interleavings
//! are explored. See the crate docs for the step mapping.

use crate::config::{compile_scripts, CacheFrees, CheckConfig, MonitorKind, Mutant, ScriptOp, Span, MAX_PAGES};
use crate::props;
use crate::state::*;
use mrcache_model::{Model as RefModel, OverlapPolicy};
use mrcache_types::{Access, Op, OpError, RegView, Ret, ReleaseKind};
use stateright::semantics::{ConsistencyTester, LinearizabilityTester};
use stateright::{Model, Property};

/// One step of one actor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Thread `t` takes its next step. `alt` takes the other branch of a
    /// choice: the registrar frees memory during A5, or the cache frees its
    /// own memory at A9 under the lock.
    Thread { t: u8, alt: bool },
    /// The uffd monitor thread takes its next step.
    Monitor,
    /// Thread `t`'s registrar call fails (at A5): ENOMEM the first time in an
    /// acquire (the trim of S5.4), EINVAL after it (E5).
    RegistrarFails { t: u8 },
    /// Lanes: the oldest store in actor `a`'s store buffer reaches memory.
    Flush { a: Actor },
}

/// Slots per lane.
pub const LANE_SLOTS: usize = 1;

/// What a step did, recorded only when rebuilding a counterexample.
#[derive(Clone, Debug, Default)]
pub struct Rec {
    /// Human-readable notes, each starting with the spec step ID.
    pub notes: Vec<String>,
    /// Invocations (`ret: None`) and returns of operations.
    pub events: Vec<RecEvent>,
}

/// An operation invoked or returning, for the JSON trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecEvent {
    pub thread: u8,
    /// A release event raised inside a cache operation (registrar or cache free).
    pub nested: bool,
    pub op: Op,
    pub ret: Option<Ret>,
}

/// The model of §A for one [`CheckConfig`].
#[derive(Clone, Debug)]
pub struct AlgoModel {
    pub cfg: CheckConfig,
    pub scripts: Vec<Vec<(Op, ScriptOp)>>,
    /// Pages the scripts (and nested events) use; uffd watches exactly these.
    pub app_pages: u8,
    /// The cache's private page (`app_pages`): never cached, never watched by uffd.
    pub private_page: u8,
}

/// What A7 will do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum A7 {
    /// Throw the registration away and retry; `replan`: not because of an
    /// event, but because the policy's plan changed while the lock was dropped.
    Stale { replan: bool },
    /// A8: another thread inserted a covering entry.
    Hit(Handle),
    /// A9.
    Insert,
}

macro_rules! note {
    ($cx:expr, $($arg:tt)*) => {
        if $cx.rec.is_some() {
            let msg = format!($($arg)*);
            if let Some(r) = $cx.rec.as_deref_mut() {
                r.notes.push(msg);
            }
        }
    };
}

impl AlgoModel {
    pub fn new(cfg: CheckConfig) -> Result<AlgoModel, String> {
        if cfg.max_retries == 0 {
            return Err("max_retries must be at least 1".into());
        }
        let scripts = compile_scripts(&cfg.scripts())?;
        let mut app_pages = 1u8;
        for s in &scripts {
            for (_, op) in s {
                if let ScriptOp::Acquire { span, .. } | ScriptOp::Event { span, .. } = op {
                    app_pages = app_pages.max(span.end);
                }
            }
        }
        if let Some(p) = cfg.registrar_frees {
            app_pages = app_pages.max(p + 1);
        }
        if let Some(CacheFrees::AppPage(p)) = cfg.cache_frees {
            app_pages = app_pages.max(p + 1);
        }
        if app_pages >= MAX_PAGES {
            return Err(format!("the scripts use {app_pages} pages; the checker allows {}", MAX_PAGES - 1));
        }
        Ok(AlgoModel { cfg, scripts, app_pages, private_page: app_pages })
    }

    pub fn mutant(&self, m: Mutant) -> bool {
        self.cfg.mutant == Some(m)
    }

    fn is_async(&self) -> bool {
        self.cfg.monitor == MonitorKind::Async
    }

    pub fn init_state(&self) -> State {
        let pages = (self.app_pages + 1) as usize;
        State {
            gens: vec![0; pages],
            done_gens: vec![0; pages],
            lock: Lock::Free,
            regs: Vec::new(),
            next_id: 1,
            queue: Vec::new(),
            uffd: Vec::new(),
            over_limit: false,
            clock: 0,
            threads: self
                .scripts
                .iter()
                .map(|s| Thread {
                    pc: if s.is_empty() { Pc::Done } else { Pc::Idle },
                    next_op: 0,
                    acq: None,
                    ev: None,
                    inflight: None,
                    held: Vec::new(),
                    dereg: Vec::new(),
                    toctou: Vec::new(),
                    waiting: false,
                    noted: Vec::new(),
                    sb: Vec::new(),
                    revoke: None,
                    popped: Vec::new(),
                    prelocked: false,
                    lane_leases: Vec::new(),
                    failing: false,
                })
                .collect(),
            monitor: Monitor {
                pc: MonPc::Idle,
                buf: Vec::new(),
                dereg: Vec::new(),
                toctou: Vec::new(),
                sb: Vec::new(),
                revoke: None,
                popped: Vec::new(),
            },
            lanes: if self.cfg.lanes { vec![vec![Slot::default(); LANE_SLOTS]; self.scripts.len()] } else { Vec::new() },
            registrar_free_left: self.cfg.registrar_frees.is_some(),
            reg_failures_left: self.cfg.registrar_failures,
            trim_evicted: false,
            cache_free_left: self.cfg.cache_frees.is_some(),
            bad: Vec::new(),
            lin: LinearizabilityTester::new(RefModel::new(self.cfg.model_config()).concurrent().trims_logged()),
        }
    }

    /// The page the cache frees under its lock.
    fn cache_free_span(&self) -> Span {
        let p = match self.cfg.cache_frees {
            Some(CacheFrees::AppPage(p)) => p,
            _ => self.private_page,
        };
        Span::new(p, p + 1)
    }

    /// userfaultfd reports events only on the ranges the monitor subscribed:
    /// every application page; never the cache's private page.
    fn uffd_watches(&self, span: &Span) -> bool {
        span.first < self.app_pages
    }

    pub fn view(&self, s: &State, h: Handle) -> RegView {
        let r = &s.regs[h as usize];
        RegView { id: r.id as u64, addr: r.span.addr(), len: r.span.bytes(), access: r.access }
    }

    /// A covering findable entry with sufficient access; the oldest (S2.1).
    pub fn lookup(&self, s: &State, req: Span, access: Access) -> Option<Handle> {
        let any_access = self.mutant(Mutant::HitIgnoresAccess);
        s.regs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.findable && r.span.contains(&req) && (any_access || r.access.suffices_for(access)))
            .min_by_key(|(_, r)| r.id)
            .map(|(h, _)| h as Handle)
    }

    //= spec.md#S6.1
    /// The registration the overlap policy makes for a miss on `req`, and the
    /// entries it displaces, given the findable entries of `s`.
    pub fn plan(&self, s: &State, req: Span, access: Access) -> Plan {
        let findable = || s.regs.iter().enumerate().filter(|(_, r)| r.findable).map(|(h, r)| (h as Handle, r));
        match self.cfg.policy {
            OverlapPolicy::Independent => Plan { span: req, access, displaced: Vec::new() },
            OverlapPolicy::Merge => {
                let (mut span, mut acc, mut displaced) = (req, access, Vec::new());
                loop {
                    let more: Vec<Handle> = findable()
                        .filter(|(h, r)| !displaced.contains(h) && r.span.overlaps(&span))
                        .map(|(h, _)| h)
                        .collect();
                    if more.is_empty() {
                        break;
                    }
                    for h in more {
                        let r = &s.regs[h as usize];
                        span = span.union(&r.span);
                        acc = acc | r.access;
                        displaced.push(h);
                    }
                }
                displaced.sort_unstable();
                Plan { span, access: acc, displaced }
            }
            OverlapPolicy::NoMergeUncacheContained => {
                let displaced: Vec<Handle> = findable()
                    .filter(|(_, r)| req.contains(&r.span) || r.span.contains(&req))
                    .map(|(h, _)| h)
                    .collect();
                let access = displaced.iter().fold(access, |a, &h| a | s.regs[h as usize].access);
                Plan { span: req, access, displaced }
            }
        }
    }

    /// A6: whether inserting one more entry of `bytes` could exceed a limit.
    pub fn could_exceed_limits(&self, s: &State, bytes: u64) -> bool {
        let n = s.findable_count() as u64 + 1;
        let cached: u64 = s.regs.iter().filter(|r| r.findable).map(|r| r.span.bytes()).sum::<u64>() + bytes;
        self.cfg.max_regions.is_some_and(|m| n > m) || self.cfg.max_pinned_bytes.is_some_and(|m| cached > m)
    }

    pub fn over_limits(&self, s: &State) -> bool {
        let n = s.findable_count() as u64;
        let bytes: u64 = s.regs.iter().filter(|r| r.findable).map(|r| r.span.bytes()).sum();
        self.cfg.max_regions.is_some_and(|m| n > m) || self.cfg.max_pinned_bytes.is_some_and(|m| bytes > m)
    }

    //= spec.md#S6.3
    /// The LRU victim among unleased findable entries (ties by id).
    fn victim(&self, s: &State, noted: &[Handle]) -> Option<Handle> {
        s.regs
            .iter()
            .enumerate()
            .filter(|(h, r)| r.findable && r.leases == 0 && noted.contains(&(*h as Handle)))
            .min_by_key(|(_, r)| (r.last_use, r.id))
            .map(|(h, _)| h as Handle)
    }

    pub fn a7_outcome(&self, s: &State, t: usize) -> A7 {
        let th = &s.threads[t];
        let acq = th.acq.as_ref().expect("A7 runs inside an acquire");
        if th.inflight.is_some_and(|i| i.stale) && !self.mutant(Mutant::NoSeqRecheck) {
            return A7::Stale { replan: false };
        }
        if let Some(h) = self.lookup(s, acq.req, acq.access) {
            return A7::Hit(h);
        }
        // Merge's span and access, and no-merge-uncache-contained's access,
        // depend on the entries present (S6.1).
        if self.cfg.policy != OverlapPolicy::Independent && !self.mutant(Mutant::StaleMergePlan) {
            let now = self.plan(s, acq.req, acq.access);
            let planned = acq.plan.as_ref().expect("A4 planned");
            if now.span != planned.span || now.access != planned.access {
                return A7::Stale { replan: true };
            }
        }
        A7::Insert
    }

    fn first_ev_pc(&self, span: &Span) -> EvPc {
        if !self.mutant(Mutant::NotifyBeforeRelease) {
            return EvPc::Bump;
        }
        match self.cfg.monitor {
            MonitorKind::Sync => EvPc::H1,
            MonitorKind::Async if self.uffd_watches(span) => EvPc::Enqueue,
            MonitorKind::Async => EvPc::BumpLast,
        }
    }

    /// Whether thread `t` can take its next step.
    pub fn thread_enabled(&self, s: &State, t: usize) -> bool {
        let th = &s.threads[t];
        if th.revoke.is_some() {
            return true;
        }
        if th.failing {
            // The registrar failed; the trim continues as `RegistrarFails`.
            return false;
        }
        if !th.toctou.is_empty() {
            return true;
        }
        if let Some(ev) = &th.ev {
            return match ev.pc {
                // Mutant 2: the hook waits for the lock instead of trying it.
                EvPc::H2 if self.mutant(Mutant::BlockingHook) => s.lock == Lock::Free,
                EvPc::Wait => !th.waiting,
                _ => true,
            };
        }
        match th.pc {
            Pc::Idle => match self.scripts[t][th.next_op as usize].1 {
                // A1: a reader blocks while a writer holds the lock, unless the
                // queue is non-empty (then it goes straight to A2). LN1 takes no lock.
                ScriptOp::Acquire { span, access, .. } => {
                    !s.queue.is_empty() || !matches!(s.lock, Lock::Exclusive(_)) || self.l1_slot(s, t, span, access).is_some()
                }
                ScriptOp::Release { .. } | ScriptOp::Event { .. } => true,
            },
            Pc::A1 => !s.queue.is_empty() || !matches!(s.lock, Lock::Exclusive(_)),
            Pc::A2 | Pc::A6 | Pc::R2 | Pc::R2ThenA1 => s.lock == Lock::Free || th.prelocked,
            // LN4 takes the lanes mutex, which only a revoke (LN5) holds across steps.
            Pc::LN4 { .. } => self.mutant(Mutant::LaneDetachedNoMutex) || !s.lanes_mutex_held(),
            Pc::Done | Pc::Event => false,
            _ => true,
        }
    }

    /// LN1's first check: no release event is pending (queued, or taken or
    /// read and not applied yet; mutant 26: only the queue's length).
    pub fn l1_sees_no_event(&self, s: &State) -> bool {
        if self.mutant(Mutant::LaneQueueLenOnly) {
            return s.queue.is_empty();
        }
        s.queue.is_empty()
            && s.monitor.buf.is_empty()
            && s.monitor.popped.is_empty()
            && s.threads.iter().all(|t| t.popped.is_empty())
    }

    /// LN1: the slot of thread `t`'s lane with exactly this key and a non-null
    /// `ptr` (as `t` loads it), and that entry, when no event is pending.
    pub fn l1_slot(&self, s: &State, t: usize, span: Span, access: Access) -> Option<(u8, Handle)> {
        if !self.cfg.lanes || !self.l1_sees_no_event(s) {
            return None;
        }
        (0..LANE_SLOTS).find_map(|i| {
            let key = s.lanes[t][i].key?;
            (key == (span, access)).then(|| s.load_ptr(t as Actor, t, i)).flatten().map(|h| (i as u8, h))
        })
    }

    /// The slots (lane, slot, entry) whose `ptr`, as actor `a` loads it,
    /// points to one of `removed`, or to anything with `all`.
    pub fn lane_targets(&self, s: &State, a: Actor, removed: &[Handle], all: bool) -> Vec<(u8, u8, Handle)> {
        let mut out = Vec::new();
        for l in 0..s.lanes.len() {
            for i in 0..LANE_SLOTS {
                if let Some(h) = s.load_ptr(a, l, i) {
                    if all || removed.contains(&h) {
                        out.push((l as u8, i as u8, h));
                    }
                }
            }
        }
        out
    }

    /// Whether thread `t`'s next step executes a locked instruction or a
    /// barrier (a lock, an atomic read-modify-write, a system call): x86
    /// then drains its store buffer. The lane steps do not (LN1, LN3: plain
    /// stores and loads, a compiler fence); LN4 does (the lanes mutex).
    pub fn step_flushes(&self, s: &State, t: usize) -> bool {
        let th = &s.threads[t];
        if th.ev.is_some() || !th.toctou.is_empty() {
            return true;
        }
        match th.pc {
            Pc::L1Store { .. } | Pc::L1Load { .. } | Pc::L3Load { .. } => false,
            Pc::LN4 { .. } => !self.mutant(Mutant::LaneDetachedNoMutex),
            Pc::Idle => match self.scripts[t][th.next_op as usize].1 {
                ScriptOp::Acquire { span, access, .. } => self.l1_slot(s, t, span, access).is_none(),
                ScriptOp::Release { lease } => !th.lane_leases.iter().any(|(l, _)| *l == lease),
                ScriptOp::Event { .. } => true,
            },
            _ => true,
        }
    }

    /// Whether thread `t`'s registrar call (A5) may fail now: budget left, and
    /// the lock free (both outcomes take it at once).
    pub fn registrar_may_fail(&self, s: &State, t: usize) -> bool {
        let th = &s.threads[t];
        if th.failing {
            return th.revoke.is_none();
        }
        s.reg_failures_left > 0 && th.pc == Pc::A5 && th.toctou.is_empty() && th.ev.is_none() && s.lock == Lock::Free
    }

    /// Whether thread `t`'s next step has a second branch.
    pub fn thread_alt(&self, s: &State, t: usize) -> bool {
        let th = &s.threads[t];
        if !th.toctou.is_empty() || th.ev.is_some() || th.revoke.is_some() {
            return false;
        }
        match th.pc {
            Pc::A5 => s.registrar_free_left,
            Pc::A7 => s.cache_free_left && self.a7_outcome(s, t) == A7::Insert,
            _ => false,
        }
    }

    pub fn monitor_enabled(&self, s: &State) -> bool {
        if !self.is_async() {
            return false;
        }
        if !s.monitor.toctou.is_empty() || s.monitor.revoke.is_some() {
            return true;
        }
        match s.monitor.pc {
            MonPc::Idle => !s.uffd.is_empty(),
            MonPc::Lock => s.lock == Lock::Free,
            MonPc::Read | MonPc::Apply => true,
        }
    }

    /// What an actor waits for, for deadlock reports.
    pub fn blocked_on(&self, s: &State, a: Actor) -> String {
        let holder = match s.lock {
            Lock::Free => "nobody".to_string(),
            Lock::Shared(n) => format!("{n} reader(s)"),
            Lock::Exclusive(h) if h == a => "itself".to_string(),
            Lock::Exclusive(h) => actor_name(h),
        };
        if a == MONITOR {
            return match s.monitor.pc {
                MonPc::Lock => format!("M2 waits for the lock, held by {holder}"),
                pc => format!("{pc:?}"),
            };
        }
        let th = &s.threads[a as usize];
        if let Some(ev) = &th.ev {
            return match ev.pc {
                EvPc::H2 => format!("H2 waits for the lock, held by {holder} ({:?} event {})", ev.origin, ev.span),
                EvPc::Wait => format!("asleep in the kernel until the monitor reads its uffd event {}", ev.span),
                pc => format!("event step {pc:?}"),
            };
        }
        match th.pc {
            Pc::Idle => format!("waits for the lock, held by {holder}, to start its next op"),
            Pc::A2 | Pc::A6 | Pc::R2 | Pc::R2ThenA1 | Pc::A1 => format!("{:?} waits for the lock, held by {holder}", th.pc),
            Pc::LN4 { .. } => "LN4 waits for the lanes mutex (held by a revoke)".to_string(),
            pc => format!("at {pc:?}"),
        }
    }

    /// Applies `a` to `s`, recording notes and operation events into `rec`.
    pub fn step(&self, s: &mut State, a: Action, rec: Option<&mut Rec>) {
        let mut cx = Ctx { m: self, s, rec, dry: None };
        match a {
            Action::Thread { t, alt } => cx.thread_step(t as usize, alt),
            Action::Monitor => cx.monitor_step(),
            Action::RegistrarFails { t } => cx.registrar_fails_step(t as usize),
            Action::Flush { a } => cx.flush_one(a),
        }
    }

    /// A short label for an action in state `s`: who moves, at which step.
    pub fn label(&self, s: &State, a: Action) -> String {
        match a {
            Action::RegistrarFails { t } if s.threads[t as usize].acq.as_ref().is_some_and(|a| a.trimmed) => {
                format!("T{t} A5 (the registrar fails again: EINVAL)")
            }
            Action::RegistrarFails { t } => format!("T{t} A5 (the registrar fails: ENOMEM, trim)"),
            Action::Flush { a } => {
                let sb = if a == MONITOR { &s.monitor.sb } else { &s.threads[a as usize].sb };
                let first = sb.first().map(|st| buf_line(std::slice::from_ref(st))).unwrap_or_default();
                format!("{} store buffer: {first} reaches memory", actor_name(a))
            }
            Action::Monitor if s.monitor.revoke.is_some() => format!("monitor {}", revoke_label(s.monitor.revoke.as_ref())),
            Action::Monitor => {
                let lockless = self.mutant(Mutant::AsyncApplyOutsideLock) || self.mutant(Mutant::AsyncBlockingReadOutsideLock);
                let at = match s.monitor.pc {
                    _ if !s.monitor.toctou.is_empty() => "A-H (read lease counts)",
                    MonPc::Idle if lockless => "reads the uffd events without the lock",
                    MonPc::Idle => "M1 (the uffd fd is readable)",
                    MonPc::Lock => "M2 (take the lock)",
                    MonPc::Read => "M2 (read the pending events)",
                    MonPc::Apply => "M2 (apply the events read)",
                };
                format!("monitor {at}")
            }
            Action::Thread { t, alt } => {
                let th = &s.threads[t as usize];
                let at = if th.revoke.is_some() {
                    revoke_label(th.revoke.as_ref())
                } else if !th.toctou.is_empty() {
                    "A-H (read lease counts)".to_string()
                } else if let Some(ev) = &th.ev {
                    let what = match ev.origin {
                        Origin::Script => format!("{:?} {}", ev.kind, ev.span),
                        Origin::Registrar => format!("registrar's free of {}", ev.span),
                        Origin::Cache => format!("cache's own free of {}", ev.span),
                    };
                    let step = match ev.pc {
                        EvPc::Bump | EvPc::BumpLast => "kernel releases the frames",
                        EvPc::H1 => "H1",
                        EvPc::H2 => "H2",
                        EvPc::Enqueue => "kernel queues the uffd event",
                        EvPc::Wait => "wakes up",
                    };
                    format!("{step} ({what})")
                } else if th.pc == Pc::Idle {
                    format!("starts `{}`", self.scripts[t as usize][th.next_op as usize].0)
                } else {
                    match th.pc {
                        Pc::A1Look => "A1 (lookup under the shared lock)".to_string(),
                        Pc::A3 => "A3/A4 (lookup; plan on a miss)".to_string(),
                        Pc::A7 => "A7-A9 (stale? covered? insert)".to_string(),
                        Pc::A10b => "A10 (second half)".to_string(),
                        Pc::L1Store { slot, .. } => format!("LN1 (store held + 1 into slot {slot}, buffered)"),
                        Pc::L1Load { slot, .. } => format!("LN1 (light barrier; reload slot {slot}'s ptr)"),
                        Pc::L3Load { slot, .. } => format!("LN3 (light barrier; reload slot {slot}'s ptr)"),
                        Pc::LN4 { slot, .. } => format!("LN4 (lanes mutex; slot {slot}'s count and pin)"),
                        Pc::A1 => "A1 (after the lane undo)".to_string(),
                        Pc::A1Drain(_) => "A1 (unlocked with events queued: try the lock, drain)".to_string(),
                        pc => format!("{pc:?}"),
                    }
                };
                format!("T{t} {at}{}", if alt { " (alternative branch)" } else { "" })
            }
        }
    }
}

fn revoke_label(r: Option<&Revoke>) -> String {
    match r.map(|r| r.phase) {
        Some(RevokePhase::Barrier) => "LN5 (heavy barrier: membarrier)".to_string(),
        Some(RevokePhase::Count) => "LN5 (read the slots' counts; pin those above 0; unlock the lanes mutex)".to_string(),
        None => String::new(),
    }
}

/// What a dry run of a step found it would take out of the index (LN5 must
/// revoke those slots first).
#[derive(Default)]
struct Dry {
    /// Entries the step takes out of the index.
    removed: Vec<Handle>,
    /// Of those, the ones a queued event takes out (the drain pops the queue
    /// before it can revoke them).
    by_queue: Vec<Handle>,
    /// The ones an event read from uffd takes out (read, waking the
    /// releasing thread, before they can be revoked).
    by_uffd: Vec<Handle>,
    /// The step revokes every slot (A6 when it notes, R2, trim).
    all: bool,
    /// Applying a queued (`Some(false)`) or uffd (`Some(true)`) event now.
    applying: Option<bool>,
}

/// Who takes a step that may revoke.
#[derive(Clone, Copy)]
enum Who {
    Thread(usize, bool),
    Monitor,
    Fails(usize),
}

/// A step in progress: the model, the state it changes, and the recorder.
struct Ctx<'a> {
    m: &'a AlgoModel,
    s: &'a mut State,
    rec: Option<&'a mut Rec>,
    /// A dry run (lanes): record what the step takes out of the index.
    dry: Option<Dry>,
}

impl Ctx<'_> {
    fn mutant(&self, m: Mutant) -> bool {
        self.m.mutant(m)
    }

    fn thread_mut(&mut self, t: usize) -> &mut Thread {
        &mut self.s.threads[t]
    }

    fn acq(&self, t: usize) -> &Acq {
        self.s.threads[t].acq.as_ref().expect("inside an acquire")
    }

    fn acq_mut(&mut self, t: usize) -> &mut Acq {
        self.s.threads[t].acq.as_mut().expect("inside an acquire")
    }

    fn dereg_list(&mut self, a: Actor) -> &mut Vec<Handle> {
        if a == MONITOR {
            &mut self.s.monitor.dereg
        } else {
            &mut self.s.threads[a as usize].dereg
        }
    }

    fn toctou_list(&mut self, a: Actor) -> &mut Vec<Handle> {
        if a == MONITOR {
            &mut self.s.monitor.toctou
        } else {
            &mut self.s.threads[a as usize].toctou
        }
    }

    // ---- history (linearizability tester and trace recorder) ----

    fn invoke(&mut self, thread: u8, nested: bool, op: Op) {
        let id = if nested { NESTED + thread } else { thread };
        let _ = self.s.lin.on_invoke(id, op);
        if let Some(r) = self.rec.as_deref_mut() {
            r.events.push(RecEvent { thread, nested, op, ret: None });
        }
    }

    fn ret(&mut self, thread: u8, nested: bool, op: Op, ret: Ret) {
        let id = if nested { NESTED + thread } else { thread };
        let _ = self.s.lin.on_return(id, ret);
        if let Some(r) = self.rec.as_deref_mut() {
            r.events.push(RecEvent { thread, nested, op, ret: Some(ret) });
        }
    }

    /// The script op thread `t` is running ends with `ret`.
    fn finish(&mut self, t: usize, ret: Ret) {
        let op = self.m.scripts[t][self.s.threads[t].next_op as usize].0;
        note!(self, "T{t} returns `{ret}` for `{op}`");
        self.ret(t as u8, false, op, ret);
        let len = self.m.scripts[t].len() as u8;
        let th = self.thread_mut(t);
        th.acq = None;
        th.next_op += 1;
        th.pc = if th.next_op < len { Pc::Idle } else { Pc::Done };
    }

    // ---- registrar, lock, index ----

    fn deregister(&mut self, h: Handle) {
        let r = &mut self.s.regs[h as usize];
        r.deregs += 1;
        note!(self, "registrar: deregister #{h} ({})", reg_line(h, &self.s.regs[h as usize]));
    }

    fn perform_dereg(&mut self, a: Actor) {
        for h in std::mem::take(self.dereg_list(a)) {
            self.deregister(h);
        }
    }

    fn lock_shared(&mut self) {
        self.s.lock = match self.s.lock {
            Lock::Free => Lock::Shared(1),
            Lock::Shared(n) => Lock::Shared(n + 1),
            Lock::Exclusive(a) => panic!("shared lock taken while {} holds it exclusively", actor_name(a)),
        };
    }

    fn unlock_shared(&mut self) {
        self.s.lock = match self.s.lock {
            Lock::Shared(1) => Lock::Free,
            Lock::Shared(n) => Lock::Shared(n - 1),
            other => panic!("shared unlock of {other:?}"),
        };
    }

    fn lock_exclusive(&mut self, a: Actor) {
        if a != MONITOR && self.s.threads[a as usize].prelocked {
            // An LN5 took the lock for this step.
            assert_eq!(self.s.lock, Lock::Exclusive(a));
            self.s.threads[a as usize].prelocked = false;
            return;
        }
        assert_eq!(self.s.lock, Lock::Free, "{} takes a lock that is not free", actor_name(a));
        self.s.lock = Lock::Exclusive(a);
    }

    /// An LN5 took the lock exclusive for thread `t`'s step.
    fn prelocked(&self, t: usize) -> bool {
        self.s.threads[t].prelocked
    }

    //= spec.md#H2
    //= spec.md#A11
    /// Unlock (exclusive), then perform the dereg list. The holder first drains
    /// what hooks queued while it held the lock: H2's "the holder ... drains".
    /// Without it (mutant 8), an event queued while the lock was busy waits for
    /// a later slow path, which may never come (L1).
    fn unlock_exclusive(&mut self, a: Actor) {
        assert_eq!(self.s.lock, Lock::Exclusive(a), "{} unlocks a lock it does not hold", actor_name(a));
        let skip = self.mutant(Mutant::QueueNeverDrained) || self.mutant(Mutant::HolderSkipsDrain);
        if !skip && (!self.s.queue.is_empty() || !self.popped_mut(a).is_empty()) {
            note!(self, "{} drains the queue before it unlocks (events queued while it held the lock)", actor_name(a));
            self.drain_queue(a);
        }
        self.s.lock = Lock::Free;
        self.perform_dereg(a);
    }

    fn touch(&mut self, h: Handle) {
        if self.m.cfg.has_limits() {
            self.s.clock += 1;
            self.s.regs[h as usize].last_use = self.s.clock;
        }
    }

    /// Takes a lease on `h` for thread `t`'s acquire and judges P1 and P2.
    fn grant(&mut self, t: usize, h: Handle, hit: bool) -> Ret {
        let lease = self.acq(t).lease;
        self.s.regs[h as usize].leases += 1;
        self.touch(h);
        self.thread_mut(t).held.push((lease, h));
        self.judge_lease(t, h, hit)
    }

    /// Judges P1 and P2 for the lease thread `t`'s acquire got on `h`; the
    /// acquire's outcome.
    fn judge_lease(&mut self, t: usize, h: Handle, hit: bool) -> Ret {
        let acq = self.acq(t).clone();
        let r = &self.s.regs[h as usize];
        //= spec.md#P1
        let covers = r.span.contains(&acq.req) && r.access.suffices_for(acq.access);
        //= spec.md#P2
        //# for every page of the request, the frame pinned is at least as new as
        //# the one installed by every release event that completed before the
        //# acquire was invoked.
        let stale = acq.req.pages().enumerate().find_map(|(i, p)| {
            let pinned = (r.span.first..r.span.end).contains(&p).then(|| r.pinned[(p - r.span.first) as usize])?;
            (pinned < acq.snap[i]).then_some((p, pinned, acq.snap[i]))
        });
        note!(self, "T{t} leases #{h} for L{} ({})", acq.lease, reg_line(h, r));
        let base = Bad { property: props::P1, thread: t as u8, lease: acq.lease, handle: h, page: 0, pinned: 0, needed: 0 };
        if !covers {
            self.s.bad.push(base);
        }
        if let Some((page, pinned, needed)) = stale {
            self.s.bad.push(Bad { property: props::P2, page, pinned, needed, ..base });
        }
        Ret::Granted { reg: self.m.view(self.s, h), hit, pressure: acq.trimmed }
    }

    //= spec.md#A-D
    /// Applies one release event under the lock: findable entries overlapping
    /// it leave the index (unleased: dereg list; leased: INVALID, deregistered
    /// by the last release); in-flight records overlapping it become stale.
    fn apply_event(&mut self, span: Span, a: Actor) {
        note!(self, "A-D: {} applies the release of {span}", actor_name(a));
        for h in 0..self.s.regs.len() {
            let r = &self.s.regs[h];
            if !r.findable || !r.span.overlaps(&span) {
                continue;
            }
            if self.mutant(Mutant::PartialUnmapStartOnly) && r.span.first != span.first {
                continue;
            }
            if self.mutant(Mutant::LeasedStaysFindable) && r.leases > 0 {
                continue;
            }
            let h = h as Handle;
            self.revoke(a, h);
            self.s.regs[h as usize].findable = false;
            //= spec.md#A-H
            //# one atomic OR sets INVALID and returns the count; the invalidation
            //# owns the deregistration iff that count was 0.
            if self.mutant(Mutant::HandoffToctou) {
                self.s.regs[h as usize].invalid = true;
                self.toctou_list(a).push(h);
                continue;
            }
            let seen = self.s.regs[h as usize].leases;
            self.s.regs[h as usize].invalid = true;
            if seen == 0 || self.mutant(Mutant::DeregLeasedOnInvalidate) {
                self.dereg_list(a).push(h);
            }
            note!(self, "A-D: #{h} leaves the index ({})", if seen == 0 { "unleased: dereg list" } else { "leased: INVALID" });
        }
        for t in 0..self.s.threads.len() {
            if let Some(i) = self.s.threads[t].inflight.as_mut() {
                if i.span.overlaps(&span) && !i.stale {
                    i.stale = true;
                    note!(self, "A-D: T{t}'s in-flight registration of {} is now stale", i.span);
                }
            }
        }
    }

    /// Mutant 10's second half: read the count after INVALID was set.
    fn read_counts_late(&mut self, a: Actor) {
        //= spec.md#A-H
        for h in std::mem::take(self.toctou_list(a)) {
            let leases = self.s.regs[h as usize].leases;
            note!(self, "A-H (split): {} reads #{h}'s count: {leases}", actor_name(a));
            if leases == 0 {
                self.deregister(h);
            }
        }
    }

    fn drain_queue(&mut self, a: Actor) {
        // Lanes: events an LN5 took before it revoked come first.
        for span in std::mem::take(self.popped_mut(a)) {
            self.apply_event(span, a);
        }
        self.set_applying(Some(false));
        for span in std::mem::take(&mut self.s.queue) {
            self.apply_event(span, a);
        }
        self.set_applying(None);
    }

    //= spec.md#M2
    //# A2 and A6 also read pending events.
    fn read_and_apply_uffd(&mut self, a: Actor) {
        if !self.m.is_async() || self.mutant(Mutant::AsyncApplyOutsideLock) {
            return;
        }
        self.set_applying(Some(true));
        for (span, w) in std::mem::take(&mut self.s.uffd) {
            note!(self, "{} reads the uffd event {span}: T{w} wakes up", actor_name(a));
            self.s.threads[w as usize].waiting = false;
            self.apply_event(span, a);
        }
        self.set_applying(None);
    }

    /// A6 / R2: with limits, raise the over-limit flag (not in mutant 13),
    /// then note the unleased findable entries, *before* the drain.
    fn note_unleased(&mut self, t: usize) {
        if !self.m.cfg.has_limits() {
            return;
        }
        if !self.mutant(Mutant::OverLimitFlagLate) {
            self.s.over_limit = true;
        }
        self.revoke_all(t as Actor);
        let noted: Vec<Handle> = (0..self.s.regs.len())
            .filter(|&h| self.s.regs[h].findable && self.s.regs[h].leases == 0)
            .map(|h| h as Handle)
            .collect();
        note!(self, "T{t} raises the over-limit flag and notes the unleased entries {noted:?}");
        self.thread_mut(t).noted = noted;
    }

    /// Clears the over-limit flag when within limits.
    fn settle_over_limit(&mut self) {
        if self.m.cfg.has_limits() && !self.m.over_limits(self.s) {
            self.s.over_limit = false;
        }
    }

    //= spec.md#S5.4
    //= spec.md#A5
    //# On ENOMEM/EAGAIN (first time only): trim (S2.8) as a step of its own
    /// Thread `t`'s registrar call fails. The first failure of an acquire is
    /// ENOMEM: trim (take the lock, note the unleased entries, drain, evict
    /// the noted ones, logged as a `trim` of its own), re-plan, unlock, and
    /// register again. A later one is EINVAL: take the lock, drain, drop the
    /// in-flight record; a covering entry serves it as a hit, else E5.
    fn registrar_fails(&mut self, t: usize) {
        self.s.reg_failures_left -= 1;
        let a = t as Actor;
        let (req, access, trimmed) = (self.acq(t).req, self.acq(t).access, self.acq(t).trimmed);
        self.lock_exclusive(a);
        if !trimmed {
            self.revoke_all(a);
        }
        let noted: Vec<Handle> = (0..self.s.regs.len())
            .filter(|&h| self.s.regs[h].findable && (self.s.regs[h].leases == 0 || self.mutant(Mutant::TrimEvictsLeased)))
            .map(|h| h as Handle)
            .collect();
        self.drain_queue(a);
        self.read_and_apply_uffd(a);
        self.thread_mut(t).inflight = None;
        if !trimmed {
            note!(self, "A5: T{t}'s registrar fails with ENOMEM: T{t} trims (noted unleased {noted:?})");
            self.invoke(t as u8, true, Op::Trim);
            for h in noted {
                let r = &self.s.regs[h as usize];
                if !r.findable {
                    continue;
                }
                note!(self, "S2.8: trim evicts #{h}");
                self.s.trim_evicted = true;
                self.revoke(a, h);
                self.s.regs[h as usize].findable = false;
                if self.s.regs[h as usize].leases > 0 {
                    // Mutant: a leased entry deregistered by the trim (P3).
                    self.s.regs[h as usize].invalid = true;
                }
                self.dereg_list(a).push(h);
            }
            self.ret(t as u8, true, Op::Trim, Ret::Done);
            let plan = self.m.plan(self.s, req, access);
            note!(self, "A5: T{t} re-plans {} {} and registers again", plan.span, plan.access);
            self.thread_mut(t).inflight = Some(InFlight { span: plan.span, stale: false });
            let acq = self.acq_mut(t);
            acq.plan = Some(plan);
            acq.trimmed = true;
            self.unlock_exclusive(a);
            return;
        }
        note!(self, "A5: T{t}'s registrar fails again (EINVAL)");
        if let Some(h) = self.m.lookup(self.s, req, access) {
            note!(self, "A5: #{h} now covers the request: a hit");
            let ret = self.grant(t, h, true);
            self.unlock_exclusive(a);
            return self.finish(t, ret);
        }
        self.unlock_exclusive(a);
        let error = OpError::Registrar { failure: mrcache_types::RegistrarFailure::Other, pressure: true };
        self.finish(t, Ret::Failed { error });
    }

    //= spec.md#A10
    fn evict(&mut self, a: Actor) {
        let noted = std::mem::take(&mut self.s.threads[a as usize].noted);
        while self.m.over_limits(self.s) {
            let Some(v) = self.m.victim(self.s, &noted) else { break };
            note!(self, "A10: evict #{v}");
            self.revoke(a, v);
            self.s.regs[v as usize].findable = false;
            self.dereg_list(a).push(v);
        }
    }

    // ---- lanes (LN1–LN6) under x86-TSO ----

    fn popped_mut(&mut self, a: Actor) -> &mut Vec<Span> {
        if a == MONITOR {
            &mut self.s.monitor.popped
        } else {
            &mut self.s.threads[a as usize].popped
        }
    }

    fn sb_mut(&mut self, a: Actor) -> &mut Vec<Store> {
        if a == MONITOR {
            &mut self.s.monitor.sb
        } else {
            &mut self.s.threads[a as usize].sb
        }
    }

    fn revoke_mut(&mut self, a: Actor) -> &mut Option<Revoke> {
        if a == MONITOR {
            &mut self.s.monitor.revoke
        } else {
            &mut self.s.threads[a as usize].revoke
        }
    }

    fn set_applying(&mut self, what: Option<bool>) {
        if let Some(d) = self.dry.as_mut() {
            d.applying = what;
        }
    }

    fn apply_store(&mut self, st: Store) {
        match st {
            Store::Held { lane, slot, val } => self.s.lanes[lane as usize][slot as usize].held = val,
            Store::Ptr { lane, slot, val } => self.s.lanes[lane as usize][slot as usize].ptr = val,
        }
    }

    /// The oldest store in `a`'s store buffer reaches memory.
    fn flush_one(&mut self, a: Actor) {
        let st = self.sb_mut(a).remove(0);
        note!(self, "{}'s buffered store {} reaches memory", actor_name(a), buf_line(&[st]));
        self.apply_store(st);
    }

    /// A full barrier on `a` (a locked instruction, a system call): its
    /// buffered stores reach memory, in order.
    fn fence(&mut self, a: Actor) {
        for st in std::mem::take(self.sb_mut(a)) {
            self.apply_store(st);
        }
    }

    //= spec.md#LN5
    /// The step about to take entries out of the index: each such entry's
    /// slots must be revoked first. Called with the entry as it leaves the
    /// index. A dry run records it; a real step finds its slots revoked
    /// already, by the LN5 that [`Ctx::lane_prephase`] ran before the step.
    fn revoke(&mut self, a: Actor, h: Handle) {
        if !self.m.cfg.lanes {
            return;
        }
        if let Some(d) = self.dry.as_mut() {
            d.removed.push(h);
            match d.applying {
                Some(false) => d.by_queue.push(h),
                Some(true) => d.by_uffd.push(h),
                None => {}
            }
            return;
        }
        let left = self.m.lane_targets(self.s, a, &[h], false);
        assert!(left.is_empty(), "{} takes #{h} out of the index with live slots {left:?}", actor_name(a));
    }

    //= spec.md#LN5
    //# A6 (when it notes), R2 and trim revoke every slot before they note
    fn revoke_all(&mut self, a: Actor) {
        if !self.m.cfg.lanes {
            return;
        }
        if let Some(d) = self.dry.as_mut() {
            d.all = true;
            return;
        }
        let left = self.m.lane_targets(self.s, a, &[], true);
        assert!(left.is_empty(), "{} notes with live slots {left:?}", actor_name(a));
    }

    /// Before actor `a`'s step: a dry run of the step on a copy of the state
    /// says which entries it takes out of the index (or that it revokes
    /// every slot). If live slots point to them, the step waits and `a` runs
    /// LN5 first, in three steps: this one (take the lock exclusive if the
    /// step takes it, the lanes mutex; take the queued or uffd events whose
    /// entries are revoked, as the drain does before it can know the
    /// entries; store null into the slots, through the store buffer), then
    /// the heavy barrier, then the count reads and pins. Returns whether it
    /// took this first step.
    fn lane_prephase(&mut self, who: Who) -> bool {
        let a = match who {
            Who::Thread(t, _) | Who::Fails(t) => t as Actor,
            Who::Monitor => MONITOR,
        };
        if !(self.s.lock == Lock::Free || self.s.lock == Lock::Exclusive(a)) {
            return false;
        }
        if self.m.lane_targets(self.s, a, &[], true).is_empty() {
            return false;
        }
        let mut copy = self.s.clone();
        let dry = {
            let mut cx = Ctx { m: self.m, s: &mut copy, rec: None, dry: Some(Dry::default()) };
            match who {
                Who::Thread(t, alt) => cx.thread_body(t, alt),
                Who::Monitor => cx.monitor_body(),
                Who::Fails(t) => cx.registrar_fails(t),
            }
            cx.dry.take().expect("dry run")
        };
        let targets = self.m.lane_targets(self.s, a, &dry.removed, dry.all);
        if targets.is_empty() {
            return false;
        }
        //= spec.md#LN5
        //# revoke (under the lock exclusive and the lanes mutex): set `ptr` to null
        //# in every slot that points to the entries being revoked
        self.fence(a);
        if self.s.lock == Lock::Free {
            assert_ne!(a, MONITOR, "the monitor revokes only inside M2");
            self.lock_exclusive(a);
            self.s.threads[a as usize].prelocked = true;
            note!(self, "{} takes the lock exclusive", actor_name(a));
        }
        if targets.iter().any(|(_, _, h)| dry.by_queue.contains(h)) {
            let q = std::mem::take(&mut self.s.queue);
            note!(self, "A-D: {} takes the queued events {q:?} (applied after the revoke)", actor_name(a));
            self.popped_mut(a).extend(q);
        }
        if targets.iter().any(|(_, _, h)| dry.by_uffd.contains(h)) {
            for (span, w) in std::mem::take(&mut self.s.uffd) {
                note!(self, "{} reads the uffd event {span}: T{w} wakes up (applied after the revoke)", actor_name(a));
                self.s.threads[w as usize].waiting = false;
                self.popped_mut(a).push(span);
            }
        }
        for &(lane, slot, _) in &targets {
            self.sb_mut(a).push(Store::Ptr { lane, slot, val: None });
        }
        note!(
            self,
            "LN5: {} takes the lanes mutex and stores null into {} (store buffer)",
            actor_name(a),
            targets.iter().map(|(l, i, h)| format!("T{l}.slot{i} (#{h})")).collect::<Vec<_>>().join(", ")
        );
        *self.revoke_mut(a) = Some(Revoke { phase: RevokePhase::Barrier, slots: targets });
        true
    }

    //= spec.md#LN5
    //= spec.md#LN6
    //# LN5 stores null, runs the heavy barrier, then loads the count.
    fn revoke_step(&mut self, a: Actor) {
        let r = self.revoke_mut(a).clone().expect("an LN5 in progress");
        match r.phase {
            RevokePhase::Barrier => {
                if self.mutant(Mutant::LaneNoHeavyBarrier) {
                    note!(self, "LN5 (mutant 21): a full fence on {} only", actor_name(a));
                    self.fence(a);
                } else {
                    note!(self, "LN5: heavy barrier: every thread executes a full barrier (all store buffers drain)");
                    self.fence(a);
                    for t in 0..self.s.threads.len() {
                        self.fence(t as Actor);
                    }
                    self.fence(MONITOR);
                }
                self.revoke_mut(a).as_mut().expect("LN5").phase = RevokePhase::Count;
            }
            RevokePhase::Count => {
                for (lane, slot, h) in r.slots {
                    let (l, i) = (lane as usize, slot as usize);
                    let remote = self.s.lanes[l][i].remote;
                    let held = self.s.load_held(a, l, i);
                    let count = held.wrapping_sub(remote);
                    if count > 0 && !self.mutant(Mutant::LaneRevokeNoPin) {
                        assert_eq!(self.s.lanes[l][i].pin, None, "a live slot has no pin");
                        self.s.lanes[l][i].pin = Some(h);
                        self.s.regs[h as usize].leases += 1;
                        note!(self, "LN5: T{l}.slot{i} counts {count} (remote {remote}, held {held}): pin #{h}, its state word gains a lease");
                    } else {
                        note!(self, "LN5: T{l}.slot{i} counts {count} (remote {remote}, held {held}): no pin");
                    }
                }
                note!(self, "LN5: {} unlocks the lanes mutex", actor_name(a));
                *self.revoke_mut(a) = None;
            }
        }
    }

    /// The registrar fails (action `RegistrarFails`): with lanes, the trim
    /// (or the drain) revokes first.
    fn registrar_fails_step(&mut self, t: usize) {
        if self.m.cfg.lanes {
            if self.lane_prephase(Who::Fails(t)) {
                self.thread_mut(t).failing = true;
                return;
            }
            self.fence(t as Actor);
        }
        self.thread_mut(t).failing = false;
        self.registrar_fails(t)
    }

    //= spec.md#LN2
    //# after an A1 hit, if no slot has the key, take a slot with count 0 and no
    //# pin and set its key and `ptr`.
    /// (A slot that has the key with a null `ptr`, revoked, counts as not
    /// having it.) The stores reach memory at the unlock that follows.
    fn memoize(&mut self, t: usize, h: Handle) {
        if !self.m.cfg.lanes {
            return;
        }
        let key = (self.acq(t).req, self.acq(t).access);
        let a = t as Actor;
        if (0..LANE_SLOTS).any(|i| self.s.lanes[t][i].key == Some(key) && self.s.load_ptr(a, t, i).is_some()) {
            return;
        }
        let mut free: Vec<usize> =
            (0..LANE_SLOTS).filter(|&i| self.s.slot_count(t, i) == 0 && self.s.lanes[t][i].pin.is_none()).collect();
        free.sort_by_key(|&i| self.s.lanes[t][i].key != Some(key));
        let slot = match free.first() {
            Some(&i) => i,
            None if self.mutant(Mutant::LaneReuseBusySlot) => 0,
            None => {
                note!(self, "LN2: no free slot in T{t}'s lane: no memo");
                return;
            }
        };
        self.fence(a);
        let sl = &mut self.s.lanes[t][slot];
        sl.key = Some(key);
        sl.ptr = Some(h);
        note!(self, "LN2: T{t} memoizes #{h} in slot {slot} ({})", slot_line(&self.s.lanes[t][slot]));
    }

    //= spec.md#LN1
    //# store `held + 1`; light barrier; load `ptr` again.
    fn l1_store(&mut self, t: usize, slot: u8, h: Handle) {
        let val = self.s.load_held(t as Actor, t, slot as usize) + 1;
        self.sb_mut(t as Actor).push(Store::Held { lane: t as u8, slot, val });
        note!(self, "LN1: T{t} stores held = {val} into slot {slot} (store buffer)");
        if self.mutant(Mutant::LaneNoRecheck) {
            note!(self, "LN1 (mutant 22): no reload of ptr");
            return self.lane_hit(t, slot, h);
        }
        self.thread_mut(t).pc = Pc::L1Load { slot, h };
    }

    //= spec.md#LN1
    //# If unchanged, touch the LRU stamp and return the hit, a lease on the
    //# slot. Else store `held` back (this undo is a release that saw a revoke:
    //# run LN4) and go to A1.
    fn l1_load(&mut self, t: usize, slot: u8, h: Handle) {
        let a = t as Actor;
        let p = self.s.load_ptr(a, t, slot as usize);
        if p == Some(h) {
            note!(self, "LN1: light barrier (compiler fence); T{t} reloads slot {slot}'s ptr: #{h}, unchanged");
            return self.lane_hit(t, slot, h);
        }
        let val = self.s.load_held(a, t, slot as usize).wrapping_sub(1);
        self.sb_mut(a).push(Store::Held { lane: t as u8, slot, val });
        note!(self, "LN1: T{t} reloads slot {slot}'s ptr: null (revoked): it stores held = {val} back (store buffer) and runs LN4");
        self.thread_mut(t).pc = Pc::LN4 { slot, h, then_a1: true };
    }

    fn lane_hit(&mut self, t: usize, slot: u8, h: Handle) {
        let lease = self.acq(t).lease;
        self.touch(h);
        let th = self.thread_mut(t);
        th.held.push((lease, h));
        th.lane_leases.push((lease, slot));
        note!(self, "LN1: T{t}'s lane hit on #{h} (slot {slot})");
        let ret = self.judge_lease(t, h, true);
        self.finish(t, ret);
    }

    //= spec.md#LN3
    //# lane release: touch the LRU stamp; the owner stores `held − 1`
    /// (Releases run on the thread that acquired the lease: `remote` stays 0.)
    fn l3(&mut self, t: usize, lease: u64, slot: u8) {
        let th = self.thread_mut(t);
        let i = th.held.iter().position(|(l, _)| *l == lease).expect("a lane lease is held");
        let (_, h) = th.held.remove(i);
        th.lane_leases.retain(|(l, _)| *l != lease);
        if self.s.regs[h as usize].findable && !self.mutant(Mutant::ReleaseNoLruTouch) {
            self.touch(h);
        }
        let a = t as Actor;
        let val = self.s.load_held(a, t, slot as usize).wrapping_sub(1);
        self.sb_mut(a).push(Store::Held { lane: t as u8, slot, val });
        note!(self, "LN3: T{t} releases L{lease} on slot {slot}: stores held = {val} (store buffer)");
        self.thread_mut(t).pc = Pc::L3Load { slot, h };
    }

    //= spec.md#LN3
    //# Light barrier; load `ptr`: if it is still the lease's entry, read the
    //# over-limit flag and run R2 if it is set; else run LN4.
    fn l3_load(&mut self, t: usize, slot: u8, h: Handle) {
        let p = self.s.load_ptr(t as Actor, t, slot as usize);
        if p == Some(h) {
            let r2 = self.s.over_limit && !self.mutant(Mutant::NoReleaseEviction);
            note!(self, "LN3: T{t} reloads slot {slot}'s ptr: #{h}, still the lease's entry{}", if r2 { "; the over-limit flag is set: R2" } else { "" });
            if r2 {
                self.thread_mut(t).pc = Pc::R2;
            } else {
                self.finish(t, Ret::Done);
            }
        } else {
            note!(self, "LN3: T{t} reloads slot {slot}'s ptr: revoked: LN4");
            self.thread_mut(t).pc = Pc::LN4 { slot, h, then_a1: false };
        }
    }

    //= spec.md#LN4
    //# take the lanes mutex; if the slot's count is 0 and its pin is the
    //# lease's entry, clear the pin and release the pin as R1
    fn l4(&mut self, t: usize, slot: u8, h: Handle, then_a1: bool) {
        let (l, i) = (t, slot as usize);
        let count = self.s.slot_count(l, i);
        let mut r2 = false;
        if count == 0 && self.s.lanes[l][i].pin == Some(h) {
            self.s.lanes[l][i].pin = None;
            let r = &mut self.s.regs[h as usize];
            r.leases -= 1;
            let (left, invalid) = (r.leases, r.invalid);
            note!(self, "LN4: T{t} (lanes mutex) finds slot {slot} at count 0 with pin #{h}: clears it, decrements #{h} to {left}{}", if invalid { " (INVALID)" } else { "" });
            if left == 0 && invalid {
                //= spec.md#A-H
                self.deregister(h);
            } else {
                r2 = left == 0 && self.s.over_limit && !self.mutant(Mutant::NoReleaseEviction);
            }
        } else {
            let pin = self.s.lanes[l][i].pin;
            note!(self, "LN4: T{t} (lanes mutex) finds slot {slot} at count {count}, pin {pin:?}: nothing to return");
        }
        self.thread_mut(t).pc = match (then_a1, r2) {
            (true, true) => Pc::R2ThenA1,
            (true, false) => Pc::A1,
            (false, true) => Pc::R2,
            (false, false) => return self.finish(t, Ret::Done),
        };
    }

    /// Lanes: the A1 reader's drain after its unlock, as a step of its own.
    fn a1_drain(&mut self, t: usize, h: Handle) {
        let skip = self.mutant(Mutant::QueueNeverDrained) || self.mutant(Mutant::ReaderSkipsDrain);
        let pending = !self.s.queue.is_empty() || !self.s.threads[t].popped.is_empty();
        if !skip && (self.prelocked(t) || (pending && self.s.lock == Lock::Free)) {
            note!(self, "A1: T{t} unlocked with events queued: it tries the lock exclusive and drains");
            self.lock_exclusive(t as Actor);
            self.drain_queue(t as Actor);
            self.unlock_exclusive(t as Actor);
        }
        let reg = self.m.view(self.s, h);
        let pressure = self.acq(t).trimmed;
        self.finish(t, Ret::Granted { reg, hit: true, pressure });
    }

    // ---- application threads ----

    fn thread_step(&mut self, t: usize, alt: bool) {
        if self.m.cfg.lanes {
            if self.s.threads[t].revoke.is_some() {
                return self.revoke_step(t as Actor);
            }
            if self.lane_prephase(Who::Thread(t, alt)) {
                return;
            }
            if self.m.step_flushes(self.s, t) {
                self.fence(t as Actor);
            }
        }
        self.thread_body(t, alt)
    }

    fn thread_body(&mut self, t: usize, alt: bool) {
        if !self.s.threads[t].toctou.is_empty() {
            return self.read_counts_late(t as Actor);
        }
        if self.s.threads[t].ev.is_some() {
            return self.ev_step(t);
        }
        match self.s.threads[t].pc {
            Pc::Idle => self.start_op(t),
            Pc::A1Look => self.a1_lookup(t),
            Pc::A2 => {
                //= spec.md#A2
                note!(self, "A2: T{t} takes the lock exclusive and drains");
                self.lock_exclusive(t as Actor);
                self.drain_queue(t as Actor);
                self.read_and_apply_uffd(t as Actor);
                self.thread_mut(t).pc = Pc::A3;
            }
            Pc::A3 => self.a3(t),
            Pc::A5 => self.a5(t, alt),
            Pc::A6 => {
                //= spec.md#A6
                note!(self, "A6: T{t} takes the lock exclusive, notes the unleased entries if the insert could exceed a limit, and drains");
                self.lock_exclusive(t as Actor);
                let bytes = self.acq(t).plan.as_ref().expect("A4 planned").span.bytes();
                if self.m.could_exceed_limits(self.s, bytes) {
                    self.note_unleased(t);
                }
                self.drain_queue(t as Actor);
                self.read_and_apply_uffd(t as Actor);
                self.thread_mut(t).pc = Pc::A7;
            }
            Pc::A7 => self.a7(t, alt),
            Pc::A10 => self.a10(t),
            Pc::A10b => self.a10b(t),
            Pc::A11 => self.a11(t),
            Pc::R1Touch(h, r2) => {
                note!(self, "R1 (mutant 19): T{t} touches #{h}'s LRU stamp after its decrement");
                self.touch(h);
                if r2 {
                    self.thread_mut(t).pc = Pc::R2;
                } else {
                    self.finish(t, Ret::Done);
                }
            }
            Pc::R2 => {
                self.r2(t);
                self.finish(t, Ret::Done);
            }
            Pc::R2ThenA1 => {
                self.r2(t);
                self.thread_mut(t).pc = Pc::A1;
            }
            Pc::L1Store { slot, h } => self.l1_store(t, slot, h),
            Pc::L1Load { slot, h } => self.l1_load(t, slot, h),
            Pc::A1 => self.a1_enter(t),
            Pc::A1Drain(h) => self.a1_drain(t, h),
            Pc::L3Load { slot, h } => self.l3_load(t, slot, h),
            Pc::LN4 { slot, h, then_a1 } => self.l4(t, slot, h, then_a1),
            Pc::Event | Pc::Done => unreachable!("T{t} has no step at {:?}", self.s.threads[t].pc),
        }
    }

    //= spec.md#R2
    fn r2(&mut self, t: usize) {
        note!(self, "R2: T{t} takes the lock exclusive, notes the unleased entries, drains and evicts");
        self.lock_exclusive(t as Actor);
        self.note_unleased(t);
        self.drain_queue(t as Actor);
        self.evict(t as Actor);
        self.settle_over_limit();
        self.unlock_exclusive(t as Actor);
    }

    /// Invokes the thread's next script op and takes its first step.
    fn start_op(&mut self, t: usize) {
        let (op, sop) = self.m.scripts[t][self.s.threads[t].next_op as usize];
        self.invoke(t as u8, false, op);
        match sop {
            ScriptOp::Acquire { lease, span, access } => {
                let snap = span.pages().map(|p| self.s.done_gens[p as usize]).collect();
                self.thread_mut(t).acq =
                    Some(Acq { lease, req: span, access, snap, attempts: 0, plan: None, handle: None, trimmed: false });
                if let Some((slot, h)) = self.m.l1_slot(self.s, t, span, access) {
                    //= spec.md#LN1
                    //# if the queue is empty and a slot of this thread's lane has exactly
                    //# the request's key (page span, access) and a non-null `ptr`
                    note!(self, "LN1: no event pending; slot {slot} of T{t}'s lane has the key and ptr #{h}");
                    self.thread_mut(t).pc = Pc::L1Store { slot, h };
                    return;
                }
                self.a1_enter(t);
            }
            ScriptOp::Release { lease } => match self.s.threads[t].lane_leases.iter().find(|(l, _)| *l == lease) {
                Some(&(_, slot)) => self.l3(t, lease, slot),
                None => self.r1(t, lease),
            },
            ScriptOp::Event { kind, span } => {
                self.thread_mut(t).pc = Pc::Event;
                self.start_event(t, kind, span, Origin::Script);
            }
        }
    }

    //= spec.md#A1
    //= spec.md#S3.9
    //# The fast (read-locked) hit path is taken only when the queue is empty.
    fn a1_enter(&mut self, t: usize) {
        if !self.s.queue.is_empty() {
            note!(self, "A1: the queue is not empty: T{t} takes the slow path");
            self.thread_mut(t).pc = Pc::A2;
        } else {
            note!(self, "A1: the queue is empty: T{t} takes the lock shared");
            self.lock_shared();
            self.thread_mut(t).pc = Pc::A1Look;
        }
    }

    //= spec.md#A1
    fn a1_lookup(&mut self, t: usize) {
        let (req, access) = (self.acq(t).req, self.acq(t).access);
        match self.m.lookup(self.s, req, access) {
            Some(h) => {
                note!(self, "A1: hit #{h} under the shared lock");
                let ret = self.grant(t, h, true);
                self.memoize(t, h);
                self.unlock_shared();
                if self.m.cfg.lanes {
                    // The reader's drain is a step of its own (it may revoke).
                    if !self.s.queue.is_empty() {
                        self.thread_mut(t).pc = Pc::A1Drain(h);
                    } else {
                        self.finish(t, ret);
                    }
                    return;
                }
                // The reader's part of "the holder drains": a hook that found the
                // lock held shared left its event queued; the last reader out
                // tries the lock and drains, as H2 would.
                let skip = self.mutant(Mutant::QueueNeverDrained) || self.mutant(Mutant::ReaderSkipsDrain);
                if !skip && !self.s.queue.is_empty() && self.s.lock == Lock::Free {
                    note!(self, "A1: T{t} unlocked with events queued: it tries the lock exclusive and drains");
                    self.lock_exclusive(t as Actor);
                    self.drain_queue(t as Actor);
                    self.unlock_exclusive(t as Actor);
                }
                self.finish(t, ret);
            }
            None => {
                note!(self, "A1: no covering entry: T{t} unlocks and takes the slow path");
                self.unlock_shared();
                self.thread_mut(t).pc = Pc::A2;
            }
        }
    }

    fn a3(&mut self, t: usize) {
        let (req, access) = (self.acq(t).req, self.acq(t).access);
        //= spec.md#A3
        if let Some(h) = self.m.lookup(self.s, req, access) {
            note!(self, "A3: hit #{h}");
            let ret = self.grant(t, h, true);
            self.unlock_exclusive(t as Actor);
            return self.finish(t, ret);
        }
        //= spec.md#A4
        let plan = self.m.plan(self.s, req, access);
        note!(self, "A4: miss: T{t} plans {} {} (displacing {:?}), adds an in-flight record and unlocks", plan.span, plan.access, plan.displaced);
        self.thread_mut(t).inflight = Some(InFlight { span: plan.span, stale: false });
        self.acq_mut(t).plan = Some(plan);
        self.unlock_exclusive(t as Actor);
        self.thread_mut(t).pc = Pc::A5;
    }

    //= spec.md#A5
    //# call the registrar without the lock.
    fn a5(&mut self, t: usize, alt: bool) {
        let plan = self.acq(t).plan.clone().expect("A4 planned");
        let pinned: Vec<u8> = plan.span.pages().map(|p| self.s.gens[p as usize]).collect();
        let h = self.s.regs.len() as Handle;
        note!(self, "A5: T{t} registers {} {} without the lock: #{h} pins generations {pinned:?}", plan.span, plan.access);
        self.s.regs.push(Reg {
            span: plan.span,
            access: plan.access,
            pinned,
            deregs: 0,
            id: 0,
            findable: false,
            leases: 0,
            invalid: false,
            displaced: false,
            last_use: 0,
        });
        self.acq_mut(t).handle = Some(h);
        self.thread_mut(t).pc = Pc::A6;
        if alt {
            let p = self.m.cfg.registrar_frees.expect("alternative only when configured");
            note!(self, "A5: the registrar frees page {p} while it registers");
            self.s.registrar_free_left = false;
            self.start_event(t, ReleaseKind::Munmap, Span::new(p, p + 1), Origin::Registrar);
        }
    }

    fn a7(&mut self, t: usize, alt: bool) {
        let handle = self.acq(t).handle.expect("A5 registered");
        match self.m.a7_outcome(self.s, t) {
            A7::Stale { replan } => {
                //= spec.md#A7
                //= spec.md#S3.7
                if replan {
                    note!(self, "A7: the overlap policy's plan changed while the lock was dropped: #{handle} is thrown away");
                } else {
                    note!(self, "A7: the in-flight record is stale: #{handle} is thrown away");
                }
                self.thread_mut(t).inflight = None;
                self.dereg_list(t as Actor).push(handle);
                let acq = self.acq_mut(t);
                acq.handle = None;
                acq.plan = None;
                acq.attempts += 1;
                let exhausted = acq.attempts >= self.m.cfg.max_retries;
                self.thread_mut(t).noted.clear();
                self.settle_over_limit();
                self.unlock_exclusive(t as Actor);
                if exhausted {
                    self.finish(t, Ret::Failed { error: OpError::RetriesExhausted });
                } else {
                    self.thread_mut(t).pc = Pc::A2;
                }
            }
            A7::Hit(h) => {
                //= spec.md#A8
                note!(self, "A8: #{h} now covers the request: lease it, throw #{handle} away");
                self.thread_mut(t).inflight = None;
                self.dereg_list(t as Actor).push(handle);
                self.acq_mut(t).handle = None;
                let ret = self.grant(t, h, true);
                self.thread_mut(t).noted.clear();
                self.settle_over_limit();
                self.unlock_exclusive(t as Actor);
                self.finish(t, ret);
            }
            A7::Insert => {
                //= spec.md#A9
                let acq = self.acq(t).clone();
                let displaced = if self.mutant(Mutant::StaleMergePlan) {
                    acq.plan.clone().expect("A4 planned").displaced
                } else {
                    self.m.plan(self.s, acq.req, acq.access).displaced
                };
                self.thread_mut(t).inflight = None;
                let id = self.s.next_id;
                self.s.next_id += 1;
                let r = &mut self.s.regs[handle as usize];
                r.id = id;
                r.findable = true;
                note!(self, "A9: insert #{handle} as R{id}; displace {displaced:?}");
                let _ = self.grant(t, handle, false);
                for d in displaced {
                    self.revoke(t as Actor, d);
                    let r = &mut self.s.regs[d as usize];
                    r.findable = false;
                    r.invalid = true;
                    r.displaced = true;
                    let drop_leased = self.mutant(Mutant::MergeDropsLeased) && self.m.cfg.policy == OverlapPolicy::Merge;
                    if self.s.regs[d as usize].leases == 0 || drop_leased {
                        self.dereg_list(t as Actor).push(d);
                    }
                }
                let next = if self.m.cfg.has_limits() { Pc::A10 } else { Pc::A11 };
                if alt {
                    let span = self.m.cache_free_span();
                    note!(self, "A9: the cache frees its own memory ({span}) while it holds the lock");
                    self.s.cache_free_left = false;
                    self.thread_mut(t).pc = next;
                    self.start_event(t, ReleaseKind::Munmap, span, Origin::Cache);
                } else if next == Pc::A10 {
                    self.thread_mut(t).pc = Pc::A10;
                } else {
                    self.a11(t);
                }
            }
        }
    }

    //= spec.md#A10
    //# Correct order: A6 raised the over-limit flag *before* noting the
    //# unleased entries, so that a release (R1: decrement, then read the
    //# flag) either was noted or sees the flag.
    fn a10(&mut self, t: usize) {
        self.evict(t as Actor);
        if self.mutant(Mutant::OverLimitFlagLate) && self.m.over_limits(self.s) {
            self.thread_mut(t).pc = Pc::A10b;
        } else {
            self.settle_over_limit();
            self.a11(t);
        }
    }

    /// Mutant 13's late flag.
    fn a10b(&mut self, t: usize) {
        note!(self, "A10: still over a limit, every noted entry leased: raise the over-limit flag");
        self.s.over_limit = true;
        self.a11(t);
    }

    //= spec.md#A11
    fn a11(&mut self, t: usize) {
        let h = self.acq(t).handle.expect("A9 inserted");
        self.unlock_exclusive(t as Actor);
        let reg = self.m.view(self.s, h);
        let pressure = self.acq(t).trimmed;
        self.finish(t, Ret::Granted { reg, hit: false, pressure });
    }

    //= spec.md#R1
    fn r1(&mut self, t: usize, lease: u64) {
        let Some(i) = self.s.threads[t].held.iter().position(|(l, _)| *l == lease) else {
            // The acquire failed (E6), so the lease is not held.
            return self.finish(t, Ret::Failed { error: OpError::UnknownLease { lease } });
        };
        let (_, h) = self.thread_mut(t).held.remove(i);
        let r = &mut self.s.regs[h as usize];
        r.leases -= 1;
        let (left, invalid, findable) = (r.leases, r.invalid, r.findable);
        // R1 touches the LRU stamp *before* its decrement (mutant 19 touches
        // after it, mutant 16 never).
        let late = self.mutant(Mutant::ReleaseTouchAfterDecrement) && self.m.cfg.has_limits();
        if findable && !self.mutant(Mutant::ReleaseNoLruTouch) && !late {
            self.touch(h);
        }
        note!(self, "R1: T{t} decrements #{h} to {left}{}", if invalid { " (INVALID)" } else { "" });
        if left == 0 && invalid {
            //= spec.md#A-H
            //# a release owns the deregistration iff its decrement took the count
            //# from 1 to 0 with INVALID set.
            self.deregister(h);
            self.finish(t, Ret::Done);
            return;
        }
        let r2 = left == 0 && self.s.over_limit && !self.mutant(Mutant::NoReleaseEviction);
        if late && findable {
            self.thread_mut(t).pc = Pc::R1Touch(h, r2);
        } else if r2 {
            self.thread_mut(t).pc = Pc::R2;
        } else {
            self.finish(t, Ret::Done);
        }
    }

    // ---- release events ----

    fn start_event(&mut self, t: usize, kind: ReleaseKind, span: Span, origin: Origin) {
        if origin != Origin::Script {
            let op = Op::ReleaseEvent { kind, addr: span.addr(), len: span.bytes() };
            self.invoke(t as u8, true, op);
        }
        let pc = self.m.first_ev_pc(&span);
        self.thread_mut(t).ev = Some(Ev { pc, span, kind, origin, assigned: Vec::new() });
        self.ev_step(t);
    }

    fn bump(&mut self, t: usize) {
        let span = self.s.threads[t].ev.as_ref().expect("event").span;
        let mut assigned = Vec::new();
        for p in span.pages() {
            self.s.gens[p as usize] += 1;
            assigned.push(self.s.gens[p as usize]);
        }
        note!(self, "kernel: {span} is released (new generations {assigned:?})");
        self.thread_mut(t).ev.as_mut().expect("event").assigned = assigned;
    }

    fn set_ev_pc(&mut self, t: usize, pc: EvPc) {
        self.thread_mut(t).ev.as_mut().expect("event").pc = pc;
    }

    fn ev_step(&mut self, t: usize) {
        let ev = self.s.threads[t].ev.clone().expect("event in progress");
        let nbr = self.mutant(Mutant::NotifyBeforeRelease);
        match ev.pc {
            EvPc::Bump => {
                self.bump(t);
                match self.m.cfg.monitor {
                    MonitorKind::Sync => self.set_ev_pc(t, EvPc::H1),
                    MonitorKind::Async if self.m.uffd_watches(&ev.span) => {
                        note!(self, "kernel: uffd event {} queued; T{t} sleeps until it is read", ev.span);
                        self.s.uffd.push((ev.span, t as Actor));
                        self.thread_mut(t).waiting = true;
                        self.set_ev_pc(t, EvPc::Wait);
                    }
                    MonitorKind::Async => self.finish_event(t),
                }
            }
            EvPc::H1 => {
                //= spec.md#H1
                note!(self, "H1: T{t} pushes {} on the invalidation queue", ev.span);
                self.s.queue.push(ev.span);
                self.set_ev_pc(t, EvPc::H2);
            }
            EvPc::H2 => {
                //= spec.md#H2
                //= spec.md#S7.2
                if self.s.lock == Lock::Free || self.prelocked(t) {
                    note!(self, "H2: T{t} gets the lock: drains and unlocks");
                    self.lock_exclusive(t as Actor);
                    self.drain_queue(t as Actor);
                    self.unlock_exclusive(t as Actor);
                } else {
                    note!(self, "H2: the lock is busy: T{t} returns, leaving the event queued");
                }
                if nbr {
                    self.set_ev_pc(t, EvPc::BumpLast);
                } else {
                    self.finish_event(t);
                }
            }
            EvPc::Enqueue => {
                note!(self, "kernel: uffd event {} queued before the frames change; T{t} sleeps", ev.span);
                self.s.uffd.push((ev.span, t as Actor));
                self.thread_mut(t).waiting = true;
                self.set_ev_pc(t, EvPc::Wait);
            }
            EvPc::Wait => {
                note!(self, "T{t} wakes up: its uffd event was read");
                if nbr {
                    self.set_ev_pc(t, EvPc::BumpLast);
                } else {
                    self.finish_event(t);
                }
            }
            EvPc::BumpLast => {
                self.bump(t);
                self.finish_event(t);
            }
        }
    }

    fn finish_event(&mut self, t: usize) {
        let ev = self.thread_mut(t).ev.take().expect("event in progress");
        for (i, p) in ev.span.pages().enumerate() {
            let d = &mut self.s.done_gens[p as usize];
            *d = (*d).max(ev.assigned[i]);
        }
        match ev.origin {
            Origin::Script => self.finish(t, Ret::Done),
            _ => {
                let op = Op::ReleaseEvent { kind: ev.kind, addr: ev.span.addr(), len: ev.span.bytes() };
                note!(self, "the {:?} release of {} returns", ev.origin, ev.span);
                self.ret(t as u8, true, op, Ret::Done);
            }
        }
    }

    // ---- the uffd monitor thread ----

    fn monitor_read(&mut self) {
        for (span, w) in std::mem::take(&mut self.s.uffd) {
            note!(self, "monitor reads the uffd event {span}: T{w} wakes up");
            self.s.threads[w as usize].waiting = false;
            self.s.monitor.buf.push(span);
        }
    }

    fn monitor_apply(&mut self) {
        for span in std::mem::take(&mut self.s.monitor.buf) {
            self.apply_event(span, MONITOR);
        }
    }

    fn monitor_step(&mut self) {
        if self.m.cfg.lanes {
            if self.s.monitor.revoke.is_some() {
                return self.revoke_step(MONITOR);
            }
            if self.lane_prephase(Who::Monitor) {
                return;
            }
            self.fence(MONITOR);
        }
        self.monitor_body()
    }

    fn monitor_body(&mut self) {
        if !self.s.monitor.toctou.is_empty() {
            return self.read_counts_late(MONITOR);
        }
        let outside = self.mutant(Mutant::AsyncApplyOutsideLock);
        let blocking_read = self.mutant(Mutant::AsyncBlockingReadOutsideLock);
        match self.s.monitor.pc {
            MonPc::Idle if outside || blocking_read => {
                note!(self, "monitor reads without the lock");
                self.monitor_read();
                self.s.monitor.pc = if outside { MonPc::Apply } else { MonPc::Lock };
            }
            MonPc::Idle => {
                //= spec.md#M1
                note!(self, "M1: the uffd fd is readable (nothing read yet)");
                self.s.monitor.pc = MonPc::Lock;
            }
            MonPc::Lock => {
                //= spec.md#M2
                note!(self, "M2: monitor takes the lock exclusive");
                self.lock_exclusive(MONITOR);
                self.s.monitor.pc = if blocking_read { MonPc::Apply } else { MonPc::Read };
            }
            MonPc::Read => {
                //= spec.md#S3.8
                //# reads are non-blocking and happen only while holding the write lock
                self.monitor_read();
                if self.s.monitor.buf.is_empty() {
                    note!(self, "M2: nothing left to read (A2/A6 read it): unlock");
                    self.unlock_exclusive(MONITOR);
                    self.s.monitor.pc = MonPc::Idle;
                } else {
                    self.s.monitor.pc = MonPc::Apply;
                }
            }
            MonPc::Apply => {
                self.monitor_apply();
                if outside {
                    self.perform_dereg(MONITOR);
                } else {
                    self.unlock_exclusive(MONITOR);
                }
                self.s.monitor.pc = MonPc::Idle;
            }
        }
    }
}

impl Model for AlgoModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.init_state()]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for t in 0..s.threads.len() {
            if self.thread_enabled(s, t) {
                actions.push(Action::Thread { t: t as u8, alt: false });
                if self.thread_alt(s, t) {
                    actions.push(Action::Thread { t: t as u8, alt: true });
                }
            }
        }
        if self.monitor_enabled(s) {
            actions.push(Action::Monitor);
        }
        for t in 0..s.threads.len() {
            if self.registrar_may_fail(s, t) {
                actions.push(Action::RegistrarFails { t: t as u8 });
            }
        }
        if self.cfg.lanes {
            for t in 0..s.threads.len() {
                if !s.threads[t].sb.is_empty() {
                    actions.push(Action::Flush { a: t as Actor });
                }
            }
            if !s.monitor.sb.is_empty() {
                actions.push(Action::Flush { a: MONITOR });
            }
        }
    }

    fn next_state(&self, s: &State, a: Action) -> Option<State> {
        let mut next = s.clone();
        self.step(&mut next, a, None);
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        props::properties(self)
    }

    fn format_action(&self, a: &Action) -> String {
        match a {
            Action::Thread { t, alt: false } => format!("T{t}"),
            Action::Thread { t, alt: true } => format!("T{t} (alternative branch)"),
            Action::Monitor => "monitor".into(),
            Action::RegistrarFails { t } => format!("T{t} (registrar fails)"),
            Action::Flush { a } => format!("{} (flush its oldest buffered store)", actor_name(*a)),
        }
    }

    fn format_step(&self, last: &State, a: Action) -> Option<String> {
        let mut next = last.clone();
        let mut rec = Rec::default();
        self.step(&mut next, a, Some(&mut rec));
        Some(format!("{}\n{}\n{}", self.label(last, a), rec.notes.join("\n"), next.summary()))
    }
}
