//! The `barlink` command: benchmarks, platform checks and (as the links land)
//! validation and soak runs. Exit status: 0 success, 1 a check or
//! verification failed, 2 bad usage, 3 an environment problem.
#![forbid(unsafe_code)]

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Trustworthy GPU peer-to-peer transfers: benchmark, inspect and check the
/// paths between devices.
#[derive(Debug, Parser)]
#[command(name = "barlink", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Measure the reliability engine against a memcpy baseline.
    Bench(cli::bench::BenchArgs),
    /// Show the PCI topology: GPU/NIC matrix, links, and the path per pair.
    Topo(cli::topo::TopoArgs),
    /// Check the platform for what breaks P2P (ACS, IOMMU, small BARs, ...).
    Doctor(cli::topo::TopoArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Bench(args) => cli::bench::run(&args),
        Command::Topo(args) => cli::topo::run_topo(&args),
        Command::Doctor(args) => cli::topo::run_doctor(&args),
    };
    match outcome {
        Ok(status) => status.into(),
        Err(error) => {
            eprintln!("barlink: {error}");
            error.status().into()
        }
    }
}
