//! Proof that a madvise has returned (spec.md#S7.5, the OS half of M4).
//!
//! userfaultfd queues REMOVE *before* the kernel drops the pages and does not
//! say which thread raised it. The thread that did is blocked until the event
//! is read, so after the read it is either still inside madvise (zapping) or
//! has returned. This module decides, without any cache lock, when every
//! thread that might still be inside has left:
//!
//! - [`threads`] and [`look`] list `/proc/self/task` and read each thread's `syscall`
//!   file. A thread blocked in another system call is not inside the
//!   madvise ([`Seen::Elsewhere`]); a running one, or one blocked in an
//!   overlapping madvise or in process_madvise, might be ([`Seen::Inside`]).
//!   An io_uring worker's `syscall` file says nothing of what it runs, so a
//!   worker (its `stat` flags say which) is judged by its `wchan` instead:
//!   idle, or not yet proven out ([`Seen::WorkerBusy`], never signalled).
//! - [`Signal`] sends such a thread the proof signal with a fresh token. The
//!   handler runs only on a return to user mode, after the signal was sent,
//!   so once it has stored the token ([`Signal::acknowledged`]) the thread
//!   is out of the kernel call it was in.
//!
//! Invariants: the handler is async-signal-safe (one atomic store, one
//! raw `write` system call, no cancellation point, to an eventfd that is
//! never closed, errno saved and restored); a
//! token is never reused while its signal may still be pending, so a late
//! handler cannot acknowledge a newer send; the handler is installed once
//! per process and never replaces one the application installed.
//!
//! Every `unsafe` here is an FFI call on plain data (SAFETY comments at each).

use crate::fork_safe::{ProcessGuard, ProcessLock};
use mrcache_types::Range;
use std::fs;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

/// Acknowledgement slots: a token's low bits name its slot.
const SLOTS: usize = 1024;
const SLOT_BITS: u32 = 10;

/// `ACKS[slot]` holds the last token whose handler ran.
static ACKS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
/// An eventfd the handler writes to, so the monitor thread wakes at once.
/// Created with the handler and never closed (a late handler must never
/// write to a reused descriptor).
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
/// The installed signal, or why none is, with the process that installed
/// it. A [`ProcessLock`], not a `OnceLock`: a fork child whose parent was
/// installing it must not wait forever (spec.md#S7.6, *Fork*).
static INSTALLED: ProcessLock<Option<(u32, Result<Signal, InstallError>)>> = ProcessLock::new(None);
/// Slots whose signal may still be pending, and the token sequence, for the
/// process `pid` (a fork child starts with no signal pending: it resets
/// `busy` and keeps `seq`, so no token of its own equals one its parent
/// sent, which `ACKS` may hold).
static SLOT_STATE: ProcessLock<SlotState> = ProcessLock::new(SlotState { pid: 0, busy: [false; SLOTS], next: 0, seq: 0 });

struct SlotState {
    pid: u32,
    busy: [bool; SLOTS],
    next: usize,
    seq: u64,
}

/// The slot state of this process.
fn slot_state() -> ProcessGuard<'static, SlotState> {
    let mut s = SLOT_STATE.lock();
    let me = std::process::id();
    if s.pid != me {
        s.pid = me;
        s.busy = [false; SLOTS];
    }
    s
}

/// Why the proof signal was not installed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstallError {
    /// `MRCACHE_PROOF_SIGNAL` is not a real-time signal number (the number, or -1 if unparsable).
    NotRealtime(i32),
    /// The application already handles or ignores this signal.
    Taken(i32),
    /// sigaction or eventfd failed (errno).
    Os(i32),
}

/// The environment variable that chooses the proof signal's number.
pub const SIGNAL_ENV: &str = "MRCACHE_PROOF_SIGNAL";

extern "C" fn on_proof_signal(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: errno is thread-local; saved and restored around the write.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler;
    // our sender put the token in si_value (rt_tgsigqueueinfo).
    let token = unsafe { (*info).si_value().sival_ptr } as u64;
    if token != 0 {
        // Release: the monitor's Acquire load of the token then knows this
        // thread was back in user mode after the send.
        ACKS[(token as usize) & (SLOTS - 1)].store(token, Ordering::Release);
        let fd = WAKE_FD.load(Ordering::Relaxed);
        if fd >= 0 {
            add_one(fd);
        }
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Adds 1 to the eventfd `fd` (never closed). A raw `write` system call,
/// not libc's `write`: that one is a cancellation point, and this runs on
/// application threads (in the proof signal's handler, on whatever thread
/// was signalled). A cancel pending there would unwind out of the signal
/// handler and through the interrupted code, which may be the library's
/// own Rust frames, or hold a lock.
fn add_one(fd: i32) {
    let one: u64 = 1;
    // SAFETY: write(2) of 8 bytes from a local to our non-blocking eventfd;
    // a raw system call is async-signal-safe and no cancellation point.
    unsafe { libc::syscall(libc::SYS_write, fd, (&one as *const u64).cast::<libc::c_void>(), 8usize) };
}

/// The process's proof signal, installed once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signal {
    pub number: i32,
}

/// A sent signal awaiting its acknowledgement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sent {
    token: u64,
}

