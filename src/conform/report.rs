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
    /// Every failure of a `fail`, in the order found (the first is `rule`,
    /// `line`, `detail`): the properties are judged to the end of the case.
    pub failures: Vec<Failure>,
    /// Registrations the adapter reported.
    pub registrations: u64,
    /// Registrations the model makes for the same case under the policy it
    /// is judged by (run on its own, in the order the runner saw the
    /// operations complete).
    pub required: u64,
    /// Wasted work: `registrations` beyond `required` (reported, not failed).
    pub extra: u64,
    /// Deregistration timing against L1.
    pub l1: String,
    /// What the data commands showed: `stale DMA observed: ...`, `data
    /// right`, `order only: ...` (no data moved), or empty (the case has none).
    pub data: String,
    pub transcript: Vec<String>,
}

/// One failure of a case.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Failure {
    pub rule: String,
    pub line: usize,
    pub detail: String,
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
    let mut s = if r.name.is_empty() {
        // No case got as far as a hello: nothing is known of the adapter
        // but its command (not a header of empty fields).
        format!("adapter: ({}) gave no hello\n", r.adapter)
    } else {
        format!(
            "adapter: {} {} ({}); declared policy: {}; judged under: {}; registrar: {}\n",
            r.name,
            r.version,
            r.adapter,
            r.declared_policy.as_deref().unwrap_or("none"),
            r.judged_under,
            r.registrar
        )
    };
    let w = r.results.iter().map(|x| x.case.len()).max().unwrap_or(4).max(4);
    s += &format!("{:<w$}  {:<11}  {:<8}  {:>4}  {:>5}  detail\n", "case", "verdict", "rule", "line", "extra");
    for x in &r.results {
        let mut d = x.detail.clone();
        if d.len() > 160 {
            d.truncate(160);
            d += "...";
        }
        s += &format!("{:<w$}  {:<11}  {:<8}  {:>4}  {:>5}  {}\n", x.case, x.verdict.to_string(), x.rule, x.line, extra_cell(x), d);
        s += &also_failed(x, w);
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
    let wasted: u64 = r.results.iter().map(|x| x.extra).sum();
    s += &format!("extra: registrations beyond what the policy requires (wasted work, reported, not failed): {wasted} in all\n");
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
        for f in x.failures.iter().skip(1) {
            s += &format!("    also {} at case line {}: {}\n", f.rule, f.line, f.detail);
        }
        for t in &x.transcript {
            s += &format!("    {t}\n");
        }
    }
    s
}

/// The rows under a case's row for its failures after the first.
fn also_failed(x: &CaseResult, w: usize) -> String {
    let mut s = String::new();
    for f in x.failures.iter().skip(1) {
        let mut d: String = f.detail.chars().take(160).collect();
        if d.len() < f.detail.len() {
            d += "...";
        }
        s += &format!("{:<w$}  {:<11}  {:<8}  {:>4}  {:>5}  {}\n", "", "  also", f.rule, f.line, "", d);
    }
    s
}

/// The efficiency column: registrations beyond the policy's (`-` for a
/// case that registered nothing or did not run).
fn extra_cell(x: &CaseResult) -> String {
    if x.registrations == 0 && x.required == 0 {
        "-".into()
    } else {
        x.extra.to_string()
    }
}
