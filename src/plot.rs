//! SVG charts of a [`crate::report::Report`] (`mrcache report --plot DIR`).
//!
//! Per trace `<run>-rank-<r>`:
//! - `pinned-<…>.svg`: pinned MiB over the run, one line per overlap policy;
//! - `hits-<…>.svg`: cumulative hits (left) and misses (right) over the run;
//! - `limits-<…>.svg`: hit rate against `max_pinned_bytes` (log-spaced axis),
//!   one line per overlap policy × eviction policy;
//!
//! and `thresholds.svg`: hit rate against the registration threshold, one line
//! per trace (independent policy).
//!
//! plotters' SVG backend writes text as `<text>` elements and, built without
//! its font features, sizes labels with its own estimate: no system font is
//! loaded. Invariant: every file written is a complete SVG document, or the
//! function returns an error naming it.

use crate::replay::human;
use crate::report::{eviction_name, Point, Report, Series, TraceReport};
use anyhow::{anyhow, Context, Result};
use mrcache_model::{EvictionPolicy, OverlapPolicy};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

const SIZE: (u32, u32) = (900, 500);
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
];

fn policy_color(p: OverlapPolicy) -> RGBColor {
    COLORS[OverlapPolicy::ALL.iter().position(|&q| q == p).unwrap_or(0)]
}

/// Overlap policies are drawn widest first, so lines that coincide (common:
/// the policies often agree) stay visible as nested strokes.
fn policy_width(p: OverlapPolicy) -> u32 {
    match p {
        OverlapPolicy::Independent => 6,
        OverlapPolicy::Merge => 3,
        OverlapPolicy::NoMergeUncacheContained => 1,
    }
}

const LABEL_FONT: (&str, u32) = ("sans-serif", 15);
const DESC_FONT: (&str, u32) = ("sans-serif", 16);
const LIGHT: RGBColor = RGBColor(242, 242, 242);
const BOLD: RGBColor = RGBColor(205, 205, 205);

fn slug(label: &str) -> String {
    label.replace('/', "-")
}

/// Writes every chart into `dir` (created if needed); returns the files.
pub fn write_all(report: &Report, dir: &Path) -> Result<Vec<PathBuf>> {
    prepare_dir(dir)?;
    let mut files = Vec::new();
    for t in &report.traces {
        let s = slug(&t.label);
        for (name, f) in [
            (format!("pinned-{s}.svg"), pinned as fn(&TraceReport, &Path) -> Result<()>),
            (format!("hits-{s}.svg"), hits),
            (format!("limits-{s}.svg"), limits),
        ] {
            let path = dir.join(name);
            f(t, &path).with_context(|| format!("chart {}", path.display()))?;
            files.push(path);
        }
    }
    let path = dir.join("thresholds.svg");
    thresholds(report, &path).with_context(|| format!("chart {}", path.display()))?;
    files.push(path);
    Ok(files)
}

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("{e}")
}

/// x of a sample: seconds when the trace has times, else the record index.
fn x_of(p: &Point) -> f64 {
    p.t_s.unwrap_or(p.index as f64)
}

fn x_desc(series: &[Series]) -> &'static str {
    let timed = series.iter().flat_map(|s| s.points.iter()).all(|p| p.t_s.is_some());
    if timed {
        "time since MPI_Init (s)"
    } else {
        "record"
    }
}

fn x_max(series: &[Series]) -> f64 {
    series.iter().flat_map(|s| s.points.iter()).map(x_of).fold(0.0, f64::max).max(1e-9)
}

fn title(t: &TraceReport, what: &str) -> String {
    format!("{}: {what} (threshold {})", t.label, human(t.sweep_threshold))
}

type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A chart's mesh, in one style on every chart: set the descriptions, then
/// `.draw()`.
macro_rules! mesh {
    ($chart:expr) => {
        $chart.configure_mesh().light_line_style(LIGHT).bold_line_style(BOLD).label_style(LABEL_FONT).axis_desc_style(DESC_FONT)
    };
}

/// One overlap policy's line, labelled for the legend.
macro_rules! policy_line {
    ($chart:expr, $policy:expr, $points:expr) => {{
        let (c, w) = (policy_color($policy), policy_width($policy));
        $chart
            .draw_series(LineSeries::new($points, c.stroke_width(w)))
            .map_err(err)?
            .label($policy.name())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(w)));
    }};
}

