//! `mrcache figures` (also `mrcache bench-report`): the generated parts of
//! the documentation, from the measurements committed under `docs/data/`.
//!
//! Inputs (each says when, on what and at which commit it was measured):
//! - `docs/data/peers.json`: the latest run of `bench/peers/run.sh`
//!   ([`PeersRun`]; `bench/peers/summarize.py --json` writes it);
//! - `docs/data/checker.json`, `docs/data/oracle.json`,
//!   `docs/data/conformance.json`: the figures of the model checker, the
//!   stale-DMA oracle and the conformance suite ([`FigureTable`]).
//!
//! Outputs: the regions between `<!-- figures:NAME -->` and
//! `<!-- /figures:NAME -->` in `README.md`, `docs/performance.md` and
//! `docs/checking.md`, and the SVG charts `docs/figures/peers-ratio.svg`
//! (each mrcache arm's ratio to the best peer, per row) and
//! `docs/figures/peers-p99.svg` (the two-thread p99s). Everything outside
//! the regions is left as it is.
//!
//! Invariant: [`render`] is a pure function of the data files and the text
//! around the regions, byte for byte (no clock, no locale, no float
//! formatting that depends on the platform), so `tests/figures.rs` can
//! check that the committed pages match the committed data.

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Options of `mrcache figures`.
#[derive(clap::Args, Debug, Clone)]
pub struct FiguresArgs {
    /// The repository's root.
    #[arg(long, default_value = ".")]
    pub root: PathBuf,
    /// Make this run of `bench/peers/run.sh` (its `peers.json`) the latest:
    /// it is checked and copied to `docs/data/peers.json` first.
    #[arg(long, value_name = "RUN.json")]
    pub import: Option<PathBuf>,
    /// Write nothing: exit 1 if a generated file differs from what the data
    /// gives.
    #[arg(long)]
    pub check: bool,
}

/// One run of `bench/peers/run.sh`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeersRun {
    /// Always `"peers"`.
    pub mrcache_bench: String,
    /// Format version, 1.
    pub version: u32,
    /// UTC start and end of the run (RFC 3339).
    pub start: String,
    pub end: String,
    /// The commit the mrcache arms were built from.
    pub commit: String,
    /// The machine (CPUs, kernel, what else ran).
    pub machine: String,
    /// One-minute load averages during the run, in order.
    pub load: Vec<LoadSample>,
    /// run.sh's settings (`ROUNDS`, `MT_ROUNDS`, `PIN`, ...).
    pub settings: BTreeMap<String, String>,
    /// Where the figures come from, when not straight from run.sh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<String>,
    /// Facts of the run that are no row (a peer that hung, ...).
    #[serde(default)]
    pub notes: Vec<String>,
    pub rows: Vec<PeersRow>,
}

/// A load average and when it was read.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadSample {
    pub when: String,
    pub one_minute: f64,
}

/// Which way a row's figure is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    Lower,
    Higher,
}

/// One workload's figure on every arm that ran it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeersRow {
    /// Stable name (`hit/100`, `mt/uring/B-p99`, ...).
    pub id: String,
    /// `one thread`, `two threads, io_uring`, ...
    pub group: String,
    /// What is measured, for the tables.
    pub label: String,
    /// Unit of every value of the row (`ns`, `M hits/s`, `k misses/s`, `B`).
    pub unit: String,
    pub better: Better,
    /// The ratio to the best peer an mrcache arm should reach (≤ for
    /// `lower`, ≥ for `higher`); none: reported only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<f64>,
    /// The peer the ratios are to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_peer: Option<String>,
    /// The medians of the peers that were measured (by name).
    #[serde(default)]
    pub peers: BTreeMap<String, f64>,
    /// The mrcache arms (`C`, `Rust`).
    #[serde(default)]
    pub mrcache: BTreeMap<String, Arm>,
}

/// An mrcache arm's figure: its median and its ratio to the best peer (the
/// median of the per-round ratios, the bench's method: one round is one
/// machine state).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Arm {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
}

/// A table of figures that are not the bench's: each row with the run that
/// produced it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FigureTable {
    pub title: String,
    /// Said once above the table (the machine, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub about: Option<String>,
    pub rows: Vec<FigureRow>,
}

