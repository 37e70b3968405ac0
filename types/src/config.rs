//! The policy parameters of the one contract (spec.md#S6): what the reference
//! model and the cache are both configured with.

use serde::{Deserialize, Serialize};

//= spec.md#S6.1
/// What a miss does about findable entries that overlap the new registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OverlapPolicy {
    /// Register the request's aligned range; leave others alone (Open MPI grdma).
    #[default]
    Independent,
    /// Register the union with every overlapping entry, which leave the lookup (UCX).
    Merge,
    /// Register the request's aligned range; entries it contains or that contain
    /// it leave the lookup (libfabric).
    NoMergeUncacheContained,
}

impl OverlapPolicy {
    pub const ALL: [OverlapPolicy; 3] = [OverlapPolicy::Independent, OverlapPolicy::Merge, OverlapPolicy::NoMergeUncacheContained];

    pub fn name(&self) -> &'static str {
        match self {
            OverlapPolicy::Independent => "independent",
            OverlapPolicy::Merge => "merge",
            OverlapPolicy::NoMergeUncacheContained => "no-merge-uncache-contained",
        }
    }
}

impl std::str::FromStr for OverlapPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.replace('_', "-").as_str() {
            "independent" => Ok(OverlapPolicy::Independent),
            "merge" => Ok(OverlapPolicy::Merge),
            "no-merge-uncache-contained" => Ok(OverlapPolicy::NoMergeUncacheContained),
            _ => Err(format!("unknown policy `{s}` (expected independent, merge or no-merge-uncache-contained)")),
        }
    }
}

//= spec.md#S6.3
/// Which unleased entry goes first when a limit is exceeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum EvictionPolicy {
    /// Least recently used (acquired or released) first.
    #[default]
    Lru,
    /// GreedyDual-Size over the registration cost model: entries that are cheap
    /// to re-register per page, and not used lately, go first.
    CostAware,
}

impl std::str::FromStr for EvictionPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.replace('_', "-").as_str() {
            "lru" => Ok(EvictionPolicy::Lru),
            "cost-aware" | "cost" => Ok(EvictionPolicy::CostAware),
            _ => Err(format!("unknown eviction policy `{s}` (expected lru or cost-aware)")),
        }
    }
}

//= spec.md#S6.4
/// Limits on cached entries. `None` is unlimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct Limits {
    /// Cached (findable) entries.
    pub max_regions: Option<u64>,
    /// Bytes of cached (findable) entries.
    pub max_pinned_bytes: Option<u64>,
    /// Queued release events an implementation may hold back (deferred work,
    /// spec.md#L2). The sequential model never defers.
    pub max_unreleased: Option<u64>,
}

impl Limits {
    /// spec.md#L2's default bound on the invalidation queue.
    pub const DEFAULT_MAX_UNRELEASED: u64 = 1024;
}

/// The whole policy an implementation declares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Config {
    pub policy: OverlapPolicy,
    pub page_size: u64,
    /// Registrations are widened outwards to multiples of this many pages (S6.2).
    pub chunk_pages: u64,
    pub eviction: EvictionPolicy,
    pub limits: Limits,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            policy: OverlapPolicy::Independent,
            page_size: crate::PAGE_SIZE,
            chunk_pages: 1,
            eviction: EvictionPolicy::Lru,
            limits: Limits { max_unreleased: Some(Limits::DEFAULT_MAX_UNRELEASED), ..Limits::default() },
        }
    }
}

impl Config {
    //= spec.md#S6.2
    /// Page size a power of two in [512, 2^20]; `chunk_pages ≥ 1` with
    /// `chunk_pages · page_size ≤ 2^62`, so no page arithmetic overflows.
    pub fn validate(&self) -> Result<(), String> {
        if !self.page_size.is_power_of_two() || !(512..=1 << 20).contains(&self.page_size) {
            return Err(format!("page_size {} is not a power of two in [512, 2^20]", self.page_size));
        }
        if self.chunk_pages == 0 || self.chunk_pages.checked_mul(self.page_size).is_none_or(|b| b > 1 << 62) {
            return Err(format!("chunk_pages {} must be >= 1 and chunk_pages * page_size <= 2^62", self.chunk_pages));
        }
        Ok(())
    }

    pub fn with_policy(policy: OverlapPolicy) -> Config {
        Config { policy, ..Config::default() }
    }
}

//= spec.md#S6.3
/// Registration cost per page, in ns, of a registration of `pages` pages:
/// 16 µs fixed + 0.06 ns/byte (UCX's cost model), divided over its pages.
//# H is an integer in ns: `floor + ⌊(16000 + ⌊bytes·6/100⌋) / pages⌋`.
pub fn per_page_cost_ns(pages: u64, page_size: u64) -> u64 {
    let bytes = u128::from(pages) * u128::from(page_size);
    let cost = (16_000 + bytes * 6 / 100) / u128::from(pages.max(1));
    u64::try_from(cost).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_never_overflows() {
        for pages in [1u64, 2, 3, 16, 255, 1 << 20] {
            let bytes = pages * 4096;
            assert_eq!(per_page_cost_ns(pages, 4096), (16_000 + bytes * 6 / 100) / pages);
        }
        assert_eq!(per_page_cost_ns(1 << 52, 4096), 245);
        assert_eq!(per_page_cost_ns(0, 4096), 16_000);
    }
}