/// What [`Signal::send`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOutcome {
    Sent(Sent),
    /// The thread has exited.
    Gone,
    /// No slot free, or the kernel's signal queue is full: try again later.
    Later,
}

impl Signal {
    /// The signal number [`Signal::install`] uses: `MRCACHE_PROOF_SIGNAL`, or
    /// `SIGRTMAX - 2`.
    pub fn configured_number() -> Result<i32, InstallError> {
        let default = libc::SIGRTMAX() - 2;
        match std::env::var(SIGNAL_ENV) {
            Err(_) => Ok(default),
            Ok(v) => {
                let n: i32 = v.trim().parse().map_err(|_| InstallError::NotRealtime(-1))?;
                if n < libc::SIGRTMIN() || n > libc::SIGRTMAX() {
                    return Err(InstallError::NotRealtime(n));
                }
                Ok(n)
            }
        }
    }

    /// Installs the handler for the configured number, once per process.
    /// Refuses a number that already has a handler or is ignored (the
    /// application owns it), naming it.
    pub fn install() -> Result<Signal, InstallError> {
        let me = std::process::id();
        let mut installed = INSTALLED.lock();
        if installed.taken_over() {
            // The parent's thread was inside this at the fork: install again
            // (`install_number` accepts our own handler).
            // SAFETY: a valid place; `write` neither reads nor drops it.
            unsafe { std::ptr::write(&mut *installed, None) };
        }
        let result = match *installed {
            Some((pid, result)) if pid == me => return result,
            // A fork child: the handler is inherited, but the eventfd is
            // shared with the parent, whose monitor would take the child's
            // wakes. The child gets its own.
            Some((_, Ok(signal))) => new_wake_fd().map(|()| signal),
            Some((_, Err(e))) => Err(e),
            None => Self::configured_number().and_then(Self::install_number),
        };
        *installed = Some((me, result));
        result
    }

    fn install_number(number: i32) -> Result<Signal, InstallError> {
        // SAFETY: sigaction with a null new action only reads the old one.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: `old` is a valid out-pointer.
        if unsafe { libc::sigaction(number, std::ptr::null(), &mut old) } != 0 {
            return Err(InstallError::Os(errno()));
        }
        let ours = on_proof_signal as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as usize;
        if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != ours {
            return Err(InstallError::Taken(number));
        }
        new_wake_fd()?;
        // SAFETY: zeroed sigaction is a valid starting value.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = on_proof_signal as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_ONSTACK;
        // SAFETY: sa_mask is a valid sigset to empty.
        unsafe { libc::sigemptyset(&mut act.sa_mask) };
        // SAFETY: a valid action for a real-time signal nobody else handles.
        if unsafe { libc::sigaction(number, &act, std::ptr::null_mut()) } != 0 {
            return Err(InstallError::Os(errno()));
        }
        Ok(Signal { number })
    }

    /// The eventfd the handler writes to (readable after an acknowledgement).
    pub fn wake_fd(&self) -> i32 {
        WAKE_FD.load(Ordering::Relaxed)
    }

    /// Makes the wake eventfd readable (the monitor thread's poll returns).
    /// No cancellation point (`add_one`): safe to call on any thread.
    pub fn wake(&self) {
        add_one(self.wake_fd());
    }

