//! The rules of spec.md, by ID, and the violation a judge reports.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Every property of mrcache, one vocabulary for the model's judge and the
/// model checker (checker/src/props.rs): the rules an outcome can break
/// (spec.md §3, §4, §5), linearizability (S9), and the reachability goals
/// the checker asks to see reached. [`Property::name`] is the judge's short
/// name of a rule; [`Property::check_name`] the name the checker reports.
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
    /// Linearizable with respect to [`crate::Model`] (spec.md#S9): checked
    /// by the model checker.
    S9,
    /// Goal: a leased entry is invalidated.
    LeasedInvalidated,
    /// Goal: a merge happens.
    Merge,
    /// Goal: a miss uncaches a contained or containing entry.
    Uncache,
    /// Goal: a release event arrives during a registration.
    EventDuringRegistration,
    /// Goal: the monitor has read an event, not yet applied, while an acquire is in flight.
    ReadNotApplied,
    /// Goal: a hook finds the lock busy and leaves its event queued.
    HookDeferred,
    /// Goal: an ENOMEM trim evicts an entry (S5.4).
    TrimEvicts,
    /// Goal: a registration planned inside a release window is served uncached (W3).
    Windowed,
    /// Goal: a lane hit (LN1).
    LaneHit,
    /// Goal: a revoke pins a lane lease (LN5).
    LanePin,
    /// Goal: a lane hit's held + 1 is pinned by a revoke, then it reloads
    /// null, finds the pin and keeps its hit (LN1).
    LaneHitPinned,
    /// Goal: a lane hit reloads null and finds no pin for it: it undoes its
    /// count (LN1).
    LaneUndo,
}

impl Property {
    /// Every property the model checker checks, `always` ones first (the
    /// order of its verdicts and of its search for a counterexample).
    pub const CHECKED: [Property; 20] = [
        Property::P1,
        Property::P2,
        Property::P3,
        Property::P4,
        Property::P5,
        Property::S9,
        Property::P6,
        Property::L1,
        Property::LeasedInvalidated,
        Property::Merge,
        Property::Uncache,
        Property::EventDuringRegistration,
        Property::ReadNotApplied,
        Property::HookDeferred,
        Property::TrimEvicts,
        Property::Windowed,
        Property::LaneHit,
        Property::LanePin,
        Property::LaneHitPinned,
        Property::LaneUndo,
    ];

    /// The judge's short name of a rule (`""` for S9 and the goals, which
    /// the judge does not report).
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
            Property::S9 => "linearizable",
            _ => "",
        }
    }

    /// The spec ID the property checks (`""` for reachability goals).
    pub const fn spec_id(&self) -> &'static str {
        match self {
            Property::P1 => "P1",
            Property::P2 => "P2",
            Property::P3 => "P3",
            Property::P4 => "P4",
            Property::P5 => "P5",
            Property::P6 => "P6",
            Property::L1 => "L1",
            Property::L2 => "L2",
            Property::C1 => "C1",
            Property::C2 => "C2",
            Property::C3 => "C3",
            Property::C4 => "C4",
            Property::S9 => "S9",
            _ => "",
        }
    }

    /// Whether the property is a reachability goal (`sometimes`), not a rule.
    pub const fn is_goal(&self) -> bool {
        self.spec_id().is_empty()
    }

    /// The name the model checker gives the property (its verdicts,
    /// counterexamples and reports); `""` for the rules it does not check
    /// (L2, C1..C4: the judge's).
    pub const fn check_name(&self) -> &'static str {
        match self {
            Property::P1 => "always: P1 coverage",
            Property::P2 => "always: P2 freshness",
            Property::P3 => "always: P3 no premature deregistration",
            Property::P4 => "always: P4 exactly-once deregistration",
            Property::P5 => "always: P5 limits (when no op is in flight)",
            Property::S9 => "always: linearizable w.r.t. mrcache_model::Model (S9; when no op is in flight)",
            Property::P6 => "always: P6 no deadlock",
            Property::L1 => "always in terminal states: L1 nothing unleased left registered, queue drained",
            Property::L2 | Property::C1 | Property::C2 | Property::C3 | Property::C4 => "",
            Property::LeasedInvalidated => "sometimes: a leased entry is invalidated",
            Property::Merge => "sometimes: a merge happens",
            Property::Uncache => "sometimes: a miss uncaches a contained or containing entry",
            Property::EventDuringRegistration => "sometimes: a release event arrives during a registration (in-flight record stale)",
            Property::ReadNotApplied => "sometimes: the monitor has read an event, not yet applied, while an acquire is in flight",
            Property::HookDeferred => "sometimes: a hook finds the lock busy and leaves its event queued",
            Property::TrimEvicts => "sometimes: an ENOMEM trim evicts an entry (S5.4)",
            Property::Windowed => "sometimes: a registration planned inside a release window is served uncached (W3)",
            Property::LaneHit => "sometimes: a lane hit (LN1)",
            Property::LanePin => "sometimes: a revoke pins a lane lease (LN5)",
            Property::LaneHitPinned => {
                "sometimes: a lane hit's held + 1 is pinned by a revoke, then it reloads null, finds the pin and keeps its hit (LN1)"
            }
            Property::LaneUndo => "sometimes: a lane hit reloads null and finds no pin for it: it undoes its count (LN1)",
        }
    }

    /// The checked property the checker names `name` ([`Property::check_name`]).
    pub fn from_check_name(name: &str) -> Option<Property> {
        Property::CHECKED.into_iter().find(|p| p.check_name() == name)
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
