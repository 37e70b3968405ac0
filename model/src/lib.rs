//! The reference model of spec.md: pure, deterministic, no I/O, no unsafe.
//!
//! [`Model`] is a sequential state machine over the spec's state (S4): page
//! generations (the physical truth), registrations, cache entries, leases.
//! It offers two things:
//! - [`Model::step`] (and [`SequentialSpec::invoke`](stateright::semantics::SequentialSpec::invoke)): the model's own
//!   canonical outcome for an [`Op`];
//! - [`Model::judge`] (and [`SequentialSpec::is_valid_step`](stateright::semantics::SequentialSpec::is_valid_step)): given the
//!   outcome another implementation returned, say whether the contract allows
//!   it under the configured policy, name the rule it breaks if not, and
//!   follow the observed choice if it is allowed.
//!
//! Invariants (checked by [`Model::check_invariants`] after every step):
//! - every findable entry is fresh: the page generations it pinned are current (P2);
//! - a registration with leases is registered (P3), and a registration is
//!   deregistered exactly once (P4): it moves from `regs` to `awaiting_dereg`
//!   once and never comes back;
//! - after every op, for each limit: the cached entries are within it, or every
//!   cached entry is leased (P5);
//! - no registration that is neither findable nor leased stays in `regs` (L1).

#![forbid(unsafe_code)]

pub mod props;

pub use mrcache_types::config::{Config, EvictionPolicy, Limits, OverlapPolicy};
pub use props::{Property, Violation};

use mrcache_types::{Access, LeaseId, Op, OpError, PageSpan, Range, RegView, RegistrarFailure, Ret, Stats};
use std::collections::{BTreeMap, BTreeSet};

/// A registration's identity: its creation order among cached registrations,
/// starting at 1 (spec.md#S1.3).
pub type RegId = u64;

/// A registration the model holds (spec.md#S1.3, S1.5).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Registration {
    pub id: RegId,
    pub span: PageSpan,
    pub access: Access,
    /// The release-event sequence number when it was registered: it pinned
    /// the frames mapped after every event up to this one (physical truth).
    pub registered_at: u64,
    /// In the lookup structure: future acquires may hit it.
    pub findable: bool,
    pub leases: u32,
    /// Logical time of the last acquire or release that used it (LRU).
    pub last_use: u64,
    /// GreedyDual-Size priority (cost-aware eviction).
    pub priority: u64,
}

/// What the model did to the registrar: the part of an outcome that is not
/// in [`Ret`] because its timing may legitimately differ (spec.md#S2.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Effect {
    Register {
        view: RegView,
    },
    Deregister {
        view: RegView,
        reason: DeregReason,
    },
    /// Dropped without a registrar call: the child after fork (S2.6).
    Forget {
        view: RegView,
    },
}

/// Why a registration was deregistered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeregReason {
    /// A release event invalidated it while unleased.
    Invalidated,
    /// Its last lease was released after it left the lookup.
    LastLease,
    /// A merged registration replaced it.
    Merged,
    /// no-merge-uncache-contained removed it.
    Uncached,
    Evicted,
    /// Evicted because the registrar reported ENOMEM/EAGAIN (S5.4).
    Pressure,
    Flushed,
    /// Forgotten by a fork child (no registrar call).
    Forgotten,
}

/// Whether a rejection is to carry its reason in words (`judge`), or only
/// its property (`follows`, which a serialization search calls thousands of
/// times, mostly on orders that fail).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Explain {
    Yes,
    No,
}

/// The choices an implementation may make where the contract allows several
/// outcomes. [`Model::step`] uses the canonical ones; [`Model::judge`] derives
/// them from the observed [`Ret`].
#[derive(Clone, Copy, Debug, Default)]
struct Choice {
    /// Serve a hit from this entry instead of the canonical one.
    hit: Option<RegId>,
    /// The registrar failed first with ENOMEM/EAGAIN; the retry succeeded.
    pressure: bool,
    /// The registrar failed (after its retry, for ENOMEM/EAGAIN).
    fail: Option<OpError>,
}

