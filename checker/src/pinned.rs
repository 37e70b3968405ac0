//! The pinned configurations: the correct algorithm must pass every property
//! and reach every reachability goal in each, and each has an exact number of
//! unique states (a change in the model or the scripts shows up here).

use crate::config::{CacheFrees, CheckConfig, MonitorKind};
use crate::props;
use crate::run::Outcome;
use mrcache_model::OverlapPolicy;

/// A pinned configuration and its exact unique-state count (BFS, complete).
#[derive(Clone, Debug)]
pub struct Pinned {
    pub name: String,
    pub cfg: CheckConfig,
    pub unique_states: usize,
    /// Every reachability goal must be reached (all families but `lru`, whose
    /// scripts have no overlapping ranges: no merge, no uncache).
    pub goals_required: bool,
}

/// Families of pinned configurations; each runs under every policy and both
/// monitors unless noted.
const FAMILIES: [&str; 59] = [
    "2x3",
    "2x4",
    "3x2",
    "2x3+nested",
    "2x3+limit",
    "2x3+pinned-bytes",
    "2x3+nested+limit",
    "2x3+cache-app-page",
    "2x3+e6",
    "lru",
    "2x3+pressure",
    "limit-event",
    "lanes",
    "lanes+limit",
    "lanes+note",
    "lanes-drain",
    "lanes-reuse",
    "2x3+pair",
    "pair-windows",
    "pair-closed",
    "2x3+remove",
    "remove",
    "shared",
    "2x4+shared",
    "2x3+shared+remove",
    "shared+remove",
    "2x3+attached",
    "lockless",
    "lockless-drain",
    "lockless+pressure",
    "lockless+trim",
    "2x3+limit+skip",
    "lanes+limit+skip",
    "lanes-collide",
    "lanes-remote",
    "lanes-claims",
    "2x3+limit+steps",
    "lru+steps",
    "2x3+drain-rounds",
    "lockless+drain-rounds",
    "remove+proof",
    "2x3+remove+proof",
    "2x3+lookup-skips",
    "lookup-skips",
    "lockless+memo",
    "memo-pending",
    "memo-reuse",
    "lru+restamp",
    "flush",
    "flush+limit",
    "lanes+flush",
    "chunk",
    "2x3+chunk",
    "cost",
    "2x3+limit+cost",
    "hull",
    "2x3+nested+hull",
    "fork",
    "fork+limit",
];

