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
//! - `unix-socket`: a Unix stream socket.
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

use std::io::{Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use barlink_transport::crc::Crc32c;
use barlink_transport::link::{
    IoError, LinkConfig, Listener, Medium, ProgressOptions, ProgressThread, RingLink, connect,
    connect_windows,
};
use barlink_transport::ring::{self, Consumer, Producer};
use barlink_transport::window::{FaultConfig, FaultWindow, ShmWindow, Window};
use clap::{Args, ValueEnum};

/// How long any single step of the benchmark may wait for the peer.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProcPath {
    Barlink,
    RawRing,
    RawRingCrc,
    UnixSocket,
    /// barlink with a bit flipped in packets on the way (`--fault-rate`).
    BarlinkFaults,
}

impl ProcPath {
    pub fn name(self) -> &'static str {
        match self {
            ProcPath::Barlink => "barlink",
            ProcPath::RawRing => "raw-ring",
            ProcPath::RawRingCrc => "raw-ring-crc",
            ProcPath::UnixSocket => "unix-socket",
            ProcPath::BarlinkFaults => "barlink-faults",
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

/// What one size measured on one path.
#[derive(Debug, Clone)]
pub struct Measured {
    pub gbps_windows: Vec<f64>,
    pub latencies_us: Vec<f64>,
    pub retransmits: u64,
    pub crc_errors: u64,
}

/// Moves messages one way and back.
trait Pipe {
    fn send(&mut self, message: &Arc<[u8]>) -> Result<(), String>;
    /// Receives one message into `buf`: its length, or `None` if none came
    /// within `within`. Pipes that move data without being called (the raw
    /// ring, the socket) block instead, for at most [`STEP_TIMEOUT`].
    fn recv_within(&mut self, buf: &mut Vec<u8>, within: Duration)
    -> Result<Option<usize>, String>;
    /// Whether everything sent is through (for a link: acknowledged), after
    /// waiting at most `within`.
    fn flush_within(&mut self, within: Duration) -> Result<bool, String> {
        let _ = within;
        Ok(true)
    }
    /// One round of whatever keeps the pipe moving while its turn waits.
    fn poke(&mut self) -> Result<(), String> {
        Ok(())
    }
    fn counters(&self) -> (u64, u64) {
        (0, 0)
    }
}

/// A link call's result, with a timeout as `None` (the wait goes on in
/// [`recv_on`] / [`flush_on`]).
fn unless_timed_out<T>(result: Result<T, IoError>) -> Result<Option<T>, String> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(IoError::Timeout { .. }) => Ok(None),
        Err(error) => Err(error.to_string()),
    }
}

/// How long one wait on a pipe lasts before the other pipes get a round.
const IDLE_SLICE: Duration = Duration::from_millis(1);

/// Receives on `pipes[index]`, giving the other pipes a round of progress
/// whenever the wait lasts longer than [`IDLE_SLICE`].
///
/// A link moves data only while it is called. The two processes take the
/// paths in turn, so a packet that one side still owes on the path it left
/// (a held acknowledgement, a retransmission of a last packet that arrived
/// corrupt) would otherwise wait until the schedule came back to that path
/// — while the other side waits for it there, never coming back: a
/// deadlock that `--fault-rate` runs hit a few times in a hundred. A round
/// on an idle link is two loads, so the timed windows do not feel it.
fn recv_on(pipes: &mut [Box<dyn Pipe>], index: usize, buf: &mut Vec<u8>) -> Result<usize, String> {
    let mut deadline = None;
    loop {
        if let Some(len) = pipes[index].recv_within(buf, IDLE_SLICE)? {
            return Ok(len);
        }
        keep_others_moving(pipes, index, &mut deadline)?;
    }
}

/// Flushes `pipes[index]` as [`recv_on`] receives: before the schedule
/// turns to another path, everything sent on this one is acknowledged.
fn flush_on(pipes: &mut [Box<dyn Pipe>], index: usize) -> Result<(), String> {
    let mut deadline = None;
    while !pipes[index].flush_within(IDLE_SLICE)? {
        keep_others_moving(pipes, index, &mut deadline)?;
    }
    Ok(())
}

