//! Links: an engine bound to a medium that carries its packets.
//!
//! A [`Link`] owns an [`Engine`] and a [`Medium`]. [`Link::progress`]
//! moves packets both ways; the blocking calls ([`Link::send_blocking`],
//! [`Link::recv`], [`Link::flush`]) drive it until done or until their
//! timeout, so nothing waits forever. Progress is driven by the caller's
//! thread (polling).
//!
//! A [`RingLink`] is a link over [`RingMedium`]: two windows, its own
//! receive window, which the peer writes packets into and which it reads,
//! and the peer's receive window, which it writes into and never reads
//! (except the control block, once, at setup). `barlink-rdma` provides a
//! medium whose packets travel as RDMA WRITE with immediate.
//!
//! [`connect`] and [`Listener`] set up a link between processes by name:
//! each side creates a memfd window and hands it to the other over a Unix
//! socket.
// Protocol code: no unsafe, ever (the crate only denies it, for window::mapping).
#![forbid(unsafe_code)]

mod connect;
pub mod credentials;
mod medium;
mod named;
mod thread;

pub use medium::{IndexStats, Intake, Medium, MediumError, REPUBLISH_EVERY, RepeatTimer};
pub use named::{NamedOptions, Side, connect_named, create_named_ring, pair_windows};
pub use thread::{ProgressOptions, ProgressThread};

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::Ordering;
use std::time::Duration;

pub use connect::{LinkConfig, Listener, ListenerStats, connect, connect_windows};
pub use credentials::{ALLOW_GIDS_VAR, ALLOW_UIDS_VAR, AllowedPeers, PeerCredentials};

use crate::clock::Clock;
use crate::engine::{
    ConfigError, Delivery, Engine, EngineConfig, Event, LinkError, MessageId, PostId, PostedRecv,
    RecvTarget, SendError,
};
use crate::ring::{self, Consumer, Geometry, PACKET_AT, Producer, RingError};
use crate::time::Time;
use crate::window::{Window, WindowError};
use crate::wire::HEADER_LEN;

/// What a round that moved nothing saw: until one of these changes, the
/// next round cannot move anything either.
#[derive(Debug, Clone, Copy)]
struct Quiet {
    /// The medium's activity (for a ring: nothing new arrived and no slot
    /// was freed).
    activity: [u64; 2],
    /// The engine's next timer.
    until: Option<Time>,
}

/// How much of a round of progress to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Round {
    /// Receive, send, timers, completions.
    Full,
    /// As `Full`, but receive only until a message is ready (small ones
    /// in a batch: [`Intake::FirstMessage`]) and stop once it is
    /// delivered if nothing needs sending and no timer is due: a blocking
    /// receive's caller is waiting for it, and the rest of the round
    /// (counting completions) can wait for the next call without harm.
    UntilDelivery,
}

/// What a round of progress did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Moved {
    Nothing,
    Some,
    /// A `Round::UntilDelivery` stopped after delivering a message.
    Delivered,
}

/// Idle rounds a blocking call spins (with a CPU pause hint) before it
/// yields the CPU: a yield is a system call, and on a busy link the next
/// packet is usually a few hundred nanoseconds away. With far fewer rounds
/// a waiting side yielded about once per small-message round trip, and
/// each yield that came as the answer arrived added its system call to the
/// latency.
const SPINS_BEFORE_YIELD: u32 = 1024;

/// Idle rounds between clock reads in a blocking call.
const CLOCK_EVERY_IDLE_ROUNDS: u32 = 8;

/// A receive that waits for one message ([`Intake::FirstMessage`]) stops
/// once the messages it made ready hold this many bytes. Smaller messages
/// are taken in a batch: the round that stops costs a load of the peer's
/// index line, as much as moving a few small messages, while it spares a
/// large one a buffer of its own.
const FIRST_MESSAGE_STOP_BYTES: usize = 64 << 10;

/// Messages from this many bytes land around the cache (where the CPU's
/// copies do that faster, see [`Window::read_crc_streaming`]): larger than
/// a core's own cache, so their lines would be read from memory first
/// only to be overwritten, and mostly evicted before anyone reads them.
/// Smaller messages are often read at once, from the cache.
pub const STREAM_MESSAGES_FROM: u64 = 4 << 20;

/// Writes a ring's control block into the window its owner will read:
/// magic, version, geometry and the owner's generation; the indices start
/// at zero. The owner does this before handing the window to the peer.
pub fn init_ring<W: Window + ?Sized>(
    window: &W,
    geometry: Geometry,
    generation: u64,
) -> Result<(), SetupError> {
    geometry.validate(window.len())?;
    // A window may be laid out again while the other side watches it (a
    // device BAR or a ring file reused after a restart): the magic goes
    // first and comes back last, so a reader that sees it (Acquire) sees
    // the geometry and the zeroed indices too.
    window.store_u64(ring::offset::MAGIC, 0, Ordering::Release)?;
    let line = ring::Identity {
        magic: 0,
        version: ring::RING_VERSION,
        geometry,
        generation,
        owner_pid: std::process::id(),
    }
    .encode();
    let after_magic = ring::offset::MAGIC + 8;
    window.write(after_magic, &line[after_magic..])?;
    window.store_u64(
        ring::offset::HEAD,
        ring::encode_index(ring::IndexKind::Head, 0),
        Ordering::Relaxed,
    )?;
    window.store_u64(
        ring::offset::CONSUMED,
        ring::encode_index(ring::IndexKind::Consumed, 0),
        Ordering::Relaxed,
    )?;
    window.store_fence();
    window.store_u64(ring::offset::MAGIC, ring::RING_MAGIC, Ordering::Release)?;
    window.store_fence();
    Ok(())
}

/// What a ring's control block says, checked against its window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingInfo {
    /// Slots and their size.
    pub geometry: Geometry,
    /// The owner's generation (+1 per attach).
    pub generation: u64,
    /// The owner's process id, for diagnostics.
    pub owner_pid: u32,
}

