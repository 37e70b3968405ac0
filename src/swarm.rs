//! `mrcache swarm submit --slurm` and `mrcache swarm collect`: the swarm of
//! `mrcache check --swarm` as a Slurm job array (docs/checking.md, "A swarm
//! on a cluster").
//!
//! `submit` splits the seeds into tasks: for each configuration (`--config`,
//! the options of `mrcache check` that choose the model) `--tasks` seed
//! ranges of `--searches-per-task` seeds each. It writes into DIR the task
//! table (`tasks.tsv`: task id, first seed, searches, configuration), the
//! options common to every task (`check-options`) and the
//! batch script (`job.sh`, an array of one task per line of the table), then
//! submits it with `sbatch`. Each task runs `mrcache check --swarm` on its
//! seed range with the node's CPUs it was given, and writes its summary
//! (`task-ID.json`), its output (`task-ID.out`) and, on a violation, the
//! counterexample's trace (`task-ID.trace.jsonl`). `collect` merges the
//! summaries.

use anyhow::{bail, Context};
use mrcache_checker::SwarmSummary;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(clap::Subcommand, Debug)]
pub enum SwarmCommand {
    /// Write a Slurm job array of swarm tasks into DIR and submit it.
    Submit(SubmitArgs),
    /// Merge the results of a swarm's tasks in DIR.
    Collect(CollectArgs),
}

#[derive(clap::Args, Debug)]
pub struct SubmitArgs {
    /// Submit to Slurm (sbatch): the one batch system supported.
    #[arg(long, required = true)]
    pub slurm: bool,
    /// The job's directory, on a file system every node sees (created).
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// A configuration: the options of `mrcache check` that choose the
    /// model, in one argument (e.g. "--threads 3 --ops 4 --policy merge").
    /// Repeat for several; default: the default configuration.
    #[arg(long = "config", value_name = "OPTIONS", allow_hyphen_values = true)]
    pub configs: Vec<String>,
    /// Seed ranges (tasks) per configuration.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub tasks: u64,
    /// Searches (seeds) per task.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pub searches_per_task: u64,
    /// The first task's first seed.
    #[arg(long, default_value_t = 0)]
    pub first_seed: u64,
    /// CPUs per task (the task's swarm workers).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub cpus_per_task: u32,
    /// Slurm partition (default: the cluster's default).
    #[arg(long)]
    pub partition: Option<String>,
    /// Slurm time limit per task (e.g. 00:30:00).
    #[arg(long)]
    pub time: Option<String>,
    /// Slurm memory per task (e.g. 4G).
    #[arg(long)]
    pub mem: Option<String>,
    /// The mrcache binary the tasks run (default: this one); it must be at
    /// this path on every node.
    #[arg(long, value_name = "PATH")]
    pub binary: Option<PathBuf>,
    /// Wait until the job array has finished (`sbatch --wait`).
    #[arg(long)]
    pub wait: bool,
    /// Write the task table and the batch script, do not submit.
    #[arg(long)]
    pub no_submit: bool,
    /// Further options of `mrcache check --swarm` for every task (e.g.
    /// --max-states 20000 --timeout 600).
    #[arg(last = true, value_name = "CHECK OPTIONS")]
    pub check_options: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct CollectArgs {
    /// The job's directory (of `mrcache swarm submit`).
    pub dir: PathBuf,
    /// Copy the first counterexample's trace here.
    #[arg(long, value_name = "FILE")]
    pub trace_out: Option<PathBuf>,
    /// Print the merged result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Options a configuration or the common options may not set: the task
/// sets them.
const TASK_OPTIONS: [&str; 7] = ["--swarm", "--seed", "--searches", "--workers", "--summary-json", "--trace-out", "--pinned"];

/// Parses a task's options as `mrcache check` would.
#[derive(clap::Parser)]
struct Probe {
    #[command(flatten)]
    _check: crate::check::CheckArgs,
}

/// One line of `tasks.tsv`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Task {
    pub id: u64,
    pub first_seed: u64,
    pub searches: u64,
    pub config: String,
}

/// The tasks of a submission: configurations outer, seed ranges inner.
pub fn tasks(configs: &[String], tasks: u64, per_task: u64, first_seed: u64) -> Vec<Task> {
    let configs = if configs.is_empty() { vec![String::new()] } else { configs.to_vec() };
    let mut out = Vec::new();
    for c in &configs {
        for r in 0..tasks {
            out.push(Task {
                id: out.len() as u64,
                first_seed: first_seed.wrapping_add(r * per_task),
                searches: per_task,
                config: c.split_whitespace().collect::<Vec<_>>().join(" "),
            });
        }
    }
    out
}

fn table(tasks: &[Task]) -> String {
    tasks.iter().map(|t| format!("{}\t{}\t{}\t{}\n", t.id, t.first_seed, t.searches, t.config)).collect()
}

fn parse_table(text: &str) -> anyhow::Result<Vec<Task>> {
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.splitn(4, '\t').collect();
            let n = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok()).with_context(|| format!("tasks.tsv: bad line `{l}`"));
            Ok(Task { id: n(0)?, first_seed: n(1)?, searches: n(2)?, config: f.get(3).unwrap_or(&"").to_string() })
        })
        .collect()
}