fn family(name: &str, policy: OverlapPolicy, monitor: MonitorKind) -> Option<CheckConfig> {
    let base = |t, o| CheckConfig::new(t, o, policy, monitor);
    Some(match name {
        "2x3" => base(2, 3),
        "2x4" => base(2, 4),
        "3x2" => base(3, 2),
        // The registrar frees page 1 during an A5, the cache frees its own
        // page during an A9 (each at most once per run).
        "2x3+nested" => CheckConfig { registrar_frees: Some(1), cache_frees: Some(CacheFrees::Private), ..base(2, 3) },
        "2x3+limit" => CheckConfig { max_regions: Some(1), ..base(2, 3) },
        // The byte limit (S6.4) at one page: every entry alone is over it,
        // so each insert notes and evicts, and a leased entry keeps the
        // cache over the limit until its release (R2).
        "2x3+pinned-bytes" => CheckConfig { max_pinned_bytes: Some(4096), ..base(2, 3) },
        "2x3+nested+limit" => {
            CheckConfig { registrar_frees: Some(1), cache_frees: Some(CacheFrees::Private), max_regions: Some(1), ..base(2, 3) }
        }
        // Freeing watched memory under the lock deadlocks with userfaultfd
        // (spec.md#S7.3 forbids it): sync monitor only.
        "2x3+cache-app-page" if monitor == MonitorKind::Sync => CheckConfig { cache_frees: Some(CacheFrees::AppPage(1)), ..base(2, 3) },
        "2x3+cache-app-page" => return None,
        // One attempt only: the registrar's free makes it stale, so E6 is reachable.
        "2x3+e6" => CheckConfig { registrar_frees: Some(1), max_retries: 1, ..base(2, 3) },
        // Two registrar failures: ENOMEM (the trim of S5.4), then ENOMEM on
        // another acquire or EINVAL after the trim (E5); max_regions 1.
        "2x3+pressure" => CheckConfig { registrar_failures: 2, max_regions: Some(1), ..base(2, 3) },
        // A release and a munmap of the new entry while a miss over the
        // limit holds the lock (A6 raises the flag before its note).
        "limit-event" => CheckConfig { scripts: Some(crate::config::limit_event_scripts()), max_regions: Some(1), ..base(2, 3) },
        // The LRU order decides the victim (`release-no-lru-touch` and `release-touch-after-decrement`).
        "lru" => CheckConfig { scripts: Some(crate::config::lru_scripts()), max_regions: Some(2), ..base(2, 3) },
        // The lanes (LN1–LN6) under x86-TSO: a lane hit, a revoke that pins
        // it, an undo after a pin; with a limit (A6 revokes every slot); and
        // an event taken off the queue by a drain before its revoke (the
        // draining count of LN1).
        "lanes" => CheckConfig { lanes: true, scripts: Some(crate::config::lane_scripts()), ..base(2, 3) },
        "lanes+limit" => CheckConfig { lanes: true, scripts: Some(crate::config::lane_scripts()), max_regions: Some(1), ..base(2, 3) },
        // A miss over the limit notes while another thread may hold a lane
        // lease on the LRU entry (the note revokes that entry's slot, LN5).
        "lanes+note" => CheckConfig { lanes: true, scripts: Some(crate::config::lane_note_scripts()), max_regions: Some(1), ..base(2, 3) },
        "lanes-drain" => CheckConfig { lanes: true, scripts: Some(crate::config::lane_drain_scripts()), ..base(2, 3) },
        // A slot re-keyed while it may still count a lease (LN2's rule).
        "lanes-reuse" => CheckConfig { lanes: true, scripts: Some(crate::config::lane_reuse_scripts()), ..base(2, 3) },
        // The hook runs before the release, as the W1/W2 pair (sync only:
        // userfaultfd reports after the fact): the generated scripts, and
        // two windows open at once (`end-closes-oldest`).
        "2x3+pair" | "pair-windows" | "pair-closed" if monitor != MonitorKind::Sync => return None,
        "2x3+pair" => CheckConfig { pair: true, ..base(2, 3) },
        "pair-windows" => CheckConfig { pair: true, scripts: Some(crate::config::window_scripts()), ..base(2, 3) },
        // A windowed acquire whose window closes before its A9 (A7's rule of W3).
        "pair-closed" => CheckConfig { pair: true, scripts: Some(crate::config::window_closed_scripts()), ..base(2, 3) },
        // Every script release is a madvise REMOVE, queued by userfaultfd
        // before the frames change (spec.md#S7.4 (b)): the read opens a
        // window (M3), the monitor closes it once the madvise returned (M4).
        // Async only: the generated scripts, and an acquire planned between
        // the read and the zap, then one after the madvise returned
        // (`remove-without-window`).
        "2x3+remove" | "remove" if monitor != MonitorKind::Async => return None,
        "2x3+remove" => CheckConfig { remove: true, ..base(2, 3) },
        "remove" => CheckConfig { remove: true, scripts: Some(crate::config::remove_scripts()), ..base(2, 3) },
        // Two caches on one userfaultfd monitor (spec.md#S7.6, M5, M6): T0 on
        // cache 0 unmaps a page both caches cached; T1 on cache 1 acquires it
        // again (`event-to-one-cache`).
        "shared" | "2x4+shared" | "2x3+shared+remove" | "shared+remove" | "2x3+attached" if monitor != MonitorKind::Async => return None,
        // One cache attached to the process's monitor (M6: the ring, the
        // gate, the drains), with two threads on it: the generated 2x3
        // scripts as T0 and T2 on cache 0, T1 (on cache 1) idle.
        "2x3+attached" => {
            let mut scripts = crate::config::default_scripts(2, 3);
            scripts.insert(1, Vec::new());
            CheckConfig { caches: 2, scripts: Some(scripts), ..base(2, 3) }
        }
        // The generated scripts with T0 on cache 0 and T1 on cache 1: each
        // one's releases reach the other's entries only through M5.
        "2x4+shared" => CheckConfig { caches: 2, ..base(2, 4) },
        "shared" => CheckConfig { caches: 2, scripts: Some(crate::config::shared_monitor_scripts()), ..base(2, 3) },
        // Two caches with every script release a madvise REMOVE: each
        // cache's drain of the ring opens its window (M3), one M4 closes both.
        "2x3+shared+remove" => CheckConfig { caches: 2, remove: true, ..base(2, 3) },
        // T1 on cache 1 registers A between the REMOVE's read and its zap,
        // then acquires A again after the madvise returned.
        "shared+remove" => CheckConfig { caches: 2, remove: true, scripts: Some(crate::config::shared_remove_scripts()), ..base(2, 3) },
        // A0, the lock-free hit: the generated scripts, and the lane drain
        // scripts (a drain that took a munmap's event off the queue and
        // revokes before it applies it: A0's draining count).
        "lockless" => CheckConfig { lockless: true, ..base(2, 3) },
        // A3 and A8 skip their lookups while the index's insert counter is
        // unchanged (`a1-count-after-unlock`, `a4-count-after-unlock`).
        "2x3+lookup-skips" => CheckConfig { lookup_skips: true, ..base(2, 3) },
        // A0 through the hit memo: a racy slot naming entry memory that A9
        // reuses, the state word's PENDING and incarnation, the key checked
        // before and after the compare-exchange (`lockless-ignores-key`).
        "lockless+memo" => CheckConfig { lockless: true, memo: true, ..base(2, 3) },
        // A0 between a windowed entry's insert and its take-out
        // (`lockless-takes-pending`): with the pair, sync only; one policy.
        "memo-pending" if policy != OverlapPolicy::Independent || monitor != MonitorKind::Sync => return None,
        "memo-pending" => {
            CheckConfig { lockless: true, memo: true, pair: true, scripts: Some(crate::config::memo_pending_scripts()), ..base(2, 3) }
        }
        // Entry memory reused twice between A0's read and its
        // compare-exchange (`lockless-no-key-recheck`): one policy, one
        // monitor (the async one adds nothing to A0's reads).
        "memo-reuse" if policy != OverlapPolicy::Independent || monitor != MonitorKind::Sync => return None,
        "memo-reuse" => CheckConfig { lockless: true, memo: true, scripts: Some(crate::config::memo_reuse_scripts()), ..base(2, 3) },
        // T0 inserts A between T1's lookups of A (after its A1, after its
        // A4). Its scripts have no overlaps of different keys: one policy.
        "lookup-skips" if policy != OverlapPolicy::Independent => return None,
        "lookup-skips" => CheckConfig { lookup_skips: true, scripts: Some(crate::config::lookup_scripts()), ..base(2, 3) },
        // An acquire may skip A1 (straight to A2), with a limit.
        "2x3+limit+skip" => CheckConfig { skip_a1: true, max_regions: Some(1), ..base(2, 3) },
        // R1's atomics as steps (the touch, the decrement, the flag's load),
        // with a limit: misses over it between them (`release-flag-before-decrement`).
        "2x3+limit+steps" => CheckConfig { release_steps: true, max_regions: Some(1), ..base(2, 3) },
        // The same with the LRU scripts: an eviction between the decrement
        // and a late touch (`release-touch-after-decrement`).
        "lru+steps" => CheckConfig { release_steps: true, scripts: Some(crate::config::lru_scripts()), max_regions: Some(2), ..base(2, 3) },
        // The cache skips A1 only on a thread with a lane: the same with lanes.
        "lanes+limit+skip" => {
            CheckConfig { lanes: true, skip_a1: true, scripts: Some(crate::config::lane_scripts()), max_regions: Some(1), ..base(2, 3) }
        }
        // Without limits, the ENOMEM trim (S2.8) is the one note: A0's hits
        // before, after and between its compare-exchanges (one step each, as
        // in the cache; loom's `lockless_hit_vs_trim` checks the same race
        // on the atomics).
        "lockless+pressure" => CheckConfig { lockless: true, registrar_failures: 2, ..base(2, 3) },
        // The trim's compare-exchanges, one step each, beside an A0 hit on
        // an entry the trim noted (`trim-reads-then-ors`).
        // Its scripts have no events and no overlaps: one policy, one monitor.
        "lockless+trim" if policy != OverlapPolicy::Independent || monitor != MonitorKind::Sync => return None,
        "lockless+trim" => {
            CheckConfig { lockless: true, registrar_failures: 1, scripts: Some(crate::config::trim_scripts()), ..base(2, 3) }
        }
        // The LRU scripts with the restamp skip (`restamp-skip-when-recent`,
        // `lru-skips-restamp`). Their scripts have no overlaps: one policy.
        "lru+restamp" if policy != OverlapPolicy::Independent => return None,
        "lru+restamp" => {
            CheckConfig { restamp_skip: true, scripts: Some(crate::config::lru_scripts()), max_regions: Some(2), ..base(2, 3) }
        }
        // The lanes as built: two slots per lane, direct-mapped, with A and C
        // in one slot (`lane-hit-ignores-key`). Their scripts have no
        // overlapping ranges: one policy.
        // The lane protocol does not depend on the monitor (the lane
        // families above run both): the sync monitor only.
        "lanes-collide" | "lanes-remote" | "lanes-claims" if policy != OverlapPolicy::Independent || monitor != MonitorKind::Sync => {
            return None
        }
        "lanes-collide" => CheckConfig { lanes: true, lane_slots: 2, scripts: Some(crate::config::lane_collide_scripts()), ..base(2, 3) },
        // A lane lease released on another thread (`remote`, read before
        // `held` in separate steps by LN4 and LN5), beside the owner's lane
        // hits on the same slot (`lane-remote-writes-held`).
        "lanes-remote" => CheckConfig { lanes: true, scripts: Some(crate::config::lane_remote_scripts()), ..base(2, 3) },
        // Lane claims given back with a lane lease out and claimed by the
        // other thread, which hits the old owner's memo
        // (`lane-release-by-acquirer`).
        "lanes-claims" => CheckConfig { lanes: true, give_backs: 2, scripts: Some(crate::config::lane_claim_scripts()), ..base(2, 3) },
        "lockless-drain" => CheckConfig { lockless: true, lanes: true, scripts: Some(crate::config::lane_drain_scripts()), ..base(2, 3) },
        // M4 as the prover's steps (S7.5): the scan, the signals, each
        // thread's acknowledgement at a return to user mode, the close; the
        // madvise's zap and its return two steps (`proof-without-ack`,
        // `proof-kernel-outside`). Async only, one cache.
        "remove+proof" | "2x3+remove+proof" if monitor != MonitorKind::Async => return None,
        "2x3+remove+proof" => CheckConfig { remove: true, proof_steps: true, ..base(2, 3) },
        "remove+proof" => CheckConfig { remove: true, proof_steps: true, scripts: Some(crate::config::remove_scripts()), ..base(2, 3) },
        // A11's post-unlock drain as the cache runs it (unlock, then rounds
        // of a queue check and a try of the lock), with the cache freeing
        // its own page under the lock: a hook's event queued while a round
        // holds the lock is left to that round's holder (`drain-one-round`).
        // Only the sync hook queues events: sync only.
        "2x3+drain-rounds" | "lockless+drain-rounds" if monitor != MonitorKind::Sync => return None,
        "2x3+drain-rounds" => CheckConfig { drain_rounds: true, cache_frees: Some(CacheFrees::Private), ..base(2, 3) },
        // And A0 beside the rounds: its hits check the queue a drain round
        // has not emptied yet.
        "lockless+drain-rounds" => CheckConfig { drain_rounds: true, lockless: true, cache_frees: Some(CacheFrees::Private), ..base(2, 3) },
        // The user's flush (S2.5) while the flusher holds a lease and the
        // other thread registers, holds, releases or unmaps an overlapping
        // entry; with a limit (the flush clears the over-limit flag); and
        // with the lanes (the flush revokes every slot, LN5).
        "flush" => CheckConfig { scripts: Some(crate::config::flush_scripts()), ..base(2, 3) },
        "flush+limit" => CheckConfig { scripts: Some(crate::config::flush_scripts()), max_regions: Some(1), ..base(2, 3) },
        "lanes+flush" => CheckConfig { lanes: true, scripts: Some(crate::config::flush_scripts()), ..base(2, 3) },
        // Registrations widened to chunks of 2 pages (S6.2): the chunk
        // scripts (an event on a page only the rounding added, during the
        // registration; a hit on the chunk), and the generated scripts,
        // whose pages 0 and 1 are one chunk.
        "chunk" => CheckConfig { chunk_pages: 2, scripts: Some(crate::config::chunk_scripts()), ..base(2, 3) },
        "2x3+chunk" => CheckConfig { chunk_pages: 2, ..base(2, 3) },
        // Cost-aware eviction (S6.3, GreedyDual-Size): the cost scripts,
        // where priority and the floor decide the victims (their ranges do
        // not overlap but for Y: no merge, no uncache), and the generated
        // scripts under max_regions 1 (entries of one and two pages).
        "cost" => CheckConfig { cost_aware: true, scripts: Some(crate::config::cost_scripts()), max_regions: Some(2), ..base(2, 3) },
        "2x3+limit+cost" => CheckConfig { cost_aware: true, max_regions: Some(1), ..base(2, 3) },
        // The queue's hull (L2) at a capacity of 1: the hull scripts (two
        // munmaps queued while a miss holds the lock, their hull over an
        // entry between them), and the generated scripts with the
        // registrar's and the cache's frees (events queued beside T1's).
        // Sync only: userfaultfd's events are read, not queued; the queue
        // holds only the hooks' (nested events under async, one at most here).
        "hull" | "2x3+nested+hull" if monitor != MonitorKind::Sync => return None,
        "hull" => CheckConfig { max_unreleased: 1, scripts: Some(crate::config::hull_scripts()), ..base(2, 3) },
        "2x3+nested+hull" => {
            CheckConfig { max_unreleased: 1, registrar_frees: Some(1), cache_frees: Some(CacheFrees::Private), ..base(2, 3) }
        }
        // A fork (F1) while the other thread is anywhere in the cache;
        // with a limit (a miss's A6-A11 section, R2). Sync only: a
        // userfaultfd monitor does not follow the child (S2.6).
        "fork" | "fork+limit" if monitor != MonitorKind::Sync => return None,
        "fork" => CheckConfig { scripts: Some(crate::config::fork_scripts()), ..base(2, 3) },
        "fork+limit" => CheckConfig { scripts: Some(crate::config::fork_scripts()), max_regions: Some(1), ..base(2, 3) },
        _ => return None,
    })
}

