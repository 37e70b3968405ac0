//! `mrcache adapter`: conformance adapters (docs/conformance-protocol.md)
//! written in Rust, run by `mrcache conform --adapter 'mrcache adapter ...'`.
//!
//! - `mrcache adapter --policy P [--fault F]`: mrcache itself, with the
//!   userfaultfd monitor watching the real memory operations the adapter
//!   performs (no `invalidate` call: it is judged exactly as the peers are).
//!   `--fault` turns on one of the cache's fault switches.
//! - `mrcache adapter --toy [--break B]`: a deliberately small cache (a list
//!   of entries under one mutex, explicit invalidation from the adapter's own
//!   memory operations) that is correct without `--break` and breaks one
//!   rule with it. The tests check that each break fails exactly the cases
//!   listed in conformance/expected/.
//!
//! The protocol plumbing (reader thread, one worker thread per case thread,
//! pause/continue, fork, the memory operations) is shared by both.
//!
//! Both pin every registration as an io_uring fixed buffer
//! (`mrcache::registrar::uring`, FOLL_LONGTERM like `ibv_reg_mr`) and answer
//! the data commands (`dma_in`, `dma_out`, `app_write`, `app_read`) through
//! those pins; `--registrar counting` only reports the calls, and the device
//! commands are then `unsupported`. The Rust registrar's ring is
//! `MADV_DONTFORK`: a fork child opens a ring of its own, so a registration
//! made before the fork moves no data in the child (its `dma_*` commands
//! fail, and a P2 failure there is judged by event order only: the toy's
//! `--break fork-keeps`). The C adapters' ring is inherited, as a verbs
//! context is.

use mrcache::monitor::uffd::UffdMonitor;
use mrcache::monitor::UffdEvents;
use mrcache::registrar::uring::{UringHandle, UringRegistrar};
use mrcache::registrar::{Keys, Registrar, RegistrarError};
use mrcache::{Cache, CacheConfig, Lease};
use mrcache_model::{Config, Limits, OverlapPolicy};
use mrcache_types::{Access, LeaseId, PageSpan, Range};
use serde_json::{json, Map, Value};
use std::cell::Cell;
use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

const PAGE: u64 = 4096;
/// The arena the cases address: 4 MiB.
const ARENA: u64 = 4 << 20;
/// The largest arena a case may get from this adapter (`config.arena_len`).
const MAX_ARENA: u64 = 64 << 20;
/// Where the arena goes if it can.
const ARENA_HINT: u64 = 0x2000_0000_0000;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToyBreak {
    /// Release events are ignored.
    NoInvalidation,
    /// A hit ignores the access asked for.
    AccessIgnored,
    /// A release event deregisters leased entries at once.
    DeregWhileLeased,
    /// The last release of an invalidated entry deregisters it twice.
    DeregTwice,
    /// A release event removes only the entries whose first page it frees.
    HitPartiallyFreed,
    /// Registrations round the request's pages inwards.
    NoRounding,
    /// Declares `merge` but registers independently.
    WrongPolicy,
    /// Declares the limits but never evicts.
    NoLimits,
    /// A fork child keeps the parent's entries.
    ForkKeeps,
    /// No re-check after the registrar returns: neither for release events
    /// (S3.7, A7) nor for an entry another thread inserted (A8).
    NoRecheck,
    /// The monitor hook runs before the release (S1.8).
    HookBeforeRelease,
    /// A release event also invalidates the entries that merely touch it
    /// (its end taken as inclusive).
    InclusiveEnd,
    /// Wasted work: every miss first registers the range once for nothing
    /// (and deregisters it at once). Every case passes; the report's
    /// `extra` column counts them.
    RedundantRegister,
    /// Deferred deregistration: an entry a release event invalidates is
    /// deregistered at the next acquire, not at once (beyond the declared
    /// `l1_bound` unless `--no-l1-bound`).
    DeferredDereg,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheFault {
    /// `Faults::monitor_off`: release events are ignored.
    MonitorOff,
    /// `Faults::skip_seq_recheck`: A7 skipped.
    SkipSeqRecheck,
    /// `Faults::dereg_leased_on_invalidate`: leased entries deregistered at once.
    DeregLeasedOnInvalidate,
    /// `Faults::fork_keeps_monitor`: a fork child reads the parent's monitor.
    ForkKeepsMonitor,
}

/// The registrar behind either cache.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegistrarKind {
    /// Pins each registration as an io_uring fixed buffer; the data commands
    /// move bytes through the pins.
    #[value(name = "io_uring")]
    IoUring,
    /// Only reports the calls (no pins, no data commands).
    Counting,
}

