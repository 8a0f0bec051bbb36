//! What `barlink bench` prints: the rows of the in-process and the
//! two-process runs as a table for people or one JSON object per line, and
//! the statistics behind them (medians, percentiles, the spread of windows).

use std::sync::{Once, OnceLock};
use std::time::Duration;

use barlink_transport::EngineConfig;
use barlink_transport::cpu::CpuReport;
use serde_json::json;

use super::args::BenchArgs;
use crate::cli::human_size;

pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

pub fn percentile(values: &mut [f64], fraction: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let index = ((values.len() as f64 * fraction).ceil() as usize).clamp(1, values.len()) - 1;
    values[index]
}

/// The slowest and fastest of a path's windows (zeros if none).
pub fn extremes(windows: &[f64]) -> (f64, f64) {
    if windows.is_empty() {
        return (0.0, 0.0);
    }
    let low = windows.iter().copied().fold(f64::INFINITY, f64::min);
    let high = windows.iter().copied().fold(0.0, f64::max);
    (low, high)
}

pub fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

pub fn round(value: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (value * scale).round() / scale
}

/// The CPU this run is on and the kernels chosen on it (read once).
pub fn cpu() -> &'static CpuReport {
    static CPU: OnceLock<CpuReport> = OnceLock::new();
    CPU.get_or_init(CpuReport::current)
}

/// How this binary was built: `release`, or `debug` (`cargo run` without
/// `--release`), whose figures are not barlink's speed.
pub const BUILD: &str = if cfg!(debug_assertions) {
    "debug"
} else {
    "release"
};

/// Says on stderr, once, with or without `--json`, that a debug build's
/// figures are not barlink's speed: with the first figures (the header or
/// the first row), so a run that ends before any (no RDMA device, say)
/// keeps its one line of error.
fn warn_if_debug_build() {
    static WARNED: Once = Once::new();
    if BUILD != "release" {
        WARNED.call_once(|| {
            eprintln!(
                "bench: this barlink is a {BUILD} build: its figures are not barlink's speed (build with --release)"
            );
        });
    }
}

/// The header line that says where every figure below came from.
pub fn print_cpu_line() {
    warn_if_debug_build();
    let cpu = cpu();
    let limit = cpu
        .isa_limit
        .map(|limit| format!(" (limited to {limit} by BARLINK_CPU_ISA)"))
        .unwrap_or_default();
    println!(
        "# cpu: {} [{}]  kernels{limit}: copy+crc {}; crc {}; copy {}; build {BUILD}",
        cpu.model,
        cpu.features.join(" "),
        cpu.copy_crc_kernel,
        cpu.crc_kernel,
        cpu.copy_kernel
    );
}

/// The fields every `--json` row of every path has (the README's contract
/// with scripts): path, size, GB/s, latency percentiles, retransmissions,
/// CRC errors, and the link settings.
pub fn common_json(
    path: &str,
    size: usize,
    [gbps, lat_p50_us, lat_p99_us]: [f64; 3],
    [retransmits, crc_errors]: [u64; 2],
    config: &EngineConfig,
) -> serde_json::Map<String, serde_json::Value> {
    warn_if_debug_build();
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
        "cpu": cpu().model,
        "cpu_features": cpu().features,
        "copy_crc_kernel": cpu().copy_crc_kernel,
        "crc_kernel": cpu().crc_kernel,
        "copy_kernel": cpu().copy_kernel,
        "cpu_isa_limit": cpu().isa_limit,
        "build": BUILD,
    }) {
        serde_json::Value::Object(map) => map,
        _ => unreachable!("a JSON object literal"),
    }
}

// ------------------------------------------------------------- engine-mem

/// One row of the in-process run.
#[derive(Debug, Clone)]
pub struct Row {
    pub path: &'static str,
    pub size: usize,
    pub gbps: f64,
    pub lat_p50_us: f64,
    pub lat_p99_us: f64,
    pub packets_per_s: f64,
    pub retransmits: u64,
    pub crc_errors: u64,
    pub ratio_to_memcpy: f64,
}

pub fn print_header(args: &BenchArgs, config: &EngineConfig, windows: usize) {
    println!(
        "# barlink bench: two engines in one thread over an in-memory medium (the protocol's own cost)"
    );
    println!(
        "# MTU {}  window {}  CRC {}  fault rate {}  {} timed windows per size (medians)",
        config.mtu,
        config.send_window,
        if config.crc { "on" } else { "off" },
        args.fault_rate,
        windows
    );
    print_cpu_line();
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

pub fn print_row(row: &Row, args: &BenchArgs, config: &EngineConfig) {
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

// ------------------------------------------------------------- two processes

/// A path whose fastest window beats its slowest by more than this saw the
/// machine's load change, and the run says so.
pub const UNSTEADY_SPREAD: f64 = 1.5;

/// One row of the two-process run.
pub struct ProcRow {
    pub path: &'static str,
    pub size: usize,
    pub gbps: f64,
    /// The slowest and fastest timed window.
    pub gbps_range: (f64, f64),
    pub lat_p50_us: f64,
    pub lat_p99_us: f64,
    /// Round trips the latency percentiles come from.
    pub lat_samples: usize,
    pub retransmits: u64,
    pub crc_errors: u64,
    pub vs_raw_ring: f64,
    pub vs_raw_ring_crc: f64,
    pub vs_unix: f64,
    /// `barlink-faults`: goodput relative to the clean barlink run.
    pub vs_clean: Option<f64>,
    /// `barlink-copied` and `barlink-acked`: speed relative to the link
    /// sending its shared buffer, where both ran.
    pub vs_shared: Option<f64>,
}

pub fn print_proc_header(args: &BenchArgs, config: &EngineConfig, windows: usize) {
    println!("# barlink bench: two processes over shared memory (memfd windows, 4 MiB rings)");
    println!(
        "# MTU {}  window {}  CRC {}  progress {}  {} timed windows per size (medians); latency = round trip / 2",
        config.mtu,
        config.send_window,
        if config.crc { "on" } else { "off" },
        args.progress.name(),
        windows
    );
    print_cpu_line();
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

pub fn print_proc_row(row: &ProcRow, args: &BenchArgs, config: &EngineConfig) {
    if args.output.json {
        println!("{}", proc_row_json(row, args, config));
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

fn proc_row_json(row: &ProcRow, args: &BenchArgs, config: &EngineConfig) -> serde_json::Value {
    let mut value = common_json(
        row.path,
        row.size,
        [row.gbps, row.lat_p50_us, row.lat_p99_us],
        [row.retransmits, row.crc_errors],
        config,
    );
    value.insert("lat_samples".into(), json!(row.lat_samples));
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
    if let Some(vs_shared) = row.vs_shared {
        value.insert("ratio_to_barlink".into(), json!(round(vs_shared, 3)));
    }
    serde_json::Value::Object(value)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