/// Single quotes for the shell.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The batch script: one array task per line of the task table.
pub fn job_script(a: &SubmitArgs, dir: &Path, binary: &Path, n: usize) -> String {
    let d = dir.display().to_string();
    let mut s = String::from("#!/bin/bash\n# Written by `mrcache swarm submit --slurm`: one task per line of tasks.tsv.\n");
    s += "#SBATCH --job-name=mrcache-swarm\n";
    s += &format!("#SBATCH --array=0-{}\n", n.saturating_sub(1));
    s += &format!("#SBATCH --cpus-per-task={}\n", a.cpus_per_task);
    s += "#SBATCH --ntasks=1\n";
    s += &format!("#SBATCH --output={d}/task-%a.out\n");
    if let Some(p) = &a.partition {
        s += &format!("#SBATCH --partition={p}\n");
    }
    if let Some(t) = &a.time {
        s += &format!("#SBATCH --time={t}\n");
    }
    if let Some(m) = &a.mem {
        s += &format!("#SBATCH --mem={m}\n");
    }
    s += "set -u\n";
    s += &format!("dir={}\n", quote(&d));
    s += "id=${SLURM_ARRAY_TASK_ID:?not a Slurm array task}\n";
    s += "line=$(awk -F '\\t' -v id=\"$id\" '$1 == id' \"$dir/tasks.tsv\")\n";
    s += "[ -n \"$line\" ] || { echo \"task $id: not in $dir/tasks.tsv\" >&2; exit 2; }\n";
    s += "IFS=$'\\t' read -r _ seed searches config <<<\"$line\"\n";
    s += "# The configuration's options are words (split on purpose).\n";
    s += "# shellcheck disable=SC2086\n";
    s += &format!(
        "exec {} check --swarm --seed \"$seed\" --searches \"$searches\" --workers \"${{SLURM_CPUS_PER_TASK:-1}}\" \\\n  --summary-json \"$dir/task-$id.json\" --trace-out \"$dir/task-$id.trace.jsonl\" $config",
        quote(&binary.display().to_string())
    );
    for o in &a.check_options {
        s += &format!(" {}", quote(o));
    }
    s += "\n";
    s
}

