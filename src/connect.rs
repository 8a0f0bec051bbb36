//! One [`connect`] for every path: it picks BAR peer-to-peer, a host-memory
//! bounce or RDMA from the PCI topology and from where the peer is, sets up
//! that link, and says which it picked and why ([`PathDecision`]).
//!
//! - A peer on **another node** ([`Peer::Remote`]) is reached over RDMA
//!   (`barlink-rdma`: RDMA WRITE with immediate into its registered ring)
//!   where this host has an active RDMA port, else over TCP
//!   (`transport::tcp`, sealed when [`ConnectOptions::encrypt`]). Either
//!   way setup is authenticated first. [`Peer::Rdma`] and [`Peer::Tcp`]
//!   take one medium only; without an RDMA device `Peer::Rdma` has no path,
//!   and the error says what was found.
//! - A peer on **this host** whose GPU and ours were named by their BAR
//!   windows ([`ConnectOptions::bars`]) is reached over those BARs when the
//!   topology allows peer-to-peer between the two devices (same switch or
//!   root complex within the policy, no ACS redirect, no translating IOMMU,
//!   an aperture large enough), else through host memory.
//! - Any other peer on this host is reached through host shared memory
//!   (memfd rings set up under a link name).
//!
//! Whatever the path, the link underneath is the same engine: every packet
//! CRC-checked, retransmitted until it is through, messages delivered once
//! and in order, or an error.
#![forbid(unsafe_code)]

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

pub use crate::bars::{BarEnds, BarRef};

use barlink_rdma::RdmaLink;
use barlink_rdma::verbs_queue::{self, RdmaLinkOptions, VerbsQueue};
use barlink_topology::{Bdf, PathChoice, PathPolicy, Topology};
use barlink_transport::auth::PeerAuth;
use barlink_transport::engine::MessageId;
use barlink_transport::link::{
    AllowedPeers, IoError, LinkConfig, RingLink, SentBack, SetupError, pair_windows,
};
use barlink_transport::tcp::{self, SocketBuffers, TcpLink, TcpLinkOptions};
use barlink_transport::window::{ShmOptions, ShmWindow};
use barlink_transport::{Delivery, EngineConfig, PostId, PostedRecv, RecvTarget, SendError, Stats};
use barlink_vfio::open::{BarOpenError, BarRoute, open_bar_range};
use barlink_vfio::{BarWindow, DeviceSpec};

/// Where the peer is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// A process on this host, met under a link name.
    Local { name: String },
    /// A process on another node, met at its setup address (`host:port`;
    /// for [`Role::Accept`], the address to listen on): over RDMA where
    /// this host has an active RDMA port, else over TCP.
    Remote { addr: String },
    /// A process on another node, over RDMA only (`rdma://HOST:PORT`).
    Rdma { addr: String },
    /// A process on another node, over TCP only (`tcp://HOST:PORT`).
    Tcp { addr: String },
}

impl FromStr for Peer {
    type Err = ConnectError;

    /// `local:NAME` or a bare name: this host; `rdma://HOST:PORT`,
    /// `tcp://HOST:PORT` or `HOST:PORT` (RDMA where this host has it, else
    /// TCP): another node.
    fn from_str(text: &str) -> Result<Peer, ConnectError> {
        if let Some(name) = text.strip_prefix("local:") {
            return Ok(Peer::Local {
                name: name.to_string(),
            });
        }
        if let Some(addr) = text.strip_prefix("rdma://") {
            return Ok(Peer::Rdma {
                addr: addr.to_string(),
            });
        }
        if let Some(addr) = text.strip_prefix("tcp://") {
            return Ok(Peer::Tcp {
                addr: addr.to_string(),
            });
        }
        if text.is_empty() {
            return Err(ConnectError::Usage {
                detail: "an empty peer: give local:NAME, rdma://HOST:PORT or tcp://HOST:PORT"
                    .to_string(),
            });
        }
        Ok(match text.rsplit_once(':') {
            Some((_, port)) if port.parse::<u16>().is_ok() => Peer::Remote {
                addr: text.to_string(),
            },
            _ => Peer::Local {
                name: text.to_string(),
            },
        })
    }
}

