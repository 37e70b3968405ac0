//! Real memory under a replayed trace (spec.md#T4): [`RealMemory`], an
//! anonymous arena the trace's addresses are relocated into, and release
//! events performed for real in it.
//!
//! Invariants:
//!
//! - the plan covers every range the trace's ops name (it is built from
//!   them), so relocation fails only for ops from another trace;
//! - relocation keeps each address's residue modulo [`Relocation::ALIGN`],
//!   so page and chunk alignment (and with them the cache's and the model's
//!   registrations, stats and ids) are the same in both coordinates; only
//!   addresses differ, and [`RealMemory::original`] maps them back;
//! - a release event replaces its pages with `mmap(MAP_FIXED)` of fresh
//!   anonymous pages, so the frames that backed them are really gone (a
//!   registration still naming them would be stale, as after the recorded
//!   program's own release);
//! - the arena is unmapped on drop: the owner drops it after the cache (and
//!   every lease on it) is gone.

use mrcache_types::trace::Relocation;
use mrcache_types::{Op, Range, Ret};

/// The arena a trace is relocated into. See the module docs.
pub struct RealMemory {
    plan: Relocation,
    base: u64,
    len: usize,
    /// The OS page: what `mmap` replaces (the trace's own page size only
    /// plans the relocation).
    os_page: u64,
}

impl RealMemory {
    /// Plans the relocation of `ops` (spec.md#T4) and maps its arena
    /// (`MAP_NORESERVE`: the trace's spans are touched only by the cache's
    /// registrations).
    pub fn map<'a>(ops: impl IntoIterator<Item = &'a Op>, page_size: u64) -> Result<RealMemory, String> {
        let plan = Relocation::plan(ops, page_size);
        let os_page = mrcache::mem::page_size();
        let len = usize::try_from(plan.arena_len.max(os_page)).map_err(|_| format!("arena of {} bytes is too large", plan.arena_len))?;
        let base = mrcache::mem::map_anon(len as u64, libc::MAP_NORESERVE)
            .map_err(|e| format!("cannot map a {} MiB replay arena: {e}", len >> 20))?;
        Ok(RealMemory { plan, base, len, os_page })
    }

    /// `op` with its addresses in the arena; `None` if the plan does not
    /// cover them.
    pub fn relocate(&self, op: &Op) -> Option<Op> {
        self.plan.relocate(op, self.base)
    }

    /// An arena range in the trace's coordinates (ranges the plan does not
    /// know are left as they are, so a divergence still shows them).
    pub fn original(&self, r: Range) -> Range {
        let addr = r.addr.checked_sub(self.base).and_then(|o| self.plan.original(o)).unwrap_or(r.addr);
        Range { addr, len: r.len }
    }

    /// An outcome in the trace's coordinates (only a grant names an address).
    pub fn original_ret(&self, ret: Ret) -> Ret {
        match ret {
            Ret::Granted { mut reg, hit, pressure } => {
                reg.addr = self.original(Range { addr: reg.addr, len: reg.len }).addr;
                Ret::Granted { reg, hit, pressure }
            }
            other => other,
        }
    }

    /// Replaces `[addr, addr+len)` (arena coordinates, page-rounded) by
    /// fresh pages: the frames that backed it are released, as the recorded
    /// release event did.
    pub fn release(&self, addr: u64, len: u64) -> Result<(), String> {
        let r = Range::new(addr, len).map_err(|e| e.to_string())?;
        let p = r.pages(self.os_page);
        let (start, bytes) = (p.first * self.os_page, p.count() * self.os_page);
        if start < self.base || start + bytes > self.base + self.len as u64 {
            return Err(format!("release event {r} falls outside the replay arena"));
        }
        // SAFETY: the range lies inside our own arena (checked above) and is
        // page-aligned; no Rust object lives there, and leases on it only
        // hold registrations.
        let fresh =
            unsafe { crate::pages::map_at(start, bytes, libc::MAP_FIXED | libc::MAP_NORESERVE, libc::PROT_READ | libc::PROT_WRITE) };
        fresh.map_err(|errno| format!("cannot remap {r} in the arena: {}", std::io::Error::from_raw_os_error(errno)))?;
        Ok(())
    }
}

