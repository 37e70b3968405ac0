//! The adapter process the runner starts (not an adapter itself: that is
//! [`super::builtin_adapter`]): one per case, started by `sh -c` in a process
//! group of its own so that [`AdapterProcess::kill`] also reaches whatever it
//! started.
//!
//! Its stdout is read on a thread and handed over line by line through a
//! channel, so a silent adapter is a timeout (`hang`), never a blocked read;
//! end of file is [`Line::Eof`]. The last lines of the exchange and of its
//! stderr are kept for the report. Invariant: the runner never holds more
//! than [`MAX_LINE`] bytes of one line of the adapter's.

use anyhow::{Context, Result};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

pub(super) enum Line {
    Text(String),
    /// A line longer than [`MAX_LINE`] bytes: the reader stopped there
    /// (the runner never holds more than that of one line).
    TooLong,
    Eof,
}

/// The longest line an adapter may write (a reply is a few hundred bytes).
pub(super) const MAX_LINE: u64 = 1 << 20;

pub(super) struct AdapterProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    pub(super) rx: Receiver<Line>,
    stderr: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// Set when the stderr reader reached end of file.
    stderr_done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub(super) transcript: Vec<String>,
}

const TRANSCRIPT_KEEP: usize = 24;

impl AdapterProcess {
    pub(super) fn spawn(cmd: &str, env: &[(String, String)]) -> Result<AdapterProcess> {
        use std::os::unix::process::CommandExt;
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!("exec {cmd}"))
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot start the adapter `{cmd}`"))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            loop {
                let mut buf = Vec::new();
                // Bounded: at most MAX_LINE bytes of one line are held.
                match (&mut r).take(MAX_LINE + 1).read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => {
                        let _ = tx.send(Line::Eof);
                        return;
                    }
                    Ok(n) if n as u64 > MAX_LINE && buf.last() != Some(&b'\n') => {
                        let _ = tx.send(Line::TooLong);
                        // Drain what follows, holding nothing, so that an
                        // adapter blocked writing can end and say how
                        // ([`AdapterProcess::end_after_too_long`]).
                        drop(buf);
                        let _ = std::io::copy(&mut r, &mut std::io::sink());
                        let _ = tx.send(Line::Eof);
                        return;
                    }
                    Ok(_) => {
                        let s = String::from_utf8_lossy(&buf);
                        if tx.send(Line::Text(s.trim_end().to_string())).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let errs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let errs2 = errs.clone();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done2 = done.clone();
        std::thread::spawn(move || {
            let _at_end = SetOnDrop(done2);
            for l in BufReader::new(stderr).lines() {
                let Ok(l) = l else { return };
                let mut v = errs2.lock().unwrap_or_else(|e| e.into_inner());
                v.push(l);
                if v.len() > 8 {
                    v.remove(0);
                }
            }
        });
        Ok(AdapterProcess { child, stdin, rx, stderr: errs, stderr_done: done, transcript: Vec::new() })
    }

    pub(super) fn note(&mut self, s: String) {
        self.transcript.push(s);
        if self.transcript.len() > TRANSCRIPT_KEEP {
            self.transcript.remove(0);
        }
    }

    pub(super) fn send(&mut self, v: &Value, line: usize) -> Result<(), String> {
        let s = v.to_string();
        self.note(format!("> {s}    (case line {line})"));
        let stdin = self.stdin.as_mut().ok_or("the adapter's stdin is closed")?;
        stdin
            .write_all(s.as_bytes())
            .and_then(|()| stdin.write_all(b"\n"))
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("cannot write to the adapter: {e}"))
    }

    /// Kills the adapter's whole process group.
    pub(super) fn kill(&mut self) {
        let pid = self.child.id() as i32;
        // SAFETY: signals our own child's process group (spawned with process_group(0)).
        unsafe { libc::kill(-pid, libc::SIGKILL) };
        let _ = self.child.wait();
    }

    /// After EOF: how the adapter ended (waits up to 2 s, then kills).
    pub(super) fn exit_status(&mut self) -> String {
        use std::os::unix::process::ExitStatusExt;
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match self.child.try_wait() {
                Ok(Some(st)) => {
                    return match (st.code(), st.signal()) {
                        (Some(c), _) => format!("exited with status {c}"),
                        (_, Some(s)) => format!("killed by signal {s} ({})", signal_name(s)),
                        _ => "ended".into(),
                    };
                }
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                _ => {
                    self.kill();
                    return "closed its stdout and did not exit within 2 s (killed)".into();
                }
            }
        }
    }

    /// After [`Line::TooLong`]: how the adapter ended, for the report. The
    /// reader drains the rest of its output, so one that exits after its
    /// long line is seen to; one still writing after 2 s is killed.
    pub(super) fn end_after_too_long(&mut self) -> String {
        match self.rx.recv_timeout(Duration::from_secs(2)) {
            Ok(Line::Eof) | Err(mpsc::RecvTimeoutError::Disconnected) => format!("then {}", self.exit_status()),
            _ => {
                self.kill();
                "and was still writing 2 s later (killed)".into()
            }
        }
    }

    /// The last lines of its stderr. Once it has exited, waits (up to
    /// 500 ms) for the reader to take in what it wrote last.
    pub(super) fn stderr_tail(&mut self) -> Vec<String> {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            let deadline = Instant::now() + Duration::from_millis(500);
            while !self.stderr_done.load(std::sync::atomic::Ordering::Acquire) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        self.stderr.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Sets its flag when dropped (the stderr reader's end, however it ends).
struct SetOnDrop(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

fn signal_name(s: i32) -> &'static str {
    match s {
        libc::SIGABRT => "SIGABRT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGKILL => "SIGKILL",
        libc::SIGBUS => "SIGBUS",
        libc::SIGTERM => "SIGTERM",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        _ => "signal",
    }
}
