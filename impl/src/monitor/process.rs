//! One userfaultfd monitor per process, shared by every cache that uses it
//! (spec.md#S7.6, M1, M2, M5, M3, M4).
//!
//! A range can be watched by one userfaultfd only, so two caches with a
//! monitor each could not share a buffer (the second watch fails with
//! EBUSY). Here the process has one `Hub`: one fd, one thread, one madvise
//! prover. A cache *attaches* with [`MonitorThread::start`] and detaches
//! when that handle is dropped; the last detach stops the thread, which
//! closes the fd (unwatching every range) before it exits.
//!
//! Invariants:
//! - The fd is read only by the hub's thread, in a round that holds the
//!   exclusive lock of every attached cache (taken in attach order, under
//!   the members mutex), and every event read is applied to every one of
//!   them before any unlocks (M5). A cache's A2/A6 read nothing from it
//!   (`HubSource::read_pending` is empty). So no cache can hand out a
//!   registration that an event already read (its releasing thread woken)
//!   has invalidated.
//! - Lock order: the process mutex, then the members mutex, then cache
//!   locks in attach order. Nothing takes them in another order: a detach
//!   flushes its cache before it takes the members mutex.
//! - No deregistration runs while a cache lock is held: each cache's list
//!   is performed once every cache of the round is unlocked (A11).
//! - A cache detaching stops caching first (its source stops delivering:
//!   A9 caches nothing), is flushed while events still reach it, and only
//!   then leaves the members: no entry of it outlives its monitor.
//! - Every loop is bounded by the stop flag or by [`READ_BATCH`].

use super::fork_close;
use super::madvise_proof::{self, InstallError, Observation, Seen, SendOutcome, Sent, Signal, TaskFile, TaskFiles};
use super::uffd::{UffdError, UffdMonitor};
use crate::cache::{Cache, EventSource, ReleaseEvent, RoundDeregs, RoundLock, SharedCache, Watched};
use crate::registrar::Registrar;
use mrcache_types::Range;
use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, Weak};
use std::thread::JoinHandle;

/// Messages read per round.
pub const READ_BATCH: usize = 256;

/// How long the monitor thread waits in `poll` before re-checking its stop flag.
pub const POLL_TIMEOUT_MS: i32 = 20;

/// The poll timeout while a REMOVE window awaits its proof: threads seen
/// inside a madvise are looked at again this often (those that acknowledge
/// the signal wake the poll at once).
pub const PROOF_POLL_MS: i32 = 1;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An attached cache, whatever its registrar.
trait Member: Send + Sync {
    /// Takes the cache's lock exclusive for a round (M5).
    fn lock(&self) -> Box<dyn LockedMember<'_> + '_>;
    /// M4 for one window M3 opened in this cache.
    fn close_remove_window(&self, range: Range);
    /// Stops caching and flushes (spec.md#S7.6, detaching).
    fn stop_caching(&self);
}

/// One attached cache, locked for the round.
trait LockedMember<'c> {
    /// Applies the events; returns the ranges whose REMOVE window it opened.
    fn apply(&mut self, events: &[ReleaseEvent]) -> Vec<Range>;
    fn unlock(self: Box<Self>) -> Box<dyn Deferred + 'c>;
}

/// A locked cache's deregistrations, performed once every cache is unlocked.
trait Deferred {
    fn perform(self: Box<Self>);
}

struct CacheMember<C> {
    cache: C,
    delivering: Arc<AtomicBool>,
}

impl<R, C> Member for CacheMember<C>
where
    R: Registrar,
    C: Deref<Target = Cache<R>> + Send + Sync,
{
    fn lock(&self) -> Box<dyn LockedMember<'_> + '_> {
        Box::new(self.cache.lock_for_round())
    }

    fn close_remove_window(&self, range: Range) {
        self.cache.close_remove_window(range);
    }

    fn stop_caching(&self) {
        // Release: pairs with the Acquire in `delivering`, read by A9 under
        // the cache lock; the flush below takes that lock after it, so every
        // A9 after the flush sees `false`.
        self.delivering.store(false, Ordering::Release);
        self.cache.flush();
    }
}