/// Reads and checks a ring's control block: a window that is not a barlink
/// ring, of another layout version, or whose geometry does not fit the
/// window is refused with an error that says which.
pub fn read_ring_info<W: Window + ?Sized>(window: &W) -> Result<RingInfo, SetupError> {
    ring_info(read_identity(window)?, window.len())
}

/// What an identity line read from a window of `window_len` bytes says,
/// checked as [`read_ring_info`] checks it.
pub(crate) fn ring_info(
    identity: ring::Identity,
    window_len: usize,
) -> Result<RingInfo, SetupError> {
    if identity.version != ring::RING_VERSION {
        return Err(SetupError::RingVersion {
            found: identity.version,
        });
    }
    identity.geometry.validate(window_len)?;
    Ok(RingInfo {
        geometry: identity.geometry,
        generation: identity.generation,
        owner_pid: identity.owner_pid,
    })
}

/// A ring's identity line, of any layout version: refused only if the
/// window holds no barlink ring. Who owns a ring is read the same way in
/// every version ([`ring::offset::OWNER_PID`]), so a file another version
/// left behind can still be told stale or in use.
pub(crate) fn read_identity<W: Window + ?Sized>(window: &W) -> Result<ring::Identity, SetupError> {
    // The magic first (Acquire): the owner stores it last (see init_ring).
    let magic = window.load_u64(ring::offset::MAGIC, Ordering::Acquire)?;
    if magic != ring::RING_MAGIC {
        return Err(SetupError::NotARing { found: magic });
    }
    let mut line = [0u8; ring::IDENTITY_LEN];
    window.read(0, &mut line)?;
    Ok(ring::Identity::decode(&line))
}

/// Why a link could not be set up.
#[derive(Debug)]
#[non_exhaustive]
pub enum SetupError {
    /// The engine configuration is unusable.
    Config(ConfigError),
    /// A window access failed.
    Window(WindowError),
    /// The ring geometry does not fit.
    Ring(RingError),
    /// The window holds no barlink ring (wrong magic).
    NotARing { found: u64 },
    /// The ring was laid out by another barlink version.
    RingVersion { found: u32 },
    /// The peer's slots cannot hold this side's packets.
    SlotsTooSmall { slot_size: u32, mtu: usize },
    /// The medium carries packets smaller than the MTU needs.
    MediumTooSmall { max_packet: usize, needed: usize },
    /// A socket operation of the rendezvous failed.
    Io {
        operation: &'static str,
        error: std::io::Error,
    },
    /// The name is taken by another listener (or a running process's ring
    /// file).
    NameInUse { name: String },
    /// A ring file left behind by a process that no longer runs.
    StaleRing {
        path: std::path::PathBuf,
        owner_pid: u32,
    },
    /// Nobody is listening under the name.
    NoListener { name: String },
    /// The peer did not complete the setup in time.
    Timeout {
        operation: &'static str,
        after: Duration,
    },
    /// The peer sent something other than the setup messages.
    Handshake { detail: String },
    /// An allow list (an option or an environment variable) is malformed.
    AllowList { detail: String },
    /// The process on the other side is of a user this side does not
    /// admit; nothing was exchanged with it.
    PeerNotAllowed {
        /// What the other side is: "client", "listener", "ring file".
        peer_is: &'static str,
        peer: PeerCredentials,
        own_uid: u32,
        /// This side's allow list, in words.
        allowed: String,
    },
    /// The listener does not admit this process's user.
    RefusedByPeer {
        listener: PeerCredentials,
        own_uid: u32,
    },
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetupError::Config(error) => write!(f, "engine configuration: {error}"),
            SetupError::Window(error) => error.fmt(f),
            SetupError::Ring(error) => error.fmt(f),
            SetupError::NotARing { found } => write!(
                f,
                "the window is not a barlink ring (magic {found:#018x}): wrong file, or a ring never initialized"
            ),
            SetupError::RingVersion { found } => write!(
                f,
                "the ring was laid out by ring version {found}, this build uses {}: run the same barlink version on both sides",
                ring::RING_VERSION
            ),
            SetupError::SlotsTooSmall { slot_size, mtu } => write!(
                f,
                "the peer's ring slots ({slot_size} bytes) hold packets of at most {} bytes but this side's MTU is {mtu}: use the same MTU on both sides",
                (*slot_size as usize).saturating_sub(PACKET_AT)
            ),
            SetupError::MediumTooSmall { max_packet, needed } => write!(
                f,
                "the medium carries packets of at most {max_packet} bytes but the MTU is {needed}: lower the MTU or enlarge the medium's slots"
            ),
            SetupError::Io { operation, error } => write!(f, "{operation}: {error}"),
            SetupError::NameInUse { name } => write!(
                f,
                "link name {name:?} is in use by another process (a listener, or the owner of the ring file): pick another name or stop that process"
            ),
            SetupError::StaleRing { path, owner_pid } => write!(
                f,
                "{} is a ring left behind by process {owner_pid}, which no longer runs (it crashed or was killed): \
                 remove it (`rm {}`) or let barlink reclaim stale rings (NamedOptions::reclaim_stale)",
                path.display(),
                path.display()
            ),
            SetupError::NoListener { name } => write!(
                f,
                "nobody listens under link name {name:?}: start the accepting side first"
            ),
            SetupError::Timeout { operation, after } => {
                write!(f, "{operation}: the peer did not answer within {after:?}")
            }
            SetupError::Handshake { detail } => write!(f, "link setup: {detail}"),
            SetupError::AllowList { detail } => write!(f, "allow list: {detail}"),
            SetupError::PeerNotAllowed {
                peer_is,
                peer,
                own_uid,
                allowed,
            } => write!(
                f,
                "the {peer_is} is {peer}, a user this process (uid {own_uid}) does not admit: it admits {allowed}. \
                 Nothing was sent to it. If that user is meant, allow it ({ALLOW_UIDS_VAR}, {ALLOW_GIDS_VAR}, or the \
                 allow list in the link options); if not, another user's process holds the name"
            ),
            SetupError::RefusedByPeer { listener, own_uid } => write!(
                f,
                "the listener ({listener}) refused this process (uid {own_uid}): it does not admit this user. \
                 Its owner can allow uid {own_uid} ({ALLOW_UIDS_VAR} or the allow list in its link options)"
            ),
        }
    }
}

