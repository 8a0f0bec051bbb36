//! `barlink bench --gpu`: device buffers at both ends of a link between two
//! processes, with the baselines measured in the same run between the same
//! buffers:
//! - `barlink-gpu`: the staged host bounce ([`barlink::gpu`]): copy engine
//!   into pinned memory, the link's copy+CRC into the peer's ring, the
//!   peer's check and its copy engine into its device buffer;
//! - `cumemcpy-staged`: `cuMemcpy` device → pinned host → device in one
//!   process, nothing checked: what the copy engines allow any host bounce;
//! - `cuda-ipc`: `cuMemcpyDtoD` into the peer's buffer opened by CUDA IPC:
//!   the limit on one GPU (refused where the driver refuses IPC).
//!
//! Windows of the three interleave, as in the shared-memory bench, so the
//! ratios see the same drift; after each window what landed is read back
//! and checked (`wrong`).

mod peer;
pub mod plan;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::{Duration, Instant};

use barlink::gpu::{DeviceBuffer, DeviceLanding, IpcHandle, Staged, StagingPool, send_from_device};
use barlink::{ConnectOptions, Peer, Role, connect};
use barlink_transport::EngineConfig;
use serde_json::Value;

pub use peer::run_child;
use plan::{GpuPeerPlan, STEP_TIMEOUT, payload};

use super::args::{BenchArgs, Plan};
use super::report::{common_json, median, percentile, print_cpu_line, round};
use crate::cli::gpu::{self, Gpu};
use crate::cli::{CommandError, Status, human_size};

/// The paths, in the order of [`Measured`]'s arrays.
const PATHS: [&str; 3] = ["barlink-gpu", "cumemcpy-staged", "cuda-ipc"];

/// Pinned buffers each side keeps posted to land messages in.
pub const LANDING_DEPTH: usize = 4;

