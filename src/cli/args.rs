//! Option groups that more than one command takes, defined once and
//! flattened (`#[command(flatten)]`) into each command's arguments.

use std::path::PathBuf;

use barlink_topology::{PathClass, PathPolicy, Topology};
use barlink_transport::auth::{AuthError, PeerAuth};
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

/// `--gpu-device`: which GPU the `--gpu` modes use.
#[derive(Debug, Clone, Copy, Args)]
pub struct GpuDeviceArg {
    /// With --gpu: the CUDA device ordinal.
    #[arg(
        long = "gpu-device",
        value_name = "N",
        default_value_t = 0,
        env = "BARLINK_GPU_DEVICE"
    )]
    pub ordinal: usize,
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

/// How remote setup authenticates (`bench --rdma`, and every command that
/// links to another node). With none of these, the environment decides
/// (`BARLINK_PSK_FILE`, `BARLINK_PSK`, `BARLINK_KEY_FILE` with
/// `BARLINK_PEER_KEYS`), and nothing configured is an error.
#[derive(Debug, Clone, Args)]
pub struct RemoteAuthArgs {
    /// Authenticate with the pre-shared key in FILE (64 hex digits, mode
    /// 600; `barlink keygen --psk`), the same file on both nodes.
    #[arg(long, value_name = "FILE")]
    pub psk_file: Option<PathBuf>,
    /// Authenticate with this node's private key in FILE (`barlink keygen`);
    /// needs --peer-keys.
    #[arg(long, value_name = "FILE", requires = "peer_keys")]
    pub key_file: Option<PathBuf>,
    /// Accept only the peers whose public keys FILE lists (one per line).
    #[arg(long, value_name = "FILE", requires = "key_file")]
    pub peer_keys: Option<PathBuf>,
    /// Set up without authentication: anyone who reaches the port first
    /// gets write access to this side's ring. For isolated test networks.
    #[arg(long, conflicts_with_all = ["psk_file", "key_file", "peer_keys"])]
    pub insecure: bool,
}

impl RemoteAuthArgs {
    /// The authentication the options name; `None`: the environment's.
    pub fn peer_auth(&self) -> Result<Option<PeerAuth>, CommandError> {
        let bad_key = |error: AuthError| CommandError::usage(error.to_string());
        if self.insecure {
            return Ok(Some(PeerAuth::Insecure));
        }
        if let Some(path) = &self.psk_file {
            return PeerAuth::psk_file(path).map(Some).map_err(bad_key);
        }
        if let (Some(key), Some(peers)) = (&self.key_file, &self.peer_keys) {
            return PeerAuth::pinned_key_files(key, peers)
                .map(Some)
                .map_err(bad_key);
        }
        Ok(None)
    }
}
