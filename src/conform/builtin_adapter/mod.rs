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
//! The parts; each imports only parts listed before it (this module, which
//! starts the session, imports them all):
//! - `protocol`: the lines written and read, the `Backend` a cache
//!   implements, pause/continue;
//! - `registrar`: the registrar both caches use (io_uring pins, `reg` and
//!   `dereg` lines);
//! - `memory`: the memory and data commands, performed for real;
//! - `mrcache_backend` and `toy`: the two caches;
//! - `session`: the commands after the hello, one worker thread per case
//!   thread, fork.
//!
//! This module holds the arguments and [`run`]: the hello, the arena and
//! the backend. Invariant: the reply to the hello is the adapter's first
//! line, and it declares what the backend does (policy, `chunk_size`,
//! `l1_bound`, registrar); an adapter that cannot do it writes a failed
//! reply instead and exits.
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

mod memory;
mod mrcache_backend;
mod protocol;
mod registrar;
mod session;
mod toy;

pub use mrcache_backend::CacheFault;
pub use toy::ToyBreak;

use memory::touch;
use mrcache_backend::Mrcache;
use mrcache_model::{Limits, OverlapPolicy};
use protocol::{emit, Backend, PAGE};
use registrar::{UringPins, PINS};
use serde_json::{json, Map, Value};
use std::io::BufRead;
use std::sync::Arc;
use toy::Toy;

/// The arena the cases address: 4 MiB.
const ARENA: u64 = 4 << 20;
/// The largest arena a case may get from this adapter (`config.arena_len`).
const MAX_ARENA: u64 = 64 << 20;
/// Where the arena goes if it can.
const ARENA_HINT: u64 = 0x2000_0000_0000;

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

/// `--chunk` in pages: a power of two, a multiple of the page size.
fn chunk_pages(chunk: u64) -> Result<u64, String> {
    if !chunk.is_power_of_two() || !(PAGE..=1 << 30).contains(&chunk) {
        return Err(format!("--chunk {chunk}: expected a power of two from {PAGE} to 2^30 bytes"));
    }
    Ok(chunk / PAGE)
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
    // The arena the case asks for (`config.arena_len`), at least ours.
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
        let p = libc::mmap(
            ARENA_HINT as *mut libc::c_void,
            arena_len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            flags | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        );
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
        let toy = Toy::new(args.brk.clone(), chunk_pages, limits);
        (
            Arc::new(toy),
            name,
            declared,
            vec!["flush", "trim", "limits", "fork", "pause", "pause_mem", "query", "during_register", "fork_paused", "destroy"],
        )
    } else {
        match Mrcache::start(args.policy, limits, args.fault, chunk_pages) {
            Ok(m) => {
                let name = match args.fault {
                    Some(f) => format!("mrcache (fault {f:?})"),
                    None => "mrcache".into(),
                };
                (
                    Arc::new(m),
                    name,
                    Some(args.policy),
                    vec!["flush", "trim", "limits", "pause", "pause_mem", "fork", "query", "during_register", "fork_paused", "destroy"],
                )
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
    session::serve(lines, backend)
}