/// Which side of the setup this process takes. Over BAR windows both sides
/// do the same and the role does not matter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Waits for the peer (listens under the name or on the address).
    Accept,
    /// Goes to the peer.
    Connect,
}

/// The paths a link can take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathKind {
    /// Packets written straight into the peer device's BAR window.
    BarP2p,
    /// Packets through rings in host shared memory.
    HostBounce,
    /// Packets as RDMA WRITE with immediate into the peer's registered ring.
    Rdma,
    /// Packets over a TCP connection (sealed when encrypting).
    Tcp,
}

impl PathKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PathKind::BarP2p => "bar-p2p",
            PathKind::HostBounce => "host-bounce",
            PathKind::Rdma => "rdma",
            PathKind::Tcp => "tcp",
        }
    }
}

impl fmt::Display for PathKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The path picked, and why, in words a user can check against
/// `barlink topo` and `barlink doctor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathDecision {
    pub path: PathKind,
    pub reason: String,
}

impl fmt::Display for PathDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.reason)
    }
}

/// How [`connect`] decides and sets up.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// The engine on every path (both sides must agree on the MTU).
    pub engine: EngineConfig,
    /// Longest wait for the peer during setup.
    pub setup_timeout: Duration,
    /// The two devices' BAR windows, when both sides are GPUs on this host.
    pub bars: Option<BarEnds>,
    /// The sysfs root the topology is read from (`/`).
    pub sysfs_root: PathBuf,
    /// How far peer-to-peer is trusted (as `barlink topo --p2p-level`).
    pub policy: PathPolicy,
    /// Take this path whatever the topology says (the decision still says
    /// what it would have picked).
    pub force: Option<PathKind>,
    /// RDMA device, port, queue-pair timeouts and retries, and how the
    /// setup is authenticated (`rdma.oob.auth`; by default as the
    /// environment says). Its `engine` is replaced by
    /// [`ConnectOptions::engine`].
    pub rdma: RdmaLinkOptions,
    /// Which other local users may be the peer of a local link (by
    /// default only the same user, plus `BARLINK_ALLOW_UIDS`/`_GIDS`).
    pub allow: AllowedPeers,
    /// TCP connect retries and timeouts (its `engine` is replaced by
    /// [`ConnectOptions::engine`], its `encrypt` by
    /// [`ConnectOptions::encrypt`]).
    pub tcp: TcpLinkOptions,
    /// Seal every packet of a TCP link (RDMA payloads are not encrypted;
    /// see docs/SECURITY.md).
    pub encrypt: bool,
    /// How setup with another node is authenticated, over RDMA or TCP;
    /// `None`: `rdma.oob.auth` or `tcp.channel.auth`, else the
    /// environment's (`BARLINK_PSK_FILE`, ...).
    pub auth: Option<PeerAuth>,
    /// Bytes of each side's receive window on a link over host memory
    /// (control block plus slots).
    pub window_len: usize,
    /// How a link over host memory backs its windows (huge pages, ...).
    pub shm: ShmOptions,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            engine: EngineConfig::default(),
            setup_timeout: Duration::from_secs(10),
            bars: None,
            sysfs_root: PathBuf::from("/"),
            policy: PathPolicy::default(),
            force: None,
            rdma: RdmaLinkOptions::default(),
            allow: AllowedPeers::default(),
            tcp: TcpLinkOptions::default(),
            encrypt: false,
            auth: None,
            window_len: LinkConfig::default().window_len,
            shm: ShmOptions::default(),
        }
    }
}

/// Why [`connect`] has no link.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConnectError {
    /// No path reaches the peer; `reason` says what was looked at.
    NoPath { reason: String },
    /// The peer or the options are malformed.
    Usage { detail: String },
    /// Setting up the chosen path failed.
    Setup {
        decision: PathDecision,
        detail: String,
    },
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectError::NoPath { reason } => write!(f, "no path to the peer: {reason}"),
            ConnectError::Usage { detail } => write!(f, "connect: {detail}"),
            ConnectError::Setup { decision, detail } => {
                write!(
                    f,
                    "setting up {} ({}): {detail}",
                    decision.path, decision.reason
                )
            }
        }
    }
}

