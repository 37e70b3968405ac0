//! `mrcache record`: run an MPI program under the PMPI recorder and write one
//! trace per rank (traces/README.md, spec.md#T).
//!
//! `mrcache record -o DIR -- mpirun --allow-run-as-root -np 2 PROGRAM ARGS`
//! writes the recorder library (built by build.rs from
//! `recorder/pmpi_shim.c`, embedded in this binary) to a cache directory,
//! inserts `-x LD_PRELOAD=... -x MRCACHE_TRACE_DIR ...` right after the
//! launcher's `argv[0]`, runs the job, and reports the events of each rank and
//! the size of its trace. A command that is not an Open MPI launcher runs as a
//! singleton with LD_PRELOAD in its environment.

use anyhow::{bail, Context, Result};
use mrcache_types::trace::Trace;
use mrcache_types::Op;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The recorder, built from `recorder/pmpi_shim.c` against the Open MPI found
/// at build time.
#[cfg(mrcache_pmpi)]
const SHIM: Option<&[u8]> = Some(include_bytes!(concat!(env!("OUT_DIR"), "/libmrcache_pmpi.so")));
#[cfg(not(mrcache_pmpi))]
const SHIM: Option<&[u8]> = None;

/// Launchers whose `-x NAME[=VALUE]` exports an environment variable to the ranks.
const OPEN_MPI_LAUNCHERS: [&str; 5] = ["mpirun", "mpiexec", "orterun", "mpirun.openmpi", "mpiexec.openmpi"];

#[derive(Clone, Debug, clap::Args)]
pub struct RecordArgs {
    /// Directory for the traces: `rank-<r>.jsonl` (or `.jsonl.gz`) and `rank-<r>.stats.json`.
    #[arg(short = 'o', long = "out")]
    pub out: PathBuf,
    /// alloc/free/mmap records of fewer bytes than this are not written
    /// (acquires and release events are always written).
    #[arg(long, default_value_t = 4096)]
    pub threshold: u64,
    /// Also record during MPI_Init (by default recording starts when it returns).
    #[arg(long)]
    pub include_init: bool,
    /// The header's `program` (default: the rank executable's name).
    #[arg(long)]
    pub program: Option<String>,
    /// The header's `program_version`.
    #[arg(long)]
    pub program_version: Option<String>,
    /// How the run was set up; the header's `description` is this, then what the recorder records.
    #[arg(long)]
    pub description: Option<String>,
    /// Keep only the records with t in [FROM, TO) seconds (t counts from
    /// MPI_Init); releases of leases acquired before FROM are dropped.
    #[arg(long, value_name = "FROM:TO")]
    pub window: Option<String>,
    /// Compress the traces (`rank-<r>.jsonl.gz`); `mrcache replay` reads both.
    #[arg(long)]
    pub gzip: bool,
    /// Send SIGTERM to the job after this many seconds (then SIGKILL 10 s later).
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<u64>,
    /// The MPI command: `mpirun [OPTIONS] PROGRAM [ARGS]`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// What one rank's trace holds.
#[derive(Clone, Debug)]
pub struct RankSummary {
    pub rank: u32,
    pub path: PathBuf,
    pub bytes: u64,
    pub records: usize,
    /// Records per op name (`release_event` split by kind: `release_event:munmap`).
    pub ops: BTreeMap<String, usize>,
    /// The recorder's own counters (`rank-<r>.stats.json`), if written.
    pub recorder_stats: Option<serde_json::Value>,
}

/// Writes the embedded recorder to a cache directory and returns its path.
pub fn shim_path() -> Result<PathBuf> {
    let Some(bytes) = SHIM else {
        bail!(
            "this mrcache was built without the PMPI recorder: Open MPI's mpi.h was not found at build time. \
             Install Open MPI (Debian: apt-get install openmpi-bin libopenmpi-dev, or run ci/setup.sh) and rebuild \
             (cargo build --release)"
        );
    };
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("mrcache");
    std::fs::create_dir_all(&base).with_context(|| format!("cannot create {}", base.display()))?;
    // One file per build: the name carries a hash of the contents.
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3));
    let path = base.join(format!("libmrcache_pmpi-{hash:016x}.so"));
    if std::fs::metadata(&path).map(|m| m.len() == bytes.len() as u64).unwrap_or(false) {
        return Ok(path);
    }
    let tmp = base.join(format!(".libmrcache_pmpi-{hash:016x}.{}", std::process::id()));
    std::fs::write(&tmp, bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("cannot rename to {}", path.display()))?;
    Ok(path)
}

