//! `barlink bench`'s options, and the plan they make: sizes, windows,
//! bytes per window, latency round trips, and the engine's configuration.

use barlink_transport::EngineConfig;
use clap::{Args, ValueEnum};

use super::remote::args::RemoteArgs;
use super::shm::plan::{ProcPath, ProgressMode};
use crate::cli::args::{GpuDeviceArg, JsonArg};
use crate::cli::{CommandError, parse_size};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchPath {
    /// Two processes over shared memory: barlink, raw ring, Unix socket.
    Shm,
    /// Two engines in one thread over an in-memory medium, against memcpy.
    EngineMem,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(long, value_enum, default_value = "shm", env = "BARLINK_PATH")]
    pub path: BenchPath,
    /// Message sizes: a list (8,4K,64K) or a range MIN:MAX[:FACTOR]
    /// (8:64M:4). Default 8,64,512,4K,64K,1M,16M; with --quick 64,4K,64K,1M.
    #[arg(long, env = "BARLINK_SIZES")]
    pub sizes: Option<String>,
    /// Largest packet, header included. The default, 128 KiB, carries a
    /// 64 KiB message in one packet, not two (the second of 80 bytes), and
    /// halves the packets of larger ones. Both sides must use the same.
    #[arg(long, default_value = "128K", value_parser = parse_size, env = "BARLINK_MTU")]
    pub mtu: usize,
    /// Packets in flight (send window and receive credit). Default: as many
    /// as fill 4 MiB (the rings' size), between 4 and 256.
    #[arg(long, env = "BARLINK_WINDOW")]
    pub window: Option<u32>,
    /// CRC-32C on every packet.
    #[arg(long, value_enum, default_value = "on", env = "BARLINK_CRC")]
    pub crc: OnOff,
    /// Probability that a packet is corrupted (one bit flipped) on the way,
    /// each direction, and an index store too (the ring's head and consumed
    /// words); the engine must catch and resend every corrupt packet, and
    /// the ring must ignore and outlive every corrupt index. Between
    /// processes this adds a `barlink-faults` row, measured like the clean
    /// one, and its goodput relative to the clean run.
    #[arg(long, default_value_t = 0.0, env = "BARLINK_FAULT_RATE")]
    pub fault_rate: f64,
    /// Timed windows per size (the median is reported). Default 7; quick 3.
    #[arg(long, env = "BARLINK_WINDOWS")]
    pub windows: Option<usize>,
    /// Payload bytes per window (at least 16 messages). Default
    /// 64M; quick 8M.
    #[arg(long, value_parser = parse_size, env = "BARLINK_BYTES_PER_WINDOW")]
    pub bytes_per_window: Option<usize>,
    /// Single-message round trips timed for the latency percentiles.
    #[arg(long, env = "BARLINK_LAT_ITERS")]
    pub lat_iters: Option<usize>,
    /// A short run (under 20 seconds).
    #[arg(long)]
    pub quick: bool,
    #[command(flatten)]
    pub output: JsonArg,
    /// Seed for payloads and injected faults.
    #[arg(long, default_value_t = 1, env = "BARLINK_SEED")]
    pub seed: u64,
    /// Who drives barlink's links between processes: the caller's thread
    /// inside its calls (poll), or a background progress thread per link
    /// (thread: callers block, a CPU thread moves the packets).
    #[arg(long, value_enum, default_value = "poll", env = "BARLINK_PROGRESS")]
    pub progress: ProgressMode,
    /// Which of the two-process paths to measure (ratios to a baseline that
    /// was not measured print as "-" and are left out of --json).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "barlink,raw-ring,raw-ring-crc,unix-socket",
        env = "BARLINK_PATHS"
    )]
    pub paths: Vec<ProcPath>,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Device buffers at both ends (CUDA): barlink's staged route between
    /// two processes against cuMemcpy staging and CUDA IPC on the same GPU.
    /// Exits 3 saying what is missing without a driver or a GPU. Default
    /// sizes 4K,64K,1M,16M; with --quick 64K,1M.
    #[arg(long, conflicts_with = "remote")]
    pub gpu: bool,
    #[command(flatten)]
    pub gpu_device: GpuDeviceArg,
}

