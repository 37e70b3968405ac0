//! Sequential differential test: the cache against the reference model,
//! through `mrcache_testkit::Environment` (see its docs for everything
//! compared after each op and at the end, and for the divergences the judge
//! allows, with the reasons).
//!
//! - hand-written sequences, each under every configuration (3 overlap
//!   policies × 2 evictions × 4 limit sets × 2 chunk sizes), in `strict`
//!   mode: the cache must give the model's canonical outcome;
//! - swarm-style random cases (`mrcache_testkit::gen::prop`): hot/cold
//!   addresses, some op kinds switched off per case, registrar failures
//!   scripted on some acquires, release events raised from inside
//!   `register`; shrunk to a minimal trace on failure, which is written to
//!   `traces/regressions/` (`tests/traces.rs` replays every file there);
//! - the same search against deliberately broken caches (`Faults`), each of
//!   which it must catch with a short trace.
//!
//! Allowed divergences (spec.md#S9; the environment's table has the
//! reasons): the covering entry a hit uses; `pressure` on a miss; E5 on a
//! miss (its `pressure` says whether the eviction + retry happened); E6 only
//! in concurrent histories; deregistration timing within L1; registrations
//! without an id (A7/A8) deregistered in the same op; a release event raised
//! inside `register` ordered before its acquire; handles a fork forgot.

use mrcache::registrar::counting::CountingRegistrar;
use mrcache::types::{Access, Op, ReleaseKind, ADDRESS_LIMIT};
use mrcache::{Cache, CacheConfig, Config, Faults};
use mrcache_testkit::gen::prop::{self as gen, Found};
use mrcache_testkit::{configs, Environment, TestRegistrar};

const P: u64 = 4096;
const RR: Access = Access::REMOTE_READ;

fn acq(lease: u64, addr: u64, len: u64) -> Op {
    Op::Acquire { lease, addr, len, access: RR }
}
fn acq_a(lease: u64, addr: u64, len: u64, access: Access) -> Op {
    Op::Acquire { lease, addr, len, access }
}
fn rel(lease: u64) -> Op {
    Op::Release { lease }
}
fn unmap(addr: u64, len: u64) -> Op {
    Op::ReleaseEvent { kind: ReleaseKind::Munmap, addr, len }
}

/// Runs `ops` through the environment (strict), then `finish`; panics with
/// the divergence.
fn differential(config: Config, ops: &[Op]) {
    let cache = Cache::new(TestRegistrar::new(CountingRegistrar::default()), CacheConfig::explicit_with(config));
    let mut env = Environment::new(&cache, config).strict(true);
    for op in ops {
        if let Err(d) = env.step(op) {
            panic!("{d}\nunder {config:?}");
        }
    }
    let summary = env.finish().unwrap_or_else(|d| panic!("{d}\nunder {config:?}"));
    assert_eq!(summary.discarded, 0, "sequentially nothing is registered without being cached");
}

fn all_configs(ops: &[Op]) {
    for config in configs() {
        differential(config, ops);
    }
}

// ---------------------------------------------------------------------------
// Hand-written sequences (each under every configuration)

#[test]
fn seed_thread_scenario() {
    all_configs(&[
        acq(1, 0x1000, 0x3000),
        acq(2, 0x1000, 0x800),
        acq(3, 0x2000, 0x1000),
        rel(1),
        rel(2),
        rel(3),
        unmap(0x3000, 0x1000),
        acq(4, 0x1000, 0x1000),
        rel(4),
    ]);
}

#[test]
//= spec.md#S5.5
fn overlapping_sub_registrations_and_access_upgrades() {
    all_configs(&[
        acq(1, 0, 4 * P),
        acq(2, 2 * P, 4 * P),
        acq(3, P, P),
        acq_a(4, P, P, Access::REMOTE_WRITE | Access::LOCAL_WRITE),
        acq(5, 0, 8 * P),
        rel(1),
        acq(6, 3 * P, 100),
        acq_a(7, 10 * P, 2 * P, Access::LOCAL_READ),
        acq_a(8, 9 * P, 4 * P, Access::REMOTE_ATOMIC),
        rel(2),
        rel(5),
        acq(9, 0, 2 * P),
        rel(3),
    ]);
}

