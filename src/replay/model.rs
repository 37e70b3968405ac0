//! Replay through the reference model (`--engine model`): each record is
//! stepped through [`Model`], and a record's `expect` is checked when asked.
//!
//! Invariant: the model follows the trace's own outcomes: an expected
//! outcome other than the model's canonical one is taken only once the
//! model's judge allows it (spec.md#S9); otherwise the replay stops with
//! the trace line. Imports only the plain data of `replay::report`;
//! nothing here depends on the cache.

use super::report::{Engine, Report};
use anyhow::Result;
use mrcache_model::{Config, Model};
use mrcache_types::trace::Trace;

/// Replays one trace through the model.
pub fn replay_model(name: &str, trace: &Trace, config: Config, check_expect: bool) -> Result<Report> {
    replay_model_with(name, trace, config, check_expect, None, &mut |_, _| {})
}

/// Replays one trace through the model, skipping the records `skip` marks
/// (see [`super::skip_mask`]) and calling `observe(i, &model)` after every record
/// `i` that ran (for time series and progress).
pub fn replay_model_with(
    name: &str,
    trace: &Trace,
    config: Config,
    check_expect: bool,
    skip: Option<&[bool]>,
    observe: &mut dyn FnMut(usize, &Model),
) -> Result<Report> {
    let mut model = Model::new(config);
    let mut checked = 0;
    let mut skipped = 0;
    for (i, rec) in trace.records.iter().enumerate() {
        if skip.is_some_and(|m| m[i]) {
            skipped += 1;
            continue;
        }
        let line = trace.first_record_line + i;
        match (check_expect, rec.expect) {
            (true, Some(want)) => {
                checked += 1;
                let mut canonical = model.clone();
                let got = canonical.step(&rec.op);
                if got == want {
                    model = canonical;
                } else {
                    // The trace may assert another outcome the contract allows.
                    model.judge(&rec.op, &want).map_err(|v| {
                        anyhow::anyhow!(
                            "{name}:{line}: `{}`: the trace expects `{want}`, the model gives `{got}`, and the judge rejects the expectation: {v}",
                            rec.op
                        )
                    })?;
                }
            }
            // A record asserting failure tests error handling; the trace's
            // lease bookkeeping (T3) assumes it failed, so follow that.
            (false, Some(want @ mrcache_types::Ret::Failed { .. })) => {
                if model.judge(&rec.op, &want).is_err() {
                    model.step(&rec.op);
                }
            }
            _ => {
                model.step(&rec.op);
            }
        }
        model.take_effects();
        observe(i, &model);
    }
    Ok(Report {
        trace: name.to_string(),
        engine: Engine::Model,
        policy: config.policy,
        records: trace.records.len(),
        threshold: 0,
        skipped,
        expectations_checked: checked,
        stats: model.stats(),
    })
}
