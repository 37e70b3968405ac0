//! The protocol's plumbing that every backend shares: the lines the adapter
//! writes (`emit`, `reply`), the command fields it reads (`get_u64`), the
//! [`Backend`] a cache implements, and pause/continue.
//!
//! Invariant: stdout carries only whole protocol lines; every line is
//! written by `emit` under stdout's lock and flushed, so lines from worker
//! threads never interleave. This module is the bottom layer: it imports
//! nothing from the other modules of the built-in adapter.

use mrcache_types::{Access, LeaseId};
use serde_json::{json, Map, Value};
use std::cell::{Cell, RefCell};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

/// The page size the adapter declares and rounds to.
pub(super) const PAGE: u64 = 4096;

/// Error number of a reply that marks the command `unsupported`.
pub(super) const UNSUPPORTED: i32 = -2;

/// A command's reply fields, or its error message and errno.
pub(super) type OpResult = Result<Value, (String, i32)>;

/// A cache behind the adapter: mrcache ([`super::mrcache_backend`]) or the toy
/// ([`super::toy`]).
pub(super) trait Backend: Send + Sync {
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
    /// Destroys the cache (`destroy`): refused with EBUSY while leases are
    /// held, if the cache refuses then.
    fn destroy(&self) -> OpResult {
        Err(("destroy is not supported by this backend".into(), UNSUPPORTED))
    }
    /// Creates the cache anew after a `destroy` (`create`).
    fn create(&self) -> OpResult {
        Err(("create is not supported by this backend".into(), UNSUPPORTED))
    }
}

/// Writes one protocol line to stdout.
pub(super) fn emit(v: &Value) {
    let out = std::io::stdout();
    let mut o = out.lock();
    let _ = writeln!(o, "{v}");
    let _ = o.flush();
}

thread_local! {
    /// (case thread, pause armed) of the command this worker runs.
    pub(super) static CURRENT: Cell<(u64, bool)> = const { Cell::new((0, false)) };
}

static PAUSE: Mutex<Vec<u64>> = Mutex::new(Vec::new());
static PAUSE_CV: Condvar = Condvar::new();
/// Commands paused now (a fork does not wait for them: their threads do not
/// exist in the child).
pub(super) static PAUSED: AtomicUsize = AtomicUsize::new(0);

/// If the running command asked to pause, says so and waits for `continue`.
pub(super) fn pause_point() {
    let (thread, armed) = CURRENT.with(Cell::get);
    if !armed {
        return;
    }
    CURRENT.with(|c| c.set((thread, false)));
    emit(&json!({"ev": "paused", "thread": thread}));
    PAUSED.fetch_add(1, Ordering::SeqCst);
    let mut cont = PAUSE.lock().unwrap_or_else(|e| e.into_inner());
    while !cont.contains(&thread) {
        cont = PAUSE_CV.wait(cont).unwrap_or_else(|e| e.into_inner());
    }
    cont.retain(|t| *t != thread);
    drop(cont);
    PAUSED.fetch_sub(1, Ordering::SeqCst);
}

/// The memory operations the running acquire's registrar performs
/// (`during_register`), and the first error of one.
type During = Box<dyn FnOnce() -> Result<(), (String, i32)>>;

thread_local! {
    static DURING: RefCell<Option<During>> = const { RefCell::new(None) };
    static DURING_ERR: RefCell<Option<(String, i32)>> = const { RefCell::new(None) };
}

/// Arms the running acquire's `during_register` (the worker, before it).
pub(super) fn arm_during(f: During) {
    DURING.with(|d| *d.borrow_mut() = Some(f));
    DURING_ERR.with(|e| *e.borrow_mut() = None);
}

/// In the registrar, once the pages are pinned and reported: performs the
/// armed `during_register` (once per acquire: a retry's registration
/// performs nothing).
pub(super) fn during_point() {
    if let Some(f) = DURING.with(|d| d.borrow_mut().take()) {
        if let Err(e) = f() {
            DURING_ERR.with(|x| *x.borrow_mut() = Some(e));
        }
    }
}

/// After the acquire: disarms it and returns the error of an operation
/// that failed.
pub(super) fn disarm_during() -> Option<(String, i32)> {
    DURING.with(|d| d.borrow_mut().take());
    DURING_ERR.with(|e| e.borrow_mut().take())
}

/// The process's resident set in bytes (`/proc/self/statm`).
pub(super) fn rss_bytes() -> Result<u64, (String, i32)> {
    let s = std::fs::read_to_string("/proc/self/statm").map_err(|e| (format!("/proc/self/statm: {e}"), 0))?;
    let pages: u64 =
        s.split_whitespace().nth(1).and_then(|x| x.parse().ok()).ok_or_else(|| ("/proc/self/statm: no resident count".to_string(), 0))?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    Ok(pages * page)
}

/// `continue`: lets the paused command of `thread` go on.
pub(super) fn resume(thread: u64) {
    PAUSE.lock().unwrap_or_else(|e| e.into_inner()).push(thread);
    PAUSE_CV.notify_all();
}

/// Writes the reply to command `seq`.
pub(super) fn reply(seq: u64, r: OpResult) {
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

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The last OS error as a reply error, prefixed by `what`.
pub(super) fn os_err(what: &str) -> (String, i32) {
    (format!("{what}: {}", std::io::Error::last_os_error()), errno())
}

/// A command's unsigned field: a JSON number or a decimal or `0x` string.
pub(super) fn get_u64(c: &Map<String, Value>, k: &str) -> Result<u64, (String, i32)> {
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