/// The reference model. `Clone + Hash + Eq` so that the checker can keep it in
/// its states.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Model {
    pub config: Config,
    /// Physical truth: the release events that may still matter, as (pages,
    /// sequence number). Events older than every live registration are
    /// pruned, so this stays as small as the set of live registrations needs.
    events: Vec<(PageSpan, u64)>,
    /// Sequence number of the last release event.
    event_seq: u64,
    /// E6 is an allowed outcome only in concurrent histories (S9).
    concurrent: bool,
    /// Pressure trims are ops of their own in the history ([`Model::trims_logged`]).
    trims_logged: bool,
    /// Registrations still registered.
    regs: BTreeMap<RegId, Registration>,
    leases: BTreeMap<LeaseId, RegId>,
    /// Leases taken before a fork: their release is a no-op in the child (S2.6).
    orphan_leases: BTreeSet<LeaseId>,
    /// Deregistered by the model, not yet confirmed by an observed
    /// implementation (see [`Model::observe_deregister`]).
    awaiting_dereg: BTreeMap<RegId, RegView>,
    /// Why each deregistered registration went, so a judge can name the rule a
    /// later hit on it breaks.
    retired: BTreeMap<RegId, DeregReason>,
    next_id: RegId,
    clock: u64,
    /// GreedyDual-Size inflation value.
    gds_floor: u64,
    stats: Stats,
    effects: Vec<Effect>,
    /// Open release windows (spec.md#S2.9), a multiset in opening order: a
    /// miss whose registration overlaps one is served but not cached.
    windows: Vec<PageSpan>,
}

impl Model {
    /// A model for `config`. Panics only if `config` is invalid: call
    /// [`Config::validate`] first on untrusted configurations.
    pub fn new(config: Config) -> Model {
        if let Err(e) = config.validate() {
            panic!("invalid model config: {e}");
        }
        Model {
            config,
            events: Vec::new(),
            event_seq: 0,
            concurrent: false,
            trims_logged: false,
            regs: BTreeMap::new(),
            leases: BTreeMap::new(),
            orphan_leases: BTreeSet::new(),
            awaiting_dereg: BTreeMap::new(),
            retired: BTreeMap::new(),
            next_id: 1,
            clock: 0,
            gds_floor: 0,
            stats: Stats::default(),
            effects: Vec::new(),
            windows: Vec::new(),
        }
    }

    /// A model judging a concurrent history: E6 (retries exhausted) becomes an
    /// allowed outcome of a miss (S9).
    pub fn concurrent(mut self) -> Model {
        self.concurrent = true;
        self
    }

