//! The shared vocabulary of mrcache (spec.md §1, §2, §T).
//!
//! There is exactly one definition of [`Op`], [`Ret`], [`Range`], [`Access`],
//! [`Stats`] and the trace records. The reference model, the model checker, the
//! real cache's harness, the trace replayer and the conformance suite all use
//! these types, so an operation means the same thing everywhere.
//!
//! Invariants kept here:
//! - a [`Range`] is never empty and never wraps (`addr + len` fits in `u64`);
//! - page spans are computed only by [`Range::pages`] (the rounding rule S1.2).

#![forbid(unsafe_code)]

pub mod config;
#[cfg(any(test, feature = "testkit"))]
pub mod mutants;
pub mod trace;

use serde::{Deserialize, Serialize};
use std::fmt;

/// A caller-chosen name for a lease (spec.md#S1.6). Traces and tests name
/// leases so that a later `release` can refer to them.
//= spec.md#S1.6
pub type LeaseId = u64;

/// Default page size (x86-64 base pages).
pub const PAGE_SIZE: u64 = 4096;

//= spec.md#S1.2
/// No user address on a 64-bit Linux reaches 2^63; ranges must end at or below
/// it, so page and chunk arithmetic never overflows (page size ≤ 2^20 and
/// chunk ≤ 2^62 bytes).
pub const ADDRESS_LIMIT: u64 = 1 << 63;

//= spec.md#S1.2
/// A half-open byte range `[addr, addr + len)`; never empty, never wrapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Range {
    pub addr: u64,
    pub len: u64,
}

/// Why a byte range is not acceptable (spec.md#S2.1 preconditions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum RangeError {
    #[error("empty range at {addr:#x}: len is 0")]
    Empty { addr: u64 },
    #[error("range {addr:#x}+{len:#x} wraps or ends beyond the address space limit 2^63")]
    Wraps { addr: u64, len: u64 },
}

impl Range {
    /// Checks the preconditions of S2.1: `len > 0`, no wrap-around, and the
    /// end at or below [`ADDRESS_LIMIT`].
    pub fn new(addr: u64, len: u64) -> Result<Self, RangeError> {
        if len == 0 {
            return Err(RangeError::Empty { addr });
        }
        match addr.checked_add(len) {
            Some(end) if end <= ADDRESS_LIMIT => Ok(Range { addr, len }),
            _ => Err(RangeError::Wraps { addr, len }),
        }
    }

    /// One past the last byte; cannot overflow by construction.
    pub fn end(&self) -> u64 {
        self.addr + self.len
    }

    //= spec.md#S1.2
    //# Its *pages* are `floor(addr/P)` up to `ceil((addr+len)/P)`, exclusive:
    //# partial pages round *outwards*.
    #[inline(always)]
    pub fn pages(&self, page_size: u64) -> PageSpan {
        if page_size.is_power_of_two() {
            // Shifts: this is on the hit path, and a 64-bit division is not cheap.
            let shift = page_size.trailing_zeros();
            let end = self.end();
            return PageSpan { first: self.addr >> shift, end: (end >> shift) + u64::from(end & (page_size - 1) != 0) };
        }
        self.pages_by_division(page_size)
    }

    #[cold]
    #[inline(never)]
    fn pages_by_division(&self, page_size: u64) -> PageSpan {
        let first = self.addr / page_size;
        let end = self.end().div_ceil(page_size);
        PageSpan { first, end }
    }

    pub fn contains(&self, other: &Range) -> bool {
        self.addr <= other.addr && other.end() <= self.end()
    }

    pub fn overlaps(&self, other: &Range) -> bool {
        self.addr < other.end() && other.addr < self.end()
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:#x},{:#x})", self.addr, self.end())
    }
}

/// A half-open span of page numbers `[first, end)`; `end > first`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
//= spec.md#S1.1
pub struct PageSpan {
    pub first: u64,
    pub end: u64,
}

impl PageSpan {
    pub fn count(&self) -> u64 {
        self.end - self.first
    }
    pub fn overlaps(&self, o: &PageSpan) -> bool {
        self.first < o.end && o.first < self.end
    }
    pub fn contains(&self, o: &PageSpan) -> bool {
        self.first <= o.first && o.end <= self.end
    }
    pub fn union(&self, o: &PageSpan) -> PageSpan {
        PageSpan { first: self.first.min(o.first), end: self.end.max(o.end) }
    }
    /// Widens the span outwards to multiples of `chunk_pages` (spec.md#S6.2).
    #[inline]
    pub fn align(&self, chunk_pages: u64) -> PageSpan {
        // Every miss plans through here: masks for a power of two (the
        // default, 1, among them) rather than two 64-bit divisions.
        if chunk_pages.is_power_of_two() {
            let mask = chunk_pages - 1;
            let end = self.end.checked_add(mask).map_or(u64::MAX, |e| e & !mask);
            return PageSpan { first: self.first & !mask, end };
        }
        self.align_by_division(chunk_pages)
    }