#[test]
fn partial_free_cached_and_leased() {
    // S5.2, S5.3: invalidation of unleased and leased entries, deferred
    // deregistration at the last release, later misses.
    all_configs(&[
        acq(1, 0, 4 * P),
        acq(2, 8 * P, 2 * P),
        rel(2),
        acq(3, 0, P),
        unmap(3 * P, P),
        unmap(9 * P + 10, 1),
        acq(4, 0, P),
        rel(1),
        rel(3),
        acq(5, 8 * P, P),
        unmap(0, 20 * P),
        rel(4),
        rel(5),
    ]);
}

#[test]
fn eviction_orders() {
    // Many small, some large; uses shuffle the LRU order; cost-aware prefers
    // evicting large idle entries.
    let mut ops = Vec::new();
    for i in 0..6u64 {
        ops.push(acq(i, i * 3 * P, P + (i % 3) * 2 * P));
        ops.push(rel(i));
    }
    ops.extend([acq(10, 0, P), rel(10), acq(11, 9 * P, P), acq(12, 30 * P, 6 * P), rel(12), rel(11)]);
    for i in 0..6u64 {
        ops.push(acq(20 + i, i * 3 * P, P));
    }
    for i in (0..6u64).rev() {
        ops.push(rel(20 + i));
    }
    ops.extend([acq(30, 40 * P, 10 * P), rel(30), acq(31, 60 * P, P), rel(31)]);
    all_configs(&ops);
}

#[test]
//= spec.md#S2.4
fn over_limit_with_everything_leased_then_released() {
    // R2: all entries leased while over a limit; evicted at the last release.
    let mut ops = Vec::new();
    for i in 0..6u64 {
        ops.push(acq(i, i * 4 * P, 2 * P));
    }
    for i in 0..6u64 {
        ops.push(rel(i));
    }
    all_configs(&ops);
}

#[test]
fn errors_e1_to_e4() {
    all_configs(&[
        acq(1, 0x1000, 0),
        acq(1, u64::MAX - 10, 100),
        acq(1, 0x1000, 10),
        acq(1, 0x1000, 10), // E3
        acq(1, 0x1000, 0),  // E1 wins over E3, as in the model
        rel(7),             // E4
        rel(1),
        rel(1), // E4
        unmap(0, 0),
        unmap(u64::MAX, 1),
        Op::Alloc { addr: 5, len: 0 },       // malloc(0): no error (S2.4)
        Op::Free { addr: u64::MAX, len: 2 }, // no error either
        Op::Alloc { addr: 0x1000, len: 10 },
        Op::Free { addr: 0x1000, len: 10 },
        acq(2, ADDRESS_LIMIT - 8 * P, P), // near the top, representable even with chunk 4
        rel(2),
    ]);
}

#[test]
fn flush_and_fork() {
    all_configs(&[
        acq(1, 0, 2 * P),
        acq(2, 4 * P, 2 * P),
        rel(2),
        Op::Flush,
        acq(3, 0, P),
        acq(4, 8 * P, P),
        rel(4),
        Op::Fork,
        rel(1), // orphan: no-op
        rel(3),
        acq(1, 0, P), // new registration in the child
        acq(3, 0, P), // E3? no: 3 was released; a hit
        acq(5, 8 * P, P),
        unmap(0, P),
        rel(1),
        Op::Fork,
        acq(6, 0, P),
        rel(6),
        rel(3),
        rel(5),
    ]);
}

