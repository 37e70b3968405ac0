//! The `mrcache` command line as a library, so integration tests can call it.
//!
//! - [`replay`]: run traces through the reference model (and, later, the impl).

pub mod replay;