/// Unique states of each pinned configuration, `family policy monitor`.
const COUNTS: &[(&str, usize)] = &[
    ("2x3 independent sync", 2188),
    ("2x3 independent async", 2952),
    ("2x3 merge sync", 3121),
    ("2x3 merge async", 4113),
    ("2x3 no-merge-uncache-contained sync", 2891),
    ("2x3 no-merge-uncache-contained async", 3814),
    ("2x4 independent sync", 20720),
    ("2x4 independent async", 24322),
    ("2x4 merge sync", 32255),
    ("2x4 merge async", 38841),
    ("2x4 no-merge-uncache-contained sync", 29126),
    ("2x4 no-merge-uncache-contained async", 34216),
    ("3x2 independent sync", 51666),
    ("3x2 independent async", 90959),
    ("3x2 merge sync", 108118),
    ("3x2 merge async", 173008),
    ("3x2 no-merge-uncache-contained sync", 83412),
    ("3x2 no-merge-uncache-contained async", 142569),
    ("2x3+nested independent sync", 117544),
    ("2x3+nested independent async", 121789),
    ("2x3+nested merge sync", 185049),
    ("2x3+nested merge async", 194009),
    ("2x3+nested no-merge-uncache-contained sync", 161895),
    ("2x3+nested no-merge-uncache-contained async", 163586),
    ("2x3+limit independent sync", 5146),
    ("2x3+limit independent async", 6989),
    ("2x3+limit merge sync", 5068),
    ("2x3+limit merge async", 6822),
    ("2x3+limit no-merge-uncache-contained sync", 4671),
    ("2x3+limit no-merge-uncache-contained async", 6318),
    ("2x3+pinned-bytes independent sync", 10659),
    ("2x3+pinned-bytes independent async", 15344),
    ("2x3+pinned-bytes merge sync", 15979),
    ("2x3+pinned-bytes merge async", 23453),
    ("2x3+pinned-bytes no-merge-uncache-contained sync", 11195),
    ("2x3+pinned-bytes no-merge-uncache-contained async", 15598),
    ("2x3+nested+limit independent sync", 222769),
    ("2x3+nested+limit independent async", 271696),
    ("2x3+nested+limit merge sync", 267932),
    ("2x3+nested+limit merge async", 333743),
    ("2x3+nested+limit no-merge-uncache-contained sync", 237821),
    ("2x3+nested+limit no-merge-uncache-contained async", 282877),
    ("2x3+cache-app-page independent sync", 18087),
    ("2x3+cache-app-page merge sync", 22775),
    ("2x3+cache-app-page no-merge-uncache-contained sync", 21110),
    ("2x3+e6 independent sync", 19636),
    ("2x3+e6 independent async", 27981),
    ("2x3+e6 merge sync", 22848),
    ("2x3+e6 merge async", 32752),
    ("2x3+e6 no-merge-uncache-contained sync", 21478),
    ("2x3+e6 no-merge-uncache-contained async", 30622),
    ("lru independent sync", 9772),
    ("lru independent async", 17816),
    ("lru merge sync", 9772),
    ("lru merge async", 17816),
    ("lru no-merge-uncache-contained sync", 9772),
    ("lru no-merge-uncache-contained async", 17816),
    ("2x3+pressure independent sync", 70607),
    ("2x3+pressure independent async", 95715),
    ("2x3+pressure merge sync", 95407),
    ("2x3+pressure merge async", 129862),
    ("2x3+pressure no-merge-uncache-contained sync", 81061),
    ("2x3+pressure no-merge-uncache-contained async", 108693),
    ("limit-event independent sync", 2431),
    ("limit-event independent async", 3705),
    ("limit-event merge sync", 2431),
    ("limit-event merge async", 3705),
    ("limit-event no-merge-uncache-contained sync", 2431),
    ("limit-event no-merge-uncache-contained async", 3705),
    ("lanes independent sync", 7185),
    ("lanes independent async", 11677),
    ("lanes merge sync", 7185),
    ("lanes merge async", 11677),
    ("lanes no-merge-uncache-contained sync", 7185),
    ("lanes no-merge-uncache-contained async", 11677),
    ("lanes+limit independent sync", 8245),
    ("lanes+limit independent async", 14107),
    ("lanes+limit merge sync", 8245),
    ("lanes+limit merge async", 14107),
    ("lanes+limit no-merge-uncache-contained sync", 8245),
    ("lanes+limit no-merge-uncache-contained async", 14107),
    ("lanes+note independent sync", 88345),
    ("lanes+note independent async", 88345),
    ("lanes+note merge sync", 88345),
    ("lanes+note merge async", 88345),
    ("lanes+note no-merge-uncache-contained sync", 88345),
    ("lanes+note no-merge-uncache-contained async", 88345),
    ("lanes-drain independent sync", 17565),
    ("lanes-drain independent async", 24121),
    ("lanes-drain merge sync", 17565),
    ("lanes-drain merge async", 24121),
    ("lanes-drain no-merge-uncache-contained sync", 17565),
    ("lanes-drain no-merge-uncache-contained async", 24121),
    ("lanes-reuse independent sync", 55398),
    ("lanes-reuse independent async", 72149),
    ("lanes-reuse merge sync", 55398),
    ("lanes-reuse merge async", 72149),
    ("lanes-reuse no-merge-uncache-contained sync", 55398),
    ("lanes-reuse no-merge-uncache-contained async", 72149),
    ("2x3+pair independent sync", 7967),
    ("2x3+pair merge sync", 12084),
    ("2x3+pair no-merge-uncache-contained sync", 11429),
    ("pair-windows independent sync", 5349),
    ("pair-windows merge sync", 5349),
    ("pair-windows no-merge-uncache-contained sync", 5349),
    ("pair-closed independent sync", 2537),
    ("pair-closed merge sync", 2537),
    ("pair-closed no-merge-uncache-contained sync", 2537),
    ("2x3+remove independent async", 12426),
    ("2x3+remove merge async", 16835),
    ("2x3+remove no-merge-uncache-contained async", 15885),
    ("remove independent async", 7525),
    ("remove merge async", 7525),
    ("remove no-merge-uncache-contained async", 7525),
    ("shared independent async", 1286),
    ("shared merge async", 1286),
    ("shared no-merge-uncache-contained async", 1286),
    ("2x4+shared independent async", 9452),
    ("2x4+shared merge async", 9452),
    ("2x4+shared no-merge-uncache-contained async", 9452),
    ("2x3+shared+remove independent async", 11034),
    ("2x3+shared+remove merge async", 11034),
    ("2x3+shared+remove no-merge-uncache-contained async", 11034),
    ("shared+remove independent async", 236074),
    ("shared+remove merge async", 236074),
    ("shared+remove no-merge-uncache-contained async", 236074),
    ("2x3+attached independent async", 6903),
    ("2x3+attached merge async", 9904),
    ("2x3+attached no-merge-uncache-contained async", 9248),
    ("lockless independent sync", 2848),
    ("lockless independent async", 3916),
    ("lockless merge sync", 4014),
    ("lockless merge async", 5422),
    ("lockless no-merge-uncache-contained sync", 3675),
    ("lockless no-merge-uncache-contained async", 4975),
    ("lockless-drain independent sync", 34114),
    ("lockless-drain independent async", 48454),
    ("lockless-drain merge sync", 34114),
    ("lockless-drain merge async", 48454),
    ("lockless-drain no-merge-uncache-contained sync", 34114),
    ("lockless-drain no-merge-uncache-contained async", 48454),
    ("lockless+pressure independent sync", 46814),
    ("lockless+pressure independent async", 67271),
    ("lockless+pressure merge sync", 78313),
    ("lockless+pressure merge async", 111018),
    ("lockless+pressure no-merge-uncache-contained sync", 65690),
    ("lockless+pressure no-merge-uncache-contained async", 92091),
    ("lockless+trim independent sync", 2963),
    ("2x3+limit+skip independent sync", 6830),
    ("2x3+limit+skip independent async", 11919),
    ("2x3+limit+skip merge sync", 6486),
    ("2x3+limit+skip merge async", 10866),
    ("2x3+limit+skip no-merge-uncache-contained sync", 5894),
    ("2x3+limit+skip no-merge-uncache-contained async", 9870),
    ("lanes+limit+skip independent sync", 13518),
    ("lanes+limit+skip independent async", 25214),
    ("lanes+limit+skip merge sync", 13518),
    ("lanes+limit+skip merge async", 25214),
    ("lanes+limit+skip no-merge-uncache-contained sync", 13518),
    ("lanes+limit+skip no-merge-uncache-contained async", 25214),
    ("lanes-collide independent sync", 11716),
    ("lanes-remote independent sync", 18051),
    ("lanes-claims independent sync", 854665),
    ("2x3+limit+steps independent sync", 7837),
    ("2x3+limit+steps independent async", 10639),
    ("2x3+limit+steps merge sync", 7699),
    ("2x3+limit+steps merge async", 10495),
    ("2x3+limit+steps no-merge-uncache-contained sync", 7022),
    ("2x3+limit+steps no-merge-uncache-contained async", 9636),
    ("lru+steps independent sync", 15254),
    ("lru+steps independent async", 28944),
    ("lru+steps merge sync", 15254),
    ("lru+steps merge async", 28944),
    ("lru+steps no-merge-uncache-contained sync", 15254),
    ("lru+steps no-merge-uncache-contained async", 28944),
    ("2x3+drain-rounds independent sync", 24348),
    ("2x3+drain-rounds merge sync", 32978),
    ("2x3+drain-rounds no-merge-uncache-contained sync", 30262),
    ("lockless+drain-rounds independent sync", 28534),
    ("lockless+drain-rounds merge sync", 38663),
    ("lockless+drain-rounds no-merge-uncache-contained sync", 35312),
    ("remove+proof independent async", 15314),
    ("remove+proof merge async", 15314),
    ("remove+proof no-merge-uncache-contained async", 15314),
    ("2x3+remove+proof independent async", 36859),
    ("2x3+remove+proof merge async", 49996),
    ("2x3+remove+proof no-merge-uncache-contained async", 47373),
    ("2x3+lookup-skips independent sync", 2245),
    ("2x3+lookup-skips independent async", 3004),
    ("2x3+lookup-skips merge sync", 3148),
    ("2x3+lookup-skips merge async", 4113),
    ("2x3+lookup-skips no-merge-uncache-contained sync", 2918),
    ("2x3+lookup-skips no-merge-uncache-contained async", 3814),
    ("lookup-skips independent sync", 422),
    ("lookup-skips independent async", 644),
    ("lockless+memo independent sync", 3081),
    ("lockless+memo independent async", 4144),
    ("lockless+memo merge sync", 4357),
    ("lockless+memo merge async", 5744),
    ("lockless+memo no-merge-uncache-contained sync", 3999),
    ("lockless+memo no-merge-uncache-contained async", 5278),
    ("memo-pending independent sync", 100032),
    ("memo-reuse independent sync", 267916),
    ("lru+restamp independent sync", 9882),
    ("lru+restamp independent async", 17772),
    ("flush independent sync", 10855),
    ("flush independent async", 16398),
    ("flush merge sync", 17354),
    ("flush merge async", 25688),
    ("flush no-merge-uncache-contained sync", 13265),
    ("flush no-merge-uncache-contained async", 19505),
    ("flush+limit independent sync", 21130),
    ("flush+limit independent async", 30803),
    ("flush+limit merge sync", 23083),
    ("flush+limit merge async", 32906),
    ("flush+limit no-merge-uncache-contained sync", 18537),
    ("flush+limit no-merge-uncache-contained async", 26210),
    ("lanes+flush independent sync", 11473),
    ("lanes+flush independent async", 16854),
    ("lanes+flush merge sync", 18824),
    ("lanes+flush merge async", 26768),
    ("lanes+flush no-merge-uncache-contained sync", 13883),
    ("lanes+flush no-merge-uncache-contained async", 19961),
    ("chunk independent sync", 3040),
    ("chunk independent async", 3952),
    ("chunk merge sync", 3132),
    ("chunk merge async", 4077),
    ("chunk no-merge-uncache-contained sync", 3132),
    ("chunk no-merge-uncache-contained async", 4077),
    ("2x3+chunk independent sync", 2161),
    ("2x3+chunk independent async", 2846),
    ("2x3+chunk merge sync", 2172),
    ("2x3+chunk merge async", 2857),
    ("2x3+chunk no-merge-uncache-contained sync", 2172),
    ("2x3+chunk no-merge-uncache-contained async", 2857),
    ("cost independent sync", 24446),
    ("cost independent async", 24446),
    ("cost merge sync", 24446),
    ("cost merge async", 24446),
    ("cost no-merge-uncache-contained sync", 24446),
    ("cost no-merge-uncache-contained async", 24446),
    ("2x3+limit+cost independent sync", 5095),
    ("2x3+limit+cost independent async", 6896),
    ("2x3+limit+cost merge sync", 5068),
    ("2x3+limit+cost merge async", 6822),
    ("2x3+limit+cost no-merge-uncache-contained sync", 4671),
    ("2x3+limit+cost no-merge-uncache-contained async", 6318),
    ("hull independent sync", 33925),
    ("hull merge sync", 33925),
    ("hull no-merge-uncache-contained sync", 33925),
    ("2x3+nested+hull independent sync", 148254),
    ("2x3+nested+hull merge sync", 227791),
    ("2x3+nested+hull no-merge-uncache-contained sync", 204637),
    ("fork independent sync", 803),
    ("fork merge sync", 803),
    ("fork no-merge-uncache-contained sync", 803),
    ("fork+limit independent sync", 1255),
    ("fork+limit merge sync", 1255),
    ("fork+limit no-merge-uncache-contained sync", 1255),
];

