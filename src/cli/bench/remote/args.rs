//! The options of `barlink bench` between two machines: `--rdma` or
//! `--tcp`, the roles, authentication, and each medium's own.

use clap::{ArgGroup, Args};

use crate::cli::args::RemoteAuthArgs;

/// The options of `barlink bench` between two machines.
#[derive(Debug, Clone, Args)]
#[command(group(ArgGroup::new("remote").args(["rdma", "tcp"]).multiple(false)))]
pub struct RemoteArgs {
    /// Measure barlink over RDMA between two machines, like ib_write_bw: one
    /// side `--rdma --server`, the other `--rdma HOST[:PORT]`; perftest's
    /// ib_write_bw (and ib_write_lat) run between the same two as the baseline.
    #[arg(long)]
    pub rdma: bool,
    /// Measure barlink over TCP between two machines: one side `--tcp
    /// --server`, the other `--tcp HOST[:PORT]`; iperf3 and a plain TCP
    /// ping-pong run between the same two as the baselines.
    #[arg(long)]
    pub tcp: bool,
    /// With --rdma or --tcp: wait for a client (the side ib_write_bw and
    /// iperf3 -s are on).
    #[arg(long, requires = "remote")]
    pub server: bool,
    /// With --server: the address to listen on [default: 0.0.0.0:18515
    /// for --rdma, 0.0.0.0:18616 for --tcp].
    #[arg(long, value_name = "ADDR", requires = "server")]
    pub listen: Option<String>,
    /// With --rdma or --tcp: the server to measure against (the client role).
    #[arg(
        value_name = "HOST[:PORT]",
        requires = "remote",
        conflicts_with = "server"
    )]
    pub host: Option<String>,
    /// With --tcp: seal every packet (AES-256-GCM with the setup's keys;
    /// both sides must ask for it).
    #[arg(long, requires = "tcp")]
    pub encrypt: bool,
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
    /// With --server: seconds to wait for a client.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    pub accept_timeout: u64,
    /// With --rdma or --tcp: run no baseline (perftest, iperf3, the TCP
    /// ping-pong): no ratio.
    #[arg(long, requires = "remote")]
    pub no_baseline: bool,
    #[command(flatten)]
    pub auth: RemoteAuthArgs,
}
