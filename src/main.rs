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
    Doctor(cli::doctor::DoctorArgs),
    /// Make the keys that authenticate remote setup: a key pair, or a
    /// pre-shared key (--psk).
    Keygen(cli::keygen::KeygenArgs),
    /// Test a P2P path for silent corruption: patterns written raw and through
    /// the link, read back and checked; PASS, WARN or FAIL.
    Validate(cli::validate::ValidateArgs),
    /// The receiving process of `barlink bench` (started by it).
    #[command(hide = true)]
    BenchPeer(cli::bench::shm::PeerPlan),
    /// The receiving process of `barlink bench --gpu` (started by it).
    #[command(hide = true)]
    BenchGpuPeer(cli::bench::gpu::plan::GpuPeerPlan),
}

fn main() -> ExitCode {
    // Warnings unless BARLINK_LOG says otherwise.
    barlink::logging::to_stderr(Some(tracing_subscriber::filter::LevelFilter::WARN));
    let cli = Cli::parse();
    // A limit on the kernels that names none would be ignored deep in the
    // transport; refuse it here, before any figure is taken without it.
    if let Err(error) = barlink_transport::cpu::IsaLimit::from_env() {
        eprintln!("barlink: {error}");
        return ExitCode::from(2);
    }
    let outcome = match cli.command {
        Command::Bench(args) => cli::bench::run(&args),
        Command::Soak(args) => cli::soak::run(&args),
        Command::Topo(args) => cli::topo::run(&args),
        Command::Doctor(args) => cli::doctor::run(&args),
        Command::Validate(args) => cli::validate::run(&args),
        Command::Keygen(args) => cli::keygen::run(&args),
        Command::BenchPeer(plan) => cli::bench::shm::run_child(&plan)
            .map(|()| cli::Status::Ok)
            .map_err(|e| cli::CommandError::environment(format!("bench peer: {e}"))),
        Command::BenchGpuPeer(plan) => cli::bench::gpu::run_child(&plan)
            .map(|()| cli::Status::Ok)
            .map_err(|e| cli::CommandError::environment(format!("bench --gpu peer: {e}"))),
    };
    match outcome {
        Ok(status) => status.into(),
        Err(error) => {
            eprintln!("barlink: {error}");
            error.status().into()
        }
    }
}