impl std::error::Error for ConnectError {}

/// A device address from a BAR reference.
fn resolve(device: &str, root: &Path) -> Result<Bdf, String> {
    let spec: DeviceSpec = device.parse().map_err(|e| format!("{device}: {e}"))?;
    spec.resolve(root).map_err(|e| e.to_string())
}

/// What the topology says about peer-to-peer between two devices.
fn bar_decision(bars: &BarEnds, options: &ConnectOptions) -> PathDecision {
    let root = &options.sysfs_root;
    let bounce = |reason: String| PathDecision {
        path: PathKind::HostBounce,
        reason,
    };
    let (own, peer) = match (
        resolve(&bars.own.device, root),
        resolve(&bars.peer.device, root),
    ) {
        (Ok(own), Ok(peer)) => (own, peer),
        (Err(e), _) | (_, Err(e)) => {
            return bounce(format!(
                "the BAR windows' devices cannot be found ({e}), so host memory"
            ));
        }
    };
    let topology = match Topology::discover(root, options.policy) {
        Ok(topology) => topology,
        Err(e) => {
            return bounce(format!(
                "the PCI topology cannot be read ({e}), and peer-to-peer is not risked blind"
            ));
        }
    };
    let name_of = |bdf: Bdf| {
        topology
            .gpus
            .iter()
            .find(|g| g.bdf == bdf)
            .map(|g| g.name.clone())
    };
    match (name_of(own), name_of(peer)) {
        (Some(a), Some(b)) => match topology.pair(&a, &b) {
            Some(pair) if pair.path == PathChoice::P2p => PathDecision {
                path: PathKind::BarP2p,
                reason: format!(
                    "{a} ({own}) and {b} ({peer}) are {}: {}",
                    pair.link, pair.reason
                ),
            },
            Some(pair) => bounce(format!(
                "{a} ({own}) and {b} ({peer}) are {}, but {}",
                pair.link, pair.reason
            )),
            None => bounce(format!("the topology has no verdict for {a} and {b}")),
        },
        _ => PathDecision {
            path: PathKind::BarP2p,
            reason: format!(
                "{own} and {peer} are not GPUs the topology classifies; the BAR windows named are used as given \
                 (every packet's CRC still checks what crosses them)"
            ),
        },
    }
}

