//! `mrcache`: replay traces through the model and the cache, and model-check
//! the concurrent algorithm. See README.md and spec.md.

use clap::{Parser, Subcommand};
use mrcache_cli::{check, fuzz, record, replay};
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
    /// Run an MPI program under the PMPI recorder: one trace per rank.
    Record(record::RecordArgs),
    /// Model-check the concurrent algorithm of spec.md §A (stateright).
    Check(check::CheckArgs),
    /// Long randomized runs of every test layer: differential, linearizability, stale-DMA oracle.
    Fuzz(fuzz::FuzzArgs),
    /// Browse the state space in stateright's Explorer on 127.0.0.1.
    Explore {
        #[arg(long, default_value_t = 3000)]
        port: u16,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Replay(args) => replay::run(&args).map(|reports| {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&reports).expect("reports serialise"));
            } else {
                print!("{}", replay::table(&reports));
            }
            0
        }),
        Command::Record(args) => record::run(&args).map(|code| code.clamp(0, 255) as u8),
        Command::Check(args) => check::run(args).map(|code| code.clamp(0, 255) as u8),
        Command::Fuzz(args) => fuzz::run(&args).map(|code| code.clamp(0, 255) as u8),
        Command::Explore { port } => check::explore(port).map(|()| 0),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("mrcache: {e:#}");
            ExitCode::from(2)
        }
    }
}
