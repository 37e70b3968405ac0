//! Errors of the cache API (spec.md#S2, "Errors").
//!
//! Each variant carries its stable code (`E1`…`E6`) in its message, and maps
//! onto the shared [`OpError`] with [`Error::op_error`], so the harness
//! returns exactly what the model returns. Nothing in the cache panics on bad
//! input: an empty or wrapping range, a failing registrar, a registration
//! invalidated on every retry all come back as an [`Error`].

use crate::registrar::RegistrarError;
use mrcache_types::{OpError, Range, RangeError, RegistrarFailure};

/// Why a cache operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// E1: `len` is 0.
    #[error("E1 empty_range: range at {addr:#x} has len 0")]
    EmptyRange { addr: u64 },
    /// E2: `addr + len` overflows, or the page-aligned registration the request
    /// needs would end past the last byte of the address space.
    #[error("E2 wrapping_range: {addr:#x}+{len:#x} wraps past the end of the address space")]
    WrappingRange { addr: u64, len: u64 },
    /// E5: the registrar failed (after its one retry, for ENOMEM/EAGAIN).
    #[error("E5 registrar: {registrar} registrar: {source}")]
    Registrar {
        /// [`crate::registrar::Registrar::name`].
        registrar: &'static str,
        /// Every unleased entry was evicted after a first ENOMEM/EAGAIN (S5.4).
        pressure: bool,
        /// The verb, errno and detail the registrar reported.
        #[source]
        source: RegistrarError,
    },
    /// E5 as well: the event source refused to watch the range it would have
    /// to watch before registering (spec.md#S7.1: memory userfaultfd cannot
    /// watch, SysV shared memory or a file mapping, is refused with a clear
    /// error; the C API's `MRCACHE_UNWATCHABLE`).
    #[error("E5 registrar: {}", watch_message(.range, .detail))]
    Watch { range: Range, detail: String },
    /// E6: the registration was invalidated during every attempt (spec.md#A7).
    #[error("E6 retries_exhausted: the registration was invalidated during each of its {attempts} attempts")]
    RetriesExhausted { attempts: u32 },
    /// E7: [`crate::Cache::release_end`] names no open window with the same
    /// pages (spec.md#W2): nothing changed.
    #[error("E7 unmatched_release_end: no release window is open on {addr:#x}+{len:#x} (release_end without its release_begin)")]
    UnmatchedReleaseEnd { addr: u64, len: u64 },
    /// The configuration cannot be used (page size not a power of two, ...).
    #[error("invalid cache configuration: {reason}")]
    InvalidConfig { reason: String },
}

impl Error {
    /// The shared error the model gives for the same failure.
    pub fn op_error(&self) -> OpError {
        match self {
            Error::EmptyRange { .. } => OpError::EmptyRange,
            Error::WrappingRange { .. } => OpError::WrappingRange,
            Error::Registrar { source, pressure, .. } => OpError::Registrar { failure: source.failure, pressure: *pressure },
            Error::Watch { .. } => OpError::Registrar { failure: RegistrarFailure::Other, pressure: false },
            Error::RetriesExhausted { .. } => OpError::RetriesExhausted,
            Error::UnmatchedReleaseEnd { .. } => OpError::UnmatchedReleaseEnd,
            // Not an operation error: no op can produce it. Closest code.
            Error::InvalidConfig { .. } => OpError::Registrar { failure: RegistrarFailure::Other, pressure: false },
        }
    }

    /// The stable code of spec.md#S2: `E1`…`E6` (`config` for configuration errors).
    pub fn code(&self) -> &'static str {
        match self {
            Error::EmptyRange { .. } => "E1",
            Error::WrappingRange { .. } => "E2",
            Error::Registrar { .. } | Error::Watch { .. } => "E5",
            Error::RetriesExhausted { .. } => "E6",
            Error::UnmatchedReleaseEnd { .. } => "E7",
            Error::InvalidConfig { .. } => "config",
        }
    }

    /// The registrar's failure class, errno and verb, for E5.
    pub fn registrar_error(&self) -> Option<&RegistrarError> {
        match self {
            Error::Registrar { source, .. } => Some(source),
            _ => None,
        }
    }

    pub(crate) fn from_range(e: RangeError) -> Error {
        match e {
            RangeError::Empty { addr } => Error::EmptyRange { addr },
            RangeError::Wraps { addr, len } => Error::WrappingRange { addr, len },
        }
    }
}

/// [`Error::Watch`]'s text: the range once (the monitor's own detail often
/// names it already: "cannot watch [a,b): ...").
fn watch_message(range: &Range, detail: &str) -> String {
    if detail.contains(&range.to_string()) {
        format!("the monitor refused: {detail}")
    } else {
        format!("the monitor cannot watch {range}: {detail}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_mapping() {
        let e = Error::from_range(Range::new(5, 0).unwrap_err());
        assert_eq!(e.code(), "E1");
        assert_eq!(e.op_error(), OpError::EmptyRange);
        assert!(e.to_string().starts_with("E1"));
        let e = Error::from_range(Range::new(u64::MAX, 2).unwrap_err());
        assert_eq!(e.op_error(), OpError::WrappingRange);
        let r = RegistrarError::from_errno("ibv_reg_mr", libc::EFAULT, "bad address");
        let e = Error::Registrar { registrar: "verbs", pressure: false, source: r };
        assert_eq!(e.op_error(), OpError::Registrar { failure: RegistrarFailure::Fault, pressure: false });
        let msg = e.to_string();
        assert!(msg.contains("E5") && msg.contains("ibv_reg_mr") && msg.contains("errno 14"), "{msg}");
        assert_eq!(Error::RetriesExhausted { attempts: 4 }.op_error(), OpError::RetriesExhausted);
    }

    /// The range appears once, whether or not the monitor's detail names it
    /// (for example "monitor cannot watch [0x0,0x1000): cannot watch [0x0,0x1000): ...").
    #[test]
    fn a_watch_error_names_its_range_once() {
        let range = Range::new(0, 4096).unwrap();
        let named = Error::Watch { range, detail: format!("cannot watch {range}: a file mapping") }.to_string();
        assert_eq!(named.matches(&range.to_string()).count(), 1, "{named}");
        let unnamed = Error::Watch { range, detail: "EBUSY".into() }.to_string();
        assert_eq!(unnamed.matches(&range.to_string()).count(), 1, "{unnamed}");
    }
}
