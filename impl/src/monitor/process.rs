//! One userfaultfd monitor per process, shared by every cache that uses it
//! (spec.md#S7.6, M1, M5, M6, M3, M4), built so that it can never hang the
//! program.
//!
//! A release of watched memory (munmap, madvise, a brk shrink inside
//! `free()`) blocks in the kernel until the monitor *reads* its event. So
//! the thread that reads must never wait on anything a releasing thread can
//! hold. The monitor has two threads:
//! - the **reader** (`mrcache-uffd`) polls the fd, marks the event clock odd,
//!   reads into a buffer on its own stack, publishes each event into the
//!   [`EventRing`], marks the clock even and wakes the service thread. It
//!   allocates nothing, takes no lock, runs no user code, deregisters
//!   nothing and never exits (spec.md#M6 lists what it may wait on: nothing
//!   in user space);
//! - the **service** thread (`mrcache-svc`) applies the ring to every
//!   attached cache (each under its own lock, in turn), performs their
//!   deregistrations (the registrar's callbacks) with no lock held, and
//!   proves madvise returns (M4). It may wait on anything: no releasing
//!   thread waits for it.
//!
//! Freshness does not depend on the service thread: a hit on an attached
//! cache needs its gate current (`crate::cache` gate, M6), and an acquire
//! that finds it behind drains the ring itself under its own lock.
//!
//! Invariants:
//! - The fd, the ring and the reader live until the process exits: no exit
//!   of the reader releases memory (its stacks) that a widened registration
//!   may watch, and no fork child can keep the parent's fd alive past a
//!   reader that stopped (there is none). The service thread runs while any
//!   cache is attached (its exit's releases are read by the reader). A fork
//!   child starts its own monitor at its first attach.
//! - Lock order: the process lock, then the members mutex (held only to
//!   change or copy the list), then a member's slot mutex, then that
//!   cache's lock. The service holds a slot mutex across the member's
//!   round, callbacks included, so a detach waits for it there; it holds no
//!   other lock then.
//! - A cache attached is delivered every event published after its attach,
//!   by whichever drain comes first (its own A2/A6, or the service's round).
//! - Every loop is bounded by the reader's progress (which waits on nothing)
//!   or by [`super::uffd::READ_MESSAGES`] per read.

use super::madvise_proof::{self, InstallError, Observation, Seen, SendOutcome, Sent, Signal, TaskFile, TaskFiles};
use super::ring::{lost_events, EventRing, RING_EVENTS};
use super::uffd::{MessageBuffer, UffdError, UffdMonitor};
use crate::cache::{clock_reading, Cache, EventSource, ReleaseEvent, RoundDeregs, RoundLock, SharedCache, Watched, EVENT_CLOCK};
use crate::fork_safe::ProcessLock;
use crate::registrar::Registrar;
use mrcache_types::Range;
use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Messages a single-cache source reads per round (`UffdEvents`).
pub const READ_BATCH: usize = 256;

/// The service thread's poll timeout while a REMOVE window awaits its
/// proof: threads seen inside a madvise are looked at again this often
/// (those that acknowledge the signal wake the poll at once).
pub const PROOF_POLL_MS: i32 = 1;

/// How long the reader sleeps after a failed poll or read before trying
/// again (never expected: the fd is ours and never closed).
const REREAD_AFTER_ERROR_MS: u64 = 20;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An attached cache, whatever its registrar.
trait Member: Send + Sync {
    /// Takes the cache's lock exclusive for its part of a round.
    fn lock(&self) -> Box<dyn LockedMember<'_> + '_>;
    /// M4 for one window M3 opened in this cache.
    fn close_remove_window(&self, range: Range);
    /// Stops caching and flushes (spec.md#S7.6, detaching).
    fn stop_caching(&self);
    /// The windows M3 opened in this cache since the last call: each is
    /// owed an M4.
    fn take_owed(&self) -> Vec<Range>;
}

/// One attached cache, locked for its part of a round.
trait LockedMember<'c> {
    /// Drains: applies every event published and not yet applied here.
    fn drain(&mut self);
    fn unlock(self: Box<Self>) -> Box<dyn Deferred + 'c>;
}

/// A locked cache's deregistrations, performed once it is unlocked.
trait Deferred {
    fn perform(self: Box<Self>);
}

