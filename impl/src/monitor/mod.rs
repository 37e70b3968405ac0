//! Memory monitors: sources of release events (spec.md#S7).

pub mod uffd;
