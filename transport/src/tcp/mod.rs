//! Links between nodes over TCP, for machines without RDMA: the same
//! engine and packets (a CRC on each, retransmission, peer-loss detection),
//! carried by one TCP connection ([`TcpMedium`]), sealed end to end when
//! asked ([`TcpLinkOptions::encrypt`]).
//!
//! Setup runs over the [`channel`]: connect (with retries) or accept,
//! mutual authentication ([`crate::auth`]: a pre-shared key or pinned
//! keys; without one only by name, `PeerAuth::Insecure`), then a sealed
//! 32-byte hello each way that both engines must agree on. The packets
//! then travel on the same connection, so an encrypted link reuses the
//! handshake's session keys.
//!
//! # Hello layout (little-endian, 32 bytes)
//! ```text
//!   0 magic "BLTH"   4 version u16   6 flags u16 (bit 0: CRC, bit 1: encrypt,
//!                                                   bit 2: resuming a link)
//!   8 engine MTU u32                12 reserved u32 (0)
//!  16 max message length u64        24 link id u64 (the accepting side's)
//! ```
//!
//! # A dropped connection
//! With [`TcpLinkOptions::reconnect`] (the default), a connection that
//! fails (reset, closed without the engine's close, a frame header or a
//! sealed record that does not check) is replaced: the connecting side
//! dials again and the accepting side takes a new connection on the
//! listener it kept, both authenticate as at setup, and a sealed hello
//! with the link's id (`resume` set) proves it is the same link. The
//! engine retransmits what was lost and drops what arrives twice, so
//! nothing is lost or duplicated; if no connection comes back within the
//! engine's peer timeout, the link ends with `PeerLost`.
//! ```text
//! ```
#![forbid(unsafe_code)]

mod acceptor;
pub mod buffers;
pub mod channel;
mod lobby;
mod medium;
mod resume;

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

pub use buffers::SocketBuffers;
pub use channel::{Channel, ChannelError, ChannelListener, ChannelOptions};
pub use medium::{
    FRAME_HEADER_LEN, MAX_RECORD_PLAINTEXT, MAX_SEALED_PACKET, RECORD_HEADER_LEN, TcpMedium,
    TcpStats, frame_header, hand_frame, hand_record, next_frame, open_record,
};

use crate::auth::PeerAuth;
use crate::engine::EngineConfig;
use crate::link::{Link, MediumError, SetupError};
use acceptor::{Acceptor, Want};
use resume::{Rejoin, Resume};

/// The port a TCP link listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 18_616;
/// `b"BLTH"`.
pub const HELLO_MAGIC: [u8; 4] = *b"BLTH";
/// The TCP link protocol this build speaks. Version 2: a sealed record
/// holds whole frames.
pub const HELLO_VERSION: u16 = 2;
/// Bytes of a hello.
pub const HELLO_LEN: usize = 32;
/// Largest packet a TCP link carries (a bound on what a peer's frame may
/// make this side buffer).
pub const MAX_PACKET: usize = 16 << 20;

/// A link over TCP.
pub type TcpLink<B = Vec<u8>> = Link<TcpMedium, B>;

/// How a TCP link is set up.
#[derive(Debug, Clone)]
pub struct TcpLinkOptions {
    /// Connect retries, timeouts and authentication.
    pub channel: ChannelOptions,
    /// The engine (both sides must agree on MTU, largest message and CRC).
    pub engine: EngineConfig,
    /// Seal every packet (authenticated encryption with the handshake's
    /// keys). Both sides must agree; it needs authentication.
    pub encrypt: bool,
    /// This side's session (+1 per restart).
    pub epoch: u32,
    /// Replace a dropped connection and go on (see the module
    /// documentation); without it a dropped connection ends the link.
    pub reconnect: bool,
    /// `SO_SNDBUF` and `SO_RCVBUF` of every connection, in bytes, for a
    /// path whose bandwidth-delay product is beyond the kernel's
    /// autotuning maximum. `None`: what `BARLINK_TCP_SOCKET_BUFFER` says,
    /// else autotuning ([`buffers`]).
    pub socket_buffer: Option<usize>,
}