/// One figure and how it was measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FigureRow {
    pub what: String,
    pub figure: String,
    /// Date of the run (YYYY-MM-DD), and its commit when recorded.
    pub measured: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// The command that measures it again.
    pub reproduce: String,
    /// Also shown in the README's summary of the table (`figures:NAME` there).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub readme: bool,
}

pub const RATIO_SVG: &str = "docs/figures/peers-ratio.svg";
pub const P99_SVG: &str = "docs/figures/peers-p99.svg";

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not a valid figures file", path.display()))
}

/// Checks what a table cannot show: a row's best peer has a value, ratios
/// are positive, ids are unique.
pub fn validate(run: &PeersRun) -> Result<()> {
    if run.mrcache_bench != "peers" || run.version != 1 {
        bail!("not a peers run of version 1 (mrcache_bench {:?}, version {})", run.mrcache_bench, run.version);
    }
    let mut ids = std::collections::BTreeSet::new();
    for r in &run.rows {
        if !ids.insert(&r.id) {
            bail!("row {} appears twice", r.id);
        }
        if let Some(b) = &r.best_peer {
            if !r.peers.contains_key(b) {
                bail!("row {}: best peer {b} has no value", r.id);
            }
        }
        for (name, arm) in &r.mrcache {
            if arm.ratio.is_some_and(|x| !(x > 0.0 && x.is_finite())) {
                bail!("row {}: mrcache {name}'s ratio is not a positive number", r.id);
            }
            if arm.ratio.is_some() && r.best_peer.is_none() {
                bail!("row {}: mrcache {name} has a ratio but the row has no best peer", r.id);
            }
        }
    }
    Ok(())
}

