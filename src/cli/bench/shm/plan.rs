//! What both processes of the shared-memory bench agree on: the paths,
//! sizes, counts and link settings, passed to the child on its command
//! line.

use std::time::Duration;

use barlink_transport::link::LinkConfig;
use clap::{Args, ValueEnum};

/// How long any single step of the benchmark may wait for the peer.
pub(super) const STEP_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProcPath {
    Barlink,
    RawRing,
    RawRingCrc,
    UnixSocket,
    /// barlink with a bit flipped in packets on the way (`--fault-rate`).
    BarlinkFaults,
    /// barlink sending a copy of the caller's bytes made for each message,
    /// as a caller that only borrows its memory must: the Rust link doing
    /// what the C face's copying calls do.
    BarlinkCopied,
    /// barlink sending its one buffer again only once the link let go of
    /// it (each message acknowledged before the next goes), as a Rust
    /// caller that refills one buffer for every message must: the use a
    /// blocking C `barlink_send` that lends its bytes serves (that call
    /// returns sooner, copying the last packets instead of awaiting them).
    BarlinkAcked,
}

impl ProcPath {
    pub fn name(self) -> &'static str {
        match self {
            ProcPath::Barlink => "barlink",
            ProcPath::RawRing => "raw-ring",
            ProcPath::RawRingCrc => "raw-ring-crc",
            ProcPath::UnixSocket => "unix-socket",
            ProcPath::BarlinkFaults => "barlink-faults",
            ProcPath::BarlinkCopied => "barlink-copied",
            ProcPath::BarlinkAcked => "barlink-acked",
        }
    }
}

/// Who drives a barlink link's progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProgressMode {
    /// The caller's thread, inside its send and receive calls (polling).
    Poll,
    /// A background progress thread per link; callers block on it.
    Thread,
}

impl ProgressMode {
    pub fn name(self) -> &'static str {
        match self {
            ProgressMode::Poll => "poll",
            ProgressMode::Thread => "thread",
        }
    }
}

/// What both processes must agree on, passed to the child on its command line.
#[derive(Debug, Clone, Args)]
pub struct PeerPlan {
    /// The paths to measure, in the order their windows take turns.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub paths: Vec<ProcPath>,
    /// Rendezvous name.
    #[arg(long)]
    pub name: String,
    /// Message sizes, in order.
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<usize>,
    /// Messages per window, per size (same order).
    #[arg(long, value_delimiter = ',')]
    pub counts: Vec<usize>,
    /// Timed windows (plus one warm-up).
    #[arg(long)]
    pub windows: usize,
    /// Round trips for latency, per size.
    #[arg(long)]
    pub lat_iters: usize,
    /// Packet size of the barlink link.
    #[arg(long)]
    pub mtu: usize,
    /// CRC on the barlink link.
    #[arg(long, action = clap::ArgAction::Set)]
    pub crc: bool,
    /// `barlink-faults`: probability that a packet written into the peer's
    /// ring gets one bit flipped.
    #[arg(long, default_value_t = 0.0)]
    pub fault_rate: f64,
    /// Seed of the injected faults.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Who drives the barlink links.
    #[arg(long, value_enum, default_value = "poll")]
    pub progress: ProgressMode,
}

pub(super) fn link_config(plan: &PeerPlan) -> LinkConfig {
    let mut config = LinkConfig::default();
    config.engine.mtu = plan.mtu;
    config.engine.crc = plan.crc;
    config.engine.max_message_len = config
        .engine
        .max_message_len
        .max(plan.sizes.iter().copied().max().unwrap_or(0) as u64);
    let window = ((4 << 20) / plan.mtu).clamp(4, 256) as u32;
    config.engine.send_window = window;
    config.engine.recv_window = window;
    // A link sits unpolled while the other paths take their turns; that is
    // the schedule, not a lost peer.
    config.engine.peer_timeout = STEP_TIMEOUT;
    config.setup_timeout = Duration::from_secs(20);
    config
}

/// The child's command line for `plan` (`barlink bench-peer ...`).
pub(super) fn plan_args(plan: &PeerPlan) -> Vec<String> {
    let join = |v: &[usize]| {
        v.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    vec![
        "--paths".into(),
        plan.paths
            .iter()
            .map(|path| path.name())
            .collect::<Vec<_>>()
            .join(","),
        "--name".into(),
        plan.name.clone(),
        "--sizes".into(),
        join(&plan.sizes),
        "--counts".into(),
        join(&plan.counts),
        "--windows".into(),
        plan.windows.to_string(),
        "--lat-iters".into(),
        plan.lat_iters.to_string(),
        "--mtu".into(),
        plan.mtu.to_string(),
        "--crc".into(),
        plan.crc.to_string(),
        "--fault-rate".into(),
        plan.fault_rate.to_string(),
        "--seed".into(),
        plan.seed.to_string(),
        "--progress".into(),
        plan.progress.name().into(),
    ]
}
