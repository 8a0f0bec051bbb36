//! The `--rdma` options of `barlink bench`.

use clap::Args;

use crate::cli::args::RemoteAuthArgs;

/// The `--rdma` options of `barlink bench`.
#[derive(Debug, Clone, Args)]
pub struct RdmaArgs {
    /// Measure barlink over RDMA between two machines, like ib_write_bw: one
    /// side `--rdma --server`, the other `--rdma HOST[:PORT]`; perftest's
    /// ib_write_bw (and ib_write_lat) run between the same two as the baseline.
    #[arg(long = "rdma")]
    pub enabled: bool,
    /// With --rdma: wait for a client (the side ib_write_bw calls the server).
    #[arg(long, requires = "enabled")]
    pub server: bool,
    /// With --rdma --server: the address to listen on [default: 0.0.0.0:18515].
    #[arg(long, value_name = "ADDR", requires = "server")]
    pub listen: Option<String>,
    /// With --rdma: the server to measure against (the client role).
    #[arg(
        value_name = "HOST[:PORT]",
        requires = "enabled",
        conflicts_with = "server"
    )]
    pub host: Option<String>,
    /// With --rdma: the RDMA device (`ibv_devices`) [default: the first with an active port].
    #[arg(long, value_name = "DEV", env = "BARLINK_RDMA_DEVICE")]
    pub rdma_device: Option<String>,
    /// With --rdma: the GID index [default: the RoCE v2 entry of an IPv4 address].
    #[arg(long, value_name = "N", env = "BARLINK_GID_INDEX")]
    pub gid_index: Option<u8>,
    /// With --rdma: the queue pairs' local ACK timeout exponent (4.096 us x
    /// 2^N), for barlink and perftest alike; 18 under emulated soft-RoCE.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 14,
        env = "BARLINK_QP_TIMEOUT"
    )]
    pub qp_timeout: u8,
    /// With --rdma --server: seconds to wait for a client.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    pub accept_timeout: u64,
    /// With --rdma: do not run perftest (no baseline, no ratio).
    #[arg(long, requires = "enabled")]
    pub no_baseline: bool,
    #[command(flatten)]
    pub auth: RemoteAuthArgs,
}
