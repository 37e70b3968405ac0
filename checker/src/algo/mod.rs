//! The §A algorithm, step by step, as a stateright [`Model`].
//!
//! Each action is one step of one actor (an application thread or the uffd
//! monitor); a step is atomic, so its granularity decides which interleavings
//! are explored. See the crate docs for the step mapping.

use crate::config::{compile_scripts, CacheFrees, CheckConfig, MonitorKind, Mutant, ScriptOp, MAX_PAGES};
use crate::state::*;
use lanes::revoke_label;
use mrcache_model::Model as RefModel;
use mrcache_types::{LeaseId, Op, RegView, Ret};
use stateright::{Model, Property};

/// One step of one actor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Thread `t` takes its next step. `alt` takes the other branch of a
    /// choice: the registrar frees memory during A5, or the cache frees its
    /// own memory at A9 under the lock.
    Thread { t: u8, alt: bool },
    /// The uffd monitor thread takes its next step (with several caches,
    /// the process monitor's reader thread, M6).
    Monitor,
    /// The process monitor's service thread (several caches, M5) drains
    /// the next cache of its round.
    Service,
    /// Thread `t`'s registrar call fails (at A5): ENOMEM the first time in an
    /// acquire (the trim of S5.4), EINVAL after it (E5).
    RegistrarFails { t: u8 },
    /// Lanes: the oldest store in actor `a`'s store buffer reaches memory.
    Flush { a: Actor },
    /// `CheckConfig::remove`: the uffd monitor thread closes a REMOVE
    /// window whose madvise has returned (M4).
    CloseWindow,
    /// Lanes (`CheckConfig::give_backs`): thread `t`, between operations,
    /// gives its lane's claim back (a store through its store buffer).
    GiveClaim { t: u8 },
    /// kdreg2 model: the kernel worker takes the module's mutex (waiting
    /// for it) and invalidates the oldest deferred range.
    Worker,
    /// `CheckConfig::proof_steps`: the monitor's next step of S7.5's proof
    /// (M4): scan the threads for the windows opened since, or one pass
    /// (collect acknowledgements, look again, signal, close).
    Prove,
    /// `CheckConfig::proof_steps`: the proof signal's handler runs on
    /// thread `t` (a return to user mode) and stores its token.
    Ack { t: u8 },
}

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
    /// The leases a thread other than their acquirer releases (handed
    /// over): (lease, acquiring thread, index of the acquire in its script).
    pub handed: Vec<(LeaseId, usize, u8)>,
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

mod acquire;
mod dereg;
mod events;
mod evict;
mod flush;
mod fork;
mod kdreg2;
mod lanes;
mod proof;
mod properties;
mod release;
mod tso;

impl AlgoModel {
    pub fn new(cfg: CheckConfig) -> Result<AlgoModel, String> {
        if cfg.max_retries == 0 {
            return Err("max_retries must be at least 1".into());
        }
        if cfg.pair && cfg.monitor != MonitorKind::Sync {
            return Err("the W1/W2 pair is a hook's (sync monitor only)".into());
        }
        if cfg.remove && cfg.monitor != MonitorKind::Async {
            return Err("madvise REMOVE events are userfaultfd's (async monitor only)".into());
        }
        if cfg.remove && cfg.lanes {
            return Err("the REMOVE windows (M3, M4) are not modelled with the lanes".into());
        }
        if cfg.monitor.is_kdreg2() && (cfg.lanes || cfg.lockless || cfg.registrar_frees.is_some() || cfg.cache_frees.is_some()) {
            return Err("the kdreg2 models run without lanes, A0, and registrar and cache frees".into());
        }
        if cfg.caches == 0 || cfg.caches > 2 {
            return Err("--caches is 1 or 2".into());
        }
        if cfg.caches > 1
            && (cfg.monitor != MonitorKind::Async
                || cfg.lanes
                || cfg.pair
                || cfg.has_limits()
                || cfg.registrar_frees.is_some()
                || cfg.cache_frees.is_some()
                || cfg.registrar_failures > 0)
        {
            return Err("two caches (M5) are modelled with the async monitor only, without lanes, limits, pair, or registrar and cache frees and failures".into());
        }
        if !(1..=4).contains(&cfg.lane_slots) {
            return Err("--lane-slots is 1 to 4".into());
        }
        if (cfg.lane_slots != 1 || cfg.give_backs > 0) && !cfg.lanes {
            return Err("--lane-slots and --give-backs need --lanes".into());
        }
        if !(1..=4).contains(&cfg.chunk_pages) {
            return Err("--chunk-pages is 1 to 4".into());
        }
        let forks = cfg.scripts().iter().flatten().any(|op| matches!(op, Op::Fork));
        if forks
            && (cfg.monitor != MonitorKind::Sync
                || cfg.lanes
                || cfg.lockless
                || cfg.pair
                || cfg.caches > 1
                || cfg.registrar_frees.is_some()
                || cfg.cache_frees.is_some())
        {
            return Err(
                "a fork (F1) is modelled with the sync monitor only, without lanes, A0, the pair, two caches, or registrar and cache frees"
                    .into(),
            );
        }
        if cfg.give_backs > 2 {
            return Err("--give-backs is 0 to 2".into());
        }
        let scripts = compile_scripts(&cfg.scripts())?;
        let mut handed = Vec::new();
        for (t, s) in scripts.iter().enumerate() {
            for (u, other) in scripts.iter().enumerate() {
                for (_, op) in other {
                    if let ScriptOp::Release { lease } = *op {
                        if u != t {
                            if let Some(i) = s.iter().position(|(_, o)| matches!(*o, ScriptOp::Acquire { lease: l, .. } if l == lease)) {
                                handed.push((lease, t, i as u8));
                            }
                        }
                    }
                }
            }
        }
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
        // A registration widened to chunks (S6.2) stays inside the app's
        // pages, short of the cache's private page.
        let chunk = cfg.chunk_pages.max(1);
        app_pages = app_pages.div_ceil(chunk) * chunk;
        if app_pages >= MAX_PAGES {
            return Err(format!("the scripts use {app_pages} pages; the checker allows {}", MAX_PAGES - 1));
        }
        Ok(AlgoModel { cfg, scripts, app_pages, private_page: app_pages, handed })
    }