impl<'c, R: Registrar> LockedMember<'c> for RoundLock<'c, R> {
    fn apply(&mut self, events: &[ReleaseEvent]) -> Vec<Range> {
        RoundLock::apply(self, events)
    }
    fn unlock(self: Box<Self>) -> Box<dyn Deferred + 'c> {
        Box::new(RoundLock::unlock(*self))
    }
}

impl<R: Registrar> Deferred for RoundDeregs<'_, R> {
    fn perform(self: Box<Self>) {
        RoundDeregs::perform(*self)
    }
}

/// The process's monitor: its fd, its madvise-proof signal, and the caches
/// attached to it, in attach order.
struct Hub {
    /// The fd. `None` once the thread closed it on its way out:
    /// a watch then finds nothing to watch through (the range is served
    /// uncached). The lock keeps a watch from using the fd's number after
    /// it was closed (and perhaps reused); only the closing takes it
    /// exclusive, once.
    monitor: RwLock<Option<UffdMonitor>>,
    /// Where [`fork_close`] tracks the fd, so that a fork child closes it.
    fd_slot: Option<usize>,
    /// [`fork_close::forks`] at launch: another count means this is a fork
    /// child's copy of the hub, whose fd the child closed.
    forks_at_launch: u64,
    signal: Signal,
    /// Attached caches by id. Its mutex orders rounds, attaches and detaches.
    members: Mutex<Vec<(u64, Arc<dyn Member>)>>,
    stop: AtomicBool,
    rounds: AtomicU64,
    read_errors: AtomicU64,
}

impl Hub {
    //= spec.md#M5
    //# take the lock exclusive of every attached cache, in the order they
    //# attached (a mutex orders rounds, attaches and detaches); read every
    //# pending event non-blockingly; apply each to every attached cache (A-D,
    //# and M3 for a REMOVE); unlock each; perform the dereg lists.
    /// One round. Returns each REMOVE window opened (M3), with the ids of
    /// the caches that opened it: each is owed an M4.
    fn round(&self) -> Vec<(Range, Vec<u64>)> {
        let members = lock(&self.members);
        let mut locked: Vec<Box<dyn LockedMember<'_>>> = members.iter().map(|(_, m)| m.lock()).collect();
        let mut events = Vec::new();
        let read = match &*read_lock(&self.monitor) {
            Some(monitor) => monitor.read_pending(&mut events, READ_BATCH).map(drop),
            None => Ok(()),
        };
        if read.is_err() {
            // Retried next round: the fd stays readable.
            self.read_errors.fetch_add(1, Ordering::Relaxed);
        }
        let mut opened: Vec<(Range, Vec<u64>)> = Vec::new();
        for (member, (id, _)) in locked.iter_mut().zip(members.iter()) {
            for range in member.apply(&events) {
                match opened.iter_mut().find(|(r, _)| *r == range) {
                    Some((_, ids)) => ids.push(*id),
                    None => opened.push((range, vec![*id])),
                }
            }
        }
        let deferred: Vec<Box<dyn Deferred + '_>> = locked.into_iter().map(|m| m.unlock()).collect();
        for d in deferred {
            d.perform();
        }
        self.rounds.fetch_add(1, Ordering::Relaxed);
        opened
    }

    /// M4 for `range` in each cache of `ids` still attached, once per
    /// time its id is listed (two REMOVEs of one range in a round opened two
    /// windows there: a multiset).
    fn close_windows(&self, range: Range, ids: &[u64]) {
        let members = lock(&self.members);
        for id in ids {
            if let Some((_, member)) = members.iter().find(|(m, _)| m == id) {
                member.close_remove_window(range);
            }
        }
    }