    #[cold]
    #[inline(never)]
    fn align_by_division(&self, chunk_pages: u64) -> PageSpan {
        let c = chunk_pages.max(1);
        let first = self.first / c * c;
        let end = self.end.div_ceil(c).saturating_mul(c);
        PageSpan { first, end }
    }
    /// The byte range of this span.
    pub fn bytes(&self, page_size: u64) -> Range {
        Range { addr: self.first * page_size, len: self.count() * page_size }
    }
}

impl fmt::Display for PageSpan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pages[{},{})", self.first, self.end)
    }
}

//= spec.md#S1.4
/// Access rights of a registration. Local read is always implied, as in verbs.
/// A registration *suffices* for a request when its access is a superset.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Access(u8);

impl Access {
    pub const LOCAL_READ: Access = Access(0);
    pub const LOCAL_WRITE: Access = Access(1);
    pub const REMOTE_READ: Access = Access(2);
    pub const REMOTE_WRITE: Access = Access(4);
    pub const REMOTE_ATOMIC: Access = Access(8);
    const NAMES: [(&'static str, Access); 4] = [
        ("local_write", Access::LOCAL_WRITE),
        ("remote_read", Access::REMOTE_READ),
        ("remote_write", Access::REMOTE_WRITE),
        ("remote_atomic", Access::REMOTE_ATOMIC),
    ];

    pub const fn bits(self) -> u8 {
        self.0
    }
    pub fn from_bits(bits: u8) -> Option<Access> {
        (bits & !0xf == 0).then_some(Access(bits))
    }
    pub const fn union(self, o: Access) -> Access {
        Access(self.0 | o.0)
    }
    /// `self` grants at least everything `wanted` asks for.
    pub const fn suffices_for(self, wanted: Access) -> bool {
        self.0 & wanted.0 == wanted.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, o: Access) -> Access {
        self.union(o)
    }
}

impl fmt::Display for Access {
    /// `local_read`, or the granted rights joined by `+`: `local_write+remote_read`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            return f.write_str("local_read");
        }
        let mut first = true;
        for (name, a) in Access::NAMES {
            if self.suffices_for(a) {
                if !first {
                    f.write_str("+")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::str::FromStr for Access {
    type Err = String;
    fn from_str(s: &str) -> Result<Access, String> {
        let mut acc = Access::LOCAL_READ;
        for part in s.split('+').map(str::trim) {
            match part {
                "local_read" | "" => {}
                // Short forms for hand-written traces.
                "rw" => acc = acc | Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
                _ => match Access::NAMES.iter().find(|(n, _)| *n == part) {
                    Some((_, a)) => acc = acc | *a,
                    None => {
                        return Err(format!(
                            "unknown access right `{part}` (expected local_read, local_write, remote_read, remote_write, remote_atomic or rw, joined by +)"
                        ))
                    }
                },
            }
        }
        Ok(acc)
    }
}

impl Serialize for Access {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Access {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Access, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

//= spec.md#S1.7
/// The ways a process can stop mapping the frames behind an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseKind {
    Munmap,
    MadviseDontneed,
    MadviseFree,
    MadviseRemove,
    /// The source range of an mremap that moved or shrank the mapping.
    MremapSource,
    /// mmap(MAP_FIXED) over an existing mapping.
    MapFixedOver,
    BrkShrink,
    Shmdt,
    /// A deallocation reported by an allocator wrapper (`MonitoredAlloc`):
    /// the block may be reused or given back to the kernel; conservative.
    Dealloc,
}

impl ReleaseKind {
    pub const ALL: [ReleaseKind; 9] = [
        ReleaseKind::Munmap,
        ReleaseKind::MadviseDontneed,
        ReleaseKind::MadviseFree,
        ReleaseKind::MadviseRemove,
        ReleaseKind::MremapSource,
        ReleaseKind::MapFixedOver,
        ReleaseKind::BrkShrink,
        ReleaseKind::Shmdt,
        ReleaseKind::Dealloc,
    ];
}

/// A release event (spec.md S2.3): the frames of `range` are no longer
/// mapped. The one shape a release has in the cache, from where it is
/// reported to where it is applied: a monitor reads it (userfaultfd, M2,
/// M5), a hook queues it (H1, W1), a drain applies it (A-D).
///
/// `kind` is the release that raised it, when that is known: `None` for
/// W1's event (a hook *before* the release names no kind) and for the one
/// event a full queue collapses into (L2) when its events were of several
/// kinds. The cache applies every kind the same way (S2.3); the kind is
/// kept for what reports it, and M3 opens a window for a REMOVE a monitor
/// read.
///
/// [`Op::ReleaseEvent`] is its trace form, whose range is unchecked (a trace
/// may hold a bad one, E1/E2): [`Op::release_event`] checks it, and
/// [`ReleaseEvent::op`] gives it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ReleaseEvent {
    pub kind: Option<ReleaseKind>,
    pub range: Range,
}

impl ReleaseEvent {
    /// A release of kind `kind` on `range`.
    pub const fn of(kind: ReleaseKind, range: Range) -> Self {
        ReleaseEvent { kind: Some(kind), range }
    }

    /// A release of kind `kind` on `[addr, addr+len)`, checked (E1, E2).
    pub fn new(kind: ReleaseKind, addr: u64, len: u64) -> Result<Self, RangeError> {
        Ok(ReleaseEvent::of(kind, Range::new(addr, len)?))
    }

    /// Its pages (spec.md S1.2): what A-D applies.
    #[inline]
    pub fn pages(&self, page_size: u64) -> PageSpan {
        self.range.pages(page_size)
    }

    /// One event covering this one and `other` (L2's hull): the hull of the
    /// two ranges, whose pages are the union of theirs (the byte hull rounds
    /// outwards to the same pages), and their kind if they agree.
    pub fn hull(&self, other: &ReleaseEvent) -> ReleaseEvent {
        let addr = self.range.addr.min(other.range.addr);
        let end = self.range.end().max(other.range.end());
        let kind = if self.kind == other.kind { self.kind } else { None };
        // Both ranges end at or below ADDRESS_LIMIT, and so does the hull.
        ReleaseEvent { kind, range: Range { addr, len: end - addr } }
    }

    /// Its trace form, if its kind is known.
    pub fn op(&self) -> Option<Op> {
        self.kind.map(|kind| Op::ReleaseEvent { kind, addr: self.range.addr, len: self.range.len })
    }
}

//= spec.md#S2
/// One operation on a registration cache. This single enum drives the spec,
/// the model, the checker, the impl harness, traces and conformance.
///
/// Addresses and lengths are raw so that bad input (len 0, wrap-around) can be
/// expressed and must be answered with an error, never a panic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// S2.1: obtain a lease on a registration covering `[addr, addr+len)`.
    Acquire {
        lease: LeaseId,
        #[serde(with = "hex_u64")]
        addr: u64,
        #[serde(deserialize_with = "hex_u64::deserialize")]
        len: u64,
        access: Access,
    },
    /// S2.2: give a lease back.
    Release { lease: LeaseId },
    /// S2.3: the process stopped mapping the frames of `[addr, addr+len)`.
    ReleaseEvent {
        kind: ReleaseKind,
        #[serde(with = "hex_u64")]
        addr: u64,
        #[serde(deserialize_with = "hex_u64::deserialize")]
        len: u64,
    },
    /// S2.4: the allocator handed out `[addr, addr+len)`. No effect on the cache.
    Alloc {
        #[serde(with = "hex_u64")]
        addr: u64,
        #[serde(deserialize_with = "hex_u64::deserialize")]
        len: u64,
    },
    /// S2.4: the allocator took `[addr, addr+len)` back. No effect on the cache by
    /// itself: if memory went back to the kernel, a `ReleaseEvent` says so.
    Free {
        #[serde(with = "hex_u64")]
        addr: u64,
        #[serde(deserialize_with = "hex_u64::deserialize")]
        len: u64,
    },
    /// S2.9: a hook *before* the release of `[addr, addr+len)`: the release
    /// event's effect (S2.3) and a window that no registration overlapping
    /// it is cached in, until the matching `ReleaseEnd`.
    ReleaseBegin {
        #[serde(with = "hex_u64")]
        addr: u64,
        #[serde(deserialize_with = "hex_u64::deserialize")]
        len: u64,
    },
    /// S2.9: after that release: closes one window with the same pages (E7 if none).
    ReleaseEnd {
        #[serde(with = "hex_u64")]
        addr: u64,
        #[serde(deserialize_with = "hex_u64::deserialize")]
        len: u64,
    },
    /// S2.5: drop every cached entry.
    Flush,
    /// S2.8: drop every unleased cached entry (what the cache does itself on
    /// ENOMEM/EAGAIN, S5.4).
    Trim,
    /// S2.6: the ops that follow run in a child created by fork().
    Fork,
}

impl Op {
    /// A `ReleaseEvent` op as the cache's [`ReleaseEvent`], its range
    /// checked (E1, E2); `None` for any other op.
    pub fn release_event(&self) -> Option<Result<ReleaseEvent, RangeError>> {
        match *self {
            Op::ReleaseEvent { kind, addr, len } => Some(ReleaseEvent::new(kind, addr, len)),
            _ => None,
        }
    }

    /// The op's byte range, checked against S2.1's preconditions, if it has one.
    pub fn range(&self) -> Option<Result<Range, RangeError>> {
        match *self {
            Op::Acquire { addr, len, .. }
            | Op::ReleaseEvent { addr, len, .. }
            | Op::ReleaseBegin { addr, len }
            | Op::ReleaseEnd { addr, len }
            | Op::Alloc { addr, len }
            | Op::Free { addr, len } => Some(Range::new(addr, len)),
            Op::Release { .. } | Op::Flush | Op::Trim | Op::Fork => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Op::Acquire { .. } => "acquire",
            Op::Release { .. } => "release",
            Op::ReleaseEvent { .. } => "release_event",
            Op::ReleaseBegin { .. } => "release_begin",
            Op::ReleaseEnd { .. } => "release_end",
            Op::Alloc { .. } => "alloc",
            Op::Free { .. } => "free",
            Op::Flush => "flush",
            Op::Trim => "trim",
            Op::Fork => "fork",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Op::Acquire { lease, addr, len, access } => {
                write!(f, "acquire L{lease} {addr:#x}+{len:#x} {access}")
            }
            Op::Release { lease } => write!(f, "release L{lease}"),
            Op::ReleaseEvent { kind, addr, len } => write!(f, "{kind:?} {addr:#x}+{len:#x}"),
            Op::ReleaseBegin { addr, len } => write!(f, "release_begin {addr:#x}+{len:#x}"),
            Op::ReleaseEnd { addr, len } => write!(f, "release_end {addr:#x}+{len:#x}"),
            Op::Alloc { addr, len } => write!(f, "alloc {addr:#x}+{len:#x}"),
            Op::Free { addr, len } => write!(f, "free {addr:#x}+{len:#x}"),
            Op::Flush => f.write_str("flush"),
            Op::Trim => f.write_str("trim"),
            Op::Fork => f.write_str("fork"),
        }
    }
}

/// A registration as callers observe it: its page-aligned byte range and
/// access. Never an lkey or a slot (spec.md#S1.3): two caches agree on a
/// `RegView` whatever their backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
//= spec.md#S1.3
pub struct RegView {
    /// Creation order among cached registrations, from 1 (spec.md#S1.3).
    pub id: u64,
    #[serde(with = "hex_u64")]
    pub addr: u64,
    pub len: u64,
    pub access: Access,
}

impl fmt::Display for RegView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "R{} [{:#x},{:#x}) {}", self.id, self.addr, self.addr + self.len, self.access)
    }
}