fn submit(a: &SubmitArgs) -> anyhow::Result<i32> {
    for w in a.configs.iter().flat_map(|c| c.split_whitespace()).chain(a.check_options.iter().map(|s| s.as_str())) {
        if TASK_OPTIONS.contains(&w.split('=').next().unwrap_or(w)) {
            bail!("{w}: each task sets it (seeds, workers and outputs are the swarm's)");
        }
    }
    std::fs::create_dir_all(&a.dir).with_context(|| format!("creating {}", a.dir.display()))?;
    let dir = a.dir.canonicalize().with_context(|| format!("{}", a.dir.display()))?;
    if dir.join("tasks.tsv").exists() {
        bail!("{} already holds a swarm (tasks.tsv): use a new directory", dir.display());
    }
    let binary = match &a.binary {
        Some(b) => b.clone(),
        None => std::env::current_exe().context("finding this binary")?,
    };
    // Each configuration must parse here: a task that cannot start fails late.
    for c in if a.configs.is_empty() { vec![String::new()] } else { a.configs.clone() } {
        let argv = ["mrcache-check", "--swarm"]
            .into_iter()
            .map(String::from)
            .chain(c.split_whitespace().map(String::from))
            .chain(a.check_options.iter().cloned());
        if let Err(e) = <Probe as clap::Parser>::try_parse_from(argv) {
            bail!("configuration `{c}`: {}", e.to_string().lines().next().unwrap_or("invalid"));
        }
    }
    let ts = tasks(&a.configs, a.tasks, a.searches_per_task, a.first_seed);
    std::fs::write(dir.join("tasks.tsv"), table(&ts))?;
    std::fs::write(dir.join("check-options"), a.check_options.join(" ") + "\n")?;
    let script = dir.join("job.sh");
    std::fs::write(&script, job_script(a, &dir, &binary, ts.len()))?;
    println!(
        "{} tasks ({} configuration(s) x {} seed ranges of {} searches) written to {}",
        ts.len(),
        ts.len() as u64 / a.tasks,
        a.tasks,
        a.searches_per_task,
        dir.display()
    );
    if a.no_submit {
        println!("not submitted: sbatch {}", script.display());
        return Ok(0);
    }
    let mut cmd = Command::new("sbatch");
    cmd.arg("--parsable");
    if a.wait {
        cmd.arg("--wait");
    }
    cmd.arg(&script).current_dir(&dir);
    let out = cmd.output().context("running sbatch (is Slurm installed and on PATH?)")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let job = stdout.lines().next().unwrap_or("").split(';').next().unwrap_or("").trim().to_string();
    if !job.is_empty() {
        std::fs::write(dir.join("job_id"), format!("{job}\n"))?;
    }
    // With --wait sbatch exits with the array's worst exit code: a task that
    // found a violation exits 1. That is for `collect` to report.
    if job.is_empty() || (!out.status.success() && !a.wait) {
        bail!("sbatch failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    println!("submitted job {job}; when it has finished: mrcache swarm collect {}", dir.display());
    Ok(0)
}

/// The merged result of a swarm's tasks.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Collected {
    pub tasks: usize,
    pub tasks_reported: usize,
    pub missing: Vec<u64>,
    pub searches_requested: u64,
    pub searches_finished: u64,
    pub states: u64,
    /// The sum of each task's distinct states (tasks do not share a set).
    pub distinct_states_per_task: u64,
    pub max_depth: usize,
    /// The longest task, seconds.
    pub longest_task_secs: f64,
    /// By configuration: (tasks reported, searches finished, states, max depth).
    pub configs: BTreeMap<String, (usize, u64, u64, usize)>,
    /// (task, seed, property, configuration, the task's check options).
    pub violations: Vec<(u64, u64, String, String)>,
}

pub fn collect_dir(dir: &Path) -> anyhow::Result<(Collected, Vec<(Task, SwarmSummary)>)> {
    let table_path = dir.join("tasks.tsv");
    let text = std::fs::read_to_string(&table_path).with_context(|| format!("reading {}", table_path.display()))?;
    let ts = parse_table(&text)?;
    let mut c = Collected {
        tasks: ts.len(),
        tasks_reported: 0,
        missing: Vec::new(),
        searches_requested: 0,
        searches_finished: 0,
        states: 0,
        distinct_states_per_task: 0,
        max_depth: 0,
        longest_task_secs: 0.0,
        configs: BTreeMap::new(),
        violations: Vec::new(),
    };
    let mut reports = Vec::new();
    for t in ts {
        c.searches_requested += t.searches;
        let path = dir.join(format!("task-{}.json", t.id));
        let Ok(text) = std::fs::read_to_string(&path) else {
            c.missing.push(t.id);
            continue;
        };
        let s: SwarmSummary = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        c.tasks_reported += 1;
        c.searches_finished += s.searches_finished;
        c.states += s.states;
        c.distinct_states_per_task += s.distinct_states;
        c.max_depth = c.max_depth.max(s.max_depth);
        c.longest_task_secs = c.longest_task_secs.max(s.elapsed_secs);
        let e = c.configs.entry(s.config.clone()).or_default();
        e.0 += 1;
        e.1 += s.searches_finished;
        e.2 += s.states;
        e.3 = e.3.max(s.max_depth);
        for v in &s.violations {
            c.violations.push((t.id, v.seed, v.property.clone(), s.config.clone()));
        }
        reports.push((t, s));
    }
    Ok((c, reports))
}

fn collect(a: &CollectArgs) -> anyhow::Result<i32> {
    let (c, reports) = collect_dir(&a.dir)?;
    let common = std::fs::read_to_string(a.dir.join("check-options")).unwrap_or_default();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&c).expect("serialises"));
    } else {
        println!("swarm in {}: {} of {} tasks reported", a.dir.display(), c.tasks_reported, c.tasks);
        for (cfg, (n, searches, states, depth)) in &c.configs {
            println!("  {cfg}: {n} tasks, {searches} searches, {states} states, max depth {depth}");
        }
        println!(
            "covered: {} states ({} distinct within tasks), {} of {} searches finished, max depth {}, longest task {:.1} s",
            c.states, c.distinct_states_per_task, c.searches_finished, c.searches_requested, c.max_depth, c.longest_task_secs
        );
        if !c.missing.is_empty() {
            println!("missing: task(s) {:?} wrote no summary (see task-ID.out)", c.missing);
        }
        for (task, seed, p, cfg) in &c.violations {
            let opts = reports.iter().find(|(t, _)| t.id == *task).map(|(t, _)| t.config.as_str()).unwrap_or("");
            println!("  VIOLATED {p}: task {task}, seed {seed} ({cfg})");
            let line = [opts, common.trim(), "--swarm --seed", &seed.to_string(), "--searches 1"].join(" ");
            println!("    replay: mrcache check {}", line.split_whitespace().collect::<Vec<_>>().join(" "));
        }
    }
    if let Some(out) = &a.trace_out {
        match c.violations.first() {
            Some((task, ..)) => {
                let src = a.dir.join(format!("task-{task}.trace.jsonl"));
                std::fs::copy(&src, out).with_context(|| format!("copying {}", src.display()))?;
                if !a.json {
                    println!("counterexample trace of task {task} written to {}", out.display());
                }
            }
            None => eprintln!("mrcache swarm collect: no counterexample, {} not written", out.display()),
        }
    }
    if !c.violations.is_empty() {
        return Ok(1);
    }
    if c.tasks_reported == 0 {
        bail!("no task of {} has reported", a.dir.display());
    }
    Ok(if c.missing.is_empty() { 0 } else { 3 })
}

pub fn run(cmd: &SwarmCommand) -> anyhow::Result<i32> {
    match cmd {
        SwarmCommand::Submit(a) => submit(a),
        SwarmCommand::Collect(a) => collect(a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_split_seeds_per_configuration_and_round_trip() {
        let ts = tasks(&["--threads 3  --ops 4".into(), "--policy merge".into()], 3, 10, 100);
        assert_eq!(ts.len(), 6);
        assert_eq!((ts[0].first_seed, ts[2].first_seed, ts[3].first_seed), (100, 120, 100));
        assert_eq!(ts[1].config, "--threads 3 --ops 4");
        assert_eq!(ts[5].id, 5);
        assert_eq!(parse_table(&table(&ts)).unwrap(), ts);
        assert_eq!(tasks(&[], 2, 5, 0)[1], Task { id: 1, first_seed: 5, searches: 5, config: String::new() });
        assert_eq!(quote("a'b"), r"'a'\''b'");
    }
}
