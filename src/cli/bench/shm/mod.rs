//! `barlink bench` between two processes on this host, over shared memory,
//! with its baselines measured in the same run:
//! - `barlink`: a ring link (engine, CRC, acknowledgements) over two memfd
//!   windows, as two GPUs would use their BAR1 windows;
//! - `raw-ring`: the same rings in the same kind of windows with no
//!   protocol: bytes copied into slots and out again (the physical limit);
//! - `raw-ring-crc`: the raw ring with a CRC-32C of every slot taken in
//!   the same pass as each copy and checked on arrival, through the same
//!   kernels barlink uses: the limit for anything that checks its data on
//!   this CPU (what barlink adds beyond it is its protocol);
//! - `unix-socket`: a Unix stream socket;
//! - `barlink-copied` (asked for by name): the barlink link sending a copy
//!   of the caller's bytes made for each message, into buffers reused once
//!   the link lets go of them, as a caller that only borrows its memory
//!   must (the C face's copying calls do the same);
//! - `barlink-acked` (asked for by name): the barlink link sending its one
//!   buffer again only once each message was acknowledged, as a Rust
//!   caller that refills one buffer for every message must: the baseline
//!   of the C face's blocking send that lends its bytes, which gives the
//!   same promise but returns sooner (it copies the last packets instead
//!   of waiting for them).
//!
//! The parent sends; a child process (this binary, `bench-peer`) receives.
//! Bandwidth: a window of messages, then the child's one-byte "got them
//! all"; latency: one message there and the same size back, halved.
//!
//! Every path is set up at the start between the same two processes, and
//! their timed windows interleave (barlink, raw-ring, unix-socket, barlink,
//! ...): on a shared machine the load drifts, and a ratio is only honest if
//! both of its sides saw the same drift. Both processes follow the same
//! schedule, so no control messages are needed, and a path that is not
//! being measured is not polled at all (no idle spinning steals the CPU).

mod pipes;
pub(super) mod plan;
mod raw_ring;
mod schedule;
mod setup;
mod watch;

use std::io::IsTerminal;

use barlink_transport::EngineConfig;

use super::args::{BenchArgs, Plan};
use super::report::{
    ProcRow, UNSTEADY_SPREAD, extremes, median, percentile, print_proc_header, print_proc_row,
};
use crate::cli::{CommandError, Status, human_size};

pub use plan::{PeerPlan, ProcPath};
pub use schedule::{Measured, RunError, run_child, run_parent};
pub(in crate::cli::bench) use watch::watch_parent;

/// Every two-process path, in the order the rows' ratios index them.
const ALL: [ProcPath; 7] = [
    ProcPath::Barlink,
    ProcPath::RawRing,
    ProcPath::RawRingCrc,
    ProcPath::UnixSocket,
    ProcPath::BarlinkFaults,
    ProcPath::BarlinkCopied,
    ProcPath::BarlinkAcked,
];