/// A round of progress on every pipe but `index`; an error once the wait
/// on `index` has lasted [`STEP_TIMEOUT`].
fn keep_others_moving(
    pipes: &mut [Box<dyn Pipe>],
    index: usize,
    deadline: &mut Option<Instant>,
) -> Result<(), String> {
    let now = Instant::now();
    if now > *deadline.get_or_insert(now + STEP_TIMEOUT) {
        return Err(format!("timed out after {STEP_TIMEOUT:?}"));
    }
    for (other, pipe) in pipes.iter_mut().enumerate() {
        if other != index {
            pipe.poke()?;
        }
    }
    Ok(())
}

fn link_config(plan: &PeerPlan) -> LinkConfig {
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

/// A link whose writes into the peer's ring flip a bit with probability
/// `rate` per packet. Each packet is two writes (payload, then header, each
/// one fault decision), so each write is faulted with `rate / 2`. Both
/// windows go through the wrapper so that both directions pay its cost.
fn faulty_link(
    own: ShmWindow,
    peer: ShmWindow,
    config: &LinkConfig,
    rate: f64,
    seed: u64,
) -> Result<RingLink<FaultWindow<ShmWindow>, Arc<[u8]>>, String> {
    let own = FaultWindow::new(own, FaultConfig::none(), seed);
    let peer = FaultWindow::new(
        peer,
        FaultConfig::none().with_bit_flip(rate / 2.0),
        seed ^ 0x5EED,
    );
    RingLink::new(own, peer, config.engine.clone(), 1).map_err(|e| e.to_string())
}

/// A barlink link as the pipes use it, whoever drives its progress: the
/// caller's thread ([`RingLink`]) or a progress thread of its own.
trait DrivenLink {
    fn send_blocking(&mut self, data: Arc<[u8]>, timeout: Duration) -> Result<(), IoError>;
    fn recv(&mut self, timeout: Duration) -> Result<Vec<u8>, IoError>;
    fn flush(&mut self, timeout: Duration) -> Result<(), IoError>;
    fn recycle(&mut self, buf: Vec<u8>);
    /// One round of progress, where the caller drives it.
    fn poke(&mut self) -> Result<(), IoError>;
    fn stats(&self) -> barlink_transport::Stats;
}

impl<W: Window> DrivenLink for RingLink<W, Arc<[u8]>> {
    fn send_blocking(&mut self, data: Arc<[u8]>, timeout: Duration) -> Result<(), IoError> {
        RingLink::send_blocking(self, data, timeout).map(drop)
    }
    fn recv(&mut self, timeout: Duration) -> Result<Vec<u8>, IoError> {
        RingLink::recv(self, timeout)
    }
    fn flush(&mut self, timeout: Duration) -> Result<(), IoError> {
        RingLink::flush(self, timeout)
    }
    fn recycle(&mut self, buf: Vec<u8>) {
        RingLink::recycle(self, buf)
    }
    fn poke(&mut self) -> Result<(), IoError> {
        self.progress().map(drop)
    }
    fn stats(&self) -> barlink_transport::Stats {
        self.engine().stats().clone()
    }
}

impl<M: Medium + Send + 'static> DrivenLink for ProgressThread<M, Arc<[u8]>> {
    fn send_blocking(&mut self, data: Arc<[u8]>, timeout: Duration) -> Result<(), IoError> {
        ProgressThread::send_blocking(self, data, timeout).map(drop)
    }
    fn recv(&mut self, timeout: Duration) -> Result<Vec<u8>, IoError> {
        ProgressThread::recv(self, timeout)
    }
    fn flush(&mut self, timeout: Duration) -> Result<(), IoError> {
        ProgressThread::flush(self, timeout)
    }
    fn recycle(&mut self, buf: Vec<u8>) {
        ProgressThread::recycle(self, buf)
    }
    /// Its own thread drives it.
    fn poke(&mut self) -> Result<(), IoError> {
        Ok(())
    }
    fn stats(&self) -> barlink_transport::Stats {
        ProgressThread::stats(self)
    }
}