    /// Waits until the wake eventfd is readable (a wake or an
    /// acknowledgement), for at most `timeout_ms` (-1: no limit), or until a
    /// signal interrupts the wait.
    pub fn wait_wake(&self, timeout_ms: i32) {
        let mut pfd = libc::pollfd { fd: self.wake_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, nfds = 1.
        unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    }

    /// Empties the wake eventfd (non-blocking).
    pub fn clear_wake(&self) {
        let mut buf = 0u64;
        // SAFETY: reads 8 bytes into `buf` from our non-blocking eventfd.
        unsafe { libc::read(self.wake_fd(), (&mut buf as *mut u64).cast(), 8) };
    }

    /// Sends the proof signal to thread `tid` of this process with a fresh
    /// token.
    pub fn send(&self, tid: i32) -> SendOutcome {
        let token = {
            let mut s = slot_state();
            // Bounded: one turn per slot.
            let Some(slot) = (0..SLOTS).map(|k| (s.next + k) % SLOTS).find(|&k| !s.busy[k]) else {
                return SendOutcome::Later;
            };
            s.busy[slot] = true;
            s.next = (slot + 1) % SLOTS;
            s.seq += 1;
            (s.seq << SLOT_BITS) | slot as u64
        };
        // SAFETY: siginfo_t zeroed, then the fields rt_tgsigqueueinfo reads.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        info.si_signo = self.number;
        info.si_code = libc::SI_QUEUE;
        // si_value sits after si_pid and si_uid in the _rt member (x86-64
        // and aarch64: offset 24 from the start of siginfo_t).
        // SAFETY: writes a pointer-sized value inside the 128-byte siginfo_t.
        unsafe {
            let base = (&mut info as *mut libc::siginfo_t).cast::<u8>();
            *(base.add(16) as *mut i32) = std::process::id() as i32;
            *(base.add(20) as *mut u32) = libc::getuid();
            *(base.add(24) as *mut u64) = token;
        }
        // SAFETY: plain syscall on our own process and a thread id.
        let r = unsafe { libc::syscall(libc::SYS_rt_tgsigqueueinfo, std::process::id() as libc::pid_t, tid, self.number, &info) };
        if r == 0 {
            return SendOutcome::Sent(Sent { token });
        }
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        release_slot(token);
        if errno == libc::ESRCH {
            SendOutcome::Gone
        } else {
            SendOutcome::Later
        }
    }

    /// Whether the handler ran for `sent`. An acknowledged send frees its slot.
    pub fn acknowledged(&self, sent: Sent) -> bool {
        // Acquire: pairs with the handler's Release store.
        let done = ACKS[(sent.token as usize) & (SLOTS - 1)].load(Ordering::Acquire) == sent.token;
        if done {
            release_slot(sent.token);
        }
        done
    }

    /// Gives up waiting for `sent` because the thread exited: its signal can
    /// never be delivered, so its slot is free again. (A thread seen blocked
    /// elsewhere keeps its slot until it acknowledges: the signal is still
    /// pending for it.)
    pub fn forget_exited(&self, sent: Sent) {
        release_slot(sent.token);
    }
}

/// Proof signals sent and not yet acknowledged nor forgotten (their
/// threads exited): the prover keeps at most one per thread.
pub fn signals_outstanding() -> usize {
    slot_state().busy.iter().filter(|&&b| b).count()
}

/// Creates the eventfd the handler writes to and publishes it. The one it
/// replaces (a fork child's copy of its parent's) is left open: a late
/// handler must never write to a reused descriptor.
fn new_wake_fd() -> Result<(), InstallError> {
    // SAFETY: eventfd(2) with plain flags.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(InstallError::Os(errno()));
    }
    WAKE_FD.store(fd, Ordering::Relaxed);
    Ok(())
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL)
}

fn release_slot(token: u64) {
    let mut s = slot_state();
    s.busy[(token as usize) & (SLOTS - 1)] = false;
}

/// Where a thread was when its files were read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Running, or blocked in an overlapping madvise or in process_madvise:
    /// it may be inside the madvise that raised the event. The proof signal
    /// can show that it left.
    Inside,
    /// An io_uring worker (`PF_IO_WORKER`) not seen idle: it may be running
    /// a request, `IORING_OP_MADVISE` among them. It never returns to user
    /// mode, so it never runs the signal handler (the kernel keeps the
    /// signal pending on it forever), and its `syscall` file shows the call
    /// that created it, not what it runs: it is looked at again until it is
    /// seen idle or has exited.
    WorkerBusy,
    /// Blocked elsewhere (another system call, a madvise on other pages, or
    /// no system call): not inside that madvise.
    Elsewhere,
    /// The thread has exited.
    Exited,
    /// The file could not be read: nothing is known.
    Unknown,
}

/// `PF_IO_WORKER` in the flags of `/proc/<tid>/stat` (include/linux/sched.h):
/// an io_uring worker or SQPOLL thread of the process.
const PF_IO_WORKER: u64 = 0x10;

/// Reads one file of thread `tid`: its text, or how the read failed.
#[cfg(test)]
fn read_task_file(tid: i32, name: &str) -> Result<String, Seen> {
    read_from_start(&fs::File::open(format!("/proc/self/task/{tid}/{name}")).map_err(seen_of)?)
}

