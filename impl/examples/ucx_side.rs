//! The mrcache arm of `bench/ucx/run.sh`: the workloads of
//! `bench/ucx/ucx_arm.c` (UCX's `ucs_rcache`), with the same address
//! sequences, through mrcache's API with [`CountingRegistrar`] and
//! `CacheConfig::explicit()` (a limit only where the workload sets one).
//! Every result is one line, `<workload> <metric>=<value>`, as the C arm
//! prints it; `bench/ucx/summarize.py` pairs them.
//!
//! ```text
//! ucx_side hit64k ITERS | hit N ITERS [seq] | fill N | evict N MAX ITERS
//!          hit2t N ITERS | overlap N ITERS | unmap N ITERS | unmap-uffd N ITERS
//! ```
//! Build: `cargo build --release -p mrcache --example ucx_side`.
use mrcache::registrar::counting::CountingRegistrar;
use mrcache::types::{Access, ReleaseKind};
use mrcache::{Cache, CacheConfig, MonitorThread};
use std::hint::black_box;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};
use std::time::Instant;

const KIB: u64 = 1024;
const REGION: u64 = 8 * KIB;
/// UCX's arm asks for PROT_READ | PROT_WRITE; this is mrcache's read-write.
const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_READ).union(Access::REMOTE_WRITE);
const SEED: u64 = 0x9E37_79B9_7F4A_7C15;

/// xorshift64*, then Lemire's reduction to `[0, n)`: the C arm's sequence.
struct Rng(u64);
impl Rng {
    #[inline]
    fn below(&mut self, n: u32) -> u32 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        (((x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) * n as u64) >> 32) as u32
    }
}

fn cache(max_regions: Option<u64>) -> Cache<CountingRegistrar> {
    let mut cfg = CacheConfig::explicit();
    cfg.contract.limits.max_regions = max_regions;
    Cache::new(CountingRegistrar::default(), cfg)
}

/// Address space only (never touched): the registrar does not pin.
fn reserve(len: u64) -> u64 {
    let align = 1u64 << 20;
    // SAFETY: a fresh anonymous mapping.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            (len + align) as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    assert!(p != libc::MAP_FAILED, "mmap");
    (p as u64 + align - 1) & !(align - 1)
}

fn rss_bytes() -> i64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let rss: i64 = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    rss * unsafe { libc::sysconf(libc::_SC_PAGESIZE) }
}

#[inline(always)]
fn get_put(c: &Cache<CountingRegistrar>, addr: u64, len: u64) {
    c.acquire(black_box(addr), len, RW).unwrap().release();
}

/// A point in time: wall clock and the CPU time of the whole process (all
/// threads, user and system), as the C arm takes them. On a shared machine
/// the CPU time is the steadier figure.
#[derive(Clone, Copy)]
struct Mark {
    wall: Instant,
    cpu: f64,
}

fn now() -> Mark {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Mark { wall: Instant::now(), cpu: ts.tv_sec as f64 * 1e9 + ts.tv_nsec as f64 }
}

/// `<name> ns=<wall per op> cpu=<cpu per op><extra>`.
fn report(name: &str, a: Mark, b: Mark, ops: u64, extra: &str) {
    let wall = (b.wall - a.wall).as_nanos() as f64 / ops as f64;
    println!("{name} ns={wall:.2} cpu={:.2}{extra}", (b.cpu - a.cpu) / ops as f64);
}