/// A barlink link as a pipe.
struct LinkPipe<L: DrivenLink>(L);

impl<L: DrivenLink> Pipe for LinkPipe<L> {
    fn send(&mut self, message: &Arc<[u8]>) -> Result<(), String> {
        self.0
            .send_blocking(message.clone(), STEP_TIMEOUT)
            .map_err(|e| e.to_string())
    }
    fn recv_within(
        &mut self,
        buf: &mut Vec<u8>,
        within: Duration,
    ) -> Result<Option<usize>, String> {
        let data = unless_timed_out(self.0.recv(within))?;
        Ok(data.map(|data| swap_in(buf, data, |old| self.0.recycle(old))))
    }
    fn flush_within(&mut self, within: Duration) -> Result<bool, String> {
        Ok(unless_timed_out(self.0.flush(within))?.is_some())
    }
    fn poke(&mut self) -> Result<(), String> {
        self.0.poke().map_err(|e| e.to_string())
    }
    fn counters(&self) -> (u64, u64) {
        counters(&self.0.stats())
    }
}

/// Puts a received message in `buf` and hands the buffer it replaces back
/// to the engine (the next message reuses it); the message's length.
fn swap_in(buf: &mut Vec<u8>, data: Vec<u8>, recycle: impl FnOnce(Vec<u8>)) -> usize {
    let len = data.len();
    recycle(std::mem::replace(buf, data));
    len
}

/// Retransmissions and rejected packets, as the "done" message carries them.
fn counters(stats: &barlink_transport::Stats) -> (u64, u64) {
    (stats.retransmits(), stats.crc_failures + stats.malformed)
}

/// The link as a pipe, driven as `mode` says.
fn link_pipe<W: Window + Send + 'static>(
    link: RingLink<W, Arc<[u8]>>,
    mode: ProgressMode,
) -> Result<Box<dyn Pipe>, String> {
    Ok(match mode {
        ProgressMode::Poll => Box::new(LinkPipe(link)),
        ProgressMode::Thread => Box::new(LinkPipe(
            ProgressThread::spawn(link, ProgressOptions::default())
                .map_err(|e| format!("starting the progress thread: {e}"))?,
        )),
    })
}

/// The raw-ring baselines: fragments copied into slots behind a 16-byte
/// slot header (length, last-fragment flag and, for `raw-ring-crc`, the
/// slot's CRC-32C); no acknowledgement, retransmission or ordering.
struct RawRingPipe {
    own: ShmWindow,
    peer: ShmWindow,
    producer: Producer,
    consumer: Consumer,
    slot_payload: usize,
    /// Take a CRC-32C of each slot's bytes while copying them, and check
    /// it on arrival (`raw-ring-crc`).
    crc: bool,
}

/// A raw slot's header: the piece's length (u64), whether it ends its
/// message (u8), and with `crc` the piece's CRC-32C (u32 at 12).
const RAW_SLOT_HEADER: usize = 16;
const RAW_CRC_AT: usize = 12;

impl RawRingPipe {
    fn new(own: ShmWindow, peer: ShmWindow, crc: bool) -> Result<Self, String> {
        let own_info = barlink_transport::link::read_ring_info(&own).map_err(|e| e.to_string())?;
        let peer_info =
            barlink_transport::link::read_ring_info(&peer).map_err(|e| e.to_string())?;
        Ok(RawRingPipe {
            slot_payload: peer_info.geometry.slot_size as usize - RAW_SLOT_HEADER,
            producer: Producer::new(peer_info.geometry),
            consumer: Consumer::new(own_info.geometry),
            own,
            peer,
            crc,
        })
    }