/// What one run measures, from the options and the `--quick` defaults.
pub struct Plan {
    pub sizes: Vec<usize>,
    pub windows: usize,
    pub bytes_per_window: usize,
    pub lat_iters: usize,
}

impl Plan {
    /// Messages in one timed window: the window's bytes, but never fewer
    /// than 16 messages (a 16 MiB size still gets a median over several).
    pub fn messages_per_window(&self, size: usize) -> usize {
        (self.bytes_per_window / size.max(1)).max(16)
    }
}

fn parse_sizes(text: &str) -> Result<Vec<usize>, String> {
    if let Some((min, rest)) = text.split_once(':') {
        let (max, factor) = match rest.split_once(':') {
            Some((max, factor)) => (max, factor.parse::<usize>().map_err(|e| e.to_string())?),
            None => (rest, 2),
        };
        let (min, max) = (parse_size(min)?, parse_size(max)?);
        if factor < 2 || min == 0 || min > max {
            return Err(format!(
                "range {text:?} needs 0 < MIN <= MAX and FACTOR >= 2"
            ));
        }
        let mut sizes = vec![];
        let mut size = min;
        while size <= max {
            sizes.push(size);
            size = size.saturating_mul(factor);
        }
        Ok(sizes)
    } else {
        text.split(',').map(parse_size).collect()
    }
}

impl BenchArgs {
    pub fn plan(&self) -> Result<Plan, CommandError> {
        self.plan_with_sizes(if self.quick {
            "64,4K,64K,1M"
        } else {
            "8,64,512,4K,64K,1M,16M"
        })
    }

    /// The plan, with `default_sizes` where `--sizes` is not given.
    pub fn plan_with_sizes(&self, default_sizes: &str) -> Result<Plan, CommandError> {
        let sizes = parse_sizes(self.sizes.as_deref().unwrap_or(default_sizes))
            .map_err(|e| CommandError::usage(format!("--sizes: {e}")))?;
        if sizes.is_empty() {
            return Err(CommandError::usage("--sizes: no sizes given"));
        }
        if !(0.0..=0.5).contains(&self.fault_rate) {
            return Err(CommandError::usage(format!(
                "--fault-rate {} is outside 0..=0.5",
                self.fault_rate
            )));
        }
        let plan = Plan {
            sizes,
            windows: self.windows.unwrap_or(if self.quick { 3 } else { 7 }),
            bytes_per_window: self.bytes_per_window.unwrap_or(if self.quick {
                8 << 20
            } else {
                64 << 20
            }),
            lat_iters: self
                .lat_iters
                .unwrap_or(if self.quick { 200 } else { 1000 }),
        };
        if plan.windows == 0 || plan.lat_iters == 0 {
            return Err(CommandError::usage(
                "--windows and --lat-iters must be at least 1",
            ));
        }
        Ok(plan)
    }

    pub fn engine_config(&self, max_message: usize) -> EngineConfig {
        let window = self
            .window
            .unwrap_or(((4 << 20) / self.mtu.max(1)).clamp(4, 256) as u32);
        EngineConfig {
            mtu: self.mtu,
            send_window: window,
            recv_window: window,
            max_message_len: (max_message as u64).max(1 << 20),
            crc: self.crc == OnOff::On,
            ..EngineConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_lists_and_ranges() {
        assert_eq!(parse_sizes("8,4K"), Ok(vec![8, 4096]));
        assert_eq!(parse_sizes("8:64"), Ok(vec![8, 16, 32, 64]));
        assert_eq!(parse_sizes("1K:1M:32"), Ok(vec![1024, 32768, 1 << 20]));
        assert!(parse_sizes("64:8").is_err());
        assert!(parse_sizes("8:64:1").is_err());
        assert!(parse_sizes("0:64").is_err());
    }
}