/// Whether every generic reachability goal must be reached in `fam`. The lru
/// and lane families (and the others listed) run their own scripts, which do
/// not reach the generic goals (the lane goals are checked apart); so do cost
/// and hull (no overlaps but one), and fork (no overlaps; T1 does not exist
/// after the fork).
fn goals_required(fam: &str) -> bool {
    !fam.starts_with("lru")
        && fam != "cost"
        && fam != "hull"
        && !fam.starts_with("fork")
        && fam != "limit-event"
        && !fam.starts_with("lanes")
        && fam != "lockless-drain"
        && fam != "pair-windows"
        && fam != "pair-closed"
        && fam != "remove"
        && fam != "remove+proof"
        && !fam.contains("shared")
        && fam != "lockless+trim"
        && fam != "lookup-skips"
        && !fam.starts_with("memo-")
}

/// Every pinned configuration with its recorded unique-state count (0 when
/// not recorded yet).
pub fn pinned_configs() -> Vec<Pinned> {
    let mut out = Vec::new();
    for fam in FAMILIES {
        for policy in OverlapPolicy::ALL {
            for monitor in MonitorKind::ALL {
                let Some(cfg) = family(fam, policy, monitor) else { continue };
                let name = format!("{fam} {} {}", policy.name(), monitor.name());
                let unique_states = COUNTS.iter().find(|(n, _)| *n == name).map(|(_, c)| *c).unwrap_or(0);
                out.push(Pinned { name, cfg, unique_states, goals_required: goals_required(fam) });
            }
        }
    }
    out
}