/// A number as the tables print it: thousands separated, no trailing zeros
/// beyond what was recorded.
pub fn num(x: f64) -> String {
    if x >= 1000.0 && x.fract() == 0.0 {
        let s = format!("{}", x as u64);
        let mut out = String::new();
        for (i, c) in s.chars().enumerate() {
            if i > 0 && (s.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        out
    } else if x >= 1000.0 {
        let whole = num(x.trunc());
        let frac = format!("{x}");
        let dot = frac.find('.').map(|i| &frac[i..]).unwrap_or("");
        format!("{whole}{dot}")
    } else {
        format!("{x}")
    }
}

/// A measured value with its unit: one decimal below 100, except for bytes
/// (`45.0 ns`, not `45 ns`: such figures are recorded to a tenth).
pub fn value_text(x: f64, unit: &str) -> String {
    let n = if unit != "B" && x < 100.0 && x.fract() == 0.0 { format!("{x:.1}") } else { num(x) };
    format!("{n} {unit}")
}

fn ratio_text(r: f64) -> String {
    format!("{r:.2}×")
}

fn met(row: &PeersRow, ratio: f64) -> bool {
    match (row.target, row.better) {
        (Some(t), Better::Lower) => ratio <= t,
        (Some(t), Better::Higher) => ratio >= t,
        (None, _) => false,
    }
}

fn arm_cell(row: &PeersRow, arm: Option<&Arm>) -> String {
    let Some(arm) = arm else { return "–".into() };
    let value = arm.value.map(|v| value_text(v, &row.unit));
    let ratio = arm.ratio.map(|r| {
        let t = ratio_text(r);
        if met(row, r) {
            format!("**{t}**")
        } else {
            t
        }
    });
    match (value, ratio) {
        (Some(v), Some(r)) => format!("{r} ({v})"),
        (Some(v), None) => v,
        (None, Some(r)) => r,
        (None, None) => "–".into(),
    }
}

fn target_cell(row: &PeersRow) -> String {
    match (row.target, row.better) {
        (Some(t), Better::Lower) => format!("≤ {t:.1}×"),
        (Some(t), Better::Higher) => format!("≥ {t:.1}×"),
        (None, _) => "(reported)".into(),
    }
}

fn peer_cell(row: &PeersRow) -> String {
    match &row.best_peer {
        Some(b) => format!("{b} {}", value_text(row.peers[b], &row.unit)),
        None => "–".into(),
    }
}

/// The table of the README and of docs/performance.md: one row per
/// workload, mrcache's ratios to the best peer (bold: the target is met).
pub fn peers_table(run: &PeersRun) -> String {
    let mut s = String::from("| figure | best peer | mrcache C | mrcache Rust | target |\n|---|---|---|---|---|\n");
    for r in &run.rows {
        let label = format!("{}: {}", r.group, r.label);
        let _ = writeln!(
            s,
            "| {label} | {} | {} | {} | {} |",
            peer_cell(r),
            arm_cell(r, r.mrcache.get("C")),
            arm_cell(r, r.mrcache.get("Rust")),
            target_cell(r)
        );
    }
    s
}

fn short_commit(c: &str) -> &str {
    &c[..c.len().min(7)]
}

fn day_and_time(ts: &str) -> String {
    // "2026-12-07T01:13:00Z" -> "2026-12-07 01:13 UTC"
    match (ts.get(..10), ts.get(11..16)) {
        (Some(d), Some(t)) => format!("{d} {t} UTC"),
        _ => ts.to_string(),
    }
}

/// One sentence: when, where, at which commit and load the run ran.
pub fn run_line(run: &PeersRun) -> String {
    let loads: Vec<String> = run.load.iter().map(|l| format!("{:.2} {}", l.one_minute, l.when)).collect();
    let settings: Vec<String> = run.settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!(
        "`bash bench/peers/run.sh`, {}–{}, on `{}`, {}; `{}`; one-minute load average {}.",
        day_and_time(&run.start).trim_end_matches(" UTC"),
        run.end.get(11..16).map(|t| format!("{t} UTC")).unwrap_or_else(|| run.end.clone()),
        short_commit(&run.commit),
        run.machine,
        settings.join(" "),
        loads.join(", ")
    )
}

/// The README's region: the run's line and the table.
pub fn readme_region(run: &PeersRun) -> String {
    format!("{}\n\n{}", run_line(run), peers_table(run))
}

/// docs/performance.md's region: the run, its provenance and notes, the
/// table, every peer's median, and the charts.
pub fn performance_region(run: &PeersRun) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{}\n", run_line(run));
    if let Some(p) = &run.provenance {
        let _ = writeln!(s, "{p}\n");
    }
    s.push_str(&peers_table(run));
    s.push('\n');
    let mut peers: Vec<&String> = run.rows.iter().flat_map(|r| r.peers.keys()).collect();
    peers.sort();
    peers.dedup();
    if !peers.is_empty() {
        s.push_str("The peers' medians recorded for each row:\n\n| figure |");
        for p in &peers {
            let _ = write!(s, " {p} |");
        }
        s.push_str("\n|---|");
        for _ in &peers {
            s.push_str("---|");
        }
        s.push('\n');
        for r in &run.rows {
            let _ = write!(s, "| {}: {} |", r.group, r.label);
            for p in &peers {
                match r.peers.get(*p) {
                    Some(v) => {
                        let _ = write!(s, " {} |", value_text(*v, &r.unit));
                    }
                    None => s.push_str(" – |"),
                }
            }
            s.push('\n');
        }
        s.push('\n');
    }
    for n in &run.notes {
        let _ = writeln!(s, "- {n}");
    }
    if !run.notes.is_empty() {
        s.push('\n');
    }
    let _ = write!(
        s,
        "![mrcache's ratio to the best peer, per row]({})\n\n![The two-thread p99s]({})\n",
        RATIO_SVG.trim_start_matches("docs/"),
        P99_SVG.trim_start_matches("docs/")
    );
    s
}

/// A [`FigureTable`] as markdown.
pub fn figure_table(t: &FigureTable) -> String {
    let mut s = String::new();
    if let Some(a) = &t.about {
        let _ = writeln!(s, "{a}\n");
    }
    s.push_str("| what | figure | measured | reproduce |\n|---|---|---|---|\n");
    for r in &t.rows {
        let when = match &r.commit {
            Some(c) => format!("{}, `{}`", r.measured, short_commit(c)),
            None => r.measured.clone(),
        };
        let _ = writeln!(s, "| {} | {} | {} | {} |", r.what, r.figure, when, r.reproduce);
    }
    s
}

/// The README's summary of a figure table: its rows marked `readme`, as a
/// list; the whole table is in docs/checking.md.
pub fn readme_summary(t: &FigureTable) -> String {
    let mut s = String::new();
    for r in t.rows.iter().filter(|r| r.readme) {
        let when = match &r.commit {
            Some(c) => format!("{}, `{}`", r.measured, short_commit(c)),
            None => r.measured.clone(),
        };
        let _ = writeln!(s, "- **{}:** {} ({when}; {})", r.what, r.figure, r.reproduce);
    }
    s
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A horizontal log-scale axis over [lo, hi] (decades), `w` pixels from `x0`.
struct LogAxis {
    lo: f64,
    hi: f64,
    x0: f64,
    w: f64,
}

impl LogAxis {
    fn over(values: impl Iterator<Item = f64>, x0: f64, w: f64) -> LogAxis {
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for v in values {
            lo = lo.min(v);
            hi = hi.max(v);
        }
        if !lo.is_finite() {
            (lo, hi) = (0.1, 10.0);
        }
        LogAxis { lo: 10f64.powf(lo.log10().floor()), hi: 10f64.powf(hi.log10().ceil().max(lo.log10().floor() + 1.0)), x0, w }
    }
    fn x(&self, v: f64) -> f64 {
        self.x0 + self.w * (v.log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
    }
    fn decades(&self) -> Vec<f64> {
        let (a, b) = (self.lo.log10().round() as i32, self.hi.log10().round() as i32);
        (a..=b).map(|e| 10f64.powi(e)).collect()
    }
}

const SVG_FONT: &str = "font-family=\"sans-serif\" font-size=\"13\"";
const ARM_COLORS: [(&str, &str); 3] = [("C", "#1f77b4"), ("Rust", "#2ca02c"), ("peer", "#7f7f7f")];

fn color(name: &str) -> &'static str {
    ARM_COLORS.iter().find(|(n, _)| *n == name).map(|(_, c)| *c).unwrap_or(ARM_COLORS[2].1)
}

fn svg_head(s: &mut String, w: f64, h: f64, title: &str) {
    let _ = writeln!(s, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" {SVG_FONT}>");
    let _ = writeln!(s, "<rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>");
    let _ = writeln!(s, "<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"16\">{}</text>", w / 2.0, esc(title));
}

fn svg_axis(s: &mut String, ax: &LogAxis, top: f64, bottom: f64, label: impl Fn(f64) -> String) {
    for d in ax.decades() {
        let x = ax.x(d);
        let _ = writeln!(s, "<line x1=\"{x:.1}\" y1=\"{top}\" x2=\"{x:.1}\" y2=\"{bottom}\" stroke=\"#dddddd\"/>");
        let _ = writeln!(s, "<text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>", bottom + 16.0, esc(&label(d)));
    }
}

fn legend(s: &mut String, x: f64, y: f64, items: &[(&str, &str)]) {
    let mut x = x;
    for (name, c) in items {
        let _ = writeln!(s, "<rect x=\"{x}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{c}\"/>", y - 10.0);
        let _ = writeln!(s, "<text x=\"{}\" y=\"{y}\">{}</text>", x + 16.0, esc(name));
        x += 30.0 + 8.0 * name.chars().count() as f64;
    }
}

/// Chart: each mrcache arm's ratio to the best peer, one group of bars per
/// row (log scale; the line at 1 is parity).
pub fn ratio_svg(run: &PeersRun) -> String {
    let arms = ["C", "Rust"];
    let rows: Vec<&PeersRow> = run.rows.iter().filter(|r| r.mrcache.values().any(|a| a.ratio.is_some())).collect();
    let (label_w, plot_w, bar_h) = (440.0, 440.0, 9.0);
    let group_h = bar_h * arms.len() as f64 + 8.0;
    let top = 62.0;
    let h = top + group_h * rows.len() as f64 + 40.0;
    let w = label_w + plot_w + 70.0;
    let ax = LogAxis::over(rows.iter().flat_map(|r| r.mrcache.values().filter_map(|a| a.ratio)), label_w, plot_w);
    let mut s = String::new();
    svg_head(&mut s, w, h, "mrcache / best peer, per row (log scale; 1 = parity)");
    legend(&mut s, label_w, 44.0, &[("mrcache C", color("C")), ("mrcache Rust", color("Rust"))]);
    let bottom = top + group_h * rows.len() as f64;
    svg_axis(&mut s, &ax, top - 4.0, bottom, |d| format!("{}×", num(d)));
    for (i, r) in rows.iter().enumerate() {
        let y = top + group_h * i as f64;
        let better = match r.better {
            Better::Lower => "lower is better",
            Better::Higher => "higher is better",
        };
        let label = format!("{}: {} ({better})", r.group, r.label);
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" font-size=\"11\">{}</text>",
            label_w - 6.0,
            y + group_h / 2.0 + 1.0,
            esc(&label)
        );
        for (j, a) in arms.iter().enumerate() {
            let Some(ratio) = r.mrcache.get(*a).and_then(|x| x.ratio) else { continue };
            let by = y + 2.0 + bar_h * j as f64;
            let (x1, x2) = (ax.x(1.0), ax.x(ratio));
            let (bx, bw) = if x2 >= x1 { (x1, x2 - x1) } else { (x2, x1 - x2) };
            let _ =
                writeln!(s, "<rect x=\"{bx:.1}\" y=\"{by:.1}\" width=\"{bw:.1}\" height=\"{:.1}\" fill=\"{}\"/>", bar_h - 1.0, color(a));
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"9\">{}</text>",
                x1.max(x2) + 3.0,
                by + bar_h - 1.5,
                ratio_text(ratio)
            );
        }
    }
    let x1 = ax.x(1.0);
    let _ = writeln!(s, "<line x1=\"{x1:.1}\" y1=\"{}\" x2=\"{x1:.1}\" y2=\"{bottom}\" stroke=\"black\"/>", top - 4.0);
    s.push_str("</svg>\n");
    s
}

