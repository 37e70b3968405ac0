//! The results of a run and their table (`mrcache conform` without `--json`).
//!
//! A case has one verdict; only `fail` counts against the adapter
//! ([`RunReport::failed`]). A divergence the model saw before a failure, and
//! the deregistration timing (L1), are reported beside it, never failed.

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Pass,
    Fail,
    /// The peer declares no S6.1 policy and its overlap/eviction behaviour
    /// differs from the model's (reported, not failed).
    Diverges,
    Unsupported,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "fail",
            Verdict::Diverges => "diverges",
            Verdict::Unsupported => "unsupported",
        })
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct CaseResult {
    pub case: String,
    pub verdict: Verdict,
    /// The property or C-rule (P1..P6, C1..C4), or `hang`, `crash`, `abort`,
    /// `protocol`, `mem-op`.
    pub rule: String,
    /// The case line where it happened.
    pub line: usize,
    pub detail: String,
    /// What the model said after a divergence it did not fail (for the table).
    pub divergence: Option<String>,
    /// Deregistration timing against L1.
    pub l1: String,
    /// What the data commands showed: `stale DMA observed: ...`, `data
    /// right`, `order only: ...` (no data moved), or empty (the case has none).
    pub data: String,
    pub transcript: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub adapter: String,
    pub name: String,
    pub version: String,
    pub declared_policy: Option<String>,
    pub judged_under: String,
    /// The registrar the adapter's hello declared (`io_uring`, `counting`, or `not declared`).
    pub registrar: String,
    pub results: Vec<CaseResult>,
}

impl RunReport {
    pub fn failed(&self) -> usize {
        self.results.iter().filter(|r| r.verdict == Verdict::Fail).count()
    }
}

// ---------------------------------------------------------------------------
// Output

pub fn table(r: &RunReport) -> String {
    let mut s = format!(
        "adapter: {} {} ({}); declared policy: {}; judged under: {}; registrar: {}\n",
        r.name,
        r.version,
        r.adapter,
        r.declared_policy.as_deref().unwrap_or("none"),
        r.judged_under,
        r.registrar
    );
    let w = r.results.iter().map(|x| x.case.len()).max().unwrap_or(4).max(4);
    s += &format!("{:<w$}  {:<11}  {:<8}  {:>4}  detail\n", "case", "verdict", "rule", "line");
    for x in &r.results {
        let mut d = x.detail.clone();
        if d.len() > 160 {
            d.truncate(160);
            d += "...";
        }
        s += &format!("{:<w$}  {:<11}  {:<8}  {:>4}  {}\n", x.case, x.verdict.to_string(), x.rule, x.line, d);
    }
    let count = |v: Verdict| r.results.iter().filter(|x| x.verdict == v).count();
    s += &format!(
        "{} cases: {} pass, {} fail, {} diverge, {} unsupported\n",
        r.results.len(),
        count(Verdict::Pass),
        count(Verdict::Fail),
        count(Verdict::Diverges),
        count(Verdict::Unsupported)
    );
    let late: Vec<&CaseResult> = r.results.iter().filter(|x| x.l1 != "on time" && !x.l1.is_empty()).collect();
    if !late.is_empty() {
        s += "\nderegistration timing (L1, reported, not failed):\n";
        for x in late {
            s += &format!("  {}: {}\n", x.case, x.l1);
        }
    }
    for x in r.results.iter().filter(|x| matches!(x.verdict, Verdict::Fail | Verdict::Diverges)) {
        s += &format!("\n--- {} ({} {} at case line {}): {}\n", x.case, x.verdict, x.rule, x.line, x.detail);
        if let Some(d) = &x.divergence {
            s += &format!("    (the model had diverged first: {d})\n");
        }
        for t in &x.transcript {
            s += &format!("    {t}\n");
        }
    }
    s
}
