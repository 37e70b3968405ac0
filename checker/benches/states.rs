//! Checker throughput: unique states per second on pinned configurations
//! (BFS, one worker, so figures compare across runs on this 2-core machine),
//! for each engine in the same run: the fingerprint engine (the default)
//! and stateright's BFS.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mrcache_checker::{check, CheckConfig, Engine, MonitorKind, RunOptions};
use mrcache_model::OverlapPolicy;

fn states_per_second(c: &mut Criterion) {
    let mut g = c.benchmark_group("checker states/s");
    g.sample_size(10);
    for (name, cfg) in [
        ("2x3 independent sync", CheckConfig::new(2, 3, OverlapPolicy::Independent, MonitorKind::Sync)),
        ("2x3 merge async", CheckConfig::new(2, 3, OverlapPolicy::Merge, MonitorKind::Async)),
        ("2x4 independent sync", CheckConfig::new(2, 4, OverlapPolicy::Independent, MonitorKind::Sync)),
    ] {
        for (engine, tag) in [(Engine::Fast, "fingerprint engine"), (Engine::Stateright, "stateright")] {
            let opts = RunOptions { workers: 1, engine, ..RunOptions::default() };
            let states = check(&cfg, &opts).expect("the pinned configuration checks").unique_states;
            g.throughput(Throughput::Elements(states as u64));
            g.bench_function(format!("{name}, {tag}"), |b| b.iter(|| check(&cfg, &opts).unwrap().unique_states));
        }
    }
    g.finish();
}

criterion_group!(benches, states_per_second);
criterion_main!(benches);