/// What one look at a thread's files found, before it is judged against a
/// window's range ([`Observation::against`]). One observation serves every
/// window whose event was read before it was made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observation {
    /// A thread's `syscall` file.
    Syscall(String),
    /// An io_uring worker's verdict ([`classify_worker`]), or the thread's
    /// exit, or an unreadable file: the same for every range.
    Settled(Seen),
}

impl Observation {
    /// Where the observed thread was, against `range`.
    pub fn against(&self, range: Range) -> Seen {
        match self {
            Observation::Syscall(text) => classify(text, range),
            Observation::Settled(seen) => *seen,
        }
    }
}

/// Looks at thread `tid`: an io_uring worker by where it waits
/// ([`classify_worker`]), any other thread by its `syscall` file
/// ([`classify`], once a range is known).
pub fn observe(tid: i32) -> Observation {
    match TaskFile::open(tid) {
        Ok(file) => file.observe(),
        Err(seen) => Observation::Settled(seen),
    }
}

/// The one `/proc` file that tells where a thread is: `wchan` for an
/// io_uring worker, `syscall` for any other thread. Opened through the
/// thread's directory, so the `stat` that says which and the file itself
/// belong to the same thread even if its id is reused; and a thread that
/// exits makes every later read fail (ESRCH), whatever reuses its id.
pub struct TaskFile {
    worker: bool,
    file: fs::File,
}

impl TaskFile {
    /// Opens thread `tid`'s file; `Err(Exited)` if it is gone.
    pub fn open(tid: i32) -> Result<TaskFile, Seen> {
        use std::os::fd::{FromRawFd, OwnedFd};
        let dir = std::ffi::CString::new(format!("/proc/self/task/{tid}")).expect("no NUL");
        // SAFETY: a NUL-terminated path; the descriptor is owned below.
        let fd = unsafe { libc::open(dir.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(seen_of(std::io::Error::last_os_error()));
        }
        // SAFETY: a fresh descriptor, ours alone.
        let dir = unsafe { OwnedFd::from_raw_fd(fd) };
        let open_in = |name: &std::ffi::CStr| -> Result<fs::File, Seen> {
            use std::os::fd::AsRawFd;
            // SAFETY: a directory descriptor we own and a NUL-terminated name.
            let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
            if fd < 0 {
                return Err(seen_of(std::io::Error::last_os_error()));
            }
            // SAFETY: a fresh descriptor, ours alone.
            Ok(unsafe { fs::File::from_raw_fd(fd) })
        };
        let stat = read_from_start(&open_in(c"stat")?)?;
        let worker = stat_flags(&stat).ok_or(Seen::Unknown)? & PF_IO_WORKER != 0;
        let file = open_in(if worker { c"wchan" } else { c"syscall" })?;
        Ok(TaskFile { worker, file })
    }

    /// Another handle on the same thread's file (a `dup`).
    fn try_clone(&self) -> Option<TaskFile> {
        Some(TaskFile { worker: self.worker, file: self.file.try_clone().ok()? })
    }

    /// Reads the file again: where the thread is now.
    pub fn observe(&self) -> Observation {
        match read_from_start(&self.file) {
            Ok(text) if self.worker => Observation::Settled(classify_worker(&text)),
            Ok(text) => Observation::Syscall(text),
            Err(seen) => Observation::Settled(seen),
        }
    }
}

/// A `/proc` file's text, read from its start (a new snapshot each time).
fn read_from_start(file: &fs::File) -> Result<String, Seen> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 512];
    let mut len = 0;
    // Bounded: the buffer fills in at most 512 reads.
    while len < buf.len() {
        match file.read_at(&mut buf[len..], len as u64) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) => return Err(seen_of(e)),
        }
    }
    Ok(String::from_utf8_lossy(&buf[..len]).into_owned())
}

fn seen_of(e: std::io::Error) -> Seen {
    match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ESRCH) => Seen::Exited,
        _ => Seen::Unknown,
    }
}

/// Threads' `/proc` files kept open between the prover's passes: a look
/// at a known thread is one read, not three opens and two reads. At most
/// [`KEPT_FILES`] are kept (the process's own descriptors come first);
/// threads beyond them are looked at through fresh opens.
#[derive(Default)]
pub struct TaskFiles {
    known: std::collections::HashMap<i32, TaskFile>,
}

/// Descriptors [`TaskFiles`] keeps open at most.
pub const KEPT_FILES: usize = 64;