impl std::error::Error for SetupError {}

impl From<WindowError> for SetupError {
    fn from(error: WindowError) -> Self {
        SetupError::Window(error)
    }
}

impl From<RingError> for SetupError {
    fn from(error: RingError) -> Self {
        SetupError::Ring(error)
    }
}

impl From<ConfigError> for SetupError {
    fn from(error: ConfigError) -> Self {
        SetupError::Config(error)
    }
}

/// Why a blocking call on a link returned without its result.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IoError {
    /// Nothing happened within the timeout; the link is still up.
    Timeout { after: Duration },
    /// The link ended.
    Closed(LinkError),
    /// The medium failed: the peer broke the ring protocol (an index that
    /// cannot be true), a window access failed, or an RDMA work request
    /// completed in error. The link cannot go on.
    Medium(String),
    /// The message is longer than the configured maximum.
    TooLong { len: u64, max: u64 },
}

impl fmt::Display for IoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IoError::Timeout { after } => write!(f, "timed out after {after:?}"),
            IoError::Closed(reason) => write!(f, "link closed: {reason}"),
            IoError::Medium(detail) => write!(f, "link medium failure: {detail}"),
            IoError::TooLong { len, max } => {
                write!(f, "message of {len} bytes exceeds max_message_len {max}")
            }
        }
    }
}

impl std::error::Error for IoError {}

/// The ring in a pair of memory windows as a link's [`Medium`]: packets
/// are written into slots of the ring in the peer's window (`peer`, never
/// read) and read from slots of the ring in the own window (`own`, written
/// only by the peer), the head and consumed indices published with
/// release stores.
///
/// After setup only the own window's two index words are ever read: the
/// geometry and identity are copied at [`RingMedium::new`], so a scribble
/// over the rest of a control block changes nothing. An index word that
/// fails its check or cannot be true is a missed update ([`IndexStats`]):
/// counted, never acted on, and repaired by the peer, which stores its
/// index words again at least every [`REPUBLISH_EVERY`] (or its heartbeat
/// interval, if shorter) even when it has nothing new to say.
#[derive(Debug)]
pub struct RingMedium<W: Window> {
    own: W,
    peer: W,
    producer: Producer,
    consumer: Consumer,
    own_geometry: Geometry,
    peer_geometry: Geometry,
    /// The own ring's head word, as last read by [`Medium::activity`].
    head_word: u64,
    /// The peer's consumed word (it lives in the own window), as last read
    /// by [`Medium::activity`].
    consumed_word: u64,
    /// The words last decided on: a word is checked (and a miss counted)
    /// once, not in every round that sees it again.
    head_word_applied: u64,
    consumed_word_applied: u64,
    /// Packets and bytes read out of the own ring since the consumed count
    /// was last published (see [`RingMedium::receive`]).
    unpublished_packets: u32,
    unpublished_bytes: usize,
    /// When this side's index words are next stored again.
    repeat: RepeatTimer,
    index_stats: IndexStats,
}

impl<W: Window> RingMedium<W> {
    /// Binds two windows whose rings are initialized ([`init_ring`]): `own`
    /// is read, `peer` written.
    pub fn new(own: W, peer: W) -> Result<Self, SetupError> {
        let own_info = read_ring_info(&own)?;
        let peer_info = read_ring_info(&peer)?;
        let head_zero = ring::encode_index(ring::IndexKind::Head, 0);
        let consumed_zero = ring::encode_index(ring::IndexKind::Consumed, 0);
        Ok(RingMedium {
            producer: Producer::new(peer_info.geometry),
            consumer: Consumer::new(own_info.geometry),
            own_geometry: own_info.geometry,
            peer_geometry: peer_info.geometry,
            own,
            peer,
            head_word: head_zero,
            consumed_word: consumed_zero,
            head_word_applied: head_zero,
            consumed_word_applied: consumed_zero,
            unpublished_packets: 0,
            unpublished_bytes: 0,
            repeat: RepeatTimer::default(),
            index_stats: IndexStats::default(),
        })
    }

    /// The ring geometries (own, peer).
    pub fn geometries(&self) -> (Geometry, Geometry) {
        (self.own_geometry, self.peer_geometry)
    }
}

/// Bytes of packets after which a ring publishes its index (head when
/// sending, consumed when receiving) even in the middle of a batch. Each
/// publication is one cache line (or one PCIe write) the peer must fetch;
/// at 16 KiB that is under 1% of the bytes moved, while the peer starts
/// on the first packets of a large batch at once. Small packets are still
/// published together at the end of a batch.
const PUBLISH_BYTES: usize = 16 << 10;

/// Bytes of a slot worth fetching ahead, as soon as a packet is known to
/// be there (to read it) or a slot is known to be the next one written (to
/// write it): a header and a small message's payload, after the slot's
/// lead ([`PACKET_AT`]). The raw-ring baselines take the next slot's the
/// same way.
pub const SMALL_PACKET: usize = 256;

impl<W: Window> RingMedium<W> {
    /// Gives the slots read so far back to the peer.
    fn publish_consumed(&mut self) -> Result<(), MediumError> {
        self.unpublished_packets = 0;
        self.unpublished_bytes = 0;
        ring::publish_consumed(&self.peer, self.consumer.released()).map_err(MediumError::new)
    }

