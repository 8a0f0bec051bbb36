//! `barlink bench`: the reliability engine's throughput and per-message
//! latency, with a memcpy baseline measured in the same run.
//!
//! Today the measured path is `engine-mem`: two engines in one thread over
//! the in-memory medium, so the figures are the protocol's own cost (packet
//! building, CRC on both sides, acknowledgements, reassembly) with no
//! medium in the way. The baseline `memcpy` moves the same bytes the same
//! way — message to packet buffer to destination — with no protocol. Links
//! over shared memory (and their raw-ring and Unix-socket baselines) join
//! this command when they land.
//!
//! Figures are medians over timed windows, as the machine is shared and
//! noisy; the first window of each size is a warm-up that also verifies
//! every delivered byte.

use std::hint::black_box;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use barlink_transport::EngineConfig;
use barlink_transport::sim::{Faults, SimPair, SplitMix64};
use clap::{Args, ValueEnum};
use serde_json::json;

use super::args::JsonArg;
use super::{CommandError, Status, human_size, parse_size};

/// `--rdma`: between two machines, against perftest.
mod rdma;
/// The default path: two processes over shared memory.
pub mod shm;

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
    path: BenchPath,
    /// Message sizes: a list (8,4K,64K) or a range MIN:MAX[:FACTOR]
    /// (8:64M:4). Default 8,64,512,4K,64K,1M,16M; with --quick 64,4K,64K,1M.
    #[arg(long, env = "BARLINK_SIZES")]
    sizes: Option<String>,
    /// Largest packet, header included. The default, 128 KiB, carries a
    /// 64 KiB message in one packet, not two (the second of 80 bytes), and
    /// halves the packets of larger ones: ~1,800 fewer instructions per
    /// 64 KiB message. Both sides must use the same.
    #[arg(long, default_value = "128K", value_parser = parse_size, env = "BARLINK_MTU")]
    mtu: usize,
    /// Packets in flight (send window and receive credit). Default: as many
    /// as fill 4 MiB (the ring size this machine moves data fastest through),
    /// between 4 and 256.
    #[arg(long, env = "BARLINK_WINDOW")]
    window: Option<u32>,
    /// CRC-32C on every packet.
    #[arg(long, value_enum, default_value = "on", env = "BARLINK_CRC")]
    crc: OnOff,
    /// Probability that a packet is corrupted (one bit flipped) on the way,
    /// each direction; the engine must catch and resend every one. Between
    /// processes this adds a `barlink-faults` row, measured like the clean
    /// one, and its goodput relative to the clean run.
    #[arg(long, default_value_t = 0.0, env = "BARLINK_FAULT_RATE")]
    fault_rate: f64,
    /// Timed windows per size (the median is reported). Default 7; quick 3.
    #[arg(long, env = "BARLINK_WINDOWS")]
    windows: Option<usize>,
    /// Payload bytes per window (at least 16 messages). Default
    /// 64M; quick 8M.
    #[arg(long, value_parser = parse_size, env = "BARLINK_BYTES_PER_WINDOW")]
    bytes_per_window: Option<usize>,
    /// Single-message round trips timed for the latency percentiles.
    #[arg(long, env = "BARLINK_LAT_ITERS")]
    lat_iters: Option<usize>,
    /// A short run (under 20 seconds).
    #[arg(long)]
    quick: bool,
    #[command(flatten)]
    output: JsonArg,
    /// Seed for payloads and injected faults.
    #[arg(long, default_value_t = 1, env = "BARLINK_SEED")]
    seed: u64,
    /// Who drives barlink's links between processes: the caller's thread
    /// inside its calls (poll), or a background progress thread per link
    /// (thread: callers block, a CPU thread moves the packets).
    #[arg(long, value_enum, default_value = "poll", env = "BARLINK_PROGRESS")]
    progress: shm::ProgressMode,
    /// Which of the two-process paths to measure (ratios to a baseline that
    /// was not measured print as "-" and are left out of --json).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "barlink,raw-ring,raw-ring-crc,unix-socket",
        env = "BARLINK_PATHS"
    )]
    paths: Vec<shm::ProcPath>,
    #[command(flatten)]
    rdma: rdma::RdmaArgs,
}

