//! The churn: what changes the memory behind the cache's back.
//!
//! A churner takes a random slot whose lock it can get (so never a leased
//! one), changes its frames in one of the [`Churn`] ways, refills every
//! hole at once, bumps the churn count of the pages that changed and, with
//! the explicit monitor, calls `invalidate` before it unlocks the slot
//! (spec.md#S1.8). Churners are paced to `churn_per_100` churns per 100
//! acquires. With `churn_in_register` the registrar releases a page of the
//! range it just pinned, on the acquiring thread (spec.md#S3.7, P6).

use super::arena::{map_at, refill_holes, unmapped_any, RW_PROT};
use super::{Ctx, DmaCache, DmaConfig, MonitorKind};
use crate::rng::Rng;
use mrcache_types::{Range, ReleaseKind};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// What one churn does to a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Churn {
    Dontneed,
    MunmapMmap,
    MapFixed,
    MremapMove,
    MremapShrink,
}

impl Churn {
    pub const ALL: [Churn; 5] = [Churn::Dontneed, Churn::MunmapMmap, Churn::MapFixed, Churn::MremapMove, Churn::MremapShrink];

    fn kind(self) -> ReleaseKind {
        match self {
            Churn::Dontneed => ReleaseKind::MadviseDontneed,
            Churn::MunmapMmap => ReleaseKind::Munmap,
            Churn::MapFixed => ReleaseKind::MapFixedOver,
            Churn::MremapMove | Churn::MremapShrink => ReleaseKind::MremapSource,
        }
    }
}

/// The registrar hook of `churn_in_register`: release one page of the range
/// just pinned, on the acquiring thread (which holds the slot's lock).
pub(super) fn install_register_churn(
    cache: &Arc<DmaCache>,
    cfg: &DmaConfig,
    base: u64,
    page: u64,
    churn: Arc<Vec<AtomicU64>>,
    count: Arc<AtomicU64>,
) {
    let weak: Weak<DmaCache> = Arc::downgrade(cache);
    let calls = AtomicU64::new(0);
    let (seed, per_mille, explicit) = (cfg.seed, cfg.churn_in_register, cfg.monitor == MonitorKind::Explicit);
    cache.registrar().set_hook(Box::new(move |range: Range| {
        let n = calls.fetch_add(1, Relaxed);
        let mut rng = Rng::new(seed).split(0x5eed_0000_0000 + n);
        if !rng.chance(per_mille, 1000) {
            return;
        }
        let span = range.pages(page);
        let p = span.first + rng.below(span.count());
        // SAFETY: the page is inside the slot the acquiring thread has locked
        // (registrations never leave the requested slot, see `worker`); no
        // Rust reference into it is live. DONTNEED drops the frame from the
        // mapping; the registration keeps its pin.
        let rc = unsafe { libc::madvise((p * page) as *mut libc::c_void, page as usize, libc::MADV_DONTNEED) };
        if explicit {
            // The hook reports after the release (S1.8).
            if let Some(c) = weak.upgrade() {
                let _ = c.invalidate(p * page, page, ReleaseKind::MadviseDontneed);
            }
        }
        if rc == 0 {
            if let Some(c) = churn.get(((p * page - base) / page) as usize) {
                c.fetch_add(1, Relaxed);
            }
            count.fetch_add(1, Relaxed);
        }
    }));
}