    /// Makes every packet up to `head` visible to the peer, and gives back
    /// the slots read since the last time (the same cache line).
    fn publish_head(&mut self, head: u64) -> Result<(), MediumError> {
        if self.unpublished_packets > 0 {
            self.publish_consumed()?;
        }
        ring::publish_head(&self.peer, head).map_err(MediumError::new)
    }

    /// Applies a head word not decided on before; a miss is counted and
    /// leaves the packets already known ready.
    fn apply_head_word(&mut self) {
        if self.head_word == self.head_word_applied {
            return;
        }
        self.head_word_applied = self.head_word;
        if let Err(miss) = self.consumer.on_head(self.head_word) {
            self.index_stats.record(&miss);
            tracing::debug!(%miss, "head word not acted on");
        }
    }

    /// Applies a consumed word not decided on before; a miss is counted.
    fn apply_consumed_word(&mut self) {
        if self.consumed_word == self.consumed_word_applied {
            return;
        }
        self.consumed_word_applied = self.consumed_word;
        if let Err(miss) = self.producer.on_consumed(self.consumed_word) {
            self.index_stats.record(&miss);
            tracing::debug!(%miss, "consumed word not acted on");
        }
    }

    /// Stores both index words again if the interval is up, whether or not
    /// they changed: a store of ours the peer missed is repaired by this.
    fn republish_if_due(&mut self, now: Time, heartbeat: Duration) -> Result<(), MediumError> {
        if !self.repeat.due(now, heartbeat) {
            return Ok(());
        }
        // Both words, each once: publish_head gives back held slots
        // (storing the consumed word) only when there are some.
        if self.unpublished_packets == 0 {
            self.publish_consumed()?;
        }
        self.publish_head(self.producer.written())?;
        self.index_stats.republished += 1;
        Ok(())
    }
}

impl<W: Window> Medium for RingMedium<W> {
    fn activity(&mut self) -> Result<[u64; 2], MediumError> {
        self.head_word = ring::load_head(&self.own).map_err(MediumError::new)?;
        self.consumed_word = ring::load_consumed(&self.own).map_err(MediumError::new)?;
        Ok([self.head_word, self.consumed_word])
    }

    fn receive<B: AsRef<[u8]>>(
        &mut self,
        now: Time,
        engine: &mut Engine<B>,
        intake: Intake,
    ) -> Result<usize, MediumError> {
        self.apply_head_word();
        if self.consumer.next_slot_offset().is_none() {
            return Ok(0);
        }
        let room = (self.own_geometry.slot_size as usize).saturating_sub(PACKET_AT + HEADER_LEN);
        // Ready bytes only grow within a round (the caller takes none).
        let stop_at = (intake == Intake::FirstMessage).then(|| {
            engine
                .ready_bytes()
                .saturating_add(FIRST_MESSAGE_STOP_BYTES)
        });
        // A caller that lends targets takes its messages in them: once the
        // round has used them all, the next message stays in the ring until
        // the caller lends more (or until the next round, if it lends
        // none), rather than beginning in a buffer of the engine's, to be
        // copied out again. A fast sender otherwise keeps one round going
        // past every target the caller had lent.
        let lending = engine.posted_recvs() > 0;
        let mut handed = 0;
        while let Some(slot) = self.consumer.next_slot_offset() {
            if stop_at.is_some_and(|stop_at| engine.ready_bytes() >= stop_at)
                || (lending && engine.posted_recvs() == 0)
            {
                break;
            }
            // A small packet's lines all at once, rather than the payload's
            // only after the header has been parsed.
            let packet = slot + PACKET_AT;
            self.own.prefetch(slot, PACKET_AT + SMALL_PACKET);
            let mut header = [0u8; HEADER_LEN];
            self.own
                .read(packet, &mut header)
                .map_err(MediumError::new)?;
            let own = &self.own;
            let mut payload_read = 0usize;
            // The payload goes from the slot straight into its message
            // (one copy); the header's lengths come from the peer and the
            // engine checks them against `room` before any read. Rejected
            // packets are counted by the engine (and NAKed).
            let _verdict = engine
                .handle_packet_from(now, &header, room, |offset, dst, crc, message_len| {
                    let at = packet + HEADER_LEN + offset;
                    payload_read += dst.len();
                    match (crc, message_len >= STREAM_MESSAGES_FROM) {
                        (Some(crc), true) => own.read_crc_streaming(at, dst, crc),
                        (Some(crc), false) => own.read_crc(at, dst, crc),
                        (None, true) => own.read_streaming(at, dst),
                        (None, false) => own.read(at, dst),
                    }
                })
                .map_err(MediumError::new)?;
            self.consumer.release();
            handed += 1;
            self.unpublished_packets += 1;
            self.unpublished_bytes += HEADER_LEN + payload_read;
            // Slots go back to the sender as soon as a batch's worth is out
            // of them (it refills them while we read the rest). Fewer go
            // back with our next transmission, in the same cache line as its
            // head: one line for the peer to fetch instead of two, and no
            // wake-up of a peer that waits for our answer, not for slots.
            // The sender can still never stall on slots we hold back: it
            // runs out only when the unread and the held-back fill the
            // ring, and then we hold back fewer than a quarter of it, so
            // the unread ones will carry us over the threshold (in this
            // round, or in the next if this one stops at a message: the
            // sender waits on those unread slots either way).
            if self.unpublished_bytes >= PUBLISH_BYTES
                || self.unpublished_packets >= (self.own_geometry.slot_count / 4).max(1)
            {
                self.publish_consumed()?;
            }
            // The peer waits to learn what of a message it still needs
            // (`Engine::ack_before_tail`): the round acknowledges before it
            // checks the packets behind, the message's last ones.
            if engine.before_tail_ack_due(now) {
                break;
            }
        }
        Ok(handed)
    }

