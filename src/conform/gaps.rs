//! The protocol gaps of issue 24, item 4, kept apart from the judges they
//! extend:
//!
//! - every failure of a case is recorded and the physical judge (P1–P4) goes
//!   on to the end of the case after a C-rule or property failure
//!   ([`CaseRun::record_failure`]);
//! - a case asks for its arena (header `arena`, sent as `config.arena_len`
//!   in the hello); an adapter maps that much or answers the hello with
//!   `unsupported` ([`hello_unsupported`], [`arena_too_small`]);
//! - a cache that widens registrations to chunks declares `chunk_size` in
//!   its hello and the model widens its misses alike ([`hello_chunk_size`]);

use super::hello::Hello;
use super::{Case, CaseRun, Finding};
use serde_json::{Map, Value};

impl CaseRun<'_> {
    /// Records a failure and lets the case go on. The first one is the
    /// case's verdict; a later one at the same line and rule is the same
    /// finding seen twice and is dropped. The transcript is kept as it was
    /// at the first failure.
    pub(super) fn record_failure(&mut self, f: Finding) {
        if self.failures.iter().any(|g| g.line == f.line && g.rule == f.rule) {
            return;
        }
        if self.failure.is_none() {
            self.failure = Some(f.clone());
            self.failure_transcript = Some(self.ad.transcript.clone());
        }
        self.failures.push(f);
    }

    /// Whether the physical judge already failed something on this case line
    /// (the model's objection there is a consequence, not a new finding).
    pub(super) fn failed_at(&self, line: usize) -> bool {
        self.failures.iter().any(|g| g.line == line)
    }
}

/// A hello answered `{"ok": false, "unsupported": true}`: the adapter cannot
/// run this case (say, it cannot map the arena the case asks for).
pub(super) fn hello_unsupported(v: &Value) -> Option<String> {
    let o = v.as_object()?;
    if o.get("ok") != Some(&Value::Bool(false)) || o.get("unsupported").and_then(Value::as_bool) != Some(true) {
        return None;
    }
    let why = o.get("error").and_then(Value::as_str).unwrap_or("(no reason given)");
    Some(format!("the adapter does not support this case: {why}"))
}

/// The case asked for more arena than the adapter offers (it should have
/// answered `unsupported`).
pub(super) fn arena_too_small(case: &Case, hello: &Hello) -> Option<String> {
    (hello.arena.len < case.arena).then(|| {
        format!(
            "hello: field `arena`: the case asks for an arena of {:#x} bytes (config.arena_len) and the adapter offers {:#x}: \
             map at least that much or answer the hello with `\"unsupported\": true`",
            case.arena, hello.arena.len
        )
    })
}

/// The hello's `chunk_size`: absent or null, one page; else a power of two
/// that is a multiple of `page_size`, at most 2^30.
pub(super) fn hello_chunk_size(o: &Map<String, Value>, page_size: u64, at: &str) -> Result<u64, String> {
    let c = match o.get("chunk_size") {
        None | Some(Value::Null) => return Ok(page_size),
        Some(Value::Number(n)) => n.as_u64().ok_or_else(|| format!("{at}: field `chunk_size`: {n} is not an unsigned integer"))?,
        Some(x) => return Err(format!("{at}: field `chunk_size`: expected a number of bytes, found {x}")),
    };
    if !c.is_power_of_two() || c < page_size || c > 1 << 30 {
        return Err(format!("{at}: field `chunk_size`: {c} must be a power of two from page_size ({page_size}) to 2^30"));
    }
    Ok(c)
}