pub(super) fn churner(ctx: &Ctx<'_>, id: u32, scratch: u64) {
    let cfg = ctx.cfg;
    let mut rng = Rng::new(cfg.seed).split(1000 + u64::from(id));
    let (sb, page) = (ctx.slot_bytes, ctx.page);
    while !ctx.stop.load(Relaxed) && ctx.c.done.load(Relaxed) < cfg.ops {
        // Pacing: `churn_per_100` churns per 100 acquires (and a few to start).
        let churns = ctx.c.churns.load(Relaxed);
        if churns * 100 > ctx.c.done.load(Relaxed) * cfg.churn_per_100 + 100 {
            std::thread::sleep(Duration::from_micros(50));
            continue;
        }
        let slot = rng.below(cfg.slots);
        let Ok(mut st) = ctx.slots[slot as usize].try_lock() else { continue };
        if st.dead {
            continue;
        }
        let kind = *rng.pick(&Churn::ALL);
        let slot_addr = ctx.base + slot * sb;
        // Pages [first, end) of the slot that change frames.
        let (first, end) = match kind {
            Churn::MremapMove => (0, cfg.slot_pages),
            Churn::MremapShrink if cfg.slot_pages > 1 => (1 + rng.below(cfg.slot_pages - 1), cfg.slot_pages),
            Churn::MremapShrink => (0, 0),
            _ => {
                let f = rng.below(cfg.slot_pages);
                (f, f + 1 + rng.below(cfg.slot_pages - f))
            }
        };
        if first == end {
            continue;
        }
        let (addr, len) = (slot_addr + first * page, (end - first) * page);
        let done = churn(kind, slot_addr, sb, addr, len, scratch);
        if cfg.monitor == MonitorKind::Explicit {
            // A synchronous hook runs after the frames are released and
            // before the releasing call returns (S1.8): here, before the
            // slot is unlocked.
            let _ = ctx.cache.invalidate(addr, len, kind.kind());
        }
        if !done.intact {
            st.dead = true;
            ctx.c.dead_slots.fetch_add(1, Relaxed);
        }
        if done.changed {
            for p in first..end {
                ctx.churn[(slot * cfg.slot_pages + p) as usize].fetch_add(1, Relaxed);
            }
            ctx.c.churns.fetch_add(1, Relaxed);
            ctx.c.churn_kinds[Churn::ALL.iter().position(|k| *k == kind).unwrap_or(0)].fetch_add(1, Relaxed);
        }
        drop(st);
    }
}

/// What one churn did.
struct Churned {
    /// The slot is fully mapped again.
    intact: bool,
    /// Frames behind the churned pages changed (a failed mremap changes
    /// nothing; it is not counted as a churn).
    changed: bool,
}

/// Performs one churn (see [`Churned`]).
fn churn(kind: Churn, slot_addr: u64, slot_bytes: u64, addr: u64, len: u64, scratch: u64) -> Churned {
    // SAFETY: (all calls below) the ranges are page-aligned parts of the
    // arena slot whose lock the caller holds (no lease, no reference into
    // it) or of this churner's own scratch reservation. Every hole made is
    // refilled at once with MAP_FIXED_NOREPLACE, which never replaces a
    // mapping someone else put there; if that fails the slot is given up.
    let changed = unsafe {
        match kind {
            Churn::Dontneed => libc::madvise(addr as *mut libc::c_void, len as usize, libc::MADV_DONTNEED) == 0,
            Churn::MunmapMmap => libc::munmap(addr as *mut libc::c_void, len as usize) == 0,
            Churn::MapFixed => map_at(addr, len, libc::MAP_FIXED, RW_PROT).is_ok(),
            Churn::MremapMove => {
                // Measured on 6.18: when the slot spans several VMAs (the
                // cache watched part of it) and one of them after the first
                // is userfaultfd-registered, the move fails with EFAULT
                // *after* moving the VMAs before it, leaving holes. The
                // refill below handles every outcome.
                let p = libc::mremap(
                    slot_addr as *mut libc::c_void,
                    slot_bytes as usize,
                    slot_bytes as usize,
                    libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                    scratch as *mut libc::c_void,
                );
                let partial = p == libc::MAP_FAILED && unmapped_any(slot_addr, slot_bytes);
                // Replace whatever moved with the reservation again (frees
                // the old frames, unless a registration pins them).
                let _ = map_at(scratch, slot_bytes, libc::MAP_FIXED | libc::MAP_NORESERVE, libc::PROT_NONE);
                p != libc::MAP_FAILED || partial
            }
            Churn::MremapShrink => {
                let p = libc::mremap(slot_addr as *mut libc::c_void, slot_bytes as usize, (addr - slot_addr) as usize, 0);
                p != libc::MAP_FAILED
            }
        }
    };
    Churned { intact: refill_holes(slot_addr, slot_bytes), changed }
}