    fn transmit<B: AsRef<[u8]>>(
        &mut self,
        now: Time,
        engine: &mut Engine<B>,
    ) -> Result<usize, MediumError> {
        self.apply_consumed_word();
        self.republish_if_due(now, engine.config().heartbeat_interval)?;
        let mut unpublished = None;
        let mut unpublished_bytes = 0usize;
        let mut sent = 0;
        while let Some(slot) = self.producer.next_slot_offset() {
            let peer = &self.peer;
            let written = engine.poll_transmit_with(now, |transmit| {
                // The payload is copied and checksummed in one pass; the
                // header, with the CRC, goes last.
                let packet = slot + PACKET_AT;
                let payload_at = packet + HEADER_LEN;
                let packet_len = HEADER_LEN + transmit.payload().len();
                if !transmit.has_crc() {
                    peer.write(payload_at, transmit.payload())?;
                    peer.write(packet, &transmit.header_with_crc(0))?;
                    return Ok((packet_len, transmit.ends_burst()));
                }
                let mut crc = transmit.crc_of_header();
                peer.write_crc(payload_at, transmit.payload(), &mut crc)?;
                peer.write(packet, &transmit.header_with_crc(crc.finish()))?;
                Ok::<_, WindowError>((packet_len, transmit.ends_burst()))
            });
            let ends_burst = match written {
                None => break,
                Some(result) => {
                    let (packet_len, ends_burst) = result.map_err(MediumError::new)?;
                    unpublished = Some(self.producer.commit());
                    unpublished_bytes += packet_len;
                    sent += 1;
                    ends_burst
                }
            };
            // Publish as soon as a batch's worth of bytes is written, so
            // that the peer reads the first packets while we write the
            // next ones (publishing only at the end of a window's worth
            // turned the two sides' copies into turns, not a pipeline);
            // and right after the last packet of a burst, before asking
            // the engine for one more (an answer to a request is what the
            // peer waits for: the rest of the round is not).
            if unpublished_bytes >= PUBLISH_BYTES || ends_burst {
                if let Some(head) = unpublished.take() {
                    self.publish_head(head)?;
                }
                unpublished_bytes = 0;
            }
        }
        if let Some(head) = unpublished {
            self.publish_head(head)?;
        }
        // The next packet's slot, while the peer reads this one: its lines
        // are then ours when that packet is written, rather than taken
        // from the peer's core one after another as the writes reach them.
        if sent > 0
            && let Some(slot) = self.producer.next_slot_offset()
        {
            self.peer.prefetch_for_write(slot, PACKET_AT + SMALL_PACKET);
        }
        Ok(sent)
    }

    fn max_packet(&self) -> usize {
        (self.peer_geometry.slot_size as usize).saturating_sub(PACKET_AT)
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.repeat.deadline()
    }

    fn index_stats(&self) -> IndexStats {
        self.index_stats
    }
}

/// A send the engine is done with, given back to a caller that keeps its
/// buffers ([`Link::keep_sent_buffers`]).
#[derive(Debug)]
pub struct SentBack<B> {
    pub id: MessageId,
    pub buf: B,
    /// The peer acknowledged every packet; `false`: the message failed
    /// with its session (the peer restarted, or the link ended).
    pub acknowledged: bool,
}

/// An engine bound to a ring in each direction: the link over memory
/// windows. See [`Link`] for the calls.
pub type RingLink<W, B = Vec<u8>> = Link<RingMedium<W>, B>;

/// An engine bound to a [`Medium`]: the message API (send, receive, flush,
/// close, all with timeouts) over any medium. `B` is the type of the
/// caller's message buffers (see [`Engine`]): `Arc<[u8]>` sends the same
/// bytes many times without copying them first.
#[derive(Debug)]
pub struct Link<M: Medium, B: AsRef<[u8]> = Vec<u8>> {
    engine: Engine<B>,
    medium: M,
    clock: Clock,
    completed: u64,
    /// The buffers of sends the engine is done with, in the order it let
    /// go of them, kept for a caller that asked ([`Link::keep_sent_buffers`]);
    /// `None`: dropped at once.
    sent_back: Option<VecDeque<SentBack<B>>>,
    closed: Option<LinkError>,
    medium_error: Option<String>,
    /// Rounds of a blocking call in a row that moved nothing.
    idle_rounds: u32,
    /// Set by a round that moved nothing; cleared by anything the caller
    /// does. See `progress_inner`.
    quiet: Option<Quiet>,
    /// The clock as last read by an idle round.
    idle_clock: Option<Time>,
}

impl<W: Window, B: AsRef<[u8]>> Link<RingMedium<W>, B> {
    /// Binds an engine to two windows whose rings are initialized
    /// ([`init_ring`]): `own` is read, `peer` written. `epoch` should be the
    /// own ring's generation.
    pub fn new(own: W, peer: W, config: EngineConfig, epoch: u32) -> Result<Self, SetupError> {
        let medium = RingMedium::new(own, peer)?;
        let slot_size = medium.peer_geometry.slot_size;
        if (slot_size as usize).saturating_sub(PACKET_AT) < config.mtu {
            return Err(SetupError::SlotsTooSmall {
                slot_size,
                mtu: config.mtu,
            });
        }
        Link::with_medium(medium, config, epoch)
    }

    /// The ring geometries (own, peer).
    pub fn geometries(&self) -> (Geometry, Geometry) {
        self.medium.geometries()
    }
}

impl<M: Medium, B: AsRef<[u8]>> Link<M, B> {
    /// Binds an engine to a medium. `epoch` identifies this side's session
    /// (it must change when a side restarts; 0 is taken as 1).
    pub fn with_medium(medium: M, config: EngineConfig, epoch: u32) -> Result<Self, SetupError> {
        // The MTU is a whole packet, header included.
        let needed = config.mtu;
        if medium.max_packet() < needed {
            return Err(SetupError::MediumTooSmall {
                max_packet: medium.max_packet(),
                needed,
            });
        }
        let engine = Engine::new(config, epoch.max(1), Time::ZERO)?;
        Ok(Link {
            engine,
            medium,
            clock: Clock::start(),
            completed: 0,
            sent_back: None,
            closed: None,
            medium_error: None,
            idle_rounds: 0,
            idle_clock: None,
            quiet: None,
        })
    }