/// RDMA to `addr` when this host has an active port (on the device the
/// options name, if any), else why not.
fn rdma_decision(addr: &str, options: &ConnectOptions) -> Result<PathDecision, ConnectError> {
    Ok(match barlink_rdma::device::devices() {
        Ok(devices) => {
            let wanted = options.rdma.device.as_deref();
            let usable = devices
                .iter()
                .filter(|d| wanted.is_none_or(|w| w == d.name))
                .find_map(|d| d.active_port().map(|p| (d, p)));
            match usable {
                Some((device, port)) => PathDecision {
                    path: PathKind::Rdma,
                    reason: format!(
                        "the peer is on another node (setup over TCP at {addr}); RDMA device {} port {} is active ({:?})",
                        device.name, port.port, port.link_layer
                    ),
                },
                None => {
                    return Err(ConnectError::NoPath {
                        reason: format!(
                            "the peer is on another node (setup at {addr}) and no RDMA port is active{} \
                                 (devices: {}; check `ibv_devinfo`)",
                            wanted.map(|w| format!(" on {w}")).unwrap_or_default(),
                            devices
                                .iter()
                                .map(|d| d.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    });
                }
            }
        }
        Err(error) => {
            return Err(ConnectError::NoPath {
                reason: format!(
                    "the peer is on another node (setup at {addr}), which needs RDMA: {error}"
                ),
            });
        }
    })
}

/// Picks the path to `peer` without setting anything up.
pub fn choose_path(peer: &Peer, options: &ConnectOptions) -> Result<PathDecision, ConnectError> {
    let automatic = match peer {
        Peer::Rdma { addr } => rdma_decision(addr, options)?,
        Peer::Tcp { addr } => PathDecision {
            path: PathKind::Tcp,
            reason: format!("the peer is on another node, named as tcp://{addr}"),
        },
        Peer::Remote { addr } => match rdma_decision(addr, options) {
            Ok(decision) => decision,
            Err(ConnectError::NoPath { reason }) => PathDecision {
                path: PathKind::Tcp,
                reason: format!("no RDMA here ({reason}), so TCP"),
            },
            Err(error) => return Err(error),
        },
        Peer::Local { .. } => match &options.bars {
            Some(bars) => bar_decision(bars, options),
            None => PathDecision {
                path: PathKind::HostBounce,
                reason: "the peer is a process on this host and no BAR windows were named, so host shared memory"
                    .to_string(),
            },
        },
    };
    Ok(match options.force {
        Some(path) if path != automatic.path => PathDecision {
            path,
            reason: format!(
                "forced by the caller (automatic choice: {} — {})",
                automatic.path, automatic.reason
            ),
        },
        _ => automatic,
    })
}

/// The link under a [`Connection`], by path.
#[derive(Debug)]
#[non_exhaustive]
pub enum AnyLink<B: AsRef<[u8]> = Vec<u8>> {
    HostBounce(RingLink<ShmWindow, B>),
    BarP2p(RingLink<BarWindow, B>),
    /// Boxed: a verbs queue carries its completion buffers inline.
    Rdma(Box<RdmaLink<VerbsQueue, B>>),
    /// Boxed: its medium's buffers and state are as large.
    Tcp(Box<TcpLink<B>>),
}

/// A link to the peer over the path [`connect`] picked. `B` is the type of
/// the messages handed to [`Connection::send`] (`Arc<[u8]>` sends the same
/// bytes many times without copying them first).
#[derive(Debug)]
pub struct Connection<B: AsRef<[u8]> = Vec<u8>> {
    pub link: AnyLink<B>,
    pub decision: PathDecision,
}

macro_rules! each_link {
    ($self:expr, $link:ident => $body:expr) => {
        match &mut $self.link {
            AnyLink::HostBounce($link) => $body,
            AnyLink::BarP2p($link) => $body,
            AnyLink::Rdma($link) => $body,
            AnyLink::Tcp($link) => $body,
        }
    };
}

macro_rules! each_link_ref {
    ($self:expr, $link:ident => $body:expr) => {
        match &$self.link {
            AnyLink::HostBounce($link) => $body,
            AnyLink::BarP2p($link) => $body,
            AnyLink::Rdma($link) => $body,
            AnyLink::Tcp($link) => $body,
        }
    };
}

impl<B: AsRef<[u8]>> Connection<B> {
    /// A link set up on the path `decision` chose; the decision gains
    /// what only the link knows (a TCP link's socket buffers).
    pub(crate) fn new(link: AnyLink<B>, mut decision: PathDecision) -> Connection<B> {
        if let AnyLink::Tcp(link) = &link {
            let medium = link.medium();
            decision.reason = format!("{}; {}", decision.reason, medium.socket_buffers());
            // Unprivileged, the kernel grants at most net.core.wmem_max and
            // rmem_max; it reports twice what it grants.
            if let (SocketBuffers::Fixed(asked), Ok((send, recv))) =
                (medium.socket_buffers(), medium.buffer_sizes())
                && send.min(recv) / 2 < asked
            {
                decision.reason.push_str(&format!(
                    " asked, {} send and {} receive granted (net.core.wmem_max, rmem_max)",
                    send / 2,
                    recv / 2
                ));
            }
        }
        Connection { link, decision }
    }

    /// The engine's counters, without copying them.
    pub fn engine_stats(&self) -> &Stats {
        each_link_ref!(self, link => link.engine().stats())
    }

    /// Makes queued message `id` ask for an acknowledgement before its
    /// last packets ([`Engine::ack_before_tail`](barlink_transport::engine::Engine::ack_before_tail)).
    pub fn ack_before_tail(&mut self, id: MessageId) -> bool {
        each_link!(self, link => link.ack_before_tail(id))
    }

    /// The offset of the first byte of queued message `id` the link may
    /// still read ([`Engine::needed_from`](barlink_transport::engine::Engine::needed_from)).
    pub fn needed_from(&self, id: MessageId) -> Option<u64> {
        each_link_ref!(self, link => link.engine().needed_from(id))
    }

    /// Data packets whose payload the RDMA adapter read in place from send
    /// memory (`barlink::rdma::SendMemory`), and their payload bytes; zero
    /// on other paths, where a registered payload goes into the ring in the
    /// one copy the CRC takes anyway.
    pub fn sent_in_place(&self) -> (u64, u64) {
        match &self.link {
            AnyLink::Rdma(link) => {
                let stats = link.medium().stats();
                (stats.writes_in_place, stats.bytes_in_place)
            }
            _ => (0, 0),
        }
    }

    /// Payload bytes the peer may send ahead of this side's delivery (the
    /// credit this side grants: its receive window's packets, full): a
    /// receiver that lends targets ahead needs that many bytes of them
    /// lent for every message in flight to land in one.
    pub fn recv_window_bytes(&self) -> usize {
        each_link_ref!(self, link => {
            let config = link.engine().config();
            (config.recv_window as usize).saturating_mul(config.max_payload_len() as usize)
        })
    }

    /// Delivered messages waiting to be taken.
    pub fn messages_ready(&self) -> usize {
        each_link_ref!(self, link => link.engine().messages_ready())
    }

    /// The peer's session (its epoch), once heard from: it changes when the
    /// peer restarts.
    pub fn peer_epoch(&self) -> Option<u32> {
        each_link_ref!(self, link => link.engine().peer_epoch())
    }

    /// The id the next message handed to the caller carries, if the link
    /// knows it yet: what a combining target names (see
    /// `Engine::next_message_id`).
    pub fn next_message_id(&self) -> Option<MessageId> {
        each_link_ref!(self, link => link.engine().next_message_id())
    }

    /// Whether the two sides have heard each other (each knows the other's
    /// session), so a close reaches the peer.
    pub fn is_connected(&self) -> bool {
        each_link_ref!(self, link => link.engine().is_connected())
    }

    /// Queues a message, waiting at most `timeout` for room.
    pub fn send(&mut self, data: B, timeout: Duration) -> Result<(), IoError> {
        each_link!(self, link => link.send_blocking(data, timeout).map(|_| ()))
    }

    /// Queues a message without waiting or driving the link;
    /// `Err(SendError::QueueFull)` gives it back (drive the link, retry).
    /// The engine holds `data` until the peer acknowledged the message.
    pub fn try_send(&mut self, data: B) -> Result<MessageId, SendError<B>> {
        each_link!(self, link => link.send(data))
    }

    /// A delivered message if one is ready (after one round of progress).
    pub fn try_recv(&mut self) -> Result<Option<Vec<u8>>, IoError> {
        each_link!(self, link => link.try_recv())
    }

    /// Gives a received message's buffer back for reuse (no allocation,
    /// no page faults for the next message of its size).
    pub fn recycle(&mut self, buf: Vec<u8>) {
        each_link!(self, link => link.recycle(buf))
    }

    /// Lends `target` for a coming message to land in, with no copy after
    /// the checked one out of the medium (see `Engine::post_recv`). Take
    /// messages with [`Connection::try_recv_delivery`].
    pub fn post_recv(&mut self, target: Box<dyn RecvTarget>) -> PostId {
        each_link!(self, link => link.post_recv(target))
    }

    /// Takes back a posted target that no delivered message was handed
    /// over in; after this the link never touches it again.
    pub fn unpost_recv(&mut self, id: PostId) -> Option<PostedRecv> {
        each_link!(self, link => link.unpost_recv(id))
    }

    /// Takes back every posted target not handed over yet: before the
    /// connection is closed somewhere the targets' owner cannot follow.
    pub fn unpost_all(&mut self) -> Vec<PostedRecv> {
        each_link!(self, link => link.unpost_all())
    }

    /// A delivered message if one is ready (after one round of progress),
    /// in a posted target or in a buffer of the link's.
    pub fn try_recv_delivery(&mut self) -> Result<Option<Delivery>, IoError> {
        each_link!(self, link => link.try_recv_delivery())
    }

    /// A delivered message if one is ready now, without a round of
    /// progress (a caller that drives the link with
    /// [`Connection::progress`] takes what the round brought in).
    pub fn take_delivery(&mut self) -> Option<Delivery> {
        each_link!(self, link => link.take_delivery())
    }

    /// The next delivered message, wherever it landed, waiting at most
    /// `timeout`.
    pub fn recv_delivery(&mut self, timeout: Duration) -> Result<Delivery, IoError> {
        each_link!(self, link => link.recv_delivery(timeout))
    }

    /// Messages the peer acknowledged completely, so far; messages
    /// complete in the order they were queued.
    pub fn completed(&mut self) -> u64 {
        each_link!(self, link => link.completed())
    }

    /// Keeps the buffers of sends the engine is done with for
    /// [`Connection::sent_back_mut`] (see
    /// [`barlink_transport::link::Link::keep_sent_buffers`]).
    pub fn keep_sent_buffers(&mut self) {
        each_link!(self, link => link.keep_sent_buffers())
    }

    /// The sends the engine let go of and not yet taken, oldest first, to
    /// take in place (see
    /// [`barlink_transport::link::Link::sent_back_mut`]).
    pub fn sent_back_mut(&mut self) -> Option<&mut std::collections::VecDeque<SentBack<B>>> {
        each_link!(self, link => link.sent_back_mut())
    }

    /// Whether a send's buffer waits to be taken.
    pub fn has_sent_back(&mut self) -> bool {
        each_link!(self, link => link.has_sent_back())
    }

    /// Why the link can carry no more messages, if it cannot (the peer
    /// was lost, closed, or a send failed). `progress` records such an
    /// end without returning it: a caller waiting on
    /// [`Connection::completed`] asks here.
    pub fn check_open(&mut self) -> Result<(), IoError> {
        each_link!(self, link => link.check_open())
    }

    /// Whether a queued message has packets that never went out (waiting
    /// for the window, the peer's credit, or the next round of progress).
    pub fn has_unsent(&mut self) -> bool {
        each_link!(self, link => link.engine().has_unsent())
    }

    /// Whether this side holds messages its caller has not received yet
    /// (delivered, being assembled, or buffered ahead of a gap): they hold
    /// the credit this side grants, so a peer sending more waits for this
    /// side's caller to receive.
    pub fn holds_unreceived(&mut self) -> bool {
        each_link!(self, link => link.engine().holds_unreceived())
    }

    /// Drives the link until every queued message went out at least once.
    pub fn push(&mut self, timeout: Duration) -> Result<(), IoError> {
        each_link!(self, link => link.push(timeout))
    }

    /// The next message, waiting at most `timeout`.
    pub fn recv(&mut self, timeout: Duration) -> Result<Vec<u8>, IoError> {
        each_link!(self, link => link.recv(timeout))
    }

    /// The next message into `buf`, whose memory it is assembled in where
    /// the medium allows (a ring; see
    /// [`barlink_transport::link::Link::recv_into`]); its length. On an
    /// error `buf` is empty.
    pub fn recv_into(&mut self, buf: &mut Vec<u8>, timeout: Duration) -> Result<usize, IoError> {
        each_link!(self, link => link.recv_into(buf, timeout))
    }

    /// Waits until every queued message is acknowledged.
    pub fn flush(&mut self, timeout: Duration) -> Result<(), IoError> {
        each_link!(self, link => link.flush(timeout))
    }

    /// Closes in order: queued messages are still delivered.
    pub fn close(&mut self, timeout: Duration) -> Result<(), IoError> {
        each_link!(self, link => link.close(timeout))
    }

    /// Drives the link once (a caller that only sends or waits elsewhere
    /// should call this now and then).
    pub fn progress(&mut self) -> Result<bool, IoError> {
        each_link!(self, link => link.progress())
    }

    /// [`Connection::progress`] for a caller spinning while it waits:
    /// reads the clock only every few idle rounds, or when `fresh`; with
    /// `for_delivery`, a round takes in about 64 KiB of messages and
    /// returns early once it delivers one (see `Link::progress_waiting`).
    pub fn progress_waiting(&mut self, fresh: bool, for_delivery: bool) -> Result<bool, IoError> {
        each_link!(self, link => link.progress_waiting(fresh, for_delivery))
    }

    /// The engine's statistics.
    pub fn stats(&mut self) -> Stats {
        each_link!(self, link => link.engine().stats().clone())
    }
}

/// The window `bar` names, through the device's sysfs `resourceN` file.
fn open_bar(bar: &BarRef, root: &Path) -> Result<BarWindow, String> {
    let env = barlink_vfio::VfioEnv {
        sysfs_root: root.to_path_buf(),
        ..barlink_vfio::VfioEnv::default()
    };
    open_bar_range(
        &env,
        &bar.device,
        bar.bar,
        BarRoute::Sysfs,
        bar.offset,
        bar.len,
    )
    .map_err(|e| match e {
        BarOpenError::Range(e) => format!("BAR {} of {}: {e}", bar.bar, bar.device),
        e => format!("mapping BAR {} of {}: {e}", bar.bar, bar.device),
    })
}

/// The path chosen for a peer, and each remote medium's options with the
/// authentication setup will use.
pub(crate) struct Prepared {
    pub(crate) decision: PathDecision,
    pub(crate) rdma: RdmaLinkOptions,
    pub(crate) tcp: TcpLinkOptions,
}

impl fmt::Debug for Prepared {
    /// The decision only: the options hold the setup's keys.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prepared")
            .field("decision", &self.decision)
            .finish_non_exhaustive()
    }
}

/// Chooses the path ([`choose_path`]) and settles how setup with another
/// node is authenticated (unless asked otherwise by name), saying so in the
/// decision.
pub(crate) fn prepare(peer: &Peer, options: &ConnectOptions) -> Result<Prepared, ConnectError> {
    let mut decision = choose_path(peer, options)?;
    let mut rdma = RdmaLinkOptions {
        engine: options.engine.clone(),
        ..options.rdma.clone()
    };
    let mut tcp_options = TcpLinkOptions {
        engine: options.engine.clone(),
        encrypt: options.encrypt,
        ..options.tcp.clone()
    };
    if matches!(decision.path, PathKind::Rdma | PathKind::Tcp) {
        let configured = options.auth.clone().or_else(|| match decision.path {
            PathKind::Rdma => rdma.oob.auth.clone(),
            _ => tcp_options.channel.auth.clone(),
        });
        let auth = match configured {
            Some(auth) => auth,
            None => PeerAuth::from_environment().map_err(|error| ConnectError::Setup {
                decision: decision.clone(),
                detail: error.to_string(),
            })?,
        };
        decision.reason = format!("{}; setup {}", decision.reason, auth.describe());
        if decision.path == PathKind::Tcp {
            decision.reason.push_str(if options.encrypt {
                "; every packet sealed (AES-256-GCM)"
            } else {
                "; packets not encrypted (CRC-checked only)"
            });
        }
        rdma.oob.auth = Some(auth.clone());
        tcp_options.channel.auth = Some(auth);
    }
    check_reach(&decision, peer)?;
    Ok(Prepared {
        decision,
        rdma,
        tcp: tcp_options,
    })
}

/// Refuses a path that cannot reach the peer where it is.
fn check_reach(decision: &PathDecision, peer: &Peer) -> Result<(), ConnectError> {
    let failed = |detail: String| ConnectError::Setup {
        decision: decision.clone(),
        detail,
    };
    match (decision.path, peer) {
        (PathKind::HostBounce | PathKind::BarP2p, Peer::Local { .. })
        | (PathKind::Rdma, Peer::Remote { .. } | Peer::Rdma { .. })
        | (PathKind::Tcp, Peer::Remote { .. } | Peer::Tcp { .. }) => Ok(()),
        (path, Peer::Remote { .. } | Peer::Rdma { .. } | Peer::Tcp { .. }) => Err(failed(format!(
            "{path} cannot reach a peer on another node: only RDMA or TCP can"
        ))),
        (PathKind::Rdma | PathKind::Tcp, Peer::Local { .. }) => Err(failed(format!(
            "{} to a peer on this host needs its address: give {}://HOST:PORT",
            decision.path, decision.path
        ))),
    }
}

/// The ring configuration of a link over host memory.
pub(crate) fn local_config(options: &ConnectOptions) -> LinkConfig {
    LinkConfig {
        engine: options.engine.clone(),
        setup_timeout: options.setup_timeout,
        allow: options.allow.clone(),
        window_len: options.window_len,
        shm: options.shm.clone(),
        ..LinkConfig::default()
    }
}

/// The link over two BAR windows ([`ConnectOptions::bars`]); both sides
/// set it up the same way.
pub(crate) fn bar_link<B: AsRef<[u8]>>(
    options: &ConnectOptions,
    failed: impl Fn(String) -> ConnectError,
) -> Result<RingLink<BarWindow, B>, ConnectError> {
    let Some(bars) = &options.bars else {
        return Err(failed(
            "BAR P2P needs the two BAR windows (ConnectOptions::bars; own_bar and peer_bar in C and Python)".into(),
        ));
    };
    let own = open_bar(&bars.own, &options.sysfs_root).map_err(&failed)?;
    // Before the ring is laid out: a second link over a window in use
    // would reset the live link's ring under it.
    match own.claim_ring() {
        Ok(true) => {}
        Ok(false) => tracing::warn!(
            window = %bars.own,
            "the kernel refused a file lock on this BAR window: nothing stops another link from using it"
        ),
        Err(error) => {
            return Err(failed(format!(
                "BAR {} of {}: {error}",
                bars.own.bar, bars.own.device
            )));
        }
    }
    let peer_window = open_bar(&bars.peer, &options.sysfs_root).map_err(&failed)?;
    let place = PathBuf::from(format!("BAR {} of {}", bars.peer.bar, bars.peer.device));
    pair_windows(
        own,
        peer_window,
        options.engine.clone(),
        options.setup_timeout,
        &place,
    )
    .map_err(|e| failed(e.to_string()))
}

/// Picks the path to `peer` ([`choose_path`]), sets up the link over it and
/// returns it with the decision. [`Role::Accept`] takes one link; a
/// [`crate::Listener`] takes many.
pub fn connect<B: AsRef<[u8]>>(
    peer: &Peer,
    role: Role,
    options: &ConnectOptions,
) -> Result<Connection<B>, ConnectError> {
    if role == Role::Accept {
        return crate::Listener::bind(peer, options)?.accept();
    }
    let Prepared {
        decision,
        mut rdma,
        tcp: mut tcp_options,
    } = prepare(peer, options)?;
    // Setup with another node ends within the setup timeout: connection
    // attempts, authentication and the hello alike.
    rdma.oob = rdma.oob.ending_within(options.setup_timeout);
    tcp_options.channel = tcp_options.channel.ending_within(options.setup_timeout);
    tracing::info!(path = %decision.path, reason = %decision.reason, ?role, "path chosen");
    let failed = |detail: String| ConnectError::Setup {
        decision: decision.clone(),
        detail,
    };
    let link = match (decision.path, peer) {
        (PathKind::HostBounce, Peer::Local { name }) => AnyLink::HostBounce(
            barlink_transport::link::connect(name, &local_config(options))
                .map_err(|e: SetupError| failed(e.to_string()))?,
        ),
        (PathKind::BarP2p, _) => AnyLink::BarP2p(bar_link(options, failed)?),
        (PathKind::Rdma, Peer::Remote { addr } | Peer::Rdma { addr }) => AnyLink::Rdma(Box::new(
            verbs_queue::connect(addr.as_str(), &rdma).map_err(|e| failed(e.to_string()))?,
        )),
        (PathKind::Tcp, Peer::Remote { addr } | Peer::Tcp { addr }) => AnyLink::Tcp(Box::new(
            tcp::connect(addr.as_str(), &tcp_options).map_err(|e| failed(e.to_string()))?,
        )),
        _ => unreachable!("prepare refused a path that cannot reach the peer"),
    };
    Ok(Connection::new(link, decision))
}