impl TaskFiles {
    /// As [`observe`], through a kept file if `tid` has one.
    pub fn observe(&mut self, tid: i32) -> Observation {
        if let Some(file) = self.known.get(&tid) {
            let seen = file.observe();
            if seen == Observation::Settled(Seen::Exited) {
                self.known.remove(&tid); // its id may be reused: never read through it again
            }
            return seen;
        }
        match TaskFile::open(tid) {
            Ok(file) => {
                let seen = file.observe();
                if self.known.len() < KEPT_FILES && seen != Observation::Settled(Seen::Exited) {
                    self.known.insert(tid, file);
                }
                seen
            }
            Err(seen) => Observation::Settled(seen),
        }
    }

    /// A handle on thread `tid`'s file: a copy of the kept one (its id may
    /// have been reused since it was kept, but then the copy, like the
    /// kept file, reads the old thread's exit), or a fresh open.
    pub fn handle(&self, tid: i32) -> Option<TaskFile> {
        match self.known.get(&tid) {
            Some(file) => file.try_clone(),
            None => TaskFile::open(tid).ok(),
        }
    }

    /// Closes the files of threads not in `listed` (a full listing of the
    /// process's threads): they exited.
    pub fn keep_only(&mut self, listed: &[i32]) {
        self.known.retain(|tid, _| listed.contains(tid));
    }

    /// Files kept open now.
    pub fn kept(&self) -> usize {
        self.known.len()
    }
}

/// Where thread `tid` is, against `range` ([`observe`]).
pub fn look(tid: i32, range: Range) -> Seen {
    observe(tid).against(range)
}

/// The `flags` field (the ninth) of a `stat` file (proc(5)). The command
/// name (second field) is in parentheses and may hold spaces and
/// parentheses, so the fields are counted from the last `)`.
pub fn stat_flags(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // state ppid pgrp session tty_nr tpgid flags
    after_comm.split_whitespace().nth(6)?.parse().ok()
}

/// Classifies an io_uring worker by its `wchan` file: the function it
/// sleeps in, or `0` while it runs or is runnable. A worker sleeping in its
/// idle loop (`io_wq_worker`, or `io_sq_thread` for the SQPOLL thread: a
/// sleep inside a request shows that request's function) is between
/// requests, so it is not inside any madvise it ran for the process.
pub fn classify_worker(wchan: &str) -> Seen {
    match wchan.trim() {
        "io_wq_worker" | "io_sq_thread" => Seen::Elsewhere,
        _ => Seen::WorkerBusy,
    }
}

/// Classifies the text of a `syscall` file (proc(5)): `running`, or the
/// system call number and six arguments in hex (then sp and pc), or `-1`
/// and sp, pc when blocked outside a system call.
pub fn classify(text: &str, range: Range) -> Seen {
    let mut words = text.split_whitespace();
    let Some(first) = words.next() else { return Seen::Unknown };
    if first == "running" {
        return Seen::Inside;
    }
    let Ok(nr) = first.parse::<i64>() else { return Seen::Unknown };
    let arg = |w: Option<&str>| w.and_then(|w| u64::from_str_radix(w.trim_start_matches("0x"), 16).ok());
    if nr == libc::SYS_process_madvise {
        return Seen::Inside;
    }
    if nr != libc::SYS_madvise {
        return Seen::Elsewhere;
    }
    match (arg(words.next()), arg(words.next())) {
        (Some(addr), Some(len)) => {
            let end = addr.saturating_add(len);
            if addr < range.addr.saturating_add(range.len) && range.addr < end {
                Seen::Inside
            } else {
                Seen::Elsewhere
            }
        }
        _ => Seen::Unknown,
    }
}

/// Listings of `/proc/self/task` [`threads`] reads at most before it gives
/// up (`None`): each retry needs a thread to exit or start during the one
/// before.
const LISTING_ATTEMPTS: usize = 16;

/// The threads of this process other than `except`, or `None` if the list
/// cannot be read (or did not hold still for `LISTING_ATTEMPTS` reads).
///
/// The kernel has no atomic listing of a thread group, and one read of
/// `/proc/self/task` can miss a live thread: when the thread its readdir
/// stands on exits, that `getdents` ends, and the next one resumes by
/// *position* in a list that lost a member, stepping over one thread
/// (`proc_task_readdir`, `first_tid`, `next_tid` in fs/proc/base.c). Here
/// one read missed a live thread in about 1 listing of 200 while others
/// exited (`a_live_thread_is_listed_while_others_exit`).
///
/// So a listing counts only when two reads in a row list the same threads
/// and the group's thread count (`Threads:` in /proc/self/status, which the
/// kernel changes under the same lock as the list) is that many before the
/// first read and after the second. A miss then needs exits at the
/// readdir's position in both reads, balanced by as many thread starts,
/// all within the two reads: the test above saw none in 540,000 listings,
/// where two equal reads alone missed once in 180,000.
pub fn threads(except: i32) -> Option<Vec<i32>> {
    for _ in 0..LISTING_ATTEMPTS {
        let before = thread_count()?;
        let first = list_tasks()?;
        let second = list_tasks()?;
        if first == second && first.len() == before && thread_count()? == before {
            let mut out = first;
            out.retain(|&tid| tid != except);
            return Some(out);
        }
    }
    None
}