    fn spin_until<T>(mut ready: impl FnMut() -> Result<Option<T>, String>) -> Result<T, String> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        let mut spins = 0u32;
        loop {
            if let Some(value) = ready()? {
                return Ok(value);
            }
            spins += 1;
            if spins.is_multiple_of(1024) {
                if Instant::now() > deadline {
                    return Err("raw ring: the peer stopped".into());
                }
                std::thread::yield_now();
            }
        }
    }
}

impl Pipe for RawRingPipe {
    fn send(&mut self, message: &Arc<[u8]>) -> Result<(), String> {
        // One piece per slot, at least one (an empty message is one empty
        // piece); no list of them, so that the baseline allocates nothing
        // per message.
        let count = message.len().div_ceil(self.slot_payload).max(1);
        for index in 0..count {
            let start = index * self.slot_payload;
            let piece = &message[start..message.len().min(start + self.slot_payload)];
            let (own, producer) = (&self.own, &mut self.producer);
            let slot = Self::spin_until(|| {
                let consumed = own
                    .load_u64(ring::offset::CONSUMED, Ordering::Acquire)
                    .map_err(|e| e.to_string())?;
                producer.on_consumed(consumed).map_err(|e| e.to_string())?;
                Ok(producer.next_slot_offset())
            })?;
            let mut header = [0u8; RAW_SLOT_HEADER];
            header[..8].copy_from_slice(&(piece.len() as u64).to_le_bytes());
            header[8] = u8::from(index + 1 == count);
            if self.crc {
                let mut crc = Crc32c::new();
                self.peer
                    .write_crc(slot + RAW_SLOT_HEADER, piece, &mut crc)
                    .map_err(|e| e.to_string())?;
                header[RAW_CRC_AT..].copy_from_slice(&crc.finish().to_le_bytes());
            } else {
                self.peer
                    .write(slot + RAW_SLOT_HEADER, piece)
                    .map_err(|e| e.to_string())?;
            }
            self.peer.write(slot, &header).map_err(|e| e.to_string())?;
            let head = self.producer.commit();
            self.peer.store_fence();
            self.peer
                .store_u64(ring::offset::HEAD, head, Ordering::Release)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn recv_within(&mut self, buf: &mut Vec<u8>, _: Duration) -> Result<Option<usize>, String> {
        // `buf` keeps its length from the last message, so fragments are
        // copied over old bytes rather than over freshly zeroed ones: no
        // pass over the buffer but the copy itself.
        let mut filled = 0;
        loop {
            let (own, consumer) = (&self.own, &mut self.consumer);
            let slot = Self::spin_until(|| {
                if let Some(slot) = consumer.next_slot_offset() {
                    return Ok(Some(slot));
                }
                let head = own
                    .load_u64(ring::offset::HEAD, Ordering::Acquire)
                    .map_err(|e| e.to_string())?;
                consumer.on_head(head).map_err(|e| e.to_string())?;
                Ok(consumer.next_slot_offset())
            })?;
            let mut header = [0u8; RAW_SLOT_HEADER];
            self.own
                .read(slot, &mut header)
                .map_err(|e| e.to_string())?;
            let len = (u64::from_le_bytes(header[..8].try_into().expect("8 bytes")) as usize)
                .min(self.slot_payload);
            if buf.len() < filled + len {
                buf.resize(filled + len, 0);
            }
            let piece = &mut buf[filled..filled + len];
            if self.crc {
                let mut crc = Crc32c::new();
                self.own
                    .read_crc(slot + RAW_SLOT_HEADER, piece, &mut crc)
                    .map_err(|e| e.to_string())?;
                let carried = u32::from_le_bytes(header[RAW_CRC_AT..].try_into().expect("4 bytes"));
                if crc.finish() != carried {
                    return Err(format!(
                        "raw ring: a slot's CRC-32C is {:#010x}, its header says {carried:#010x} (nothing corrupts this ring: check memory)",
                        crc.finish()
                    ));
                }
            } else {
                self.own
                    .read(slot + RAW_SLOT_HEADER, piece)
                    .map_err(|e| e.to_string())?;
            }
            filled += len;
            let consumed = self.consumer.release();
            self.peer
                .store_u64(ring::offset::CONSUMED, consumed, Ordering::Release)
                .map_err(|e| e.to_string())?;
            if header[8] == 1 {
                buf.truncate(filled);
                return Ok(Some(filled));
            }
        }
    }
}

struct SocketPipe(UnixStream);

impl Pipe for SocketPipe {
    fn send(&mut self, message: &Arc<[u8]>) -> Result<(), String> {
        self.0
            .write_all(&(message.len() as u64).to_le_bytes())
            .and_then(|()| self.0.write_all(message))
            .map_err(|e| e.to_string())
    }
    fn recv_within(&mut self, buf: &mut Vec<u8>, _: Duration) -> Result<Option<usize>, String> {
        let mut len = [0u8; 8];
        self.0.read_exact(&mut len).map_err(|e| e.to_string())?;
        let len = u64::from_le_bytes(len) as usize;
        if len > 1 << 31 {
            return Err(format!("unix socket: impossible length {len}"));
        }
        buf.resize(len, 0);
        self.0.read_exact(buf).map_err(|e| e.to_string())?;
        Ok(Some(len))
    }
}

fn socket_address(name: &str) -> Result<SocketAddr, String> {
    SocketAddr::from_abstract_name(format!("barlink-bench/{name}")).map_err(|e| e.to_string())
}

/// Opens the pipe on the parent's side (it listens; the child connects).
fn parent_pipe(
    plan: &PeerPlan,
    path: ProcPath,
    child: &mut Child,
) -> Result<Box<dyn Pipe>, String> {
    let config = link_config(plan);
    let name = format!("{}-{}", plan.name, path.name());
    Ok(match path {
        ProcPath::Barlink => {
            let listener = Listener::bind(&name).map_err(|e| e.to_string())?;
            link_pipe(
                listener.accept(&config).map_err(|e| e.to_string())?,
                plan.progress,
            )?
        }
        ProcPath::BarlinkFaults => {
            let listener = Listener::bind(&name).map_err(|e| e.to_string())?;
            let (own, peer) = listener
                .accept_windows(&config)
                .map_err(|e| e.to_string())?;
            link_pipe(
                faulty_link(own, peer, &config, plan.fault_rate, plan.seed)?,
                plan.progress,
            )?
        }
        ProcPath::RawRing | ProcPath::RawRingCrc => {
            let listener = Listener::bind(&name).map_err(|e| e.to_string())?;
            let (own, peer) = listener
                .accept_windows(&config)
                .map_err(|e| e.to_string())?;
            Box::new(RawRingPipe::new(own, peer, path == ProcPath::RawRingCrc)?)
        }
        ProcPath::UnixSocket => {
            let listener =
                UnixListener::bind_addr(&socket_address(&name)?).map_err(|e| e.to_string())?;
            listener.set_nonblocking(true).map_err(|e| e.to_string())?;
            let deadline = Instant::now() + config.setup_timeout;
            let stream = loop {
                match listener.accept() {
                    Ok((stream, _)) => break stream,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if Instant::now() > deadline || child.try_wait().ok().flatten().is_some() {
                            return Err("unix socket: the peer never connected".into());
                        }
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(e) => return Err(e.to_string()),
                }
            };
            stream.set_nonblocking(false).map_err(|e| e.to_string())?;
            stream
                .set_read_timeout(Some(STEP_TIMEOUT))
                .map_err(|e| e.to_string())?;
            Box::new(SocketPipe(stream))
        }
    })
}

fn child_pipe(plan: &PeerPlan, path: ProcPath) -> Result<Box<dyn Pipe>, String> {
    let config = link_config(plan);
    let name = format!("{}-{}", plan.name, path.name());
    Ok(match path {
        ProcPath::Barlink => link_pipe(
            connect(&name, &config).map_err(|e| e.to_string())?,
            plan.progress,
        )?,
        ProcPath::BarlinkFaults => {
            let (own, peer) = connect_windows(&name, &config).map_err(|e| e.to_string())?;
            link_pipe(
                faulty_link(own, peer, &config, plan.fault_rate, !plan.seed)?,
                plan.progress,
            )?
        }
        ProcPath::RawRing | ProcPath::RawRingCrc => {
            let (own, peer) = connect_windows(&name, &config).map_err(|e| e.to_string())?;
            Box::new(RawRingPipe::new(own, peer, path == ProcPath::RawRingCrc)?)
        }
        ProcPath::UnixSocket => {
            let addr = socket_address(&name)?;
            let deadline = Instant::now() + config.setup_timeout;
            let stream = loop {
                match UnixStream::connect_addr(&addr) {
                    Ok(stream) => break stream,
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(2))
                    }
                    Err(e) => return Err(e.to_string()),
                }
            };
            stream
                .set_read_timeout(Some(STEP_TIMEOUT))
                .map_err(|e| e.to_string())?;
            Box::new(SocketPipe(stream))
        }
    })
}

