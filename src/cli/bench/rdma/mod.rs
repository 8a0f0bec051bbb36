//! `barlink bench --rdma`: barlink over RDMA between two machines, with
//! perftest's `ib_write_bw` (and `ib_write_lat`) on the same device, with
//! the same sizes, between the same two machines, as the baseline in the
//! same run.
//!
//! Roles as in `ib_write_bw`: `barlink bench --rdma --server` waits (on
//! `--listen`, default `0.0.0.0:18515`); `barlink bench --rdma HOST[:PORT]`
//! connects and drives. Both set up through [`barlink::connect`]
//! (`Peer::Remote`, `Role::Accept`/`Role::Connect`), which says which path
//! it took and why; that decision heads the table and is a field of every
//! JSON row.
//!
//! The schedule, over the link itself:
//! 1. The client sends its plan (sizes, messages per window, windows,
//!    latency round trips, whether it has perftest); the server answers
//!    with its device, GID index, whether it has perftest, and the TCP port
//!    its perftest servers will use (its own port + 1).
//! 2. Per size: a warm-up and `--windows` timed windows of messages from the
//!    client, each closed by the server's "got them all" (with its
//!    counters and how many messages it received, every one checked for
//!    length, the first of each window and all of the warm-up byte for byte);
//!    then round trips for latency (the server echoes each message).
//! 3. Per size, the baseline: the client asks for `ib_write_bw`; the server
//!    starts `ib_write_bw` as a server, waits until it listens, says so; the
//!    client runs `ib_write_bw HOST` with the same size, device and GID, and
//!    says when it is done; the server collects its process. The same for
//!    `ib_write_lat`. Then the client sends the size's rows, which the
//!    server prints too.
//!
//! Every step has a deadline, and a perftest process that overruns its own
//! is killed. Without libibverbs or an RDMA device the command exits 3 with
//! what is missing; without perftest it says so and prints no ratio.

use std::io::Write;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use barlink::connect::{AnyLink, ConnectError, ConnectOptions, PathDecision, Peer, Role};
use barlink_rdma::RdmaLink;
use barlink_rdma::oob::OobOptions;
use barlink_rdma::verbs_queue::{RdmaLinkOptions, VerbsQueue};
use barlink_rdma::{LinkLayer, RdmaError};
use barlink_transport::EngineConfig;
use barlink_transport::sim::SplitMix64;
use clap::Args;
use serde_json::{Value, json};

use super::{BenchArgs, Plan, common_json, median, messages_per_window, percentile, round};
use crate::cli::{CommandError, Status, human_size};

/// The setup port, as perftest's.
const DEFAULT_PORT: u16 = 18515;
/// Longest wait for any one step of the schedule (a window, a round trip,
/// a control message).
const STEP_TIMEOUT: Duration = Duration::from_secs(60);
/// Version of the control messages.
const PROTOCOL: u64 = 1;
/// The path name of barlink's rows.
const PATH: &str = "barlink-rdma";

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
}

/// What the client asks of the server.
#[derive(Debug, Clone, PartialEq)]
struct Schedule {
    sizes: Vec<usize>,
    counts: Vec<usize>,
    windows: usize,
    lat_iters: usize,
    /// The client would run ib_write_bw / ib_write_lat.
    bw: bool,
    lat: bool,
}

impl Schedule {
    fn to_json(&self) -> Value {
        json!({
            "barlink_bench_rdma": PROTOCOL,
            "sizes": self.sizes,
            "counts": self.counts,
            "windows": self.windows,
            "lat_iters": self.lat_iters,
            "ib_write_bw": self.bw,
            "ib_write_lat": self.lat,
        })
    }

    fn from_json(value: &Value) -> Result<Schedule, String> {
        if value["barlink_bench_rdma"].as_u64() != Some(PROTOCOL) {
            return Err(format!(
                "the client speaks another version of bench --rdma ({}); run the same barlink on both sides",
                value["barlink_bench_rdma"]
            ));
        }
        let list = |key: &str| -> Result<Vec<usize>, String> {
            value[key]
                .as_array()
                .ok_or(format!("plan: no {key}"))?
                .iter()
                .map(|v| {
                    v.as_u64()
                        .map(|n| n as usize)
                        .ok_or(format!("plan: {key}: {v}"))
                })
                .collect()
        };
        let number = |key: &str| -> Result<usize, String> {
            value[key]
                .as_u64()
                .map(|n| n as usize)
                .ok_or(format!("plan: no {key}"))
        };
        let schedule = Schedule {
            sizes: list("sizes")?,
            counts: list("counts")?,
            windows: number("windows")?,
            lat_iters: number("lat_iters")?,
            bw: value["ib_write_bw"].as_bool().unwrap_or(false),
            lat: value["ib_write_lat"].as_bool().unwrap_or(false),
        };
        if schedule.sizes.len() != schedule.counts.len()
            || schedule.sizes.is_empty()
            || schedule.counts.contains(&0)
            || schedule.sizes.iter().any(|&s| s > 1 << 30)
        {
            return Err("plan: sizes and counts do not match".into());
        }
        Ok(schedule)
    }
}

/// Round trips for latency at `size` (large messages take long; fewer
/// samples still give stable medians, as in the shared-memory bench).
fn lat_iters_for(lat_iters: usize, size: usize) -> usize {
    if size >= 1 << 20 {
        lat_iters.min(50)
    } else {
        lat_iters
    }
}

/// Messages of one timed window, capped as the shared-memory bench caps them.
fn count_for(plan: &Plan, size: usize) -> usize {
    messages_per_window(plan, size).min(100_000)
}

/// The message of `size` both sides expect.
fn message_of(size: usize) -> Vec<u8> {
    let mut data = vec![0u8; size];
    SplitMix64::new(size as u64 ^ 0xB4E1_0DA7).fill(&mut data);
    data
}