/// The problems of a pinned configuration's outcome: a violated property, a
/// goal not reached where the family requires it (the generic goals, and
/// the goals a family exists for), an incomplete search, or another number
/// of unique states than `p.unique_states`. Empty: the configuration passes.
pub fn problems(p: &Pinned, out: &Outcome) -> Vec<String> {
    let fam = p.name.split(' ').next().unwrap_or_default();
    let unreached = out.unreached();
    let mut problems = Vec::new();
    if !out.complete {
        problems.push("exploration incomplete".to_string());
    }
    problems.extend(out.violated().iter().map(|v| format!("VIOLATED {v}")));
    if p.goals_required {
        problems.extend(unreached.iter().map(|g| format!("not reached: {g}")));
    }
    if fam == "lanes" {
        problems.extend(unreached.iter().filter(|g| g.contains("lane")).map(|g| format!("lane goal not reached: {g}")));
    }
    // The note's revoke (LN5) must pin a lane lease there: the case it exists for.
    if fam == "lanes+note" && unreached.iter().any(|g| g.contains("a revoke pins a lane lease")) {
        problems.push("no note pinned a lane lease".to_string());
    }
    // A registration planned inside a REMOVE's window (M3) must be served
    // uncached there (W3): the case the window exists for.
    if (fam == "remove" || fam == "shared+remove") && unreached.contains(&props::S_WINDOWED) {
        problems.push("no registration was served inside a REMOVE window".to_string());
    }
    if p.unique_states == 0 {
        problems
            .push(format!("{} unique states, none pinned (recount: `mrcache check --pinned [--threads3] --recount`)", out.unique_states));
    } else if out.unique_states != p.unique_states {
        problems.push(format!("{} unique states, pinned {}", out.unique_states, p.unique_states));
    }
    problems
}