impl RegistrarKind {
    fn name(self) -> &'static str {
        match self {
            RegistrarKind::IoUring => "io_uring",
            RegistrarKind::Counting => "counting",
        }
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct AdapterArgs {
    /// The registrar: `io_uring` pins pages and moves data; `counting` only
    /// reports its calls.
    #[arg(long, value_enum, default_value = "io_uring")]
    pub registrar: RegistrarKind,
    /// mrcache's overlap policy.
    #[arg(long, default_value = "independent")]
    pub policy: OverlapPolicy,
    /// One of mrcache's fault switches.
    #[arg(long)]
    pub fault: Option<CacheFault>,
    /// Run the toy cache instead of mrcache.
    #[arg(long)]
    pub toy: bool,
    /// The rule the toy breaks (repeatable: it then breaks each).
    #[arg(long = "break", requires = "toy")]
    pub brk: Vec<ToyBreak>,
    /// The overlap policy the toy declares (`none`: declares none).
    #[arg(long, requires = "toy")]
    pub declare: Option<String>,
    /// Widen every miss's registration to chunks of this many bytes (a power
    /// of two, a multiple of the page size; spec.md S6.2), declared in the
    /// hello as `chunk_size`.
    #[arg(long, default_value_t = PAGE)]
    pub chunk: u64,
    /// Widen to `--chunk` but do not declare it (the judge then fails C2 on
    /// every widened miss: what a cache met before `chunk_size` existed).
    #[arg(long, hide = true)]
    pub chunk_undeclared: bool,
    /// Declare no `l1_bound` in the hello (deferred deregistration is then
    /// reported, not judged). By default the adapter declares none owed:
    /// every deregistration before the operation that made it due returns.
    #[arg(long)]
    pub no_l1_bound: bool,
}

// ---------------------------------------------------------------------------
// Output, pause

fn emit(v: &Value) {
    let out = std::io::stdout();
    let mut o = out.lock();
    let _ = writeln!(o, "{v}");
    let _ = o.flush();
}

thread_local! {
    /// (case thread, pause armed) of the command this worker runs.
    static CURRENT: Cell<(u64, bool)> = const { Cell::new((0, false)) };
}

static PAUSE: Mutex<Vec<u64>> = Mutex::new(Vec::new());
static PAUSE_CV: Condvar = Condvar::new();

/// If the running command asked to pause, says so and waits for `continue`.
fn pause_point() {
    let (thread, armed) = CURRENT.with(Cell::get);
    if !armed {
        return;
    }
    CURRENT.with(|c| c.set((thread, false)));
    emit(&json!({"ev": "paused", "thread": thread}));
    let mut cont = PAUSE.lock().unwrap_or_else(|e| e.into_inner());
    while !cont.contains(&thread) {
        cont = PAUSE_CV.wait(cont).unwrap_or_else(|e| e.into_inner());
    }
    cont.retain(|t| *t != thread);
}

fn resume(thread: u64) {
    PAUSE.lock().unwrap_or_else(|e| e.into_inner()).push(thread);
    PAUSE_CV.notify_all();
}

/// The registrations the registrar holds (id -> bytes), for `query`.
static LIVE: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

/// The answer to `query`: the registrations held and their bytes.
fn live_now() -> Value {
    let live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    json!({"registrations": live.len(), "pinned_bytes": live.iter().map(|(_, b)| b).sum::<u64>()})
}

/// The registrar both caches use: pins (with the io_uring registrar),
/// reports every call, pauses after the pin.
pub struct EmitRegistrar {
    next: AtomicU64,
    /// The io_uring pins, or `None` with `--registrar counting`.
    pins: Option<&'static UringPins>,
}

impl EmitRegistrar {
    fn new() -> EmitRegistrar {
        EmitRegistrar { next: AtomicU64::new(0), pins: PINS.get().copied() }
    }
}

/// The io_uring registrar and the pin of each registration id.
pub struct UringPins {
    /// Replaced in a fork child (the parent's ring is `MADV_DONTFORK`); the
    /// old one is leaked, never dropped there.
    ring: Mutex<&'static UringRegistrar>,
    handles: Mutex<HashMap<u64, UringHandle>>,
}

/// Set once at start when the registrar is io_uring.
static PINS: OnceLock<&'static UringPins> = OnceLock::new();
/// The registration id each held lease names (for the data commands).
static LEASE_REGS: Mutex<Option<HashMap<LeaseId, u64>>> = Mutex::new(None);
/// Error number of a reply that marks the command `unsupported`.
const UNSUPPORTED: i32 = -2;

/// The io_uring slots: more than any case keeps live.
const URING_SLOTS: u32 = 4096;

impl UringPins {
    fn open() -> Result<&'static UringPins, String> {
        let ring = UringRegistrar::new(URING_SLOTS).map_err(|e| format!("the io_uring registrar is unavailable: {e} (run with --registrar counting to judge by event order only)"))?;
        Ok(Box::leak(Box::new(UringPins { ring: Mutex::new(Box::leak(Box::new(ring))), handles: Mutex::new(HashMap::new()) })))
    }

    fn ring(&self) -> &'static UringRegistrar {
        *self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// In a fork child: a ring of its own; the parent's pins are forgotten.
    fn forked(&self) {
        match UringRegistrar::new(URING_SLOTS) {
            Ok(r) => *self.ring.lock().unwrap_or_else(|e| e.into_inner()) = Box::leak(Box::new(r)),
            Err(e) => emit(&json!({"ev": "log", "text": format!("no io_uring ring in the fork child: {e}")})),
        }
        let old = std::mem::take(&mut *self.handles.lock().unwrap_or_else(|e| e.into_inner()));
        // The parent's handles name slots of the parent's ring: never used here.
        std::mem::forget(old);
    }
}

impl Registrar for EmitRegistrar {
    type Handle = u64;
    fn register(&self, range: Range, access: Access) -> Result<u64, RegistrarError> {
        let pin = match self.pins {
            Some(p) => Some(p.ring().register(range, access)?),
            None => None,
        };
        let id = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        if let (Some(p), Some(h)) = (self.pins, pin) {
            p.handles.lock().unwrap_or_else(|e| e.into_inner()).insert(id, h);
        }
        emit(&json!({"ev": "reg", "id": id, "addr": format!("{:#x}", range.addr), "len": range.len, "access": access.to_string()}));
        LIVE.lock().unwrap_or_else(|e| e.into_inner()).push((id, range.len));
        pause_point();
        Ok(id)
    }
    fn deregister(&self, id: u64) -> Result<(), RegistrarError> {
        LIVE.lock().unwrap_or_else(|e| e.into_inner()).retain(|(i, _)| *i != id);
        if let Some(p) = self.pins {
            let h = p.handles.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
            if let Some(h) = h {
                if let Err(e) = p.ring().deregister(h) {
                    emit(&json!({"ev": "log", "text": format!("registration {id}: the io_uring registrar could not unpin it: {e}")}));
                }
            }
        }
        emit(&json!({"ev": "dereg", "id": id}));
        Ok(())
    }
    fn keys(&self, id: &u64) -> Keys {
        Keys { lkey: *id as u32, rkey: *id as u32 }
    }
    fn name(&self) -> &'static str {
        "conformance"
    }
}

