//! Swarm-style random operations for long runs (`mrcache fuzz`).
//!
//! Swarm testing (Groce et al., ISSTA 2012): each case switches some op kinds
//! off, so that behaviours one kind would mask (a release event before every
//! stale hit, a flush before every eviction) get exercised. Addresses come
//! from a hot/cold distribution: most ops land on a handful of hot pages, so
//! overlaps, partial frees and reuse of freed addresses are frequent; the
//! rest anywhere in a wider cold window. (`prop`, the proptest layer of
//! the integration tests, has the same shape, with shrinking; feature
//! `proptest`.)

#[cfg(feature = "proptest")]
pub mod prop;

use super::env::HookEvent;
use super::rng::Rng;
use mrcache_types::{Access, LeaseId, Op, ReleaseKind, ADDRESS_LIMIT};

/// Op kinds a swarm case can switch off (acquire is always on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Release,
    ReleaseEvent,
    AllocFree,
    /// Flush and trim.
    Flush,
    Fork,
    BadInput,
    /// Acquires ask for varied access rights (else always `remote_read`).
    AccessVariety,
    /// Sub-page offsets and lengths (else whole pages).
    SubPage,
    /// Acquires that raise a release event from inside `register` (when the
    /// environment has an event hook).
    EventInRegister,
}

impl Kind {
    pub const ALL: [Kind; 9] = [
        Kind::Release,
        Kind::ReleaseEvent,
        Kind::AllocFree,
        Kind::Flush,
        Kind::Fork,
        Kind::BadInput,
        Kind::AccessVariety,
        Kind::SubPage,
        Kind::EventInRegister,
    ];
}

const ACCESSES: [Access; 5] = [
    Access::LOCAL_READ,
    Access::REMOTE_READ,
    Access::LOCAL_WRITE.union(Access::REMOTE_READ),
    Access::LOCAL_WRITE.union(Access::REMOTE_READ).union(Access::REMOTE_WRITE),
    Access::REMOTE_ATOMIC,
];

/// One generated step: an op, and maybe an event to raise inside its
/// registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub op: Op,
    pub hook: Option<HookEvent>,
}

/// A swarm case's op generator.
#[derive(Clone, Debug)]
pub struct OpGen {
    rng: Rng,
    enabled: Vec<Kind>,
    page_size: u64,
    /// Hot pages (a few, close together).
    hot: Vec<u64>,
    cold_pages: u64,
    leases: u64,
}

impl OpGen {
    /// A case: each kind is switched off with probability 1/3.
    pub fn new(seed: u64, page_size: u64) -> OpGen {
        let mut rng = Rng::new(seed);
        let enabled = Kind::ALL.iter().copied().filter(|_| !rng.chance(1, 3)).collect();
        let base = rng.below(8);
        let hot = (0..4).map(|_| base + rng.below(10)).collect();
        OpGen { rng, enabled, page_size, hot, cold_pages: 256, leases: 6 }
    }

    pub fn enabled(&self) -> &[Kind] {
        &self.enabled
    }

    fn on(&self, k: Kind) -> bool {
        self.enabled.contains(&k)
    }

    fn addr(&mut self) -> u64 {
        let page = if self.rng.chance(4, 5) {
            *self.rng.pick(&self.hot) + self.rng.below(2)
        } else {
            self.rng.below(self.cold_pages)
        };
        let sub = if self.on(Kind::SubPage) && self.rng.chance(1, 4) { self.rng.below(self.page_size) } else { 0 };
        page * self.page_size + sub
    }

    fn len(&mut self) -> u64 {
        let pages = match self.rng.below(10) {
            0..=5 => 1 + self.rng.below(2),
            6..=8 => 1 + self.rng.below(5),
            _ => 1 + self.rng.below(16),
        };
        if self.on(Kind::SubPage) && self.rng.chance(1, 4) {
            1 + self.rng.below(pages * self.page_size)
        } else {
            pages * self.page_size
        }
    }

    /// The next step.
    pub fn next_step(&mut self) -> Step {
        loop {
            let roll = self.rng.below(100);
            let lease: LeaseId = self.rng.below(self.leases);
            let op = match roll {
                0..=39 => {
                    let access =
                        if self.on(Kind::AccessVariety) { *self.rng.pick(&ACCESSES) } else { Access::REMOTE_READ };
                    let op = Op::Acquire { lease, addr: self.addr(), len: self.len(), access };
                    let hook = (self.on(Kind::EventInRegister) && self.rng.chance(1, 4)).then(|| HookEvent {
                        page_offset: self.rng.below(8),
                        pages: 1 + self.rng.below(2),
                        kind: ReleaseKind::Munmap,
                    });
                    return Step { op, hook };
                }
                40..=69 if self.on(Kind::Release) => Op::Release { lease },
                70..=84 if self.on(Kind::ReleaseEvent) => {
                    let kind = *self.rng.pick(&ReleaseKind::ALL);
                    let len = if self.rng.chance(2, 3) { self.page_size * (1 + self.rng.below(2)) } else { self.len() };
                    Op::ReleaseEvent { kind, addr: self.addr(), len }
                }
                85..=90 if self.on(Kind::AllocFree) => {
                    if self.rng.chance(1, 2) {
                        Op::Alloc { addr: self.addr(), len: self.len() }
                    } else {
                        Op::Free { addr: self.addr(), len: self.len() }
                    }
                }
                91 if self.on(Kind::Flush) => Op::Flush,
                92..=93 if self.on(Kind::Flush) => Op::Trim,
                94 if self.on(Kind::Fork) && self.rng.chance(1, 3) => Op::Fork,
                95..=99 if self.on(Kind::BadInput) => match self.rng.below(5) {
                    0 => Op::Acquire { lease, addr: self.addr(), len: 0, access: Access::REMOTE_READ },
                    1 => Op::Acquire {
                        lease,
                        addr: u64::MAX - self.rng.below(4096),
                        len: 8192,
                        access: Access::REMOTE_READ,
                    },
                    2 => Op::Acquire {
                        lease,
                        addr: ADDRESS_LIMIT - 100,
                        len: 101 + self.rng.below(4096),
                        access: Access::REMOTE_READ,
                    },
                    3 => Op::ReleaseEvent { kind: ReleaseKind::Munmap, addr: self.addr(), len: 0 },
                    _ => Op::Release { lease: 1000 + lease },
                },
                _ => continue,
            };
            return Step { op, hook: None };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swarm_cases_differ_and_stay_in_the_hot_window() {
        let mut g = OpGen::new(3, 4096);
        let ops: Vec<Step> = (0..1000).map(|_| g.next_step()).collect();
        let acquires = ops.iter().filter(|s| matches!(s.op, Op::Acquire { .. })).count();
        assert!(acquires > 300, "{acquires}");
        let kinds: Vec<Vec<Kind>> = (0..20).map(|s| OpGen::new(s, 4096).enabled().to_vec()).collect();
        assert!(kinds.iter().any(|k| k.len() < Kind::ALL.len()), "some kinds switched off");
        assert!(kinds.windows(2).any(|w| w[0] != w[1]));
    }
}
