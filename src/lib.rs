//! The `mrcache` command line as a library, so integration tests can call it.
//!
//! - [`replay`]: run traces through the reference model
//!   ([`replay::model`]) or the cache engine, judged op by op by the model
//!   through the test kit's `Environment` ([`replay::cache`]);
//! - `fuzz`: long randomized runs of the test layers (`mrcache fuzz`,
//!   feature `testkit`, on by default);
//! - [`report`]: sweeps of recorded traces over policies, limits and
//!   registration thresholds, with the time saved ([`cost`]) and charts
//!   ([`plot`]);
//! - [`figures`]: the generated tables and charts of the documentation,
//!   from the measurements under `docs/data/`.

pub mod check;
pub mod conform;
pub mod cost;
pub mod figures;
#[cfg(feature = "testkit")]
pub mod fuzz;
pub mod plot;
pub mod record;
pub mod replay;
pub mod report;
pub mod swarm;
