//! The contract this crate implements, spec.md from the repository root,
//! included verbatim so that `cargo doc` links to it (S-, A-, P- and LN-
//! numbered items are cited at the code that implements them).
#![doc = include_str!("../../spec.md")]
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags, rustdoc::bare_urls)]