fn message_of(size: usize, seed: u64) -> Arc<[u8]> {
    let mut data = vec![0u8; size];
    barlink_transport::sim::SplitMix64::new(seed).fill(&mut data);
    data.into()
}

/// The parent's side: spawns the child, measures every size on every path,
/// returns one `Measured` per size for each path of `plan.paths`.
pub fn run_parent(plan: &PeerPlan) -> Result<Vec<Vec<Measured>>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .arg("bench-peer")
        .args(plan_args(plan))
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting the peer process: {e}"))?;
    let result = parent_phases(plan, &mut child);
    if result.is_err() {
        let _ = child.kill();
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    let measured = result?;
    if !status.success() {
        return Err(format!("the peer process failed: {status}"));
    }
    Ok(measured)
}

/// Round trips per turn when the paths take turns at latency.
const LATENCY_TURN: usize = 100;

fn parent_phases(plan: &PeerPlan, child: &mut Child) -> Result<Vec<Vec<Measured>>, String> {
    let mut pipes = vec![];
    for &path in &plan.paths {
        let pipe = parent_pipe(plan, path, child).map_err(|e| format!("{}: {e}", path.name()))?;
        pipes.push(pipe);
    }
    let mut ack = Vec::new();
    let mut reply = Vec::new();
    let mut results: Vec<Vec<Measured>> = vec![vec![]; pipes.len()];
    let mut child_before = vec![(0u64, 0u64); pipes.len()];
    for (&size, &count) in plan.sizes.iter().zip(&plan.counts) {
        let message = message_of(size, size as u64);
        let before: Vec<(u64, u64)> = pipes.iter().map(|pipe| pipe.counters()).collect();
        // The child's counters so far, as its last "done" carried them.
        let mut child_now = child_before.clone();
        let mut measured = vec![
            Measured {
                gbps_windows: vec![],
                latencies_us: vec![],
                retransmits: 0,
                crc_errors: 0,
            };
            pipes.len()
        ];
        for window in 0..=plan.windows {
            for (index, measured) in measured.iter_mut().enumerate() {
                let start = Instant::now();
                for _ in 0..count {
                    pipes[index].send(&message)?;
                }
                recv_on(&mut pipes, index, &mut ack)?; // the child has them all
                let seconds = start.elapsed().as_secs_f64();
                if let Some(counters) = child_counters(&ack) {
                    child_now[index] = counters;
                }
                flush_on(&mut pipes, index)?;
                if window > 0 {
                    measured
                        .gbps_windows
                        .push((size * count) as f64 / seconds / 1e9);
                }
            }
        }
        for turn in latency_turns(plan.lat_iters) {
            for (index, measured) in measured.iter_mut().enumerate() {
                for _ in 0..turn {
                    let start = Instant::now();
                    pipes[index].send(&message)?;
                    let len = recv_on(&mut pipes, index, &mut reply)?;
                    measured
                        .latencies_us
                        .push(start.elapsed().as_secs_f64() * 1e6 / 2.0);
                    if len != size {
                        return Err(format!("echo of {size} bytes came back as {len}"));
                    }
                }
                flush_on(&mut pipes, index)?;
            }
        }
        for index in 0..pipes.len() {
            flush_on(&mut pipes, index)?;
            let pipe = &pipes[index];
            // Both sides: each catches the corruption in what it receives
            // and retransmits what it sent.
            let (retransmits, crc_errors) = pipe.counters();
            let (child_retransmits, child_crc_errors) = child_now[index];
            measured[index].retransmits = retransmits - before[index].0
                + child_retransmits.saturating_sub(child_before[index].0);
            measured[index].crc_errors = crc_errors - before[index].1
                + child_crc_errors.saturating_sub(child_before[index].1);
        }
        for (path_results, measured) in results.iter_mut().zip(measured) {
            path_results.push(measured);
        }
        child_before = child_now;
    }
    Ok(results)
}

