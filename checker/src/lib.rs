//! A stateright model of mrcache's concurrent algorithm (spec.md §A), checked
//! against the safety and liveness properties of spec.md §3–§4 and, for
//! linearizability, against the reference model (`mrcache_model::Model`,
//! spec.md#S9), with stateright's `LinearizabilityTester`.
//!
//! # What is modeled
//!
//! *Actors.* N application threads, each running a fixed script of
//! [`Op`](mrcache_types::Op)s (acquire, release, release events: munmap,
//! madvise, mremap, MAP_FIXED); with the `async` monitor, one uffd monitor
//! thread. A release event can also be raised *inside* a cache operation: by
//! the registrar while it registers (A5, [`CheckConfig::registrar_frees`]) or
//! by the cache freeing its own memory while it holds the lock (A9,
//! [`CheckConfig::cache_frees`]); each at most once per run, at a
//! nondeterministically chosen A5/A9 (the action's `alt` branch). The
//! registrar can also fail at an A5 ([`CheckConfig::registrar_failures`],
//! action `RegistrarFails`): an acquire's first failure is ENOMEM and trims
//! (S5.4; the trim is logged as a `trim` op on the thread's nested id, and the
//! model judges with `trims_logged`), a later one is EINVAL (E5, or a hit if
//! an entry covers the request by then).
//!
//! *State* ([`State`]). The lock as explicit state (`Free`, `Shared(n)`,
//! `Exclusive(actor)`); every registration the registrar made (never removed:
//! its deregistration count is kept), with the cache entry state (id, findable,
//! the state word's lease count and INVALID bit); the in-flight records (one
//! per thread, with the stale flag); the invalidation queue; the uffd queue of
//! unread events (with the thread asleep on each) and the monitor's buffer of
//! events read but not applied; the over-limit flag; the LRU clock (only with
//! limits); each thread's program counter and locals (the acquire's plan and
//! registration, its dereg list, leases held). *Physical truth*: a generation
//! per page, bumped when the kernel releases the frames; a registration
//! records the generations it pinned. A tiny address space: the pages the
//! scripts use (2 for the generated scripts) plus one private page of the cache.
//! Each thread, the registrations and the monitor are [`shared::Shared`]
//! parts: a successor shares those its step did not change, and hashes each
//! as its fingerprint, computed once per value.
//!
//! *Steps.* One action is one atomic step of one actor. Steps that only touch
//! thread-local state or happen under the exclusive lock are merged where no
//! other actor could observe the difference; lock-free steps (R1, H1, the
//! kernel's release, reading uffd) are separate, so every interleaving §A
//! allows between them is explored. Invocation of an op is folded into its
//! first step and the return into its last (this removes only executions with
//! *fewer* real-time constraints, so no violation is lost).
//!
//! | step | where | granularity |
//! |---|---|---|
//! | A1 | `start_op`, `a1_lookup` | check the queue and take the lock shared (blocks while a writer holds it); then lookup + lease + touch + unlock |
//! | A2, A6 | `thread_step` | take the lock exclusive (blocking), drain the queue, and with uffd read + apply pending events (with two caches: drain the ring, M6, the step enabled only with the clock even) |
//! | A3, A4 | `a3` | lookup; hit: lease, unlock. Miss: plan (S6.1), in-flight record, unlock |
//! | A5 | `a5` | register: pin the current generations (optionally the registrar then frees a page) |
//! | A7, A8, A9 | `a7` | stale → throw away, unlock, retry (E6 after `max_retries`); covered → lease that entry (A8); merge plan changed → as stale; else insert with the next id and displace what the policy gives now |
//! | A10 | `a10`, `a10b` | two steps (raise the flag, then scan), so R1 can interleave |
//! | A11 | `a11`, `unlock_exclusive`; with [`CheckConfig::drain_rounds`] `end_section`, `post_drain_step` | drain what was queued meanwhile, unlock, perform the dereg list. With `drain_rounds` (sync, no lanes): unlock and perform the dereg list; then each round of the post-unlock drain is two steps: check the queue, try the lock exclusive (a failure hands the drain to the holder) and drain; then unlock; at most 4 rounds (mutant `drain-one-round`: one) |
//! | R1 | `r1` | one atomic step: touch, decrement (seeing INVALID), read the over-limit flag |
//! | R2 | `thread_step` | lock, drain, evict, unlock |
//! | H1, H2 | `ev_step` | push; then try the lock (drain + unlock if acquired) |
//! | M1, M2 | `monitor_step` (one cache) | poll; lock; read (wakes the releasing threads); apply + unlock: read and apply are separate steps of one critical section |
//! | M3 | `open_remove_window` ([`CheckConfig::remove`]) | in the step that applies a REMOVE read by M2, A2 or A6: open a window on its pages, handed to the monitor; logged as the monitor's `release_begin` |
//! | M4 | `m4_close` (action `CloseWindow`); with [`CheckConfig::proof_steps`] `m4_prove` (action `Prove`) and `proof_ack` (action `Ack`) | the monitor, between rounds, closes a REMOVE window once its madvise has returned (S7.5's proof taken as exact); logged as its `release_end`. With `proof_steps` (one cache): the prover's scan, then passes (collect acknowledgements, look again, signal, close), each a monitor step; each signalled thread's handler a step of its own, in user mode only; the madvise's zap and return two steps |
//! | M5 | `service_step` (action `Service`; [`CheckConfig::caches`] 2) | the process monitor's service thread, each thread on cache `t mod 2` (`State::swap_cache` swaps that cache's fields in for its steps): a round starts once some cache is behind the ring and visits each cache in attach order, one step each: lock, drain the ring into it (M6), unlock, perform its dereg list (enabled when that lock is free and the clock even: a lock taken earlier, waiting there, only holds off that cache's threads); M4 runs between rounds and closes a REMOVE's window in every cache that opened it |
//! | M6 | `reader_step` (action `Monitor`), `drain_ring`, `gate_passes` (in `start_op`), `drain_may_finish` | the reader, two steps, no lock: store the clock odd and read (each releasing thread wakes), then publish in the ring and store the clock even; the ring is `State::ring` (a prefix every cache applied is dropped), the clock's odd bit `State::reading`, each cache's gate its `applied` count; A0 and A1 start only with the gate current (clock even, every published event applied), else A2; A2's and A6's drains (and the service's) apply the ring from `applied` (A-D, M3), wait out an odd clock, then set `applied` |
//! | A-D | `apply_event` | one event: entries leave the index, in-flight records go stale |
//! | A-H | `apply_event`, `r1` | one atomic OR that returns the count (mutant `handoff-toctou` splits it) |
//!
//! # Which monitor each family models
//!
//! With the async monitor and one cache ([`CheckConfig::caches`] 1) the
//! monitor is the single-cache source (M2: it reads under the cache lock;
//! A2 and A6 read too), which the cache keeps for drivers that pace it
//! (the conformance adapter): every one-cache async family (`2x3`, `lanes`,
//! `remove`, `lockless`, ...) models M2. With two caches the monitor is the
//! process's (S7.6): the reader, the ring and the gate (M6) and the service
//! thread's rounds (M5), the path of every cache the shipped code attaches,
//! even a single one: the `shared` families (a thread on each cache), and
//! `2x3+attached` (the generated 2x3 scripts as two threads on cache 0,
//! cache 1 idle: one attached cache, two threads racing on it). Not
//! modelled there: lanes (so LN1's gate check is not), limits, registrar
//! and cache frees, the ring's bound (a lapped cache's whole-space REMOVE),
//! and a detach.
//!
//! # Lanes (LN1–LN6) under x86-TSO ([`CheckConfig::lanes`], opt-in)
//!
//! Each thread holds the claim on a lane of [`CheckConfig::lane_slots`]
//! slots (key, `ptr`, `held`, `remote`, `pin`; one slot per key, by a hash
//! of the key, [`config::lane_slot`]) and every actor a FIFO *store
//! buffer*. The model is x86-TSO: a plain
//! store goes into the actor's buffer; a load reads the actor's own newest
//! buffered store to that location, else memory; action `Flush` moves the
//! oldest buffered store of an actor to memory at any time. The owner's
//! `held` stores (LN1, its undo, LN3) and a revoke's null stores of `ptr` (LN5)
//! are buffered. Every step that runs a locked instruction, a lock, the
//! lanes mutex or a system call drains its actor's own buffer first; the
//! lane steps do not (the light barrier is a compiler fence). The heavy
//! barrier (membarrier) drains every buffer. So LN1's store `held + 1` and
//! its reload of `ptr` can reorder exactly as on x86, and only the heavy
//! barrier orders them against LN5's null store and count read: this is how
//! the checker checks LN6's argument (mutant `lane-no-heavy-barrier` replaces membarrier by a fence
//! on the revoking thread and breaks P3).
//!
//! Steps: LN1 is three (first load and key check, folded into the acquire's
//! invocation; store `held + 1`; reload `ptr`, then the hit) and one more
//! after a reload of null (under the lanes mutex, read the pin: the hit, or
//! the undo store); LN3 two (touch and store `held - 1`; reload `ptr`, then R2
//! or done, or LN4); LN4 one or two (under the lanes mutex). LN5 runs *before* the
//! step that takes entries out of the index: a dry run of that step on a
//! copy of the state gives the entries it removes (A-D, A9's displacement,
//! A10, trim) or notes (A6, R2, with their second note: each noted entry is
//! revoked before its count is read; a revoke that pins changes the note, so
//! the dry run is repeated until its entries have no live slot), or whether
//! it revokes every slot (trim);
//! if live slots point to them the actor runs LN5 in three steps (take the
//! lock exclusive if the step takes it, the lanes mutex, the queued or uffd
//! events that remove them as the drain takes them before it can know the
//! entries, and store null; the heavy barrier; read the counts, pin, unlock
//! the mutex), then the step. LN2 memoizes in A1 under the shared lock (its
//! stores reach memory at the unlock). With lanes the A1 reader's drain
//! after its unlock is a step of its own (it may revoke).
//!
//! LN1's first check is *no release event pending*: none queued, and none
//! taken from the queue or read from uffd and not applied yet. The spec's
//! words ("the queue is empty") with a drain that empties the queue when it
//! takes the events, before it revokes, and a monitor whose read wakes the
//! releasing thread before it revokes, are mutant `lane-queue-len-only`: a lane hit after the
//! release event returned, P2 violated under both monitors.
//!
//! Leases and claims move as in the cache. A script may release a lease
//! another thread acquires: the acquirer hands it over with a store after
//! its acquire's own (`Store::Handover`), and the release starts once that
//! store has reached memory. A thread between operations may give its
//! lane's claim back ([`CheckConfig::give_backs`], action `GiveClaim`: a
//! store after its `held` stores); its next A1 claims the first free lane,
//! whose memos and counts it takes over. The owner of a lane is the thread
//! holding its claim *now*: a release by any other thread adds to `remote`
//! (an atomic add), and where that can happen LN4's and LN5's reads of
//! `remote` and `held` are steps of their own (else reading `remote`
//! commutes with every step, and they are one).
//!
//! Simplified: LN2's stores are written to memory at once (the shared
//! unlock right after drains them); a live memo of another key is replaced
//! at once (the cache waits a few A1 hits: a skipped memo); a claimer that
//! finds no free lane in memory goes without one (the cache makes a new
//! lane); the threads' first claims are made before the run (lane `t` is
//! thread `t`'s).
//!
//! # Properties ([`props`])
//!
//! `always`: P1 coverage and P2 freshness judged at each grant (P2: for every
//! requested page, the pinned generation is at least the one installed by
//! every release event that *completed before the acquire was invoked*;
//! concurrent events may be ordered either way, spec.md#P2); P3 (no
//! registration with leases has been deregistered); P4 (no registration
//! deregistered twice); P5 (limits, only when configured; judged when no op is
//! in flight); linearizability w.r.t. the reference model (judged when no op
//! is in flight; release events raised inside an operation are operations of
//! pseudo-threads `16 + t`; a full queue's hull, L2, of `32 + t`); P6 (no actor holds the lock exclusively while it
//! cannot move, and no state without moves while a script is unfinished); L1
//! (in terminal states: every registration neither findable nor leased was
//! deregistered, and the queue is empty; with lanes, every pin whose slot
//! counts 0 was returned). With lanes, P3 and P5 count lane leases as
//! leases. `sometimes` (reachability goals,
//! which the pinned configurations must reach): a leased entry is invalidated;
//! a merge (merge policy) or an uncache (no-merge-uncache-contained) happens;
//! a release event is applied during a registration; the monitor holds an
//! event read but not applied while an acquire is in flight (async); a hook
//! leaves its event queued because the lock is busy (sync); with lanes, a
//! lane hit, a revoke that pins a lane lease, an LN1 whose `held + 1` a
//! revoke pinned and which then reloads null and keeps its hit, and an LN1
//! that reloads null, finds no pin and undoes.
//!
//! # Invariants the modeled algorithm keeps (and the rules it needs)
//!
//! The correct algorithm here is §A plus five rules the spec does not state
//! (each has a mutant showing it is needed; see the crate's report):
//! 1. *The holder drains before it unlocks* (`unlock_exclusive`; H2's "the
//!    holder ... drains"): events a hook queued while the lock was held are
//!    applied before the lock is released (mutant `holder-skips-drain` breaks L1 without it).
//! 2. *The last fast-path reader drains*: a reader that unlocks with events
//!    queued tries the lock exclusive and drains, as H2 would (mutant `reader-skips-drain`
//!    breaks L1 without it). Together: the queue is empty in every terminal state.
//!    With `CheckConfig::drain_rounds` both are the cache's post-unlock
//!    drain (A11): after the unlock, rounds of a queue check and a try of
//!    the lock; a failed try is sound because the holder's own check comes
//!    after its unlock, which comes after the failed try.
//! 3. *A9 re-plans under the lock* (merge): if the policy's plan differs from
//!    A4's, the registration is treated as stale (retry); displaced entries are
//!    recomputed at A9 (mutant `stale-merge-plan` breaks linearizability without it).
//! 4. *A10 raises the over-limit flag before it reads lease counts*, and R1
//!    reads the flag after its decrement (mutant `over-limit-flag-late` breaks P5 otherwise).
//! 5. *R1 touches the LRU stamp* of a findable entry (S2.2), *before* its
//!    decrement: an eviction between a decrement and a later touch sees an
//!    unleased entry with a stale stamp (`release-no-lru-touch` and `release-touch-after-decrement` break
//!    linearizability under limits). With `CheckConfig::release_steps`, the
//!    touch, the decrement and the flag's load are three steps, as the
//!    cache's atomics are, and other threads act between them (families
//!    `2x3+limit+steps`, `lru+steps`; mutant `release-flag-before-decrement`
//!    loads the flag before the decrement and breaks P5).
//!
//! A8 returns `hit: true` and skips A10 (it inserts nothing). The LRU clock is
//! global; eviction is LRU, or cost-aware (S6.3) with `cost_aware`.
//!
//! # Not modeled
//!
//! Registrar failures *are* modeled (`CheckConfig::registrar_failures`,
//! [`Action::RegistrarFails`]: ENOMEM first, which takes A5's trim, then
//! ENOMEM or EINVAL, which return E5). A fork (F1, S2.6) is a script op
//! (`algo/fork.rs`, families `fork`, `fork+limit`): the other threads do
//! not exist in the child, which installs a fresh generation. The bounded queue of L2 is
//! `CheckConfig::max_unreleased` (families `hull`, `2x3+nested+hull`: H1 on
//! a full queue collapses it into a hull, logged as a release of the hull
//! by the pseudo-thread `HULL + t`). Cost-aware eviction (`CheckConfig::cost_aware`) orders the notes
//! and victims by GreedyDual-Size priority and raises the floor at each
//! eviction (families `cost`, `2x3+limit+cost`). `chunk_pages` (`CheckConfig::chunk_pages`)
//! widens A4's plan and in-flight record (families `chunk`, `2x3+chunk`).
//! The user's `flush`
//! (S2.5) is a script op (`algo/flush.rs`: one exclusive section after its
//! invocation; families `flush`, `flush+limit`, `lanes+flush`).
//!
//! # API
//!
//! [`check`] / [`check_with_progress`] run a [`CheckConfig`] with
//! [`RunOptions`] (an exhaustive BFS runs on [`engine`], the fingerprint
//! engine, unless [`Engine::Stateright`]) and return an [`Outcome`] (verdicts, counts, the first
//! counterexample with its [`timeline`] and [`counterexample_trace`]);
//! [`pinned_configs`] lists the configurations the tests pin; [`Mutant`]
//! lists the broken variants and the property each must violate;
//! [`explore`] serves stateright's Explorer; [`swarm()`] runs many seeded,
//! bounded, randomly ordered searches for configurations past exhaustive
//! checking. [`waits`] is a separate, small
//! model of who may wait on whom around the userfaultfd monitor's reader
//! and service threads (spec.md S7.7), with its own mutants
//! ([`WaitMutant`]). (The spec-citation linter, which also checks that every
//! §A step is tagged here and in impl/src, is tools/citations.)

#![forbid(unsafe_code)]

pub mod algo;
pub mod config;
pub mod engine;
pub mod history;
pub mod lincache;
pub mod mutant;
pub mod pinned;
pub mod props;
pub mod report;
pub mod run;
pub mod shared;
pub mod state;
pub mod swarm;
pub mod waits;

pub use algo::{Action, AlgoModel, Rec, RecEvent};
pub use config::{default_scripts, kdreg2_scripts, CacheFrees, CheckConfig, MonitorKind, Span};
pub use mutant::Mutant;
pub use pinned::{pinned3_configs, pinned_configs, Pinned};
pub use report::{counterexample_trace, counterexample_trace_of, timeline};
pub use run::{check, check_with_progress, explore, Counterexample, Engine, Outcome, Progress, RunOptions, Status, Strategy, Verdict};
pub use state::State;
pub use swarm::{swarm, swarm_with_progress, SwarmMode, SwarmOptions, SwarmOutcome, SwarmProgress, SwarmSummary, SwarmViolation};
pub use waits::{check_waits, WaitConfig, WaitModel, WaitMutant, WaitOutcome};
