//! Connection setup out of band, over TCP, in the manner of perftest: the
//! server listens (port [`DEFAULT_PORT`]), the client connects (with a
//! timeout per attempt and a bounded number of retries), and the two
//! authenticate each other ([`OobStream::authenticate`], with a pre-shared
//! key or pinned public keys: `barlink_transport::auth`) before anything
//! else. Then each side sends a fixed-layout, versioned, checksummed
//! [`Hello`] describing its queue pair and its receive ring, sealed by the
//! session. After both queue pairs reached RTS, [`OobStream::ready`]
//! trades one sealed byte each way, so that neither side writes before the
//! other's receives are posted.
//!
//! Everything read from the peer is untrusted: a hello is checked field by
//! field before use, and a bad one is a typed [`OobError`] that says what
//! to fix. Every read, write, accept and connect has a deadline.
//!
//! # Hello layout (little-endian, 96 bytes)
//! ```text
//!   0 magic "BLRH"   4 version u16   6 length u16 (96)
//!   8 epoch u32     12 qpn u32      16 psn u32
//!  20 lid u16       22 gid index u8 23 flags u8 (bit 0: CRC on)
//!  24 gid [16]
//!  40 ring addr u64 48 ring rkey u32 52 ring slots u32 56 slot size u32
//!  60 credit rkey u32                64 credit addr u64
//!  72 engine MTU u32                 76 path MTU u16  78 reserved u16 (0)
//!  80 max message length u64
//!  88 reserved u32 (0)               92 CRC-32C of bytes 0..92
//! ```
#![forbid(unsafe_code)]

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use barlink_transport::auth::{AuthError, FrameStream, PeerAuth};
use barlink_transport::crc::crc32c;
use barlink_transport::tcp::channel::{
    self, Channel, ChannelError, ChannelListener, ChannelOptions,
};

use crate::link::{MAX_SLOTS, RingShape};

/// The TCP port a server listens on unless told otherwise (perftest's).
pub const DEFAULT_PORT: u16 = 18515;
/// `b"BLRH"` as a little-endian u32.
pub const HELLO_MAGIC: u32 = u32::from_le_bytes(*b"BLRH");
/// The hello layout (and link protocol) this build speaks. 3: the credit
/// word carries the consumed count and a CRC-32C of it
/// (`link::encode_credit`). 4: the hello follows authentication, framed
/// and sealed.
pub const HELLO_VERSION: u16 = 4;
/// Bytes of a hello.
pub const HELLO_LEN: usize = 96;
/// The byte each side sends once its queue pair is ready for traffic.
const READY: u8 = b'R';
/// Most bytes a peer's receive ring may claim (1 TiB): a bound on what an
/// untrusted hello can make this side compute with.
const MAX_RING_BYTES: u64 = 1 << 40;
/// QP numbers and PSNs are 24-bit.
const MAX_24: u32 = 0x00FF_FFFF;

/// What one side tells the other: its queue pair, its receive ring, and
/// the engine settings both must share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The sender's session (its engine epoch; +1 per restart). Never 0.
    pub epoch: u32,
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// First packet sequence number (24 bits).
    pub psn: u32,
    /// Port LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Index of the GID in the sender's port table.
    pub gid_index: u8,
    /// The GID (RoCE: an IPv6 or IPv4-mapped address).
    pub gid: [u8; 16],
    /// The sender's active path MTU in bytes (256..=4096, a power of two).
    pub path_mtu: u16,
    /// Address of the sender's receive region (control block, then slots).
    pub ring_addr: u64,
    /// Its rkey.
    pub ring_rkey: u32,
    /// The shape of the receive ring.
    pub ring: RingShape,
    /// Address of the word the peer writes its consumed count into.
    pub credit_addr: u64,
    /// Its rkey.
    pub credit_rkey: u32,
    /// The engine's MTU (a whole packet, header included).
    pub engine_mtu: u32,
    /// The engine's largest message.
    pub max_message_len: u64,
    /// Whether the engine takes a CRC on every packet.
    pub crc: bool,
}