/// How a registrar call failed, abstracted from errno (spec.md#S2.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RegistrarFailure {
    /// ENOMEM: out of pinnable memory or NIC resources.
    NoMemory,
    /// EAGAIN: transient.
    Again,
    /// EFAULT: the range is not (fully) mapped, or cannot be pinned.
    Fault,
    /// Anything else.
    Other,
}

/// Errors an operation returns (spec.md#S2, "Errors").
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "error", rename_all = "snake_case")]
#[non_exhaustive]
pub enum OpError {
    #[error("E1 empty range: len is 0")]
    //= spec.md#E1
    EmptyRange,
    #[error("E2 range wraps or ends beyond the address space limit 2^63")]
    //= spec.md#E2
    WrappingRange,
    #[error("E3 lease L{lease} is already held")]
    //= spec.md#E3
    LeaseInUse { lease: LeaseId },
    #[error("E4 lease L{lease} is not held")]
    //= spec.md#E4
    UnknownLease { lease: LeaseId },
    /// `pressure`: the first attempt failed with ENOMEM/EAGAIN, so the cache
    /// evicted every unleased entry before its one retry (S5.4).
    #[error("E5 registrar failed: {failure:?}{}", if *pressure { " (after evicting every unleased entry and retrying)" } else { "" })]
    //= spec.md#E5
    Registrar {
        failure: RegistrarFailure,
        #[serde(default)]
        pressure: bool,
    },
    #[error("E6 registration invalidated on every retry")]
    //= spec.md#E6
    RetriesExhausted,
    /// Not the outcome of an [`Op`]: a `release_end` with no matching
    /// `release_begin` (the pair is a monitor's, spec.md#W2). Here so that
    /// every error code has one shared name.
    #[error("E7 release_end without a matching release_begin")]
    //= spec.md#E7
    UnmatchedReleaseEnd,
}