/// Chart: the two-thread p99s (rows whose id ends in `p99`), every peer
/// measured and mrcache's C arm, log scale.
pub fn p99_svg(run: &PeersRun) -> String {
    let rows: Vec<&PeersRow> = run.rows.iter().filter(|r| r.id.ends_with("p99")).collect();
    let bars: Vec<Vec<(String, f64, &str)>> = rows
        .iter()
        .map(|r| {
            let mut v: Vec<(String, f64, &str)> = r.peers.iter().map(|(p, x)| (p.clone(), *x, color("peer"))).collect();
            for (a, arm) in &r.mrcache {
                if let Some(x) = arm.value {
                    v.push((format!("mrcache {a}"), x, color(a)));
                }
            }
            v
        })
        .collect();
    let (label_w, plot_w, bar_h) = (300.0, 480.0, 16.0);
    let top = 62.0;
    let heights: Vec<f64> = bars.iter().map(|b| bar_h * b.len() as f64 + 14.0).collect();
    let bottom = top + heights.iter().sum::<f64>();
    let (w, h) = (label_w + plot_w + 90.0, bottom + 40.0);
    let ax = LogAxis::over(bars.iter().flatten().map(|b| b.1), label_w, plot_w);
    let mut s = String::new();
    svg_head(&mut s, w, h, "Two threads: B's p99 latency per hit with A running (log scale)");
    legend(&mut s, label_w, 44.0, &[("peer", color("peer")), ("mrcache C", color("C"))]);
    svg_axis(&mut s, &ax, top - 4.0, bottom, |d| format!("{} {}", num(d), rows.first().map(|r| r.unit.as_str()).unwrap_or("")));
    let mut y = top;
    for (r, (b, gh)) in rows.iter().zip(bars.iter().zip(&heights)) {
        let _ = writeln!(s, "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>", label_w - 110.0, y + gh / 2.0, esc(&r.group));
        for (j, (name, v, c)) in b.iter().enumerate() {
            let by = y + 4.0 + bar_h * j as f64;
            let x2 = ax.x(*v);
            let _ = writeln!(
                s,
                "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" font-size=\"11\">{}</text>",
                label_w - 6.0,
                by + bar_h - 4.0,
                esc(name)
            );
            let _ = writeln!(
                s,
                "<rect x=\"{label_w}\" y=\"{by:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{c}\"/>",
                (x2 - label_w).max(1.0),
                bar_h - 2.0
            );
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\">{}</text>",
                x2 + 3.0,
                by + bar_h - 4.0,
                esc(&value_text(*v, &r.unit))
            );
        }
        y += gh;
    }
    s.push_str("</svg>\n");
    s
}