    fn run(&self) {
        let mut prover = Prover::new(self.signal);
        let mut unproven = false;
        while !self.stop.load(Ordering::Acquire) {
            // Short waits while a window awaits its proof: an
            // acknowledgement also wakes the poll (the eventfd).
            let timeout = if unproven { PROOF_POLL_MS } else { POLL_TIMEOUT_MS };
            //= spec.md#M1
            //# uffd monitor thread: poll until the fd is readable, without reading.
            let readable = match &*read_lock(&self.monitor) {
                Some(monitor) => monitor.wait_readable_or(self.signal.wake_fd(), timeout),
                None => break,
            };
            match readable {
                Ok(true) => {
                    let opened = self.round();
                    //= spec.md#M3
                    //# The window is handed to the monitor thread for M4 only once it is open.
                    prover.begin(opened);
                }
                Ok(false) => {}
                // EINTR and the like: poll again after the timeout.
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(POLL_TIMEOUT_MS as u64)),
            }
            self.signal.clear_wake();
            unproven = prover.advance(self);
        }
    }

    /// Closes the fd (once; later calls do nothing), untracking it first
    /// under [`fork_close`]'s gate: no fork falls between the two.
    fn close_fd(&self) {
        let held = fork_close::hold();
        let mut monitor = self.monitor.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(open) = monitor.take() {
            if fork_close::forks() == self.forks_at_launch {
                fork_close::untrack(&held, self.fd_slot);
                drop(open);
            } else {
                // A fork child's copy: the child handler closed this number
                // already, and it may name another file by now.
                std::mem::forget(open);
            }
        }
        drop(monitor);
        drop(held);
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        // A hub whose thread never ran (spawn failed) still holds its fd.
        self.close_fd();
    }
}

fn read_lock<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// A cache's event source when attached to the hub: it watches through the
/// shared fd and reads nothing itself (events arrive by rounds, M5).
struct HubSource {
    hub: Weak<Hub>,
    delivering: Arc<AtomicBool>,
}

impl EventSource for HubSource {
    //= spec.md#M2
    //# A2 and A6 also read pending events, from a monitor that serves their cache alone
    /// Nothing: a shared monitor's events are read only in rounds that hold
    /// every attached cache's lock (spec.md#M5).
    fn read_pending(&self, _out: &mut Vec<ReleaseEvent>) {}

    fn watch(&self, range: Range) -> Result<Watched, String> {
        if !self.delivering() {
            return Ok(Watched::Not);
        }
        let Some(hub) = self.hub.upgrade() else { return Ok(Watched::Not) };
        //= spec.md#S7.6
        //# If the kernel refuses to watch a range because
        //# another userfaultfd in the process watches it (EBUSY), the acquire is
        //# served, uncached
        if fork_close::forks() != hub.forks_at_launch {
            // A fork child's copy of the parent's hub, reached only under the
            // F1 fault switch (which keeps the parent's monitor; without it
            // the child's cache has no source). The child closed the fd, and
            // it never watched the child's memory (its context is the
            // parent's): answered as that fd's watch did, which keeps the
            // fault's behaviour.
            return Ok(Watched::Yes);
        }
        let monitor = read_lock(&hub.monitor);
        // The thread closed the fd: the last cache detached while this
        // acquire was between its delivering check and here. Served uncached.
        let Some(open) = &*monitor else { return Ok(Watched::Not) };
        let watched = open.watch(range);
        // Unlocked before the error text is made: its allocation and free
        // could release heap pages a widened registration watches, and a
        // stopping monitor thread waits for this guard instead of reading.
        drop(monitor);
        match watched {
            Ok(()) => Ok(Watched::Yes),
            Err(UffdError::Unwatchable { errno: libc::EBUSY, .. }) => Ok(Watched::Not),
            Err(e) => Err(e.to_string()),
        }
    }

    fn delivering(&self) -> bool {
        self.delivering.load(Ordering::Acquire)
    }

    fn proves_removes(&self) -> bool {
        true
    }
}

/// One REMOVE window awaiting its proof (spec.md#M4, S7.5), opened in the
/// caches `ids`.
struct Unproven {
    range: Range,
    ids: Vec<u64>,
    /// Threads that may still be inside the madvise, with the token of the
    /// signal that will prove each out (None: none taken yet).
    waiting: Vec<(i32, Option<Sent>)>,
    /// Not scanned yet: the thread list could not be read, or did not hold
    /// still (threads starting and exiting under it). Nothing is proven
    /// until a scan succeeds; each pass of the prover tries again.
    unknown: bool,
}

