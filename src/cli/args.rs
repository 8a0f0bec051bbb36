//! Option groups that more than one command takes, defined once and
//! flattened (`#[command(flatten)]`) into each command's arguments.

use std::path::PathBuf;

use barlink_topology::{PathClass, PathPolicy, Topology};
use clap::Args;

use super::CommandError;

/// `--json`: output for scripts.
#[derive(Debug, Clone, Copy, Args)]
pub struct JsonArg {
    /// Print JSON instead of text: one document, or one object per line
    /// where the output is rows.
    #[arg(long)]
    pub json: bool,
}

/// `--sysfs-root`: where the platform is read.
#[derive(Debug, Clone, Args)]
pub struct SysfsRootArg {
    /// Read the platform under this directory instead of `/` (a fixture
    /// tree, or a copy of another machine's /sys and /proc).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/",
        env = "BARLINK_SYSFS_ROOT"
    )]
    pub sysfs_root: PathBuf,
}

/// What `topo` and `doctor` read the platform with: where, and how far
/// peer-to-peer is trusted.
#[derive(Debug, Clone, Args)]
pub struct PlatformArgs {
    #[command(flatten)]
    pub sysfs: SysfsRootArg,
    /// The farthest connection at which GPU pairs still use BAR P2P: PIX,
    /// PXB, PHB, NODE or SYS (as NCCL_P2P_LEVEL). Default: by CPU vendor.
    #[arg(long, value_name = "LEVEL", env = "BARLINK_P2P_LEVEL")]
    pub p2p_level: Option<String>,
}

impl PlatformArgs {
    /// The topology under `--sysfs-root` with the `--p2p-level` policy.
    pub fn discover(&self) -> Result<Topology, CommandError> {
        let max_p2p_connection = match &self.p2p_level {
            None => None,
            Some(level) => Some(PathClass::parse(level).ok_or_else(|| {
                CommandError::usage(format!(
                    "--p2p-level {level:?} is not one of PIX, PXB, PHB, NODE, SYS"
                ))
            })?),
        };
        let policy = PathPolicy { max_p2p_connection };
        Topology::discover(&self.sysfs.sysfs_root, policy)
            .map_err(|error| CommandError::environment(error.to_string()))
    }
}
