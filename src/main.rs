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
    /// Measure barlink between two processes over shared memory, with a raw
    /// ring and a Unix socket as baselines (or the engine alone: --path engine-mem).
    Bench(cli::bench::BenchArgs),
    /// Run random traffic through a link with faults injected; verify every byte.
    Soak(cli::soak::SoakArgs),
    /// Show the PCI topology: GPU/NIC matrix, links, and the path per pair.
    Topo(cli::topo::TopoArgs),
    /// Check the platform for what breaks P2P (ACS, IOMMU, small BARs, ...).
    Doctor(cli::topo::TopoArgs),
    /// Test a P2P path for silent corruption: patterns written raw and through
    /// the link, read back and checked; PASS, WARN or FAIL.
    Validate(cli::validate::ValidateArgs),
    /// The receiving process of `barlink bench` (started by it).
    #[command(hide = true)]
    BenchPeer(cli::bench_procs::PeerPlan),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Bench(args) => cli::bench::run(&args),
        Command::Soak(args) => cli::soak::run(&args),
        Command::Topo(args) => cli::topo::run_topo(&args),
        Command::Doctor(args) => cli::topo::run_doctor(&args),
        Command::Validate(args) => cli::validate::run(&args),
        Command::BenchPeer(plan) => cli::bench_procs::run_child(&plan)
            .map(|()| cli::Status::Ok)
            .map_err(|e| cli::CommandError::environment(format!("bench peer: {e}"))),
    };
    match outcome {
        Ok(status) => status.into(),
        Err(error) => {
            eprintln!("barlink: {error}");
            error.status().into()
        }
    }
}
