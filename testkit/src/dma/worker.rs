//! A worker: acquires in random slots (holding the slot's lock from before
//! the acquire until after its lease is released, so no churn races it) and
//! checks every grant with the oracles of the `testkit::dma` docs: coverage
//! (P1), the pinned PFNs against the mapping's, and a DMA of a fresh pattern
//! that the application's mapping must show. An acquire on pages churned since
//! they were last granted is counted as churned.

use super::{lock, Ctx, RW};
use crate::rng::{mix, Rng};
use mrcache::pagemap;
use mrcache_types::Range;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;
use std::time::Duration;

/// A pattern no earlier op wrote (8 fresh bytes per word).
pub(super) fn fill(buf: &mut [u8], op: u64) {
    let x = mix(op ^ 0xd1a_5eed);
    for (i, chunk) in buf.chunks_mut(8).enumerate() {
        let w = mix(x.wrapping_add(i as u64)).to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
}

fn record(first: &Mutex<Option<String>>, what: impl FnOnce() -> String) {
    let mut f = lock(first);
    if f.is_none() {
        *f = Some(what());
    }
}

pub(super) fn worker(ctx: &Ctx<'_>, id: u32, ready: &std::sync::Barrier) {
    let cfg = ctx.cfg;
    let mut rng = Rng::new(cfg.seed).split(u64::from(id));
    let sb = ctx.slot_bytes;
    let mut buf = vec![0u8; sb as usize];
    let mut back = vec![0u8; sb as usize];
    ready.wait();
    loop {
        let n = ctx.c.issued.fetch_add(1, Relaxed);
        if n >= cfg.ops || ctx.stop.load(Relaxed) {
            break;
        }
        // Pacing from this side too: on a loaded machine churners (which wait
        // for the monitor) fall behind, and the run would prove less. Wait a
        // bounded while for them to come within 4 churns of the rate.
        for _ in 0..2000 {
            let lag = ctx.c.done.load(Relaxed) * cfg.churn_per_100;
            if ctx.c.churns.load(Relaxed) * 100 + 400 >= lag || ctx.stop.load(Relaxed) {
                break;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        let slot = rng.below(cfg.slots);
        let mut st = lock(&ctx.slots[slot as usize]);
        if st.dead {
            ctx.c.done.fetch_add(1, Relaxed);
            continue;
        }
        // A request inside the slot: mostly whole pages, sometimes bytes.
        let (off, len) = if rng.chance(3, 4) {
            let first = rng.below(cfg.slot_pages);
            let pages = 1 + rng.below(cfg.slot_pages - first);
            (first * ctx.page, pages * ctx.page)
        } else {
            let off = rng.below(sb - 1);
            (off, 1 + rng.below(sb - off))
        };
        let addr = ctx.base + slot * sb + off;
        let (p0, p1) = (off / ctx.page, (off + len).div_ceil(ctx.page));
        let page_index = |p: u64| (slot * cfg.slot_pages + p) as usize;
        let churned = (p0..p1).any(|p| st.seen[p as usize].is_some_and(|s| ctx.churn[page_index(p)].load(Relaxed) > s));
        match ctx.cache.acquire(addr, len, RW) {
            Ok(lease) => {
                ctx.c.granted.fetch_add(1, Relaxed);
                if lease.hit() {
                    ctx.c.hits.fetch_add(1, Relaxed);
                } else {
                    ctx.c.misses.fetch_add(1, Relaxed);
                }
                if churned {
                    ctx.c.churned.fetch_add(1, Relaxed);
                    if lease.hit() {
                        ctx.c.churned_hits.fetch_add(1, Relaxed);
                    }
                }
                let v = lease.view();
                let h = lease.handle();
                if !(v.addr <= addr && addr + len <= v.addr + v.len && v.access.suffices_for(RW))
                    || (h.range.addr, h.range.len) != (v.addr, v.len)
                {
                    ctx.c.coverage.fetch_add(1, Relaxed);
                } else {
                    // Oracle 2: the frames pinned are the frames mapped now.
                    if ctx.pfn {
                        if let (Some(pinned), Ok(now)) = (&h.pfns, pagemap::pfns(Range { addr, len })) {
                            let skip = ((addr - h.range.addr) / ctx.page) as usize;
                            ctx.c.pfn_checked.fetch_add(1, Relaxed);
                            if pinned.get(skip..skip + now.len()) != Some(&now[..]) {
                                ctx.c.pfn_mismatches.fetch_add(1, Relaxed);
                            }
                        }
                    }
                    // Oracle 1: DMA a fresh pattern, then look at the mapping.
                    let pattern = &mut buf[..len as usize];
                    fill(pattern, cfg.seed ^ (n << 8) ^ u64::from(id));
                    // SAFETY: the slot is locked by this thread, so nothing else
                    // reads or writes these bytes, and no Rust reference into
                    // them is live.
                    let dma = unsafe { ctx.cache.registrar().inner.dma_write(&h.inner, addr - h.range.addr, pattern) };
                    match dma {
                        Err(e) => {
                            ctx.c.dma_failures.fetch_add(1, Relaxed);
                            record(&ctx.first_unexpected, || format!("dma_write to {v}: {e}"));
                        }
                        Ok(()) => {
                            let seen = &mut back[..len as usize];
                            // SAFETY: `[addr, addr+len)` is mapped (slot locked, not
                            // dead) and readable; `seen` is our buffer of `len` bytes.
                            unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, seen.as_mut_ptr(), len as usize) };
                            if seen != pattern {
                                ctx.c.stale.fetch_add(1, Relaxed);
                                record(&ctx.first_stale, || {
                                    format!(
                                        "acquire #{n} of slot {slot} [{addr:#x}, +{len:#x}) got {} {v} (churned since last grant: {churned}); \
                                         the DMA through it is not in the mapping",
                                        if lease.hit() { "hit" } else { "miss" }
                                    )
                                });
                            }
                        }
                    }
                }
                for p in p0..p1 {
                    st.seen[p as usize] = Some(ctx.churn[page_index(p)].load(Relaxed));
                }
                drop(lease);
            }
            Err(e) => {
                *lock(&ctx.errors).entry(e.code().to_string()).or_default() += 1;
                let expected = e.code() == "E6" && cfg.churn_in_register > 0;
                if !expected {
                    ctx.c.unexpected.fetch_add(1, Relaxed);
                    record(&ctx.first_unexpected, || format!("acquire [{addr:#x}, +{len:#x}): {e}"));
                }
            }
        }
        drop(st);
        ctx.c.done.fetch_add(1, Relaxed);
    }
}