impl Unproven {
    /// Adds the threads of `tids` that may be inside the madvise to
    /// `waiting`. A scan at any time after the event was read is sound: a
    /// thread seen outside the madvise then has left it (or was never in it).
    fn scan(&mut self, tids: &[i32], looks: &mut Looks) {
        for &tid in tids {
            match looks.at(tid).against(self.range) {
                Seen::Elsewhere | Seen::Exited => {}
                Seen::Inside | Seen::WorkerBusy | Seen::Unknown => self.waiting.push((tid, None)),
            }
        }
        self.unknown = false;
    }
}

/// The looks at threads taken in one pass of the prover: each thread's files
/// are read once per pass, however many windows wait on it (every window of
/// the pass had its event read before the pass began, so one look serves
/// them all). A pass costs a read per thread, not per thread and window;
/// the files stay open between passes ([`TaskFiles`]).
struct Looks<'f> {
    files: &'f mut TaskFiles,
    seen: HashMap<i32, Observation>,
    /// The process's threads, listed at most once per pass (None inside:
    /// the list could not be had).
    threads: Option<Option<Vec<i32>>>,
}

impl<'f> Looks<'f> {
    fn new(files: &'f mut TaskFiles) -> Self {
        Looks { files, seen: HashMap::new(), threads: None }
    }

    fn at(&mut self, tid: i32) -> &Observation {
        let files = &mut *self.files;
        self.seen.entry(tid).or_insert_with(|| files.observe(tid))
    }

    fn threads(&mut self, me: i32) -> Option<Vec<i32>> {
        if self.threads.is_none() {
            let listed = madvise_proof::threads(me);
            if let Some(tids) = &listed {
                self.files.keep_only(tids);
            }
            self.threads = Some(listed);
        }
        self.threads.clone().flatten()
    }
}

/// A proof signal sent and not yet acknowledged.
struct Outstanding {
    tid: i32,
    sent: Sent,
    /// The thread it was sent to, opened before the send: it says when that
    /// thread exits even if its id is reused meanwhile (a look by id would
    /// see the new thread, and the signal, never to be acknowledged, would
    /// keep its slot). None past `KEPT_FILES` outstanding signals, or if it
    /// could not be opened: then looked at by id.
    thread: Option<TaskFile>,
}

/// The monitor thread's half of M4: scans threads for each new window,
/// signals those that may be inside the madvise, and closes a window once
/// none may be.
///
/// A thread has at most one proof signal outstanding, whatever the number
/// of windows waiting on it: so the signal slots and the per-pass work are
/// bounded by the process's threads, even for threads that never run the
/// handler (they block the signal, or are io_uring workers, which the
/// prover never signals but the same bound covers).
struct Prover {
    signal: Signal,
    me: i32,
    unproven: Vec<Unproven>,
    /// The threads' `/proc` files, kept open between passes.
    files: TaskFiles,
    /// The signal outstanding per thread: sent, and not acknowledged at the
    /// start of the last pass. At most one per thread.
    outstanding: Vec<Outstanding>,
}

impl Prover {
    fn new(signal: Signal) -> Self {
        Prover {
            signal,
            me: madvise_proof::gettid(),
            unproven: Vec::new(),
            files: TaskFiles::default(),
            outstanding: Vec::new(),
        }
    }

    /// Starts proving each window of `opened`: a range, and the caches
    /// that opened a window on it.
    fn begin(&mut self, opened: Vec<(Range, Vec<u64>)>) {
        let mut looks = Looks::new(&mut self.files);
        for (range, ids) in opened {
            let mut w = Unproven { range, ids, waiting: Vec::new(), unknown: true };
            if let Some(tids) = looks.threads(self.me) {
                w.scan(&tids, &mut looks);
            }
            self.unproven.push(w);
        }
    }

