//! `barlink topo` and `barlink doctor`: thin wrappers over the topology
//! crate's discovery, rendering and checks.

use std::path::PathBuf;

use barlink_topology::{PathClass, PathPolicy, Topology, doctor, render};
use clap::Args;

use super::{CommandError, Status};

#[derive(Debug, Args)]
pub struct TopoArgs {
    /// Read the platform under this directory instead of `/` (a fixture
    /// tree, or a copy of another machine's /sys and /proc).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/",
        env = "BARLINK_SYSFS_ROOT"
    )]
    sysfs_root: PathBuf,
    /// The farthest connection at which GPU pairs still use BAR P2P: PIX,
    /// PXB, PHB, NODE or SYS (as NCCL_P2P_LEVEL). Default: by CPU vendor.
    #[arg(long, value_name = "LEVEL", env = "BARLINK_P2P_LEVEL")]
    p2p_level: Option<String>,
    /// Print one JSON document instead of tables.
    #[arg(long)]
    json: bool,
}

fn discover(args: &TopoArgs) -> Result<Topology, CommandError> {
    let max_p2p_connection = match &args.p2p_level {
        None => None,
        Some(level) => Some(PathClass::parse(level).ok_or_else(|| {
            CommandError::usage(format!(
                "--p2p-level {level:?} is not one of PIX, PXB, PHB, NODE, SYS"
            ))
        })?),
    };
    let policy = PathPolicy { max_p2p_connection };
    Topology::discover(&args.sysfs_root, policy)
        .map_err(|error| CommandError::environment(error.to_string()))
}

fn print_json(value: &serde_json::Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).expect("JSON values always serialize")
    );
}

pub fn run_topo(args: &TopoArgs) -> Result<Status, CommandError> {
    let topology = discover(args)?;
    if args.json {
        print_json(&render::topo_json(&topology));
    } else {
        print!("{}", render::topo_text(&topology));
    }
    Ok(Status::Ok)
}

pub fn run_doctor(args: &TopoArgs) -> Result<Status, CommandError> {
    let topology = discover(args)?;
    let report = doctor::run(&topology);
    if args.json {
        print_json(&report.to_json());
    } else {
        print!("{}", report.render_text());
    }
    Ok(if report.has_failures() {
        Status::CheckFailed
    } else {
        Status::Ok
    })
}