impl From<RangeError> for OpError {
    fn from(e: RangeError) -> Self {
        match e {
            RangeError::Empty { .. } => OpError::EmptyRange,
            RangeError::Wraps { .. } => OpError::WrappingRange,
        }
    }
}

//= spec.md#S2
/// What an operation returns, as every implementation can observe it.
/// Deregistration timing is deliberately absent (spec.md#S2.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "ret", rename_all = "snake_case")]
//= spec.md#S2.7
pub enum Ret {
    /// A lease was granted on `reg`. `hit`: an existing cache entry served it.
    /// `pressure`: the registrar first failed with ENOMEM/EAGAIN and the cache
    /// evicted every unleased entry before its one retry (S5.4).
    Granted {
        reg: RegView,
        hit: bool,
        pressure: bool,
    },
    /// The op completed (release, release event, alloc, free, flush, fork).
    Done,
    Failed {
        error: OpError,
    },
}

impl fmt::Display for Ret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ret::Granted { reg, hit, pressure } => {
                write!(f, "{} {reg}{}", if *hit { "hit" } else { "miss" }, if *pressure { " (after pressure eviction)" } else { "" })
            }
            Ret::Done => f.write_str("done"),
            Ret::Failed { error } => write!(f, "error: {error}"),
        }
    }
}