    /// One pass over the windows: sends, checks, closes. Returns whether
    /// any window is still unproven.
    ///
    /// Every window of the pass had its event read before the pass began.
    /// So a signal found unacknowledged at the start of the pass has its
    /// handler, if it ever runs, run after that read, at a return to user
    /// mode: a window may wait on a signal another window sent (the thread
    /// was either inside the madvise at the start of the pass and has left
    /// it by then, or not inside it, which it cannot enter again: it began
    /// before the read).
    fn advance(&mut self, hub: &Hub) -> bool {
        let signal = self.signal;
        // Signals resolved since the last pass: acknowledged (their slots
        // are free again), or their thread exited.
        let mut acknowledged: Vec<Sent> = Vec::new();
        let mut looks = Looks::new(&mut self.files);
        self.outstanding.retain(|o| {
            if signal.acknowledged(o.sent) {
                acknowledged.push(o.sent);
                return false;
            }
            let exited = match &o.thread {
                Some(thread) => thread.observe() == Observation::Settled(Seen::Exited),
                None => *looks.at(o.tid) == Observation::Settled(Seen::Exited),
            };
            if exited {
                signal.forget_exited(o.sent);
                return false;
            }
            true
        });
        let me = self.me;
        let outstanding = &mut self.outstanding;
        self.unproven.retain_mut(|w| {
            if w.unknown {
                match looks.threads(me) {
                    Some(tids) => w.scan(&tids, &mut looks),
                    None => return true, // scanned again on the next pass
                }
            }
            w.waiting.retain_mut(|(tid, sent)| {
                if let Some(s) = *sent {
                    if acknowledged.contains(&s) {
                        return false; // its handler ran after the send
                    }
                    if !outstanding.iter().any(|o| o.sent == s) {
                        return false; // forgotten: the thread exited
                    }
                }
                match looks.at(*tid).against(w.range) {
                    Seen::Exited => false,
                    // Its signal, if any, stays outstanding (still pending
                    // for it): its slot is freed when it acknowledges.
                    Seen::Elsewhere => false,
                    Seen::Inside => {
                        if sent.is_none() {
                            if let Some(o) = outstanding.iter().find(|o| o.tid == *tid) {
                                *sent = Some(o.sent);
                            } else {
                                // At most KEPT_FILES of these are open (the
                                // process's own descriptors come first).
                                let thread = if outstanding.len() < madvise_proof::KEPT_FILES {
                                    looks.files.handle(*tid)
                                } else {
                                    None
                                };
                                match signal.send(*tid) {
                                    SendOutcome::Sent(s) => {
                                        outstanding.push(Outstanding { tid: *tid, sent: s, thread });
                                        *sent = Some(s);
                                    }
                                    SendOutcome::Gone => return false,
                                    SendOutcome::Later => {}
                                }
                            }
                        }
                        true
                    }
                    // Never signalled (see `Seen::WorkerBusy`): looked at again.
                    Seen::WorkerBusy | Seen::Unknown => true,
                }
            });
            if w.waiting.is_empty() && !w.unknown {
                //= spec.md#M4
                //# A window not proven stays open: it costs caching on its pages, never freshness.
                hub.close_windows(w.range, &w.ids);
                return false;
            }
            true
        });
        !self.unproven.is_empty()
    }
}

/// The process's hub while any cache is attached.
struct Running {
    pid: u32,
    hub: Arc<Hub>,
    thread: JoinHandle<()>,
    attached: usize,
    next_id: u64,
}

/// The hub of this process, if any cache is attached. In a fork child it
/// still names the parent's (its thread does not exist there): `pid` tells.
static PROCESS: Mutex<Option<Running>> = Mutex::new(None);

/// A cache's attachment to the process's userfaultfd monitor (spec.md#S7.6).
/// Dropping it detaches the cache: it stops caching and is flushed; the
/// last attachment of the process stops the monitor thread and closes the
/// fd.
///
/// ```
/// use mrcache::registrar::counting::CountingRegistrar;
/// use mrcache::types::Access;
/// use mrcache::{Cache, CacheConfig, MonitorThread, Monitoring};
/// use std::sync::Arc;
///
/// # fn main() -> Result<(), mrcache::Error> {
/// let config = CacheConfig::default().monitored_by(Monitoring::Userfaultfd);
/// let cache = Arc::new(Cache::new(CountingRegistrar::default(), config));
/// let monitor = match MonitorThread::start(&cache) {
///     Ok(monitor) => monitor,
///     // No userfaultfd here (seccomp, valgrind, vm.unprivileged_userfaultfd=0
///     // without CAP_SYS_PTRACE): the error says which.
///     Err(e) => {
///         eprintln!("{e}");
///         return Ok(());
///     }
/// };
/// let buf = vec![0u8; 4 << 20]; // large enough that free() unmaps it
/// drop(cache.acquire_slice(&buf, Access::LOCAL_WRITE)?);
/// drop(buf); // the monitor invalidates the registration before munmap returns
/// assert_eq!(cache.stats().invalidations, 1);
/// drop(monitor); // detaches: the cache is flushed and caches nothing more
/// # Ok(())
/// # }
/// ```
//= spec.md#S7.3
pub struct MonitorThread {
    /// The process that attached: a fork child has a copy of this handle
    /// but neither the thread nor the attachment.
    pid: u32,
    id: u64,
    hub: ManuallyDrop<Arc<Hub>>,
    member: ManuallyDrop<Arc<dyn Member>>,
}