impl Hello {
    /// The 96 bytes on the wire.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&HELLO_VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&(HELLO_LEN as u16).to_le_bytes());
        b[8..12].copy_from_slice(&self.epoch.to_le_bytes());
        b[12..16].copy_from_slice(&self.qpn.to_le_bytes());
        b[16..20].copy_from_slice(&self.psn.to_le_bytes());
        b[20..22].copy_from_slice(&self.lid.to_le_bytes());
        b[22] = self.gid_index;
        b[23] = u8::from(self.crc);
        b[24..40].copy_from_slice(&self.gid);
        b[40..48].copy_from_slice(&self.ring_addr.to_le_bytes());
        b[48..52].copy_from_slice(&self.ring_rkey.to_le_bytes());
        b[52..56].copy_from_slice(&self.ring.slots.to_le_bytes());
        b[56..60].copy_from_slice(&self.ring.slot_size.to_le_bytes());
        b[60..64].copy_from_slice(&self.credit_rkey.to_le_bytes());
        b[64..72].copy_from_slice(&self.credit_addr.to_le_bytes());
        b[72..76].copy_from_slice(&self.engine_mtu.to_le_bytes());
        b[76..78].copy_from_slice(&self.path_mtu.to_le_bytes());
        b[80..88].copy_from_slice(&self.max_message_len.to_le_bytes());
        let crc = crc32c(&b[..92]);
        b[92..96].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses and checks a hello that a peer sent. Checks, in order: the
    /// length, magic, version, stated length, checksum, reserved bytes,
    /// then each field's range.
    pub fn decode(bytes: &[u8]) -> Result<Hello, OobError> {
        if bytes.len() != HELLO_LEN {
            return Err(OobError::BadHello(HelloError::Length {
                found: bytes.len(),
            }));
        }
        let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"));
        let bad = |error| Err(OobError::BadHello(error));
        let magic = u32_at(0);
        if magic != HELLO_MAGIC {
            return bad(HelloError::Magic { found: magic });
        }
        let version = u16_at(4);
        if version != HELLO_VERSION {
            return bad(HelloError::Version { found: version });
        }
        let stated = u16_at(6);
        if stated as usize != HELLO_LEN {
            return bad(HelloError::Length {
                found: stated as usize,
            });
        }
        let carried = u32_at(92);
        let computed = crc32c(&bytes[..92]);
        if carried != computed {
            return bad(HelloError::Checksum { carried, computed });
        }
        if bytes[23] & !1 != 0 || u16_at(78) != 0 || u32_at(88) != 0 {
            return bad(HelloError::Field {
                field: "reserved",
                value: u64::from(bytes[23] & !1) | u64::from(u16_at(78)) | u64::from(u32_at(88)),
                why: "reserved bits must be zero (a newer peer?)",
            });
        }
        let hello = Hello {
            epoch: u32_at(8),
            qpn: u32_at(12),
            psn: u32_at(16),
            lid: u16_at(20),
            gid_index: bytes[22],
            crc: bytes[23] & 1 != 0,
            gid: bytes[24..40].try_into().expect("16"),
            ring_addr: u64_at(40),
            ring_rkey: u32_at(48),
            ring: RingShape {
                slots: u32_at(52),
                slot_size: u32_at(56),
            },
            credit_rkey: u32_at(60),
            credit_addr: u64_at(64),
            engine_mtu: u32_at(72),
            path_mtu: u16_at(76),
            max_message_len: u64_at(80),
        };
        hello.validate()?;
        Ok(hello)
    }

    /// Checks each field's range (what [`Hello::decode`] applies after the
    /// framing checks; also useful before sending one's own).
    pub fn validate(&self) -> Result<(), OobError> {
        let field = |field, value: u64, why| {
            Err(OobError::BadHello(HelloError::Field { field, value, why }))
        };
        if self.epoch == 0 {
            return field("epoch", 0, "epoch 0 names no session");
        }
        if self.qpn == 0 || self.qpn > MAX_24 {
            return field(
                "qpn",
                u64::from(self.qpn),
                "a QP number is 24 bits and not 0",
            );
        }
        if self.psn > MAX_24 {
            return field("psn", u64::from(self.psn), "a PSN is 24 bits");
        }
        if !matches!(self.path_mtu, 256 | 512 | 1024 | 2048 | 4096) {
            return field(
                "path MTU",
                u64::from(self.path_mtu),
                "the path MTU is 256, 512, 1024, 2048 or 4096",
            );
        }
        if !(2..=MAX_SLOTS).contains(&self.ring.slots) {
            return field(
                "ring slots",
                u64::from(self.ring.slots),
                "a ring has 2 to 65536 slots",
            );
        }
        if u64::from(self.engine_mtu) < barlink_transport::engine::MIN_MTU as u64
            || u64::from(self.engine_mtu) > barlink_transport::engine::MAX_MTU as u64
        {
            return field(
                "engine MTU",
                u64::from(self.engine_mtu),
                "outside the engine's MTU range",
            );
        }
        if self.ring.slot_size < self.engine_mtu {
            return Err(OobError::BadHello(HelloError::SlotTooSmall {
                slot_size: self.ring.slot_size,
                mtu: self.engine_mtu,
            }));
        }
        if self.ring.validate().is_err() {
            return field(
                "slot size",
                u64::from(self.ring.slot_size),
                "a slot size is a multiple of 64",
            );
        }
        if self.ring.region_len() as u64 > MAX_RING_BYTES {
            return field(
                "ring size",
                self.ring.region_len() as u64,
                "a ring of more than 1 TiB",
            );
        }
        if self
            .ring_addr
            .checked_add(self.ring.region_len() as u64)
            .is_none()
        {
            return field(
                "ring address",
                self.ring_addr,
                "the ring would wrap around the address space",
            );
        }
        if self.max_message_len == 0 {
            return field("max message length", 0, "must be at least 1");
        }
        Ok(())
    }

