//! The rules of spec.md, by ID, and the violation a judge reports.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Every rule an outcome can break (spec.md §3, §4, §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Property {
    /// Coverage: a lease covers the request with at least the access asked for.
    P1,
    /// Freshness: no lease holds a frame the process no longer maps there.
    P2,
    /// No premature deregistration: a leased registration stays registered.
    P3,
    /// Exactly-once deregistration.
    P4,
    /// Limits: cached entries within limits unless all are leased.
    P5,
    /// No deadlock.
    P6,
    /// Liveness: an uncached, unleased registration is deregistered within the bound.
    L1,
    /// Deferred work is bounded.
    L2,
    /// Hit when possible: an acquire hits iff a findable entry covers it.
    C1,
    /// A miss registers exactly the overlap policy's range and access.
    C2,
    /// Evictions happen only over a limit, and take the eviction policy's victim.
    C3,
    /// Errors: the error the contract names for the failed precondition.
    C4,
}

impl Property {
    pub fn name(&self) -> &'static str {
        match self {
            Property::P1 => "coverage",
            Property::P2 => "freshness",
            Property::P3 => "no premature deregistration",
            Property::P4 => "exactly-once deregistration",
            Property::P5 => "limits",
            Property::P6 => "no deadlock",
            Property::L1 => "deregistration within the bound",
            Property::L2 => "deferred work is bounded",
            Property::C1 => "hit when possible",
            Property::C2 => "overlap policy",
            Property::C3 => "eviction policy",
            Property::C4 => "errors",
        }
    }
}

impl fmt::Display for Property {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "spec.md#{:?} ({})", self, self.name())
    }
}

/// A rule an observed outcome breaks, with what happened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    pub property: Property,
    pub detail: String,
}

impl Violation {
    pub fn new(property: Property, detail: String) -> Violation {
        Violation { property, detail }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} violated: {}", self.property, self.detail)
    }
}

impl std::error::Error for Violation {}
