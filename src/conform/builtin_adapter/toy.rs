//! The toy backend (`mrcache adapter --toy [--break B]`): a deliberately
//! small cache, a list of entries under one mutex, invalidated explicitly
//! from the adapter's own memory commands. It is correct without `--break`
//! and breaks one rule per [`ToyBreak`] given; the tests check that each
//! break fails exactly the cases listed in conformance/expected/.
//!
//! Invariant (without a break): an entry is findable only while no release
//! event since its registration overlaps it, and is deregistered exactly
//! once, never while leased; the registrar is never called under the toy's
//! lock. Above [`super::protocol`] and
//! [`super::registrar`].

use super::protocol::{Backend, OpResult, PAGE};
use super::registrar::EmitRegistrar;
use mrcache::registrar::Registrar;
use mrcache_model::Limits;
use mrcache_types::{Access, LeaseId, PageSpan, Range};
use serde_json::json;
use std::collections::HashMap;
use std::sync::Mutex;

/// The rules the toy can break (`--break`, repeatable).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToyBreak {
    /// Release events are ignored.
    NoInvalidation,
    /// A hit ignores the access asked for.
    AccessIgnored,
    /// A release event deregisters leased entries at once.
    DeregWhileLeased,
    /// The last release of an invalidated entry deregisters it twice.
    DeregTwice,
    /// A release event removes only the entries whose first page it frees.
    HitPartiallyFreed,
    /// Registrations round the request's pages inwards.
    NoRounding,
    /// Declares `merge` but registers independently.
    WrongPolicy,
    /// Declares the limits but never evicts.
    NoLimits,
    /// A fork child keeps the parent's entries.
    ForkKeeps,
    /// No re-check after the registrar returns: neither for release events
    /// (S3.7, A7) nor for an entry another thread inserted (A8).
    NoRecheck,
    /// The monitor hook runs before the release (S1.8).
    HookBeforeRelease,
    /// A release event also invalidates the entries that merely touch it
    /// (its end taken as inclusive).
    InclusiveEnd,
    /// Wasted work: every miss first registers the range once for nothing
    /// (and deregisters it at once). Every case passes; the report's
    /// `extra` column counts them.
    RedundantRegister,
    /// Deferred deregistration: an entry a release event invalidates is
    /// deregistered at the next acquire, not at once (beyond the declared
    /// `l1_bound` unless `--no-l1-bound`).
    DeferredDereg,
    /// The cache lock is held across the registrar, and the monitor hook
    /// takes it: a registrar that releases memory deadlocks on itself, and
    /// a fork child of a thread inside the registrar waits for a lock no
    /// thread of its own holds (the shape of libfabric's memhooks
    /// deadlocks).
    LockAcrossRegister,
    /// Every release event is queued whole and applied only at the next
    /// cache operation: with no operation between them, what pending
    /// invalidations hold grows with the number of events (L2; UCX 1.13's
    /// invalidation queue).
    UnboundedQueue,
    /// A destroy goes ahead while leases are held and deregisters every
    /// registration, the leased ones too.
    DestroyLeased,
}

/// The most release events the toy keeps for its re-check before it
/// collapses them into their hull (spec.md L2's `max_unreleased`).
const EVENTS_BOUND: usize = 1024;

/// The toy cache: a list of entries under one mutex.
pub(super) struct Toy {
    brk: Vec<ToyBreak>,
    chunk_pages: u64,
    limits: Limits,
    st: Mutex<ToySt>,
    reg: EmitRegistrar,
    /// The lock `LockAcrossRegister` holds across the registrar.
    big: Mutex<()>,
    /// The events `UnboundedQueue` has not applied yet.
    queued: Mutex<Vec<(u64, u64)>>,
}

struct ToyEntry {
    id: u64,
    span: PageSpan,
    access: Access,
    findable: bool,
    leases: u32,
    last_use: u64,
}