    pub fn mutant(&self, m: Mutant) -> bool {
        self.cfg.mutant == Some(m)
    }

    pub(super) fn is_async(&self) -> bool {
        self.cfg.monitor == MonitorKind::Async
    }

    /// The caches are attached to the process's monitor (M5, M6): the
    /// reader publishes into the ring, each cache applies it in its drains
    /// and gates its hits. Modelled with two caches; one cache's async
    /// monitor is the single-cache source (M2).
    pub fn ring(&self) -> bool {
        self.cfg.caches > 1
    }

    pub fn init_state(&self) -> State {
        let pages = (self.app_pages + 1) as usize;
        let mut st = State {
            gens: smallvec::smallvec![0; pages],
            done_gens: smallvec::smallvec![0; pages],
            lock: Lock::Free,
            regs: crate::shared::Shared::new(Vec::new()),
            next_id: 1,
            queue: Vec::new(),
            windows: Vec::new(),
            memo: Vec::new(),
            cells: Vec::new(),
            uncounted_windows: 0,
            windowed_served: false,
            remove_windows: Vec::new(),
            proofs: Vec::new(),
            uffd: Vec::new(),
            kqueue: Vec::new(),
            kdeferred: Vec::new(),
            klock: false,
            ring: Vec::new(),
            reading: false,
            applied: 0,
            over_limit: false,
            clock: 0,
            gds_floor: 0,
            threads: self
                .scripts
                .iter()
                .map(|s| {
                    crate::shared::Shared::new(Thread {
                        pc: if s.is_empty() { Pc::Done } else { Pc::Idle },
                        next_op: 0,
                        acq: None,
                        ev: None,
                        inflight: None,
                        held: smallvec::SmallVec::new(),
                        dereg: Vec::new(),
                        toctou: Vec::new(),
                        waiting: false,
                        noted: Vec::new(),
                        sb: Vec::new(),
                        revoke: None,
                        popped: Vec::new(),
                        prelocked: false,
                        lane_leases: Vec::new(),
                        lane: None,
                        failing: false,
                        post: None,
                        sig: Sig::None,
                    })
                })
                .collect(),
            monitor: crate::shared::Shared::new(Monitor {
                pc: MonPc::Idle,
                buf: Vec::new(),
                dereg: Vec::new(),
                toctou: Vec::new(),
                sb: Vec::new(),
                revoke: None,
                popped: Vec::new(),
                svc: None,
                svc_from: Vec::new(),
            }),
            lanes: if self.cfg.lanes { vec![vec![Slot::default(); self.cfg.lane_slots as usize]; self.scripts.len()] } else { Vec::new() },
            claimed: if self.cfg.lanes { vec![true; self.scripts.len()] } else { Vec::new() },
            give_backs_left: self.cfg.give_backs,
            registrar_free_left: self.cfg.registrar_frees.is_some(),
            reg_failures_left: self.cfg.registrar_failures,
            trim_evicted: false,
            cache_free_left: self.cfg.cache_frees.is_some(),
            bad: Vec::new(),
            lin: crate::history::History::new(RefModel::new(self.cfg.model_config()).concurrent().trims_logged()),
            others: (1..self.cfg.caches)
                .map(|_| CacheSide {
                    lock: Lock::Free,
                    regs: crate::shared::Shared::new(Vec::new()),
                    next_id: 1,
                    queue: Vec::new(),
                    windows: Vec::new(),
                    windowed_served: false,
                    remove_windows: Vec::new(),
                    over_limit: false,
                    clock: 0,
                    trim_evicted: false,
                    applied: 0,
                    lin: crate::history::History::new(RefModel::new(self.cfg.model_config()).concurrent().trims_logged()),
                })
                .collect(),
        };
        if self.cfg.lanes {
            for (t, th) in st.threads.iter_mut().enumerate() {
                th.lane = Some(t as u8);
            }
        }
        st
    }