#[test]
fn merge_chains() {
    // Entries that only overlap the widened span in later rounds.
    let ops = [
        acq(1, 0, P),
        acq(2, 2 * P, P),
        acq(3, 4 * P, P),
        acq(4, 6 * P, P),
        rel(2),
        acq(5, P, 6 * P),
        acq_a(6, 3 * P, P, Access::LOCAL_WRITE),
        unmap(5 * P, P),
        acq(7, 0, 8 * P),
        rel(1),
        rel(3),
        rel(4),
        rel(5),
        rel(6),
        rel(7),
    ];
    all_configs(&ops);
}

#[test]
fn top_of_the_address_space() {
    // S1.2: ranges end at or below 2^63; chunked spans near it stay exact.
    all_configs(&[
        acq(1, ADDRESS_LIMIT - 8 * P, P),
        acq(2, ADDRESS_LIMIT - 100, 100),
        acq(3, ADDRESS_LIMIT - 100, 101), // E2: ends past 2^63
        acq(3, ADDRESS_LIMIT, 1),         // E2
        unmap(ADDRESS_LIMIT - P, P),
        unmap(ADDRESS_LIMIT - P, P + 1), // E2, still a release_event call
        acq(4, ADDRESS_LIMIT - 3 * P, 3 * P),
        rel(1),
        rel(2),
        rel(4),
    ]);
}

// ---------------------------------------------------------------------------
// Swarm random cases, shrunk to minimal traces

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(1500)
}

/// Fails with the minimal trace, after writing it to `traces/regressions/`.
fn no_divergence(name: &str, found: Option<Found>) {
    if let Some(f) = found {
        let name =
            format!("proptest-{name}-{:016x}", mrcache_testkit::rng::mix(f.trace.to_jsonl().len() as u64 ^ f.divergence.index as u64));
        let path = gen::save_trace(&f.trace, &name, true);
        panic!(
            "the cache diverges from the model: {}\nminimal case: {:?}\ntrace written to {} (commit it: tests/traces.rs replays it)",
            f.divergence,
            f.case,
            path.display()
        );
    }
}

#[test]
//= spec.md#S2.7
//= spec.md#S8
fn swarm_cases_agree_with_the_model() {
    no_divergence("swarm", gen::search("swarm", cases(), 120, Faults::default(), None));
}

#[test]
fn swarm_cases_agree_under_merge_with_events_inside_register() {
    // Merge is where an event during registration changes the outcome.
    let merge: Vec<usize> = (0..configs().len()).filter(|&i| configs()[i].policy == mrcache::OverlapPolicy::Merge).collect();
    no_divergence("merge", gen::search("merge", cases() / 3, 60, Faults::default(), Some(&merge)));
}

// -- mutants: the same search must catch each broken cache with a short trace

/// Runs the search against a mutant: it must fail, and shrink to at most
/// `max_ops` records. Returns the finding (its trace is saved under the temp
/// dir, or traces/regressions with MRCACHE_SAVE_REGRESSIONS=1).
fn catches(name: &str, faults: Faults, configs: Option<&[usize]>, max_ops: usize) -> Found {
    let found = gen::search(name, 2000, 60, faults, configs)
        .unwrap_or_else(|| panic!("{name}: 2000 swarm cases did not catch the mutant {faults:?}"));
    let ops = found.trace.records.len();
    assert!(ops <= max_ops, "{name}: not minimal: {ops} records\n{}", found.trace.to_jsonl());
    let path = gen::save_trace(&found.trace, &format!("mutant-{name}"), false);
    eprintln!("{name}: caught by a {ops}-record trace ({}): {}", path.display(), found.divergence);
    found
}

fn replays_on_the_real_cache(found: &Found) {
    let config = mrcache_testkit::env::config_from_trace(&found.trace).unwrap();
    mrcache_testkit::env::replay_trace(CountingRegistrar::default(), &found.trace, config, mrcache_testkit::env::Expectations::Exact)
        .unwrap_or_else(|d| panic!("the real cache fails the mutant's minimal trace: {d}"));
}

