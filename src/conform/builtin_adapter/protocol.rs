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
use std::cell::Cell;
use std::io::Write;
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

/// If the running command asked to pause, says so and waits for `continue`.
pub(super) fn pause_point() {
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