    /// The cache thread `t` uses (spec.md#S7.6: `t mod caches`).
    pub fn cache_of(&self, t: usize) -> usize {
        t % self.cfg.caches.max(1) as usize
    }

    pub fn view(&self, s: &State, h: Handle) -> RegView {
        let r = &s.regs[h as usize];
        RegView { id: r.id as u64, addr: r.span.addr(), len: r.span.bytes(), access: r.access }
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
        // A11's post-unlock drain only tries the lock.
        if th.post.is_some() {
            return true;
        }
        if let Some(ev) = &th.ev {
            return match ev.pc {
                // Mutant `blocking-hook`: the hook waits for the lock instead of trying it.
                EvPc::H2 if self.mutant(Mutant::BlockingHook) => s.lock == Lock::Free,
                EvPc::Wait => !th.waiting,
                // kdreg2-wait: the notifier blocks on the module's mutex.
                EvPc::Notify => self.cfg.monitor != MonitorKind::Kdreg2Wait || !s.klock,
                _ => true,
            };
        }
        match th.pc {
            Pc::Idle => match self.scripts[t][th.next_op as usize].1 {
                // A1: a reader blocks while a writer holds the lock, unless the
                // queue is non-empty (then it goes straight to A2). LN1 takes no lock.
                ScriptOp::Acquire { span, access, .. } => {
                    !s.queue.is_empty()
                        || !matches!(s.lock, Lock::Exclusive(_))
                        || self.ln1_slot(s, t, span, access).is_some()
                        || !self.gate_passes(s)
                }
                ScriptOp::Release { lease } => self.handed_over(s, lease),
                ScriptOp::Event { .. } | ScriptOp::Flush | ScriptOp::Fork => true,
            },
            Pc::A1 => !s.queue.is_empty() || !matches!(s.lock, Lock::Exclusive(_)),
            // With the process's monitor, A2's and A6's drains wait out a
            // read in progress (M6); the lock taken first is a right mover.
            Pc::A2 | Pc::A6 => (s.lock == Lock::Free || th.prelocked) && self.drain_may_finish(s),
            Pc::R2 | Pc::R2ThenA1 => s.lock == Lock::Free || th.prelocked,
            // The flush takes the lock exclusive and drains (as A2).
            Pc::Flush => (s.lock == Lock::Free || th.prelocked) && self.drain_may_finish(s),
            // LN4 takes the lanes mutex, which a revoke (LN5), or an LN4
            // between its count reads, holds across steps.
            Pc::LN4 { .. } => self.mutant(Mutant::LaneDetachedNoMutex) || !s.lanes_mutex_held(),
            Pc::LN1Pin { .. } => !s.lanes_mutex_held(),
            // kdreg2: A9's subscribe (the MONITOR ioctl) waits for the
            // module's mutex, under the cache lock.
            Pc::A7 if self.cfg.monitor.is_kdreg2() && s.klock => !matches!(self.a7_outcome(s, t), A7::Insert),
            Pc::Done | Pc::Event => false,
            _ => true,
        }
    }

    /// Whether a release of `lease` may start: a lease another thread
    /// acquires is released once that acquire has returned and its handover
    /// (a store after the acquire's stores) has reached memory.
    pub fn handed_over(&self, s: &State, lease: LeaseId) -> bool {
        match self.handed.iter().find(|(l, _, _)| *l == lease) {
            Some(&(_, by, i)) => s.threads[by].next_op > i && !s.threads[by].sb.contains(&Store::Handover { lease }),
            None => true,
        }
    }