// ---------------------------------------------------------------------------
// Backends

type OpResult = Result<Value, (String, i32)>;

trait Backend: Send + Sync {
    fn acquire(&self, lease: LeaseId, addr: u64, len: u64, access: Access) -> OpResult;
    fn release(&self, lease: LeaseId) -> OpResult;
    fn flush(&self) -> OpResult;
    fn trim(&self) -> OpResult;
    /// Runs before a release's syscall (a hook that runs before the release).
    fn before_release(&self, _addr: u64, _len: u64) {}
    /// Runs after a release's syscall returned.
    fn after_release(&self, _addr: u64, _len: u64) {}
    /// In the child, after fork.
    fn forked(&self) {}
}

/// mrcache with the userfaultfd monitor.
struct Mrcache {
    cache: &'static Cache<EmitRegistrar>,
    leases: Mutex<HashMap<LeaseId, Lease<'static, EmitRegistrar>>>,
    busy: Arc<AtomicBool>,
}

impl Mrcache {
    fn start(policy: OverlapPolicy, limits: Limits, fault: Option<CacheFault>, chunk_pages: u64) -> Result<Mrcache, String> {
        #[cfg_attr(not(feature = "testkit"), allow(unused_mut, reason = "fault switches need the testkit"))]
        let mut cfg = CacheConfig::new(Config { policy, limits, chunk_pages, ..Config::default() }).monitored_by(mrcache::Monitoring::Userfaultfd);
        match fault {
            #[cfg(feature = "testkit")]
            Some(CacheFault::MonitorOff) => cfg.faults.monitor_off = true,
            #[cfg(feature = "testkit")]
            Some(CacheFault::SkipSeqRecheck) => cfg.faults.skip_seq_recheck = true,
            #[cfg(feature = "testkit")]
            Some(CacheFault::ForkKeepsMonitor) => cfg.faults.fork_keeps_monitor = true,
            // SAFETY: the registrar's handles are plain ids that own nothing,
            // and the adapter never uses a lease's handle after an event.
            #[cfg(feature = "testkit")]
            Some(CacheFault::DeregLeasedOnInvalidate) => unsafe { cfg.faults.enable_dereg_leased_on_invalidate() },
            #[cfg(not(feature = "testkit"))]
            Some(f) => return Err(format!("fault switch {f:?} needs a build with the testkit feature")),
            None => {}
        }
        let cache = Cache::try_new(EmitRegistrar::new(), cfg).map_err(|e| e.to_string())?;
        let cache: &'static Cache<EmitRegistrar> = Box::leak(Box::new(cache));
        let busy = Arc::new(AtomicBool::new(false));
        Mrcache::arm_monitor(cache, &busy)?;
        Ok(Mrcache { cache, leases: Mutex::new(HashMap::new()), busy })
    }

