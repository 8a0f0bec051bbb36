//! What both processes of `bench --gpu` follow: sizes, message counts,
//! windows and round trips, passed to the peer on its command line.

use std::time::Duration;

use clap::Args;

/// How long one blocking step may take before the run is called failed.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// The receiving process's orders (`barlink bench-gpu-peer`).
#[derive(Debug, Clone, Args)]
pub struct GpuPeerPlan {
    /// The link's name.
    #[arg(long)]
    pub name: String,
    /// Message sizes.
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<usize>,
    /// Messages per timed window, per size.
    #[arg(long, value_delimiter = ',')]
    pub counts: Vec<usize>,
    /// Timed windows per size.
    #[arg(long)]
    pub windows: usize,
    /// Round trips per size for the latency.
    #[arg(long)]
    pub lat_iters: usize,
    /// Largest packet.
    #[arg(long)]
    pub mtu: usize,
    /// Packets in flight.
    #[arg(long)]
    pub window: u32,
    /// The CUDA device ordinal.
    #[arg(long)]
    pub gpu_device: usize,
}

impl GpuPeerPlan {
    pub fn args(&self) -> Vec<String> {
        let list = |values: &[usize]| {
            values
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        vec![
            format!("--name={}", self.name),
            format!("--sizes={}", list(&self.sizes)),
            format!("--counts={}", list(&self.counts)),
            format!("--windows={}", self.windows),
            format!("--lat-iters={}", self.lat_iters),
            format!("--mtu={}", self.mtu),
            format!("--window={}", self.window),
            format!("--gpu-device={}", self.gpu_device),
        ]
    }

    pub fn max_size(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(1)
    }
}

/// The bytes of every message of `size`: the same on both sides, so the
/// receiver can check what landed.
pub fn payload(size: usize) -> Vec<u8> {
    let mut state = (size as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..size)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}
