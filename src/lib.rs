//! The `mrcache` command line as a library, so integration tests can call it.
//!
//! - [`replay`]: run traces through the reference model or the cache;
//! - [`fuzz`]: long randomized runs of the test layers (`mrcache fuzz`);
//! - [`replay_impl`]: the cache engine, judged op by op by the model.

pub mod check;
pub mod fuzz;
pub mod record;
pub mod replay;
pub mod replay_impl;
