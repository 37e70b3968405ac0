//! The test kit of mrcache: the harnesses that check the cache against the
//! contract, used by `impl/tests/` and by `mrcache fuzz`. A crate of its own:
//! the production crate `mrcache` holds no test code, only the fault
//! switches (its feature `faults`, which this crate turns on).
//!
//! Three layers, each with its own oracle, and each shown to catch a
//! deliberately broken cache ([`mrcache::Faults`]):
//!
//! | layer | module | oracle | what it drives |
//! |---|---|---|---|
//! | sequential differential | [`mod@env`] | `Model::judge` + registrar effects + stats | one op at a time, any registrar |
//! | concurrent histories | [`lin`] | stateright's `LinearizabilityTester` over `Model::concurrent()` | 2–4 threads, counting registrar |
//! | real memory | [`dma`] | the loopback NIC: a `dma_write` through every lease must be visible in the mapping; pagemap PFNs | io_uring registrar, uffd or explicit monitor, churning threads |
//!
//! [`dma::race`] measures the userfaultfd windows of spec.md#S7.4 (a release
//! and an acquire of the same memory, concurrent on purpose).
//!
//! Plus [`Apply`] (one [`mrcache_types::Op`] applied to a cache, answering
//! the model's [`mrcache_types::Ret`]), [`registrar::TestRegistrar`]
//! (logging, seeded fault injection, a hook that runs inside `register`, PFN
//! capture), [`gen`] (swarm op generation, seeded for long runs, with
//! proptest's shrinking for the integration tests), [`generations`] (page
//! generations, the physical truth of freshness checks without real memory)
//! and [`watchdog`] (no test may hang). Anonymous mappings come from
//! `mrcache::mem`; fresh pages at a fixed address (the DMA arena's churns,
//! replay's releases) from one private helper, `pages::map_at`.
//!
//! Never a dependency of a production build: it exists to break and observe
//! the cache.

// Loom builds (`--cfg loom`, impl/tests/loom.rs) model the cache's atomics;
// the kit drives real threads and memory, and is empty there.
#![cfg(not(loom))]

pub mod apply;
pub mod dma;
pub mod env;
pub mod gen;
pub mod generations;
pub mod lin;
mod pages;
pub mod registrar;
pub mod rng;
pub mod watchdog;

pub use apply::Apply;
pub use env::{Check, Divergence, Ending, Environment, RealMemory, Summary};
pub use registrar::{Call, TestHandle, TestRegistrar};
pub use rng::Rng;

/// Re-exported so that users of the test kit need no direct dependency.
pub use stateright;

use mrcache_model::{Config, EvictionPolicy, Limits, OverlapPolicy};

/// Every configuration the sequential layers sweep: 3 overlap policies × 2
/// evictions × 4 limit sets × 2 chunk sizes (48), page size 4096.
pub fn configs() -> Vec<Config> {
    const P: u64 = 4096;
    let limits = [
        Limits::default(),
        Limits { max_regions: Some(3), ..Limits::default() },
        Limits { max_pinned_bytes: Some(6 * P), ..Limits::default() },
        Limits { max_regions: Some(4), max_pinned_bytes: Some(9 * P), max_unreleased: Some(8) },
    ];
    let mut out = Vec::new();
    for policy in OverlapPolicy::ALL {
        for eviction in [EvictionPolicy::Lru, EvictionPolicy::CostAware] {
            for limits in limits {
                for chunk_pages in [1, 4] {
                    out.push(Config { policy, page_size: P, chunk_pages, eviction, limits });
                }
            }
        }
    }
    out
}

/// The `mrcache replay` command line that replays a trace under `config`
/// (stored in a trace header's `command`, so that regression traces carry
/// their configuration; see [`env::config_from_command`]).
pub fn replay_command(config: &Config) -> String {
    let mut s = format!(
        "mrcache replay --policy {} --eviction {} --chunk-pages {}",
        config.policy.name(),
        match config.eviction {
            EvictionPolicy::Lru => "lru",
            EvictionPolicy::CostAware => "cost-aware",
        },
        config.chunk_pages
    );
    if let Some(m) = config.limits.max_regions {
        s += &format!(" --max-regions {m}");
    }
    if let Some(m) = config.limits.max_pinned_bytes {
        s += &format!(" --max-pinned-bytes {m}");
    }
    s
}
