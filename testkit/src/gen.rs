//! Swarm-style random operations for long runs (`mrcache fuzz`): [`OpGen`]
//! draws [`swarm`]'s distribution from a seed. (`prop`, the proptest layer
//! of the integration tests, draws the same one with shrinking; feature
//! `proptest`.)
//!
//! Invariant: a seed determines the whole case (mask, hot pages, steps), so
//! a failing seed reproduces on every machine.

#[cfg(feature = "proptest")]
pub mod prop;
pub mod swarm;

use super::env::HookEvent;
use super::rng::Rng;
use mrcache_types::Op;
use swarm::{off, Case, Draw};

/// One generated step: an op, and maybe an event to raise inside its
/// registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub op: Op,
    pub hook: Option<HookEvent>,
}

/// A swarm case's op generator.
#[derive(Clone, Debug)]
pub struct OpGen {
    rng: Rng,
    /// The mask and hot pages; its steps stay empty (drawn one at a time).
    case: Case,
    page_size: u64,
}

impl OpGen {
    /// A case: its swarm mask and hot pages drawn as `prop::case` draws
    /// them. Registrar failures are not scripted (the fuzzer's registrar
    /// injects its own, at random): [`off::REGISTRAR_FAULTS`] is always set.
    pub fn new(seed: u64, page_size: u64) -> OpGen {
        let mut rng = Rng::new(seed);
        let mut draw = Draw(&mut rng);
        let case = Case { config: 0, off: draw.off() | off::REGISTRAR_FAULTS, hot: draw.hot(), steps: Vec::new() };
        OpGen { rng, case, page_size }
    }

    /// The swarm mask: a set bit ([`off`]) switches a kind off.
    pub fn off(&self) -> u16 {
        self.case.off
    }

    /// The next step (steps of a kind switched off are drawn again).
    pub fn next_step(&mut self) -> Step {
        loop {
            let step = Draw(&mut self.rng).step();
            if let Some((op, hook, _)) = self.case.op_of(&step, self.page_size) {
                return Step { op, hook };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swarm_cases_differ_and_stay_in_the_hot_window() {
        let mut g = OpGen::new(3, 4096);
        let ops: Vec<Step> = (0..1000).map(|_| g.next_step()).collect();
        let acquires = ops.iter().filter(|s| matches!(s.op, Op::Acquire { .. })).count();
        assert!(acquires > 300, "{acquires}");
        let masks: Vec<u16> = (0..20).map(|s| OpGen::new(s, 4096).off()).collect();
        assert!(masks.iter().any(|&m| m != off::REGISTRAR_FAULTS), "some kinds switched off");
        assert!(masks.windows(2).any(|w| w[0] != w[1]));
        // A seed reproduces its case.
        let again: Vec<Step> = {
            let mut g = OpGen::new(3, 4096);
            (0..1000).map(|_| g.next_step()).collect()
        };
        assert_eq!(ops, again);
    }

    /// The seeded draws follow the weights the proptest strategies use.
    #[test]
    fn seeded_draws_follow_the_weights() {
        let mut rng = Rng::new(11);
        let n = 90_000;
        let mut counts = [0u32; 9];
        for _ in 0..n {
            let i = match Draw(&mut rng).step() {
                swarm::Step::Acquire { .. } => 0,
                swarm::Step::Release { .. } => 1,
                swarm::Step::Event { .. } => 2,
                swarm::Step::Alloc { .. } => 3,
                swarm::Step::Free { .. } => 4,
                swarm::Step::Flush => 5,
                swarm::Step::Trim => 6,
                swarm::Step::Fork => 7,
                swarm::Step::Bad(_) => 8,
            };
            counts[i] += 1;
        }
        let total: u32 = swarm::STEP_WEIGHTS.iter().sum();
        for (c, w) in counts.iter().zip(swarm::STEP_WEIGHTS) {
            let want = f64::from(n) * f64::from(w) / f64::from(total);
            assert!((f64::from(*c) - want).abs() < 0.1 * want + 100.0, "{counts:?}");
        }
    }
}