/// The legend, in one style on every chart.
fn legend<'a, 'b: 'a, C: CoordTranslate>(chart: &mut ChartContext<'a, SVGBackend<'b>, C>, at: SeriesLabelPosition) -> Result<()> {
    chart
        .configure_series_labels()
        .label_font(LABEL_FONT)
        .position(at)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)
}

/// A chart whose x axis is the categories 0, 1, … named by `labels` (limits,
/// thresholds), y in percent; `draw` adds the labelled series.
fn category_chart(
    path: &Path,
    caption: &str,
    labels: &[String],
    y: std::ops::Range<f64>,
    x_desc: &str,
    legend_at: SeriesLabelPosition,
    draw: impl FnOnce(&mut Chart<'_, '_>) -> Result<()>,
) -> Result<()> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let n = labels.len().max(2);
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.3f64..(n as f64 - 0.7), y)
        .map_err(err)?;
    let fmt = |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 0.01 && i >= 0.0 {
            labels.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    mesh!(chart).x_desc(x_desc).y_desc("hit rate (%)").x_labels(n).x_label_formatter(&fmt).disable_x_mesh().draw().map_err(err)?;
    draw(&mut chart)?;
    legend(&mut chart, legend_at)?;
    root.present().map_err(err)?;
    Ok(())
}

fn pinned(t: &TraceReport, path: &Path) -> Result<()> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let y_max = t.series.iter().flat_map(|s| s.points.iter()).map(|p| mib(p.pinned_bytes)).fold(0.0, f64::max).max(0.1) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(title(t, "pinned memory, no limit"), ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_max(&t.series), 0f64..y_max)
        .map_err(err)?;
    mesh!(chart).x_desc(x_desc(&t.series)).y_desc("pinned (MiB)").draw().map_err(err)?;
    for s in &t.series {
        // Steps: pinned bytes hold until the next sample.
        let mut pts = Vec::with_capacity(2 * s.points.len());
        for (i, p) in s.points.iter().enumerate() {
            if i > 0 {
                pts.push((x_of(p), mib(s.points[i - 1].pinned_bytes)));
            }
            pts.push((x_of(p), mib(p.pinned_bytes)));
        }
        policy_line!(chart, s.policy, pts);
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present().map_err(err)?;
    Ok(())
}

fn hits(t: &TraceReport, path: &Path) -> Result<()> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root.titled(&title(t, "cumulative hits and misses, no limit"), ("sans-serif", 22)).map_err(err)?;
    let (left, right) = root.split_horizontally(SIZE.0 / 2);
    let max_of = |get: fn(&Point) -> u64| t.series.iter().flat_map(|s| s.points.iter()).map(|p| get(p) as f64).fold(0.0, f64::max);
    // One panel; the y axis differs (linear hits, log misses), hence a macro.
    macro_rules! panel {
        ($area:expr, $y:expr, $what:expr, $get:expr, $fmt:expr, $pos:expr) => {{
            let get: fn(&Point) -> f64 = $get;
            let mut chart = ChartBuilder::on($area)
                .margin(12)
                .x_label_area_size(45)
                .y_label_area_size(65)
                .build_cartesian_2d(0f64..x_max(&t.series), $y)
                .map_err(err)?;
            mesh!(chart).x_desc(x_desc(&t.series)).y_desc($what).x_labels(5).y_label_formatter($fmt).draw().map_err(err)?;
            for s in &t.series {
                policy_line!(chart, s.policy, s.points.iter().map(|p| (x_of(p), get(p))));
            }
            legend(&mut chart, $pos)?;
        }};
    }
    let hits_max = max_of(|p| p.hits).max(4.5) * 1.1;
    panel!(
        &left,
        0f64..hits_max,
        "hits",
        |p| p.hits as f64,
        &|v: &f64| if (v - v.round()).abs() < 1e-6 { format!("{v:.0}") } else { String::new() },
        SeriesLabelPosition::UpperLeft
    );
    // Misses span 10 to 10^5 between policies: log scale, 0 drawn at 1.
    let misses_max = max_of(|p| p.misses).max(10.0) * 2.0;
    panel!(
        &right,
        (1f64..misses_max).log_scale(),
        "misses = registrations (log scale)",
        |p| (p.misses as f64).max(1.0),
        &|v: &f64| format!("{v:.0}"),
        SeriesLabelPosition::LowerRight
    );
    root.present().map_err(err)?;
    Ok(())
}