/// `HOST`, `HOST:PORT`, `[V6]:PORT` -> (host for perftest, host:port).
fn client_target(text: &str) -> Result<(String, String), String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok((addr.ip().to_string(), addr.to_string()));
    }
    if text.parse::<std::net::Ipv6Addr>().is_ok() {
        return Ok((text.to_string(), format!("[{text}]:{DEFAULT_PORT}")));
    }
    match text.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && !host.contains(':') => {
            port.parse::<u16>()
                .map_err(|_| format!("{text:?}: the port {port:?} is not a number"))?;
            Ok((host.to_string(), text.to_string()))
        }
        Some(_) => Err(format!("{text:?} is not HOST or HOST:PORT")),
        None if text.is_empty() => Err("an empty HOST".into()),
        None => Ok((text.to_string(), format!("{text}:{DEFAULT_PORT}"))),
    }
}

/// An executable named `name` in `PATH`.
fn find_tool(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| {
            candidate
                .metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// The device and GID index perftest should use: the ones barlink uses.
#[derive(Debug, Clone)]
struct Device {
    name: String,
    /// `None` on InfiniBand (perftest then needs no `-x`).
    gid_index: Option<u32>,
}

fn local_device(args: &RdmaArgs) -> Result<Device, RdmaError> {
    let info = match &args.rdma_device {
        Some(name) => barlink_rdma::device::device(name)?,
        None => {
            let devices = barlink_rdma::device::devices()?;
            let first_active = devices.iter().position(|d| d.active_port().is_some());
            match first_active {
                Some(index) => devices[index].clone(),
                None => devices.into_iter().next().ok_or(RdmaError::NoDevice {
                    reason: "libibverbs lists no device".into(),
                })?,
            }
        }
    };
    let port = info.ports.iter().find(|p| p.port == 1);
    let gid_index = match (args.gid_index, port) {
        (Some(index), _) => Some(u32::from(index)),
        (None, Some(port)) if port.link_layer == LinkLayer::InfiniBand => None,
        (None, Some(port)) => port.roce_v2_gid().map(|g| g.index),
        (None, None) => None,
    };
    Ok(Device {
        name: info.name,
        gid_index,
    })
}

fn connect_options(args: &BenchArgs, device: &Device) -> ConnectOptions {
    // The largest message is fixed (the engine's default) so that the
    // server, which learns the sizes only later, agrees with the client.
    let mut engine: EngineConfig = args.engine_config(1);
    engine.max_message_len = EngineConfig::default().max_message_len;
    // A link waits unpolled while perftest runs: that is the schedule,
    // not a lost peer.
    engine.peer_timeout = STEP_TIMEOUT;
    let slots = engine.send_window.max(8);
    ConnectOptions {
        setup_timeout: Duration::from_secs(args.rdma.accept_timeout),
        rdma: RdmaLinkOptions {
            device: Some(device.name.clone()),
            port: 1,
            gid_index: args.rdma.gid_index,
            slots,
            send_queue_depth: (2 * slots).max(128),
            qp_timeout: args.rdma.qp_timeout,
            retry_count: 7,
            rnr_retry: 7,
            oob: OobOptions {
                connect_timeout: Duration::from_secs(5),
                connect_retries: 20,
                retry_interval: Duration::from_millis(500),
                io_timeout: STEP_TIMEOUT,
            },
            engine: engine.clone(),
            epoch: 1,
        },
        engine,
        ..ConnectOptions::default()
    }
}

fn connect_error(error: ConnectError) -> CommandError {
    match error {
        ConnectError::Usage { .. } => CommandError::usage(format!("bench --rdma: {error}")),
        other => CommandError::environment(format!("bench --rdma: {other}")),
    }
}

/// Sets up the link and takes the RDMA link out of the connection.
fn link_up(
    args: &BenchArgs,
    device: &Device,
    peer: &str,
    role: Role,
) -> Result<(RdmaLink<VerbsQueue>, PathDecision), CommandError> {
    let options = connect_options(args, device);
    let connection = barlink::connect(
        &Peer::Remote {
            addr: peer.to_string(),
        },
        role,
        &options,
    )
    .map_err(connect_error)?;
    let decision = connection.decision;
    match connection.link {
        AnyLink::Rdma(link) => Ok((*link, decision)),
        _ => Err(CommandError::environment(format!(
            "bench --rdma: the link is not RDMA ({decision})"
        ))),
    }
}

fn link_error(what: &str) -> impl Fn(barlink_transport::link::IoError) -> CommandError + '_ {
    move |error| CommandError::environment(format!("bench --rdma: {what}: {error}"))
}

fn send_control(link: &mut RdmaLink<VerbsQueue>, value: &Value) -> Result<(), CommandError> {
    link.send_blocking(value.to_string().into_bytes(), STEP_TIMEOUT)
        .map(|_| ())
        .map_err(link_error("sending a control message"))
}

fn recv_control(
    link: &mut RdmaLink<VerbsQueue>,
    timeout: Duration,
    what: &str,
) -> Result<Value, CommandError> {
    let data = link
        .recv(timeout)
        .map_err(|e| CommandError::environment(format!("bench --rdma: waiting for {what}: {e}")))?;
    serde_json::from_slice(&data).map_err(|e| {
        CommandError::environment(format!(
            "bench --rdma: waiting for {what}, a message of {} bytes that is no control message ({e}): \
             the two sides are out of step (same barlink and options on both?)",
            data.len()
        ))
    })
}

/// As [`recv_control`], but sleeping between polls: for waits while
/// perftest runs, which must not compete with a spinning receiver.
fn recv_control_gently(
    link: &mut RdmaLink<VerbsQueue>,
    timeout: Duration,
    what: &str,
) -> Result<Value, CommandError> {
    let deadline = Instant::now() + timeout;
    loop {
        let waiting =
            |e| CommandError::environment(format!("bench --rdma: waiting for {what}: {e}"));
        if let Some(data) = link.try_recv().map_err(waiting)? {
            return serde_json::from_slice(&data).map_err(|e| {
                CommandError::environment(format!(
                    "bench --rdma: waiting for {what}, a message of {} bytes that is no control message ({e})",
                    data.len()
                ))
            });
        }
        if Instant::now() >= deadline {
            return Err(CommandError::environment(format!(
                "bench --rdma: waiting for {what}: nothing after {timeout:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The server's "got them all": tag, its retransmits, CRC errors, and how
/// many messages of this size it has received so far.
const DONE_TAG: u8 = 0xD0;

fn done_message(retransmits: u64, crc_errors: u64, received: u64) -> Vec<u8> {
    let mut done = vec![DONE_TAG];
    for value in [retransmits, crc_errors, received] {
        done.extend_from_slice(&value.to_le_bytes());
    }
    done
}

fn parse_done(data: &[u8]) -> Option<(u64, u64, u64)> {
    if data.len() != 25 || data[0] != DONE_TAG {
        return None;
    }
    let word = |i: usize| u64::from_le_bytes(data[1 + 8 * i..9 + 8 * i].try_into().expect("8"));
    Some((word(0), word(1), word(2)))
}

fn counters(link: &RdmaLink<VerbsQueue>) -> (u64, u64) {
    let stats = link.engine().stats();
    (stats.retransmits(), stats.crc_failures + stats.malformed)
}

// ------------------------------------------------------------- perftest

/// A perftest process with its output collected by two threads.
struct Tool {
    name: &'static str,
    child: Child,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
}

fn reader(stream: Option<impl std::io::Read + Send + 'static>) -> Option<JoinHandle<String>> {
    let mut stream = stream?;
    Some(std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stream.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    }))
}

impl Tool {
    fn spawn(name: &'static str, program: &Path, args: &[String]) -> Result<Tool, String> {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", program.display()))?;
        Ok(Tool {
            name,
            stdout: reader(child.stdout.take()),
            stderr: reader(child.stderr.take()),
            child,
        })
    }

    fn output(&mut self) -> String {
        let mut text = String::new();
        for handle in [self.stdout.take(), self.stderr.take()]
            .into_iter()
            .flatten()
        {
            text.push_str(&handle.join().unwrap_or_default());
        }
        text
    }

    /// Waits at most `limit`, calling `tick` meanwhile; kills it past that.
    fn wait(
        mut self,
        limit: Duration,
        mut tick: impl FnMut(),
    ) -> Result<(ExitStatus, String), String> {
        let deadline = Instant::now() + limit;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    let text = self.output();
                    return Ok((status, text));
                }
                Ok(None) => {}
                Err(e) => return Err(format!("{}: {e}", self.name)),
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let text = self.output();
                return Err(format!(
                    "{} ran past {limit:?} and was killed; its output ended: {}",
                    self.name,
                    last_lines(&text, 3)
                ));
            }
            tick();
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Tool {
    fn drop(&mut self) {
        if self.running() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn last_lines(text: &str, count: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(count)..]
        .iter()
        .map(|l| l.trim())
        .collect::<Vec<_>>()
        .join(" | ")
}

/// perftest's common arguments: device, GID, size, iterations, port, QP timeout.
fn perftest_args(
    device: &Device,
    size: usize,
    iters: usize,
    port: u16,
    qp_timeout: u8,
) -> Vec<String> {
    let mut args = vec!["-d".into(), device.name.clone(), "-i".into(), "1".into()];
    if let Some(gid) = device.gid_index {
        args.extend(["-x".into(), gid.to_string()]);
    }
    args.extend([
        "-s".into(),
        size.to_string(),
        "-n".into(),
        iters.max(5).to_string(),
        "-p".into(),
        port.to_string(),
        "-u".into(),
        qp_timeout.to_string(),
        "-F".into(),
    ]);
    args
}

/// Which perftest tool, and its extra arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Baseline {
    Bw,
    Lat,
}

impl Baseline {
    fn tool(self) -> &'static str {
        match self {
            Baseline::Bw => "ib_write_bw",
            Baseline::Lat => "ib_write_lat",
        }
    }

    /// Arguments of this tool only. `ib_write_bw` reports in MB/sec (MiB)
    /// with two decimals: 8x the resolution of `--report_gbits`, which
    /// rounds soft-RoCE's small-message figures to 0.00.
    fn extra(self) -> &'static [&'static str] {
        &[]
    }
}

/// `ib_write_bw`'s average bandwidth in GB/s (10^9 bytes per second, as
/// barlink's `gbps`): the row after the `#bytes #iterations BW peak BW
/// average` header whose first number is `size`. Gb/sec (`--report_gbits`)
/// and MB/sec (perftest's MB are MiB) are both understood.
pub(crate) fn parse_write_bw(output: &str, size: usize) -> Option<f64> {
    let mut scale = None;
    for line in output.lines() {
        if line.contains("#bytes") && line.contains("BW average") {
            scale = Some(if line.contains("BW average[Gb/sec]") {
                1.0 / 8.0
            } else if line.contains("BW average[MB/sec]") || line.contains("BW average[MiB/sec]") {
                1_048_576.0 / 1e9
            } else {
                return None;
            });
            continue;
        }
        let Some(scale) = scale else { continue };
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() >= 4 && fields[0].parse::<usize>() == Ok(size) {
            let average: f64 = fields[3].parse().ok().filter(|v: &f64| v.is_finite())?;
            return Some(average * scale);
        }
    }
    None
}

/// `ib_write_lat`'s one-way latency (it halves the round trip itself):
/// (typical = median, 99th percentile) in microseconds; where it printed
/// only an average, that twice.
pub(crate) fn parse_write_lat(output: &str, size: usize) -> Option<(f64, f64)> {
    let mut typical = None;
    for line in output.lines() {
        if line.contains("#bytes") && line.contains("usec") {
            typical = Some(line.contains("t_typical"));
            continue;
        }
        let Some(typical) = typical else { continue };
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() >= 3 && fields[0].parse::<usize>() == Ok(size) {
            // perftest prints "nan" where its cycle counter failed it
            let number = |i: usize| {
                fields
                    .get(i)
                    .and_then(|f| f.parse::<f64>().ok())
                    .filter(|v| v.is_finite())
            };
            return if typical {
                Some((number(4)?, number(7).or(number(3))?))
            } else {
                let avg = number(2)?;
                Some((avg, avg))
            };
        }
    }
    None
}

/// Whether a perftest client failed only because its server was not
/// listening yet (worth another try).
fn not_listening_yet(output: &str) -> bool {
    output.contains("Unable to open file descriptor for socket connection")
        || output.contains("Unable to init the socket connection")
        || output.contains("Couldn't connect")
}

/// Whether something listens on TCP `port` here (perftest's server).
fn listening(port: u16) -> bool {
    let hex = format!(":{port:04X} ");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|file| {
        std::fs::read_to_string(file).is_ok_and(|text| {
            text.lines().skip(1).any(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                fields.len() > 3 && format!("{} ", fields[1]).ends_with(&hex) && fields[3] == "0A"
            })
        })
    })
}

/// Longest a perftest run of `bytes` may take: generous (soft-RoCE under
/// emulation moves 10-30 MB/s), but bounded.
fn tool_limit(bytes: usize) -> Duration {
    Duration::from_secs(30 + (bytes / 2_000_000) as u64).min(Duration::from_secs(600))
}

// ------------------------------------------------------------- rows

#[derive(Debug, Clone, Default)]
struct Row {
    path: &'static str,
    size: usize,
    gbps: f64,
    lat: Option<(f64, f64)>,
    retransmits: u64,
    crc_errors: u64,
    ratio: Option<f64>,
    messages: u64,
    lost: u64,
    iterations: usize,
}

struct Context {
    role: &'static str,
    decision: PathDecision,
    device: Device,
    json: bool,
}

fn row_json(row: &Row, ctx: &Context, config: &EngineConfig) -> Value {
    let (p50, p99) = row.lat.unwrap_or((0.0, 0.0));
    let mut value = common_json(
        row.path,
        row.size,
        [row.gbps, p50, p99],
        [row.retransmits, row.crc_errors],
        config,
    );
    // Six decimals, not common_json's three: under emulation small
    // messages move kilobytes per second, which three would round to 0.
    value.insert("gbps".into(), json!(round(row.gbps, 6)));
    if row.lat.is_none() {
        value.insert("lat_p50_us".into(), Value::Null);
        value.insert("lat_p99_us".into(), Value::Null);
    }
    value.insert("path_decision".into(), json!(ctx.decision.to_string()));
    value.insert("device".into(), json!(ctx.device.name));
    if row.path == PATH {
        value.insert("messages".into(), json!(row.messages));
        value.insert("lost".into(), json!(row.lost));
        if let Some(ratio) = row.ratio {
            value.insert("ratio_to_ib_write_bw".into(), json!(round(ratio, 3)));
        }
    } else {
        value.insert("tool".into(), json!("perftest"));
        value.insert("iterations".into(), json!(row.iterations));
        if row.lat.is_some() {
            value.insert("lat_from".into(), json!("ib_write_lat"));
        }
    }
    Value::Object(value)
}

fn print_header(ctx: &Context, config: &EngineConfig, peer: &str, windows: usize, baseline: &str) {
    if ctx.json {
        return;
    }
    println!(
        "# barlink bench --rdma ({} of {peer}): messages as RDMA WRITE WITH IMM into the peer's registered ring",
        ctx.role
    );
    println!("# path {}", ctx.decision);
    println!(
        "# device {}{}  MTU {}  window {}  CRC {}  {windows} timed windows per size (medians); latency = round trip / 2",
        ctx.device.name,
        ctx.device
            .gid_index
            .map(|g| format!(" GID index {g}"))
            .unwrap_or_default(),
        config.mtu,
        config.send_window,
        if config.crc { "on" } else { "off" },
    );
    println!("# baseline in the same run: {baseline}");
    println!(
        "# {:>8}  {:<14} {:>8} {:>14} {:>11} {:>11} {:>8} {:>8}",
        "size", "path", "GB/s", "vs ib_write_bw", "lat p50 us", "lat p99 us", "retrans", "crc_err"
    );
}

fn print_row_value(value: &Value, json_mode: bool) {
    if json_mode {
        println!("{value}");
    } else {
        let number = |key: &str, digits: usize| {
            value[key]
                .as_f64()
                .map_or("-".to_string(), |v| format!("{v:.digits$}"))
        };
        let ratio = value["ratio_to_ib_write_bw"]
            .as_f64()
            .map_or("-".to_string(), |r| format!("{r:.2}x"));
        println!(
            "  {:>8}  {:<14} {:>8} {:>14} {:>11} {:>11} {:>8} {:>8}",
            human_size(value["size_bytes"].as_u64().unwrap_or(0) as usize),
            value["path"].as_str().unwrap_or("?"),
            number("gbps", 4),
            ratio,
            number("lat_p50_us", 2),
            number("lat_p99_us", 2),
            value["retransmits"].as_u64().unwrap_or(0),
            value["crc_errors"].as_u64().unwrap_or(0),
        );
    }
    let _ = std::io::stdout().flush();
}

fn note(message: &str) {
    eprintln!("barlink bench --rdma: {message}");
}

// ------------------------------------------------------------- entry

/// `barlink bench --rdma ...`.
pub fn run(args: &BenchArgs) -> Result<Status, CommandError> {
    let rdma = &args.rdma;
    if args.fault_rate != 0.0 {
        return Err(CommandError::usage(
            "--fault-rate is not supported with --rdma (the link's own tests inject faults)",
        ));
    }
    let plan = args.plan()?;
    if plan.sizes.iter().any(|&s| s == 0 || s > 1 << 30) {
        return Err(CommandError::usage(
            "--sizes: with --rdma each size must be 1 byte .. 1 GiB",
        ));
    }
    args.engine_config(1)
        .validate()
        .map_err(|e| CommandError::usage(format!("engine configuration: {e}")))?;
    let target = match (&rdma.host, rdma.server) {
        (Some(host), false) => Some(
            client_target(host).map_err(|e| CommandError::usage(format!("bench --rdma: {e}")))?,
        ),
        (None, true) => None,
        _ => {
            return Err(CommandError::usage(
                "bench --rdma needs a role: --server (waits), or HOST[:PORT] of the server (connects)",
            ));
        }
    };
    // No RDMA here: say what is missing before anything listens or connects.
    let device = local_device(rdma).map_err(|e| {
        CommandError::environment(format!("bench --rdma: no RDMA path from this host: {e}"))
    })?;
    match target {
        Some((host, addr)) => run_client(args, &plan, device, &host, &addr),
        None => run_server(args, device),
    }
}

fn run_client(
    args: &BenchArgs,
    plan: &Plan,
    device: Device,
    host: &str,
    addr: &str,
) -> Result<Status, CommandError> {
    let rdma = &args.rdma;
    let tools = if rdma.no_baseline {
        [None, None]
    } else {
        [find_tool("ib_write_bw"), find_tool("ib_write_lat")]
    };
    let schedule = Schedule {
        sizes: plan.sizes.clone(),
        counts: plan.sizes.iter().map(|&s| count_for(plan, s)).collect(),
        windows: plan.windows,
        lat_iters: plan.lat_iters.min(100_000),
        bw: tools[0].is_some(),
        lat: tools[1].is_some(),
    };
    let (mut link, decision) = link_up(args, &device, addr, Role::Connect)?;
    send_control(&mut link, &schedule.to_json())?;
    let reply = recv_control(&mut link, STEP_TIMEOUT, "the server's answer to the plan")?;
    if reply["ok"].as_bool() != Some(true) {
        return Err(CommandError::environment(format!(
            "bench --rdma: the server refused the plan: {}",
            reply["error"].as_str().unwrap_or("(no reason)")
        )));
    }
    let perf_port = reply["perftest_port"].as_u64().unwrap_or(0) as u16;
    let run_bw = schedule.bw && reply["ib_write_bw"].as_bool() == Some(true);
    let run_lat = schedule.lat && reply["ib_write_lat"].as_bool() == Some(true);
    let baseline = if rdma.no_baseline {
        "none (--no-baseline): no ratio".to_string()
    } else if !run_bw {
        let missing = if tools[0].is_none() {
            "here"
        } else {
            "on the server"
        };
        let text = format!(
            "none: perftest's ib_write_bw is not installed {missing} (Debian: apt install perftest): no ratio"
        );
        note(&text);
        text
    } else {
        format!(
            "perftest ib_write_bw{} on {} (server GID index {}), same sizes, between the same two machines (TCP port {perf_port}){}",
            if run_lat {
                " (bandwidth) and ib_write_lat (latency)"
            } else {
                ""
            },
            device.name,
            reply["gid_index"],
            if run_lat {
                ""
            } else {
                "; ib_write_lat not installed on both sides: no baseline latency"
            }
        )
    };
    let ctx = Context {
        role: "client",
        decision,
        device,
        json: args.output.json,
    };
    let config = link.engine().config().clone();
    print_header(&ctx, &config, addr, plan.windows, &baseline);

    let mut failed = false;
    for (index, (&size, &count)) in schedule.sizes.iter().zip(&schedule.counts).enumerate() {
        let message = message_of(size);
        let before = counters(&link);
        let mut server_before = (0u64, 0u64);
        let mut server_now = (0u64, 0u64);
        let mut gbps = Vec::with_capacity(plan.windows);
        let mut sent = 0u64;
        let mut received = 0u64;
        for window in 0..=plan.windows {
            // The link takes ownership of each message: the copies are made
            // before the clock starts.
            let copies: Vec<Vec<u8>> = (0..count).map(|_| message.clone()).collect();
            let start = Instant::now();
            for copy in copies {
                link.send_blocking(copy, STEP_TIMEOUT)
                    .map_err(link_error(&format!("size {size}: sending")))?;
                sent += 1;
            }
            let done = link
                .recv(STEP_TIMEOUT)
                .map_err(link_error(&format!("size {size}: waiting for the server")))?;
            let seconds = start.elapsed().as_secs_f64();
            let (retransmits, crc_errors, got) = parse_done(&done).ok_or_else(|| {
                CommandError::environment(format!(
                    "bench --rdma: size {size}: the server's answer is not \"got them all\" \
                     ({} bytes): the sides are out of step",
                    done.len()
                ))
            })?;
            if window == 0 {
                server_before = (retransmits, crc_errors);
            }
            server_now = (retransmits, crc_errors);
            received = got;
            link.recycle(done);
            if window > 0 {
                gbps.push((size * count) as f64 / seconds / 1e9);
            }
        }
        let mut latencies = Vec::new();
        let mut echo = message.clone();
        for i in 0..lat_iters_for(schedule.lat_iters, size) {
            let start = Instant::now();
            link.send_blocking(echo, STEP_TIMEOUT)
                .map_err(link_error(&format!("size {size}: latency")))?;
            echo = link
                .recv(STEP_TIMEOUT)
                .map_err(link_error(&format!("size {size}: latency echo")))?;
            latencies.push(start.elapsed().as_secs_f64() * 1e6 / 2.0);
            if echo.len() != size || (i == 0 && echo != message) {
                failed = true;
                note(&format!(
                    "size {size}: the echo came back with {} bytes{}",
                    echo.len(),
                    if echo.len() == size {
                        ", different ones"
                    } else {
                        ""
                    }
                ));
            }
        }
        if echo != message {
            failed = true;
            note(&format!(
                "size {size}: the last echo differs from what was sent"
            ));
        }
        link.flush(STEP_TIMEOUT)
            .map_err(link_error(&format!("size {size}: flush")))?;
        let after = counters(&link);
        let lost = sent.saturating_sub(received);
        if lost > 0 {
            failed = true;
            note(&format!(
                "size {size}: the server received {received} of {sent} messages"
            ));
        }
        let barlink_gbps = median(&mut gbps);
        let mut rows = vec![Row {
            path: PATH,
            size,
            gbps: barlink_gbps,
            lat: Some((
                percentile(&mut latencies, 0.5),
                percentile(&mut latencies, 0.99),
            )),
            retransmits: after.0 - before.0 + server_now.0.saturating_sub(server_before.0),
            crc_errors: after.1 - before.1 + server_now.1.saturating_sub(server_before.1),
            messages: sent,
            lost,
            ..Row::default()
        }];

        // The baseline.
        let bw = if run_bw {
            let iters = count.clamp(5, 100_000);
            perftest_client(
                &mut link,
                &ctx.device,
                tools[0].as_deref().expect("checked"),
                Baseline::Bw,
                host,
                perf_port,
                size,
                iters,
                rdma.qp_timeout,
            )
            .map(|output| {
                let gbps = parse_write_bw(&output, size);
                if gbps.is_none() {
                    note(&format!(
                        "size {size}: no bandwidth in ib_write_bw's output: {}",
                        last_lines(&output, 4)
                    ));
                }
                gbps.map(|g| (g, iters))
            })
            .unwrap_or_else(|e| {
                note(&format!("size {size}: ib_write_bw: {e}"));
                None
            })
        } else {
            None
        };
        let lat = if run_lat && bw.is_some() {
            let iters = lat_iters_for(schedule.lat_iters, size).clamp(5, 100_000);
            perftest_client(
                &mut link,
                &ctx.device,
                tools[1].as_deref().expect("checked"),
                Baseline::Lat,
                host,
                perf_port,
                size,
                iters,
                rdma.qp_timeout,
            )
            .map(|output| {
                let lat = parse_write_lat(&output, size);
                if lat.is_none() {
                    note(&format!(
                        "size {size}: no latency in ib_write_lat's output: {}",
                        last_lines(&output, 4)
                    ));
                }
                lat
            })
            .unwrap_or_else(|e| {
                note(&format!("size {size}: ib_write_lat: {e}"));
                None
            })
        } else {
            None
        };
        if let Some((perf_gbps, iterations)) = bw {
            if perf_gbps > 0.0 {
                rows[0].ratio = Some(barlink_gbps / perf_gbps);
            } else {
                note(&format!(
                    "size {size}: ib_write_bw's bandwidth printed as 0 (below its resolution): no ratio"
                ));
            }
            rows.push(Row {
                path: "ib_write_bw",
                size,
                gbps: perf_gbps,
                lat,
                iterations,
                ..Row::default()
            });
        }
        let values: Vec<Value> = rows.iter().map(|r| row_json(r, &ctx, &config)).collect();
        for value in &values {
            print_row_value(value, ctx.json);
        }
        let last = index + 1 == schedule.sizes.len();
        send_control(&mut link, &json!({ "rows": values, "last": last }))?;
    }
    let _ = recv_control(&mut link, STEP_TIMEOUT, "the server's goodbye")?;
    let _ = link.close(Duration::from_secs(5));
    Ok(if failed {
        Status::CheckFailed
    } else {
        Status::Ok
    })
}

/// One perftest run, client side: ask the server to start its side, run
/// ours (a few tries while the server's is not listening yet), tell the
/// server, collect its verdict. The output of ours, or why there is none.
#[allow(clippy::too_many_arguments)]
fn perftest_client(
    link: &mut RdmaLink<VerbsQueue>,
    device: &Device,
    program: &Path,
    which: Baseline,
    host: &str,
    port: u16,
    size: usize,
    iters: usize,
    qp_timeout: u8,
) -> Result<String, String> {
    let control_error = |e: CommandError| e.to_string();
    send_control(
        link,
        &json!({ "run": which.tool(), "size": size, "iters": iters }),
    )
    .map_err(control_error)?;
    let ready =
        recv_control_gently(link, STEP_TIMEOUT, "the server's perftest").map_err(control_error)?;
    if ready["ready"].as_bool() != Some(true) {
        return Err(format!(
            "the server could not start its side: {}",
            ready["error"].as_str().unwrap_or("(no reason)")
        ));
    }
    let mut args = perftest_args(device, size, iters, port, qp_timeout);
    args.extend(which.extra().iter().map(|s| s.to_string()));
    args.push(host.to_string());
    let limit = tool_limit(size * iters);
    let mut outcome = Err(String::from("not run"));
    for attempt in 0..4 {
        let result = Tool::spawn(which.tool(), program, &args).and_then(|tool| {
            tool.wait(limit, || {
                let _ = link.progress();
            })
        });
        match result {
            Ok((status, output)) if status.success() => {
                outcome = Ok(output);
                break;
            }
            Ok((status, output)) => {
                outcome = Err(format!("exited with {status}: {}", last_lines(&output, 3)));
                if !not_listening_yet(&output) || attempt == 3 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    // Whatever happened here, the server collects its side before the
    // schedule goes on.
    send_control(link, &json!({ "finished": which.tool() })).map_err(control_error)?;
    let verdict = recv_control_gently(link, limit + STEP_TIMEOUT, "the server's perftest result")
        .map_err(control_error)?;
    if outcome.is_ok() && verdict["ok"].as_bool() != Some(true) {
        note(&format!(
            "{}: the server's side: {}",
            which.tool(),
            verdict["error"].as_str().unwrap_or("failed")
        ));
    }
    outcome
}

fn run_server(args: &BenchArgs, device: Device) -> Result<Status, CommandError> {
    let rdma = &args.rdma;
    let listen = rdma
        .listen
        .clone()
        .unwrap_or_else(|| format!("0.0.0.0:{DEFAULT_PORT}"));
    let port = listen
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .map(|a| a.port())
        .ok_or_else(|| {
            CommandError::usage(format!("--listen {listen:?}: not an address (ADDR:PORT)"))
        })?;
    let perf_port = port.checked_add(1).unwrap_or(port - 1);
    if !args.output.json {
        eprintln!(
            "barlink bench --rdma: server on {listen} (device {}), waiting up to {} s for a client",
            device.name, rdma.accept_timeout
        );
    }
    let (mut link, decision) = link_up(args, &device, &listen, Role::Accept)?;
    let plan = recv_control(&mut link, STEP_TIMEOUT, "the client's plan")?;
    let schedule = match Schedule::from_json(&plan) {
        Ok(schedule) => schedule,
        Err(error) => {
            send_control(&mut link, &json!({ "ok": false, "error": error }))?;
            let _ = link.close(Duration::from_secs(5));
            return Err(CommandError::usage(format!("bench --rdma: {error}")));
        }
    };
    let tools = if rdma.no_baseline {
        [None, None]
    } else {
        [find_tool("ib_write_bw"), find_tool("ib_write_lat")]
    };
    if schedule.bw && tools[0].is_none() && !rdma.no_baseline {
        note(
            "perftest's ib_write_bw is not installed here (Debian: apt install perftest): no baseline, no ratio",
        );
    }
    send_control(
        &mut link,
        &json!({
            "ok": true,
            "device": device.name,
            "gid_index": device.gid_index,
            "perftest_port": perf_port,
            "ib_write_bw": tools[0].is_some(),
            "ib_write_lat": tools[1].is_some(),
        }),
    )?;
    let ctx = Context {
        role: "server",
        decision,
        device,
        json: args.output.json,
    };
    let config = link.engine().config().clone();
    print_header(
        &ctx,
        &config,
        &format!("a client, listening on {listen}"),
        schedule.windows,
        "perftest ib_write_bw/ib_write_lat, run by the client (rows as it measured them)",
    );
    let mut failed = false;
    for (&size, &count) in schedule.sizes.iter().zip(&schedule.counts) {
        let expected = message_of(size);
        let mut received = 0u64;
        for window in 0..=schedule.windows {
            for index in 0..count {
                let data = link
                    .recv(STEP_TIMEOUT)
                    .map_err(link_error(&format!("size {size}: receiving")))?;
                let check_bytes = window == 0 || index == 0;
                if data.len() != size || (check_bytes && data != expected) {
                    failed = true;
                    note(&format!(
                        "size {size}: message {index} of window {window} arrived with {} bytes{}",
                        data.len(),
                        if data.len() == size {
                            ", different ones"
                        } else {
                            ""
                        }
                    ));
                }
                received += 1;
                link.recycle(data);
            }
            let (retransmits, crc_errors) = counters(&link);
            link.send_blocking(
                done_message(retransmits, crc_errors, received),
                STEP_TIMEOUT,
            )
            .map_err(link_error(&format!("size {size}: answering")))?;
        }
        for _ in 0..lat_iters_for(schedule.lat_iters, size) {
            let data = link
                .recv(STEP_TIMEOUT)
                .map_err(link_error(&format!("size {size}: latency")))?;
            link.send_blocking(data, STEP_TIMEOUT)
                .map_err(link_error(&format!("size {size}: echo")))?;
        }
        // Then the client's requests, until it sends the size's rows.
        loop {
            let request = recv_control(&mut link, STEP_TIMEOUT, "the client's next step")?;
            if let Some(rows) = request["rows"].as_array() {
                for row in rows {
                    print_row_value(row, ctx.json);
                }
                break;
            }
            match request["run"].as_str() {
                Some(name) => {
                    let which = if name == "ib_write_bw" {
                        Baseline::Bw
                    } else {
                        Baseline::Lat
                    };
                    let program = tools[usize::from(which == Baseline::Lat)].clone();
                    perftest_server(
                        &mut link,
                        &ctx.device,
                        program.as_deref(),
                        which,
                        perf_port,
                        request["size"].as_u64().unwrap_or(0) as usize,
                        request["iters"].as_u64().unwrap_or(5) as usize,
                        rdma.qp_timeout,
                    )?;
                }
                None => {
                    return Err(CommandError::environment(format!(
                        "bench --rdma: an unknown request from the client: {request}"
                    )));
                }
            }
        }
    }
    send_control(&mut link, &json!({ "bye": true }))?;
    // The client closes after the goodbye; wait for that, briefly.
    let _ = link.close(Duration::from_secs(5));
    Ok(if failed {
        Status::CheckFailed
    } else {
        Status::Ok
    })
}

/// One perftest run, server side: start ours, say when it listens, wait
/// for the client's "finished", collect ours (killed if it overruns).
#[allow(clippy::too_many_arguments)]
fn perftest_server(
    link: &mut RdmaLink<VerbsQueue>,
    device: &Device,
    program: Option<&Path>,
    which: Baseline,
    port: u16,
    size: usize,
    iters: usize,
    qp_timeout: u8,
) -> Result<(), CommandError> {
    let limit = tool_limit(size * iters);
    let started = match program {
        None => Err(format!("{} is not installed on the server", which.tool())),
        Some(program) => {
            let mut args = perftest_args(device, size, iters, port, qp_timeout);
            args.extend(which.extra().iter().map(|s| s.to_string()));
            Tool::spawn(which.tool(), program, &args)
        }
    };
    let mut tool = match started {
        Ok(mut tool) => {
            // Until it listens (or dies): then tell the client.
            let deadline = Instant::now() + Duration::from_secs(20);
            while !listening(port) && tool.running() && Instant::now() < deadline {
                let _ = link.progress();
                std::thread::sleep(Duration::from_millis(10));
            }
            if tool.running() {
                send_control(link, &json!({ "ready": true }))?;
                Some(tool)
            } else {
                let output = tool.output();
                send_control(
                    link,
                    &json!({ "ready": false, "error": format!("{} exited at once: {}", which.tool(), last_lines(&output, 3)) }),
                )?;
                None
            }
        }
        Err(error) => {
            send_control(link, &json!({ "ready": false, "error": error }))?;
            None
        }
    };
    if tool.is_none() {
        return Ok(());
    }
    let finished = recv_control_gently(link, limit + STEP_TIMEOUT, "the client's perftest")?;
    if finished["finished"].as_str() != Some(which.tool()) {
        return Err(CommandError::environment(format!(
            "bench --rdma: expected the end of {}, got {finished}",
            which.tool()
        )));
    }
    let verdict = match tool
        .take()
        .expect("running")
        .wait(Duration::from_secs(20), || {
            let _ = link.progress();
        }) {
        Ok((status, _)) if status.success() => json!({ "ok": true }),
        Ok((status, output)) => {
            json!({ "ok": false, "error": format!("exited with {status}: {}", last_lines(&output, 3)) })
        }
        Err(error) => json!({ "ok": false, "error": error }),
    };
    send_control(link, &verdict)
}

#[cfg(test)]
mod tests {
    use super::*;

    const WRITE_BW: &str = "
************************************
* Waiting for client to connect... *
************************************
---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF\t\tDevice         : rxe0
 Number of qps   : 1\t\tTransport type : IB
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 65536      100              0.18               0.16   \t\t   0.000305
---------------------------------------------------------------------------------------
";

    const WRITE_LAT: &str = "
---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 4096       20          310.25         2011.40      402.12     \t     455.32     \t  150.10  \t\t1900.00 \t\t2011.40 
---------------------------------------------------------------------------------------
";

    #[test]
    fn ib_write_bw_average_in_gigabytes_per_second() {
        let gbps = parse_write_bw(WRITE_BW, 65536).unwrap();
        assert!((gbps - 0.02).abs() < 1e-9, "{gbps}");
        assert_eq!(parse_write_bw(WRITE_BW, 4096), None, "another size");
        let mib = WRITE_BW
            .replace("Gb/sec", "MB/sec")
            .replace("0.16", "100.00");
        let gbps = parse_write_bw(&mib, 65536).unwrap();
        assert!((gbps - 0.104_857_6).abs() < 1e-9, "{gbps}");
        assert_eq!(
            parse_write_bw("Couldn't connect to 10.0.2.15:18516", 64),
            None
        );
    }

    #[test]
    fn ib_write_lat_typical_and_99th_percentile() {
        assert_eq!(parse_write_lat(WRITE_LAT, 4096), Some((402.12, 1900.0)));
        assert_eq!(parse_write_lat(WRITE_LAT, 64), None);
        let average =
            " #bytes        #iterations       t_avg[usec]    tps average\n 64  100  12.5  80000\n";
        assert_eq!(parse_write_lat(average, 64), Some((12.5, 12.5)));
        let nan = WRITE_LAT
            .replace("402.12", "nan")
            .replace("1900.00", "-nan");
        assert_eq!(parse_write_lat(&nan, 4096), None);
    }

    #[test]
    fn client_targets() {
        assert_eq!(
            client_target("10.0.2.15").unwrap(),
            ("10.0.2.15".into(), "10.0.2.15:18515".into())
        );
        assert_eq!(
            client_target("node2:9000").unwrap(),
            ("node2".into(), "node2:9000".into())
        );
        assert_eq!(
            client_target("[fe80::1]:7000").unwrap(),
            ("fe80::1".into(), "[fe80::1]:7000".into())
        );
        assert!(client_target("host:port").is_err());
        assert!(client_target("").is_err());
    }

    #[test]
    fn schedules_round_trip_and_bad_ones_are_refused() {
        let schedule = Schedule {
            sizes: vec![64, 4096],
            counts: vec![100, 16],
            windows: 3,
            lat_iters: 20,
            bw: true,
            lat: false,
        };
        assert_eq!(
            Schedule::from_json(&schedule.to_json()),
            Ok(schedule.clone())
        );
        let mut value = schedule.to_json();
        value["counts"] = json!([1]);
        assert!(Schedule::from_json(&value).is_err());
        value["barlink_bench_rdma"] = json!(99);
        assert!(Schedule::from_json(&value).unwrap_err().contains("version"));
    }

    #[test]
    fn done_messages_round_trip() {
        assert_eq!(parse_done(&done_message(3, 4, 5)), Some((3, 4, 5)));
        assert_eq!(parse_done(b"{\"rows\":[]}"), None);
    }

    #[test]
    fn perftest_arguments() {
        let device = Device {
            name: "rxe0".into(),
            gid_index: Some(1),
        };
        assert_eq!(
            perftest_args(&device, 4096, 3, 18516, 18).join(" "),
            "-d rxe0 -i 1 -x 1 -s 4096 -n 5 -p 18516 -u 18 -F"
        );
        let ib = Device {
            name: "mlx5_0".into(),
            gid_index: None,
        };
        assert!(!perftest_args(&ib, 64, 100, 1, 14).contains(&"-x".to_string()));
    }

    #[test]
    fn a_perftest_that_overruns_is_killed() {
        let started = Instant::now();
        let tool = Tool::spawn("sleep", Path::new("/bin/sleep"), &["30".into()]).unwrap();
        let error = tool.wait(Duration::from_millis(200), || {}).unwrap_err();
        assert!(error.contains("killed"), "{error}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