#[test]
fn catches_monitor_off() {
    let mut faults = Faults::default();
    faults.monitor_off = true;
    let found = catches("monitor-off", faults, None, 4);
    replays_on_the_real_cache(&found);
    // The saved trace catches the mutant on its own.
    let config = mrcache_testkit::env::config_from_trace(&found.trace).unwrap();
    assert!(mrcache_testkit::env::replay_trace_with(
        CountingRegistrar::default(),
        &found.trace,
        config,
        mrcache_testkit::env::Expectations::Exact,
        faults
    )
    .is_err());
}

#[test]
fn catches_skip_seq_recheck_with_an_event_inside_register() {
    let mut faults = Faults::default();
    faults.skip_seq_recheck = true;
    let merge: Vec<usize> = (0..configs().len()).filter(|&i| configs()[i].policy == mrcache::OverlapPolicy::Merge).collect();
    let found = catches("skip-seq-recheck", faults, Some(&merge), 5);
    replays_on_the_real_cache(&found);
}

#[test]
fn catches_dereg_leased_on_invalidate() {
    let mut faults = Faults::default();
    // SAFETY: the environment reads a lease's handle only right after the
    // grant (before any event), and TestHandle<CountingHandle> owns nothing
    // its deregistration frees (`pfns` is None).
    unsafe { faults.enable_dereg_leased_on_invalidate() };
    let found = catches("dereg-leased", faults, None, 3);
    assert!(found.divergence.message.contains("P3"), "{}", found.divergence);
    replays_on_the_real_cache(&found);
}

#[test]
fn catches_lru_skips_restamp() {
    // The skip of `Cache::touch` (an entry holding the clock's latest stamp
    // takes no new one) taken on every use: victims follow creation order.
    let mut faults = Faults::default();
    faults.lru_skips_restamp = true;
    let found = catches("lru-skips-restamp", faults, None, 12);
    assert!(found.divergence.message.contains("C3"), "{}", found.divergence);
    replays_on_the_real_cache(&found);
}

/// The fault switches are the shared list's (`mrcache_types::mutants`), one
/// field each.
#[test]
fn fault_switches_are_the_shared_list() {
    let debug = format!("{:?}", Faults::default());
    let fields: Vec<&str> =
        debug.trim_start_matches("Faults {").trim_end_matches('}').split(',').map(|f| f.split(':').next().unwrap().trim()).collect();
    let listed: Vec<&str> = mrcache::types::mutants::FAULT_SWITCHES.iter().map(|f| f.field).collect();
    assert_eq!(fields, listed);
}

fn begin(addr: u64, len: u64) -> Op {
    Op::ReleaseBegin { addr, len }
}
fn end(addr: u64, len: u64) -> Op {
    Op::ReleaseEnd { addr, len }
}

#[test]
//= spec.md#S2.9
//= spec.md#W3
fn release_windows_serve_uncached_then_cache_again() {
    // A hook before the release: begin takes the leased entry out, misses
    // inside the window are served and not cached (nested, overlapping and
    // equal windows from several "threads"), an unmatched end is E7 and
    // changes nothing, and after the last end the range is cached again.
    all_configs(&[
        acq(1, 0, 4 * P),
        acq(2, 8 * P, P),
        rel(2),
        begin(2 * P, 2 * P),
        acq(3, 2 * P, P),
        acq(4, 2 * P, P),
        begin(3 * P, P),
        begin(2 * P, 2 * P),
        acq(5, 0, P),
        end(2 * P, 2 * P),
        acq(6, 3 * P + 10, 10),
        end(5 * P, P),
        end(3 * P, P),
        rel(3),
        acq(7, 2 * P, 2 * P),
        end(2 * P, 2 * P),
        end(2 * P, 2 * P),
        acq(8, 2 * P, 2 * P),
        acq(9, 2 * P, P),
        begin(0, 0),
        end(u64::MAX - P, 2 * P),
        rel(1),
        rel(4),
        rel(5),
        rel(6),
        rel(7),
        rel(8),
        rel(9),
    ]);
}