    fn now(&self) -> Time {
        self.clock.now()
    }

    /// The engine (statistics, configuration, state).
    pub fn engine(&self) -> &Engine<B> {
        &self.engine
    }

    /// See [`Engine::ack_before_tail`].
    pub fn ack_before_tail(&mut self, id: MessageId) -> bool {
        self.engine.ack_before_tail(id)
    }

    /// The medium.
    pub fn medium(&self) -> &M {
        &self.medium
    }

    /// Index updates from the peer this side could not act on, and its own
    /// repeated ones (see [`IndexStats`]).
    pub fn index_stats(&self) -> IndexStats {
        self.medium.index_stats()
    }

    /// Messages whose every packet the peer acknowledged, so far.
    pub fn completed(&self) -> u64 {
        self.completed
    }

    /// From now on, keeps the buffer of each send the engine is done with
    /// (acknowledged, or failed with its session) for [`Link::take_sent`],
    /// rather than dropping it: a caller that reuses its buffers, or
    /// settles each message by its own outcome, gets them back without
    /// sharing them. A caller that asks must take them, or they pile up.
    pub fn keep_sent_buffers(&mut self) {
        self.sent_back.get_or_insert_with(VecDeque::new);
    }

    /// The oldest send the engine let go of and not yet taken (see
    /// [`Link::keep_sent_buffers`]).
    pub fn take_sent(&mut self) -> Option<SentBack<B>> {
        self.sent_back.as_mut()?.pop_front()
    }

    /// The sends the engine let go of and not yet taken, oldest first, to
    /// take in place; `None` unless kept ([`Link::keep_sent_buffers`]).
    pub fn sent_back_mut(&mut self) -> Option<&mut VecDeque<SentBack<B>>> {
        self.sent_back.as_mut()
    }

    /// Keeps a finished send's buffer for the caller if it asked
    /// ([`Link::keep_sent_buffers`]), else drops it.
    fn hand_back(&mut self, id: MessageId, buf: B, acknowledged: bool) {
        if let Some(back) = &mut self.sent_back {
            back.push_back(SentBack {
                id,
                buf,
                acknowledged,
            });
        }
    }

    /// Whether a send's buffer waits for [`Link::take_sent`].
    pub fn has_sent_back(&self) -> bool {
        self.sent_back.as_ref().is_some_and(|back| !back.is_empty())
    }

    /// Moves packets both ways and processes timers once. Returns whether
    /// anything moved. Call it in a loop (or use the blocking calls).
    pub fn progress(&mut self) -> Result<bool, IoError> {
        self.progress_at(self.now(), Round::Full)
    }

    /// [`Link::progress`] for a caller that spins on the link while it
    /// waits: a round in a run of rounds that moved nothing reuses the
    /// clock the run's first round read, reading it again only every few
    /// rounds, as the blocking calls do (a round is a few hundred
    /// nanoseconds, the engine's timers are milliseconds). `fresh` reads
    /// it regardless: pass it on the first round of a wait, as the caller
    /// may have been away since the last idle round. `for_delivery`: the
    /// caller waits for a message, and a round that delivers one returns
    /// at once when nothing needs to go out and no timer is due, as
    /// [`Link::recv`]'s rounds do (see `progress_inner`); such a round
    /// takes in packets only until about 64 KiB of messages are ready
    /// ([`Intake::FirstMessage`]), leaving the rest for the next round.
    pub fn progress_waiting(&mut self, fresh: bool, for_delivery: bool) -> Result<bool, IoError> {
        let round = if for_delivery {
            Round::UntilDelivery
        } else {
            Round::Full
        };
        self.idle_round(fresh, round).map(|(_, moved)| moved)
    }

    /// A round that reuses the clock of the idle rounds before it, reading
    /// it only every few rounds or when `fresh` (see
    /// [`Link::progress_waiting`]): the instant it ran at, and whether
    /// anything moved.
    fn idle_round(&mut self, fresh: bool, round: Round) -> Result<(Time, bool), IoError> {
        let instant = match self.idle_clock {
            Some(instant)
                if !fresh && !self.idle_rounds.is_multiple_of(CLOCK_EVERY_IDLE_ROUNDS) =>
            {
                instant
            }
            _ => self.now(),
        };
        let moved = self.progress_at(instant, round)?;
        if moved {
            self.idle_rounds = 0;
            self.idle_clock = None;
        } else {
            self.idle_clock = Some(instant);
            self.idle_rounds = self.idle_rounds.wrapping_add(1);
        }
        Ok((instant, moved))
    }

    fn progress_at(&mut self, now: Time, round: Round) -> Result<bool, IoError> {
        if let Some(detail) = &self.medium_error {
            return Err(IoError::Medium(detail.clone()));
        }
        match self.progress_inner(now, round) {
            Ok(Moved::Delivered) => Ok(true),
            Ok(Moved::Some) => {
                self.take_events();
                Ok(true)
            }
            Ok(Moved::Nothing) => {
                self.take_events();
                Ok(false)
            }
            Err(error) => {
                let detail = error.detail().to_string();
                tracing::warn!(%detail, "link medium failed; the link stops");
                self.medium_error = Some(detail.clone());
                Err(IoError::Medium(detail))
            }
        }
    }