    /// Checks that a peer's hello agrees with this side's on what both
    /// engines must share (MTU, largest message, CRC) and on the slot size
    /// (both sides size slots from the MTU; a peer's larger slots would
    /// only make this side register a larger staging area for them).
    pub fn check_agreement(&self, peer: &Hello) -> Result<(), OobError> {
        let mismatch = |what, ours: u64, theirs: u64| {
            Err(OobError::BadHello(HelloError::Mismatch {
                what,
                ours,
                theirs,
            }))
        };
        if self.engine_mtu != peer.engine_mtu {
            return mismatch(
                "engine MTU",
                u64::from(self.engine_mtu),
                u64::from(peer.engine_mtu),
            );
        }
        if self.max_message_len != peer.max_message_len {
            return mismatch(
                "max message length",
                self.max_message_len,
                peer.max_message_len,
            );
        }
        if self.crc != peer.crc {
            return mismatch("CRC", u64::from(self.crc), u64::from(peer.crc));
        }
        if self.ring.slot_size != peer.ring.slot_size {
            return mismatch(
                "ring slot size",
                u64::from(self.ring.slot_size),
                u64::from(peer.ring.slot_size),
            );
        }
        Ok(())
    }
}

/// What is wrong with a peer's hello.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HelloError {
    /// Not 96 bytes.
    Length { found: usize },
    /// Not a barlink hello.
    Magic { found: u32 },
    /// Another hello version.
    Version { found: u16 },
    /// The checksum does not match.
    Checksum { carried: u32, computed: u32 },
    /// A field out of range.
    Field {
        field: &'static str,
        value: u64,
        why: &'static str,
    },
    /// The peer's slots cannot hold its own packets.
    SlotTooSmall { slot_size: u32, mtu: u32 },
    /// The two sides' engines disagree.
    Mismatch {
        what: &'static str,
        ours: u64,
        theirs: u64,
    },
}

impl fmt::Display for HelloError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HelloError::Length { found } => write!(
                f,
                "a hello of {found} bytes (this build's are {HELLO_LEN}): run the same barlink version on both sides"
            ),
            HelloError::Magic { found } => write!(
                f,
                "not a barlink hello (magic {found:#010x}): is something else listening on that port?"
            ),
            HelloError::Version { found } => write!(
                f,
                "the peer speaks hello version {found}, this build {HELLO_VERSION}: run the same barlink version on both sides"
            ),
            HelloError::Checksum { carried, computed } => write!(
                f,
                "hello checksum {carried:#010x} does not match its bytes ({computed:#010x}): corrupted on the way"
            ),
            HelloError::Field { field, value, why } => {
                write!(f, "the peer's {field} is {value}: {why}")
            }
            HelloError::SlotTooSmall { slot_size, mtu } => write!(
                f,
                "the peer's ring slots hold {slot_size} bytes, less than its MTU of {mtu}: the peer is misconfigured"
            ),
            HelloError::Mismatch { what, ours, theirs } => write!(
                f,
                "{what} differs: {ours} here, {theirs} at the peer: configure both sides alike"
            ),
        }
    }
}

/// Why the out-of-band setup failed: the channel (connecting,
/// authenticating, a deadline, the peer gone), or the peer's hello.
#[derive(Debug)]
#[non_exhaustive]
pub enum OobError {
    /// Connecting, authenticating or talking to the peer failed.
    Channel(ChannelError),
    /// The peer's hello is unusable.
    BadHello(HelloError),
}

impl From<AuthError> for OobError {
    fn from(error: AuthError) -> Self {
        OobError::Channel(ChannelError::Auth(error))
    }
}

impl From<ChannelError> for OobError {
    fn from(error: ChannelError) -> Self {
        OobError::Channel(error)
    }
}

impl fmt::Display for OobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OobError::Channel(error) => error.fmt(f),
            OobError::BadHello(error) => write!(f, "connection setup: {error}"),
        }
    }
}