/// One read of `/proc/self/task`, sorted (it may have missed a thread: see
/// [`threads`]).
fn list_tasks() -> Option<Vec<i32>> {
    let dir = fs::read_dir("/proc/self/task").ok()?;
    let mut out = Vec::new();
    for e in dir {
        out.push(e.ok()?.file_name().to_str()?.parse().ok()?);
    }
    out.sort_unstable();
    Some(out)
}

/// The number of threads in this process (`Threads:` of /proc/self/status).
fn thread_count() -> Option<usize> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|l| l.strip_prefix("Threads:"))?.trim().parse().ok()
}

/// This thread's id.
pub fn gettid() -> i32 {
    // SAFETY: gettid(2) has no arguments and cannot fail.
    unsafe { libc::gettid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(addr: u64, len: u64) -> Range {
        Range { addr, len }
    }

    /// A thread parked in a channel receive (a futex wait) until
    /// [`Parked::finish`], with its tid, known once [`Parked::spawn`]
    /// returns.
    struct Parked {
        tid: i32,
        wake: std::sync::mpsc::Sender<()>,
        handle: std::thread::JoinHandle<()>,
    }

    impl Parked {
        fn spawn() -> Parked {
            let (wake, rx) = std::sync::mpsc::channel::<()>();
            let (ready_tx, ready_rx) = std::sync::mpsc::channel::<i32>();
            let handle = std::thread::spawn(move || {
                ready_tx.send(gettid()).unwrap();
                let _ = rx.recv(); // SA_RESTART: a signal restarts the futex wait
            });
            Parked { tid: ready_rx.recv().unwrap(), wake, handle }
        }

        /// Wakes the thread and joins it (joined, not yet reaped: see
        /// `wait_reaped`).
        fn finish(self) {
            self.wake.send(()).unwrap();
            self.handle.join().unwrap();
        }
    }

    #[test]
    fn syscall_lines_are_classified() {
        let range = r(0x7000, 0x2000);
        assert_eq!(classify("running\n", range), Seen::Inside);
        // madvise(0x6000, 0x2000, DONTNEED): overlaps [0x7000, 0x9000).
        assert_eq!(classify("28 0x6000 0x2000 0x4 0x0 0x0 0x0 0x7ffd 0x7f00\n", range), Seen::Inside);
        // madvise on other pages.
        assert_eq!(classify("28 0x9000 0x1000 0x4 0x0 0x0 0x0 0x7ffd 0x7f00\n", range), Seen::Elsewhere);
        // futex, poll: elsewhere.
        assert_eq!(classify("202 0x7f0 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f00\n", range), Seen::Elsewhere);
        assert_eq!(classify("-1 0x7ffd 0x7f00\n", range), Seen::Elsewhere);
        assert_eq!(classify(&format!("{} 0x3 0x0 0x1 0x4 0x0 0x0 0x1 0x2\n", libc::SYS_process_madvise), range), Seen::Inside);
        assert_eq!(classify("", range), Seen::Unknown);
        assert_eq!(classify("28 zz", range), Seen::Unknown);
    }

    #[test]
    fn stat_flags_and_worker_waits_are_read() {
        // The name may hold spaces and parentheses: fields count from the last ')'.
        let stat = "4242 (iou-wrk-) 4) S 1 4240 4240 0 -1 4194384 0 0 0 0 1 2 0 0 20 0 1 0\n";
        assert_eq!(stat_flags(stat), Some(4194384));
        assert_ne!(stat_flags(stat).unwrap() & PF_IO_WORKER, 0);
        assert_eq!(stat_flags("4242 (a b) R 1 2 3 0 -1 4194560 0\n").map(|f| f & PF_IO_WORKER), Some(0));
        assert_eq!(stat_flags("4242 (cut"), None);
        assert_eq!(stat_flags("4242 (x) R 1 2"), None);
        // Idle between requests, or anything else (running: 0; inside a
        // request: that request's function).
        assert_eq!(classify_worker("io_wq_worker"), Seen::Elsewhere);
        assert_eq!(classify_worker("io_sq_thread\n"), Seen::Elsewhere);
        assert_eq!(classify_worker("0"), Seen::WorkerBusy);
        assert_eq!(classify_worker("wait_for_partner"), Seen::WorkerBusy);
        assert_eq!(classify_worker(""), Seen::WorkerBusy);
    }

    /// A thread whose name the kernel cut inside a UTF-8 character (its
    /// `stat` is then not valid UTF-8) is still looked at: with a strict
    /// read it was `Unknown` forever, and every window stayed open.
    #[test]
    fn a_thread_name_cut_mid_character_is_read() {
        let (tx, rx) = std::sync::mpsc::channel::<i32>();
        let (wake, parked) = std::sync::mpsc::channel::<()>();
        let h = std::thread::Builder::new()
            .name("wörker-ééééééé-x".into())
            .spawn(move || {
                tx.send(gettid()).unwrap();
                let _ = parked.recv();
            })
            .unwrap();
        let tid = rx.recv().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while look(tid, r(0, 4096)) != Seen::Elsewhere {
            assert_ne!(look(tid, r(0, 4096)), Seen::Unknown, "the stat of a thread with a cut name was not read");
            assert!(std::time::Instant::now() < deadline, "the parked thread was never seen blocked");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        wake.send(()).unwrap();
        h.join().unwrap();
    }

    /// A kept file reads where the thread is now; once the thread exits
    /// it says so (never another thread's state, whatever reuses the id),
    /// and the file is closed; at most `KEPT_FILES` are kept.
    #[test]
    fn kept_files_follow_their_thread_and_close_on_exit() {
        let mut files = TaskFiles::default();
        let parked = Parked::spawn();
        let tid = parked.tid;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while files.observe(tid).against(r(0, 4096)) != Seen::Elsewhere {
            assert!(std::time::Instant::now() < deadline, "the parked thread was never seen blocked");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(files.kept(), 1);
        parked.finish();
        wait_reaped(tid);
        assert_eq!(files.observe(tid), Observation::Settled(Seen::Exited));
        assert_eq!(files.kept(), 0, "an exited thread's file is closed");
        // Listed threads only; a bounded number.
        let me = gettid();
        let parked: Vec<Parked> = (0..KEPT_FILES + 4).map(|_| Parked::spawn()).collect();
        for p in &parked {
            let _ = files.observe(p.tid);
        }
        assert_eq!(files.kept(), KEPT_FILES);
        files.keep_only(&threads(me).unwrap()[..1]);
        assert!(files.kept() <= 1);
        parked.into_iter().for_each(Parked::finish);
    }

    /// An io_uring worker blocked inside a request (an `openat` of a FIFO
    /// no one writes) is not proven out of a madvise, whatever its
    /// `syscall` file says (the call that created it); idle again, it is.
    #[test]
    fn an_io_uring_worker_is_seen_busy_inside_a_request_and_elsewhere_when_idle() {
        use io_uring::{opcode, types, IoUring};
        use std::ffi::CString;
        let dir = std::env::temp_dir().join(format!("mrcache-fifo-{}", std::process::id()));
        let _ = fs::remove_file(&dir);
        let path = CString::new(dir.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
        let before: Vec<i32> = list_tasks().unwrap();
        let mut ring = IoUring::new(4).unwrap();
        let open = opcode::OpenAt::new(types::Fd(libc::AT_FDCWD), path.as_ptr())
            .flags(libc::O_RDONLY)
            .build()
            .flags(io_uring::squeue::Flags::ASYNC) // to a worker, which blocks (inline, it would open non-blocking)
            .user_data(7);
        // SAFETY: `path` outlives the request (we wait for its completion below).
        unsafe { ring.submission().push(&open).unwrap() };
        ring.submit().unwrap();
        let is_worker = |tid: i32| read_task_file(tid, "stat").ok().and_then(|s| stat_flags(&s)).is_some_and(|f| f & PF_IO_WORKER != 0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let worker = loop {
            let found = list_tasks().unwrap().into_iter().find(|t| !before.contains(t) && is_worker(*t));
            if let Some(tid) = found {
                if read_task_file(tid, "wchan").is_ok_and(|w| !matches!(w.trim(), "0" | "io_wq_worker")) {
                    break tid; // asleep inside the open
                }
            }
            assert!(std::time::Instant::now() < deadline, "no io_uring worker blocked in the open");
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        // Its syscall file is not a madvise: read as a plain thread's, it
        // would be `Elsewhere`.
        let syscall = read_task_file(worker, "syscall").unwrap();
        assert_eq!(classify(&syscall, r(0, u64::MAX / 2)), Seen::Elsewhere, "{syscall}");
        assert_eq!(look(worker, r(0, u64::MAX / 2)), Seen::WorkerBusy);
        // A writer lets the open finish; the worker goes back to waiting for work.
        let writer = fs::OpenOptions::new().write(true).open(&dir).unwrap();
        ring.submit_and_wait(1).unwrap();
        let cqe = ring.completion().next().unwrap();
        assert!(cqe.result() >= 0, "openat: {}", cqe.result());
        // SAFETY: the descriptor the open returned, ours to close.
        unsafe { libc::close(cqe.result()) };
        drop(writer);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !matches!(look(worker, r(0, u64::MAX / 2)), Seen::Elsewhere | Seen::Exited) {
            assert!(std::time::Instant::now() < deadline, "the worker was never seen idle");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let _ = fs::remove_file(&dir);
    }

    #[test]
    fn threads_are_listed_and_seen_blocked_or_exited() {
        let me = gettid();
        // A thread reading its own file sees itself in that read.
        assert_eq!(look(me, r(0, 4096)), Seen::Elsewhere);
        let parked = Parked::spawn();
        let other = parked.tid;
        assert!(threads(me).unwrap().contains(&other));
        assert!(!threads(me).unwrap().contains(&me));
        // Blocked in a futex (recv): elsewhere, once it sleeps.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while look(other, r(0, 4096)) != Seen::Elsewhere && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(look(other, r(0, 4096)), Seen::Elsewhere);
        parked.finish();
        wait_reaped(other);
    }

    /// A live thread is listed every time while threads listed before it
    /// exit around the listing. With one read of /proc/self/task per
    /// listing, it was missing from 1 to 16 of the 3,000 listings in each of
    /// 5 runs here (see `threads`).
    #[test]
    fn a_live_thread_is_listed_while_others_exit() {
        let me = gettid();
        let (mut misses, mut unsettled, mut listings) = (0, 0, 0);
        for round in 0..300u64 {
            // Threads created before the live one come before it in the
            // kernel's list; they exit at staggered times during the reads.
            let exiting: Vec<_> = (0..8u64)
                .map(|i| std::thread::spawn(move || std::thread::sleep(std::time::Duration::from_micros((i * 7 + round) % 50))))
                .collect();
            let live = Parked::spawn();
            let live_tid = live.tid;
            for _ in 0..10 {
                listings += 1;
                match threads(me) {
                    Some(tids) => misses += usize::from(!tids.contains(&live_tid)),
                    None => unsettled += 1,
                }
            }
            exiting.into_iter().for_each(|t| t.join().unwrap());
            live.finish();
        }
        assert_eq!(misses, 0, "a live thread was missing from {misses} of {listings} listings");
        // Exits under a listing make it read again; it must settle, mostly.
        assert!(unsettled * 2 < listings, "{unsettled} of {listings} listings never held still");
    }

    /// Waits (5 s at most) until the kernel has reaped thread `tid`, then
    /// returns: `look` says `Exited` from then on. A join returns when the
    /// kernel clears the thread's tid word (CLONE_CHILD_CLEARTID, early in
    /// its exit), before it unhashes the task, so right after a join
    /// `/proc/self/task/<tid>` can still exist and a signal to it can still
    /// be sent. process.rs copes by looking again; these tests wait.
    fn wait_reaped(tid: i32) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while look(tid, r(0, 4096)) != Seen::Exited {
            assert!(std::time::Instant::now() < deadline, "thread {tid} was joined but not reaped in 5 s");
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_signalled_thread_acknowledges_and_an_exited_one_is_gone() {
        let sig = Signal::install().expect("the proof signal installs");
        let parked = Parked::spawn();
        let tid = parked.tid;
        let SendOutcome::Sent(sent) = sig.send(tid) else { panic!("send failed") };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !sig.acknowledged(sent) {
            assert!(std::time::Instant::now() < deadline, "no acknowledgement");
            std::thread::yield_now();
        }
        parked.finish();
        // Once reaped (not merely joined: see `wait_reaped`), it is gone.
        wait_reaped(tid);
        assert_eq!(sig.send(tid), SendOutcome::Gone);
        // Installing again gives the same signal; a taken number is refused.
        assert_eq!(Signal::install(), Ok(sig));
        // A number with the application's handler is refused.
        extern "C" fn theirs(_: libc::c_int) {}
        let other = sig.number - 1;
        // SAFETY: a zeroed sigaction with a plain handler, on a real-time
        // signal this test owns.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = theirs as extern "C" fn(libc::c_int) as usize;
            assert_eq!(libc::sigaction(other, &act, std::ptr::null_mut()), 0);
        }
        assert_eq!(Signal::install_number(other), Err(InstallError::Taken(other)));
    }
}
