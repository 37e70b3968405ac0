//! The result of replaying one trace ([`Report`]) and the engine that ran
//! it ([`Engine`]): plain data, the bottom of `replay` (it imports no other
//! part of it).

use mrcache_model::OverlapPolicy;
use mrcache_types::Stats;
use serde::Serialize;

/// Which implementation runs the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    /// The reference model.
    Model,
    /// The real cache, every outcome judged by the model.
    Impl,
}

/// The result of replaying one trace.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub trace: String,
    pub engine: Engine,
    pub policy: OverlapPolicy,
    pub records: usize,
    /// The registration threshold in force (bytes).
    pub threshold: u64,
    /// Records skipped by it: small acquires and their releases.
    pub skipped: usize,
    /// Records whose `expect` was checked.
    pub expectations_checked: usize,
    pub stats: Stats,
}