/// Calls `$callback!` with the field names of [`Stats`], in order: the one
/// list of the counters. [`Stats`] is declared from it, and so is the C
/// API's copy into `mrcache_stats_t` (capi/src/lib.rs), which therefore names
/// every counter `Stats` has (a counter added here and missing there, or the
/// other way round, does not compile).
#[macro_export]
macro_rules! for_each_stat {
    ($callback:ident) => {
        $callback! {
            acquires,
            hits,
            misses,
            errors,
            releases,
            release_events,
            registrations,
            deregistrations,
            bytes_registered,
            pinned_bytes,
            peak_pinned_bytes,
            cached_entries,
            invalidations,
            leased_invalidations,
            deferred_deregistrations,
            merges,
            uncached,
            evictions,
            pressure_evictions,
            forgotten,
        }
    };
}

macro_rules! declare_stats {
    ($($field:ident,)*) => {
        //= spec.md#S8
        /// Counters shared by the model, the impl and replay. Same schema everywhere,
        /// so a sequential replay through the model and through the impl can be
        /// compared field by field. The fields: [`for_each_stat`].
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
        //= spec.md#S8
        pub struct Stats {
            $(pub $field: u64,)*
        }
    };
}

for_each_stat!(declare_stats);

/// Addresses are written as `"0x..."` strings in traces; numbers are accepted
/// too, for lengths and hand-written files.
pub mod hex_u64 {
    use serde::{de, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("{v:#x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = u64;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an unsigned integer or a \"0x...\" hex string")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
                Ok(v)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
                u64::try_from(v).map_err(|_| E::custom(format!("negative value {v}")))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<u64, E> {
                let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
                    Some(h) => u64::from_str_radix(h, 16),
                    None => s.parse(),
                };
                parsed.map_err(|_| E::custom(format!("`{s}` is not a number")))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_events_hull_covers_the_union_of_its_pages_and_keeps_a_common_kind() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..100_000 {
            let page = 1u64 << (next() % 21);
            let ev = |a: u64, l: u64, k: ReleaseKind| ReleaseEvent::new(k, a, l.max(1)).unwrap();
            let (a, b) = (next() >> 2, next() >> 2);
            let (ka, kb) = (ReleaseKind::ALL[(next() % 9) as usize], ReleaseKind::ALL[(next() % 9) as usize]);
            let e = ev(a, next() >> (2 + next() % 62), ka);
            let f = ev(b, next() >> (2 + next() % 62), kb);
            let h = e.hull(&f);
            assert_eq!(h.pages(page), e.pages(page).union(&f.pages(page)), "{e:?} {f:?}");
            assert_eq!(h.kind, if ka == kb { Some(ka) } else { None });
            assert_eq!(h.op().is_some(), ka == kb);
        }
        let op = Op::ReleaseEvent { kind: ReleaseKind::Shmdt, addr: 0x3000, len: 0x10 };
        let ev = op.release_event().unwrap().unwrap();
        assert_eq!((ev.kind, ev.range), (Some(ReleaseKind::Shmdt), Range { addr: 0x3000, len: 0x10 }));
        assert_eq!(ev.op(), Some(op));
        assert!(Op::ReleaseEvent { kind: ReleaseKind::Munmap, addr: 0x3000, len: 0 }.release_event().unwrap().is_err());
        assert_eq!(Op::Flush.release_event(), None);
    }