pub fn engine_config(mtu: usize, window: u32, max_size: usize) -> EngineConfig {
    EngineConfig {
        mtu,
        send_window: window,
        recv_window: window,
        max_message_len: (max_size as u64).max(1 << 20),
        ..EngineConfig::default()
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<[u8; 64]> {
    let mut out = [0u8; 64];
    if text.len() != 128 {
        return None;
    }
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// One size's figures: GB/s of each window, latencies in µs, and what
/// read back wrong, per path.
#[derive(Default)]
struct Measured {
    gbps: [Vec<f64>; 3],
    latency_us: [Vec<f64>; 3],
    wrong: [u64; 3],
}

/// The parent's buffers and link.
struct Parent {
    gpu: Gpu,
    link: barlink::Connection<Staged>,
    pool: std::sync::Arc<StagingPool>,
    source: DeviceBuffer,
    landing: DeviceBuffer,
    /// Where barlink's answers land in the latency loop: apart from
    /// `landing`, which the staged copies there overwrite.
    replies: DeviceBuffer,
    receiver: DeviceLanding,
    pinned: barlink::gpu::PinnedBuffer,
    imported: Result<DeviceBuffer, String>,
}

pub fn run(args: &BenchArgs) -> Result<Status, CommandError> {
    let gpu = gpu::open(args.gpu_device.ordinal, Path::new("/"))?;
    let plan = args.plan_with_sizes(if args.quick {
        "64K,1M"
    } else {
        "4K,64K,1M,16M"
    })?;
    let max = *plan.sizes.iter().max().expect("checked non-empty");
    let config = args.engine_config(max);
    config
        .validate()
        .map_err(|e| CommandError::usage(format!("engine configuration: {e}")))?;
    let peer_plan = GpuPeerPlan {
        name: format!("barlink-bench-gpu-{}", std::process::id()),
        counts: plan
            .sizes
            .iter()
            .map(|&s| plan.messages_per_window(s))
            .collect(),
        sizes: plan.sizes.clone(),
        windows: plan.windows,
        lat_iters: plan.lat_iters,
        mtu: config.mtu,
        window: config.send_window,
        gpu_device: args.gpu_device.ordinal,
    };
    if !args.output.json {
        print_header(&gpu, &config, &plan);
    }
    let exe = std::env::current_exe().map_err(|e| CommandError::environment(e.to_string()))?;
    let mut child = Command::new(exe)
        .arg("bench-gpu-peer")
        .args(peer_plan.args())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| CommandError::environment(format!("starting the peer process: {e}")))?;
    let outcome = measure_with_child(gpu, &peer_plan, &config, &mut child);
    if outcome.is_err() {
        let _ = child.kill();
    }
    let _ = child.wait();
    let (gpu, results, ipc_note) =
        outcome.map_err(|e| CommandError::new(Status::CheckFailed, e))?;
    report(args, &gpu, &config, &plan, &results, ipc_note.as_deref())
}

/// Sets up with the child, measures every size, and collects the child's
/// count of wrong deliveries.
fn measure_with_child(
    gpu: Gpu,
    plan: &GpuPeerPlan,
    config: &EngineConfig,
    child: &mut Child,
) -> Result<(Gpu, Vec<Measured>, Option<String>), String> {
    let lines = peer_lines(child.stdout.take().ok_or("the peer has no stdout")?);
    let first = lines
        .recv_timeout(STEP_TIMEOUT)
        .map_err(|_| "the peer did not start (its error is above)".to_string())??;
    let max = plan.max_size();
    let context = gpu.context.clone();
    let imported = match first.split_once(' ') {
        Some(("ipc", text)) => {
            let handle = IpcHandle(unhex(text).ok_or("the peer's IPC handle is not 64 hex bytes")?);
            context.open_ipc(&handle, max).map_err(|e| e.to_string())
        }
        Some(("ipc-refused", why)) => Err(why.to_string()),
        _ => return Err(format!("the peer said {first:?}, not its IPC handle")),
    };
    let options = ConnectOptions {
        engine: config.clone(),
        ..ConnectOptions::default()
    };
    let peer = Peer::Local {
        name: plan.name.clone(),
    };
    let link = connect::<Staged>(&peer, Role::Accept, &options).map_err(|e| e.to_string())?;
    let cuda = |e: barlink::gpu::CudaError| e.to_string();
    let mut parent = Parent {
        pool: StagingPool::new(context.clone(), 64 << 20),
        source: context.alloc(max).map_err(cuda)?,
        landing: context.alloc(max).map_err(cuda)?,
        replies: context.alloc(max).map_err(cuda)?,
        receiver: DeviceLanding::new(context.clone(), max, LANDING_DEPTH),
        pinned: context.alloc_pinned(max).map_err(cuda)?,
        imported,
        link,
        gpu,
    };
    let mut results = Vec::new();
    for (&size, &count) in plan.sizes.iter().zip(&plan.counts) {
        results.push(measure_size(&mut parent, plan, size, count)?);
    }
    // The peer frees the buffer it exported when it ends, and freeing it
    // while it is mapped here is undefined: unmap it (the import is
    // dropped here), then say so.
    let note = std::mem::replace(&mut parent.imported, Err(String::new())).err();
    barlink_send(&mut parent, 1)?;
    // The peer's counts come on its stdout once everything it sent is
    // acknowledged, which needs this side to keep driving the link.
    let last = wait_line(&lines, &mut parent.link)?;
    let child_wrong: Vec<u64> = last
        .strip_prefix("wrong ")
        .and_then(|list| list.split(',').map(|n| n.parse().ok()).collect())
        .filter(|list: &Vec<u64>| list.len() == results.len())
        .ok_or_else(|| format!("the peer ended with {last:?}, not its counts of wrong windows"))?;
    for (measured, wrong) in results.iter_mut().zip(child_wrong) {
        measured.wrong[0] += wrong;
    }
    parent.link.close(STEP_TIMEOUT).map_err(|e| e.to_string())?;
    wait_exit(child, &mut parent.link)?;
    Ok((parent.gpu, results, note))
}

/// The peer's stdout, line by line, from a thread (so that waiting for a
/// line never stops this side from driving the link).
fn peer_lines(stdout: ChildStdout) -> Receiver<Result<String, String>> {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let line = line.map_err(|e| format!("reading from the peer: {e}"));
            if sender.send(line).is_err() {
                return;
            }
        }
        let _ = sender.send(Err(
            "the peer process ended early (its error is above)".to_string()
        ));
    });
    receiver
}