/// What a cache's source and its membership share.
struct Delivery {
    /// False once the cache began to detach: nothing more is cached.
    delivering: AtomicBool,
    /// Events of the ring applied to this cache (the next one's number).
    /// Changed only by a drain, under the cache's lock exclusive.
    cursor: AtomicU64,
    /// Windows M3 opened here, not yet handed to the prover. A leaf mutex.
    owed: Mutex<Vec<Range>>,
}

struct CacheMember<C> {
    cache: C,
    delivery: Arc<Delivery>,
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
        self.delivery.delivering.store(false, Ordering::Release);
        self.cache.flush();
    }

    fn take_owed(&self) -> Vec<Range> {
        std::mem::take(&mut *lock(&self.delivery.owed))
    }
}

impl<'c, R: Registrar> LockedMember<'c> for RoundLock<'c, R> {
    fn drain(&mut self) {
        // No events of its own: the drain inside reads the ring.
        RoundLock::apply(self, &[]);
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

/// A member's place in the hub. Its mutex is held by the service thread
/// across the member's round (callbacks included) and by the detach that
/// takes the member out: so once a detach returns, the hub holds no
/// reference to the cache.
struct MemberSlot {
    id: u64,
    member: Mutex<Option<Arc<dyn Member>>>,
}

/// The process's monitor: its fd, its ring, its madvise-proof signal, and
/// the caches attached to it, in attach order. Lives until the process
/// exits (module invariants).
struct Hub {
    monitor: UffdMonitor,
    ring: EventRing,
    signal: Signal,
    members: Mutex<Vec<Arc<MemberSlot>>>,
    /// The reader's thread id (0 until it runs): never inside a madvise.
    reader_tid: AtomicI32,
    rounds: AtomicU64,
    read_errors: AtomicU64,
    /// Drains that found their cache lapped (spec.md#M6).
    laps: AtomicU64,
}

impl Hub {
    //= spec.md#M6
    //# reader thread: poll the fd; store the event clock odd; read every
    //# pending message non-blockingly into memory of its own; publish each
    //# release event in the ring; store the clock even; wake the service
    //# thread
    /// The reader's loop (module docs): never returns, never allocates,
    /// never locks.
    fn read_forever(&self) -> ! {
        let mut buf = MessageBuffer::default();
        // Launch left the clock even (no reader ran before in this process).
        let mut published = EVENT_CLOCK.load(Ordering::Relaxed) / 2;
        loop {
            //= spec.md#M1
            //# uffd monitor thread: poll until the fd is readable, without reading.
            match self.monitor.wait_readable_or(-1, -1) {
                Ok(true) => {}
                Ok(false) => continue, // woken without an event (every signal is blocked here)
                Err(_) => {
                    self.read_errors.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(std::time::Duration::from_millis(REREAD_AFTER_ERROR_MS));
                    continue;
                }
            }
            // SeqCst, before the read(): a releasing thread is woken inside
            // it, and an acquire ordered after that release must then see
            // the clock odd or past this read's events (gate.rs).
            EVENT_CLOCK.store(2 * published + 1, Ordering::SeqCst);
            let mut next = published;
            let read = self.monitor.read_into(&mut buf, |ev| {
                self.ring.put(next, ev);
                next += 1;
            });
            if read.is_err() {
                self.read_errors.fetch_add(1, Ordering::Relaxed);
            }
            // Release: the ring slots written above are visible to a drain
            // that reads this value (it also re-checks each slot).
            EVENT_CLOCK.store(2 * next, Ordering::Release);
            if next != published {
                published = next;
                self.signal.wake();
            }
        }
    }

    /// The service thread's loop (module docs): rounds, then M4, until
    /// `stop` (the last detach; no cache is attached, so no window is owed).
    fn serve(&self, stop: &AtomicBool) {
        ON_SERVICE_THREAD.with(|on| on.set(true));
        let mut prover = Prover::new(self.signal, self.reader_tid.load(Ordering::Acquire));
        let mut unproven = false;
        // Acquire: pairs with the detach's Release store.
        while !stop.load(Ordering::Acquire) {
            let timeout = if unproven { PROOF_POLL_MS } else { -1 };
            self.signal.wait_wake(timeout);
            // Cleared before the round: a wake during it makes the next
            // wait return at once.
            self.signal.clear_wake();
            let opened = self.round();
            //= spec.md#M3
            //# The window is handed to the monitor thread for M4 only once it is open.
            prover.begin(opened);
            unproven = prover.advance(self);
        }
    }

    /// Starts a service thread; `stop` ends it.
    fn start_service(hub: &Arc<Hub>) -> Result<Service, UffdError> {
        let stop = Arc::new(AtomicBool::new(false));
        let (h, s) = (hub.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("mrcache-svc".into())
            .spawn(move || h.serve(&s))
            .map_err(|e| UffdError::Thread { errno: e.raw_os_error().unwrap_or(libc::EAGAIN) })?;
        Ok(Service { stop, thread })
    }

    //= spec.md#M5
    //# service thread, one round: for each attached cache in the order they
    //# attached, take its lock exclusive, drain it (M6), unlock it, perform
    //# its dereg list, with no other lock held but its member slot
    /// One round. Returns each REMOVE window opened (M3) since the last
    /// round, with the ids of the caches that opened it: each is owed an M4.
    fn round(&self) -> Vec<(Range, Vec<u64>)> {
        let slots: Vec<Arc<MemberSlot>> = lock(&self.members).clone();
        let mut opened: Vec<(Range, Vec<u64>)> = Vec::new();
        for slot in &slots {
            let held = lock(&slot.member);
            let Some(member) = held.as_ref() else { continue };
            let mut locked = member.lock();
            locked.drain();
            let deferred = locked.unlock();
            deferred.perform();
            // After this cache's drain: every window an earlier drain of it
            // opened (its own A2/A6) is in the list by now.
            for range in member.take_owed() {
                match opened.iter_mut().find(|(r, _)| *r == range) {
                    Some((_, ids)) => ids.push(slot.id),
                    None => opened.push((range, vec![slot.id])),
                }
            }
        }
        self.rounds.fetch_add(1, Ordering::Relaxed);
        opened
    }

    /// M4 for `range` in each cache of `ids` still attached, once per
    /// time its id is listed (two REMOVEs of one range opened two windows
    /// there: a multiset).
    fn close_windows(&self, range: Range, ids: &[u64]) {
        let slots: Vec<Arc<MemberSlot>> = lock(&self.members).clone();
        for id in ids {
            if let Some(slot) = slots.iter().find(|s| s.id == *id) {
                if let Some(member) = lock(&slot.member).as_ref() {
                    member.close_remove_window(range);
                }
            }
        }
    }
}

/// A cache's event source when attached to the hub: it watches through the
/// shared fd and drains the ring from its own cursor (M6).
struct HubSource {
    hub: Arc<Hub>,
    delivery: Arc<Delivery>,
}

impl EventSource for HubSource {
    //= spec.md#M6
    //# An attached cache's drain (A2, A6, a service round) applies the
    //# ring's events from its cursor, waiting out a read in progress,
    //# then sets its gate
    fn read_pending(&self, out: &mut Vec<ReleaseEvent>) -> Option<u64> {
        if !self.hub.ring.mapped_here() {
            // A fork child's copy (the F1 fault switch keeps it): no reader
            // here.
            return None;
        }
        let mut cursor = self.delivery.cursor.load(Ordering::Relaxed);
        // Bounded by the reader's progress: it is odd only across one
        // read(), and waits on nothing.
        loop {
            // Acquire: pairs with the reader's Release store of the clock.
            let clock = EVENT_CLOCK.load(Ordering::Acquire);
            let published = clock / 2;
            let mut lapped = published.saturating_sub(cursor) > RING_EVENTS;
            if !lapped {
                let before = out.len();
                for n in cursor..published {
                    match self.hub.ring.get(n) {
                        Some(ev) => out.push(ev),
                        None => {
                            lapped = true;
                            break;
                        }
                    }
                }
                if lapped {
                    out.truncate(before);
                }
            }
            if lapped {
                //= spec.md#M6
                //# A cache whose cursor the reader lapped applies a REMOVE of the whole address space instead
                self.hub.laps.fetch_add(1, Ordering::Relaxed);
                out.push(lost_events());
            }
            cursor = cursor.max(published);
            if !clock_reading(clock) {
                self.delivery.cursor.store(cursor, Ordering::Relaxed);
                return Some(2 * cursor);
            }
            std::thread::yield_now();
        }
    }

    fn gate_start(&self) -> Option<u64> {
        Some(2 * self.delivery.cursor.load(Ordering::Relaxed))
    }

    fn watch(&self, range: Range) -> Result<Watched, String> {
        if !self.delivering() {
            return Ok(Watched::Not);
        }
        if !self.hub.ring.mapped_here() {
            // A fork child's copy of the parent's hub, reached only under the
            // F1 fault switch (which keeps the parent's monitor; without it
            // the child's cache has no source). Its fd never watched the
            // child's memory (its context is the parent's): answered as that
            // fd's watch did, which keeps the fault's behaviour.
            return Ok(Watched::Yes);
        }
        //= spec.md#S7.6
        //# If the kernel refuses to watch a range because
        //# another userfaultfd in the process watches it (EBUSY), the acquire is
        //# served, uncached
        match self.hub.monitor.watch(range) {
            Ok(()) => Ok(Watched::Yes),
            Err(UffdError::Unwatchable { errno: libc::EBUSY, .. }) => Ok(Watched::Not),
            Err(e) => Err(e.to_string()),
        }
    }

    fn delivering(&self) -> bool {
        self.delivery.delivering.load(Ordering::Acquire)
    }

    fn proves_removes(&self) -> bool {
        true
    }

    fn remove_window_opened(&self, range: Range) {
        // Under the cache lock: a leaf mutex and a push.
        lock(&self.delivery.owed).push(range);
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

    /// The process's threads but the monitor's own two (`me`: the service
    /// thread, which proves; `reader`: the reader, which never calls
    /// madvise).
    fn threads(&mut self, (me, reader): (i32, i32)) -> Option<Vec<i32>> {
        if self.threads.is_none() {
            let listed = madvise_proof::threads(me).map(|mut tids| {
                tids.retain(|&t| t != reader);
                tids
            });
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
    /// The service thread's id and the reader's (never inside a madvise).
    me: (i32, i32),
    unproven: Vec<Unproven>,
    /// The threads' `/proc` files, kept open between passes.
    files: TaskFiles,
    /// The signal outstanding per thread: sent, and not acknowledged at the
    /// start of the last pass. At most one per thread.
    outstanding: Vec<Outstanding>,
}

impl Prover {
    fn new(signal: Signal, reader: i32) -> Self {
        Prover { signal, me: (madvise_proof::gettid(), reader), unproven: Vec::new(), files: TaskFiles::default(), outstanding: Vec::new() }
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
                    // Exited since this pass's first look at the outstanding
                    // signals (above): forget its signal here, as that look
                    // would have. This may close the last window, and no
                    // later pass then comes to free the slot (no handler of
                    // an exited thread wakes the service).
                    Seen::Exited => {
                        if let Some(i) = outstanding.iter().position(|o| o.tid == *tid) {
                            signal.forget_exited(outstanding.swap_remove(i).sent);
                        }
                        false
                    }
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
                                let thread = if outstanding.len() < madvise_proof::KEPT_FILES { looks.files.handle(*tid) } else { None };
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

/// The process's hub, once a cache attached. In a fork child it still names
/// the parent's (its threads do not exist there): `pid` tells.
struct Running {
    pid: u32,
    hub: Arc<Hub>,
    /// The service thread, while any cache is attached. It stops at the last
    /// detach (its exit may release watched memory: the reader reads it), so
    /// a process with no cache attached keeps only the reader, which never
    /// allocates: a child it makes with a raw fork finds no allocator lock
    /// held by mrcache.
    service: Option<Service>,
    attached: usize,
    next_id: u64,
}

/// A running service thread and its stop flag.
struct Service {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Service {
    /// Stops the thread after its round, and waits for it unless this is
    /// that thread (a callback that detached the last cache: it returns
    /// to the loop, which then ends).
    fn stop(self, hub: &Hub) {
        // Release: pairs with the Acquire in `serve`.
        self.stop.store(true, Ordering::Release);
        hub.signal.wake();
        if self.thread.thread().id() != std::thread::current().id() {
            let _ = self.thread.join();
        }
    }
}

/// The hub of this process, if any cache ever attached. A [`ProcessLock`]:
/// a fork child whose parent was inside attach or detach takes it over.
static PROCESS: ProcessLock<Option<Running>> = ProcessLock::new(None);

/// A cache's attachment to the process's userfaultfd monitor (spec.md#S7.6).
/// Dropping it detaches the cache: it stops caching and is flushed, and
/// once the drop returns the monitor holds no reference to it. The monitor
/// itself (its fd and two threads) stays for the life of the process.
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
/// drop(buf); // munmap returns once the monitor has read the event
/// // Applied before any later acquire can hit (and before stats count).
/// assert_eq!(cache.stats().invalidations, 1);
/// drop(monitor); // detaches: the cache is flushed and caches nothing more
/// # Ok(())
/// # }
/// ```
//= spec.md#S7.3
pub struct MonitorThread {
    /// The process that attached: a fork child has a copy of this handle
    /// but neither the threads nor the attachment.
    pid: u32,
    hub: ManuallyDrop<Arc<Hub>>,
    slot: ManuallyDrop<Arc<MemberSlot>>,
    member: ManuallyDrop<Arc<dyn Member>>,
}

impl MonitorThread {
    /// Attaches `cache` to the process's userfaultfd monitor, starting it
    /// (the fd and its two threads, for the life of the process) if no
    /// cache of the process has. Every cache of the process shares the one
    /// monitor, whatever its registrar, so caches can hold registrations of
    /// the same buffer. Fails if the cache already has a source,
    /// userfaultfd is unavailable, or the madvise proof's signal is taken.
    /// In a fork child, call it again: the parent's monitor does not follow
    /// the child, and the child's cache caches nothing until it has its own
    /// (spec.md#S2.6).
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
        let mut process = PROCESS.lock();
        if process.taken_over() || process.as_ref().is_some_and(|r| r.pid != pid) {
            //= spec.md#S7.6
            //# A fork child, of any kind, starts its own monitor at its first attach
            // The parent's hub, perhaps half-changed: overwritten, never read
            // or dropped (its threads and attachments are the parent's).
            // SAFETY: a valid place for an `Option<Running>`; `write` neither
            // reads nor drops the old value.
            unsafe { std::ptr::write(&mut *process, None) };
        }
        if process.is_none() {
            *process = Some(Self::launch(signal, pid)?);
        }
        let running = process.as_mut().expect("launched above");
        if running.service.is_none() {
            running.service = Some(Hub::start_service(&running.hub)?);
        }
        // Not delivering until it is a member: a registration made before a
        // round can reach the cache is served uncached, never cached.
        let delivery = Arc::new(Delivery {
            delivering: AtomicBool::new(false),
            // Every event published from here on reaches the cache; earlier
            // ones concern nothing it watches (it watches only once
            // delivering).
            cursor: AtomicU64::new(EVENT_CLOCK.load(Ordering::Acquire) / 2),
            owed: Mutex::new(Vec::new()),
        });
        let source = HubSource { hub: running.hub.clone(), delivery: delivery.clone() };
        if cache.set_event_source(Box::new(source)).is_err() {
            let idle = if running.attached == 0 { running.service.take() } else { None };
            let hub = running.hub.clone();
            drop(process);
            if let Some(service) = idle {
                service.stop(&hub);
            }
            return Err(UffdError::AlreadyMonitored);
        }
        let id = running.next_id;
        running.next_id += 1;
        running.attached += 1;
        let member: Arc<dyn Member> = Arc::new(CacheMember { cache, delivery: delivery.clone() });
        let slot = Arc::new(MemberSlot { id, member: Mutex::new(Some(member.clone())) });
        lock(&running.hub.members).push(slot.clone());
        // Release: a watch or an A9 that sees `true` (Acquire) comes after
        // the push, so the service's rounds reach what it caches.
        delivery.delivering.store(true, Ordering::Release);
        let hub = running.hub.clone();
        drop(process);
        Ok(MonitorThread { pid, hub: ManuallyDrop::new(hub), slot: ManuallyDrop::new(slot), member: ManuallyDrop::new(member) })
    }

    /// Opens the fd, maps the ring and starts the two threads.
    fn launch(signal: Signal, pid: u32) -> Result<Running, UffdError> {
        let monitor = UffdMonitor::open()?;
        let ring = EventRing::map().map_err(|e| UffdError::Thread { errno: e.raw_os_error().unwrap_or(libc::ENOMEM) })?;
        // Even: a fork child's copy may be odd (its parent's reader was
        // inside a read at the fork), and no reader runs here yet.
        let clock = EVENT_CLOCK.load(Ordering::Acquire);
        EVENT_CLOCK.store(clock + (clock & 1), Ordering::SeqCst);
        let hub = Arc::new(Hub {
            monitor,
            ring,
            signal,
            members: Mutex::new(Vec::new()),
            reader_tid: AtomicI32::new(0),
            rounds: AtomicU64::new(0),
            read_errors: AtomicU64::new(0),
            laps: AtomicU64::new(0),
        });
        // The reader first: the service thread's prover needs its id. The
        // channel says the thread runs (its start allocated and mapped what
        // it needed: its stack and signal stack, before anything is
        // watched); a closed channel means it died first.
        let (started, running) = std::sync::mpsc::sync_channel::<()>(1);
        let h = hub.clone();
        spawn("mrcache-uffd", move || {
            // Every signal blocked: a process-directed signal is then
            // delivered to another thread, so no handler of the
            // application's (which might allocate or lock) ever runs here.
            // SAFETY: a full set built by sigfillset, applied to this thread.
            unsafe {
                let mut all: libc::sigset_t = std::mem::zeroed();
                libc::sigfillset(&mut all);
                libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
            }
            h.reader_tid.store(madvise_proof::gettid(), Ordering::Release);
            let _ = started.send(());
            h.read_forever()
        })?;
        let _ = running.recv();
        // The service thread starts with the first attach (`attach`).
        Ok(Running { pid, hub, service: None, attached: 0, next_id: 0 })
    }

    /// Monitor rounds the service thread has run so far (every cache's).
    pub fn rounds(&self) -> u64 {
        self.hub.rounds.load(Ordering::Relaxed)
    }

    /// Failed polls or reads of the shared fd (not EAGAIN); each is retried.
    pub fn read_errors(&self) -> u64 {
        self.hub.read_errors.load(Ordering::Relaxed)
    }

    /// Drains that found their cache lapped by the reader (spec.md#M6).
    pub fn laps(&self) -> u64 {
        self.hub.laps.load(Ordering::Relaxed)
    }

    /// Caches attached to the process's monitor now.
    pub fn attached(&self) -> usize {
        lock(&self.hub.members).len()
    }
}

/// Spawns a monitor thread that never returns.
fn spawn(name: &str, body: impl FnOnce() -> std::convert::Infallible + Send + 'static) -> Result<(), UffdError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let _never = body();
        })
        .map(drop)
        .map_err(|e| UffdError::Thread { errno: e.raw_os_error().unwrap_or(libc::EAGAIN) })
}

impl Drop for MonitorThread {
    fn drop(&mut self) {
        if std::process::id() != self.pid {
            // In a fork child the threads do not exist and the hub's state
            // is the parent's copy: touch nothing (leaked).
            return;
        }
        // SAFETY: taken once, here; not used after.
        let member = unsafe { ManuallyDrop::take(&mut self.member) };
        // SAFETY: as above.
        let slot = unsafe { ManuallyDrop::take(&mut self.slot) };
        // SAFETY: as above.
        let hub = unsafe { ManuallyDrop::take(&mut self.hub) };
        //= spec.md#S7.6
        //# A cache that detaches while it lives takes every entry out of
        //# its lookup (as a flush: unleased ones are deregistered, leased ones at
        //# their last release) and caches nothing from then on
        // Flushed while events still reach it (it is still a member), and
        // with nothing cached after: no entry outlives its monitor.
        member.stop_caching();
        let idle = {
            let mut process = PROCESS.lock();
            lock(&hub.members).retain(|s| !Arc::ptr_eq(s, &slot));
            let ours = !process.taken_over();
            match process.as_mut().filter(|r| ours && Arc::ptr_eq(&r.hub, &hub)) {
                Some(running) => {
                    running.attached -= 1;
                    if running.attached == 0 {
                        running.service.take()
                    } else {
                        None
                    }
                }
                None => None,
            }
        };
        // Waits for a round of the service thread on this cache (its
        // callbacks included) to end; later rounds no longer see it.
        let taken = lock(&slot.member).take();
        // Outside every lock: this may be the last handle of the cache.
        drop(taken);
        drop(member);
        drop(slot);
        if let Some(service) = idle {
            service.stop(&hub);
        }
        drop(hub);
    }
}

thread_local! {
    /// Set on the service thread, for [`on_service_thread`].
    static ON_SERVICE_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread is the monitor's service thread
/// (`mrcache-svc`), which runs deregistrations outside any library call
/// of the application's: a registrar adapter must not let a callback end
/// that thread (the C API's trampolines swallow a `pthread_exit` there).
pub fn on_service_thread() -> bool {
    ON_SERVICE_THREAD.try_with(|on| on.get()).unwrap_or(false)
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
        let p = unsafe { libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, f.as_raw_fd(), 0) };
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