// ---------------------------------------------------------------------------
// The families at 3 threads (the full tier: `mrcache check --pinned
// --threads3`, the ignored test `every_family_at_three_threads`).
//
// Each family's 3-thread form is derived from its 2-thread configuration
// (`family` above), so a new family gets one by the default rules:
// - generated scripts (`scripts` is `None`): 3 threads, `THREE_THREAD_OPS`
//   ops each (2 unless listed there: 3 x 3 of a feature family is 10-30 M
//   states or more, minutes each, against seconds at 3 x 2; thread 2 runs
//   the generated pattern of index 2: a madvise of page 0, an acquire of
//   page 0 and later of pages 0-1);
// - hand-written scripts: a third thread (T2) running `third_thread`'s
//   script, by default the first operation of the generated pattern of
//   index 2 (a madvise of page 0): page 0 is the range every hand-written
//   script acquires and releases (A), so T2's release event overlaps the
//   other threads' entries;
// - the largest hand-written families (`SPLIT_THIRD_THREAD`): T2 runs the
//   last operation of one thread's script, moved;
// - a family whose scripts make the overlap policy irrelevant
//   (`policy_blind`) runs the independent policy only;
// - the families in `NO_THREE_THREADS` are not run here, with the reason.
// The name of a 3-thread configuration is its family's (`family policy
// monitor`); its goals are the 2-thread family's.
// ---------------------------------------------------------------------------

/// Families without a 3-thread form here, and why.
pub const NO_THREE_THREADS: &[(&str, &str)] = &[
    ("2x3", "its 3-thread form, 3 threads x 3 ops, is ci/check-large.sh (the full tier's `large` step)"),
    ("2x4", "3 threads x 4 ops is past exhaustive reach (its BFS filled 23 GB); 3 x 3 is ci/check-large.sh"),
    ("3x2", "already 3 threads (pinned in the fast tier); 3 x 3 is ci/check-large.sh"),
];

/// Hand-written families whose 3-thread form moves one thread's last
/// operation to the third thread (T2) instead of adding T2's madvise, and
/// the thread that gives it: with the madvise added each ran past 100 M
/// states in 6-15 minutes without finishing (their 2-thread forms are the
/// largest, 100,032-854,665 states). The moved operation keeps its script
/// (T2 may start it after its old predecessor returned, as before, or run
/// it concurrently), and T2 is on the giver's cache (thread `t` is on cache
/// `t % caches`): T0 where there are two caches, else T1.
const SPLIT_THIRD_THREAD: &[(&str, usize)] = &[
    // T0 (cache 0): madvise REMOVE A; T1 (cache 1): acquire A, release,
    // acquire A; T2 (cache 0): acquire A.
    ("shared+remove", 0),
    // T1: acquire A, release, acquire B, acquire A; T2: munmap A (which
    // revokes T1's and T0's slots of A).
    ("lanes-claims", 1),
    // T1: acquire A, release, munmap A; T2: acquire A (the memo read
    // between the windowed entry's insert and its take-out).
    ("memo-pending", 1),
    // T1: munmap A, acquire C, release, munmap C; T2: acquire B (on A's
    // first page: it takes the freed memory).
    ("memo-reuse", 1),
];

/// Ops per thread of the generated families at 3 threads, where not 2.
const THREE_THREAD_OPS: &[(&str, usize)] = &[];

/// T2's script in a hand-written family at 3 threads (see above).
fn third_thread(_fam: &str) -> Vec<mrcache_types::Op> {
    crate::config::default_scripts(3, 1).swap_remove(2)
}