    /// Whether thread `t` may give its lane's claim back now (between
    /// operations, or after its last: a thread's exit gives its claims back).
    pub fn may_give_claim(&self, s: &State, t: usize) -> bool {
        let th = &s.threads[t];
        self.cfg.lanes
            && s.give_backs_left > 0
            && th.lane.is_some()
            && matches!(th.pc, Pc::Idle | Pc::Done)
            && th.ev.is_none()
            && th.toctou.is_empty()
            && th.revoke.is_none()
            && !th.prelocked
    }

    /// Whether thread `t`'s next step has a second branch.
    pub fn thread_alt(&self, s: &State, t: usize) -> bool {
        let th = &s.threads[t];
        if !th.toctou.is_empty() || th.ev.is_some() || th.revoke.is_some() || th.post.is_some() {
            return false;
        }
        match th.pc {
            Pc::A5 => s.registrar_free_left,
            Pc::A7 => s.cache_free_left && self.a7_outcome(s, t) == A7::Insert,
            Pc::Idle => self.a0_may_start(s, t),
            _ => false,
        }
    }

    /// Whether thread `t` may start its next op, an acquire, with A0 (the
    /// `alt` branch of its first step), or, with limits and `skip_a1`, by
    /// skipping A1 (straight to A2): neither takes the lock at once, so
    /// either may start while another thread holds the lock exclusive.
    pub fn a0_may_start(&self, s: &State, t: usize) -> bool {
        let th = &s.threads[t];
        ((self.cfg.lockless && !self.cfg.has_limits()) || (self.cfg.skip_a1 && self.cfg.has_limits()))
            && th.pc == Pc::Idle
            && th.ev.is_none()
            && th.toctou.is_empty()
            && th.revoke.is_none()
            && matches!(self.scripts[t][th.next_op as usize].1, ScriptOp::Acquire { .. })
    }