fn arg(a: &[String], i: usize) -> u64 {
    a.get(i).unwrap_or_else(|| panic!("{}: missing argument {i}", a[1])).parse().unwrap()
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    match a.get(1).map(String::as_str).unwrap_or("") {
        "hit64k" => {
            let iters = arg(&a, 2);
            let c = cache(None);
            let buf = reserve(64 * KIB);
            get_put(&c, buf, 64 * KIB);
            let t = now();
            for _ in 0..iters {
                get_put(&c, buf, 64 * KIB);
            }
            report("hit64k", t, now(), iters, "");
        }
        "hit" => {
            let (n, iters) = (arg(&a, 2) as u32, arg(&a, 3));
            let seq = a.get(4).is_some_and(|s| s == "seq");
            let c = cache(None);
            let base = reserve(n as u64 * REGION);
            for i in 0..n as u64 {
                get_put(&c, base + i * REGION, REGION);
            }
            // An untimed warm pass, the same kind of sequence as the timed
            // one (the C arm's): hits are measured in steady state.
            let mut g = Rng(SEED ^ 0x5A5A);
            let mut i = 0u32;
            for _ in 0..iters / 2 + 2 * n as u64 {
                let j = if seq { i } else { g.below(n) };
                i += 1;
                if i == n {
                    i = 0;
                }
                get_put(&c, base + j as u64 * REGION, REGION);
            }
            let mut g = Rng(SEED);
            let mut i = 0u32;
            let t = now();
            for _ in 0..iters {
                let j = if seq { i } else { g.below(n) };
                i += 1;
                if i == n {
                    i = 0;
                }
                get_put(&c, base + j as u64 * REGION, REGION);
            }
            report(&format!("hit{}/{n}", if seq { "-seq" } else { "" }), t, now(), iters, "");
            assert_eq!(c.registrar().registered.load(Ordering::Relaxed), n as u64, "a hit missed");
        }
        "fill" => {
            let n = arg(&a, 2);
            let extra = 1000;
            let rss0 = rss_bytes();
            let c = cache(None);
            let base = reserve((n + extra) * REGION);
            let t0 = now();
            for i in 0..n {
                get_put(&c, base + i * REGION, REGION);
            }
            let t1 = now();
            let rss1 = rss_bytes();
            let t2 = now();
            for i in n..n + extra {
                get_put(&c, base + i * REGION, REGION);
            }
            let t3 = now();
            report(&format!("fill/{n}"), t0, t1, n, "");
            report(&format!("marginal/{n}"), t2, t3, extra, "");
            println!("rss/{n} bytes={:.1}", (rss1 - rss0) as f64 / n as f64);
            assert_eq!(c.registrar().registered.load(Ordering::Relaxed), n + extra);
        }
        "evict" => {
            let (n, max, iters) = (arg(&a, 2), arg(&a, 3), arg(&a, 4));
            let c = cache(Some(max));
            let base = reserve(n * REGION);
            for k in 0..max {
                get_put(&c, base + (k % n) * REGION, REGION);
            }
            let r0 = c.registrar().registered.load(Ordering::Relaxed);
            let t = now();
            for k in max..max + iters {
                get_put(&c, base + (k % n) * REGION, REGION);
            }
            report(&format!("evict/{n}/{max}"), t, now(), iters, "");
            assert_eq!(c.registrar().registered.load(Ordering::Relaxed) - r0, iters, "an eviction case hit");
        }
        "hit2t" => {
            let (n, iters) = (arg(&a, 2) as u32, arg(&a, 3));
            let c = cache(None);
            let base = reserve(n as u64 * REGION);
            for i in 0..n as u64 {
                get_put(&c, base + i * REGION, REGION);
            }
            let go = Barrier::new(3);
            let t = std::thread::scope(|s| {
                for th in 0..2u64 {
                    let (c, go) = (&c, &go);
                    s.spawn(move || {
                        let mut g = Rng(SEED + th);
                        let mine = base + th * (n as u64 / 2) * REGION;
                        go.wait();
                        for _ in 0..iters {
                            get_put(c, mine + g.below(n / 2) as u64 * REGION, REGION);
                        }
                    });
                }
                go.wait();
                now()
            });
            let t1 = now();
            // Wall time per get+put per thread; CPU time per get+put.
            let wall = (t1.wall - t.wall).as_nanos() as f64 / iters as f64;
            println!("hit2t/{n} ns={wall:.2} cpu={:.2}", (t1.cpu - t.cpu) / (2 * iters) as f64);
        }
        "overlap" => {
            let (n, iters) = (arg(&a, 2) as u32, arg(&a, 3));
            let c = cache(None);
            let base = reserve((n as u64 + 1) * REGION);
            let t0 = now();
            for i in 0..n as u64 {
                get_put(&c, base + i * REGION, 2 * REGION);
            }
            let t1 = now();
            let mut g = Rng(SEED);
            let t2 = now();
            for _ in 0..iters {
                get_put(&c, base + g.below(n) as u64 * REGION, 2 * REGION);
            }
            let t3 = now();
            let regs = c.registrar().registered.load(Ordering::Relaxed);
            report(&format!("overlap-fill/{n}"), t0, t1, n as u64, &format!(" regs={regs}"));
            report(&format!("overlap-hit/{n}"), t2, t3, iters, "");
            assert_eq!(regs, n as u64, "overlapping entries were not all cached");
        }
        w @ ("unmap" | "unmap-uffd") => {
            let (n, iters) = (arg(&a, 2), arg(&a, 3));
            let uffd = w == "unmap-uffd";
            let c = Arc::new(cache(None));
            let _monitor = if uffd { Some(MonitorThread::start(&c).expect("userfaultfd monitor")) } else { None };
            let base = reserve(n * REGION);
            for i in 0..n {
                get_put(&c, base + i * REGION, REGION);
            }
            let spare: Vec<u64> = (0..iters).map(|_| reserve(4096)).collect();
            let munmap = |addr: u64| {
                // SAFETY: our own mapping, never referenced again.
                assert_eq!(unsafe { libc::munmap(addr as *mut libc::c_void, 4096) }, 0);
                if !uffd {
                    c.invalidate(addr, 4096, ReleaseKind::Munmap).unwrap();
                }
            };
            let t0 = now();
            for &p in &spare {
                munmap(p);
            }
            let t1 = now();
            let t2 = now();
            for k in 0..iters {
                munmap(base + k * REGION);
            }
            let t3 = now();
            // The uffd monitor applies events after munmap returns: wait for them.
            let deadline = Instant::now() + std::time::Duration::from_secs(10);
            while c.registrar().deregistered.load(Ordering::Relaxed) < iters && Instant::now() < deadline {
                std::thread::yield_now();
            }
            let deregs = c.registrar().deregistered.load(Ordering::Relaxed);
            report(&format!("{w}-none/{n}"), t0, t1, iters, "");
            report(&format!("{w}-one/{n}"), t2, t3, iters, &format!(" deregs={deregs}"));
            assert_eq!(deregs, iters, "a munmap did not invalidate its entry");
            if !uffd {
                // The syscall alone, for reference.
                let bare: Vec<u64> = (0..iters).map(|_| reserve(4096)).collect();
                let t = now();
                for &p in &bare {
                    // SAFETY: as above.
                    assert_eq!(unsafe { libc::munmap(p as *mut libc::c_void, 4096) }, 0);
                }
                report("munmap-bare", t, now(), iters, "");
            }
        }
        _ => {
            eprintln!("usage: see the head of impl/examples/ucx_side.rs");
            std::process::exit(2);
        }
    }
}
