//! The properties the checker evaluates, named with their spec IDs.
//!
//! P1 and P2 are judged when a lease is granted (the grant records a [`Bad`]);
//! the others are predicates over states. P5 and linearizability are judged
//! only in quiescent states (no operation in flight), L1 only in terminal
//! states (every script finished): both are vacuous elsewhere.
//!
//! [`Bad`]: crate::state::Bad

pub const P1: &str = "always: P1 coverage";
pub const P2: &str = "always: P2 freshness";
pub const P3: &str = "always: P3 no premature deregistration";
pub const P4: &str = "always: P4 exactly-once deregistration";
pub const P5: &str = "always: P5 limits (when no op is in flight)";
pub const LINEARIZABLE: &str = "always: linearizable w.r.t. mrcache_model::Model (S9; when no op is in flight)";
pub const P6: &str = "always: P6 no deadlock";
pub const L1: &str = "always in terminal states: L1 nothing unleased left registered, queue drained";
pub const S_LEASED_INVALIDATED: &str = "sometimes: a leased entry is invalidated";
pub const S_MERGE: &str = "sometimes: a merge happens";
pub const S_UNCACHE: &str = "sometimes: a miss uncaches a contained or containing entry";
pub const S_EVENT_DURING_REGISTRATION: &str =
    "sometimes: a release event arrives during a registration (in-flight record stale)";
pub const S_READ_NOT_APPLIED: &str =
    "sometimes: the monitor has read an event, not yet applied, while an acquire is in flight";
pub const S_HOOK_DEFERRED: &str = "sometimes: a hook finds the lock busy and leaves its event queued";
pub const S_TRIM_EVICTS: &str = "sometimes: an ENOMEM trim evicts an entry (S5.4)";
pub const S_WINDOWED: &str = "sometimes: a registration planned inside a release window is served uncached (W3)";
pub const S_LANE_HIT: &str = "sometimes: a lane hit (LN1)";
pub const S_LANE_PIN: &str = "sometimes: a revoke pins a lane lease (LN5)";
pub const S_LANE_UNDO_PINNED: &str =
    "sometimes: a lane hit's held + 1 is pinned by a revoke, then it reloads null and undoes (LN1, LN4)";

/// Every property name the checker may use, `always` ones first.
pub const ALL: [&str; 19] = [
    P1,
    P2,
    P3,
    P4,
    P5,
    LINEARIZABLE,
    P6,
    L1,
    S_LEASED_INVALIDATED,
    S_MERGE,
    S_UNCACHE,
    S_EVENT_DURING_REGISTRATION,
    S_READ_NOT_APPLIED,
    S_HOOK_DEFERRED,
    S_TRIM_EVICTS,
    S_WINDOWED,
    S_LANE_HIT,
    S_LANE_PIN,
    S_LANE_UNDO_PINNED,
];

/// The spec ID a property checks (`""` for `sometimes` reachability goals).
pub fn spec_id(name: &str) -> &'static str {
    match name {
        P1 => "P1",
        P2 => "P2",
        P3 => "P3",
        P4 => "P4",
        P5 => "P5",
        LINEARIZABLE => "S9",
        P6 => "P6",
        L1 => "L1",
        _ => "",
    }
}