    /// What an actor waits for, for deadlock reports.
    pub fn blocked_on(&self, s: &State, a: Actor) -> String {
        let holder = match s.lock {
            Lock::Free => "nobody".to_string(),
            Lock::Shared(n) => format!("{n} reader(s)"),
            Lock::Exclusive(h) if h == a => "itself".to_string(),
            Lock::Exclusive(h) => actor_name(h),
        };
        if a == MONITOR && self.ring() {
            return match s.monitor.svc {
                Some(c) => format!("the service thread waits for cache {c}'s lock, or for the event clock to turn even"),
                None => "the service thread is between rounds".to_string(),
            };
        }
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
            Pc::Idle if matches!(self.scripts[a as usize][th.next_op as usize].1, ScriptOp::Release { .. }) => {
                "waits for the lease it releases to be handed over".to_string()
            }
            Pc::Idle => format!("waits for the lock, held by {holder}, to start its next op"),
            Pc::A2 | Pc::A6 | Pc::R2 | Pc::R2ThenA1 | Pc::A1 => format!("{:?} waits for the lock, held by {holder}", th.pc),
            Pc::LN4 { .. } => "LN4 waits for the lanes mutex (held by a revoke or another LN4)".to_string(),
            Pc::LN1Pin { .. } => "LN1 waits for the lanes mutex (held by a revoke or an LN4) to read its slot's pin".to_string(),
            pc => format!("at {pc:?}"),
        }
    }

    /// Applies `a` to `s`, recording notes and operation events into `rec`.
    pub fn step(&self, s: &mut State, a: Action, rec: Option<&mut Rec>) {
        // A thread's step runs on its own cache's state (`State::swap_cache`).
        let c = match a {
            Action::Thread { t, .. } | Action::RegistrarFails { t } => self.cache_of(t as usize),
            _ => 0,
        };
        s.swap_cache(c);
        let mut cx = Ctx { m: self, s, rec, dry: None };
        match a {
            Action::Thread { t, alt } => cx.thread_step(t as usize, alt),
            Action::Monitor => cx.monitor_step(),
            Action::Service => cx.service_step(),
            Action::RegistrarFails { t } => cx.registrar_fails_step(t as usize),
            Action::Flush { a } => cx.flush_one(a),
            Action::CloseWindow => cx.m4_close(),
            Action::GiveClaim { t } => cx.give_claim(t as usize),
            Action::Worker => cx.worker_step(),
            Action::Prove => cx.m4_prove(),
            Action::Ack { t } => cx.proof_ack(t as usize),
        }
        s.swap_cache(c);
        if self.ring() {
            normalize_ring(s);
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
            Action::GiveClaim { t } => format!(
                "T{t} gives lane {}'s claim back (its claim list overflowed, or it exits)",
                s.threads[t as usize].lane.map_or("?".to_string(), |l| l.to_string())
            ),
            Action::Worker => {
                let span = s.kdeferred.first().map(|x| x.to_string()).unwrap_or_default();
                format!("kdreg2 worker (lock the module's mutex, invalidate the deferred range {span})")
            }
            Action::Monitor if self.cfg.monitor.is_kdreg2() => match s.monitor.pc {
                MonPc::Idle => "evictor (pending_events > 0: read(), which locks the module's mutex)".to_string(),
                MonPc::Read => "evictor (read() copies one event out and unlocks the mutex)".to_string(),
                _ => "evictor (lock the cache, apply the event, unlock)".to_string(),
            },
            Action::CloseWindow if self.ring() => "service thread M4 (the madvise returned: close its window)".to_string(),
            Action::CloseWindow => "monitor M4 (the madvise returned: close its window)".to_string(),
            Action::Prove if s.proofs.iter().any(|p| !p.scanned) => {
                "monitor M4 (list the threads, look at each: which may be inside the madvise)".to_string()
            }
            Action::Prove => "monitor M4 (a pass: collect acknowledgements, look again, signal, close what is proven)".to_string(),
            Action::Ack { t } => format!("T{t} runs the proof signal's handler (a return to user mode): it stores its token"),
            Action::Service => {
                let c = s.monitor.svc.unwrap_or(0);
                format!("service thread M5 (lock cache {c}, drain the ring into it (M6), unlock, perform its dereg list)")
            }
            Action::Monitor if self.ring() => match s.monitor.pc {
                MonPc::Idle => "reader M6 (the fd is readable: store the clock odd, read the events: their threads wake)".to_string(),
                _ => "reader M6 (publish the events read in the ring, store the clock even)".to_string(),
            },
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
                } else if let Some(p) = th.post {
                    if p.locked {
                        format!("A11 (unlock after the post-unlock drain's round {})", p.round + 1)
                    } else {
                        format!("A11 (post-unlock drain, round {}: check the queue, try the lock, drain)", p.round + 1)
                    }
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
                        EvPc::Begin => "W1 (open the window)",
                        EvPc::End => "W2 (close the window)",
                        EvPc::Notify if self.cfg.monitor == MonitorKind::Kdreg2 => "kdreg2 notifier (trylock the module's mutex)",
                        EvPc::Notify => "kdreg2 notifier (lock the module's mutex)",
                        EvPc::Return => "returns from madvise",
                    };
                    format!("{step} ({what})")
                } else if th.pc == Pc::Idle {
                    format!("starts `{}`", self.scripts[t as usize][th.next_op as usize].0)
                } else {
                    match th.pc {
                        Pc::A1Look => "A1 (lookup under the shared lock)".to_string(),
                        Pc::A0Cas(h) => format!("A0 (compare-exchange on #{h}'s state word)"),
                        Pc::A9Pub { .. } => "A9 (take the new entry out at once, or publish it)".to_string(),
                        Pc::A3 => "A3/A4 (lookup; plan on a miss)".to_string(),
                        Pc::A7 => "A7-A9 (stale? covered? insert)".to_string(),
                        Pc::A10b => "A10 (second half)".to_string(),
                        Pc::Trim => "the trim (the next noted entry's compare-exchange, or re-plan and unlock)".to_string(),
                        Pc::TrimOr(h) => format!("the trim ORs INVALID into #{h} (mutant)"),
                        Pc::LN1Store { slot, .. } => format!("LN1 (store held + 1 into slot {slot}, buffered)"),
                        Pc::LN1Load { slot, .. } => format!("LN1 (light barrier; reload slot {slot}'s ptr)"),
                        Pc::LN1Pin { slot, .. } => format!("LN1 (lanes mutex; read slot {slot}'s pin)"),
                        Pc::LN3Load { lane, slot, .. } => format!("LN3 (light barrier; reload lane {lane} slot {slot}'s ptr)"),
                        Pc::LN4 { lane, slot, .. } if self.remote_moves() => {
                            format!("LN4 (lanes mutex; read lane {lane} slot {slot}'s remote)")
                        }
                        Pc::LN4 { slot, .. } => format!("LN4 (lanes mutex; slot {slot}'s count and pin)"),
                        Pc::LN4Held { lane, slot, .. } => format!("LN4 (read lane {lane} slot {slot}'s held; pin)"),
                        Pc::A1 => "A1 (after the lane undo)".to_string(),
                        Pc::A1Drain(_) => "A1 (unlocked with events queued: try the lock, drain)".to_string(),
                        Pc::R1Dec { h, .. } => format!("R1 (decrement #{h}'s state word)"),
                        Pc::R1Flag => "R1 (load the over-limit flag)".to_string(),
                        pc => format!("{pc:?}"),
                    }
                };
                format!("T{t} {at}{}", if alt { " (alternative branch)" } else { "" })
            }
        }
    }
}