/// The 3-thread form of `cfg`, family `fam`'s 2-thread configuration.
fn three_threads(fam: &str, mut cfg: CheckConfig) -> CheckConfig {
    match cfg.scripts.take() {
        None => {
            cfg.threads = 3;
            cfg.ops = THREE_THREAD_OPS.iter().find(|(f, _)| *f == fam).map_or(2, |(_, o)| *o);
        }
        // `2x3+attached`: T1 (on cache 1) is idle at 2 threads, T0 and T2
        // run the generated patterns 0 and 1 on cache 0; at 3 threads T1
        // runs the first two operations of pattern 2 (a madvise of page 0,
        // then an acquire of page 0), whose event reaches cache 0 through
        // the ring.
        Some(mut scripts) if scripts.len() >= 3 => {
            if let Some(idle) = scripts.iter().position(|s| s.is_empty()) {
                scripts[idle] = crate::config::default_scripts(3, 2).swap_remove(2);
            }
            cfg.scripts = Some(scripts);
        }
        Some(mut scripts) => {
            let third = match SPLIT_THIRD_THREAD.iter().find(|(f, _)| *f == fam) {
                Some(&(_, from)) => vec![scripts[from].pop().expect("a split family's giver has operations")],
                None => third_thread(fam),
            };
            scripts.push(third);
            cfg.scripts = Some(scripts);
        }
    }
    cfg
}

/// Whether the overlap policy cannot change a run of `scripts`: any two
/// acquires ask for the same range with the same access, or for disjoint
/// ranges. The policies differ only on a request that overlaps another
/// entry's range without being it (a merge, an uncache, a second entry),
/// and the entries are then always the requests' ranges. Such families run
/// one policy at 3 threads (their 2-thread counts are the same under each,
/// as `lanes-collide` runs one policy at 2 threads).
fn policy_blind(scripts: &[Vec<mrcache_types::Op>]) -> bool {
    let acquires: Vec<_> = scripts
        .iter()
        .flatten()
        .filter_map(|op| match *op {
            mrcache_types::Op::Acquire { addr, len, access, .. } => Some((addr, addr.saturating_add(len), access)),
            _ => None,
        })
        .collect();
    acquires.iter().all(|a| acquires.iter().all(|b| a == b || a.1 <= b.0 || b.1 <= a.0))
}