impl Drop for RealMemory {
    fn drop(&mut self) {
        // SAFETY: our own mapping; its owner drops it after every lease on it.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::{Check, Ending, Environment};
    use crate::registrar::TestRegistrar;
    use mrcache::registrar::counting::CountingRegistrar;
    use mrcache::{Cache, CacheConfig, Faults};
    use mrcache_model::Config;
    use mrcache_types::{Access, ReleaseKind};

    /// A trace far from any real mapping: acquire, release, the memory
    /// released, acquired again (a miss: the event invalidated the entry).
    fn ops() -> Vec<Op> {
        let (addr, len, access) = (0x7e00_0000_1000, 3 * 4096, Access::LOCAL_WRITE);
        vec![
            Op::Acquire { lease: 1, addr, len, access },
            Op::Release { lease: 1 },
            Op::ReleaseEvent { kind: ReleaseKind::Munmap, addr, len },
            Op::Acquire { lease: 2, addr: addr + 4096, len: 4096, access },
        ]
    }

    fn run(faults: Faults, ending: Ending) -> Result<Ret, crate::Divergence> {
        let ops = ops();
        let mem = RealMemory::map(&ops, 4096).unwrap();
        let config = Config::default();
        let mut cc = CacheConfig::explicit_with(config);
        cc.faults = faults;
        let cache = Cache::new(TestRegistrar::new(CountingRegistrar::default()), cc);
        let mut env = Environment::new(&cache, config).real_memory(&mem);
        let mut last = Ret::Done;
        for op in &ops {
            last = env.step(op)?;
        }
        // The registration lies in the arena, the judged outcome in the trace.
        let held = cache.cached_views();
        assert!(held.iter().all(|v| mem.relocate(&Op::Free { addr: v.addr, len: v.len }).is_none()), "{held:?}");
        env.finish_with(ending)?;
        Ok(last)
    }

    #[test]
    fn judged_in_the_trace_coordinates_and_released_for_real() {
        let Ret::Granted { reg, hit, .. } = run(Faults::default(), Ending::Drain).unwrap() else { panic!() };
        assert_eq!((reg.addr, hit), (0x7e00_0000_2000, false));
        run(Faults::default(), Ending::AsRecorded).unwrap();
        // With the monitor off the event is ignored: the released entry
        // stays registered past the op (L1; the next acquire would hit it,
        // P2).
        let mut off = Faults::default();
        off.monitor_off = true;
        let d = run(off, Ending::Drain).unwrap_err();
        assert_eq!((d.check, d.index), (Check::Effects, 2), "{d}");
        assert!(d.message.contains("L1"), "{d}");
        assert_eq!(d.op, ops()[2], "the divergence names the trace's op");
    }

    #[test]
    fn an_op_outside_the_plan_is_the_harness_s_failure() {
        let mem = RealMemory::map(&ops(), 4096).unwrap();
        let config = Config::default();
        let cache = Cache::new(TestRegistrar::new(CountingRegistrar::default()), CacheConfig::explicit_with(config));
        let mut env = Environment::new(&cache, config).real_memory(&mem);
        let far = Op::Acquire { lease: 1, addr: 0x1000, len: 4096, access: Access::LOCAL_READ };
        let d = env.step(&far).unwrap_err();
        assert_eq!(d.check, Check::Harness);
        assert_eq!(d.message, format!("`{far}` cannot be relocated"));
        let r = Range::new(0x7e00_0000_1000, 4096).unwrap();
        let moved = mem.relocate(&Op::Free { addr: r.addr, len: r.len }).and_then(|o| o.range()?.ok()).unwrap();
        assert_ne!(moved, r);
        assert_eq!(mem.original(moved), r);
    }
}
