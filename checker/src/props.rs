//! The properties the checker evaluates, named with their spec IDs: the
//! names of [`mrcache_model::Property`] (one vocabulary with the model's
//! judge), as the `&'static str` names stateright's properties carry.
//!
//! P1 and P2 are judged when a lease is granted (the grant records a [`Bad`]);
//! the others are predicates over states. P5 and linearizability are judged
//! only in quiescent states (no operation in flight), L1 only in terminal
//! states (every script finished): both are vacuous elsewhere.
//!
//! [`Bad`]: crate::state::Bad

use mrcache_model::Property;

pub const P1: &str = Property::P1.check_name();
pub const P2: &str = Property::P2.check_name();
pub const P3: &str = Property::P3.check_name();
pub const P4: &str = Property::P4.check_name();
pub const P5: &str = Property::P5.check_name();
pub const LINEARIZABLE: &str = Property::S9.check_name();
pub const P6: &str = Property::P6.check_name();
pub const L1: &str = Property::L1.check_name();
pub const S_LEASED_INVALIDATED: &str = Property::LeasedInvalidated.check_name();
pub const S_MERGE: &str = Property::Merge.check_name();
pub const S_UNCACHE: &str = Property::Uncache.check_name();
pub const S_EVENT_DURING_REGISTRATION: &str = Property::EventDuringRegistration.check_name();
pub const S_READ_NOT_APPLIED: &str = Property::ReadNotApplied.check_name();
pub const S_HOOK_DEFERRED: &str = Property::HookDeferred.check_name();
pub const S_TRIM_EVICTS: &str = Property::TrimEvicts.check_name();
pub const S_WINDOWED: &str = Property::Windowed.check_name();
pub const S_LANE_HIT: &str = Property::LaneHit.check_name();
pub const S_LANE_PIN: &str = Property::LanePin.check_name();
pub const S_LANE_HIT_PINNED: &str = Property::LaneHitPinned.check_name();
pub const S_LANE_UNDO: &str = Property::LaneUndo.check_name();

/// Every property name the checker may use, `always` ones first
/// ([`Property::CHECKED`]).
pub const ALL: [&str; 20] = {
    let mut all = [""; 20];
    let mut i = 0;
    while i < all.len() {
        all[i] = Property::CHECKED[i].check_name();
        i += 1;
    }
    all
};

/// The property the checker names `name`, if it is one ([`ALL`]).
pub fn property(name: &str) -> Option<Property> {
    Property::from_check_name(name)
}

/// The spec ID a property checks (`""` for `sometimes` reachability goals).
pub fn spec_id(name: &str) -> &'static str {
    property(name).map_or("", |p| p.spec_id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_checked_property_has_its_own_name() {
        for (i, name) in ALL.iter().enumerate() {
            assert!(!name.is_empty());
            assert_eq!(property(name), Some(Property::CHECKED[i]));
            assert!(ALL[..i].iter().all(|n| n != name), "{name} twice");
        }
        assert_eq!(spec_id(LINEARIZABLE), "S9");
        assert_eq!(spec_id(S_MERGE), "");
        assert_eq!(spec_id("no such property"), "");
    }
}