    /// A model judging a history that logs the trim an acquire performs on
    /// ENOMEM/EAGAIN as a `trim` op of its own (S5.4: it linearizes apart from
    /// the acquire), so an acquire's `pressure` flag evicts nothing here and
    /// may come with a hit (A8).
    pub fn trims_logged(mut self) -> Model {
        self.trims_logged = true;
        self
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Effects since the last call, oldest first.
    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    pub fn registrations(&self) -> impl Iterator<Item = &Registration> {
        self.regs.values()
    }

    pub fn lease(&self, lease: LeaseId) -> Option<&Registration> {
        self.leases.get(&lease).and_then(|id| self.regs.get(id))
    }

    pub fn leases_held(&self) -> usize {
        self.leases.len() + self.orphan_leases.len()
    }

    pub fn view(&self, r: &Registration) -> RegView {
        let b = r.span.bytes(self.config.page_size);
        RegView { id: r.id, addr: b.addr, len: b.len, access: r.access }
    }

    /// The model's canonical outcome for `op`.
    pub fn step(&mut self, op: &Op) -> Ret {
        self.apply(op, Choice::default())
    }

    //= spec.md#S9
    /// Judges an observed outcome. On success the model has followed it; on
    /// failure the model is unchanged and the violated rule is named.
    pub fn judge(&mut self, op: &Op, observed: &Ret) -> Result<(), Violation> {
        let choice = self.choice_for(op, observed, Explain::Yes)?;
        let mut next = self.clone();
        let expected = next.apply(op, choice);
        if expected != *observed {
            return Err(self.explain_mismatch(op, observed, &expected));
        }
        *self = next;
        Ok(())
    }

    /// `judge`'s verdict alone, on a model the caller throws away on
    /// `false` (as a serialization search does): no copy, and no message
    /// for a rejection. On `true` the model has followed the outcome, and
    /// keeps no effects (a search copies the model at every step, and has
    /// no use for them).
    pub fn follows(&mut self, op: &Op, observed: &Ret) -> bool {
        let Ok(choice) = self.choice_for(op, observed, Explain::No) else { return false };
        let follows = self.apply(op, choice) == *observed;
        self.effects.clear();
        follows
    }

    /// Derives the implementation's choices from its outcome, rejecting those
    /// the contract does not allow (with the reason in words if `explain`).
    fn choice_for(&self, op: &Op, observed: &Ret, explain: Explain) -> Result<Choice, Violation> {
        let reject = |property: Property, detail: &dyn Fn() -> String| {
            Violation::new(property, if explain == Explain::Yes { detail() } else { String::new() })
        };
        let Op::Acquire { addr, len, access, .. } = *op else {
            return Ok(Choice::default());
        };
        let Ok(range) = Range::new(addr, len) else {
            return Ok(Choice::default());
        };
        let span = range.pages(self.config.page_size);
        let canonical = self.lookup(span, access);
        match *observed {
            Ret::Granted { reg, hit: true, pressure } => {
                let Some(r) = self.regs.get(&reg.id) else {
                    let (prop, why) = match self.retired.get(&reg.id) {
                        Some(DeregReason::Invalidated) => {
                            //= spec.md#P2
                            (Property::P2, "a release event invalidated it: its frames are stale")
                        }
                        //= spec.md#P3
                        Some(DeregReason::LastLease) => (Property::P3, "it was deregistered"),
                        //= spec.md#C1
                        Some(DeregReason::Forgotten) => (Property::C1, "a fork forgot it"),
                        //= spec.md#P5
                        Some(DeregReason::Evicted) => (Property::P5, "the limits evicted it"),
                        //= spec.md#C3
                        Some(DeregReason::Pressure) => (Property::C3, "registrar pressure evicted it"),
                        Some(DeregReason::Merged | DeregReason::Uncached) => {
                            //= spec.md#C2
                            (Property::C2, "the overlap policy removed it")
                        }
                        Some(DeregReason::Flushed) => (Property::C1, "a flush removed it"),
                        //= spec.md#P1
                        None => (Property::P1, "it was never created"),
                    };
                    return Err(reject(prop, &|| format!("hit on R{}, but {why}", reg.id)));
                };
                if pressure && !self.trims_logged {
                    return Err(reject(Property::C3, &|| {
                        format!("hit on R{} reports a pressure eviction, which only a miss can cause", reg.id)
                    }));
                }
                if !r.findable {
                    let stale = !self.is_fresh(r);
                    return Err(reject(if stale { Property::P2 } else { Property::C1 }, &|| {
                        format!(
                            "hit on {} which left the lookup{}",
                            self.view(r),
                            if stale { " and holds frames no longer mapped" } else { "" }
                        )
                    }));
                }
                if !r.span.contains(&span) || !r.access.suffices_for(access) {
                    return Err(reject(Property::P1, &|| format!("{} does not cover {range} with {access}", self.view(r))));
                }
                Ok(Choice { hit: Some(reg.id), pressure, ..Choice::default() })
            }
            Ret::Granted { hit: false, pressure, .. } => {
                if let Some(id) = canonical {
                    return Err(reject(Property::C1, &|| {
                        format!("miss although {} covers {range} with {access}", self.view(&self.regs[&id]))
                    }));
                }
                Ok(Choice { pressure, ..Choice::default() })
            }
            Ret::Failed { error: OpError::RetriesExhausted } if !self.concurrent => Err(reject(
                //= spec.md#C4
                Property::C4,
                &|| "E6 (retries exhausted) needs a concurrent release event: impossible in a sequential history".into(),
            )),
            Ret::Failed {
                error: OpError::Registrar { failure: failure @ (RegistrarFailure::NoMemory | RegistrarFailure::Again), pressure: false },
            } => Err(reject(Property::C4, &|| format!("E5 {failure:?} without the pressure eviction and retry S5.4 requires"))),
            Ret::Failed { error: e @ (OpError::Registrar { .. } | OpError::RetriesExhausted) } => {
                if let Some(id) = canonical {
                    return Err(reject(Property::C1, &|| format!("error `{e}` although R{id} covers {range}: a hit needs no registrar")));
                }
                Ok(Choice { fail: Some(e), ..Choice::default() })
            }
            _ => Ok(Choice::default()),
        }
    }

    fn explain_mismatch(&self, op: &Op, observed: &Ret, expected: &Ret) -> Violation {
        let (prop, why) = match (observed, expected) {
            (Ret::Granted { reg: o, .. }, Ret::Granted { reg: e, .. }) => {
                let covers = Range::new(o.addr, o.len).ok().zip(op.range().and_then(Result::ok));
                match covers {
                    Some((reg, req)) if !reg.contains(&req) => (Property::P1, "the registration does not cover the request"),
                    _ if !o.access.suffices_for(e.access) && !e.access.suffices_for(o.access) => {
                        (Property::C2, "the access differs from the policy's")
                    }
                    _ if o.id != e.id => (Property::C2, "the registration is not the one the policy creates next"),
                    _ => (Property::C2, "the registered range differs from the overlap policy's"),
                }
            }
            (Ret::Failed { .. }, _) | (_, Ret::Failed { .. }) => (Property::C4, "the error differs from the contract's"),
            _ => (Property::C2, "the outcome differs from the contract's"),
        };
        Violation::new(prop, format!("{op}: observed `{observed}`, the contract gives `{expected}`: {why}"))
    }

    /// Confirms that an implementation deregistered `id` (spec.md#P3, P4).
    pub fn observe_deregister(&mut self, id: RegId) -> Result<(), Violation> {
        if self.awaiting_dereg.remove(&id).is_some() {
            return Ok(());
        }
        match self.regs.get(&id) {
            Some(r) if r.leases > 0 => {
                Err(Violation::new(Property::P3, format!("{} deregistered while it holds {} lease(s)", self.view(r), r.leases)))
            }
            Some(r) => {
                Err(Violation::new(Property::C3, format!("{} deregistered while still cached and not due for eviction", self.view(r))))
            }
            None if id < self.next_id => {
                //= spec.md#P4
                Err(Violation::new(Property::P4, format!("R{id} deregistered a second time")))
            }
            None => Err(Violation::new(Property::P4, format!("R{id} deregistered but never registered"))),
        }
    }

    /// Registrations the model has deregistered that the implementation has not
    /// yet confirmed. Must be empty when an operation returns (spec.md#L1).
    pub fn pending_deregistrations(&self) -> Vec<RegView> {
        self.awaiting_dereg.values().copied().collect()
    }

    //= spec.md#S5.5
    fn lookup(&self, span: PageSpan, access: Access) -> Option<RegId> {
        //= spec.md#S2.1
        //# if a findable entry covers the request's pages with sufficient access,
        //# the lease is taken on it; the canonical choice is the oldest (lowest id)
        //# such entry
        self.regs.values().find(|r| r.findable && r.span.contains(&span) && r.access.suffices_for(access)).map(|r| r.id)
    }

    fn is_fresh(&self, r: &Registration) -> bool {
        !self.events.iter().any(|(span, seq)| *seq > r.registered_at && span.overlaps(&r.span))
    }

    fn apply(&mut self, op: &Op, choice: Choice) -> Ret {
        let ret = match *op {
            Op::Acquire { lease, addr, len, access } => self.acquire(lease, addr, len, access, choice),
            Op::Release { lease } => self.release(lease),
            Op::ReleaseEvent { addr, len, .. } => self.release_event(addr, len),
            Op::ReleaseBegin { addr, len } => self.release_begin(addr, len),
            Op::ReleaseEnd { addr, len } => self.release_end(addr, len),
            //= spec.md#S2.4
            Op::Alloc { .. } | Op::Free { .. } => Ret::Done,
            Op::Flush => self.flush(),
            Op::Trim => self.trim(),
            Op::Fork => self.fork(),
        };
        debug_assert_eq!(self.check_invariants(), Ok(()), "after {op}");
        ret
    }

    fn fail(&mut self, error: OpError) -> Ret {
        self.stats.errors += 1;
        Ret::Failed { error }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn touch(&mut self, id: RegId) {
        let now = self.tick();
        let floor = self.gds_floor;
        let page_size = self.config.page_size;
        let r = self.regs.get_mut(&id).expect("touch of a live registration");
        r.last_use = now;
        r.priority = floor + mrcache_types::config::per_page_cost_ns(r.span.count(), page_size);
    }

    //= spec.md#S2.1
    fn acquire(&mut self, lease: LeaseId, addr: u64, len: u64, access: Access, choice: Choice) -> Ret {
        self.stats.acquires += 1;
        let range = match Range::new(addr, len) {
            Ok(r) => r,
            Err(e) => return self.fail(e.into()),
        };
        if self.leases.contains_key(&lease) || self.orphan_leases.contains(&lease) {
            return self.fail(OpError::LeaseInUse { lease });
        }
        let span = range.pages(self.config.page_size);
        if let Some(id) = choice.hit.or_else(|| self.lookup(span, access)) {
            self.stats.hits += 1;
            self.grant(lease, id);
            let view = self.view(&self.regs[&id]);
            // `pressure` on a hit: only with trims logged (A8 after a trim).
            return Ret::Granted { reg: view, hit: true, pressure: choice.pressure };
        }
        // Miss. The registrar is called with the policy's range; on ENOMEM or
        // EAGAIN the cache trims and retries once (S5.4), unless the history
        // logs that trim as an op of its own.
        let trimmed = choice.pressure || matches!(choice.fail, Some(OpError::Registrar { pressure: true, .. }));
        if trimmed && !self.trims_logged {
            self.trim();
        }
        if let Some(error) = choice.fail {
            return self.fail(error);
        }
        let (new_span, new_access, displaced) = self.plan_miss(span, access);
        self.stats.misses += 1;
        let id = self.register(new_span, new_access);
        self.grant(lease, id);
        let reason = match self.config.policy {
            OverlapPolicy::Merge => DeregReason::Merged,
            _ => DeregReason::Uncached,
        };
        for old in displaced {
            match reason {
                DeregReason::Merged => self.stats.merges += 1,
                _ => self.stats.uncached += 1,
            }
            self.uncache(old, reason);
        }
        //= spec.md#S2.9
        //# A miss whose registration overlaps an open window is served but not
        //# cached
        if self.windows.iter().any(|w| w.overlaps(&new_span)) {
            self.stats.uncached += 1;
            self.uncache(id, DeregReason::Uncached);
        }
        self.enforce_limits();
        let view = self.view(&self.regs[&id]);
        Ret::Granted { reg: view, hit: false, pressure: choice.pressure }
    }

    //= spec.md#S6.1
    /// The registration a miss creates, and the entries it displaces.
    fn plan_miss(&self, span: PageSpan, access: Access) -> (PageSpan, Access, Vec<RegId>) {
        let chunk = self.config.chunk_pages;
        let mut new_span = span.align(chunk);
        let mut new_access = access;
        let mut displaced = Vec::new();
        match self.config.policy {
            OverlapPolicy::Independent => {}
            OverlapPolicy::Merge => {
                // Grow to the union of every overlapping findable entry, until
                // nothing more overlaps. Each round adds an entry, so it ends.
                loop {
                    let more: Vec<&Registration> =
                        self.regs.values().filter(|r| r.findable && !displaced.contains(&r.id) && r.span.overlaps(&new_span)).collect();
                    if more.is_empty() {
                        break;
                    }
                    for r in more {
                        new_span = new_span.union(&r.span).align(chunk);
                        new_access = new_access | r.access;
                        displaced.push(r.id);
                    }
                }
            }
            OverlapPolicy::NoMergeUncacheContained => {
                for r in self.regs.values() {
                    if r.findable && (new_span.contains(&r.span) || r.span.contains(&new_span)) {
                        // The new registration keeps the rights of what it
                        // displaces, so requests that differ only in access
                        // stop displacing each other.
                        new_access = new_access | r.access;
                        displaced.push(r.id);
                    }
                }
            }
        }
        (new_span, new_access, displaced)
    }

    fn register(&mut self, span: PageSpan, access: Access) -> RegId {
        let id = self.next_id;
        self.next_id += 1;
        let bytes = span.count() * self.config.page_size;
        self.regs.insert(
            id,
            Registration { id, span, access, registered_at: self.event_seq, findable: true, leases: 0, last_use: 0, priority: 0 },
        );
        self.stats.registrations += 1;
        self.stats.bytes_registered = self.stats.bytes_registered.saturating_add(bytes);
        self.stats.pinned_bytes = self.stats.pinned_bytes.saturating_add(bytes);
        self.stats.peak_pinned_bytes = self.stats.peak_pinned_bytes.max(self.stats.pinned_bytes);
        self.stats.cached_entries += 1;
        let view = self.view(&self.regs[&id]);
        self.effects.push(Effect::Register { view });
        id
    }

    fn grant(&mut self, lease: LeaseId, id: RegId) {
        self.regs.get_mut(&id).expect("grant on a live registration").leases += 1;
        self.leases.insert(lease, id);
        self.touch(id);
    }

    /// Takes an entry out of the lookup; deregisters it now if unleased, else
    /// when its last lease is released (spec.md#S3.2).
    //= spec.md#S3.2
    fn uncache(&mut self, id: RegId, reason: DeregReason) {
        self.retired.insert(id, reason);
        let r = self.regs.get_mut(&id).expect("uncache of a live registration");
        debug_assert!(r.findable);
        r.findable = false;
        self.stats.cached_entries -= 1;
        if r.leases == 0 {
            self.deregister(id, reason);
        } else {
            self.stats.deferred_deregistrations += 1;
        }
    }

    fn deregister(&mut self, id: RegId, reason: DeregReason) {
        let r = self.regs.remove(&id).expect("deregister of a live registration");
        let view = self.view(&r);
        self.stats.deregistrations += 1;
        self.stats.pinned_bytes -= view.len;
        self.awaiting_dereg.insert(id, view);
        self.retired.entry(id).or_insert(reason);
        self.effects.push(Effect::Deregister { view, reason });
    }

    //= spec.md#S2.2
    fn release(&mut self, lease: LeaseId) -> Ret {
        self.stats.releases += 1;
        if self.orphan_leases.remove(&lease) {
            return Ret::Done;
        }
        let Some(id) = self.leases.remove(&lease) else {
            return self.fail(OpError::UnknownLease { lease });
        };
        let r = self.regs.get_mut(&id).expect("a held lease names a live registration");
        r.leases -= 1;
        if r.findable {
            self.touch(id);
        } else if r.leases == 0 {
            self.deregister(id, DeregReason::LastLease);
        }
        self.enforce_limits();
        Ret::Done
    }

    //= spec.md#S2.3
    //= spec.md#S5.2
    //= spec.md#S5.3
    fn release_event(&mut self, addr: u64, len: u64) -> Ret {
        self.stats.release_events += 1;
        let range = match Range::new(addr, len) {
            Ok(r) => r,
            Err(e) => return self.fail(e.into()),
        };
        let span = range.pages(self.config.page_size);
        self.event_seq += 1;
        self.events.push((span, self.event_seq));
        let hit: Vec<RegId> = self.regs.values().filter(|r| r.findable && r.span.overlaps(&span)).map(|r| r.id).collect();
        for id in hit {
            self.stats.invalidations += 1;
            if self.regs[&id].leases > 0 {
                self.stats.leased_invalidations += 1;
            }
            self.uncache(id, DeregReason::Invalidated);
        }
        self.prune_events();
        Ret::Done
    }

    //= spec.md#S2.9
    /// A hook before a release: the release event's effect now (S2.3), and a
    /// window on its pages until the matching [`Model::release_end`].
    fn release_begin(&mut self, addr: u64, len: u64) -> Ret {
        let ret = self.release_event(addr, len);
        if ret == Ret::Done {
            let span = Range::new(addr, len).expect("checked by release_event").pages(self.config.page_size);
            self.windows.push(span);
        }
        ret
    }

    //= spec.md#S2.9
    /// Closes one window with exactly these pages; E7 if none is open.
    fn release_end(&mut self, addr: u64, len: u64) -> Ret {
        let range = match Range::new(addr, len) {
            Ok(r) => r,
            Err(e) => return self.fail(e.into()),
        };
        let span = range.pages(self.config.page_size);
        match self.windows.iter().position(|w| *w == span) {
            Some(i) => {
                self.windows.remove(i);
                Ret::Done
            }
            None => self.fail(OpError::UnmatchedReleaseEnd),
        }
    }

    /// Release windows open now (spec.md#S2.9).
    pub fn open_windows(&self) -> usize {
        self.windows.len()
    }

    /// Drops events no live registration can be stale by.
    fn prune_events(&mut self) {
        let oldest = self.regs.values().map(|r| r.registered_at).min().unwrap_or(self.event_seq);
        self.events.retain(|(_, seq)| *seq > oldest);
    }

    //= spec.md#S2.5
    fn flush(&mut self) -> Ret {
        let all: Vec<RegId> = self.regs.values().filter(|r| r.findable).map(|r| r.id).collect();
        for id in all {
            self.uncache(id, DeregReason::Flushed);
        }
        Ret::Done
    }

    //= spec.md#S2.6
    /// The child forgets every registration. The model then caches as
    /// before: its release events are operations, which the child sees. An
    /// implementation whose monitor does not follow the child caches nothing
    /// there until the child has one (the one allowed divergence, S2.6: C1 is
    /// not judged in such a child; P1-P5 hold as here).
    fn fork(&mut self) -> Ret {
        for (id, r) in std::mem::take(&mut self.regs) {
            let view = self.view(&r);
            self.retired.insert(id, DeregReason::Forgotten);
            self.stats.forgotten += 1;
            self.stats.pinned_bytes -= view.len;
            self.effects.push(Effect::Forget { view });
        }
        self.stats.cached_entries = 0;
        // The threads inside a window do not exist in the child.
        self.windows.clear();
        self.prune_events();
        let held = std::mem::take(&mut self.leases);
        self.orphan_leases.extend(held.into_keys());
        Ret::Done
    }

    fn cached_bytes(&self) -> u64 {
        self.regs.values().filter(|r| r.findable).fold(0u64, |sum, r| sum.saturating_add(r.span.count() * self.config.page_size))
    }

    fn over_limits(&self) -> bool {
        let l = &self.config.limits;
        l.max_regions.is_some_and(|m| self.stats.cached_entries > m) || l.max_pinned_bytes.is_some_and(|m| self.cached_bytes() > m)
    }

    //= spec.md#S6.3
    /// The next victim under the eviction policy, among unleased cached entries.
    fn victim(&self) -> Option<RegId> {
        let candidates = self.regs.values().filter(|r| r.findable && r.leases == 0);
        match self.config.eviction {
            EvictionPolicy::Lru => candidates.min_by_key(|r| (r.last_use, r.id)),
            EvictionPolicy::CostAware => candidates.min_by_key(|r| (r.priority, r.last_use, r.id)),
        }
        .map(|r| r.id)
    }

    //= spec.md#S6.4
    fn enforce_limits(&mut self) {
        while self.over_limits() {
            let Some(id) = self.victim() else { break };
            self.gds_floor = self.gds_floor.max(self.regs[&id].priority);
            self.stats.evictions += 1;
            self.uncache(id, DeregReason::Evicted);
        }
    }

    //= spec.md#S2.8
    fn trim(&mut self) -> Ret {
        self.evict_all_unleased();
        Ret::Done
    }

    fn evict_all_unleased(&mut self) {
        let all: Vec<RegId> = self.regs.values().filter(|r| r.findable && r.leases == 0).map(|r| r.id).collect();
        for id in all {
            self.stats.pressure_evictions += 1;
            self.uncache(id, DeregReason::Pressure);
        }
    }

    //= spec.md#L1
    /// At the end of an operation (sequential use), every registration the
    /// model deregistered must have been confirmed by the implementation.
    pub fn check_quiescent(&self) -> Result<(), Violation> {
        match self.awaiting_dereg.values().next() {
            None => Ok(()),
            Some(v) => Err(Violation::new(
                Property::L1,
                format!("{v} is neither findable nor leased and still registered after the operation returned"),
            )),
        }
    }

    /// Checks the model's own invariants (module docs). Used after every step
    /// in debug builds and by the checker.
    pub fn check_invariants(&self) -> Result<(), Violation> {
        for r in self.regs.values() {
            if r.findable && !self.is_fresh(r) {
                return Err(Violation::new(Property::P2, format!("findable R{} is stale", r.id)));
            }
            if !r.findable && r.leases == 0 {
                return Err(Violation::new(Property::L1, format!("R{} is uncached, unleased, still registered", r.id)));
            }
        }
        if self.over_limits() && self.victim().is_some() {
            return Err(Violation::new(Property::P5, "over a limit with an unleased entry cached".into()));
        }
        let leased: u32 = self.regs.values().map(|r| r.leases).sum();
        if leased as usize != self.leases.len() {
            return Err(Violation::new(Property::P3, "lease counts disagree with held leases".into()));
        }
        Ok(())
    }
}

impl stateright::semantics::SequentialSpec for Model {
    type Op = Op;
    type Ret = Ret;

    fn invoke(&mut self, op: &Op) -> Ret {
        self.step(op)
    }

    /// stateright's testers call it on a copy they drop on `false`.
    fn is_valid_step(&mut self, op: &Op, ret: &Ret) -> bool {
        self.follows(op, ret)
    }
}

#[cfg(test)]
mod tests;