/// The peer's next line, driving the link while it comes.
fn wait_line(
    lines: &Receiver<Result<String, String>>,
    link: &mut barlink::Connection<Staged>,
) -> Result<String, String> {
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        match lines.try_recv() {
            Ok(line) => return line,
            Err(TryRecvError::Disconnected) => return Err("the peer's output ended".to_string()),
            Err(TryRecvError::Empty) if Instant::now() > deadline => {
                return Err(format!("the peer said nothing for {STEP_TIMEOUT:?}"));
            }
            Err(TryRecvError::Empty) => {
                link.progress().map_err(|e| e.to_string())?;
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }
}

/// Waits for the peer to exit, answering its close meanwhile; an exit
/// other than success is the run's failure.
fn wait_exit(child: &mut Child, link: &mut barlink::Connection<Staged>) -> Result<(), String> {
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => return Err(format!("the peer process failed: {status}")),
            Ok(None) if Instant::now() > deadline => {
                return Err(format!("the peer did not exit within {STEP_TIMEOUT:?}"));
            }
            Ok(None) => {
                // Closed on this side: progress only answers the peer.
                let _ = link.progress();
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(e) => return Err(format!("waiting for the peer: {e}")),
        }
    }
}

/// The windows of one size, interleaved across the paths, then latency.
fn measure_size(
    parent: &mut Parent,
    plan: &GpuPeerPlan,
    size: usize,
    count: usize,
) -> Result<Measured, String> {
    let expected = payload(size);
    parent
        .source
        .write(0, &expected)
        .map_err(|e| e.to_string())?;
    let mut measured = Measured::default();
    let bytes = (size * count) as f64;
    let mut back = vec![0u8; size];
    for _ in 0..plan.windows {
        let started = Instant::now();
        for _ in 0..count {
            barlink_send(parent, size)?;
        }
        // The peer's one byte: every message of the window landed.
        parent
            .receiver
            .recv(&mut parent.link, &parent.replies, 0, STEP_TIMEOUT)
            .map_err(|e| e.to_string())?;
        measured.gbps[0].push(bytes / started.elapsed().as_secs_f64() / 1e9);

        let started = Instant::now();
        for _ in 0..count {
            staged_copy(parent, size)?;
        }
        measured.gbps[1].push(bytes / started.elapsed().as_secs_f64() / 1e9);
        parent
            .landing
            .read(0, &mut back)
            .map_err(|e| e.to_string())?;
        measured.wrong[1] += u64::from(back != expected);

        if let Ok(imported) = &parent.imported {
            let started = Instant::now();
            ipc_copies(parent, imported, size, count)?;
            measured.gbps[2].push(bytes / started.elapsed().as_secs_f64() / 1e9);
            imported.read(0, &mut back).map_err(|e| e.to_string())?;
            measured.wrong[2] += u64::from(back != expected);
        }
    }
    for _ in 0..plan.lat_iters {
        let started = Instant::now();
        barlink_send(parent, size)?;
        parent
            .receiver
            .recv(&mut parent.link, &parent.replies, 0, STEP_TIMEOUT)
            .map_err(|e| e.to_string())?;
        measured.latency_us[0].push(started.elapsed().as_secs_f64() * 1e6 / 2.0);

        let started = Instant::now();
        staged_copy(parent, size)?;
        measured.latency_us[1].push(started.elapsed().as_secs_f64() * 1e6);

        if let Ok(imported) = &parent.imported {
            let started = Instant::now();
            ipc_copies(parent, imported, size, 1)?;
            measured.latency_us[2].push(started.elapsed().as_secs_f64() * 1e6);
        }
    }
    parent
        .replies
        .read(0, &mut back)
        .map_err(|e| e.to_string())?;
    measured.wrong[0] += u64::from(back != expected);
    Ok(measured)
}

/// barlink's one message: the source's first `size` bytes to the peer.
fn barlink_send(parent: &mut Parent, size: usize) -> Result<(), String> {
    send_from_device(
        &mut parent.link,
        &parent.pool,
        &parent.source,
        0,
        size,
        STEP_TIMEOUT,
    )
    .map_err(|e| e.to_string())
}

/// The CUDA IPC baseline: `count` device-to-device copies into the peer's
/// buffer, finished.
fn ipc_copies(
    parent: &Parent,
    imported: &DeviceBuffer,
    size: usize,
    count: usize,
) -> Result<(), String> {
    for _ in 0..count {
        imported
            .copy_from(0, &parent.source, 0, size)
            .map_err(|e| e.to_string())?;
    }
    parent.gpu.context.synchronize().map_err(|e| e.to_string())
}

/// The staging baseline's one message: device → pinned → device.
fn staged_copy(parent: &mut Parent, size: usize) -> Result<(), String> {
    parent
        .pinned
        .fill_from(&parent.source, 0, size)
        .map_err(|e| e.to_string())?;
    parent
        .landing
        .write(0, &parent.pinned.as_ref()[..size])
        .map_err(|e| e.to_string())
}