impl MonitorThread {
    /// Attaches `cache` to the process's userfaultfd monitor, starting it
    /// (the fd and its thread) if no cache of the process has. Every cache
    /// of the process shares the one monitor, whatever its registrar, so
    /// caches can hold registrations of the same buffer. Fails if the cache
    /// already has a source, userfaultfd is unavailable, or the madvise
    /// proof's signal is taken. In a fork child, call it again: the parent's
    /// monitor does not follow the child, and the child's cache caches
    /// nothing until it has its own (spec.md#S2.6).
    pub fn start<R: Registrar>(cache: &Arc<Cache<R>>) -> Result<MonitorThread, UffdError> {
        Self::attach(Arc::clone(cache))
    }

    /// [`Self::start`] for a [`SharedCache`]: the monitor keeps a handle
    /// (never a bare `Arc`, whose drop would skip the handle's check for
    /// owned leases still out).
    pub fn start_shared<R: Registrar + 'static>(cache: &SharedCache<R>) -> Result<MonitorThread, UffdError> {
        Self::attach(cache.clone())
    }

    fn attach<R, C>(cache: C) -> Result<MonitorThread, UffdError>
    where
        R: Registrar,
        C: Deref<Target = Cache<R>> + Send + Sync + 'static,
    {
        let signal = Signal::install().map_err(|e| match e {
            InstallError::Taken(signal) => UffdError::ProofSignal { signal, taken: true },
            InstallError::NotRealtime(signal) => UffdError::ProofSignal { signal, taken: false },
            InstallError::Os(errno) => UffdError::Thread { errno },
        })?;
        let pid = std::process::id();
        let mut process = lock(&PROCESS);
        if process.as_ref().is_some_and(|r| r.pid != pid) {
            // A fork child: the parent's hub has no thread here. Leaked (its
            // fd watches nothing of the child: the child's mappings lose the
            // parent's watch at fork).
            std::mem::forget(process.take());
        }
        if process.is_none() {
            *process = Some(Self::launch(signal, pid)?);
        }
        let running = process.as_mut().expect("launched above");
        // Not delivering until it is a member: a registration made before a
        // round can reach the cache is served uncached, never cached.
        let delivering = Arc::new(AtomicBool::new(false));
        let source = HubSource { hub: Arc::downgrade(&running.hub), delivering: delivering.clone() };
        if cache.set_event_source(Box::new(source)).is_err() {
            if running.attached == 0 {
                let idle = process.take().expect("present");
                drop(process);
                Self::shut_down(idle);
            }
            return Err(UffdError::AlreadyMonitored);
        }
        let id = running.next_id;
        running.next_id += 1;
        running.attached += 1;
        let member: Arc<dyn Member> = Arc::new(CacheMember { cache, delivering: delivering.clone() });
        lock(&running.hub.members).push((id, member.clone()));
        // Release: a watch or an A9 that sees `true` (Acquire) comes after
        // the push, so every round that reads an event for what it caches
        // holds this cache's lock too.
        delivering.store(true, Ordering::Release);
        Ok(MonitorThread { pid, id, hub: ManuallyDrop::new(running.hub.clone()), member: ManuallyDrop::new(member) })
    }

    /// Opens the fd and starts the thread.
    fn launch(signal: Signal, pid: u32) -> Result<Running, UffdError> {
        // Opened and tracked under the gate: a fork in between would give a
        // child a copy it does not know to close.
        let held = fork_close::hold();
        let monitor = UffdMonitor::open()?;
        let fd_slot = fork_close::track(&held, monitor.raw_fd());
        let forks_at_launch = fork_close::forks();
        drop(held);
        let hub = Arc::new(Hub {
            monitor: RwLock::new(Some(monitor)),
            fd_slot,
            forks_at_launch,
            signal,
            members: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            rounds: AtomicU64::new(0),
            read_errors: AtomicU64::new(0),
        });
        let (started, running) = std::sync::mpsc::sync_channel::<()>(1);
        let h = hub.clone();
        let thread = std::thread::Builder::new()
            .name("mrcache-uffd".into())
            .spawn(move || {
                //= spec.md#S7.6
                //# The monitor thread closes the fd itself, before it exits.
                // Its exit releases memory of its own (Rust's std unmaps its
                // signal stack, glibc madvises the unused part of its stack).
                // A registration widened over a neighbouring mapping (S6.2's
                // chunk_pages) can have watched those pages, and a release
                // of watched memory waits until its event is read: by this
                // thread, which would wait for itself forever. Closed by a
                // guard, so also if a round panics (a registrar's
                // deregistration, say). Every cache detached before the stop
                // (each flushed while still a member), so no event is owed.
                struct CloseOnExit(Arc<Hub>);
                impl Drop for CloseOnExit {
                    fn drop(&mut self) {
                        self.0.close_fd();
                    }
                }
                let hub = CloseOnExit(h);
                let _ = started.send(());
                hub.0.run();
            })
            .map_err(|e| UffdError::Thread { errno: e.raw_os_error().unwrap_or(libc::EAGAIN) })?;
        // Return only once the thread runs: its start maps memory (its stack
        // and signal stack), which must not land in a hole the application
        // makes later between an unmap and a MAP_FIXED of the same address.
        // A closed channel means the thread died before it ran.
        let _ = running.recv();
        Ok(Running { pid, hub, thread, attached: 0, next_id: 0 })
    }

    fn shut_down(idle: Running) {
        idle.hub.stop.store(true, Ordering::Release);
        let _ = idle.thread.join();
    }

    /// Monitor rounds run so far by the process's monitor (every cache's).
    pub fn rounds(&self) -> u64 {
        self.hub.rounds.load(Ordering::Relaxed)
    }

    /// `read()` calls of the shared fd that failed (not EAGAIN); each is
    /// retried in the next round.
    pub fn read_errors(&self) -> u64 {
        self.hub.read_errors.load(Ordering::Relaxed)
    }

    /// Caches attached to the process's monitor now.
    pub fn attached(&self) -> usize {
        lock(&self.hub.members).len()
    }
}