/// Drops the ring's prefix that every cache has applied (no drain reads it
/// again), lowering each cache's `applied`: states that differ only there
/// are one.
fn normalize_ring(s: &mut State) {
    let k =
        std::iter::once(s.applied).chain(s.others.iter().map(|o| o.applied)).chain(s.monitor.svc_from.iter().copied()).min().unwrap_or(0);
    if k == 0 {
        return;
    }
    s.ring.drain(..k as usize);
    s.applied -= k;
    for o in &mut s.others {
        o.applied -= k;
    }
    for f in &mut s.monitor.svc_from {
        *f -= k;
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
    /// The step revokes every slot (the trim).
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
    pub(super) fn mutant(&self, m: Mutant) -> bool {
        self.m.mutant(m)
    }

    pub(super) fn thread_mut(&mut self, t: usize) -> &mut Thread {
        &mut self.s.threads[t]
    }

    pub(super) fn acq(&self, t: usize) -> &Acq {
        self.s.threads[t].acq.as_ref().expect("inside an acquire")
    }

    pub(super) fn acq_mut(&mut self, t: usize) -> &mut Acq {
        self.s.threads[t].acq.as_mut().expect("inside an acquire")
    }

    pub(super) fn dereg_list(&mut self, a: Actor) -> &mut Vec<Handle> {
        if a == MONITOR {
            &mut self.s.monitor.dereg
        } else {
            &mut self.s.threads[a as usize].dereg
        }
    }

    pub(super) fn toctou_list(&mut self, a: Actor) -> &mut Vec<Handle> {
        if a == MONITOR {
            &mut self.s.monitor.toctou
        } else {
            &mut self.s.threads[a as usize].toctou
        }
    }

    pub(super) fn invoke(&mut self, thread: u8, nested: bool, op: Op) {
        let id = if nested { NESTED + thread } else { thread };
        self.s.lin.invoke(id, op);
        if matches!(op, Op::ReleaseEvent { .. }) {
            // A release is the process's: every cache's history has it.
            for o in &mut self.s.others {
                o.lin.invoke(id, op);
            }
        }
        if let Some(r) = self.rec.as_deref_mut() {
            r.events.push(RecEvent { thread, nested, op, ret: None });
        }
    }

    pub(super) fn ret(&mut self, thread: u8, nested: bool, op: Op, ret: Ret) {
        let id = if nested { NESTED + thread } else { thread };
        self.s.lin.ret(id, ret);
        if matches!(op, Op::ReleaseEvent { .. }) {
            for o in &mut self.s.others {
                o.lin.ret(id, ret);
            }
        }
        if let Some(r) = self.rec.as_deref_mut() {
            r.events.push(RecEvent { thread, nested, op, ret: Some(ret) });
        }
    }

    /// The script op thread `t` is running ends with `ret`.
    pub(super) fn finish(&mut self, t: usize, ret: Ret) {
        let (op, sop) = self.m.scripts[t][self.s.threads[t].next_op as usize];
        note!(self, "T{t} returns `{ret}` for `{op}`");
        self.ret(t as u8, false, op, ret);
        if let ScriptOp::Acquire { lease, .. } = sop {
            if self.m.cfg.lanes && self.m.handed.iter().any(|(l, _, _)| *l == lease) {
                // The lease goes to the thread that releases it through
                // memory: a store after the acquire's own.
                self.sb_mut(t as Actor).push(Store::Handover { lease });
                note!(self, "T{t} hands L{lease} over (store buffer)");
            }
        }
        self.next_script_op(t);
    }

    /// Thread `t` moves on to its next script op (the current one's return
    /// is logged already).
    pub(super) fn next_script_op(&mut self, t: usize) {
        let len = self.m.scripts[t].len() as u8;
        let th = self.thread_mut(t);
        th.acq = None;
        th.next_op += 1;
        th.pc = if th.next_op < len { Pc::Idle } else { Pc::Done };
    }

    pub(super) fn deregister(&mut self, h: Handle) {
        let r = &mut self.s.regs[h as usize];
        r.deregs += 1;
        // kdreg2: the UNMONITOR ioctl (a no-op once the module destroyed
        // the region). Its wait for the module's mutex is not modelled.
        r.kmon = false;
        note!(self, "registrar: deregister #{h} ({})", reg_line(h, &self.s.regs[h as usize]));
    }

    pub(super) fn lock_shared(&mut self) {
        self.s.lock = match self.s.lock {
            Lock::Free => Lock::Shared(1),
            Lock::Shared(n) => Lock::Shared(n + 1),
            Lock::Exclusive(a) => panic!("shared lock taken while {} holds it exclusively", actor_name(a)),
        };
    }

    pub(super) fn unlock_shared(&mut self) {
        self.s.lock = match self.s.lock {
            Lock::Shared(1) => Lock::Free,
            Lock::Shared(n) => Lock::Shared(n - 1),
            other => panic!("shared unlock of {other:?}"),
        };
    }

    pub(super) fn lock_exclusive(&mut self, a: Actor) {
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
    pub(super) fn prelocked(&self, t: usize) -> bool {
        self.s.threads[t].prelocked
    }

    pub(super) fn thread_step(&mut self, t: usize, alt: bool) {
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

    pub(super) fn thread_body(&mut self, t: usize, alt: bool) {
        if !self.s.threads[t].toctou.is_empty() {
            return self.read_counts_late(t as Actor);
        }
        if self.s.threads[t].post.is_some() {
            return self.post_drain_step(t);
        }
        if self.s.threads[t].ev.is_some() {
            return self.ev_step(t);
        }
        match self.s.threads[t].pc {
            Pc::Idle => self.start_op(t, alt),
            Pc::A1Look => self.a1_lookup(t),
            Pc::A0Cas(h) => self.a0_cas(t, h),
            Pc::A9Pub { alt, windowed } => self.a9_pub(t, alt, windowed),
            Pc::A2 => self.a2(t),
            Pc::A3 => self.a3(t),
            Pc::A5 => self.a5(t, alt),
            Pc::A6 => self.a6(t),
            Pc::A7 => self.a7(t, alt),
            Pc::A10 => self.a10(t),
            Pc::A10b => self.a10b(t),
            Pc::A11 => self.a11(t),
            Pc::Trim => self.trim_step(t),
            Pc::TrimOr(h) => self.trim_or(t, h),
            Pc::R1Touch(h, r2) => {
                note!(self, "R1 (mutant `release-touch-after-decrement`): T{t} touches #{h}'s LRU stamp after its decrement");
                self.touch(h);
                if self.release_steps() {
                    // `r2` is whether the decrement left the count at 0:
                    // the flag's load comes next.
                    self.r1_unleased(t, r2, None);
                } else if r2 {
                    self.thread_mut(t).pc = Pc::R2;
                } else {
                    self.finish(t, Ret::Done);
                }
            }
            Pc::R1Dec { h, flag } => self.r1_dec(t, h, flag),
            Pc::R1Flag => self.r1_flag(t),
            Pc::R2 => {
                self.r2(t);
                self.finish(t, Ret::Done);
            }
            Pc::R2ThenA1 => {
                self.r2(t);
                self.thread_mut(t).pc = Pc::A1;
            }
            Pc::Flush => self.flush(t),
            Pc::LN1Store { slot, h } => self.ln1_store(t, slot, h),
            Pc::LN1Load { slot, h } => self.ln1_load(t, slot, h),
            Pc::LN1Pin { slot, h } => self.ln1_pin(t, slot, h),
            Pc::A1 => self.a1_enter(t),
            Pc::A1Drain(h) => self.a1_drain(t, h),
            Pc::LN3Load { lane, slot, h } => self.ln3_load(t, lane, slot, h),
            Pc::LN4 { lane, slot, h, then_a1 } => self.ln4(t, lane, slot, h, then_a1),
            Pc::LN4Held { lane, slot, h, then_a1, remote } => self.ln4_held(t, lane, slot, h, then_a1, remote),
            Pc::Event | Pc::Done => unreachable!("T{t} has no step at {:?}", self.s.threads[t].pc),
        }
    }

    /// Invokes the thread's next script op and takes its first step (`alt`:
    /// an acquire that starts with A0, after LN1).
    pub(super) fn start_op(&mut self, t: usize, alt: bool) {
        let (op, sop) = self.m.scripts[t][self.s.threads[t].next_op as usize];
        // A release through the W1/W2 pair is two operations in the history
        // (release_begin, release_end), which W1 and W2 log themselves.
        if !(self.m.cfg.pair && matches!(sop, ScriptOp::Event { .. })) {
            self.invoke(t as u8, false, op);
        }
        match sop {
            ScriptOp::Acquire { lease, span, access } => {
                let snap = span.pages().map(|p| self.s.done_gens[p as usize]).collect();
                self.thread_mut(t).acq = Some(Acq {
                    lease,
                    req: span,
                    access,
                    snap,
                    attempts: 0,
                    plan: None,
                    handle: None,
                    trimmed: false,
                    skipped_a1: false,
                    inserts: InsertCount::Changed,
                });
                if self.ln1_start(t, span, access) {
                    return;
                }
                //= spec.md#M6
                //# Gate: a hit on a cache the process's monitor delivers to needs
                //# the gate current (the clock even and equal to the clock value the
                //# cache has applied), checked before A0, LN1 and A1; otherwise the
                //# acquire goes to A2.
                if !self.m.gate_passes(self.s) {
                    note!(self, "M6: cache {}'s gate is not current (a read in progress, or events published it has not applied): T{t} takes the slow path", self.m.cache_of(t));
                    self.thread_mut(t).pc = Pc::A2;
                    return;
                }
                if alt && self.m.cfg.lockless && !self.m.cfg.has_limits() {
                    return self.a0_read(t);
                }
                if alt {
                    return self.a1_skip(t);
                }
                self.a1_enter(t);
            }
            ScriptOp::Release { lease } => match self.s.lane_lease(lease) {
                Some((by, lane, slot)) => self.ln3(t, by, lease, lane, slot),
                None => self.r1(t, lease),
            },
            ScriptOp::Event { kind, span } => {
                self.thread_mut(t).pc = Pc::Event;
                self.start_event(t, kind, span, Origin::Script);
            }
            ScriptOp::Flush => self.thread_mut(t).pc = Pc::Flush,
            ScriptOp::Fork => self.fork(t),
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
            let s = s.seen_from_cache(self.cache_of(t));
            if self.thread_enabled(&s, t) {
                actions.push(Action::Thread { t: t as u8, alt: false });
                if self.thread_alt(&s, t) {
                    actions.push(Action::Thread { t: t as u8, alt: true });
                }
            } else if self.a0_may_start(&s, t) {
                actions.push(Action::Thread { t: t as u8, alt: true });
            }
        }
        if self.monitor_enabled(s) {
            actions.push(Action::Monitor);
        }
        if self.service_enabled(s) {
            actions.push(Action::Service);
        }
        if self.m4_window(s).is_some() {
            actions.push(Action::CloseWindow);
        }
        if self.worker_enabled(s) {
            actions.push(Action::Worker);
        }
        if self.prove_enabled(s) {
            actions.push(Action::Prove);
        }
        for t in 0..s.threads.len() {
            if self.ack_enabled(s, t) {
                actions.push(Action::Ack { t: t as u8 });
            }
        }
        for t in 0..s.threads.len() {
            if self.registrar_may_fail(&s.seen_from_cache(self.cache_of(t)), t) {
                actions.push(Action::RegistrarFails { t: t as u8 });
            }
        }
        if self.cfg.lanes {
            for t in 0..s.threads.len() {
                if self.may_give_claim(s, t) {
                    actions.push(Action::GiveClaim { t: t as u8 });
                }
            }
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
        properties::properties(self)
    }

    fn format_action(&self, a: &Action) -> String {
        match a {
            Action::Thread { t, alt: false } => format!("T{t}"),
            Action::Thread { t, alt: true } => format!("T{t} (alternative branch)"),
            Action::Monitor if self.ring() => "reader".into(),
            Action::Monitor => "monitor".into(),
            Action::Service => "service thread".into(),
            Action::RegistrarFails { t } => format!("T{t} (registrar fails)"),
            Action::Flush { a } => format!("{} (flush its oldest buffered store)", actor_name(*a)),
            Action::CloseWindow => "monitor (M4)".into(),
            Action::Prove => "monitor (M4, the proof)".into(),
            Action::Ack { t } => format!("T{t} (proof signal handler)"),
            Action::GiveClaim { t } => format!("T{t} (gives its lane claim back)"),
            Action::Worker => "kdreg2 worker".into(),
        }
    }

    fn format_step(&self, last: &State, a: Action) -> Option<String> {
        let mut next = last.clone();
        let mut rec = Rec::default();
        self.step(&mut next, a, Some(&mut rec));
        Some(format!("{}\n{}\n{}", self.label(last, a), rec.notes.join("\n"), next.summary()))
    }
}