fn shell_quote(arg: &str) -> String {
    if !arg.is_empty() && arg.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c)) {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

fn parse_window(w: &str) -> Result<(u64, u64)> {
    let (a, b) = w.split_once(':').context("--window takes FROM:TO in seconds, e.g. 5:10")?;
    let secs = |s: &str| -> Result<u64> {
        let v: f64 = s.trim().parse().with_context(|| format!("--window: `{s}` is not a number of seconds"))?;
        if !(v >= 0.0 && v.is_finite()) {
            bail!("--window: `{s}` must be a non-negative number of seconds");
        }
        Ok((v * 1e9) as u64)
    };
    let (from, to) = (secs(a)?, if b.trim().is_empty() { u64::MAX } else { secs(b)? });
    if from >= to {
        bail!("--window: FROM must be before TO");
    }
    Ok((from, to))
}

/// The records of `trace` with `t` in `[from, to)`, still a valid trace:
/// releases of leases acquired before the window are dropped (leases still
/// held at its end simply stay held).
pub fn window(trace: &Trace, from: u64, to: u64) -> Trace {
    let mut held = BTreeSet::new();
    let mut records = Vec::new();
    for r in &trace.records {
        let t = r.t.unwrap_or(0);
        if t < from || t >= to {
            continue;
        }
        match r.op {
            Op::Acquire { lease, .. } => {
                held.insert(lease);
            }
            // A lease acquired before the window: its release goes too.
            Op::Release { lease } if !held.remove(&lease) => continue,
            _ => {}
        }
        records.push(r.clone());
    }
    let mut header = trace.header.clone();
    let note = format!(
        "window: records with t in [{:.3} s, {}) of the run",
        from as f64 / 1e9,
        if to == u64::MAX { "end".to_string() } else { format!("{:.3} s", to as f64 / 1e9) }
    );
    header.description = Some(match header.description {
        Some(d) => format!("{d}; {note}"),
        None => note,
    });
    Trace { header, records, first_record_line: 2 }
}

/// Reads a trace file, gzip-compressed or not.
pub fn read_text(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    if path.extension().is_some_and(|e| e == "gz") {
        let mut text = String::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .read_to_string(&mut text)
            .with_context(|| format!("cannot decompress {}", path.display()))?;
        Ok(text)
    } else {
        String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8", path.display()))
    }
}

fn write_trace(path: &Path, text: &str, gzip: bool) -> Result<PathBuf> {
    if !gzip {
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
        return Ok(path.to_path_buf());
    }
    let gz = path.with_extension("jsonl.gz");
    let file = std::fs::File::create(&gz).with_context(|| format!("cannot create {}", gz.display()))?;
    let mut enc = flate2::write::GzEncoder::new(file, flate2::Compression::best());
    enc.write_all(text.as_bytes())?;
    enc.finish()?;
    if path != gz {
        let _ = std::fs::remove_file(path);
    }
    Ok(gz)
}

/// Summarises (and validates) one rank's trace.
pub fn summarise(path: &Path) -> Result<RankSummary> {
    let text = read_text(path)?;
    let trace = Trace::parse(&path.display().to_string(), &text)?;
    let mut ops = BTreeMap::new();
    for r in &trace.records {
        let name = match r.op {
            Op::ReleaseEvent { kind, .. } => {
                format!("release_event:{}", serde_json::to_value(kind)?.as_str().unwrap_or("?"))
            }
            op => op.name().to_string(),
        };
        *ops.entry(name).or_insert(0) += 1;
    }
    let rank = trace.header.rank.unwrap_or(0);
    let stats_path = path.with_file_name(format!("rank-{rank}.stats.json"));
    let recorder_stats = std::fs::read_to_string(stats_path).ok().and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok());
    Ok(RankSummary {
        rank,
        path: path.to_path_buf(),
        bytes: std::fs::metadata(path)?.len(),
        records: trace.records.len(),
        ops,
        recorder_stats,
    })
}