    fn progress_inner(&mut self, now: Time, round: Round) -> Result<Moved, MediumError> {
        let activity = self.medium.activity()?;
        // Nothing arrived, no room was freed, no timer is due and the
        // caller has done nothing since a round that moved nothing: this
        // round would move nothing either. A ring's two loads instead of a
        // pass through the engine — what a waiting caller spins on.
        if let Some(quiet) = &self.quiet
            && quiet.activity == activity
            && quiet.until.is_none_or(|until| now < until)
        {
            return Ok(Moved::Nothing);
        }
        self.quiet = None;
        let intake = match round {
            Round::Full => Intake::All,
            Round::UntilDelivery => Intake::FirstMessage,
        };
        let mut moved = self.medium.receive(now, &mut self.engine, intake)? > 0;
        if round == Round::UntilDelivery
            && self.engine.messages_ready() > 0
            && !self.engine.wants_transmit(now)
            && self.engine.poll_timeout().is_none_or(|due| due > now)
        {
            // The caller waits for exactly this, nothing needs to go out
            // (an acknowledgement may wait for the caller's answer) and no
            // timer is due: hand it over now, and leave completions to the
            // next round. A due acknowledgement or timer still runs in
            // this one, or a caller that only receives a steady stream,
            // every round delivering, would never acknowledge it nor
            // resend a packet of its own that was lost.
            return Ok(Moved::Delivered);
        }
        moved |= self.medium.transmit(now, &mut self.engine)? > 0;
        if self.engine.poll_timeout().is_some_and(|due| due <= now) {
            self.engine.handle_timeout(now);
            moved = true;
        }
        if !moved {
            let until = match (self.engine.poll_timeout(), self.medium.poll_timeout()) {
                (Some(engine), Some(medium)) => Some(engine.min(medium)),
                (engine, medium) => engine.or(medium),
            };
            self.quiet = Some(Quiet { activity, until });
            return Ok(Moved::Nothing);
        }
        Ok(Moved::Some)
    }

    /// Takes completions and state changes. Delivered messages stay in the
    /// engine, holding their credit, until the caller receives them: a
    /// caller that does not keep up slows the sender instead of growing a
    /// queue here.
    fn take_events(&mut self) {
        while let Some(event) = self.engine.poll_other_event() {
            match event {
                Event::SendComplete { id, buf } => {
                    self.completed += 1;
                    self.hand_back(id, buf, true);
                }
                Event::SendFailed { id, buf, error } => {
                    tracing::warn!(%error, "a send failed");
                    self.closed.get_or_insert(error);
                    self.hand_back(id, buf, false);
                }
                Event::Closed { reason } => {
                    match &reason {
                        LinkError::LocalClose | LinkError::PeerClosed => {
                            tracing::debug!(%reason, "link closed")
                        }
                        _ => tracing::warn!(%reason, "link closed"),
                    }
                    self.closed = Some(reason);
                }
                Event::Connected { peer_epoch } => {
                    tracing::debug!(epoch = self.engine.epoch(), peer_epoch, "session up");
                }
                Event::PeerRestarted {
                    old_epoch,
                    new_epoch,
                } => {
                    tracing::info!(old_epoch, new_epoch, "peer restarted: a new session");
                }
                Event::Message { .. } | Event::Landed { .. } => {}
            }
        }
    }

    /// A delivered message, without a round of progress.
    fn take_message(&mut self) -> Option<Vec<u8>> {
        let (_, data) = self.engine.poll_message()?;
        // Taking it frees credit and may release a held ack.
        self.quiet = None;
        Some(data)
    }

    /// Why the link can carry no more messages, if it cannot. `progress`
    /// records a close or a failed send without returning it; a caller
    /// that waits on [`Link::completed`] after `progress` asks here, or
    /// it would wait on a dead link for its own timeout.
    pub fn check_open(&self) -> Result<(), IoError> {
        if let Some(detail) = &self.medium_error {
            return Err(IoError::Medium(detail.clone()));
        }
        match &self.closed {
            Some(reason) if self.engine.is_closed() => Err(IoError::Closed(reason.clone())),
            _ => Ok(()),
        }
    }

    /// Queues a message without waiting. `Err(SendError::QueueFull)` gives
    /// the buffer back: call [`RingLink::progress`] and retry.
    pub fn send(&mut self, data: B) -> Result<MessageId, SendError<B>> {
        self.quiet = None;
        self.engine.send(data)
    }

    /// Queues a message, driving the link while the send queue is full, for
    /// at most `timeout`.
    pub fn send_blocking(&mut self, data: B, timeout: Duration) -> Result<MessageId, IoError> {
        // Set by the first wait, from a clock read it needs anyway: a call
        // that completes at once reads no clock for its deadline.
        let mut deadline = None;
        let mut data = data;
        loop {
            self.check_open()?;
            self.quiet = None;
            match self.engine.send(data) {
                Ok(id) => {
                    self.progress()?;
                    return Ok(id);
                }
                Err(SendError::QueueFull(back)) => data = back,
                Err(SendError::TooLong { len, max, .. }) => {
                    return Err(IoError::TooLong { len, max });
                }
                Err(SendError::Closed(_)) => {
                    return Err(IoError::Closed(
                        self.closed.clone().unwrap_or(LinkError::LocalClose),
                    ));
                }
            }
            self.wait_step(&mut deadline, timeout, Round::Full)?;
        }
    }

    /// The next delivered message, driving the link for at most `timeout`.
    pub fn recv(&mut self, timeout: Duration) -> Result<Vec<u8>, IoError> {
        // Set by the first wait, from a clock read it needs anyway: a call
        // that completes at once reads no clock for its deadline.
        let mut deadline = None;
        loop {
            if let Some(data) = self.take_message() {
                return Ok(data);
            }
            self.check_open()?;
            self.wait_step(&mut deadline, timeout, Round::UntilDelivery)?;
        }
    }

