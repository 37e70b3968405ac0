//! The registration cost model of `mrcache report` and `mrcache cost`.
//!
//! Registering `p` pages costs `reg_ns + reg_ns_per_page · p`, deregistering
//! them `dereg_ns + dereg_ns_per_page · p` (the same affine shape UCX uses
//! for its own registration cost estimate). The coefficients are either given
//! (`--cost-model A,B[,C,D]`) or measured here: [`measure`] pins a touched
//! anonymous buffer with the io_uring registrar (a real `FOLL_LONGTERM` pin,
//! like `ibv_reg_mr`) at sizes from 1 page to 64 MiB, takes the median time
//! of each size, and fits the line by least squares on relative error (so
//! that the 1-page and the 16 384-page points weigh alike).
//!
//! Invariants: a [`CostModel`] holds finite, non-negative coefficients (a
//! negative intercept from a noisy fit is clamped to 0 and said so in
//! `source`); measuring never leaves a registration behind (each register is
//! paired with its deregister, and the registrar's drop unpins the rest).

use anyhow::{anyhow, bail, Result};
use mrcache::registrar::uring::UringRegistrar;
use mrcache::registrar::Registrar;
use mrcache_types::{Access, Range};
use serde::Serialize;
use std::time::Instant;

/// Costs in nanoseconds, affine in the number of pages.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CostModel {
    pub reg_ns: f64,
    pub reg_ns_per_page: f64,
    pub dereg_ns: f64,
    pub dereg_ns_per_page: f64,
    /// `measured (io_uring, ...)` or `given`.
    pub source: String,
}

impl CostModel {
    /// Time to register `registrations` regions totalling `pages` pages.
    pub fn register_ns(&self, registrations: u64, pages: u64) -> f64 {
        self.reg_ns * registrations as f64 + self.reg_ns_per_page * pages as f64
    }

    /// Time to deregister `deregistrations` regions totalling `pages` pages.
    pub fn deregister_ns(&self, deregistrations: u64, pages: u64) -> f64 {
        self.dereg_ns * deregistrations as f64 + self.dereg_ns_per_page * pages as f64
    }

    /// One line: `register 1.2 µs + 0.15 µs/page, deregister ...`.
    pub fn describe(&self) -> String {
        format!(
            "register {:.2} us + {:.1} ns/page, deregister {:.2} us + {:.1} ns/page ({})",
            self.reg_ns / 1000.0,
            self.reg_ns_per_page,
            self.dereg_ns / 1000.0,
            self.dereg_ns_per_page,
            self.source
        )
    }
}

/// Parses `--cost-model`: `A_NS,B_NS_PER_PAGE` (registration; deregistration
/// then costs nothing) or `A,B,C,D` (registration, then deregistration).
pub fn parse(s: &str) -> Result<CostModel> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    if parts.len() != 2 && parts.len() != 4 {
        bail!("--cost-model `{s}`: expected A_NS,B_NS_PER_PAGE or A,B,C,D (register then deregister), e.g. 1500,120");
    }
    let mut v = Vec::with_capacity(4);
    for p in &parts {
        let x: f64 = p.parse().map_err(|_| anyhow!("--cost-model `{s}`: `{p}` is not a number"))?;
        if !x.is_finite() || x < 0.0 {
            bail!("--cost-model `{s}`: `{p}` must be a finite number of nanoseconds >= 0");
        }
        v.push(x);
    }
    v.resize(4, 0.0);
    Ok(CostModel { reg_ns: v[0], reg_ns_per_page: v[1], dereg_ns: v[2], dereg_ns_per_page: v[3], source: "given".into() })
}

/// One measured size.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    pub pages: u64,
    pub reps: usize,
    pub register_median_ns: f64,
    pub deregister_median_ns: f64,
}

/// Sizes measured, in pages: 4 KiB to 64 MiB.
const SIZES: [u64; 8] = [1, 4, 16, 64, 256, 1024, 4096, 16384];