/// Replaces the text between `<!-- figures:NAME -->` and
/// `<!-- /figures:NAME -->` (each on a line of its own) with `body`.
pub fn replace_region(text: &str, name: &str, body: &str) -> Result<String> {
    let open = format!("<!-- figures:{name} -->");
    let close = format!("<!-- /figures:{name} -->");
    let a = text.find(&open).ok_or_else(|| anyhow!("no `{open}` line"))?;
    let b = text.find(&close).ok_or_else(|| anyhow!("no `{close}` line"))?;
    if b < a {
        bail!("`{close}` comes before `{open}`");
    }
    let body = body.trim_end_matches('\n');
    Ok(format!("{}{open}\n{body}\n{}", &text[..a], &text[b..]))
}

/// Every generated file's expected content, from the data under
/// `root/docs/data/` and the current text around the regions.
pub fn render(root: &Path) -> Result<Vec<(PathBuf, String)>> {
    let data = root.join("docs/data");
    let run: PeersRun = read_json(&data.join("peers.json"))?;
    validate(&run).context("docs/data/peers.json")?;
    let tables: Vec<(&str, FigureTable)> = ["checker", "oracle", "conformance"]
        .into_iter()
        .map(|n| Ok((n, read_json(&data.join(format!("{n}.json")))?)))
        .collect::<Result<_>>()?;
    let page = |p: &str| -> Result<String> { std::fs::read_to_string(root.join(p)).with_context(|| format!("cannot read {p}")) };
    let mut readme = replace_region(&page("README.md")?, "peers", &readme_region(&run)).context("README.md")?;
    for (name, t) in &tables {
        if t.rows.iter().any(|r| r.readme) {
            readme = replace_region(&readme, name, &readme_summary(t)).context("README.md")?;
        }
    }
    let perf = replace_region(&page("docs/performance.md")?, "peers", &performance_region(&run)).context("docs/performance.md")?;
    let mut checking = page("docs/checking.md")?;
    for (name, t) in &tables {
        checking = replace_region(&checking, name, &figure_table(t)).context("docs/checking.md")?;
    }
    Ok(vec![
        (root.join("README.md"), readme),
        (root.join("docs/performance.md"), perf),
        (root.join("docs/checking.md"), checking),
        (root.join(RATIO_SVG), ratio_svg(&run)),
        (root.join(P99_SVG), p99_svg(&run)),
    ])
}