impl Drop for MonitorThread {
    fn drop(&mut self) {
        if std::process::id() != self.pid {
            // In a fork child the thread does not exist and the hub's state
            // is the parent's copy: touch nothing (leaked).
            return;
        }
        // SAFETY: taken once, here; not used after.
        let member = unsafe { ManuallyDrop::take(&mut self.member) };
        // SAFETY: as above.
        let hub = unsafe { ManuallyDrop::take(&mut self.hub) };
        //= spec.md#S7.6
        //# A cache that detaches while it lives takes every entry out of
        //# its lookup (as a flush: unleased ones are deregistered, leased ones at
        //# their last release) and caches nothing from then on
        // Flushed while events still reach it (it is still a member), and
        // with nothing cached after: no entry outlives its monitor.
        member.stop_caching();
        let mut process = lock(&PROCESS);
        let removed = {
            let mut members = lock(&hub.members);
            let at = members.iter().position(|(id, _)| *id == self.id);
            at.map(|i| members.remove(i))
        };
        let idle = match process.as_mut() {
            Some(running) if Arc::ptr_eq(&running.hub, &hub) => {
                running.attached -= 1;
                if running.attached == 0 { process.take() } else { None }
            }
            _ => None,
        };
        drop(process);
        // Outside the mutexes: this may be the last handle of the cache.
        drop(removed);
        drop(member);
        if let Some(idle) = idle {
            Self::shut_down(idle);
        }
        drop(hub);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::uffd::UffdError;
    use crate::registrar::counting::CountingRegistrar;
    use crate::CacheConfig;
    use mrcache_types::Access;

    fn map(len: usize) -> u64 {
        crate::mem::map_anon(len as u64, 0).unwrap()
    }

    #[test]
    //= spec.md#S7.3
    fn munmap_invalidates_through_the_monitor_thread() {
        let cache = Arc::new(Cache::new(CountingRegistrar::default(), CacheConfig::explicit()));
        let _monitor = MonitorThread::start(&cache).expect("userfaultfd available (root or user-mode-only)");
        let a = map(8 << 12);
        {
            let lease = cache.acquire(a, 8 << 12, Access::LOCAL_WRITE).unwrap();
            assert!(!lease.hit());
        }
        assert!(cache.acquire(a, 4096, Access::LOCAL_WRITE).unwrap().hit());
        // The munmap returns only once the monitor has read (and so applied) it.
        // SAFETY: `a` is our mapping, no lease is held.
        assert_eq!(unsafe { libc::munmap((a + (4 << 12)) as *mut _, 4 << 12) }, 0);
        // The kernel wakes the releasing thread inside the monitor's read(),
        // possibly before the apply ends; stats() waits for the monitor's
        // critical section, and so does the acquire (S3.8).
        assert_eq!(cache.stats().invalidations, 1);
        assert!(!cache.acquire(a, 4096, Access::LOCAL_WRITE).unwrap().hit());
        // L1: the monitor round deregisters after its unlock; wait for it (bounded).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while cache.stats().deregistrations < 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(cache.stats().deregistrations, 1, "{:?}", cache.stats());
        // SAFETY: the rest of our mapping.
        unsafe { libc::munmap(a as *mut _, 4 << 12) };
    }

    #[test]
    //= spec.md#S2.6
    fn a_replayed_fork_keeps_reading_the_monitor() {
        // Op::Fork replayed in the same process: the monitor still watches
        // this process's memory. Were it detached, the munmap below would
        // wait forever for a read that the monitor thread no longer does.
        let cache = Arc::new(Cache::new(CountingRegistrar::default(), CacheConfig::explicit()));
        let _monitor = MonitorThread::start(&cache).unwrap();
        let a = map(4 << 12);
        drop(cache.acquire(a, 4 << 12, Access::LOCAL_WRITE).unwrap());
        cache.simulate_fork();
        drop(cache.acquire(a, 4 << 12, Access::LOCAL_WRITE).unwrap());
        assert!(cache.acquire(a, 4096, Access::LOCAL_WRITE).unwrap().hit(), "cached after the replayed fork");
        // SAFETY: `a` is our mapping, no lease is held.
        assert_eq!(unsafe { libc::munmap(a as *mut _, 4 << 12) }, 0);
        let a2 = map(4 << 12);
        if a2 == a {
            assert!(!cache.acquire(a, 4096, Access::LOCAL_WRITE).unwrap().hit());
        }
        // SAFETY: our mapping.
        unsafe { libc::munmap(a2 as *mut _, 4 << 12) };
    }

    #[test]
    fn unwatchable_memory_is_refused_clearly() {
        let cache = Arc::new(Cache::new(CountingRegistrar::default(), CacheConfig::explicit()));
        let _monitor = MonitorThread::start(&cache).unwrap();
        let path = std::env::temp_dir().join(format!("mrcache-uffd-{}", std::process::id()));
        let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        f.set_len(4096).unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared mapping of our own file.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, f.as_raw_fd(), 0)
        };
        assert_ne!(p, libc::MAP_FAILED);
        let err = cache.acquire(p as u64, 4096, Access::LOCAL_WRITE).unwrap_err();
        assert_eq!(err.code(), "E5");
        assert!(err.to_string().contains("cannot watch"), "{err}");
        assert_eq!(cache.stats().cached_entries, 0);
        // SAFETY: our mapping.
        unsafe { libc::munmap(p, 4096) };
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_second_source_is_refused() {
        let cache = Arc::new(Cache::new(CountingRegistrar::default(), CacheConfig::explicit()));
        let _m = MonitorThread::start(&cache).unwrap();
        assert!(matches!(MonitorThread::start(&cache), Err(UffdError::AlreadyMonitored)));
    }
}