#[derive(Default)]
struct ToySt {
    entries: Vec<ToyEntry>,
    leases: HashMap<LeaseId, u64>,
    /// Leases held at a fork: their release is a no-op in the child (S2.6).
    orphans: Vec<LeaseId>,
    /// Release events applied while a registration was in flight, each
    /// with its number (the re-check of A7 compares against them): emptied
    /// whenever none is in flight, and bounded (L2) by collapsing into their
    /// hull, numbered as the newest (conservative: a registration in flight
    /// then retries).
    events: Vec<(u64, PageSpan)>,
    /// Release events applied so far.
    total: u64,
    /// Registrations in flight (the registrar runs without the lock).
    in_flight: usize,
    /// Destroyed, and not created again.
    destroyed: bool,
    clock: u64,
    /// Deregistrations put off to the next acquire (`DeferredDereg`).
    owed: Vec<u64>,
}

impl ToySt {
    /// The first findable entry covering `span` with enough access (any
    /// access under `AccessIgnored`): the hit of A1 and the recheck of A8.
    fn covering_mut(&mut self, span: PageSpan, access: Access, ignore_access: bool) -> Option<&mut ToyEntry> {
        self.entries.iter_mut().find(|e| e.findable && e.span.contains(&span) && (ignore_access || e.access.suffices_for(access)))
    }
}

impl Toy {
    /// A toy breaking each of `brk`, widening registrations to `chunk_pages`.
    pub(super) fn new(brk: Vec<ToyBreak>, chunk_pages: u64, limits: Limits) -> Toy {
        Toy {
            brk,
            chunk_pages,
            limits,
            st: Mutex::new(ToySt::default()),
            reg: EmitRegistrar::new(),
            big: Mutex::new(()),
            queued: Mutex::new(Vec::new()),
        }
    }

    fn is(&self, b: ToyBreak) -> bool {
        self.brk.contains(&b)
    }

    fn span(&self, addr: u64, len: u64) -> Result<PageSpan, (String, i32)> {
        let r = Range::new(addr, len).map_err(|e| (e.to_string(), 0))?;
        let s = r.pages(PAGE);
        if self.is(ToyBreak::NoRounding) {
            // Inwards: the first whole page on, at least one page.
            let first = addr.div_ceil(PAGE);
            let end = ((addr + len) / PAGE).max(first + 1);
            return Ok(PageSpan { first, end });
        }
        Ok(s)
    }

    /// The monitor hook: a release event.
    fn hook(&self, addr: u64, len: u64) {
        let _big = self.is(ToyBreak::LockAcrossRegister).then(|| self.big.lock().unwrap_or_else(|e| e.into_inner()));
        if self.is(ToyBreak::UnboundedQueue) {
            self.queued.lock().unwrap_or_else(|e| e.into_inner()).push((addr, len));
            return;
        }
        self.invalidate(addr, len);
    }

    /// `UnboundedQueue`: applies the queued events (at each cache operation).
    fn apply_queued(&self) {
        let q = std::mem::take(&mut *self.queued.lock().unwrap_or_else(|e| e.into_inner()));
        for (a, l) in q {
            self.invalidate(a, l);
        }
    }

    fn invalidate(&self, addr: u64, len: u64) {
        if self.is(ToyBreak::NoInvalidation) {
            return;
        }
        let Ok(r) = Range::new(addr, len) else { return };
        let span = r.pages(PAGE);
        let mut st = self.st.lock().unwrap_or_else(|e| e.into_inner());
        st.total += 1;
        let n = st.total;
        if st.in_flight == 0 {
            st.events.clear();
        } else if st.events.len() >= EVENTS_BOUND {
            let hull = st.events.iter().fold(span, |h, (_, s)| PageSpan { first: h.first.min(s.first), end: h.end.max(s.end) });
            st.events.clear();
            st.events.push((n, hull));
        }
        st.events.push((n, span));
        let mut gone = Vec::new();
        for e in st.entries.iter_mut().filter(|e| e.findable) {
            let hit = if self.is(ToyBreak::HitPartiallyFreed) {
                span.first <= e.span.first && e.span.first < span.end
            } else if self.is(ToyBreak::InclusiveEnd) {
                span.first <= e.span.end && e.span.first <= span.end
            } else {
                e.span.overlaps(&span)
            };
            if hit {
                e.findable = false;
                if e.leases == 0 || self.is(ToyBreak::DeregWhileLeased) {
                    gone.push(e.id);
                }
            }
        }
        st.entries.retain(|e| !(e.leases == 0 && gone.contains(&e.id)));
        if self.is(ToyBreak::DeferredDereg) {
            st.owed.append(&mut gone);
        }
        drop(st);
        for id in gone {
            let _ = self.reg.deregister(id);
        }
    }