/// `barlink bench` (the default path): both processes, every path, the rows.
pub fn run(args: &BenchArgs, plan: &Plan, config: &EngineConfig) -> Result<Status, CommandError> {
    let progress = !args.output.json && std::io::stderr().is_terminal();
    if !args.output.json {
        print_proc_header(args, config, plan.windows);
    }
    if progress {
        eprint!("\rbench: measuring ...");
    }
    let mut results = measure(args, plan, config)?;
    if progress {
        eprint!("\r{:40}\r", "");
    }
    // The widest spread of one path's windows, to warn about below.
    let mut widest: Option<Spread> = None;
    for (index, &size) in plan.sizes.iter().enumerate() {
        let spread = print_size(args, config, &mut results, index, size);
        if let Some(spread) = spread
            && widest.is_none_or(|w| spread.ratio > w.ratio)
        {
            widest = Some(spread);
        }
    }
    if let Some(Spread {
        ratio,
        path,
        size,
        low,
        high,
    }) = widest
        && ratio > UNSTEADY_SPREAD
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

/// Runs both processes over the paths asked for: one list of results per
/// entry of [`ALL`], empty where the path was not measured.
fn measure(
    args: &BenchArgs,
    plan: &Plan,
    config: &EngineConfig,
) -> Result<Vec<Vec<Measured>>, CommandError> {
    let paths: Vec<ProcPath> = ALL
        .into_iter()
        .filter(|&path| {
            if path == ProcPath::BarlinkFaults {
                args.fault_rate > 0.0
            } else {
                args.paths.contains(&path)
            }
        })
        .collect();
    let peer_plan = PeerPlan {
        paths: paths.clone(),
        name: format!("bench-{}", std::process::id()),
        sizes: plan.sizes.clone(),
        counts: plan
            .sizes
            .iter()
            .map(|&size| plan.messages_per_window(size).min(100_000))
            .collect(),
        windows: plan.windows,
        lat_iters: plan.lat_iters,
        mtu: config.mtu,
        crc: config.crc,
        fault_rate: args.fault_rate,
        seed: args.seed,
        progress: args.progress,
    };
    let measured = run_parent(&peer_plan).map_err(|error| match error {
        RunError::Lost(lost) => CommandError::new(lost.status(), format!("bench: {lost}")),
        RunError::Failed(error) => CommandError::environment(format!("bench: {error}")),
    })?;
    let mut results: Vec<Vec<Measured>> = vec![vec![]; ALL.len()];
    for (path, path_results) in paths.iter().zip(measured) {
        let slot = ALL
            .iter()
            .position(|p| p == path)
            .expect("paths come from ALL");
        results[slot] = path_results;
    }
    Ok(results)
}

/// How far apart one path's slowest and fastest windows were.
#[derive(Debug, Clone, Copy)]
struct Spread {
    ratio: f64,
    path: &'static str,
    size: usize,
    low: f64,
    high: f64,
}

/// Prints the rows of size `index`; the widest spread among them.
fn print_size(
    args: &BenchArgs,
    config: &EngineConfig,
    results: &mut [Vec<Measured>],
    index: usize,
    size: usize,
) -> Option<Spread> {
    let mut medians = [0.0f64; ALL.len()];
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
    let mut widest: Option<Spread> = None;
    for (which, path) in ALL.into_iter().enumerate() {
        let Some(m) = results[which].get_mut(index) else {
            continue;
        };
        let path = path.name();
        let (low, high) = extremes(&m.gbps_windows);
        if low > 0.0 && widest.is_none_or(|w| high / low > w.ratio) {
            widest = Some(Spread {
                ratio: high / low,
                path,
                size,
                low,
                high,
            });
        }
        let row = ProcRow {
            path,
            size,
            gbps: medians[which],
            gbps_range: (low, high),
            lat_p50_us: percentile(&mut m.latencies_us, 0.5),
            lat_p99_us: percentile(&mut m.latencies_us, 0.99),
            lat_samples: m.latencies_us.len(),
            retransmits: m.retransmits,
            crc_errors: m.crc_errors,
            vs_raw_ring: ratio(medians[which], medians[1]),
            vs_raw_ring_crc: ratio(medians[which], medians[2]),
            vs_unix: ratio(medians[which], medians[3]),
            vs_clean: (which == 4).then(|| ratio(medians[4], medians[0])),
            vs_shared: (matches!(which, 5 | 6) && medians[0] > 0.0)
                .then(|| ratio(medians[which], medians[0])),
        };
        print_proc_row(&row, args, config);
    }
    if args.fault_rate > 0.0 && !args.output.json {
        println!(
            "# {:>8}  goodput with a bit flipped in {} of packets: {:.2}x the clean barlink run",
            human_size(size),
            args.fault_rate,
            ratio(medians[4], medians[0])
        );
    }
    if medians[5] > 0.0 && medians[0] > 0.0 && !args.output.json {
        println!(
            "# {:>8}  a copy made for each message: {:.2}x the link sending its shared buffer",
            human_size(size),
            ratio(medians[5], medians[0])
        );
    }
    if medians[6] > 0.0 && medians[0] > 0.0 && !args.output.json {
        println!(
            "# {:>8}  each message acknowledged before the next: {:.2}x the link sending its shared buffer",
            human_size(size),
            ratio(medians[6], medians[0])
        );
    }
    widest
}