impl std::error::Error for OobError {}

/// Timeouts, retries and authentication of the out-of-band setup.
pub type OobOptions = ChannelOptions;

/// The server side: listens for one client at a time.
#[derive(Debug)]
pub struct OobListener {
    listener: ChannelListener,
}

impl OobListener {
    /// Listens on `addr` (e.g. `0.0.0.0:18515`; port 0 picks one).
    pub fn bind(addr: impl ToSocketAddrs) -> Result<OobListener, OobError> {
        Ok(OobListener {
            listener: ChannelListener::bind(addr)?,
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> Result<SocketAddr, OobError> {
        Ok(self.listener.local_addr()?)
    }

    /// Waits at most `timeout` for a client.
    pub fn accept(&self, timeout: Duration, options: &OobOptions) -> Result<OobStream, OobError> {
        Ok(OobStream {
            channel: self.listener.accept(timeout, options)?,
        })
    }

    /// Waits at most `timeout` for a client that authenticates as `auth`
    /// requires; those that fail are logged and dropped, having received
    /// nothing but the refusal ([`ChannelListener::accept_authenticated`]).
    pub fn accept_authenticated(
        &self,
        timeout: Duration,
        options: &OobOptions,
        auth: &PeerAuth,
    ) -> Result<OobStream, OobError> {
        Ok(OobStream {
            channel: self.listener.accept_authenticated(timeout, options, auth)?,
        })
    }
}

/// The client side: connects to `addr`, retrying while nobody listens
/// yet, each attempt bounded by `options.connect_timeout`.
pub fn connect(addr: impl ToSocketAddrs, options: &OobOptions) -> Result<OobStream, OobError> {
    Ok(OobStream {
        channel: channel::connect(addr, options)?,
    })
}

/// A connected setup channel that carries the hello.
#[derive(Debug)]
pub struct OobStream {
    channel: Channel,
}

impl FrameStream for OobStream {
    type Error = OobError;

    fn send_bytes(&mut self, bytes: &[u8]) -> Result<(), OobError> {
        Ok(self.channel.send_bytes(bytes)?)
    }

    fn recv_bytes(&mut self, buf: &mut [u8]) -> Result<(), OobError> {
        Ok(self.channel.recv_bytes(buf)?)
    }
}

impl OobStream {
    /// The peer's address.
    pub fn peer_addr(&self) -> Result<SocketAddr, OobError> {
        Ok(self.channel.peer_addr()?)
    }

    /// Proves to the peer, and checks, who each side is (`initiator`: the
    /// side that connected). Nothing about this host's rings is sent before
    /// it succeeds; on failure the peer is told it was refused.
    pub fn authenticate(&mut self, auth: &PeerAuth, initiator: bool) -> Result<(), OobError> {
        Ok(self.channel.authenticate(auth, initiator)?)
    }

    /// Whether the session is authenticated (false: `--insecure`).
    pub fn is_authenticated(&self) -> bool {
        self.channel.is_authenticated()
    }

    /// Sends `ours` and returns the peer's hello, checked, and checked to
    /// agree with `ours` on what both engines must share.
    pub fn exchange(&mut self, ours: &Hello) -> Result<Hello, OobError> {
        self.channel
            .send_sealed(&ours.encode(), "sending the hello")?;
        let bytes = self.channel.recv_sealed("waiting for the peer's hello")?;
        let peer = Hello::decode(&bytes)?;
        ours.check_agreement(&peer)?;
        Ok(peer)
    }

    /// Says this side is ready for traffic (its queue pair is in RTS, its
    /// receives are posted) and waits until the peer says the same.
    pub fn ready(&mut self) -> Result<(), OobError> {
        self.channel
            .send_sealed(&[READY], "sending the ready byte")?;
        let byte = self
            .channel
            .recv_sealed("waiting for the peer to be ready")?;
        if byte != [READY] {
            return Err(OobError::Channel(ChannelError::Protocol {
                detail: format!("expected the ready byte {READY:#04x}, got {byte:02x?}"),
            }));
        }
        Ok(())
    }

    /// Raw bytes to the peer (tests of hostile hellos).
    pub fn write_all(&mut self, bytes: &[u8], operation: &'static str) -> Result<(), OobError> {
        Ok(self.channel.write_all(bytes, operation)?)
    }

    /// Reads exactly `buf.len()` bytes within the I/O timeout.
    pub fn read_exact(&mut self, buf: &mut [u8], operation: &'static str) -> Result<(), OobError> {
        Ok(self.channel.read_exact(buf, operation)?)
    }
}

#[cfg(test)]
mod tests;