/// Measures the io_uring registrar on this machine; see the module docs.
/// `quick` takes fewer repetitions. An error (io_uring unavailable, no
/// memory) says what failed; nothing stays pinned.
pub fn measure(quick: bool) -> Result<(CostModel, Vec<Sample>)> {
    let reg = UringRegistrar::new(1).map_err(|e| anyhow!("io_uring registrar unavailable: {e}"))?;
    let page = 4096u64;
    let max = SIZES[SIZES.len() - 1] * page;
    let buf = Buffer::map(max)?;
    let mut samples = Vec::new();
    for &pages in &SIZES {
        let range = Range::new(buf.addr, pages * page).map_err(|e| anyhow!("{e}"))?;
        let reps = if quick { (20_000 / pages as usize).clamp(5, 51) } else { (200_000 / pages as usize).clamp(21, 401) };
        // Warm-up: the first pin of a size touches page tables and caches.
        let h = reg.register(range, Access::REMOTE_READ).map_err(|e| anyhow!("io_uring register of {pages} pages: {e}"))?;
        reg.deregister(h).map_err(|e| anyhow!("io_uring deregister: {e}"))?;
        let (mut r, mut d) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
        for _ in 0..reps {
            let t0 = Instant::now();
            let h = reg.register(range, Access::REMOTE_READ).map_err(|e| anyhow!("io_uring register of {pages} pages: {e}"))?;
            let t1 = Instant::now();
            reg.deregister(h).map_err(|e| anyhow!("io_uring deregister: {e}"))?;
            let t2 = Instant::now();
            r.push((t1 - t0).as_nanos() as f64);
            d.push((t2 - t1).as_nanos() as f64);
        }
        samples.push(Sample { pages, reps, register_median_ns: median(&mut r), deregister_median_ns: median(&mut d) });
    }
    let fit_of = |f: fn(&Sample) -> f64| fit(&samples.iter().map(|s| (s.pages as f64, f(s))).collect::<Vec<_>>());
    let ((a, b), a_clamped) = fit_of(|s| s.register_median_ns);
    let ((c, d), c_clamped) = fit_of(|s| s.deregister_median_ns);
    let mut source = format!("measured: io_uring fixed buffers, touched anonymous memory, 1..{} pages", SIZES[SIZES.len() - 1]);
    if a_clamped || c_clamped {
        source.push_str(", negative intercept clamped to 0");
    }
    let model = CostModel { reg_ns: a, reg_ns_per_page: b, dereg_ns: c, dereg_ns_per_page: d, source };
    if ![a, b, c, d].iter().all(|x| x.is_finite()) {
        bail!("the cost fit is not finite: {model:?}");
    }
    Ok((model, samples))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Least squares of `y = a + b·x` with weights 1/y² (relative error).
/// Returns ((a, b), clamped): a negative `a` or `b` is clamped to 0.
pub fn fit(points: &[(f64, f64)]) -> ((f64, f64), bool) {
    let (mut sw, mut swx, mut swy, mut swxx, mut swxy) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(x, y) in points {
        let w = 1.0 / (y * y).max(1.0);
        sw += w;
        swx += w * x;
        swy += w * y;
        swxx += w * x * x;
        swxy += w * x * y;
    }
    let det = sw * swxx - swx * swx;
    if det.abs() < f64::EPSILON {
        return ((swy / sw.max(f64::MIN_POSITIVE), 0.0), false);
    }
    let b = (sw * swxy - swx * swy) / det;
    let a = (swy - b * swx) / sw;
    let clamped = a < 0.0 || b < 0.0;
    ((a.max(0.0), b.max(0.0)), clamped)
}

/// A touched anonymous mapping, unmapped on drop.
struct Buffer {
    addr: u64,
    len: usize,
}

impl Buffer {
    fn map(len: u64) -> Result<Buffer> {
        let addr = mrcache::mem::map_anon(len, 0).map_err(|e| anyhow!("cannot map {} MiB to measure registration: {e}", len >> 20))?;
        let len = len as usize;
        // Touch every page: registering memory that is in use, as MPI does,
        // not the first-touch faults.
        // SAFETY: `addr` is our own writable mapping of `len` bytes.
        unsafe { std::ptr::write_bytes(addr as *mut u8, 1, len) };
        Ok(Buffer { addr, len })
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: our own mapping; every registration on it was deregistered.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_recovers_a_line() {
        let pts: Vec<(f64, f64)> = [1.0, 10.0, 100.0, 1000.0].iter().map(|&x| (x, 500.0 + 3.0 * x)).collect();
        let ((a, b), clamped) = fit(&pts);
        assert!((a - 500.0).abs() < 1e-6 && (b - 3.0).abs() < 1e-9 && !clamped, "{a} {b}");
    }

    #[test]
    fn parse_rejects_garbage() {
        assert!(parse("1,2").is_ok());
        assert_eq!(parse("1,2,3,4").unwrap().dereg_ns_per_page, 4.0);
        for bad in ["", "1", "1,2,3", "a,b", "-1,2", "inf,1"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