/// Unique states of each 3-thread configuration, `family policy monitor`.
/// Recount (after a change of the model, the scripts or FAMILIES) with
/// `mrcache check --pinned --threads3 --recount` and paste its output here.
const COUNTS3: &[(&str, usize)] = &[
    ("2x3+attached independent async", 18885640),
    ("2x3+attached merge async", 47611928),
    ("2x3+cache-app-page independent sync", 420445),
    ("2x3+cache-app-page merge sync", 645711),
    ("2x3+cache-app-page no-merge-uncache-contained sync", 553733),
    ("2x3+e6 independent async", 588423),
    ("2x3+e6 independent sync", 405323),
    ("2x3+e6 merge async", 661589),
    ("2x3+e6 merge sync", 473280),
    ("2x3+e6 no-merge-uncache-contained async", 642649),
    ("2x3+e6 no-merge-uncache-contained sync", 447322),
    ("2x3+limit independent async", 315223),
    ("2x3+limit independent sync", 186620),
    ("2x3+limit merge async", 361287),
    ("2x3+limit merge sync", 234600),
    ("2x3+limit no-merge-uncache-contained async", 318761),
    ("2x3+limit no-merge-uncache-contained sync", 187190),
    ("2x3+limit+skip independent async", 377379),
    ("2x3+limit+skip independent sync", 211531),
    ("2x3+limit+skip merge async", 394054),
    ("2x3+limit+skip merge sync", 247306),
    ("2x3+limit+skip no-merge-uncache-contained async", 350765),
    ("2x3+limit+skip no-merge-uncache-contained sync", 199403),
    ("2x3+limit+steps independent async", 1043784),
    ("2x3+limit+steps independent sync", 604193),
    ("2x3+limit+steps merge async", 1080222),
    ("2x3+limit+steps merge sync", 717838),
    ("2x3+limit+steps no-merge-uncache-contained async", 962496),
    ("2x3+limit+steps no-merge-uncache-contained sync", 568844),
    ("2x3+nested independent async", 8700335),
    ("2x3+nested independent sync", 7994212),
    ("2x3+nested merge async", 16223478),
    ("2x3+nested merge sync", 15561035),
    ("2x3+nested no-merge-uncache-contained async", 13986379),
    ("2x3+nested no-merge-uncache-contained sync", 12774379),
    ("2x3+pair independent sync", 227333),
    ("2x3+pair merge sync", 409386),
    ("2x3+pair no-merge-uncache-contained sync", 357986),
    ("2x3+pinned-bytes independent async", 387446),
    ("2x3+pinned-bytes independent sync", 219493),
    ("2x3+pinned-bytes merge async", 571110),
    ("2x3+pinned-bytes merge sync", 343622),
    ("2x3+pinned-bytes no-merge-uncache-contained async", 427252),
    ("2x3+pinned-bytes no-merge-uncache-contained sync", 243865),
    ("2x3+pressure independent async", 12004216),
    ("2x3+pressure independent sync", 6875387),
    ("2x3+pressure merge async", 16819815),
    ("2x3+pressure merge sync", 10427768),
    ("2x3+pressure no-merge-uncache-contained async", 14115772),
    ("2x3+pressure no-merge-uncache-contained sync", 8166490),
    ("2x3+remove independent async", 2417554),
    ("2x3+remove merge async", 4078280),
    ("2x3+remove no-merge-uncache-contained async", 3654649),
    ("2x3+shared+remove independent async", 6827141),
    ("2x3+shared+remove merge async", 7010486),
    ("2x3+shared+remove no-merge-uncache-contained async", 7010486),
    ("2x4+shared independent async", 103459),
    ("2x4+shared merge async", 107230),
    ("2x4+shared no-merge-uncache-contained async", 107230),
    ("lanes independent async", 1253460),
    ("lanes independent sync", 1274345),
    ("lanes+limit independent async", 2002246),
    ("lanes+limit independent sync", 1836558),
    ("lanes+limit+skip independent async", 3144498),
    ("lanes+limit+skip independent sync", 2556192),
    ("lanes-collide independent sync", 1642749),
    ("lanes-drain independent async", 2989215),
    ("lanes-drain independent sync", 3329837),
    ("lanes-remote independent sync", 4530753),
    ("lanes-reuse independent async", 11087685),
    ("lanes-reuse independent sync", 13237040),
    ("limit-event independent async", 319639),
    ("limit-event independent sync", 295765),
    ("lockless independent async", 113093),
    ("lockless independent sync", 63293),
    ("lockless merge async", 205880),
    ("lockless merge sync", 126203),
    ("lockless no-merge-uncache-contained async", 173504),
    ("lockless no-merge-uncache-contained sync", 99331),
    ("lockless+pressure independent async", 4460293),
    ("lockless+pressure independent sync", 2234676),
    ("lockless+pressure merge async", 9497838),
    ("lockless+pressure merge sync", 5157827),
    ("lockless+pressure no-merge-uncache-contained async", 7619743),
    ("lockless+pressure no-merge-uncache-contained sync", 3907224),
    ("lockless+trim independent sync", 351737),
    ("lockless-drain independent async", 5394413),
    ("lockless-drain independent sync", 5598159),
    ("lru independent async", 1999225),
    ("lru independent sync", 1560954),
    ("lru+steps independent async", 3492311),
    ("lru+steps independent sync", 2619394),
    ("pair-closed independent sync", 1401760),
    ("pair-windows independent sync", 939009),
    ("remove independent async", 3581131),
    ("shared independent async", 949451),
    ("2x3+chunk independent sync", 96020),
    ("2x3+chunk independent async", 160844),
    ("2x3+chunk merge sync", 103452),
    ("2x3+chunk merge async", 176669),
    ("2x3+chunk no-merge-uncache-contained sync", 103452),
    ("2x3+chunk no-merge-uncache-contained async", 176669),
    ("2x3+drain-rounds independent sync", 856986),
    ("2x3+drain-rounds merge sync", 1660640),
    ("2x3+drain-rounds no-merge-uncache-contained sync", 1327224),
    ("2x3+limit+cost independent sync", 199556),
    ("2x3+limit+cost independent async", 345512),
    ("2x3+limit+cost merge sync", 234600),
    ("2x3+limit+cost merge async", 361287),
    ("2x3+limit+cost no-merge-uncache-contained sync", 187190),
    ("2x3+limit+cost no-merge-uncache-contained async", 318761),
    ("2x3+lookup-skips independent sync", 60200),
    ("2x3+lookup-skips independent async", 101994),
    ("2x3+lookup-skips merge sync", 116151),
    ("2x3+lookup-skips merge async", 179398),
    ("2x3+lookup-skips no-merge-uncache-contained sync", 89771),
    ("2x3+lookup-skips no-merge-uncache-contained async", 148578),
    ("2x3+remove+proof independent async", 6897606),
    ("2x3+remove+proof merge async", 10422008),
    ("2x3+remove+proof no-merge-uncache-contained async", 9634059),
    ("chunk independent sync", 617742),
    ("chunk independent async", 529869),
    ("chunk merge sync", 645651),
    ("chunk merge async", 547055),
    ("chunk no-merge-uncache-contained sync", 645651),
    ("chunk no-merge-uncache-contained async", 547055),
    ("cost independent sync", 11099663),
    ("cost independent async", 12291683),
    ("flush+limit independent sync", 2219414),
    ("flush+limit independent async", 2460683),
    ("flush+limit merge sync", 2958488),
    ("flush+limit merge async", 2930094),
    ("flush+limit no-merge-uncache-contained sync", 2121822),
    ("flush+limit no-merge-uncache-contained async", 2181213),
    ("flush independent sync", 1036038),
    ("flush independent async", 1262441),
    ("flush merge sync", 2156255),
    ("flush merge async", 2248283),
    ("flush no-merge-uncache-contained sync", 1494008),
    ("flush no-merge-uncache-contained async", 1617344),
    ("fork+limit independent sync", 61163),
    ("fork independent sync", 37861),
    ("lanes+flush independent sync", 1136731),
    ("lanes+flush independent async", 1300341),
    ("lanes+flush merge sync", 2421026),
    ("lanes+flush merge async", 2340031),
    ("lanes+flush no-merge-uncache-contained sync", 1594701),
    ("lanes+flush no-merge-uncache-contained async", 1655244),
    ("lockless+drain-rounds independent sync", 950407),
    ("lockless+drain-rounds merge sync", 1804919),
    ("lockless+drain-rounds no-merge-uncache-contained sync", 1456857),
    ("lockless+memo independent sync", 77421),
    ("lockless+memo independent async", 132683),
    ("lockless+memo merge sync", 156437),
    ("lockless+memo merge async", 244622),
    ("lockless+memo no-merge-uncache-contained sync", 122672),
    ("lockless+memo no-merge-uncache-contained async", 206955),
    ("lookup-skips independent sync", 31183),
    ("lookup-skips independent async", 32623),
    ("lru+restamp independent sync", 1570107),
    ("lru+restamp independent async", 1987083),
    ("remove+proof independent async", 29413523),
    ("2x3+attached no-merge-uncache-contained async", 34021279),
    ("hull independent sync", 12207295),
    ("2x3+nested+hull independent sync", 16160816),
    ("2x3+nested+hull merge sync", 26105013),
    ("2x3+nested+hull no-merge-uncache-contained sync", 22696909),
    ("2x3+nested+limit independent sync", 25015112),
    ("2x3+nested+limit independent async", 29585009),
    ("2x3+nested+limit merge sync", 31573373),
    ("2x3+nested+limit merge async", 34110660),
    ("2x3+nested+limit no-merge-uncache-contained sync", 26636734),
    ("2x3+nested+limit no-merge-uncache-contained async", 31269460),
    ("lanes+note independent sync", 40803122),
    ("lanes+note independent async", 38430600),
    ("shared+remove independent async", 901758),
    ("lanes-claims independent sync", 77710620),
    ("memo-pending independent sync", 3821096),
    ("memo-reuse independent sync", 29003732),
];

/// Every family's 3-thread configurations (but those of [`NO_THREE_THREADS`])
/// with their recorded unique-state counts (0 when not recorded yet).
pub fn pinned3_configs() -> Vec<Pinned> {
    let mut out = Vec::new();
    for fam in FAMILIES {
        if NO_THREE_THREADS.iter().any(|(f, _)| *f == fam) {
            continue;
        }
        for policy in OverlapPolicy::ALL {
            for monitor in MonitorKind::ALL {
                let Some(cfg) = family(fam, policy, monitor) else { continue };
                let cfg = three_threads(fam, cfg);
                if policy != OverlapPolicy::Independent && cfg.scripts.as_deref().is_some_and(policy_blind) {
                    continue;
                }
                let name = format!("{fam} {} {}", policy.name(), monitor.name());
                let unique_states = COUNTS3.iter().find(|(n, _)| *n == name).map(|(_, c)| *c).unwrap_or(0);
                out.push(Pinned { name, cfg, unique_states, goals_required: goals_required(fam) });
            }
        }
    }
    out
}

/// The families (names) of `FAMILIES`, for listings.
pub fn families() -> &'static [&'static str] {
    &FAMILIES
}