/// `mrcache figures`: import a run if asked, then write (or `--check`) every
/// generated file. Returns the exit code.
pub fn run(args: &FiguresArgs) -> Result<u8> {
    if let Some(path) = &args.import {
        let run: PeersRun = read_json(path)?;
        validate(&run).with_context(|| path.display().to_string())?;
        if !args.check {
            let to = args.root.join("docs/data/peers.json");
            let text = serde_json::to_string_pretty(&run)? + "\n";
            std::fs::write(&to, text).with_context(|| format!("cannot write {}", to.display()))?;
        }
    }
    let files = render(&args.root)?;
    let mut stale = 0;
    for (path, want) in files {
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have == want {
            continue;
        }
        if args.check {
            eprintln!("mrcache figures: {} is not what docs/data/ gives (run `mrcache figures`)", path.display());
            stale += 1;
        } else {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
            }
            std::fs::write(&path, want).with_context(|| format!("cannot write {}", path.display()))?;
            eprintln!("mrcache figures: wrote {}", path.display());
        }
    }
    Ok(u8::from(stale > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_print_as_recorded() {
        assert_eq!(num(42.7), "42.7");
        assert_eq!(num(5218.0), "5,218");
        assert_eq!(num(1234567.0), "1,234,567");
        assert_eq!(num(2345.5), "2,345.5");
        assert_eq!(num(0.06), "0.06");
    }

    #[test]
    fn a_region_is_replaced_and_the_rest_kept() {
        let t = "a\n<!-- figures:x -->\nold\n<!-- /figures:x -->\nb\n";
        assert_eq!(replace_region(t, "x", "new\n").unwrap(), "a\n<!-- figures:x -->\nnew\n<!-- /figures:x -->\nb\n");
        assert!(replace_region(t, "y", "new").is_err());
    }
}