impl Default for TcpLinkOptions {
    /// 128 KiB packets (fewer frames and system calls per byte), plain.
    fn default() -> Self {
        TcpLinkOptions {
            channel: ChannelOptions::default(),
            engine: EngineConfig {
                mtu: 128 << 10,
                ..EngineConfig::default()
            },
            encrypt: false,
            epoch: 1,
            reconnect: true,
            socket_buffer: None,
        }
    }
}

/// Why a TCP link could not be set up.
#[derive(Debug)]
#[non_exhaustive]
pub enum TcpSetupError {
    /// Connecting, authenticating or the hello failed.
    Channel(ChannelError),
    /// The peer's hello is unusable or disagrees with ours.
    Hello { detail: String },
    /// The options cannot work.
    Options { detail: String },
    /// The link could not be put together.
    Link(SetupError),
}

impl fmt::Display for TcpSetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TcpSetupError::Channel(error) => error.fmt(f),
            TcpSetupError::Hello { detail } => write!(f, "TCP link setup: {detail}"),
            TcpSetupError::Options { detail } => write!(f, "TCP link options: {detail}"),
            TcpSetupError::Link(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for TcpSetupError {}

impl From<ChannelError> for TcpSetupError {
    fn from(error: ChannelError) -> Self {
        TcpSetupError::Channel(error)
    }
}

impl From<SetupError> for TcpSetupError {
    fn from(error: SetupError) -> Self {
        TcpSetupError::Link(error)
    }
}

/// What each side tells the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpHello {
    pub engine_mtu: u32,
    pub max_message_len: u64,
    pub crc: bool,
    pub encrypt: bool,
    /// Taking an existing link back after a dropped connection.
    pub resume: bool,
    /// Names the link: the accepting side's random id.
    pub link_id: u64,
}

impl TcpHello {
    fn of(options: &TcpLinkOptions) -> TcpHello {
        TcpHello {
            engine_mtu: engine_config(options).mtu as u32,
            max_message_len: options.engine.max_message_len,
            crc: options.engine.crc,
            encrypt: options.encrypt,
            resume: false,
            link_id: random_id(),
        }
    }

    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut bytes = [0u8; HELLO_LEN];
        bytes[..4].copy_from_slice(&HELLO_MAGIC);
        bytes[4..6].copy_from_slice(&HELLO_VERSION.to_le_bytes());
        let flags =
            u16::from(self.crc) | (u16::from(self.encrypt) << 1) | (u16::from(self.resume) << 2);
        bytes[6..8].copy_from_slice(&flags.to_le_bytes());
        bytes[8..12].copy_from_slice(&self.engine_mtu.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.max_message_len.to_le_bytes());
        bytes[24..32].copy_from_slice(&self.link_id.to_le_bytes());
        bytes
    }

    /// A peer's hello, checked field by field.
    pub fn decode(bytes: &[u8]) -> Result<TcpHello, String> {
        if bytes.len() != HELLO_LEN {
            return Err(format!(
                "a hello of {} bytes (this build's are {HELLO_LEN}): run the same barlink version on both sides",
                bytes.len()
            ));
        }
        if bytes[..4] != HELLO_MAGIC {
            return Err(format!(
                "not a barlink TCP hello (it begins {:02x?}): is an RDMA setup or something else on that port?",
                &bytes[..4]
            ));
        }
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        if version != HELLO_VERSION {
            return Err(format!(
                "the peer speaks TCP link version {version}, this build {HELLO_VERSION}: run the same barlink version on both sides"
            ));
        }
        let flags = u16::from_le_bytes([bytes[6], bytes[7]]);
        if flags & !0b111 != 0 || bytes[12..16] != [0; 4] {
            return Err("the hello's reserved bits are set".to_string());
        }
        let engine_mtu = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if !(256..=MAX_PACKET as u32).contains(&engine_mtu) {
            return Err(format!(
                "the peer's MTU is {engine_mtu}: a TCP link carries 256 B to {MAX_PACKET} B packets"
            ));
        }
        Ok(TcpHello {
            engine_mtu,
            max_message_len: u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes")),
            crc: flags & 1 != 0,
            encrypt: flags & 2 != 0,
            resume: flags & 4 != 0,
            link_id: u64::from_le_bytes(bytes[24..32].try_into().expect("8 bytes")),
        })
    }

    /// What the two sides must share.
    pub(crate) fn check_agreement(&self, peer: &TcpHello) -> Result<(), String> {
        if self.encrypt != peer.encrypt {
            let (on, off) = if self.encrypt {
                ("this side", "the peer")
            } else {
                ("the peer", "this side")
            };
            return Err(format!(
                "{on} encrypts and {off} does not (--encrypt on one side only): nothing is sent in the clear \
                 to a side that asked for encryption"
            ));
        }
        for (what, ours, theirs) in [
            (
                "the engine MTU",
                u64::from(self.engine_mtu),
                u64::from(peer.engine_mtu),
            ),
            (
                "the largest message",
                self.max_message_len,
                peer.max_message_len,
            ),
            ("the CRC setting", u64::from(self.crc), u64::from(peer.crc)),
        ] {
            if ours != theirs {
                return Err(format!(
                    "{what} differs: {ours} here, {theirs} at the peer: configure both sides alike"
                ));
            }
        }
        Ok(())
    }
}