/// The rank traces in `dir`, in rank order.
pub fn rank_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<(u32, PathBuf)> = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let rank = name
            .strip_prefix("rank-")
            .and_then(|r| r.strip_suffix(".jsonl").or_else(|| r.strip_suffix(".jsonl.gz")))
            .and_then(|r| r.parse().ok());
        if let Some(rank) = rank {
            files.push((rank, path));
        }
    }
    files.sort();
    Ok(files.into_iter().map(|(_, p)| p).collect())
}

/// Runs the command under the recorder. Returns the job's exit code.
pub fn run(args: &RecordArgs) -> Result<i32> {
    let shim = shim_path()?;
    let window = args.window.as_deref().map(parse_window).transpose()?;
    std::fs::create_dir_all(&args.out).with_context(|| format!("cannot create {}", args.out.display()))?;
    let out = args.out.canonicalize()?;
    // Stale traces and stats of an earlier run would mix with this one's.
    for entry in std::fs::read_dir(&out)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("rank-") && [".jsonl", ".jsonl.gz", ".stats.json"].iter().any(|s| name.ends_with(s)) {
            std::fs::remove_file(&path)?;
        }
    }

    let (program, rest) = args.command.split_first().context("no command given after --")?;
    let launcher = Path::new(program).file_name().and_then(|n| n.to_str()).unwrap_or("");
    let mut env: Vec<(&str, String)> = vec![
        ("MRCACHE_TRACE_DIR", out.display().to_string()),
        ("MRCACHE_THRESHOLD", args.threshold.to_string()),
        ("MRCACHE_COMMAND", args.command.iter().map(|a| shell_quote(a)).collect::<Vec<_>>().join(" ")),
    ];
    if args.include_init {
        env.push(("MRCACHE_INCLUDE_INIT", "1".into()));
    }
    for (name, value) in
        [("MRCACHE_PROGRAM", &args.program), ("MRCACHE_PROGRAM_VERSION", &args.program_version), ("MRCACHE_DESCRIPTION", &args.description)]
    {
        if let Some(v) = value {
            env.push((name, v.clone()));
        }
    }
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", shim.display()),
        _ => shim.display().to_string(),
    };
    let mut cmd = Command::new(program);
    for (k, v) in &env {
        cmd.env(k, v);
    }
    if OPEN_MPI_LAUNCHERS.contains(&launcher) {
        // mpirun itself is not preloaded: `-x` hands the variables to the ranks.
        cmd.arg("-x").arg(format!("LD_PRELOAD={preload}"));
        for (k, _) in &env {
            cmd.arg("-x").arg(k);
        }
    } else {
        cmd.env("LD_PRELOAD", &preload);
    }
    cmd.args(rest);

    let started = Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("cannot run `{program}`"))?;
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if let Some(limit) = args.timeout {
            let elapsed = started.elapsed();
            if !timed_out && elapsed > Duration::from_secs(limit) {
                eprintln!("mrcache record: timeout after {limit} s: sending SIGTERM to the job");
                // SAFETY: kill(2) on our own child's pid.
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
                timed_out = true;
            } else if timed_out && elapsed > Duration::from_secs(limit + 10) {
                child.kill()?;
                break child.wait()?;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let elapsed = started.elapsed();
    let code = status.code().unwrap_or(128 + 15);

    let files = rank_files(&out)?;
    if files.is_empty() {
        bail!(
            "`{}` exited with {status} after {:.1} s and wrote no trace in {}: did the program call MPI_Init? \
             (Open MPI is needed: the recorder is built against it)",
            args.command.join(" "),
            elapsed.as_secs_f64(),
            out.display()
        );
    }
    for path in &files {
        if let Some(bytes) = drop_partial_last_record(path)? {
            eprintln!(
                "mrcache record: {}: the rank was killed in the middle of a write; dropped its partial last record ({bytes} bytes)",
                path.display()
            );
        }
    }
    if window.is_some() || args.gzip {
        for path in &files {
            let text = read_text(path)?;
            let trace = Trace::parse(&path.display().to_string(), &text)?;
            let text = match window {
                Some((from, to)) => self::window(&trace, from, to).to_jsonl(),
                None => text,
            };
            write_trace(path, &text, args.gzip)?;
        }
    }
    println!(
        "mrcache record: `{}` exited with {status} after {:.1} s; traces in {}",
        args.command.join(" "),
        elapsed.as_secs_f64(),
        out.display()
    );
    println!("{}", report(&rank_files(&out)?.iter().map(|p| summarise(p)).collect::<Result<Vec<_>>>()?));
    Ok(code)
}

/// A rank killed (SIGKILL, or mpirun's kill after its SIGTERM) while the
/// recorder wrote can leave a record without its newline at the end of the
/// file. Truncates it to its last complete record; returns the bytes dropped.
fn drop_partial_last_record(path: &Path) -> Result<Option<u64>> {
    if path.extension().and_then(|e| e.to_str()) != Some("jsonl") {
        return Ok(None);
    }
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.is_empty() || bytes.ends_with(b"\n") {
        return Ok(None);
    }
    let keep = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let file = std::fs::OpenOptions::new().write(true).open(path).with_context(|| format!("cannot open {}", path.display()))?;
    file.set_len(keep as u64).with_context(|| format!("cannot truncate {}", path.display()))?;
    Ok(Some((bytes.len() - keep) as u64))
}

/// A table: one line per rank.
pub fn report(ranks: &[RankSummary]) -> String {
    use std::fmt::Write;
    let cols: BTreeSet<&str> = ranks.iter().flat_map(|r| r.ops.keys().map(String::as_str)).collect();
    let mut out = String::new();
    let _ = write!(out, "{:>4} {:>10} {:>12}", "rank", "records", "bytes");
    for c in &cols {
        let _ = write!(out, " {c:>w$}", w = c.len().max(8));
    }
    out.push('\n');
    for r in ranks {
        let _ = write!(out, "{:>4} {:>10} {:>12}", r.rank, r.records, r.bytes);
        for c in &cols {
            let _ = write!(out, " {:>w$}", r.ops.get(*c).copied().unwrap_or(0), w = c.len().max(8));
        }
        out.push('\n');
        if let Some(s) = &r.recorder_stats {
            let _ = writeln!(out, "     recorder: {s}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partial_last_record_is_dropped_and_whole_files_are_kept() {
        let dir = std::env::temp_dir().join(format!("mrcache-partial-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let whole = "{\"mrcache_trace\":1}\n{\"t\":1,\"op\":\"release\",\"lease\":1}\n";
        let cut = dir.join("rank-0.jsonl");
        std::fs::write(&cut, format!("{whole}{{\"t\":2,\"op\":\"acq")).unwrap();
        assert_eq!(drop_partial_last_record(&cut).unwrap(), Some(r#"{"t":2,"op":"acq"#.len() as u64));
        assert_eq!(std::fs::read_to_string(&cut).unwrap(), whole);
        assert_eq!(drop_partial_last_record(&cut).unwrap(), None, "a whole file is left alone");
        assert_eq!(std::fs::read_to_string(&cut).unwrap(), whole);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn window_keeps_a_valid_trace() {
        let text = r#"{"mrcache_trace":1,"source":"recorder"}
{"t":1,"op":"acquire","lease":1,"addr":"0x1000","len":4096,"access":"remote_read"}
{"t":5,"op":"acquire","lease":2,"addr":"0x3000","len":4096,"access":"remote_read"}
{"t":6,"op":"release","lease":1}
{"t":7,"op":"release_event","kind":"munmap","addr":"0x1000","len":4096}
{"t":9,"op":"release","lease":2}
"#;
        let t = Trace::parse("t", text).unwrap();
        let w = window(&t, 5, 9);
        assert_eq!(w.records.len(), 2, "{w:?}");
        Trace::parse("w", &w.to_jsonl()).unwrap();
        assert!(w.header.description.unwrap().contains("window"));
        assert_eq!(parse_window("1.5:3").unwrap(), (1_500_000_000, 3_000_000_000));
        assert_eq!(parse_window("2:").unwrap().1, u64::MAX);
        assert!(parse_window("3:1").is_err());
    }

    #[test]
    fn commands_are_quoted_for_the_header() {
        assert_eq!(shell_quote("-np"), "-np");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