fn print_header(gpu: &Gpu, config: &EngineConfig, plan: &Plan) {
    println!("# barlink bench --gpu: device buffers at both ends, two processes on one GPU");
    println!("# gpu: {}", gpu.describe());
    print_cpu_line();
    println!(
        "# MTU {}  window {}  CRC on  {} timed windows per size (medians)",
        config.mtu, config.send_window, plan.windows
    );
    println!(
        "# barlink-gpu: copy engine -> pinned host -> link (copy+CRC) -> peer's ring -> checked -> copy engine -> device"
    );
    println!("# cumemcpy-staged: cuMemcpy device -> pinned host -> device, one process, unchecked");
    println!(
        "# cuda-ipc: cuMemcpyDtoD into the peer's buffer opened by CUDA IPC (the limit on one GPU)"
    );
    println!(
        "# {:>8}  {:<16} {:>9} {:>11} {:>10} {:>8} {:>6}",
        "size", "path", "GB/s", "lat p50 us", "vs staged", "vs ipc", "wrong"
    );
}

/// One printed row: a path at a size.
struct Row<'a> {
    path: &'static str,
    size: usize,
    gbps: f64,
    lat_p50_us: f64,
    lat_p99_us: f64,
    wrong: u64,
    vs_staged: Option<f64>,
    vs_ipc: Option<f64>,
    ipc_refused: Option<&'a str>,
}

fn report(
    args: &BenchArgs,
    gpu: &Gpu,
    config: &EngineConfig,
    plan: &Plan,
    results: &[Measured],
    ipc_refused: Option<&str>,
) -> Result<Status, CommandError> {
    if let (Some(why), false) = (ipc_refused, args.output.json) {
        println!("# cuda-ipc: not measured: {why}");
    }
    let mut wrong_total = 0;
    for (measured, &size) in results.iter().zip(&plan.sizes) {
        let gbps: Vec<f64> = measured
            .gbps
            .iter()
            .map(|w| {
                if w.is_empty() {
                    0.0
                } else {
                    median(&mut w.clone())
                }
            })
            .collect();
        let ratio = |base: usize| (gbps[base] > 0.0).then(|| gbps[0] / gbps[base]);
        for (i, path) in PATHS.into_iter().enumerate() {
            if measured.gbps[i].is_empty() {
                continue;
            }
            wrong_total += measured.wrong[i];
            let mut latency = measured.latency_us[i].clone();
            let row = Row {
                path,
                size,
                gbps: gbps[i],
                lat_p50_us: percentile(&mut latency, 0.5),
                lat_p99_us: percentile(&mut latency, 0.99),
                wrong: measured.wrong[i],
                vs_staged: if i == 0 { ratio(1) } else { None },
                vs_ipc: if i == 0 { ratio(2) } else { None },
                ipc_refused: if i == 0 { ipc_refused } else { None },
            };
            print_row(args, gpu, config, &row);
        }
    }
    Ok(if wrong_total == 0 {
        Status::Ok
    } else {
        eprintln!("barlink: bench --gpu: {wrong_total} window(s) read back wrong");
        Status::CheckFailed
    })
}

fn print_row(args: &BenchArgs, gpu: &Gpu, config: &EngineConfig, row: &Row) {
    if args.output.json {
        let figures = [row.gbps, row.lat_p50_us, row.lat_p99_us];
        let mut fields = common_json(row.path, row.size, figures, [0, 0], config);
        if let Value::Object(gpu_fields) = gpu.json() {
            fields.extend(gpu_fields);
        }
        fields.insert("wrong".into(), row.wrong.into());
        if let Some(r) = row.vs_staged {
            fields.insert("ratio_to_cumemcpy_staged".into(), round(r, 3).into());
        }
        if let Some(r) = row.vs_ipc {
            fields.insert("ratio_to_cuda_ipc".into(), round(r, 3).into());
        }
        if let Some(why) = row.ipc_refused {
            fields.insert("cuda_ipc_refused".into(), why.into());
        }
        println!("{}", Value::Object(fields));
    } else {
        let show = |r: Option<f64>| r.map_or_else(|| "-".to_string(), |r| format!("{r:.2}"));
        println!(
            "  {:>8}  {:<16} {:>9.2} {:>11.2} {:>10} {:>8} {:>6}",
            human_size(row.size),
            row.path,
            row.gbps,
            row.lat_p50_us,
            show(row.vs_staged),
            show(row.vs_ipc),
            row.wrong
        );
    }
}
