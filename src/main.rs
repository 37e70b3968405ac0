//! `mrcache`: replay traces through the model and the cache, and model-check
//! the concurrent algorithm. See README.md and spec.md.

use clap::{Parser, Subcommand};
use mrcache_cli::conform::builtin_adapter;
#[cfg(feature = "testkit")]
use mrcache_cli::fuzz;
use mrcache_cli::{check, conform, cost, figures, plot, record, replay, report, swarm};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "mrcache", version, about = "A registration cache for RDMA, checked against its spec")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run traces through an engine and print their stats.
    Replay(replay::ReplayArgs),
    /// Sweep traces over overlap policies, byte limits, eviction and registration
    /// thresholds; registration time saved; SVG charts with --plot DIR.
    Report(report::ReportArgs),
    /// Measure the io_uring registrar's cost per registration and per page.
    Cost {
        /// Fewer repetitions.
        #[arg(long)]
        quick: bool,
        #[arg(long)]
        json: bool,
    },
    /// Run an MPI program under the PMPI recorder: one trace per rank.
    Record(record::RecordArgs),
    /// Model-check the concurrent algorithm of spec.md §A (stateright).
    Check(check::CheckArgs),
    /// A swarm of `mrcache check --swarm` tasks on a cluster: `submit --slurm`
    /// writes and submits a Slurm job array, `collect DIR` merges its results.
    #[command(subcommand)]
    Swarm(swarm::SwarmCommand),
    /// Long randomized runs of every test layer: differential, linearizability, stale-DMA oracle.
    #[cfg(feature = "testkit")]
    Fuzz(fuzz::FuzzArgs),
    /// Run the conformance cases against a cache behind an adapter (docs/conformance-protocol.md).
    Conform(conform::ConformArgs),
    /// A conformance adapter: mrcache itself (uffd monitor), or the toy cache.
    #[command(hide = true)]
    Adapter(builtin_adapter::AdapterArgs),
    /// Regenerate the tables and charts of README.md and docs/ from docs/data/
    /// (--import RUN.json first makes a bench run the latest; --check only compares).
    #[command(visible_alias = "bench-report")]
    Figures(figures::FiguresArgs),
    /// Browse the state space in stateright's Explorer on 127.0.0.1.
    Explore {
        #[arg(long, default_value_t = 3000)]
        port: u16,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A closed stdout or stderr (`mrcache check ... | head -1`) ends the
    // process quietly, as for any Unix tool, instead of a panic in print!.
    // Not for `conform`, whose runner writes to adapters that may have
    // exited: there a write must fail with EPIPE (reported as the adapter's
    // end), not kill the runner.
    if !matches!(cli.command, Command::Conform(_)) {
        // SAFETY: restores the default disposition of SIGPIPE before any
        // thread or I/O of this command exists.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let result = match cli.command {
        Command::Replay(args) => replay::run(&args).map(|reports| {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&reports).expect("reports serialise"));
            } else {
                print!("{}", replay::table(&reports));
            }
            0
        }),
        Command::Report(args) => report::run(&args).and_then(|r| {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&r).expect("the report serialises"));
            } else {
                print!("{}", report::tables(&r));
            }
            if let Some(dir) = &args.plot {
                let files = plot::write_all(&r, dir)?;
                eprintln!("mrcache: {} charts written to {}", files.len(), dir.display());
            }
            Ok(0)
        }),
        Command::Cost { quick, json } => cost::measure(quick).map(|(m, samples)| {
            if json {
                let v = serde_json::json!({ "cost_model": m, "samples": samples });
                println!("{}", serde_json::to_string_pretty(&v).expect("the cost model serialises"));
            } else {
                println!("{}", m.describe());
                for s in &samples {
                    println!(
                        "  {:>6} pages: register {:>9.1} us, deregister {:>8.1} us (median of {})",
                        s.pages,
                        s.register_median_ns / 1e3,
                        s.deregister_median_ns / 1e3,
                        s.reps
                    );
                }
            }
            0
        }),
        Command::Record(args) => record::run(&args).map(|code| code.clamp(0, 255) as u8),
        Command::Check(args) => check::run(args).map(|code| code.clamp(0, 255) as u8),
        Command::Swarm(cmd) => swarm::run(&cmd).map(|code| code.clamp(0, 255) as u8),
        #[cfg(feature = "testkit")]
        Command::Fuzz(args) => fuzz::run(&args).map(|code| code.clamp(0, 255) as u8),
        Command::Conform(args) => conform::run(&args).map(|r| {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&r).expect("the report serialises"));
            } else {
                print!("{}", conform::table(&r));
            }
            u8::from(r.failed() > 0)
        }),
        Command::Adapter(args) => builtin_adapter::run(&args),
        Command::Figures(args) => figures::run(&args),
        Command::Explore { port } => check::explore(port).map(|()| 0),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) if e.downcast_ref::<conform::AdapterDidNotStart>().is_some() => {
            eprintln!("mrcache conform: {e:#}");
            ExitCode::from(conform::AdapterDidNotStart::EXIT_STATUS)
        }
        Err(e) => {
            eprintln!("mrcache: {e:#}");
            ExitCode::from(2)
        }
    }
}