    #[test]
    fn align_by_masks_equals_align_by_division() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..100_000 {
            let c = 1u64 << (next() % 64);
            let (a, b) = (next() >> (next() % 64), next() >> (next() % 64));
            let span = PageSpan { first: a.min(b), end: a.max(b) };
            assert_eq!(span.align(c), span.align_by_division(c), "{span} to {c}");
        }
        let top = PageSpan { first: u64::MAX - 3, end: u64::MAX };
        assert_eq!(top.align(8), top.align_by_division(8));
        assert_eq!(top.align(1), top);
    }

    #[test]
    fn pages_by_shift_equal_pages_by_division() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let page_size = 512u64 << (x % 12);
            let addr = (x >> 20) % (1 << 40);
            let len = 1 + (x >> 3) % (1 << (x % 30 + 1));
            let r = Range::new(addr, len).unwrap();
            let span = r.pages(page_size);
            assert_eq!(span.first, addr / page_size);
            assert_eq!(span.end, (addr + len).div_ceil(page_size), "addr {addr} len {len} page {page_size}");
        }
    }

    #[test]
    //= spec.md#S1.2
    fn range_rejects_empty_and_wrapping() {
        assert_eq!(Range::new(0x1000, 0), Err(RangeError::Empty { addr: 0x1000 }));
        assert_eq!(Range::new(u64::MAX, 2), Err(RangeError::Wraps { addr: u64::MAX, len: 2 }));
        assert_eq!(Range::new(u64::MAX - 1, 2), Err(RangeError::Wraps { addr: u64::MAX - 1, len: 2 }));
        assert!(Range::new(ADDRESS_LIMIT - 2, 2).is_ok());
        assert_eq!(Range::new(ADDRESS_LIMIT - 2, 3), Err(RangeError::Wraps { addr: ADDRESS_LIMIT - 2, len: 3 }));
    }

    #[test]
    //= spec.md#S1.1
    fn page_rounding_is_outward() {
        let r = Range::new(100, 4900).unwrap();
        assert_eq!(r.pages(4096), PageSpan { first: 0, end: 2 });
        let r = Range::new(0x3000, 0x1000).unwrap();
        assert_eq!(r.pages(4096), PageSpan { first: 3, end: 4 });
        assert_eq!(PageSpan { first: 3, end: 5 }.align(4), PageSpan { first: 0, end: 8 });
    }

    #[test]
    fn access_round_trips_and_orders() {
        for bits in 0..16u8 {
            let a = Access::from_bits(bits).unwrap();
            assert_eq!(a.to_string().parse::<Access>().unwrap(), a);
        }
        assert!("rw".parse::<Access>().unwrap().suffices_for(Access::REMOTE_WRITE));
        assert!(!Access::LOCAL_WRITE.suffices_for(Access::REMOTE_READ));
        assert!("bogus".parse::<Access>().unwrap_err().contains("bogus"));
    }

    #[test]
    fn op_json_shape() {
        let op = Op::Acquire { lease: 1, addr: 0x1000, len: 0x3000, access: Access::REMOTE_READ };
        let s = serde_json::to_string(&op).unwrap();
        assert_eq!(s, r#"{"op":"acquire","lease":1,"addr":"0x1000","len":12288,"access":"remote_read"}"#);
        assert_eq!(serde_json::from_str::<Op>(&s).unwrap(), op);
        let hand = r#"{"op":"acquire","lease":1,"addr":4096,"len":"0x3000","access":"remote_read"}"#;
        assert_eq!(serde_json::from_str::<Op>(hand).unwrap(), op);
    }
}