    /// Evicts LRU unleased findable entries while over a limit.
    fn enforce(&self, st: &mut ToySt) -> Vec<u64> {
        let mut out = Vec::new();
        if self.is(ToyBreak::NoLimits) {
            return out;
        }
        loop {
            let cached: Vec<&ToyEntry> = st.entries.iter().filter(|e| e.findable).collect();
            let bytes: u64 = cached.iter().map(|e| e.span.count() * PAGE).sum();
            let over =
                self.limits.max_regions.is_some_and(|m| cached.len() as u64 > m) || self.limits.max_pinned_bytes.is_some_and(|m| bytes > m);
            if !over {
                return out;
            }
            let Some(v) = cached.iter().filter(|e| e.leases == 0).min_by_key(|e| (e.last_use, e.id)).map(|e| e.id) else {
                return out;
            };
            st.entries.retain(|e| e.id != v);
            out.push(v);
        }
    }
}

impl Backend for Toy {
    fn acquire(&self, lease: LeaseId, addr: u64, len: u64, access: Access) -> OpResult {
        let span = self.span(addr, len)?;
        self.apply_queued();
        let _big = self.is(ToyBreak::LockAcrossRegister).then(|| self.big.lock().unwrap_or_else(|e| e.into_inner()));
        let owed = std::mem::take(&mut self.st.lock().unwrap_or_else(|e| e.into_inner()).owed);
        for id in owed {
            let _ = self.reg.deregister(id);
        }
        loop {
            let mut st = self.st.lock().unwrap_or_else(|e| e.into_inner());
            if st.destroyed {
                return Err(("the cache is destroyed".into(), libc::EINVAL));
            }
            st.clock += 1;
            let now = st.clock;
            let ignore_access = self.is(ToyBreak::AccessIgnored);
            if let Some(e) = st.covering_mut(span, access, ignore_access) {
                e.leases += 1;
                e.last_use = now;
                let id = e.id;
                st.leases.insert(lease, id);
                return Ok(json!({"reg": id, "hit": true}));
            }
            let seen = st.total;
            st.in_flight += 1;
            drop(st);
            let reg_span = span.align(self.chunk_pages);
            let range = reg_span.bytes(PAGE);
            if self.is(ToyBreak::RedundantRegister) {
                let waste = self.reg.register(range, access).map_err(|e| (e.to_string(), e.errno))?;
                let _ = self.reg.deregister(waste);
            }
            let id = self.reg.register(range, access);
            let mut st = self.st.lock().unwrap_or_else(|e| e.into_inner());
            st.in_flight -= 1;
            let id = id.map_err(|e| (e.to_string(), e.errno))?;
            // A8: another thread cached a covering entry meanwhile: use it.
            let now = st.clock + 1;
            if !self.is(ToyBreak::NoRecheck) {
                if let Some(e) = st.covering_mut(span, access, ignore_access) {
                    e.leases += 1;
                    e.last_use = now;
                    let hit = e.id;
                    st.clock = now;
                    st.leases.insert(lease, hit);
                    drop(st);
                    let _ = self.reg.deregister(id);
                    return Ok(json!({"reg": hit, "hit": true}));
                }
            }
            let stale = st.events.iter().any(|(n, s)| *n > seen && s.overlaps(&reg_span));
            if stale && !self.is(ToyBreak::NoRecheck) {
                drop(st);
                let _ = self.reg.deregister(id);
                continue;
            }
            st.clock += 1;
            let now = st.clock;
            st.entries.push(ToyEntry { id, span: reg_span, access, findable: true, leases: 1, last_use: now });
            st.leases.insert(lease, id);
            let evicted = self.enforce(&mut st);
            drop(st);
            for v in evicted {
                let _ = self.reg.deregister(v);
            }
            return Ok(json!({"reg": id, "hit": false}));
        }
    }
    fn release(&self, lease: LeaseId) -> OpResult {
        self.apply_queued();
        let mut st = self.st.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = st.orphans.iter().position(|l| *l == lease) {
            st.orphans.remove(i);
            return Ok(json!({}));
        }
        let Some(id) = st.leases.remove(&lease) else { return Err((format!("unknown lease {lease}"), 0)) };
        st.clock += 1;
        let now = st.clock;
        let mut dereg = 0;
        if let Some(pos) = st.entries.iter().position(|e| e.id == id) {
            let e = &mut st.entries[pos];
            e.leases -= 1;
            e.last_use = now;
            if !e.findable && e.leases == 0 {
                st.entries.remove(pos);
                if !self.is(ToyBreak::DeregWhileLeased) {
                    dereg = if self.is(ToyBreak::DeregTwice) { 2 } else { 1 };
                }
            }
        }
        let evicted = self.enforce(&mut st);
        drop(st);
        for _ in 0..dereg {
            let _ = self.reg.deregister(id);
        }
        for v in evicted {
            let _ = self.reg.deregister(v);
        }
        Ok(json!({}))
    }
    fn flush(&self) -> OpResult {
        self.apply_queued();
        let mut st = self.st.lock().unwrap_or_else(|e| e.into_inner());
        let mut gone = Vec::new();
        for e in st.entries.iter_mut().filter(|e| e.findable) {
            e.findable = false;
            if e.leases == 0 {
                gone.push(e.id);
            }
        }
        st.entries.retain(|e| !gone.contains(&e.id));
        drop(st);
        for id in gone {
            let _ = self.reg.deregister(id);
        }
        Ok(json!({}))
    }
    fn trim(&self) -> OpResult {
        self.apply_queued();
        let mut st = self.st.lock().unwrap_or_else(|e| e.into_inner());
        let gone: Vec<u64> = st.entries.iter().filter(|e| e.findable && e.leases == 0).map(|e| e.id).collect();
        st.entries.retain(|e| !gone.contains(&e.id));
        drop(st);
        for id in gone {
            let _ = self.reg.deregister(id);
        }
        Ok(json!({}))
    }
    fn destroy(&self) -> OpResult {
        self.apply_queued();
        let mut st = self.st.lock().unwrap_or_else(|e| e.into_inner());
        if st.destroyed {
            return Ok(json!({}));
        }
        if !st.leases.is_empty() && !self.is(ToyBreak::DestroyLeased) {
            return Err((format!("{} lease(s) are held", st.leases.len()), libc::EBUSY));
        }
        let gone: Vec<u64> = st.entries.drain(..).map(|e| e.id).collect();
        let held: Vec<LeaseId> = st.leases.drain().map(|(l, _)| l).collect();
        st.orphans.extend(held);
        st.destroyed = true;
        drop(st);
        for id in gone {
            let _ = self.reg.deregister(id);
        }
        Ok(json!({}))
    }
    fn create(&self) -> OpResult {
        self.st.lock().unwrap_or_else(|e| e.into_inner()).destroyed = false;
        Ok(json!({}))
    }
    fn before_release(&self, addr: u64, len: u64) {
        if self.is(ToyBreak::HookBeforeRelease) {
            self.hook(addr, len);
        }
    }
    fn after_release(&self, addr: u64, len: u64) {
        if !self.is(ToyBreak::HookBeforeRelease) {
            self.hook(addr, len);
        }
    }
    fn forked(&self) {
        if self.is(ToyBreak::ForkKeeps) {
            return;
        }
        // S2.6: forget everything without registrar calls; held leases are
        // orphans; a registration in flight belongs to a thread that does
        // not exist here.
        self.queued.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let mut st = self.st.lock().unwrap_or_else(|e| e.into_inner());
        st.entries.clear();
        st.in_flight = 0;
        let held: Vec<LeaseId> = st.leases.drain().map(|(l, _)| l).collect();
        st.orphans.extend(held);
    }
}
