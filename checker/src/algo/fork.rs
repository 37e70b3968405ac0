//! Fork (spec.md#F1) is not a step of this model: a fork is sequential (no
//! thread runs during it), so the checker has nothing to interleave. The
//! model's `Op::Fork` and the conformance tests cover it (impl:
//! `impl/src/cache/fork.rs`, over `impl/src/cache/os.rs`).