/// One row of results.
#[derive(Debug, Clone)]
struct Row {
    path: &'static str,
    size: usize,
    gbps: f64,
    lat_p50_us: f64,
    lat_p99_us: f64,
    packets_per_s: f64,
    retransmits: u64,
    crc_errors: u64,
    ratio_to_memcpy: f64,
}

struct Plan {
    sizes: Vec<usize>,
    windows: usize,
    bytes_per_window: usize,
    lat_iters: usize,
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
    fn plan(&self) -> Result<Plan, CommandError> {
        let default_sizes = if self.quick {
            "64,4K,64K,1M"
        } else {
            "8,64,512,4K,64K,1M,16M"
        };
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

    fn engine_config(&self, max_message: usize) -> EngineConfig {
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

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn percentile(values: &mut [f64], fraction: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let index = ((values.len() as f64 * fraction).ceil() as usize).clamp(1, values.len()) - 1;
    values[index]
}

/// Messages in one timed window: the window's bytes, but never fewer than
/// 16 messages (a 16 MiB size still gets a median over several).
fn messages_per_window(plan: &Plan, size: usize) -> usize {
    (plan.bytes_per_window / size.max(1)).max(16)
}

pub fn run(args: &BenchArgs) -> Result<Status, CommandError> {
    if args.rdma.enabled {
        return rdma::run(args);
    }
    let plan = args.plan()?;
    let max_size = *plan.sizes.iter().max().expect("checked non-empty");
    let config = args.engine_config(max_size);
    config
        .validate()
        .map_err(|e| CommandError::usage(format!("engine configuration: {e}")))?;
    if args.path == BenchPath::Shm {
        return run_processes(args, &plan, &config);
    }
    let faults = Faults {
        corrupt: args.fault_rate,
        ..Faults::none()
    };
    let progress = !args.output.json && std::io::stderr().is_terminal();
    if !args.output.json {
        println!(
            "# barlink bench: two engines in one thread over an in-memory medium (the protocol's own cost)"
        );
        println!(
            "# MTU {}  window {}  CRC {}  fault rate {}  {} timed windows per size (medians)",
            config.mtu,
            config.send_window,
            if config.crc { "on" } else { "off" },
            args.fault_rate,
            plan.windows
        );
        println!(
            "# baseline memcpy: the same bytes copied message -> packet slot (cycling through a window's worth) -> destination, no protocol"
        );
        println!(
            "# {:>8}  {:<10} {:>8} {:>10} {:>11} {:>11} {:>9} {:>8} {:>8}",
            "size",
            "path",
            "GB/s",
            "vs memcpy",
            "lat p50 us",
            "lat p99 us",
            "Mpkt/s",
            "retrans",
            "crc_err"
        );
    }
    let mut rng = SplitMix64::new(args.seed);
    let mut failed_verification = false;
    for &size in &plan.sizes {
        let mut payload = vec![0u8; size];
        rng.fill(&mut payload);
        let message: Arc<[u8]> = payload.into();
        let count = messages_per_window(&plan, size);
        if progress {
            eprint!("\rbench: {:>6} ...", human_size(size));
        }
        let mut pair: SimPair<Arc<[u8]>> = SimPair::new(
            config.clone(),
            config.clone(),
            faults.clone(),
            faults.clone(),
            rng.next_u64(),
        )
        .map_err(|e| CommandError::usage(e.to_string()))?;

        // Warm-up window: every delivered byte is checked.
        let mut bad = 0usize;
        let mut delivered = 0usize;
        pair.transfer(&message, count.min(2000), |data| {
            delivered += 1;
            if data != &message[..] {
                bad += 1;
            }
        })
        .map_err(|e| CommandError::environment(format!("size {size}: {e}")))?;
        if bad > 0 || delivered != count.min(2000) {
            failed_verification = true;
            eprintln!(
                "barlink bench: size {size}: {bad} of {delivered} delivered messages differ from what was sent"
            );
        }

        let stats_before = pair.a.stats().clone();
        let crc_before = pair.b.stats().crc_failures + pair.b.stats().malformed;
        let mut engine_gbps = Vec::with_capacity(plan.windows);
        let mut engine_pps = Vec::with_capacity(plan.windows);
        let mut memcpy_gbps = Vec::with_capacity(plan.windows);
        // The baseline's packet slots: a window's worth, as the medium holds.
        let mut staging = vec![0u8; config.mtu * config.send_window as usize];
        let mut destination = vec![0u8; size];
        for window in 0..plan.windows {
            if progress {
                eprint!(
                    "\rbench: {:>6} window {}/{} ",
                    human_size(size),
                    window + 1,
                    plan.windows
                );
            }
            let packets_before = pair.a.stats().data_packets_sent;
            let start = Instant::now();
            let mut delivered_bytes = 0usize;
            pair.transfer(&message, count, |data| delivered_bytes += data.len())
                .map_err(|e| CommandError::environment(format!("size {size}: {e}")))?;
            let seconds = start.elapsed().as_secs_f64();
            engine_gbps.push(delivered_bytes as f64 / seconds / 1e9);
            engine_pps.push((pair.a.stats().data_packets_sent - packets_before) as f64 / seconds);

            let start = Instant::now();
            let mut cursor = 0;
            for _ in 0..count {
                copy_like_the_medium(
                    &message,
                    &mut staging,
                    &mut destination,
                    config.max_payload_len() as usize,
                    &mut cursor,
                );
            }
            let seconds = start.elapsed().as_secs_f64();
            memcpy_gbps.push((count * size) as f64 / seconds / 1e9);
        }
        let (engine_lat, memcpy_lat) = latencies(
            &mut pair,
            &message,
            &mut staging,
            &mut destination,
            &plan,
            &config,
        )
        .map_err(|e| CommandError::environment(format!("size {size}: {e}")))?;

        let stats = pair.a.stats();
        let retransmits = stats.retransmits() - stats_before.retransmits();
        let crc_errors = pair.b.stats().crc_failures + pair.b.stats().malformed - crc_before;
        let memcpy = median(&mut memcpy_gbps);
        let engine = median(&mut engine_gbps);
        let (mut engine_lat, mut memcpy_lat) = (engine_lat, memcpy_lat);
        let rows = [
            Row {
                path: "engine-mem",
                size,
                gbps: engine,
                lat_p50_us: percentile(&mut engine_lat, 0.5),
                lat_p99_us: percentile(&mut engine_lat, 0.99),
                packets_per_s: median(&mut engine_pps),
                retransmits,
                crc_errors,
                ratio_to_memcpy: engine / memcpy,
            },
            Row {
                path: "memcpy",
                size,
                gbps: memcpy,
                lat_p50_us: percentile(&mut memcpy_lat, 0.5),
                lat_p99_us: percentile(&mut memcpy_lat, 0.99),
                packets_per_s: 0.0,
                retransmits: 0,
                crc_errors: 0,
                ratio_to_memcpy: 1.0,
            },
        ];
        if progress {
            eprint!("\r{:40}\r", "");
        }
        for row in rows {
            print_row(&row, args, &config);
        }
    }
    Ok(if failed_verification {
        Status::CheckFailed
    } else {
        Status::Ok
    })
}

/// The default path: two processes over shared memory, three ways.
fn run_processes(
    args: &BenchArgs,
    plan: &Plan,
    config: &EngineConfig,
) -> Result<Status, CommandError> {
    let counts: Vec<usize> = plan
        .sizes
        .iter()
        .map(|&size| messages_per_window(plan, size).min(100_000))
        .collect();
    let progress = !args.output.json && std::io::stderr().is_terminal();
    if !args.output.json {
        println!("# barlink bench: two processes over shared memory (memfd windows, 4 MiB rings)");
        println!(
            "# MTU {}  window {}  CRC {}  progress {}  {} timed windows per size (medians); latency = round trip / 2",
            config.mtu,
            config.send_window,
            if config.crc { "on" } else { "off" },
            args.progress.name(),
            plan.windows
        );
        println!(
            "# baselines in the same run: raw-ring (same rings, no protocol: the limit), \
             raw-ring-crc (the raw ring checking a CRC-32C per slot: the limit with checked data), unix-socket"
        );
        println!(
            "# {:>8}  {:<14} {:>8} {:>12} {:>12} {:>9} {:>11} {:>11} {:>8} {:>8}",
            "size",
            "path",
            "GB/s",
            "vs raw-ring",
            "vs raw+crc",
            "vs unix",
            "lat p50 us",
            "lat p99 us",
            "retrans",
            "crc_err"
        );
    }
    // The medians below are indexed in this order.
    let all = [
        shm::ProcPath::Barlink,
        shm::ProcPath::RawRing,
        shm::ProcPath::RawRingCrc,
        shm::ProcPath::UnixSocket,
        shm::ProcPath::BarlinkFaults,
    ];
    let faults = args.fault_rate > 0.0;
    let paths: Vec<shm::ProcPath> = all
        .into_iter()
        .filter(|&path| {
            if path == shm::ProcPath::BarlinkFaults {
                faults
            } else {
                args.paths.contains(&path)
            }
        })
        .collect();
    if progress {
        eprint!("\rbench: measuring ...");
    }
    let peer_plan = shm::PeerPlan {
        paths: paths.clone(),
        name: format!("bench-{}", std::process::id()),
        sizes: plan.sizes.clone(),
        counts: counts.clone(),
        windows: plan.windows,
        lat_iters: plan.lat_iters.min(2000),
        mtu: config.mtu,
        crc: config.crc,
        fault_rate: args.fault_rate,
        seed: args.seed,
        progress: args.progress,
    };
    let measured = shm::run_parent(&peer_plan)
        .map_err(|e| CommandError::environment(format!("bench: {e}")))?;
    // One list per entry of `all`, empty where the path was not measured.
    let mut results: Vec<Vec<shm::Measured>> = vec![vec![]; all.len()];
    for (path, path_results) in paths.iter().zip(measured) {
        let slot = all
            .iter()
            .position(|p| p == path)
            .expect("paths come from all");
        results[slot] = path_results;
    }
    if progress {
        eprint!("\r{:40}\r", "");
    }
    // The widest spread of one path's windows, to warn about below.
    let mut widest: Option<(f64, &'static str, usize, f64, f64)> = None;
    for (index, &size) in plan.sizes.iter().enumerate() {
        let mut medians = [0.0f64; 5];
        for (which, path_results) in results.iter_mut().enumerate() {
            if let Some(measured) = path_results.get_mut(index) {
                medians[which] = median(&mut measured.gbps_windows);
            }
        }
        let ratio = |value: f64, baseline: f64| {
            if baseline > 0.0 {
                value / baseline
            } else {
                0.0
            }
        };
        for (which, path) in all.into_iter().enumerate() {
            let Some(m) = results[which].get_mut(index) else {
                continue;
            };
            let path = path.name();
            let (low, high) = extremes(&m.gbps_windows);
            if low > 0.0 && widest.is_none_or(|(spread, ..)| high / low > spread) {
                widest = Some((high / low, path, size, low, high));
            }
            let row = ProcRow {
                path,
                size,
                gbps: medians[which],
                gbps_range: (low, high),
                lat_p50_us: percentile(&mut m.latencies_us, 0.5),
                lat_p99_us: percentile(&mut m.latencies_us, 0.99),
                retransmits: m.retransmits,
                crc_errors: m.crc_errors,
                vs_raw_ring: ratio(medians[which], medians[1]),
                vs_raw_ring_crc: ratio(medians[which], medians[2]),
                vs_unix: ratio(medians[which], medians[3]),
                vs_clean: (which == 4).then(|| ratio(medians[4], medians[0])),
            };
            print_proc_row(&row, args, config);
        }
        if faults && !args.output.json {
            println!(
                "# {:>8}  goodput with a bit flipped in {} of packets: {:.2}x the clean barlink run",
                human_size(size),
                args.fault_rate,
                ratio(medians[4], medians[0])
            );
        }
    }
    if let Some((spread, path, size, low, high)) = widest
        && spread > UNSTEADY_SPREAD
        && !args.output.json
    {
        println!(
            "# note: the machine's load changed during this run: {path} at {} moved {low:.2}-{high:.2} GB/s \
             between its windows; the paths take turns, so each ratio saw the same load, but one run \
             is not a figure here: run it again (gbps_min/gbps_max in --json)",
            human_size(size)
        );
    }
    Ok(Status::Ok)
}

/// A path whose fastest window beats its slowest by more than this saw the
/// machine's load change (a shared VM: measured 2.6x between back-to-back
/// runs of the same build), and the run says so.
const UNSTEADY_SPREAD: f64 = 1.5;

/// The slowest and fastest of a path's windows (zeros if none).
fn extremes(windows: &[f64]) -> (f64, f64) {
    if windows.is_empty() {
        return (0.0, 0.0);
    }
    let low = windows.iter().copied().fold(f64::INFINITY, f64::min);
    let high = windows.iter().copied().fold(0.0, f64::max);
    (low, high)
}

struct ProcRow {
    path: &'static str,
    size: usize,
    gbps: f64,
    /// The slowest and fastest timed window.
    gbps_range: (f64, f64),
    lat_p50_us: f64,
    lat_p99_us: f64,
    retransmits: u64,
    crc_errors: u64,
    vs_raw_ring: f64,
    vs_raw_ring_crc: f64,
    vs_unix: f64,
    /// `barlink-faults`: goodput relative to the clean barlink run.
    vs_clean: Option<f64>,
}

fn print_proc_row(row: &ProcRow, args: &BenchArgs, config: &EngineConfig) {
    if args.output.json {
        let mut value = common_json(
            row.path,
            row.size,
            [row.gbps, row.lat_p50_us, row.lat_p99_us],
            [row.retransmits, row.crc_errors],
            config,
        );
        value.insert("gbps_min".into(), json!(round(row.gbps_range.0, 3)));
        value.insert("gbps_max".into(), json!(round(row.gbps_range.1, 3)));
        // A ratio to a baseline this run did not measure is left out.
        if row.vs_raw_ring > 0.0 {
            value.insert("ratio_to_raw_ring".into(), json!(round(row.vs_raw_ring, 3)));
        }
        if row.vs_raw_ring_crc > 0.0 {
            value.insert(
                "ratio_to_raw_ring_crc".into(),
                json!(round(row.vs_raw_ring_crc, 3)),
            );
        }
        if row.vs_unix > 0.0 {
            value.insert("ratio_to_unix_socket".into(), json!(round(row.vs_unix, 3)));
        }
        if row.path.starts_with("barlink") {
            value.insert("progress".into(), json!(args.progress.name()));
        }
        if let Some(vs_clean) = row.vs_clean {
            value.insert("fault_rate".into(), json!(args.fault_rate));
            value.insert("ratio_to_clean".into(), json!(round(vs_clean, 3)));
        }
        println!("{}", serde_json::Value::Object(value));
    } else {
        // "-" for a ratio to a baseline this run did not measure.
        let ratio = |value: f64| {
            if value > 0.0 {
                format!("{value:.2}x")
            } else {
                "-".to_string()
            }
        };
        println!(
            "  {:>8}  {:<14} {:>8.2} {:>12} {:>12} {:>9} {:>11.2} {:>11.2} {:>8} {:>8}",
            human_size(row.size),
            row.path,
            row.gbps,
            ratio(row.vs_raw_ring),
            ratio(row.vs_raw_ring_crc),
            ratio(row.vs_unix),
            row.lat_p50_us,
            row.lat_p99_us,
            row.retransmits,
            row.crc_errors
        );
    }
}

/// What the medium does to a message's bytes, without a protocol: each
/// packet-sized piece copied into the next of a ring of slots (`staging`,
/// a whole number of `slot`-byte slots), then to its place.
fn copy_like_the_medium(
    message: &[u8],
    staging: &mut [u8],
    destination: &mut [u8],
    piece: usize,
    cursor: &mut usize,
) {
    let slot = staging.len() / (staging.len() / piece.max(1)).max(1);
    for (index, chunk) in message.chunks(piece).enumerate() {
        if *cursor + slot > staging.len() {
            *cursor = 0;
        }
        let slot_bytes = &mut staging[*cursor..*cursor + chunk.len()];
        slot_bytes.copy_from_slice(chunk);
        let offset = index * piece;
        destination[offset..offset + chunk.len()].copy_from_slice(slot_bytes);
        *cursor += slot;
    }
    black_box(&destination);
}

/// Single-message latency: from `send` to the receiver's delivery, one
/// message at a time, in microseconds; and the memcpy baseline's.
fn latencies(
    pair: &mut SimPair<Arc<[u8]>>,
    message: &Arc<[u8]>,
    staging: &mut [u8],
    destination: &mut [u8],
    plan: &Plan,
    config: &EngineConfig,
) -> Result<(Vec<f64>, Vec<f64>), String> {
    // Large messages take long; fewer samples still give stable medians.
    let iters = if message.len() >= 1 << 20 {
        plan.lat_iters.min(50)
    } else {
        plan.lat_iters
    };
    let mut engine = Vec::with_capacity(iters);
    let mut memcpy = Vec::with_capacity(iters);
    for _ in 0..iters {
        let start = Instant::now();
        let mut arrived = None;
        pair.transfer(message, 1, |_| arrived = Some(start.elapsed()))
            .map_err(|e| e.to_string())?;
        let arrived = arrived.ok_or("a message completed without being delivered")?;
        engine.push(micros(arrived));
        let start = Instant::now();
        let mut cursor = 0;
        copy_like_the_medium(
            message,
            staging,
            destination,
            config.max_payload_len() as usize,
            &mut cursor,
        );
        memcpy.push(micros(start.elapsed()));
    }
    Ok((engine, memcpy))
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

fn print_row(row: &Row, args: &BenchArgs, config: &EngineConfig) {
    if args.output.json {
        let mut value = common_json(
            row.path,
            row.size,
            [row.gbps, row.lat_p50_us, row.lat_p99_us],
            [row.retransmits, row.crc_errors],
            config,
        );
        value.insert("packets_per_s".into(), json!(round(row.packets_per_s, 0)));
        value.insert(
            "ratio_to_memcpy".into(),
            json!(round(row.ratio_to_memcpy, 3)),
        );
        value.insert("fault_rate".into(), json!(args.fault_rate));
        println!("{}", serde_json::Value::Object(value));
    } else {
        let ratio = if row.path == "memcpy" {
            "-".to_string()
        } else {
            format!("{:.2}x", row.ratio_to_memcpy)
        };
        let mpps = if row.packets_per_s > 0.0 {
            format!("{:.3}", row.packets_per_s / 1e6)
        } else {
            "-".to_string()
        };
        println!(
            "  {:>8}  {:<10} {:>8.2} {:>10} {:>11.2} {:>11.2} {:>9} {:>8} {:>8}",
            human_size(row.size),
            row.path,
            row.gbps,
            ratio,
            row.lat_p50_us,
            row.lat_p99_us,
            mpps,
            row.retransmits,
            row.crc_errors
        );
    }
}

/// The fields every `--json` row of every path has (the README's contract
/// with scripts): path, size, GB/s, latency percentiles, retransmissions,
/// CRC errors, and the link settings.
fn common_json(
    path: &str,
    size: usize,
    [gbps, lat_p50_us, lat_p99_us]: [f64; 3],
    [retransmits, crc_errors]: [u64; 2],
    config: &EngineConfig,
) -> serde_json::Map<String, serde_json::Value> {
    match json!({
        "path": path,
        "size_bytes": size,
        "gbps": round(gbps, 3),
        "lat_p50_us": round(lat_p50_us, 3),
        "lat_p99_us": round(lat_p99_us, 3),
        "retransmits": retransmits,
        "crc_errors": crc_errors,
        "mtu": config.mtu,
        "crc": config.crc,
    }) {
        serde_json::Value::Object(map) => map,
        _ => unreachable!("a JSON object literal"),
    }
}

fn round(value: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (value * scale).round() / scale
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

    #[test]
    fn extremes_are_the_slowest_and_fastest_window() {
        assert_eq!(extremes(&[3.0, 1.5, 9.0, 2.0]), (1.5, 9.0));
        assert_eq!(extremes(&[]), (0.0, 0.0));
    }

    #[test]
    fn percentiles_pick_ranks() {
        let mut values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&mut values, 0.5), 50.0);
        assert_eq!(percentile(&mut values, 0.99), 99.0);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
    }

    #[test]
    fn the_medium_copy_reassembles_the_message() {
        let message: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let mut staging = vec![0; 3 * 1000];
        let mut destination = vec![0; 10_000];
        let mut cursor = 0;
        copy_like_the_medium(&message, &mut staging, &mut destination, 944, &mut cursor);
        assert_eq!(message, destination);
        assert!(cursor > 0 && cursor <= staging.len());
    }
}
