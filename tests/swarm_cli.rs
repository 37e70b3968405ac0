//! `mrcache check --swarm` and `mrcache swarm submit/collect`, end to end
//! but without Slurm (ci/slurm-swarm.sh runs a real one): a small swarm
//! passes; a mutant's seed replays its counterexample into a trace; a job
//! written with `--no-submit`, its tasks run as Slurm would run them, is
//! merged by `collect`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn mrcache(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mrcache")).args(args).current_dir(env!("CARGO_MANIFEST_DIR")).output().expect("mrcache runs")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mrcache-swarm-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn a_small_swarm_passes_and_a_seed_replays_a_mutant() {
    let o = mrcache(&["check", "--swarm", "--searches", "4", "--max-states", "2000", "--workers", "2"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("4 of 4 searches finished"), "{}", text(&o));
    assert!(text(&o).contains("result: no violation found"), "{}", text(&o));
    let dir = scratch("replay");
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("cx.jsonl");
    let o = mrcache(&[
        "check",
        "--mutant",
        "lease-count-saturates",
        "--swarm",
        "--seed",
        "25",
        "--searches",
        "1",
        "--trace-out",
        trace.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("VIOLATED always: P3 no premature deregistration in 44 steps, seed 25"), "{}", text(&o));
    assert!(text(&o).contains("--swarm --seed 25 --searches 1"), "{}", text(&o));
    // The trace replays through the model (its records parse).
    let t = std::fs::read_to_string(&trace).unwrap();
    mrcache_types::trace::Trace::parse("cx", &t).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

fn run_task(dir: &Path, id: u32) {
    let o = Command::new("bash")
        .arg(dir.join("job.sh"))
        .env("SLURM_ARRAY_TASK_ID", id.to_string())
        .env("SLURM_CPUS_PER_TASK", "1")
        .output()
        .unwrap();
    assert!(matches!(o.status.code(), Some(0 | 1)), "task {id}: {}", text(&o));
}

#[test]
fn a_job_written_without_slurm_runs_and_is_collected() {
    let dir = scratch("job");
    let d = dir.to_str().unwrap();
    let o = mrcache(&[
        "swarm",
        "submit",
        "--slurm",
        "--no-submit",
        "--dir",
        d,
        "--tasks",
        "2",
        "--searches-per-task",
        "3",
        "--config",
        "--threads 2 --ops 2",
        "--config",
        "--mutant no-seq-recheck",
        "--",
        "--max-states",
        "2000",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let script = std::fs::read_to_string(dir.join("job.sh")).unwrap();
    assert!(script.contains("#SBATCH --array=0-3"), "{script}");
    // A task option in a configuration is refused.
    let o = mrcache(&["swarm", "submit", "--slurm", "--no-submit", "--dir", d, "--config", "--seed 3"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    // Tasks 0, 1 and 3 run; task 2 never does.
    for id in [0, 1, 3] {
        run_task(&dir, id);
    }
    let o = mrcache(&["swarm", "collect", d, "--trace-out", dir.join("cx.jsonl").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("3 of 4 tasks reported"), "{out}");
    assert!(out.contains("missing: task(s) [2]"), "{out}");
    assert!(out.contains("VIOLATED") && out.contains("task 3, seed "), "{out}");
    assert!(out.contains("--mutant no-seq-recheck --max-states 2000 --swarm --seed"), "{out}");
    assert!(dir.join("cx.jsonl").exists());
    // Without the mutant's tasks: every task reported, no violation.
    std::fs::remove_file(dir.join("task-3.json")).unwrap();
    run_task(&dir, 2);
    std::fs::write(
        dir.join("tasks.tsv"),
        std::fs::read_to_string(dir.join("tasks.tsv")).unwrap().lines().take(2).map(|l| format!("{l}\n")).collect::<String>(),
    )
    .unwrap();
    let o = mrcache(&["swarm", "collect", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("2 of 2 tasks reported"), "{}", text(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}
