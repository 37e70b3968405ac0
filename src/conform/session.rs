//! One case from start to verdict: start the adapter, exchange hellos, check
//! the capabilities and limits the case needs, set up both judges, drive the
//! records (`CaseRun::run`) and turn what the judges found into one
//! [`CaseResult`]. The adapter is killed whatever the outcome; a failing or
//! diverging case keeps the tail of the exchange and of the adapter's stderr.

use super::adapter_process::{AdapterProcess, Line};
use super::hello::{parse_hello, Hello};
use super::report::Failure;
use super::{Case, CaseResult, CaseRun, ConformArgs, Stop, Verdict, PROTOCOL};
use mrcache_model::{Config, Model, OverlapPolicy};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

fn result(case: &Case, verdict: Verdict, rule: &str, line: usize, detail: String) -> CaseResult {
    CaseResult {
        case: case.name.clone(),
        verdict,
        rule: rule.into(),
        line,
        detail,
        divergence: None,
        failures: Vec::new(),
        registrations: 0,
        required: 0,
        extra: 0,
        l1: String::new(),
        data: String::new(),
        transcript: Vec::new(),
    }
}

/// Where a case's `preload` allocator is looked for.
const LIB_DIRS: [&str; 5] = ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"];

/// The environment that runs the adapter under the case's allocator
/// (`LD_PRELOAD` and the allocator's own settings), or why it cannot.
fn preload_env(case: &Case, args: &ConformArgs) -> Result<Vec<(String, String)>, String> {
    let name = match (&case.preload, &args.preload) {
        (Some(n), _) => n,
        (None, Some(n)) => {
            let glibc = case.records.iter().any(|(_, r)| {
                matches!(
                    r,
                    super::Record::Mem {
                        kind: super::MemKind::Malloc | super::MemKind::Free | super::MemKind::BrkGrow | super::MemKind::BrkShrink,
                        ..
                    }
                )
            });
            if glibc {
                return Err(format!("--preload {n}: the case's malloc, free or brk records are judged as glibc serves them"));
            }
            n
        }
        (None, None) => return Ok(Vec::new()),
    };
    let pre = super::PRELOADS.iter().find(|x| x.name == name).ok_or_else(|| format!("unknown allocator {name}"))?;
    let path = LIB_DIRS.iter().map(|d| std::path::Path::new(d).join(pre.lib)).find(|p| p.exists()).ok_or_else(|| {
        format!("{name} is not installed here ({} is in none of {}; Debian: apt-get install lib{name}*)", pre.lib, LIB_DIRS.join(", "))
    })?;
    let mut env = vec![("LD_PRELOAD".to_string(), path.display().to_string())];
    env.extend(pre.env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Ok(env)
}

pub(super) fn run_case(case: &Case, args: &ConformArgs) -> (Option<CaseResult>, Option<Hello>) {
    let env = match preload_env(case, args) {
        Ok(e) => e,
        Err(why) => return (Some(result(case, Verdict::Unsupported, "-", 1, why)), None),
    };
    let mut ad = match AdapterProcess::spawn(&args.adapter, &env) {
        Ok(a) => a,
        Err(e) => return (Some(result(case, Verdict::Fail, "crash", 0, format!("{e:#}"))), None),
    };
    let hello_cmd = json!({
        "seq": 0, "cmd": "hello", "protocol": PROTOCOL, "case": case.name,
        "config": {"max_regions": case.max_regions, "max_pinned_bytes": case.max_pinned_bytes, "arena_len": case.arena},
    });
    let timeout = Duration::from_secs_f64(args.timeout.max(0.1));
    let hello = (|| -> Result<Hello, (String, String)> {
        if ad.send(&hello_cmd, 1).is_err() {
            // Its stdin closed: it exited (or is exiting) before reading the
            // hello; report how it ended, not the broken pipe.
            return Err(("crash".into(), format!("the adapter {} before its hello", ad.exit_status())));
        }
        let deadline = Instant::now() + timeout;
        loop {
            match ad.rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(Line::Text(t)) => {
                    ad.note(format!("< {t}"));
                    let v: Value =
                        serde_json::from_str(&t).map_err(|e| ("protocol".into(), format!("adapter line is not JSON ({e}): `{t}`")))?;
                    if v.get("ev").is_some() {
                        continue;
                    }
                    if let Some(why) = super::gaps::hello_unsupported(&v) {
                        return Err(("unsupported".into(), why));
                    }
                    return parse_hello(&v, "hello").map_err(|e| ("protocol".into(), e));
                }
                Ok(Line::Eof) => return Err(("crash".into(), format!("the adapter {} before its hello", ad.exit_status()))),
                Ok(Line::TooLong) => {
                    let how = ad.end_after_too_long();
                    return Err((
                        "protocol".into(),
                        format!("the adapter wrote a line longer than {} bytes, {how}", super::adapter_process::MAX_LINE),
                    ));
                }
                Err(_) => return Err(("hang".into(), format!("no hello within {:.1} s", args.timeout))),
            }
        }
    })();
    let hello = match hello {
        Ok(h) => h,
        Err((rule, detail)) if rule == "unsupported" => {
            ad.kill();
            return (Some(result(case, Verdict::Unsupported, "-", 1, detail)), None);
        }
        Err((rule, detail)) => {
            let mut r = result(case, Verdict::Fail, &rule, 1, detail);
            r.transcript = ad.transcript.clone();
            r.transcript.extend(ad.stderr_tail().into_iter().map(|l| format!("stderr: {l}")));
            ad.kill();
            return (Some(r), None);
        }
    };
    // Capabilities the case needs.
    let mut needs = case.needs.clone();
    if case.max_regions.is_some() || case.max_pinned_bytes.is_some() {
        needs.push("limits".into());
    }
    if let Some(n) = needs.iter().find(|n| !hello.caps.contains(n)) {
        let _ = ad.send(&json!({"seq": 1, "cmd": "end"}), 0);
        ad.kill();
        return (Some(result(case, Verdict::Unsupported, "-", 1, format!("the adapter lacks the `{n}` capability"))), Some(hello));
    }
    if (case.max_regions.is_some() && hello.limits.max_regions != case.max_regions)
        || (case.max_pinned_bytes.is_some() && hello.limits.max_pinned_bytes != case.max_pinned_bytes)
    {
        ad.kill();
        return (
            Some(result(
                case,
                Verdict::Fail,
                "protocol",
                1,
                format!(
                    "the case asks for max_regions {:?} max_pinned_bytes {:?}; the adapter declared {:?} {:?}",
                    case.max_regions, case.max_pinned_bytes, hello.limits.max_regions, hello.limits.max_pinned_bytes
                ),
            )),
            Some(hello),
        );
    }
    if let Some(why) = super::gaps::arena_too_small(case, &hello) {
        ad.kill();
        return (Some(result(case, Verdict::Fail, "protocol", 1, why)), Some(hello));
    }
    let policy = args.policy.or(hello.policy);
    let config = Config {
        policy: policy.unwrap_or(OverlapPolicy::Independent),
        page_size: hello.page_size,
        chunk_pages: hello.chunk_size / hello.page_size,
        eviction: hello.eviction,
        limits: hello.limits,
    };
    if let Err(e) = config.validate() {
        ad.kill();
        return (Some(result(case, Verdict::Fail, "protocol", 1, format!("hello: {e}"))), Some(hello));
    }
    let mut bufs = HashMap::new();
    bufs.insert("arena".to_string(), (hello.arena.addr, hello.arena.len));
    let mut run = CaseRun {
        case,
        args,
        ad,
        seq: 0,
        pending: BTreeMap::new(),
        page: hello.page_size,
        access_classes: hello.access_classes.clone(),
        bufs,
        models: vec![Model::new(config)],
        log: Vec::new(),
        // C rules bind only a peer that declared a policy itself; `--policy`
        // picks what the model compares an undeclared peer with.
        declared: hello.policy.is_some(),
        next_model_id: 1,
        divergence: None,
        events: Vec::new(),
        event_seq: 0,
        regs: HashMap::new(),
        reg_order: 0,
        leases: HashMap::new(),
        lease_count: HashMap::new(),
        deregs_buffered: Vec::new(),
        snap: None,
        note: None,
        deferred: Vec::new(),
        ops_done: 0,
        l1_since: HashMap::new(),
        l1_worst: None,
        failure: None,
        failures: Vec::new(),
        failure_transcript: None,
        gaps: super::gaps::GapState::new(config, &hello),
        data: Default::default(),
        during: None,
        rss_mark: None,
        orphans: Default::default(),
    };
    let outcome = run.run();
    run.l1_judge_end();
    // A stop (crash, hang, protocol) after recorded failures is one more of
    // them; the first failure stays the verdict.
    let outcome = match outcome {
        Err(Stop::Fail(f)) if run.failure.is_some() => {
            run.record_failure(f);
            Ok(())
        }
        Err(Stop::Unsupported(..)) if run.failure.is_some() => Ok(()),
        o => o,
    };
    let mut r = match outcome {
        Ok(()) => match (&run.failure, &run.divergence) {
            (Some(f), _) => result(case, Verdict::Fail, &f.rule, f.line, f.detail.clone()),
            (None, Some(d)) => result(case, Verdict::Diverges, &d.rule, d.line, d.detail.clone()),
            (None, None) => result(case, Verdict::Pass, "-", 0, String::new()),
        },
        Err(Stop::Unsupported(line, why)) => result(case, Verdict::Unsupported, "-", line, why),
        Err(Stop::Fail(f)) => result(case, Verdict::Fail, &f.rule, f.line, f.detail),
    };
    run.data_finish(&mut r);
    if r.verdict == Verdict::Fail || r.verdict == Verdict::Diverges {
        r.transcript = run.failure_transcript.clone().unwrap_or_else(|| run.ad.transcript.clone());
        r.transcript.extend(run.ad.stderr_tail().into_iter().map(|l| format!("stderr: {l}")));
    }
    if r.verdict == Verdict::Fail {
        if let Some(d) = &run.divergence {
            r.divergence = Some(format!("line {}: {} {}", d.line, d.rule, d.detail));
        }
        r.failures = run.failures.iter().map(|f| Failure { rule: f.rule.clone(), line: f.line, detail: f.detail.clone() }).collect();
        if r.failures.is_empty() {
            r.failures.push(Failure { rule: r.rule.clone(), line: r.line, detail: r.detail.clone() });
        }
    }
    r.l1 = run.l1_summary();
    run.efficiency(&mut r);
    if let Some(n) = &run.note {
        r.divergence = Some(n.clone());
    }
    run.ad.kill();
    (Some(r), Some(hello))
}
