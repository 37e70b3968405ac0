//! Counterexample traces replay: judged in order through the reference model,
//! a freshness counterexample is rejected for P2.

use mrcache_checker::{check, props, CheckConfig, Mutant, RunOptions};
use mrcache_model::{Model, Property};
use mrcache_types::trace::Trace;

fn judge(cfg: &CheckConfig, trace: &Trace) -> Result<(), mrcache_model::Violation> {
    let mut m = Model::new(cfg.model_config()).concurrent().trims_logged();
    for r in trace.records.iter().filter(|r| r.expect.is_some()) {
        m.judge(&r.op, r.expect.as_ref().unwrap())?;
    }
    Ok(())
}

#[test]
fn a_stale_hit_trace_is_rejected_by_the_model() {
    for mutant in [Mutant::NoSeqRecheck, Mutant::LeasedStaysFindable, Mutant::PartialUnmapStartOnly] {
        let cfg = CheckConfig::default().with_mutant(mutant);
        let out = check(&cfg, &RunOptions { workers: 1, ..RunOptions::default() }).unwrap();
        let c = out.counterexample.unwrap();
        assert_eq!(c.property, props::P2);
        let v = judge(&cfg, &c.trace).expect_err("the trace must be rejected");
        assert_eq!(v.property, Property::P2, "{mutant}: {v}\n{}", c.trace.to_jsonl());
        let text = c.trace.to_jsonl();
        let first = text.lines().next().unwrap();
        assert!(first.contains("\"source\":\"checker\"") && first.contains("\"concurrent\":true"), "{first}");
        assert!(text.lines().skip(1).all(|l| l.contains("\"expect\"")), "{text}");
    }
}

#[test]
fn the_timeline_names_threads_steps_lock_and_truth() {
    let cfg = CheckConfig::default().with_mutant(Mutant::NoSeqRecheck);
    let out = check(&cfg, &RunOptions { workers: 1, ..RunOptions::default() }).unwrap();
    let tl = out.counterexample.unwrap().timeline;
    for needle in ["T0 A5", "A7-A9", "lock exclusive(T", "truth p0:g0 p1:g1", "R2 findable", "VIOLATED: always: P2 freshness (spec.md#P2)"]
    {
        assert!(tl.contains(needle), "missing `{needle}` in\n{tl}");
    }
}