    /// Opens a userfaultfd monitor, installs it as the cache's event source
    /// and starts its thread: at the start, and again in a fork child (the
    /// parent's monitor neither follows the child nor may be read by it,
    /// spec.md#S2.6).
    fn arm_monitor(cache: &'static Cache<EmitRegistrar>, busy: &Arc<AtomicBool>) -> Result<(), String> {
        let monitor = Arc::new(UffdMonitor::open().map_err(|e| format!("userfaultfd: {e}"))?);
        if cache.set_event_source(Box::new(UffdEvents::new(monitor.clone()))).is_err() {
            return Err("the cache already has an event source".into());
        }
        let b = busy.clone();
        let (started, running) = std::sync::mpsc::sync_channel::<()>(1);
        // M1 with a `busy` flag, so a release can wait for the round its
        // event started (the releasing call returns once the event is read,
        // inside the round, before the round's deregistrations).
        std::thread::spawn(move || {
            let _ = started.send(());
            loop {
                match monitor.wait_readable(20) {
                    Ok(true) => {
                        b.store(true, Ordering::SeqCst);
                        cache.monitor_round();
                        b.store(false, Ordering::SeqCst);
                    }
                    Ok(false) => {}
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        // Wait until the thread runs: its start maps its signal stack, which
        // must not land in a hole a case's munmap leaves for its MAP_FIXED.
        let _ = running.recv();
        Ok(())
    }
}

impl Backend for Mrcache {
    fn acquire(&self, lease: LeaseId, addr: u64, len: u64, access: Access) -> OpResult {
        let l = self.cache.acquire(addr, len, access).map_err(|e| (e.to_string(), 0))?;
        let id = *l.handle();
        let hit = l.hit();
        self.leases.lock().unwrap_or_else(|e| e.into_inner()).insert(lease, l);
        Ok(json!({"reg": id, "hit": hit}))
    }
    fn release(&self, lease: LeaseId) -> OpResult {
        let l = self.leases.lock().unwrap_or_else(|e| e.into_inner()).remove(&lease);
        match l {
            Some(l) => {
                l.release();
                Ok(json!({}))
            }
            None => Err((format!("unknown lease {lease}"), 0)),
        }
    }
    fn flush(&self) -> OpResult {
        self.cache.flush();
        Ok(json!({}))
    }
    fn trim(&self) -> OpResult {
        self.cache.trim();
        Ok(json!({}))
    }
    fn forked(&self) {
        // A monitor of the child's own (S2.6); until it runs the child's
        // cache would serve every acquire uncached.
        if let Err(e) = Mrcache::arm_monitor(self.cache, &self.busy) {
            emit(&json!({"ev": "log", "text": format!("no monitor in the fork child: {e}")}));
        }
    }
    fn after_release(&self, _addr: u64, _len: u64) {
        // The round that read our event (if any) is still running: wait.
        for _ in 0..20_000 {
            if !self.busy.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// The toy cache: a list of entries under one mutex.
struct Toy {
    brk: Vec<ToyBreak>,
    chunk_pages: u64,
    limits: Limits,
    st: Mutex<ToySt>,
    reg: EmitRegistrar,
}

struct ToyEntry {
    id: u64,
    span: PageSpan,
    access: Access,
    findable: bool,
    leases: u32,
    last_use: u64,
}

#[derive(Default)]
struct ToySt {
    entries: Vec<ToyEntry>,
    leases: HashMap<LeaseId, u64>,
    /// Leases held at a fork: their release is a no-op in the child (S2.6).
    orphans: Vec<LeaseId>,
    /// Release events applied (span, number).
    events: Vec<(PageSpan, u64)>,
    clock: u64,
    /// Deregistrations put off to the next acquire (`DeferredDereg`).
    owed: Vec<u64>,
}

impl Toy {
    fn is(&self, b: ToyBreak) -> bool {
        self.brk.contains(&b)
    }

    fn span(&self, addr: u64, len: u64) -> Result<PageSpan, (String, i32)> {
        let r = Range::new(addr, len).map_err(|e| (e.to_string(), 0))?;
        let s = r.pages(PAGE);
        if self.is(ToyBreak::NoRounding) {
            // Inwards: the first whole page on, at least one page.
            let first = addr.div_ceil(PAGE);
            let end = ((addr + len) / PAGE).max(first + 1);
            return Ok(PageSpan { first, end });
        }
        Ok(s)
    }

    fn invalidate(&self, addr: u64, len: u64) {
        if self.is(ToyBreak::NoInvalidation) {
            return;
        }
        let Ok(r) = Range::new(addr, len) else { return };
        let span = r.pages(PAGE);
        let mut st = self.st.lock().unwrap_or_else(|e| e.into_inner());
        let n = st.events.len() as u64 + 1;
        st.events.push((span, n));
        let mut gone = Vec::new();
        for e in st.entries.iter_mut().filter(|e| e.findable) {
            let hit = if self.is(ToyBreak::HitPartiallyFreed) {
                span.first <= e.span.first && e.span.first < span.end
            } else if self.is(ToyBreak::InclusiveEnd) {
                span.first <= e.span.end && e.span.first <= span.end
            } else {
                e.span.overlaps(&span)
            };
            if hit {
                e.findable = false;
                if e.leases == 0 || self.is(ToyBreak::DeregWhileLeased) {
                    gone.push(e.id);
                }
            }
        }
        st.entries.retain(|e| !(e.leases == 0 && gone.contains(&e.id)));
        if self.is(ToyBreak::DeferredDereg) {
            st.owed.append(&mut gone);
        }
        drop(st);
        for id in gone {
            let _ = self.reg.deregister(id);
        }
    }

    /// Evicts LRU unleased findable entries while over a limit.
    fn enforce(&self, st: &mut ToySt) -> Vec<u64> {
        let mut out = Vec::new();
        if self.is(ToyBreak::NoLimits) {
            return out;
        }
        loop {
            let cached: Vec<&ToyEntry> = st.entries.iter().filter(|e| e.findable).collect();
            let bytes: u64 = cached.iter().map(|e| e.span.count() * PAGE).sum();
            let over = self.limits.max_regions.is_some_and(|m| cached.len() as u64 > m)
                || self.limits.max_pinned_bytes.is_some_and(|m| bytes > m);
            if !over {
                return out;
            }
            let Some(v) = cached.iter().filter(|e| e.leases == 0).min_by_key(|e| (e.last_use, e.id)).map(|e| e.id) else {
                return out;
            };
            st.entries.retain(|e| e.id != v);
            out.push(v);
        }
    }
}

impl Backend for Toy {
    fn acquire(&self, lease: LeaseId, addr: u64, len: u64, access: Access) -> OpResult {
        let span = self.span(addr, len)?;
        let owed = std::mem::take(&mut self.st.lock().unwrap_or_else(|e| e.into_inner()).owed);
        for id in owed {
            let _ = self.reg.deregister(id);
        }
        loop {
            let mut st = self.st.lock().unwrap_or_else(|e| e.into_inner());
            st.clock += 1;
            let now = st.clock;
            let ignore_access = self.is(ToyBreak::AccessIgnored);
            if let Some(e) = st
                .entries
                .iter_mut()
                .find(|e| e.findable && e.span.contains(&span) && (ignore_access || e.access.suffices_for(access)))
            {
                e.leases += 1;
                e.last_use = now;
                let id = e.id;
                st.leases.insert(lease, id);
                return Ok(json!({"reg": id, "hit": true}));
            }
            let seen = st.events.len();
            drop(st);
            let reg_span = span.align(self.chunk_pages);
            let range = reg_span.bytes(PAGE);
            if self.is(ToyBreak::RedundantRegister) {
                let waste = self.reg.register(range, access).map_err(|e| (e.to_string(), e.errno))?;
                let _ = self.reg.deregister(waste);
            }
            let id = self.reg.register(range, access).map_err(|e| (e.to_string(), e.errno))?;
            let mut st = self.st.lock().unwrap_or_else(|e| e.into_inner());
            // A8: another thread cached a covering entry meanwhile: use it.
            let now = st.clock + 1;
            if !self.is(ToyBreak::NoRecheck) {
                if let Some(e) = st
                    .entries
                    .iter_mut()
                    .find(|e| e.findable && e.span.contains(&span) && (ignore_access || e.access.suffices_for(access)))
                {
                    e.leases += 1;
                    e.last_use = now;
                    let hit = e.id;
                    st.clock = now;
                    st.leases.insert(lease, hit);
                    drop(st);
                    let _ = self.reg.deregister(id);
                    return Ok(json!({"reg": hit, "hit": true}));
                }
            }
            let stale = st.events[seen..].iter().any(|(s, _)| s.overlaps(&reg_span));
            if stale && !self.is(ToyBreak::NoRecheck) {
                drop(st);
                let _ = self.reg.deregister(id);
                continue;
            }
            st.clock += 1;
            let now = st.clock;
            st.entries.push(ToyEntry { id, span: reg_span, access, findable: true, leases: 1, last_use: now });
            st.leases.insert(lease, id);
            let evicted = self.enforce(&mut st);
            drop(st);
            for v in evicted {
                let _ = self.reg.deregister(v);
            }
            return Ok(json!({"reg": id, "hit": false}));
        }
    }
    fn release(&self, lease: LeaseId) -> OpResult {
        let mut st = self.st.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = st.orphans.iter().position(|l| *l == lease) {
            st.orphans.remove(i);
            return Ok(json!({}));
        }
        let Some(id) = st.leases.remove(&lease) else { return Err((format!("unknown lease {lease}"), 0)) };
        st.clock += 1;
        let now = st.clock;
        let mut dereg = 0;
        if let Some(pos) = st.entries.iter().position(|e| e.id == id) {
            let e = &mut st.entries[pos];
            e.leases -= 1;
            e.last_use = now;
            if !e.findable && e.leases == 0 {
                st.entries.remove(pos);
                if !self.is(ToyBreak::DeregWhileLeased) {
                    dereg = if self.is(ToyBreak::DeregTwice) { 2 } else { 1 };
                }
            }
        }
        let evicted = self.enforce(&mut st);
        drop(st);
        for _ in 0..dereg {
            let _ = self.reg.deregister(id);
        }
        for v in evicted {
            let _ = self.reg.deregister(v);
        }
        Ok(json!({}))
    }
    fn flush(&self) -> OpResult {
        let mut st = self.st.lock().unwrap_or_else(|e| e.into_inner());
        let mut gone = Vec::new();
        for e in st.entries.iter_mut().filter(|e| e.findable) {
            e.findable = false;
            if e.leases == 0 {
                gone.push(e.id);
            }
        }
        st.entries.retain(|e| !gone.contains(&e.id));
        drop(st);
        for id in gone {
            let _ = self.reg.deregister(id);
        }
        Ok(json!({}))
    }
    fn trim(&self) -> OpResult {
        let mut st = self.st.lock().unwrap_or_else(|e| e.into_inner());
        let gone: Vec<u64> = st.entries.iter().filter(|e| e.findable && e.leases == 0).map(|e| e.id).collect();
        st.entries.retain(|e| !gone.contains(&e.id));
        drop(st);
        for id in gone {
            let _ = self.reg.deregister(id);
        }
        Ok(json!({}))
    }
    fn before_release(&self, addr: u64, len: u64) {
        if self.is(ToyBreak::HookBeforeRelease) {
            self.invalidate(addr, len);
        }
    }
    fn after_release(&self, addr: u64, len: u64) {
        if !self.is(ToyBreak::HookBeforeRelease) {
            self.invalidate(addr, len);
        }
    }
    fn forked(&self) {
        if self.is(ToyBreak::ForkKeeps) {
            return;
        }
        // S2.6: forget everything without registrar calls; held leases are orphans.
        let mut st = self.st.lock().unwrap_or_else(|e| e.into_inner());
        st.entries.clear();
        let held: Vec<LeaseId> = st.leases.drain().map(|(l, _)| l).collect();
        st.orphans.extend(held);
    }
}

// ---------------------------------------------------------------------------
// Memory operations (real syscalls)

/// `--chunk` in pages: a power of two, a multiple of the page size.
fn chunk_pages(chunk: u64) -> Result<u64, String> {
    if !chunk.is_power_of_two() || !(PAGE..=1 << 30).contains(&chunk) {
        return Err(format!("--chunk {chunk}: expected a power of two from {PAGE} to 2^30 bytes"));
    }
    Ok(chunk / PAGE)
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn os_err(what: &str) -> (String, i32) {
    (format!("{what}: {}", std::io::Error::last_os_error()), errno())
}

fn touch(addr: u64, len: u64) {
    // SAFETY: the caller just mapped [addr, addr+len) read-write.
    unsafe { std::ptr::write_bytes(addr as *mut u8, 0x5a, len as usize) };
}

fn map_fresh(addr: u64, len: u64, flags: i32) -> Result<(), (String, i32)> {
    // SAFETY: maps anonymous memory at an address the case names inside the
    // adapter's own arena (the runner checks the bounds); no Rust object lives there.
    let p = unsafe {
        libc::mmap(addr as *mut libc::c_void, len as usize, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags, -1, 0)
    };
    if p == libc::MAP_FAILED {
        return Err(os_err("mmap"));
    }
    if p as u64 != addr {
        // SAFETY: the mapping we just made elsewhere.
        unsafe { libc::munmap(p, len as usize) };
        return Err((format!("mmap placed the pages at {p:p}, not {addr:#x}"), 0));
    }
    touch(addr, len);
    Ok(())
}

fn get_u64(c: &Map<String, Value>, k: &str) -> Result<u64, (String, i32)> {
    match c.get(k) {
        Some(Value::Number(n)) => n.as_u64().ok_or_else(|| (format!("field `{k}` is not an unsigned integer"), 0)),
        Some(Value::String(s)) => {
            let r = match s.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16),
                None => s.parse(),
            };
            r.map_err(|_| (format!("field `{k}`: `{s}` is not a number"), 0))
        }
        _ => Err((format!("missing field `{k}`"), 0)),
    }
}

/// Performs a memory command; returns its reply fields.
fn memory_op(b: &dyn Backend, cmd: &str, c: &Map<String, Value>) -> OpResult {
    // SAFETY (all blocks below): the addresses are in the adapter's arena or
    // blocks it allocated for the case; no Rust object lives in them.
    unsafe {
        match cmd {
            "malloc" => {
                let len = get_u64(c, "len")?;
                let p = libc::malloc(len as usize);
                if p.is_null() {
                    return Err(os_err("malloc"));
                }
                touch(p as u64, len);
                Ok(json!({"addr": format!("{:#x}", p as u64)}))
            }
            "brk_grow" => {
                let len = get_u64(c, "len")?;
                let cur = libc::sbrk(0) as u64;
                let top = cur.div_ceil(PAGE) * PAGE;
                if libc::sbrk((top - cur + len) as isize) as isize == -1 {
                    return Err(os_err("sbrk"));
                }
                touch(top, len);
                Ok(json!({"addr": format!("{top:#x}")}))
            }
            "mmap" => {
                let (a, l) = (get_u64(c, "addr")?, get_u64(c, "len")?);
                map_fresh(a, l, libc::MAP_FIXED_NOREPLACE).map(|()| json!({}))
            }
            _ => {
                // A release: the peer's own hooks run inside the syscall.
                let addr = if cmd == "brk_shrink" { 0 } else { get_u64(c, "addr")? };
                let len = if cmd == "free" { 0 } else { get_u64(c, "len")? };
                let (ev_addr, ev_len) = match cmd {
                    "mremap_shrink" => {
                        let n = get_u64(c, "new_len")?;
                        (addr + n, len.saturating_sub(n))
                    }
                    "brk_shrink" => {
                        let cur = libc::sbrk(0) as u64;
                        (cur - len, len)
                    }
                    "free" => (addr.saturating_sub(16), libc::malloc_usable_size(addr as *mut libc::c_void) as u64 + 16),
                    _ => (addr, len),
                };
                b.before_release(ev_addr, ev_len.max(1));
                pause_point();
                let r = match cmd {
                    "munmap" => libc::munmap(addr as *mut libc::c_void, len as usize),
                    "mmap_fixed" => return map_fresh(addr, len, libc::MAP_FIXED).map(|()| {
                        b.after_release(ev_addr, ev_len);
                        json!({})
                    }),
                    "madvise_dontneed" => libc::madvise(addr as *mut libc::c_void, len as usize, libc::MADV_DONTNEED),
                    "madvise_free" => libc::madvise(addr as *mut libc::c_void, len as usize, libc::MADV_FREE),
                    "mremap_move" => {
                        let t = libc::mmap(std::ptr::null_mut(), len as usize, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
                        if t == libc::MAP_FAILED {
                            return Err(os_err("mmap (mremap target)"));
                        }
                        let p = libc::mremap(addr as *mut libc::c_void, len as usize, len as usize, libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED, t);
                        if p == libc::MAP_FAILED {
                            -1
                        } else if p != t {
                            return Err((format!("mremap(MREMAP_FIXED) put the pages at {p:p}, not at the target {t:p}"), libc::EFAULT));
                        } else {
                            0
                        }
                    }
                    "mremap_shrink" => {
                        let p = libc::mremap(addr as *mut libc::c_void, len as usize, (len - ev_len) as usize, 0);
                        if p == libc::MAP_FAILED {
                            -1
                        } else {
                            0
                        }
                    }
                    "free" => {
                        libc::free(addr as *mut libc::c_void);
                        0
                    }
                    "brk_shrink" => {
                        if libc::sbrk(-(len as isize)) as isize == -1 {
                            -1
                        } else {
                            0
                        }
                    }
                    other => return Err((format!("unknown command `{other}`"), 0)),
                };
                if r != 0 {
                    return Err(os_err(cmd));
                }
                b.after_release(ev_addr, ev_len);
                Ok(json!({}))
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The session

fn execute(b: &dyn Backend, c: &Map<String, Value>) -> OpResult {
    let cmd = c.get("cmd").and_then(Value::as_str).unwrap_or("");
    match cmd {
        "acquire" => {
            let access: Access = c
                .get("access")
                .and_then(Value::as_str)
                .unwrap_or("local_read")
                .parse()
                .map_err(|e: String| (e, 0))?;
            b.acquire(get_u64(c, "lease")?, get_u64(c, "addr")?, get_u64(c, "len")?, access)
        }
        "release" => b.release(get_u64(c, "lease")?),
        "flush" => b.flush(),
        "trim" => b.trim(),
        "dma_in" | "dma_out" | "app_write" | "app_read" => data_op(cmd, c),
        _ => memory_op(b, cmd, c),
    }
}

/// Remembers which registration a lease names (after an acquire's reply),
/// forgets it at its release.
fn track_lease(c: &Map<String, Value>, r: &OpResult) {
    let mut m = LEASE_REGS.lock().unwrap_or_else(|e| e.into_inner());
    let m = m.get_or_insert_with(HashMap::new);
    match (c.get("cmd").and_then(Value::as_str), r) {
        (Some("acquire"), Ok(v)) => {
            if let (Ok(l), Some(id)) = (get_u64(c, "lease"), v.get("reg").and_then(Value::as_u64)) {
                m.insert(l, id);
            }
        }
        (Some("release"), _) => {
            if let Ok(l) = get_u64(c, "lease") {
                m.remove(&l);
            }
        }
        _ => {}
    }
}

/// Run-length `[[byte, count], ...]` of `bytes`.
fn runs(bytes: &[u8]) -> Value {
    let mut out: Vec<(u8, u64)> = Vec::new();
    for &b in bytes {
        match out.last_mut() {
            Some((x, n)) if *x == b => *n += 1,
            _ => out.push((b, 1)),
        }
    }
    json!(out.iter().map(|(b, n)| json!([b, n])).collect::<Vec<_>>())
}

/// The data commands (docs/conformance-protocol.md, *Data commands*).
fn data_op(cmd: &str, c: &Map<String, Value>) -> OpResult {
    let (addr, len) = (get_u64(c, "addr")?, get_u64(c, "len")?);
    if len == 0 || len > 1 << 20 {
        return Err((format!("{cmd}: length {len} out of range (1 ..= 1 MiB)"), libc::EINVAL));
    }
    let byte = || -> Result<u8, (String, i32)> {
        u8::try_from(get_u64(c, "byte")?).map_err(|_| (format!("{cmd}: `byte` is not a byte"), libc::EINVAL))
    };
    match cmd {
        "app_write" => {
            let b = byte()?;
            // SAFETY: the runner names bytes of the adapter's arena or of a
            // block it allocated for the case; no Rust object lives there.
            unsafe { std::ptr::write_bytes(addr as *mut u8, b, len as usize) };
            return Ok(json!({}));
        }
        "app_read" => {
            // SAFETY: as for app_write; the bytes are copied out at once.
            let v = unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) }.to_vec();
            return Ok(json!({"runs": runs(&v)}));
        }
        _ => {}
    }
    let Some(pins) = PINS.get() else {
        return Err(("the counting registrar pins nothing: no device can move data (run with --registrar io_uring)".into(), UNSUPPORTED));
    };
    let lease = get_u64(c, "lease")?;
    let id = LEASE_REGS.lock().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(|m| m.get(&lease).copied());
    let Some(id) = id else { return Err((format!("{cmd}: lease {lease} is not held"), libc::EINVAL)) };
    let handles = pins.handles.lock().unwrap_or_else(|e| e.into_inner());
    let Some(h) = handles.get(&id) else {
        return Err((
            format!("{cmd}: registration {id} (lease {lease}) holds no pin of this process's io_uring registrar (deregistered, or made before a fork)"),
            libc::EINVAL,
        ));
    };
    if addr < h.range.addr || addr + len > h.range.addr + h.range.len {
        return Err((format!("{cmd}: [{addr:#x}, {:#x}) lies outside registration {id} {}", addr + len, h.range), libc::EFAULT));
    }
    let off = addr - h.range.addr;
    let ring = pins.ring();
    if cmd == "dma_in" {
        let data = vec![byte()?; len as usize];
        // SAFETY: the device writes into pinned frames of the case's memory:
        // no Rust reference points into the arena or the case's blocks, and
        // the runner sends no other command touching them meanwhile.
        unsafe { ring.dma_write(h, off, &data) }.map_err(|e| (format!("dma_in through registration {id}: {e}"), e.errno))?;
        Ok(json!({}))
    } else {
        let mut out = vec![0u8; len as usize];
        ring.dma_read(h, off, &mut out).map_err(|e| (format!("dma_out through registration {id}: {e}"), e.errno))?;
        Ok(json!({"runs": runs(&out)}))
    }
}

fn reply(seq: u64, r: OpResult) {
    let v = match r {
        Ok(Value::Object(mut m)) => {
            m.insert("seq".into(), json!(seq));
            m.insert("ok".into(), json!(true));
            Value::Object(m)
        }
        Ok(_) => json!({"seq": seq, "ok": true}),
        Err((e, UNSUPPORTED)) => json!({"seq": seq, "ok": false, "error": e, "errno": 0, "unsupported": true}),
        Err((e, errno)) => json!({"seq": seq, "ok": false, "error": e, "errno": errno}),
    };
    emit(&v);
}

/// Runs the adapter on stdin/stdout until `end` or EOF. Returns the exit code.
pub fn run(args: &AdapterArgs) -> anyhow::Result<u8> {
    // Keep the adapter's own allocations off the brk heap (brk_grow/shrink
    // move the break under glibc's feet otherwise), as fabtests does.
    // SAFETY: mallopt before any other thread exists.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 1) };
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let Some(Ok(first)) = lines.next() else { return Ok(0) };
    let hello: Map<String, Value> = match serde_json::from_str(&first) {
        Ok(h) => h,
        Err(e) => {
            emit(&json!({"seq": 0, "ok": false, "error": format!("line 1 is not a JSON object: {e}")}));
            return Ok(2);
        }
    };
    let cfg = hello.get("config").and_then(Value::as_object).cloned().unwrap_or_default();
    let limits = Limits {
        max_regions: cfg.get("max_regions").and_then(Value::as_u64),
        max_pinned_bytes: cfg.get("max_pinned_bytes").and_then(Value::as_u64),
        max_unreleased: Some(Limits::DEFAULT_MAX_UNRELEASED),
    };
    let seq0 = hello.get("seq").and_then(Value::as_u64).unwrap_or(0);
    let chunk_pages = match chunk_pages(args.chunk) {
        Ok(c) => c,
        Err(e) => {
            emit(&json!({"seq": seq0, "ok": false, "error": e}));
            return Ok(2);
        }
    };
    // The arena the case asks for (issue 24: `config.arena_len`), at least ours.
    let arena_len = match cfg.get("arena_len").and_then(Value::as_u64) {
        Some(n) if n > MAX_ARENA => {
            emit(&json!({"seq": seq0, "ok": false, "unsupported": true,
                "error": format!("the case asks for an arena of {n} bytes; this adapter maps at most {MAX_ARENA}")}));
            return Ok(0);
        }
        Some(n) => n.max(ARENA).next_multiple_of(PAGE),
        None => ARENA,
    };
    // SAFETY: a fresh private anonymous mapping, far below where the kernel
    // places new mappings (top down), so that the holes the cases make are
    // not filled by other allocations; NOREPLACE never clobbers anything.
    let arena = unsafe {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        let p = libc::mmap(ARENA_HINT as *mut libc::c_void, arena_len as usize, libc::PROT_READ | libc::PROT_WRITE, flags | libc::MAP_FIXED_NOREPLACE, -1, 0);
        if p == libc::MAP_FAILED {
            libc::mmap(std::ptr::null_mut(), arena_len as usize, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0)
        } else {
            p
        }
    };
    if arena == libc::MAP_FAILED {
        emit(&json!({"seq": 0, "ok": false, "error": format!("cannot map the arena: {}", std::io::Error::last_os_error())}));
        return Ok(2);
    }
    touch(arena as u64, arena_len);
    if args.registrar == RegistrarKind::IoUring {
        match UringPins::open() {
            Ok(p) => {
                let _ = PINS.set(p);
            }
            Err(e) => {
                emit(&json!({"seq": 0, "ok": false, "error": e}));
                return Ok(2);
            }
        }
    }
    let (backend, name, policy, caps): (Arc<dyn Backend>, String, Option<OverlapPolicy>, Vec<&str>) = if args.toy {
        let declared = match args.declare.as_deref() {
            Some("none") => None,
            Some(p) => match p.parse::<OverlapPolicy>() {
                Ok(p) => Some(p),
                Err(e) => {
                    emit(&json!({"seq": 0, "ok": false, "error": format!("--declare: {e}")}));
                    return Ok(2);
                }
            },
            None if args.brk.contains(&ToyBreak::WrongPolicy) => Some(OverlapPolicy::Merge),
            None => Some(OverlapPolicy::Independent),
        };
        let name = match args.brk.as_slice() {
            [] => "toy".into(),
            [b] => format!("toy (breaks {b:?})"),
            bs => format!("toy (breaks {})", bs.iter().map(|b| format!("{b:?}")).collect::<Vec<_>>().join(", ")),
        };
        let toy = Toy { brk: args.brk.clone(), chunk_pages, limits, st: Mutex::new(ToySt::default()), reg: EmitRegistrar::new() };
        (Arc::new(toy), name, declared, vec!["flush", "trim", "limits", "fork", "pause", "pause_mem", "query"])
    } else {
        match Mrcache::start(args.policy, limits, args.fault, chunk_pages) {
            Ok(m) => {
                let name = match args.fault {
                    Some(f) => format!("mrcache (fault {f:?})"),
                    None => "mrcache".into(),
                };
                (Arc::new(m), name, Some(args.policy), vec!["flush", "trim", "limits", "pause", "pause_mem", "fork", "query"])
            }
            Err(e) => {
                emit(&json!({"seq": 0, "ok": false, "error": e}));
                return Ok(2);
            }
        }
    };
    emit(&json!({
        "seq": hello.get("seq").and_then(Value::as_u64).unwrap_or(0), "ok": true, "protocol": 1,
        "name": name, "version": env!("CARGO_PKG_VERSION"),
        "policy": policy.map(|p| p.name()), "page_size": PAGE, "caps": caps, "access_field": true,
        "eviction": "lru",
        "limits": {"max_regions": limits.max_regions, "max_pinned_bytes": limits.max_pinned_bytes},
        "arena": {"addr": format!("{:#x}", arena as u64), "len": arena_len},
        "chunk_size": (!args.chunk_undeclared).then_some(args.chunk),
        "l1_bound": (!args.no_l1_bound).then(|| json!({"ops": 0, "registrations": 0, "bytes": 0})),
        "registrar": args.registrar.name(),
    }));
    let inflight = Arc::new(AtomicUsize::new(0));
    let mut workers: HashMap<u64, Sender<Map<String, Value>>> = HashMap::new();
    let wait_idle = |inflight: &AtomicUsize| {
        for _ in 0..100_000 {
            if inflight.load(Ordering::SeqCst) == 0 {
                return;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    };
    for line in lines {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let c: Map<String, Value> = match serde_json::from_str(&line) {
            Ok(c) => c,
            Err(e) => {
                emit(&json!({"ev": "log", "text": format!("ignored a line that is not a JSON object: {e}")}));
                continue;
            }
        };
        let seq = c.get("seq").and_then(Value::as_u64).unwrap_or(0);
        let thread = c.get("thread").and_then(Value::as_u64).unwrap_or(0);
        match c.get("cmd").and_then(Value::as_str).unwrap_or("") {
            "continue" => {
                resume(thread);
                reply(seq, Ok(json!({})));
            }
            "end" => {
                wait_idle(&inflight);
                reply(seq, Ok(json!({})));
                return Ok(0);
            }
            "stats" => emit(&json!({"seq": seq, "ok": false, "unsupported": true, "error": "stats are not reported by this adapter"})),
            "query" => {
                wait_idle(&inflight);
                reply(seq, Ok(live_now()));
            }
            "fork" => {
                wait_idle(&inflight);
                let out = std::io::stdout();
                let guard = out.lock();
                // SAFETY: every worker is idle; the child continues with this
                // thread only and starts new workers on demand.
                let pid = unsafe { libc::fork() };
                drop(guard);
                match pid {
                    -1 => reply(seq, Err(os_err("fork"))),
                    0 => {
                        workers.clear();
                        // The child forgets the parent's registrations (S2.6).
                        LIVE.lock().unwrap_or_else(|e| e.into_inner()).clear();
                        if let Some(p) = PINS.get() {
                            p.forked();
                        }
                        backend.forked();
                        reply(seq, Ok(json!({"pid": std::process::id()})));
                    }
                    child => {
                        // The parent waits for the child, which owns the session now.
                        let mut st = 0;
                        // SAFETY: waits for our own child.
                        unsafe { libc::waitpid(child, &mut st, 0) };
                        let code = if libc::WIFEXITED(st) { libc::WEXITSTATUS(st) } else { 128 + libc::WTERMSIG(st) };
                        // SAFETY: ends the parent without running destructors
                        // that the child's session still relies on.
                        unsafe { libc::_exit(code) };
                    }
                }
            }
            _ => {
                let tx = workers.entry(thread).or_insert_with(|| {
                    let (tx, rx) = channel::<Map<String, Value>>();
                    let b = backend.clone();
                    let inflight = inflight.clone();
                    std::thread::spawn(move || {
                        for c in rx {
                            let seq = c.get("seq").and_then(Value::as_u64).unwrap_or(0);
                            let pause = c.get("pause").and_then(Value::as_bool).unwrap_or(false);
                            CURRENT.with(|cur| cur.set((thread, pause)));
                            let r = execute(&*b, &c);
                            track_lease(&c, &r);
                            CURRENT.with(|cur| cur.set((thread, false)));
                            reply(seq, r);
                            inflight.fetch_sub(1, Ordering::SeqCst);
                        }
                    });
                    tx
                });
                inflight.fetch_add(1, Ordering::SeqCst);
                if tx.send(c).is_err() {
                    inflight.fetch_sub(1, Ordering::SeqCst);
                    reply(seq, Err(("worker thread is gone".into(), 0)));
                }
            }
        }
    }
    Ok(0)
}
