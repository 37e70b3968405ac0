//! The replay report of recorded traces (docs/replay-report.md): the
//! registration threshold, `mrcache report` on a slice of a real trace
//! (model and cache agree), its charts, the cost model, and the errors for
//! bad `--threshold` / `--cost-model` values.

use mrcache_cli::{cost, plot, replay, report};
use mrcache_model::Config;
use mrcache_types::trace::Trace;
use std::path::{Path, PathBuf};
use std::process::Command;

fn real(run: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/real").join(run).join("rank-0.jsonl.gz")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mrcache-report-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// L1 (100 bytes) is below a 4 KiB threshold, L2 (64 KiB) above; the name
/// L1 is reused for a large acquire once the small one is released.
const SMALL_AND_LARGE: &str = r#"{"mrcache_trace": 1, "source": "hand-written"}
{"op": "acquire", "lease": 1, "addr": "0x10000", "len": 100, "access": "remote_read"}
{"op": "acquire", "lease": 2, "addr": "0x20000", "len": 65536, "access": "remote_read"}
{"op": "release", "lease": 1}
{"op": "release", "lease": 2}
{"op": "acquire", "lease": 1, "addr": "0x20000", "len": 8192, "access": "remote_read"}
{"op": "release", "lease": 1}
"#;

#[test]
fn acquires_below_the_threshold_are_skipped_with_their_releases() {
    let trace = Trace::parse("small-and-large", SMALL_AND_LARGE).unwrap();
    let mask = replay::skip_mask(&trace, 4096).unwrap();
    assert_eq!(mask, [true, false, true, false, false, false]);
    assert!(replay::skip_mask(&trace, 0).is_none(), "threshold 0 registers everything");

    let run = |threshold| {
        let mask = replay::skip_mask(&trace, threshold);
        replay::replay_model_with("t", &trace, Config::default(), false, mask.as_deref(), &mut |_, _| {}).unwrap()
    };
    let all = run(0);
    assert_eq!((all.stats.acquires, all.stats.releases, all.stats.misses, all.stats.hits), (3, 3, 2, 1));
    let big = run(4096);
    assert_eq!(big.skipped, 2);
    // Only L2 and the 8 KiB reuse of L1 (a hit inside L2's registration).
    assert_eq!((big.stats.acquires, big.stats.releases, big.stats.misses, big.stats.hits), (2, 2, 1, 1));
    let none = run(1 << 20);
    assert_eq!((none.stats.acquires, none.stats.releases, none.skipped), (0, 0, 6));
}

#[test]
fn the_default_threshold_applies_to_recorded_traces_only() {
    let hand = Trace::parse("hand", SMALL_AND_LARGE).unwrap();
    assert_eq!(replay::threshold_for(None, &hand), 0);
    assert_eq!(replay::threshold_for(Some(4096), &hand), 4096);
    let recorded = replay::load(&real("netpipe")).unwrap();
    assert_eq!(replay::threshold_for(None, &recorded), replay::DEFAULT_THRESHOLD);
    assert_eq!(replay::threshold_for(Some(0), &recorded), 0);
}

#[test]
fn byte_counts_parse_with_binary_suffixes() {
    for (s, want) in [("0", 0), ("8192", 8192), ("4k", 4096), ("64K", 65536), ("64KiB", 65536), ("1m", 1 << 20), ("2g", 2 << 30)] {
        assert_eq!(replay::parse_bytes(s).unwrap(), want, "{s}");
    }
    for bad in ["", "k", "8x", "-1", "1.5k", "99999999999999999999g"] {
        assert!(replay::parse_bytes(bad).is_err(), "{bad}");
    }
}

/// The report on the first records of a real trace: every sweep runs, the
/// cache agrees with the model (the report fails otherwise), the charts are
/// SVG documents.
#[test]
fn the_report_on_a_slice_of_a_real_trace_agrees_and_plots() {
    let dir = tmp("plot");
    let args = report::ReportArgs {
        traces: vec![real("netpipe"), real("lammps-peptide")],
        plot: Some(dir.clone()),
        json: false,
        quick: true,
        quiet: true,
        threshold: None,
        cost_model: report::CostSpec::Given(cost::parse("300,30,290,9").unwrap()),
        records: Some(6000),
    };
    let r = report::run(&args).unwrap();
    assert_eq!(r.traces.len(), 2);
    for t in &r.traces {
        assert!(t.records > 6000 - 1 && t.records < 6000 + 200, "{}: trimmed, open leases closed: {}", t.label, t.records);
        assert_eq!(t.sweep_threshold, replay::DEFAULT_THRESHOLD);
        assert_eq!(t.impl_check.cache, t.impl_check.model, "{}", t.label);
        assert_eq!(t.thresholds.len(), 3 * 3, "3 policies x 3 quick thresholds");
        assert_eq!(t.limits.len(), 3 * 2 * 3, "3 policies x 2 evictions x 3 quick limits");
        assert_eq!(t.series.len(), 3);
        assert!(t.series.iter().all(|s| !s.points.is_empty()));
        assert!(t.savings.iter().all(|s| s.uncached_ms >= s.cached_ms && s.saved_ms.is_finite()), "{:?}", t.savings);
    }
    let text = report::tables(&r);
    assert!(text.contains("stats equal") && text.contains("netpipe/rank-0"), "{text}");
    let files = plot::write_all(&r, &dir).unwrap();
    assert_eq!(files.len(), 2 * 3 + 1);
    for f in &files {
        let svg = std::fs::read_to_string(f).unwrap();
        assert!(svg.len() > 1000 && svg.contains("<svg") && svg.trim_end().ends_with("</svg>"), "{}", f.display());
        assert!(svg.contains("<text"), "{}: labels are SVG text", f.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Not a timing assertion: the measurement yields usable coefficients.
#[test]
fn the_cost_measurement_gives_positive_finite_coefficients() {
    match cost::measure(true) {
        Ok((m, samples)) => {
            assert_eq!(samples.len(), 8);
            for x in [m.reg_ns, m.reg_ns_per_page, m.dereg_ns, m.dereg_ns_per_page] {
                assert!(x.is_finite() && x >= 0.0, "{m:?}");
            }
            assert!(m.reg_ns + m.reg_ns_per_page > 0.0, "{m:?}");
            assert!(samples.iter().all(|s| s.register_median_ns > 0.0), "{samples:?}");
        }
        Err(e) if e.to_string().contains("io_uring registrar unavailable") => {
            eprintln!("skipped: {e}");
        }
        Err(e) => panic!("{e:#}"),
    }
}

fn mrcache(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_mrcache")).args(args).output().unwrap()
}

#[test]
fn bad_threshold_and_cost_model_are_clear_errors() {
    let trace = real("netpipe");
    let trace = trace.to_str().unwrap();
    for (args, needle) in [
        (vec!["replay", "--threshold", "8x", trace], "invalid byte count `8x`"),
        (vec!["report", "--threshold", "lots", trace], "invalid byte count `lots`"),
        (vec!["report", "--cost-model", "1,2,3", trace], "expected A_NS,B_NS_PER_PAGE or A,B,C,D"),
        (vec!["report", "--cost-model", "fast,1", trace], "`fast` is not a number"),
        (vec!["report", "--cost-model=-5,1", trace], "must be a finite number"),
    ] {
        let out = mrcache(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // A missing trace names the file.
    let out = mrcache(&["report", "--quick", "--cost-model", "none", "/nonexistent/rank-0.jsonl.gz"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("/nonexistent/rank-0.jsonl.gz") && !err.contains("panicked"), "{err}");
}

/// `mrcache replay` applies the default threshold to a recorded trace and
/// says so in its table; `--threshold 0` gives today's figures.
#[test]
fn replay_shows_the_threshold_in_force() {
    let trace = real("netpipe");
    let trace = trace.to_str().unwrap();
    let out = mrcache(&["replay", "--json", trace]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["threshold"], 8192);
    assert!(v[0]["skipped"].as_u64().unwrap() > 0);
    let out = mrcache(&["replay", "--json", "--threshold", "0", trace]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v[0]["threshold"].as_u64(), v[0]["skipped"].as_u64()), (Some(0), Some(0)));
    assert_eq!(v[0]["stats"]["acquires"], 14478, "every acquire of NetPIPE's rank 0");
}