/// The server side of TCP links: accepts any number of peers on one port,
/// and the links it accepted take their peers back on the same port.
#[derive(Debug)]
pub struct TcpServer {
    acceptor: Arc<Acceptor>,
}

impl TcpServer {
    /// Listens on `addr` (`0.0.0.0:18616`; port 0 picks one).
    pub fn bind(addr: impl ToSocketAddrs) -> Result<TcpServer, TcpSetupError> {
        Ok(TcpServer {
            acceptor: Arc::new(Acceptor::new(ChannelListener::bind(addr)?)),
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> Result<SocketAddr, TcpSetupError> {
        Ok(self.acceptor.listener().local_addr()?)
    }

    /// Waits at most `timeout` for a client that authenticates, then sets
    /// up the link, all of it within `timeout`. Clients that fail
    /// authentication are logged and dropped; the wait goes on.
    pub fn accept<B: AsRef<[u8]>>(
        &self,
        timeout: Duration,
        options: &TcpLinkOptions,
    ) -> Result<TcpLink<B>, TcpSetupError> {
        let (auth, buffers) = check_options(options)?;
        let channel_options = options.channel.clone().ending_within(timeout);
        let arrival = self
            .acceptor
            .next(Want::New, timeout, &channel_options, &auth)?
            .ok_or(ChannelError::Timeout {
                operation: "waiting for the peer to connect",
                after: timeout,
            })?;
        let rejoin = Rejoin::Reaccept {
            acceptor: Arc::clone(&self.acceptor),
        };
        let peer_hello = Some(arrival.hello);
        establish(
            arrival.channel,
            peer_hello,
            options,
            (auth, buffers),
            rejoin,
        )
    }
}

/// The client side: connects to `addr` (retrying as `options.channel`
/// says), authenticates, and sets up the link.
pub fn connect<B: AsRef<[u8]>>(
    addr: impl ToSocketAddrs,
    options: &TcpLinkOptions,
) -> Result<TcpLink<B>, TcpSetupError> {
    let (auth, buffers) = check_options(options)?;
    let mut channel = channel::connect(addr, &options.channel)?;
    channel.authenticate(&auth, true)?;
    let rejoin = Rejoin::Redial {
        addr: channel.peer_addr()?,
    };
    establish(channel, None, options, (auth, buffers), rejoin)
}

/// The authentication to use, and whether the options can work with it.
/// How setup authenticates and how big the connections' buffers are, or
/// why the options cannot work: refused before anyone is dialled or
/// waited for.
fn check_options(options: &TcpLinkOptions) -> Result<(PeerAuth, SocketBuffers), TcpSetupError> {
    let buffers = SocketBuffers::resolve(options.socket_buffer, |name| std::env::var(name).ok())
        .map_err(|detail| TcpSetupError::Options { detail })?;
    options
        .engine
        .validate()
        .map_err(|e| TcpSetupError::Options {
            detail: e.to_string(),
        })?;
    if options.engine.mtu > MAX_PACKET {
        return Err(TcpSetupError::Options {
            detail: format!(
                "an MTU of {} bytes; a TCP link carries at most {MAX_PACKET}",
                options.engine.mtu
            ),
        });
    }
    let auth = options.channel.resolve_auth()?;
    if options.encrypt && auth == PeerAuth::Insecure {
        return Err(TcpSetupError::Options {
            detail:
                "--encrypt needs authentication (a pre-shared key or pinned keys): encrypting to a \
                     peer nobody checked protects nothing"
                    .to_string(),
        });
    }
    Ok((auth, buffers))
}

/// The engine's configuration on this link: as asked, but a link that
/// encrypts carries packets of at most [`MAX_SEALED_PACKET`] (one sealed
/// record each).
pub fn engine_config(options: &TcpLinkOptions) -> EngineConfig {
    let mut engine = options.engine.clone();
    if options.encrypt {
        engine.mtu = engine.mtu.min(MAX_SEALED_PACKET);
    }
    engine
}

/// The hello both ways over the authenticated channel (the peer's already
/// read when the acceptor took the connection), then the medium on the
/// same connection.
fn establish<B: AsRef<[u8]>>(
    mut channel: Channel,
    peer_hello: Option<TcpHello>,
    options: &TcpLinkOptions,
    (auth, buffers): (PeerAuth, SocketBuffers),
    rejoin: Rejoin,
) -> Result<TcpLink<B>, TcpSetupError> {
    let mut ours = TcpHello::of(options);
    channel.send_sealed(&ours.encode(), "sending the TCP link hello")?;
    let peer = match peer_hello {
        Some(peer) => peer,
        None => {
            let bytes = channel.recv_sealed("waiting for the peer's TCP link hello")?;
            TcpHello::decode(&bytes).map_err(|detail| TcpSetupError::Hello { detail })?
        }
    };
    ours.check_agreement(&peer)
        .map_err(|detail| TcpSetupError::Hello { detail })?;
    if peer.resume {
        return Err(TcpSetupError::Hello {
            detail: "the peer tries to resume a link this side does not know".to_string(),
        });
    }
    if matches!(rejoin, Rejoin::Redial { .. }) {
        ours.link_id = peer.link_id;
    }
    let peer_key = channel.peer_key();
    let resume = options.reconnect.then(|| Resume {
        rejoin,
        peer_key,
        // Each attempt sets its own end; the setup's has passed by then.
        options: ChannelOptions {
            deadline: None,
            ..options.channel.clone()
        },
        auth,
        hello: ours,
    });
    let (stream, session) = channel.into_parts();
    let cipher = if options.encrypt { session } else { None };
    let engine = engine_config(options);
    let medium =
        TcpMedium::new(stream, engine.mtu, cipher, resume, buffers).map_err(|e: MediumError| {
            TcpSetupError::Hello {
                detail: e.to_string(),
            }
        })?;
    tracing::info!(
        peer = ?medium,
        mtu = engine.mtu,
        "TCP link set up"
    );
    Ok(Link::with_medium(medium, engine, options.epoch)?)
}

/// An id for a new link: distinct between links, not secret (it travels
/// sealed, and only an authenticated peer can name it).
fn random_id() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    crate::rng::SplitMix64::new(nanos ^ u64::from(std::process::id()).rotate_left(32)).next_u64()
}

#[cfg(test)]
mod tests;
