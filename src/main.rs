//! `mrcache`: replay traces through the model and the cache, and model-check
//! the concurrent algorithm. See README.md and spec.md.

use clap::{Parser, Subcommand};
use mrcache_cli::replay;
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
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("mrcache: {e:#}");
            ExitCode::from(2)
        }
    }
}
