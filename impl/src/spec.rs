//! The contract this crate implements, spec.md from the repository root,
//! included verbatim so that `cargo doc` links to it (S-, A-, P- and LN-
//! numbered items are cited at the code that implements them). Only in
//! the docs: in a build, the text would go into the rlib's metadata, and
//! the spec names the fault switches (its coverage table), which the
//! production build must not hold (tests/production.rs).
#![cfg_attr(doc, doc = include_str!("../../spec.md"))]
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags, rustdoc::bare_urls)]