/// The child's (retransmits, CRC errors) from a 17-byte "done" message.
fn child_counters(done: &[u8]) -> Option<(u64, u64)> {
    let retransmits = u64::from_le_bytes(done.get(1..9)?.try_into().ok()?);
    let crc_errors = u64::from_le_bytes(done.get(9..17)?.try_into().ok()?);
    Some((retransmits, crc_errors))
}

/// `iters` round trips split into turns of at most [`LATENCY_TURN`].
fn latency_turns(iters: usize) -> impl Iterator<Item = usize> {
    (0..iters.div_ceil(LATENCY_TURN))
        .map(move |turn| (iters - turn * LATENCY_TURN).min(LATENCY_TURN))
}

/// The child's side (`barlink bench-peer`): receives, checks, confirms,
/// echoes, on each path in the parent's order.
pub fn run_child(plan: &PeerPlan) -> Result<(), String> {
    let mut pipes = vec![];
    for &path in &plan.paths {
        pipes.push(child_pipe(plan, path).map_err(|e| format!("{}: {e}", path.name()))?);
    }
    let mut done = [1u8; 17];
    let mut buf = Vec::new();
    for (&size, &count) in plan.sizes.iter().zip(&plan.counts) {
        let expected = message_of(size, size as u64);
        for _ in 0..=plan.windows {
            for path in 0..pipes.len() {
                for index in 0..count {
                    let len = recv_on(&mut pipes, path, &mut buf)?;
                    if len != size {
                        return Err(format!(
                            "message {index} of size {size} arrived with {len} bytes"
                        ));
                    }
                    if index == 0 && buf[..] != expected[..] {
                        return Err(format!(
                            "message of size {size} arrived with different bytes"
                        ));
                    }
                }
                // "Got them all", with this side's counters so far.
                let (retransmits, crc_errors) = pipes[path].counters();
                done[1..9].copy_from_slice(&retransmits.to_le_bytes());
                done[9..17].copy_from_slice(&crc_errors.to_le_bytes());
                pipes[path].send(&Arc::from(&done[..]))?;
                flush_on(&mut pipes, path)?;
            }
        }
        for turn in latency_turns(plan.lat_iters) {
            for path in 0..pipes.len() {
                for _ in 0..turn {
                    recv_on(&mut pipes, path, &mut buf)?;
                    pipes[path].send(&expected)?;
                }
                flush_on(&mut pipes, path)?;
            }
        }
        for path in 0..pipes.len() {
            flush_on(&mut pipes, path)?;
        }
    }
    // Keep the links up briefly so the parent gets its last acknowledgements.
    let until = Instant::now() + Duration::from_millis(200);
    while Instant::now() < until {
        for pipe in pipes.iter_mut() {
            let _ = pipe.flush_within(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

fn plan_args(plan: &PeerPlan) -> Vec<String> {
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