    /// [`Link::recv`] for a caller that reuses one buffer: `buf`'s memory
    /// goes to the link first (as [`Link::recycle`] gives it), so on a
    /// ring the next message is assembled in it, unless it is too small
    /// for the message or an earlier round (a `Full` one, or a medium that
    /// reads ahead: TCP, RDMA) already began that message elsewhere. On
    /// return `buf` holds the message, wherever it landed, and the
    /// message's length is returned. On an error `buf` is empty (unlike a
    /// socket's read): its memory went to the link's spare buffers.
    pub fn recv_into(&mut self, buf: &mut Vec<u8>, timeout: Duration) -> Result<usize, IoError> {
        if buf.capacity() > 0 {
            self.recycle(std::mem::take(buf));
        }
        *buf = self.recv(timeout)?;
        Ok(buf.len())
    }

    /// A delivered message if one is ready (after one round of progress).
    pub fn try_recv(&mut self) -> Result<Option<Vec<u8>>, IoError> {
        if self.engine.messages_ready() == 0 {
            self.progress()?;
        }
        if let Some(data) = self.take_message() {
            return Ok(Some(data));
        }
        self.check_open()?;
        Ok(None)
    }

    /// Gives a received message's buffer back for reuse.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        self.engine.recycle_buffer(buf);
    }

    /// Lends `target` for a coming message to land in, without a copy out
    /// of the engine (see [`Engine::post_recv`]); take messages with
    /// [`Link::try_recv_delivery`] or [`Link::recv_delivery`], and take the
    /// target back with [`Link::unpost_recv`] if it is still posted.
    pub fn post_recv(&mut self, target: Box<dyn RecvTarget>) -> PostId {
        self.quiet = None;
        self.engine.post_recv(target)
    }

    /// Takes back a posted target not handed over yet (see
    /// [`Engine::unpost_recv`]).
    pub fn unpost_recv(&mut self, id: PostId) -> Option<PostedRecv> {
        self.engine.unpost_recv(id)
    }

    /// Takes back every posted target not handed over yet (see
    /// [`Engine::unpost_all`]).
    pub fn unpost_all(&mut self) -> Vec<PostedRecv> {
        self.engine.unpost_all()
    }

    /// A delivered message if one is ready (after one round of progress),
    /// wherever it landed.
    pub fn try_recv_delivery(&mut self) -> Result<Option<Delivery>, IoError> {
        if self.engine.messages_ready() == 0 {
            self.progress()?;
        }
        if let Some(delivery) = self.take_delivery() {
            return Ok(Some(delivery));
        }
        self.check_open()?;
        Ok(None)
    }

    /// The next delivered message, wherever it landed, driving the link
    /// for at most `timeout`.
    pub fn recv_delivery(&mut self, timeout: Duration) -> Result<Delivery, IoError> {
        let mut deadline = None;
        loop {
            if let Some(delivery) = self.take_delivery() {
                return Ok(delivery);
            }
            self.check_open()?;
            self.wait_step(&mut deadline, timeout, Round::UntilDelivery)?;
        }
    }

    /// A delivered message if one is ready now, without a round of
    /// progress: for a caller that drives the link itself and takes what
    /// a round brought in.
    pub fn take_delivery(&mut self) -> Option<Delivery> {
        let delivery = self.engine.poll_delivery()?;
        self.quiet = None;
        Some(delivery)
    }

    /// Drives the link until every packet of every queued message has been
    /// written into the peer's ring at least once (not necessarily
    /// acknowledged), for at most `timeout`.
    ///
    /// With caller-driven progress a message that `send` queued goes out
    /// only while the caller keeps calling the link: call this before
    /// turning away from a link for a while (to another link, or to
    /// compute) so that the peer is not left waiting for it.
    pub fn push(&mut self, timeout: Duration) -> Result<(), IoError> {
        // Set by the first wait, from a clock read it needs anyway: a call
        // that completes at once reads no clock for its deadline.
        let mut deadline = None;
        loop {
            self.progress()?;
            if !self.engine.has_unsent() {
                return Ok(());
            }
            self.check_open()?;
            self.wait_step(&mut deadline, timeout, Round::Full)?;
        }
    }

    /// Drives the link until every queued message is acknowledged, for at
    /// most `timeout`.
    pub fn flush(&mut self, timeout: Duration) -> Result<(), IoError> {
        // Set by the first wait, from a clock read it needs anyway: a call
        // that completes at once reads no clock for its deadline.
        let mut deadline = None;
        loop {
            self.progress()?;
            if self.engine.queued_messages() == 0 {
                return Ok(());
            }
            self.check_open()?;
            self.wait_step(&mut deadline, timeout, Round::Full)?;
        }
    }

    /// Closes in order: queued messages are still delivered, then the peer
    /// is told; waits at most `timeout`.
    pub fn close(&mut self, timeout: Duration) -> Result<(), IoError> {
        self.quiet = None;
        self.engine.close();
        // Set by the first wait, from a clock read it needs anyway: a call
        // that completes at once reads no clock for its deadline.
        let mut deadline = None;
        loop {
            self.progress()?;
            if self.engine.is_closed() && !self.engine.wants_transmit(self.now()) {
                return Ok(());
            }
            self.wait_step(&mut deadline, timeout, Round::Full)?;
        }
    }

    /// One round of progress; past the deadline, a timeout. Spins while
    /// packets move and yields the CPU when idle.
    fn wait_step(
        &mut self,
        deadline: &mut Option<Time>,
        timeout: Duration,
        round: Round,
    ) -> Result<(), IoError> {
        // While idle, read the clock every few rounds only: a round is a few
        // hundred nanoseconds and the engine's timers are milliseconds.
        // The first wait of a call reads the clock afresh: the caller may
        // have been away since the last idle round.
        let (instant, moved) = self.idle_round(deadline.is_none(), round)?;
        let deadline = *deadline.get_or_insert(instant + timeout);
        if instant >= deadline {
            return Err(IoError::Timeout { after: timeout });
        }
        if !moved {
            if self.idle_rounds.is_multiple_of(SPINS_BEFORE_YIELD) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        Ok(())
    }
}
