//! The session after the hello: the commands read from stdin, each run on
//! the worker thread of its case thread (one per `thread` field), the
//! commands the adapter answers itself (`continue`, `end`, `stats`,
//! `query`, `fork`), and the reply to each.
//!
//! Invariant: the commands of one case thread run in order on its worker,
//! and the reply to a command is written after its `reg`/`dereg`/`paused`
//! lines; `end`, `query`, `rss` and `fork` first wait (up to 10 s) until
//! every command in flight has replied or is paused, so a fork child starts
//! with every worker idle or paused (a paused command's thread does not
//! exist in the child, which forgets it). Above every other module of the
//! built-in adapter but its `mod.rs` (which starts the session).

use super::memory::{data_op, memory_op};
use super::protocol::{arm_during, disarm_during, emit, get_u64, os_err, reply, resume, rss_bytes, Backend, OpResult, CURRENT, PAUSED};
use super::registrar::{live_now, LEASE_REGS, LIVE, PINS};
use mrcache_types::Access;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::time::Duration;

/// Serves the commands after the hello until `end` or EOF. Returns the exit code.
pub(super) fn serve(lines: impl Iterator<Item = std::io::Result<String>>, backend: Arc<dyn Backend>) -> anyhow::Result<u8> {
    let inflight = Arc::new(AtomicUsize::new(0));
    let mut workers: HashMap<u64, Sender<Map<String, Value>>> = HashMap::new();
    // Idle: every command replied to or paused (a paused one does not
    // finish before its `continue`).
    let wait_idle = |inflight: &AtomicUsize| {
        for _ in 0..100_000 {
            if inflight.load(Ordering::SeqCst) <= PAUSED.load(Ordering::SeqCst) {
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
            "rss" => {
                wait_idle(&inflight);
                reply(seq, rss_bytes().map(|b| json!({"rss": b})));
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
                        // Only this thread exists here: a command paused in
                        // the parent never finishes in the child.
                        std::mem::forget(std::mem::take(&mut workers));
                        inflight.store(0, Ordering::SeqCst);
                        PAUSED.store(0, Ordering::SeqCst);
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
                            arm(&b, &c);
                            let r = execute(&*b, &c);
                            let r = match (disarm_during(), r) {
                                (Some((e, errno)), Ok(_)) => Err((format!("during_register: {e}"), errno)),
                                (_, r) => r,
                            };
                            let failed_during = matches!(&r, Err((e, _)) if e.starts_with("during_register: "));
                            track_lease(&c, &r);
                            CURRENT.with(|cur| cur.set((thread, false)));
                            if failed_during {
                                let (e, errno) = r.err().unwrap_or_default();
                                emit(&json!({"seq": seq, "ok": false, "error": e, "errno": errno, "during_register_failed": true}));
                            } else {
                                reply(seq, r);
                            }
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

/// Arms an acquire's `during_register`: its registrar performs each memory
/// operation, as the memory command of that name, once the pages are pinned.
fn arm(b: &Arc<dyn Backend>, c: &Map<String, Value>) {
    let Some(Value::Array(ops)) = c.get("during_register") else { return };
    let ops: Vec<Map<String, Value>> = ops.iter().filter_map(|o| o.as_object().cloned()).collect();
    let b = b.clone();
    arm_during(Box::new(move || {
        for o in &ops {
            let cmd = o.get("mem").and_then(Value::as_str).unwrap_or("");
            memory_op(&*b, cmd, o).map_err(|(e, n)| (format!("{cmd}: {e}"), n))?;
        }
        Ok(())
    }));
}

fn execute(b: &dyn Backend, c: &Map<String, Value>) -> OpResult {
    let cmd = c.get("cmd").and_then(Value::as_str).unwrap_or("");
    match cmd {
        "acquire" => {
            let access: Access = c.get("access").and_then(Value::as_str).unwrap_or("local_read").parse().map_err(|e: String| (e, 0))?;
            b.acquire(get_u64(c, "lease")?, get_u64(c, "addr")?, get_u64(c, "len")?, access)
        }
        "release" => b.release(get_u64(c, "lease")?),
        "flush" => b.flush(),
        "destroy" => b.destroy(),
        "create" => b.create(),
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