fn limits(t: &TraceReport, path: &Path) -> Result<()> {
    // Limits from the smallest to unlimited, on an index axis: the swept
    // limits are spaced ×4, so equal steps are a log scale.
    let mut ls: Vec<Option<u64>> = Vec::new();
    for r in &t.limits {
        if !ls.contains(&r.max_pinned_bytes) {
            ls.push(r.max_pinned_bytes);
        }
    }
    ls.sort_by_key(|l| l.unwrap_or(u64::MAX));
    let labels: Vec<String> = ls.iter().map(|l| l.map_or("unlimited".into(), human)).collect();
    let y_min = t.limits.iter().map(|r| r.hit_rate).fold(100.0, f64::min);
    let y_lo = (y_min - 5.0).clamp(0.0, 95.0).floor();
    let caption = title(t, "hit rate against the byte limit");
    let x = "max_pinned_bytes (log scale)";
    category_chart(path, &caption, &labels, y_lo..100.5, x, SeriesLabelPosition::LowerRight, |chart| {
        for p in OverlapPolicy::ALL {
            for e in [EvictionPolicy::Lru, EvictionPolicy::CostAware] {
                let c = policy_color(p);
                let pts: Vec<(f64, f64)> = ls
                    .iter()
                    .enumerate()
                    .filter_map(|(i, l)| {
                        t.limits
                            .iter()
                            .find(|r| r.policy == p && r.eviction == e && r.max_pinned_bytes == *l)
                            .map(|r| (i as f64, r.hit_rate))
                    })
                    .collect();
                let w = policy_width(p);
                let style = if e == EvictionPolicy::Lru { c.stroke_width(w) } else { c.mix(0.5).stroke_width(w.div_ceil(2)) };
                chart
                    .draw_series(LineSeries::new(pts.clone(), style))
                    .map_err(err)?
                    .label(format!("{}, {}", p.name(), eviction_name(e)))
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
                // LRU: filled dots; cost-aware: open squares.
                if e == EvictionPolicy::Lru {
                    chart.draw_series(pts.iter().map(|&(x, y)| Circle::new((x, y), 4, c.filled()))).map_err(err)?;
                } else {
                    chart.draw_series(pts.iter().map(|&(x, y)| Circle::new((x, y), 6, c.stroke_width(1)))).map_err(err)?;
                }
            }
        }
        Ok(())
    })
}

fn thresholds(report: &Report, path: &Path) -> Result<()> {
    let mut ts: Vec<u64> = report.traces.iter().flat_map(|t| t.thresholds.iter().map(|r| r.threshold)).collect();
    ts.sort_unstable();
    ts.dedup();
    let labels: Vec<String> = ts.iter().map(|&b| if b == 0 { "0 (all)".into() } else { human(b) }).collect();
    let runs = |t: &TraceReport| -> Vec<(f64, f64)> {
        ts.iter()
            .enumerate()
            .filter_map(|(i, th)| {
                t.thresholds
                    .iter()
                    .find(|r| r.policy == OverlapPolicy::Independent && r.threshold == *th && r.stats.acquires > 0)
                    .map(|r| (i as f64, r.hit_rate))
            })
            .collect()
    };
    let y_min = report.traces.iter().flat_map(&runs).map(|(_, y)| y).fold(100.0, f64::min);
    let y_lo = (y_min - 2.0).clamp(0.0, 98.0).floor();
    let caption = "hit rate against the registration threshold (independent, no limit, LRU)";
    let x = "acquires below this many bytes are eager, not registered";
    category_chart(path, caption, &labels, y_lo..100.3, x, SeriesLabelPosition::LowerLeft, |chart| {
        for (k, t) in report.traces.iter().enumerate() {
            let c = COLORS[k % COLORS.len()];
            // Widest first: traces with the same figures stay visible.
            let w = 2 + (report.traces.len().saturating_sub(1 + k) as u32) * 3 / 2;
            let pts = runs(t);
            chart
                .draw_series(LineSeries::new(pts.clone(), c.stroke_width(w)))
                .map_err(err)?
                .label(t.label.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(w)));
            chart.draw_series(pts.iter().map(|&(x, y)| Circle::new((x, y), 4, c.filled()))).map_err(err)?;
        }
        Ok(())
    })
}

/// Makes the `--plot` directory (`mrcache report` calls it before its work).
pub fn prepare_dir(dir: &std::path::Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("--plot {}: cannot create the directory", dir.display()))
}
